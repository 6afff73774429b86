//! The Iceberg REST catalog of the `RestIceberg` sink (and of the `S3TablesIceberg` and
//! `GlueRestIceberg` shortcuts): the REST protocol as the Iceberg spec writes it. `GET
//! /v1/config` first (defaults, overrides, the prefix, the endpoints offered); namespaces and
//! tables created when missing; tables loaded with `X-Iceberg-Access-Delegation:
//! vended-credentials` and read and written with the storage credentials the catalog vends
//! (renewed before they expire); commits sent as the spec's `CommitTableRequest` with their
//! requirements, so a concurrent writer gets 409 and is never overwritten, or several tables
//! in one `CommitTransactionRequest` when the catalog offers `transactions/commit`.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use async_trait::async_trait;
use bytes::Bytes;
use http::{Method, StatusCode};
use iceberg::io::FileIOBuilder;
use iceberg::spec::{TableMetadata, TableMetadataRef};
use iceberg::table::Table;
use iceberg::{
    Catalog, Error as IcebergError, ErrorKind as IcebergErrorKind, Namespace, NamespaceIdent,
    Result as IcebergResult, TableCommit, TableCreation, TableIdent, TableRequirement, TableUpdate,
};
use iceberg_catalog_rest::{
    CommitTableRequest, CommitTableResponse, CreateNamespaceRequest, CreateTableRequest,
    ErrorModel, ListNamespaceResponse, ListTablesResponse, LoadTableResult, NamespaceResponse,
    RegisterTableRequest, RenameTableRequest,
};
use object_store::client::{HttpClient, HttpConnector, HttpRequestBody, ReqwestConnector};
use object_store::ClientOptions;
use serde::{Deserialize, Serialize};

use super::rest_auth::{Auth, AuthError, OAuth2};
use crate::config::RestIcebergSink;
use crate::storage::iceberg_io::{ObjectStorageFactory, Vended};

/// The endpoint of multi-table commits, as `GET /v1/config` lists it.
const TRANSACTIONS_ENDPOINT: &str = "POST /v1/{prefix}/transactions/commit";

/// One Iceberg REST catalog.
#[derive(Debug)]
pub struct RestCatalog {
    /// The base URI without a trailing `/` (requests go to `<uri>/v1/...`).
    uri: String,
    warehouse: Option<String>,
    /// The one namespace every table goes to (a Glue database), instead of the one asked for.
    namespace: Option<String>,
    /// The sink's `properties`.
    properties: HashMap<String, String>,
    /// The region of the storage when SigV4 names one.
    region: Option<String>,
    auth: Arc<Auth>,
    client: HttpClient,
    session: tokio::sync::OnceCell<Session>,
    /// The last load of each table whose answer carried an `ETag`, with that tag.
    tagged: std::sync::Mutex<HashMap<TableIdent, (String, Table)>>,
    me: Weak<RestCatalog>,
}

/// What `GET /v1/config` answered.
#[derive(Debug, Clone)]
struct Session {
    /// `v1/` or `v1/<prefix>/`.
    base: String,
    /// Defaults, then the sink's properties, then the catalog's overrides.
    props: HashMap<String, String>,
    /// Whether the catalog offers multi-table commits.
    transactions: bool,
}

#[derive(Deserialize)]
struct ConfigResponse {
    #[serde(default)]
    defaults: HashMap<String, String>,
    #[serde(default)]
    overrides: HashMap<String, String>,
    #[serde(default)]
    endpoints: Option<Vec<String>>,
}

#[derive(Deserialize)]
struct ErrorBody {
    error: ErrorModel,
}

/// The changes to one table in a commit, as the spec's JSON.
pub type TableChange = CommitTableRequest;

#[derive(Serialize)]
struct CommitTransactionRequest<'a> {
    #[serde(rename = "table-changes")]
    table_changes: &'a [TableChange],
}

/// Percent-encodes one path segment (RFC 3986 unreserved characters stay).
fn segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A namespace in a path: its levels joined by the unit separator, encoded.
fn namespace_segment(ns: &NamespaceIdent) -> String {
    segment(&ns.as_ref().join("\u{1f}"))
}

fn transport(uri: &str, e: impl std::fmt::Display) -> IcebergError {
    IcebergError::new(
        IcebergErrorKind::Unexpected,
        format!("no answer from the REST catalog at {uri}: {e}; check `uri` and that the catalog is reachable from here"),
    )
    .with_retryable(true)
}

fn auth_error(e: AuthError) -> IcebergError {
    IcebergError::new(IcebergErrorKind::Unexpected, e.message).with_retryable(e.transient)
}

/// The error of an unsuccessful answer: the catalog's own message, and the fix.
fn answer_error(uri: &str, doing: &str, status: StatusCode, body: &[u8]) -> IcebergError {
    let said = match serde_json::from_slice::<ErrorBody>(body) {
        Ok(b) => format!("{}: {}", b.error.r#type, b.error.message),
        Err(_) => String::from_utf8_lossy(body).chars().take(300).collect(),
    };
    let hint = match status {
        StatusCode::UNAUTHORIZED => "; check the sink's `credential` or `token` (and `scope`)",
        StatusCode::FORBIDDEN => "; the principal lacks a privilege for this: grant it in the catalog (for example CATALOG_MANAGE_CONTENT or TABLE_WRITE_DATA)",
        StatusCode::NOT_FOUND if doing == "read its configuration" => "; check `warehouse` (the name the catalog gives it) and that `uri` is the catalog's base URI (without /v1)",
        _ => "",
    };
    let kind = match status {
        StatusCode::CONFLICT => IcebergErrorKind::CatalogCommitConflicts,
        _ => IcebergErrorKind::Unexpected,
    };
    let retryable = status.is_server_error()
        || status == StatusCode::TOO_MANY_REQUESTS
        || status == StatusCode::CONFLICT;
    IcebergError::new(
        kind,
        format!("the REST catalog at {uri} refused to {doing} ({status}, {said}){hint}"),
    )
    .with_retryable(retryable)
}

fn parse<T: serde::de::DeserializeOwned>(uri: &str, what: &str, body: &[u8]) -> IcebergResult<T> {
    serde_json::from_slice(body).map_err(|e| {
        IcebergError::new(
            IcebergErrorKind::DataInvalid,
            format!("the REST catalog at {uri} answered {what} that does not follow the Iceberg REST spec: {e}"),
        )
    })
}

impl RestCatalog {
    /// The catalog a sink names. Nothing is contacted yet.
    pub fn new(sink: &RestIcebergSink, namespace: Option<&str>) -> crate::error::Result<Arc<Self>> {
        let uri = sink.uri.trim_end_matches('/').to_string();
        let options = ClientOptions::new()
            .with_allow_http(uri.starts_with("http://"))
            .with_timeout(std::time::Duration::from_secs(60));
        let client = ReqwestConnector::default().connect(&options).map_err(|e| {
            crate::error::Error::config(format!("cannot set up the REST catalog client for {uri}"))
                .with_source(e)
        })?;
        let properties: HashMap<String, String> = sink
            .properties
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let auth = if let Some(sigv4) = &sink.sigv4 {
            let chain = crate::storage::aws::s3_store("skippr-signing", Some(&sigv4.region))?;
            Auth::Sigv4 {
                region: sigv4.region.clone(),
                service: sigv4.service.clone(),
                chain: Arc::new(chain),
            }
        } else if let Some(credential) = &sink.credential {
            let token_uri = properties
                .get("oauth2-server-uri")
                .cloned()
                .unwrap_or_else(|| format!("{uri}/v1/oauth/tokens"));
            Auth::OAuth2(OAuth2::new(credential, sink.scope.as_deref(), token_uri))
        } else if let Some(token) = &sink.token {
            Auth::Token(token.clone())
        } else {
            Auth::None
        };
        Ok(Arc::new_cyclic(|me| Self {
            uri,
            warehouse: sink.warehouse.clone(),
            namespace: namespace.map(str::to_string),
            properties,
            region: sink.sigv4.as_ref().map(|s| s.region.clone()),
            auth: Arc::new(auth),
            client,
            session: tokio::sync::OnceCell::new(),
            tagged: Default::default(),
            me: me.clone(),
        }))
    }

    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// Sends one request; a token the catalog refuses is replaced once.
    async fn send(
        &self,
        method: Method,
        url: String,
        body: Option<Vec<u8>>,
        delegate: bool,
    ) -> IcebergResult<(StatusCode, Bytes)> {
        let (status, body, _) = self.send_if(method, url, body, delegate, None).await?;
        Ok((status, body))
    }

    /// Like [`RestCatalog::send`], with `If-None-Match: if_none_match`; also returns the
    /// answer's `ETag`.
    async fn send_if(
        &self,
        method: Method,
        url: String,
        body: Option<Vec<u8>>,
        delegate: bool,
        if_none_match: Option<String>,
    ) -> IcebergResult<(StatusCode, Bytes, Option<String>)> {
        let (auth, client, uri) = (self.auth.clone(), self.client.clone(), self.uri.clone());
        let fut = async move {
            let mut attempt = 0;
            loop {
                attempt += 1;
                let mut b = http::Request::builder()
                    .method(method.clone())
                    .uri(&url)
                    .header("accept", "application/json")
                    .header("x-client-version", "skippr");
                if body.is_some() {
                    b = b.header("content-type", "application/json");
                }
                if delegate {
                    b = b.header("x-iceberg-access-delegation", "vended-credentials");
                }
                if let Some(tag) = &if_none_match {
                    b = b.header("if-none-match", tag.as_str());
                }
                let mut request = b
                    .body(HttpRequestBody::from(body.clone().unwrap_or_default()))
                    .map_err(|e| transport(&uri, e))?;
                let token = auth
                    .authorize(&client, &mut request)
                    .await
                    .map_err(auth_error)?;
                let response = client
                    .execute(request)
                    .await
                    .map_err(|e| transport(&uri, e))?;
                let status = response.status();
                let etag = response
                    .headers()
                    .get(http::header::ETAG)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string);
                let bytes = response
                    .into_body()
                    .bytes()
                    .await
                    .map_err(|e| transport(&uri, e))?;
                if status == StatusCode::UNAUTHORIZED && attempt == 1 {
                    if let (Auth::OAuth2(o), Some(token)) = (auth.as_ref(), token) {
                        tracing::debug!("REST catalog refused the token; fetching another");
                        o.refused(&token).await;
                        continue;
                    }
                }
                return Ok((status, bytes, etag));
            }
        };
        match crate::storage::on_io(async move { Ok(fut.await) }).await {
            Ok(r) => r,
            Err(e) => Err(transport(&self.uri, e.report())),
        }
    }

    /// The catalog's configuration, asked for once.
    async fn session(&self) -> IcebergResult<&Session> {
        self.session
            .get_or_try_init(|| async {
                let mut url = format!("{}/v1/config", self.uri);
                if let Some(w) = &self.warehouse {
                    url.push_str(&format!("?warehouse={}", segment(w)));
                }
                let (status, body) = self.send(Method::GET, url, None, false).await?;
                self.answered(status, &body, "read its configuration")?;
                let config: ConfigResponse = parse(&self.uri, "a configuration", &body)?;
                let mut props = config.defaults;
                props.extend(self.properties.clone());
                props.extend(config.overrides);
                if let (Some(uri), Auth::OAuth2(o)) =
                    (props.get("oauth2-server-uri"), self.auth.as_ref())
                {
                    *o.token_uri.lock().unwrap_or_else(|e| e.into_inner()) = uri.clone();
                }
                let base = match props.get("prefix").filter(|p| !p.is_empty()) {
                    Some(p) => format!("v1/{}/", p.trim_matches('/')),
                    None => "v1/".to_string(),
                };
                let transactions = config
                    .endpoints
                    .as_ref()
                    .is_some_and(|e| e.iter().any(|e| e == TRANSACTIONS_ENDPOINT));
                tracing::debug!(uri = %self.uri, transactions, "REST catalog configuration read");
                Ok(Session {
                    base,
                    props,
                    transactions,
                })
            })
            .await
    }

    /// `<uri>/v1/[<prefix>/]<path>`.
    async fn url(&self, path: &str) -> IcebergResult<String> {
        Ok(format!("{}/{}{path}", self.uri, self.session().await?.base))
    }

    /// The namespace a table of `ns` is in.
    fn ns(&self, ns: &NamespaceIdent) -> NamespaceIdent {
        match &self.namespace {
            Some(one) => NamespaceIdent::new(one.clone()),
            None => ns.clone(),
        }
    }

    fn table_path(&self, ident: &TableIdent) -> String {
        format!(
            "namespaces/{}/tables/{}",
            namespace_segment(&self.ns(ident.namespace())),
            segment(ident.name())
        )
    }

    fn no_table(&self, ident: &TableIdent) -> IcebergError {
        IcebergError::new(
            IcebergErrorKind::TableNotFound,
            format!(
                "the REST catalog at {} has no table {}",
                self.uri,
                self.remote(ident)
            ),
        )
    }

    fn no_namespace(&self, ns: &NamespaceIdent) -> IcebergError {
        IcebergError::new(
            IcebergErrorKind::NamespaceNotFound,
            format!(
                "the REST catalog at {} has no namespace {}",
                self.uri,
                ns.to_url_string()
            ),
        )
    }

    /// `Ok` for a successful answer; otherwise the catalog's refusal to do `doing`.
    fn answered(&self, status: StatusCode, body: &[u8], doing: &str) -> IcebergResult<()> {
        if status.is_success() {
            Ok(())
        } else {
            Err(answer_error(&self.uri, doing, status, body))
        }
    }

    /// The identifier the catalog knows `ident` by.
    fn remote(&self, ident: &TableIdent) -> TableIdent {
        TableIdent::new(self.ns(ident.namespace()), ident.name().to_string())
    }

    /// Whether the catalog commits several tables atomically.
    pub async fn offers_transactions(&self) -> IcebergResult<bool> {
        Ok(self.session().await?.transactions)
    }

    /// Checks that the catalog answers and authorises: its configuration is read.
    pub async fn check(&self) -> IcebergResult<()> {
        self.session().await.map(|_| ())
    }

    /// The table a load or create answered, with the storage the catalog names for it.
    async fn table(&self, ident: &TableIdent, loaded: LoadTableResult) -> IcebergResult<Table> {
        let location = loaded.metadata_location.ok_or_else(|| {
            IcebergError::new(
                IcebergErrorKind::DataInvalid,
                format!(
                    "the REST catalog at {} answered table {ident} without a metadata location",
                    self.uri
                ),
            )
        })?;
        let props = self
            .storage_props(
                loaded.config,
                loaded.storage_credentials,
                loaded.metadata.location(),
            )
            .await?;
        let vended: Option<Arc<dyn Vended>> = self.me.upgrade().map(|catalog| {
            Arc::new(TableCredentials {
                catalog,
                ident: ident.clone(),
            }) as Arc<dyn Vended>
        });
        let factory = ObjectStorageFactory {
            region: self.region.clone(),
            vended,
        };
        let file_io = FileIOBuilder::new(Arc::new(factory))
            .with_props(props)
            .build();
        Table::builder()
            .file_io(file_io)
            .metadata_location(location)
            .identifier(ident.clone())
            .metadata(loaded.metadata)
            .runtime(iceberg::Runtime::try_current()?)
            .build()
    }

    /// The FileIO properties of a table: the session's, the table's `config`, then the
    /// storage credentials whose prefix is the longest that the table's location starts with.
    async fn storage_props(
        &self,
        config: HashMap<String, String>,
        credentials: Option<Vec<iceberg_catalog_rest::StorageCredential>>,
        location: &str,
    ) -> IcebergResult<HashMap<String, String>> {
        let mut props = self.session().await?.props.clone();
        props.extend(config);
        if let Some(best) = credentials
            .unwrap_or_default()
            .into_iter()
            .filter(|c| location.starts_with(&c.prefix))
            .max_by_key(|c| c.prefix.len())
        {
            props.extend(best.config);
        }
        Ok(props)
    }

    /// `GET` of a table: its metadata, location and storage properties.
    async fn load(&self, ident: &TableIdent) -> IcebergResult<LoadTableResult> {
        let url = self.url(&self.table_path(ident)).await?;
        let (status, body) = self.send(Method::GET, url, None, true).await?;
        self.loaded(ident, status, &body)
    }

    /// What a load of `ident` answered.
    fn loaded(
        &self,
        ident: &TableIdent,
        status: StatusCode,
        body: &[u8],
    ) -> IcebergResult<LoadTableResult> {
        match status {
            s if s.is_success() => parse(&self.uri, "a table", body),
            StatusCode::NOT_FOUND => Err(self.no_table(ident)),
            s => Err(answer_error(
                &self.uri,
                &format!("load table {}", self.remote(ident)),
                s,
                body,
            )),
        }
    }

    /// Commits `updates` to one table if every requirement holds: the table as the
    /// catalog now has it. A concurrent writer makes this fail with a retryable conflict.
    pub async fn commit(
        &self,
        ident: &TableIdent,
        change: TableChange,
        file_io: iceberg::io::FileIO,
    ) -> IcebergResult<Table> {
        let url = self.url(&self.table_path(ident)).await?;
        let body = serde_json::to_vec(&TableChange {
            identifier: Some(self.remote(ident)),
            ..change
        })?;
        let (status, body) = self.send(Method::POST, url, Some(body), false).await?;
        if !status.is_success() {
            return Err(commit_error(
                &self.uri,
                &[self.remote(ident)],
                status,
                &body,
            ));
        }
        let answer: CommitTableResponse = parse(&self.uri, "a commit", &body)?;
        Table::builder()
            .file_io(file_io)
            .metadata_location(answer.metadata_location)
            .identifier(ident.clone())
            .metadata(answer.metadata)
            .runtime(iceberg::Runtime::try_current()?)
            .build()
    }

    /// Commits the changes to several tables in one atomic request: all or none.
    pub async fn commit_transaction(
        &self,
        changes: Vec<(TableIdent, TableChange)>,
    ) -> IcebergResult<()> {
        let idents: Vec<TableIdent> = changes.iter().map(|(i, _)| self.remote(i)).collect();
        let table_changes: Vec<TableChange> = changes
            .into_iter()
            .map(|(ident, c)| TableChange {
                identifier: Some(self.remote(&ident)),
                ..c
            })
            .collect();
        let url = self.url("transactions/commit").await?;
        let body = serde_json::to_vec(&CommitTransactionRequest {
            table_changes: &table_changes,
        })?;
        let (status, body) = self.send(Method::POST, url, Some(body), false).await?;
        if !status.is_success() {
            return Err(commit_error(&self.uri, &idents, status, &body));
        }
        Ok(())
    }
}

/// The error of a refused commit. A conflict is retried from the catalog's state; a server
/// fault leaves the outcome unknown, which the committed LSN in the snapshot settles on retry.
fn commit_error(uri: &str, tables: &[TableIdent], status: StatusCode, body: &[u8]) -> IcebergError {
    let names = tables
        .iter()
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let doing = format!("commit to {names}");
    if status == StatusCode::CONFLICT {
        let e = answer_error(uri, &doing, status, body);
        return IcebergError::new(
            IcebergErrorKind::CatalogCommitConflicts,
            format!("another writer changed {names} during a commit; the commit was not applied and is retried from the catalog's state ({e})"),
        )
        .with_retryable(true);
    }
    answer_error(uri, &doing, status, body)
}

/// Renews a table's vended credentials by loading it again.
#[derive(Debug)]
struct TableCredentials {
    catalog: Arc<RestCatalog>,
    ident: TableIdent,
}

#[async_trait]
impl Vended for TableCredentials {
    async fn fresh_props(&self) -> crate::error::Result<HashMap<String, String>> {
        let loaded = self.catalog.load(&self.ident).await?;
        let location = loaded.metadata.location().to_string();
        Ok(self
            .catalog
            .storage_props(loaded.config, loaded.storage_credentials, &location)
            .await?)
    }
}

/// The requirements that keep a commit built on `base` from overwriting a concurrent
/// writer: the same table, the same `main` snapshot, and for the parts `updates` change
/// (schema, partition spec, sort order), the same current ones.
pub fn requirements(base: &TableMetadata, updates: &[TableUpdate]) -> Vec<TableRequirement> {
    let mut out = vec![
        TableRequirement::UuidMatch { uuid: base.uuid() },
        TableRequirement::RefSnapshotIdMatch {
            r#ref: iceberg::spec::MAIN_BRANCH.to_string(),
            snapshot_id: base.current_snapshot_id(),
        },
    ];
    let (mut schema, mut spec, mut order) = (false, false, false);
    for u in updates {
        match u {
            TableUpdate::AddSchema { .. } | TableUpdate::SetCurrentSchema { .. } => schema = true,
            TableUpdate::AddSpec { .. } | TableUpdate::SetDefaultSpec { .. } => spec = true,
            TableUpdate::AddSortOrder { .. } | TableUpdate::SetDefaultSortOrder { .. } => {
                order = true
            }
            _ => {}
        }
    }
    if schema {
        out.push(TableRequirement::CurrentSchemaIdMatch {
            current_schema_id: base.current_schema_id(),
        });
        out.push(TableRequirement::LastAssignedFieldIdMatch {
            last_assigned_field_id: base.last_column_id(),
        });
    }
    if spec {
        out.push(TableRequirement::DefaultSpecIdMatch {
            default_spec_id: base.default_partition_spec_id(),
        });
        out.push(TableRequirement::LastAssignedPartitionIdMatch {
            last_assigned_partition_id: base.last_partition_id(),
        });
    }
    if order {
        out.push(TableRequirement::DefaultSortOrderIdMatch {
            default_sort_order_id: base.default_sort_order_id(),
        });
    }
    out
}

/// A change to one table built on `base`, with its requirements.
pub fn table_change(base: &TableMetadataRef, updates: Vec<TableUpdate>) -> TableChange {
    TableChange {
        identifier: None,
        requirements: requirements(base, &updates),
        updates,
    }
}

#[path = "rest_api.rs"]
mod api;

#[cfg(test)]
#[path = "rest_tests.rs"]
mod tests;
