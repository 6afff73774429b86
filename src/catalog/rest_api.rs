//! The Iceberg REST catalog, its `Catalog` interface: namespaces and tables listed, created,
//! loaded, renamed, dropped and committed through the REST protocol of [`super::RestCatalog`].

use super::*;

#[async_trait]
impl Catalog for RestCatalog {
    async fn list_namespaces(
        &self,
        parent: Option<&NamespaceIdent>,
    ) -> IcebergResult<Vec<NamespaceIdent>> {
        let mut out = Vec::new();
        let mut page: Option<String> = None;
        loop {
            let mut query: Vec<String> = Vec::new();
            if let Some(p) = parent {
                query.push(format!("parent={}", namespace_segment(p)));
            }
            if let Some(t) = &page {
                query.push(format!("pageToken={}", segment(t)));
            }
            let mut url = self.url("namespaces").await?;
            if !query.is_empty() {
                url = format!("{url}?{}", query.join("&"));
            }
            let (status, body) = self.send(Method::GET, url, None, false).await?;
            self.answered(status, &body, "list namespaces")?;
            let answer: ListNamespaceResponse = parse(&self.uri, "a namespace list", &body)?;
            out.extend(answer.namespaces);
            match answer.next_page_token {
                Some(t) if !t.is_empty() => page = Some(t),
                _ => return Ok(out),
            }
        }
    }

    async fn create_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> IcebergResult<Namespace> {
        let ns = self.ns(namespace);
        let url = self.url("namespaces").await?;
        let body = serde_json::to_vec(&CreateNamespaceRequest {
            namespace: ns.clone(),
            properties: properties.clone(),
        })?;
        let (status, body) = self.send(Method::POST, url, Some(body), false).await?;
        match status {
            // Created meanwhile by someone else: that is what was asked for.
            s if s.is_success() || s == StatusCode::CONFLICT => {
                Ok(Namespace::with_properties(namespace.clone(), properties))
            }
            s => Err(answer_error(
                &self.uri,
                &format!("create namespace {}", ns.to_url_string()),
                s,
                &body,
            )),
        }
    }

    async fn get_namespace(&self, namespace: &NamespaceIdent) -> IcebergResult<Namespace> {
        let ns = self.ns(namespace);
        let url = self
            .url(&format!("namespaces/{}", namespace_segment(&ns)))
            .await?;
        let (status, body) = self.send(Method::GET, url, None, false).await?;
        match status {
            s if s.is_success() => {
                let answer: NamespaceResponse = parse(&self.uri, "a namespace", &body)?;
                Ok(Namespace::with_properties(
                    namespace.clone(),
                    answer.properties,
                ))
            }
            StatusCode::NOT_FOUND => Err(self.no_namespace(&ns)),
            s => Err(answer_error(
                &self.uri,
                &format!("read namespace {}", ns.to_url_string()),
                s,
                &body,
            )),
        }
    }

    async fn namespace_exists(&self, namespace: &NamespaceIdent) -> IcebergResult<bool> {
        match self.get_namespace(namespace).await {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == IcebergErrorKind::NamespaceNotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn update_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> IcebergResult<()> {
        let ns = self.ns(namespace);
        let url = self
            .url(&format!("namespaces/{}/properties", namespace_segment(&ns)))
            .await?;
        let body =
            serde_json::to_vec(&serde_json::json!({ "removals": [], "updates": properties }))?;
        let (status, body) = self.send(Method::POST, url, Some(body), false).await?;
        self.answered(
            status,
            &body,
            &format!("update namespace {}", ns.to_url_string()),
        )
    }

    async fn drop_namespace(&self, namespace: &NamespaceIdent) -> IcebergResult<()> {
        let ns = self.ns(namespace);
        let url = self
            .url(&format!("namespaces/{}", namespace_segment(&ns)))
            .await?;
        let (status, body) = self.send(Method::DELETE, url, None, false).await?;
        self.answered(
            status,
            &body,
            &format!("drop namespace {}", ns.to_url_string()),
        )
    }

    async fn list_tables(&self, namespace: &NamespaceIdent) -> IcebergResult<Vec<TableIdent>> {
        let ns = self.ns(namespace);
        let mut out = Vec::new();
        let mut page: Option<String> = None;
        loop {
            let mut url = self
                .url(&format!("namespaces/{}/tables", namespace_segment(&ns)))
                .await?;
            if let Some(t) = &page {
                url = format!("{url}?pageToken={}", segment(t));
            }
            let (status, body) = self.send(Method::GET, url, None, false).await?;
            if status == StatusCode::NOT_FOUND {
                return Err(self.no_namespace(&ns));
            }
            self.answered(
                status,
                &body,
                &format!("list the tables of {}", ns.to_url_string()),
            )?;
            let answer: ListTablesResponse = parse(&self.uri, "a table list", &body)?;
            // Named in the namespace they were asked for.
            out.extend(
                answer
                    .identifiers
                    .into_iter()
                    .map(|t| TableIdent::new(namespace.clone(), t.name().to_string())),
            );
            match answer.next_page_token {
                Some(t) if !t.is_empty() => page = Some(t),
                _ => return Ok(out),
            }
        }
    }

    async fn create_table(
        &self,
        namespace: &NamespaceIdent,
        creation: TableCreation,
    ) -> IcebergResult<Table> {
        let ns = self.ns(namespace);
        let ident = TableIdent::new(namespace.clone(), creation.name.clone());
        let url = self
            .url(&format!("namespaces/{}/tables", namespace_segment(&ns)))
            .await?;
        let request = CreateTableRequest {
            name: creation.name,
            location: creation.location,
            schema: creation.schema,
            partition_spec: creation.partition_spec,
            write_order: creation.sort_order,
            stage_create: Some(false),
            properties: creation.properties,
        };
        let body = serde_json::to_vec(&request)?;
        let (status, body) = self.send(Method::POST, url, Some(body), true).await?;
        match status {
            s if s.is_success() => {
                let loaded: LoadTableResult = parse(&self.uri, "a created table", &body)?;
                self.table(&ident, loaded).await
            }
            StatusCode::CONFLICT => Err(IcebergError::new(
                IcebergErrorKind::TableAlreadyExists,
                format!(
                    "the REST catalog at {} already has table {}",
                    self.uri,
                    self.remote(&ident)
                ),
            )),
            StatusCode::NOT_FOUND => Err(self.no_namespace(&ns)),
            s => Err(answer_error(
                &self.uri,
                &format!("create table {}", self.remote(&ident)),
                s,
                &body,
            )),
        }
    }

    /// A table unchanged since its last load (the catalog answers `304 Not Modified` to its
    /// `ETag`) is the table loaded then: no metadata is sent or parsed again.
    async fn load_table(&self, ident: &TableIdent) -> IcebergResult<Table> {
        let known = self
            .tagged
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(ident)
            .cloned();
        let url = self.url(&self.table_path(ident)).await?;
        let (status, body, etag) = self
            .send_if(
                Method::GET,
                url,
                None,
                true,
                known.as_ref().map(|(t, _)| t.clone()),
            )
            .await?;
        if status == StatusCode::NOT_MODIFIED {
            if let Some((_, table)) = known {
                return Ok(table);
            }
        }
        let loaded = self.loaded(ident, status, &body)?;
        let table = self.table(ident, loaded).await?;
        let mut tagged = self.tagged.lock().unwrap_or_else(|e| e.into_inner());
        match etag {
            Some(tag) => tagged.insert(ident.clone(), (tag, table.clone())),
            None => tagged.remove(ident),
        };
        Ok(table)
    }

    async fn drop_table(&self, ident: &TableIdent) -> IcebergResult<()> {
        let url = self.url(&self.table_path(ident)).await?;
        let (status, body) = self.send(Method::DELETE, url, None, false).await?;
        match status {
            s if s.is_success() => Ok(()),
            StatusCode::NOT_FOUND => Err(self.no_table(ident)),
            s => Err(answer_error(
                &self.uri,
                &format!("drop table {}", self.remote(ident)),
                s,
                &body,
            )),
        }
    }

    async fn purge_table(&self, ident: &TableIdent) -> IcebergResult<()> {
        let url = format!(
            "{}?purgeRequested=true",
            self.url(&self.table_path(ident)).await?
        );
        let (status, body) = self.send(Method::DELETE, url, None, false).await?;
        if status.is_success() || status == StatusCode::NOT_FOUND {
            Ok(())
        } else {
            Err(answer_error(
                &self.uri,
                &format!("purge table {}", self.remote(ident)),
                status,
                &body,
            ))
        }
    }

    async fn table_exists(&self, ident: &TableIdent) -> IcebergResult<bool> {
        let url = self.url(&self.table_path(ident)).await?;
        let (status, body) = self.send(Method::HEAD, url, None, false).await?;
        match status {
            s if s.is_success() => Ok(true),
            StatusCode::NOT_FOUND => Ok(false),
            // A catalog without HEAD: a load answers.
            StatusCode::METHOD_NOT_ALLOWED | StatusCode::NOT_IMPLEMENTED => {
                match self.load(ident).await {
                    Ok(_) => Ok(true),
                    Err(e) if e.kind() == IcebergErrorKind::TableNotFound => Ok(false),
                    Err(e) => Err(e),
                }
            }
            s => Err(answer_error(
                &self.uri,
                &format!("look up table {}", self.remote(ident)),
                s,
                &body,
            )),
        }
    }

    async fn rename_table(&self, src: &TableIdent, dest: &TableIdent) -> IcebergResult<()> {
        let url = self.url("tables/rename").await?;
        let body = serde_json::to_vec(&RenameTableRequest {
            source: self.remote(src),
            destination: self.remote(dest),
        })?;
        let (status, body) = self.send(Method::POST, url, Some(body), false).await?;
        self.answered(status, &body, &format!("rename table {}", self.remote(src)))
    }

    async fn register_table(
        &self,
        ident: &TableIdent,
        metadata_location: String,
    ) -> IcebergResult<Table> {
        let ns = self.ns(ident.namespace());
        let url = self
            .url(&format!("namespaces/{}/register", namespace_segment(&ns)))
            .await?;
        let body = serde_json::to_vec(&RegisterTableRequest {
            name: ident.name().to_string(),
            metadata_location,
            overwrite: Some(false),
        })?;
        let (status, body) = self.send(Method::POST, url, Some(body), true).await?;
        self.answered(
            status,
            &body,
            &format!("register table {}", self.remote(ident)),
        )?;
        let loaded: LoadTableResult = parse(&self.uri, "a registered table", &body)?;
        self.table(ident, loaded).await
    }

    /// iceberg's own transactions (fast appends, schema changes) commit here, with the
    /// requirements they carry.
    async fn update_table(&self, mut commit: TableCommit) -> IcebergResult<Table> {
        let ident = commit.identifier().clone();
        let current = self.load_table(&ident).await?;
        let change = TableChange {
            identifier: None,
            requirements: commit.take_requirements(),
            updates: commit.take_updates(),
        };
        self.commit(&ident, change, current.file_io().clone()).await
    }
}
