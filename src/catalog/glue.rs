//! The Glue catalog of the `AthenaIceberg` sink: Iceberg tables registered in one Glue
//! database the way Athena, Spark, Trino and PyIceberg expect them (`table_type=ICEBERG`,
//! `metadata_location`, `previous_metadata_location`, the columns mirrored into the
//! StorageDescriptor), with metadata and data under the `s3://` warehouse.
//!
//! A commit writes the next metadata file, re-reads the Glue table, and swaps
//! `metadata_location` with `UpdateTable` guarded by the `VersionId` just read: a concurrent
//! writer shows up as a changed location or a refused version and is never overwritten.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;

use async_trait::async_trait;
use iceberg::io::FileIO;
use iceberg::spec::{PrimitiveType, TableMetadata, TableMetadataBuilder, Type};
use iceberg::table::Table;
use iceberg::{
    Catalog, MetadataLocation, Namespace, NamespaceIdent, TableCommit, TableCreation, TableIdent,
};
use serde_json::{json, Map, Value};

use super::glue_api::{GlueApi, GlueError};

/// Glue's table parameter that names the current metadata file.
const METADATA_LOCATION: &str = "metadata_location";
const PREVIOUS_METADATA_LOCATION: &str = "previous_metadata_location";

/// Iceberg tables in one Glue database.
#[derive(Debug)]
pub struct GlueCatalog {
    api: Arc<dyn GlueApi>,
    database: String,
    /// `s3://bucket/prefix` without a trailing `/`.
    warehouse: String,
    file_io: FileIO,
}

fn glue_err(doing: &str, e: GlueError) -> iceberg::Error {
    let retryable =
        e.is("Transport") || e.is("ThrottlingException") || e.is("InternalServiceException");
    let hint = if e.is("AccessDeniedException") {
        "; the credentials lack Glue permissions: see the IAM policy in docs/deploy.md"
    } else {
        ""
    };
    iceberg::Error::new(
        iceberg::ErrorKind::Unexpected,
        format!("Glue {doing} failed{hint}"),
    )
    .with_retryable(retryable)
    .with_source(e)
}

fn conflict(ident: &TableIdent, why: &str) -> iceberg::Error {
    iceberg::Error::new(
        iceberg::ErrorKind::CatalogCommitConflicts,
        format!("Iceberg table {ident} was changed by another writer during a commit ({why}); the commit was not applied"),
    )
    .with_retryable(true)
}

impl GlueCatalog {
    pub fn new(api: Arc<dyn GlueApi>, database: &str, warehouse: &str, file_io: FileIO) -> Self {
        Self {
            api,
            database: database.to_string(),
            warehouse: warehouse.trim_end_matches('/').to_string(),
            file_io,
        }
    }

    pub fn database(&self) -> &str {
        &self.database
    }

    /// The Glue table, or `None` when there is none.
    async fn get_table(&self, name: &str) -> iceberg::Result<Option<Value>> {
        match self
            .api
            .call(
                "GetTable",
                json!({ "DatabaseName": self.database, "Name": name }),
            )
            .await
        {
            Ok(v) => Ok(Some(v["Table"].clone())),
            Err(e) if e.is("EntityNotFoundException") => Ok(None),
            Err(e) => Err(glue_err(&format!("GetTable {}.{name}", self.database), e)),
        }
    }

    /// The current metadata file of `ident`, or `None` when Glue has no such table.
    pub async fn metadata_location(&self, ident: &TableIdent) -> iceberg::Result<Option<String>> {
        Ok(self.get_table(ident.name()).await?.and_then(|t| {
            t["Parameters"][METADATA_LOCATION]
                .as_str()
                .map(str::to_string)
        }))
    }

    /// The `TableInput` Glue stores for an Iceberg table at `metadata`.
    fn table_input(
        name: &str,
        metadata: &TableMetadata,
        location: &str,
        previous: Option<&str>,
        mut parameters: Map<String, Value>,
    ) -> Value {
        parameters.insert("table_type".into(), json!("ICEBERG"));
        parameters.insert(METADATA_LOCATION.into(), json!(location));
        match previous {
            Some(p) => parameters.insert(PREVIOUS_METADATA_LOCATION.into(), json!(p)),
            None => parameters.remove(PREVIOUS_METADATA_LOCATION),
        };
        let schema = metadata.current_schema();
        let columns: Vec<Value> = schema
            .as_struct()
            .fields()
            .iter()
            .map(|f| {
                let mut c = json!({
                    "Name": f.name,
                    "Type": hive_type(&f.field_type),
                    "Parameters": {
                        "iceberg.field.id": f.id.to_string(),
                        "iceberg.field.optional": (!f.required).to_string(),
                        "iceberg.field.current": "true",
                    }
                });
                if let Some(doc) = &f.doc {
                    c["Comment"] = json!(doc);
                }
                c
            })
            .collect();
        json!({
            "Name": name,
            "TableType": "EXTERNAL_TABLE",
            "Parameters": parameters,
            "StorageDescriptor": {
                "Location": metadata.location(),
                "Columns": columns,
            },
        })
    }

    /// Points `ident` at `new` if Glue still names `old`: re-reads the table, then
    /// `UpdateTable` with the `VersionId` read, which Glue refuses if anyone updated the
    /// table in between.
    pub async fn swap(&self, ident: &TableIdent, old: &str, new: &str) -> iceberg::Result<()> {
        let table = self.get_table(ident.name()).await?.ok_or_else(|| {
            iceberg::Error::new(
                iceberg::ErrorKind::TableNotFound,
                format!(
                    "Glue table {}.{} no longer exists; was it dropped by hand?",
                    self.database,
                    ident.name()
                ),
            )
        })?;
        let current = table["Parameters"][METADATA_LOCATION]
            .as_str()
            .unwrap_or_default();
        if current != old {
            return Err(conflict(ident, "Glue names another metadata file"));
        }
        let version = table["VersionId"].as_str().map(str::to_string);
        let metadata = TableMetadata::read_from(&self.file_io, new).await?;
        let parameters = table["Parameters"].as_object().cloned().unwrap_or_default();
        let mut input = json!({
            "DatabaseName": self.database,
            "TableInput": Self::table_input(ident.name(), &metadata, new, Some(old), parameters),
        });
        if let Some(v) = version {
            input["VersionId"] = json!(v);
        }
        match self.api.call("UpdateTable", input).await {
            Ok(_) => Ok(()),
            Err(e) if e.is("ConcurrentModificationException") => {
                Err(conflict(ident, "Glue refused the table version"))
            }
            Err(e) => Err(glue_err(
                &format!("UpdateTable {}.{}", self.database, ident.name()),
                e,
            )),
        }
    }

    fn default_location(&self, name: &str) -> String {
        format!("{}/{}.db/{name}", self.warehouse, self.database)
    }

    pub(crate) async fn build_table(
        &self,
        ident: TableIdent,
        location: String,
    ) -> iceberg::Result<Table> {
        let metadata = TableMetadata::read_from(&self.file_io, &location).await?;
        Table::builder()
            .file_io(self.file_io.clone())
            .metadata_location(location)
            .identifier(ident)
            .metadata(metadata)
            .runtime(iceberg::Runtime::try_current()?)
            .build()
    }

    async fn database_exists(&self) -> iceberg::Result<bool> {
        match self
            .api
            .call("GetDatabase", json!({ "Name": self.database }))
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.is("EntityNotFoundException") => Ok(false),
            Err(e) => Err(glue_err(&format!("GetDatabase {}", self.database), e)),
        }
    }
}

/// The Hive type Glue shows for an Iceberg type (what Athena's DDL and the consoles use).
fn hive_type(t: &Type) -> String {
    match t {
        Type::Primitive(p) => match p {
            PrimitiveType::Boolean => "boolean".into(),
            PrimitiveType::Int => "int".into(),
            PrimitiveType::Long => "bigint".into(),
            PrimitiveType::Float => "float".into(),
            PrimitiveType::Double => "double".into(),
            PrimitiveType::Decimal { precision, scale } => format!("decimal({precision},{scale})"),
            PrimitiveType::Date => "date".into(),
            PrimitiveType::Time | PrimitiveType::String | PrimitiveType::Uuid => "string".into(),
            PrimitiveType::Timestamp
            | PrimitiveType::Timestamptz
            | PrimitiveType::TimestampNs
            | PrimitiveType::TimestamptzNs => "timestamp".into(),
            PrimitiveType::Fixed(_) | PrimitiveType::Binary => "binary".into(),
        },
        Type::Struct(s) => format!(
            "struct<{}>",
            s.fields()
                .iter()
                .map(|f| format!("{}:{}", f.name, hive_type(&f.field_type)))
                .collect::<Vec<_>>()
                .join(",")
        ),
        Type::List(l) => format!("array<{}>", hive_type(&l.element_field.field_type)),
        Type::Map(m) => format!(
            "map<{},{}>",
            hive_type(&m.key_field.field_type),
            hive_type(&m.value_field.field_type)
        ),
    }
}

#[async_trait]
impl Catalog for GlueCatalog {
    async fn list_namespaces(
        &self,
        _parent: Option<&NamespaceIdent>,
    ) -> iceberg::Result<Vec<NamespaceIdent>> {
        Ok(vec![NamespaceIdent::new(self.database.clone())])
    }

    /// Every namespace maps to the sink's Glue database; this creates it when missing.
    async fn create_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> iceberg::Result<Namespace> {
        let input = json!({ "DatabaseInput": {
            "Name": self.database,
            "Description": "Iceberg tables written by Skippr",
            "LocationUri": format!("{}/{}.db", self.warehouse, self.database),
        }});
        match self.api.call("CreateDatabase", input).await {
            Ok(_) => {}
            Err(e) if e.is("AlreadyExistsException") => {}
            Err(e) => return Err(glue_err(&format!("CreateDatabase {}", self.database), e)),
        }
        Ok(Namespace::with_properties(namespace.clone(), properties))
    }

    async fn get_namespace(&self, namespace: &NamespaceIdent) -> iceberg::Result<Namespace> {
        if !self.database_exists().await? {
            return Err(iceberg::Error::new(
                iceberg::ErrorKind::NamespaceNotFound,
                format!("Glue database {} does not exist", self.database),
            ));
        }
        Ok(Namespace::new(namespace.clone()))
    }

    async fn namespace_exists(&self, _namespace: &NamespaceIdent) -> iceberg::Result<bool> {
        self.database_exists().await
    }

    async fn update_namespace(
        &self,
        _namespace: &NamespaceIdent,
        _properties: HashMap<String, String>,
    ) -> iceberg::Result<()> {
        Err(iceberg::Error::new(
            iceberg::ErrorKind::FeatureUnsupported,
            "skipprd does not change Glue database properties",
        ))
    }

    async fn drop_namespace(&self, _namespace: &NamespaceIdent) -> iceberg::Result<()> {
        Err(iceberg::Error::new(
            iceberg::ErrorKind::FeatureUnsupported,
            "skipprd never drops a Glue database",
        ))
    }

    async fn list_tables(&self, namespace: &NamespaceIdent) -> iceberg::Result<Vec<TableIdent>> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut input = json!({ "DatabaseName": self.database });
            if let Some(t) = &token {
                input["NextToken"] = json!(t);
            }
            let page = self
                .api
                .call("GetTables", input)
                .await
                .map_err(|e| glue_err(&format!("GetTables {}", self.database), e))?;
            for t in page["TableList"].as_array().into_iter().flatten() {
                let iceberg = t["Parameters"]["table_type"]
                    .as_str()
                    .is_some_and(|v| v.eq_ignore_ascii_case("ICEBERG"));
                if let (true, Some(name)) = (iceberg, t["Name"].as_str()) {
                    out.push(TableIdent::new(namespace.clone(), name.to_string()));
                }
            }
            token = page["NextToken"].as_str().map(str::to_string);
            if token.is_none() {
                return Ok(out);
            }
        }
    }

    async fn create_table(
        &self,
        namespace: &NamespaceIdent,
        creation: TableCreation,
    ) -> iceberg::Result<Table> {
        let ident = TableIdent::new(namespace.clone(), creation.name.clone());
        let location = creation
            .location
            .clone()
            .unwrap_or_else(|| self.default_location(&creation.name));
        let creation = TableCreation {
            location: Some(location.clone()),
            ..creation
        };
        let metadata = TableMetadataBuilder::from_table_creation(creation)?
            .build()?
            .metadata;
        let metadata_location = MetadataLocation::new_with_metadata(location, &metadata);
        metadata.write_to(&self.file_io, &metadata_location).await?;
        let metadata_location = metadata_location.to_string();
        let input = json!({
            "DatabaseName": self.database,
            "TableInput": Self::table_input(ident.name(), &metadata, &metadata_location, None, Map::new()),
        });
        match self.api.call("CreateTable", input).await {
            Ok(_) => {}
            Err(e) if e.is("AlreadyExistsException") => {
                return Err(iceberg::Error::new(
                    iceberg::ErrorKind::TableAlreadyExists,
                    format!(
                        "Glue table {}.{} already exists",
                        self.database,
                        ident.name()
                    ),
                ))
            }
            Err(e) => {
                return Err(glue_err(
                    &format!("CreateTable {}.{}", self.database, ident.name()),
                    e,
                ))
            }
        }
        Table::builder()
            .file_io(self.file_io.clone())
            .metadata_location(metadata_location)
            .identifier(ident)
            .metadata(metadata)
            .runtime(iceberg::Runtime::try_current()?)
            .build()
    }

    async fn load_table(&self, ident: &TableIdent) -> iceberg::Result<Table> {
        let Some(table) = self.get_table(ident.name()).await? else {
            return Err(iceberg::Error::new(
                iceberg::ErrorKind::TableNotFound,
                format!(
                    "Glue database {} has no table {}",
                    self.database,
                    ident.name()
                ),
            ));
        };
        let is_iceberg = table["Parameters"]["table_type"]
            .as_str()
            .is_some_and(|v| v.eq_ignore_ascii_case("ICEBERG"));
        let location = table["Parameters"][METADATA_LOCATION].as_str();
        match (is_iceberg, location) {
            (true, Some(location)) => self.build_table(ident.clone(), location.to_string()).await,
            _ => Err(iceberg::Error::new(
                iceberg::ErrorKind::DataInvalid,
                format!(
                    "Glue table {}.{} is not an Iceberg table (no table_type=ICEBERG and metadata_location); drop it or pick another glue_database_name",
                    self.database,
                    ident.name()
                ),
            )),
        }
    }

    async fn drop_table(&self, ident: &TableIdent) -> iceberg::Result<()> {
        match self
            .api
            .call(
                "DeleteTable",
                json!({ "DatabaseName": self.database, "Name": ident.name() }),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.is("EntityNotFoundException") => Err(iceberg::Error::new(
                iceberg::ErrorKind::TableNotFound,
                format!(
                    "Glue database {} has no table {}",
                    self.database,
                    ident.name()
                ),
            )),
            Err(e) => Err(glue_err(
                &format!("DeleteTable {}.{}", self.database, ident.name()),
                e,
            )),
        }
    }

    async fn purge_table(&self, ident: &TableIdent) -> iceberg::Result<()> {
        let table = self.load_table(ident).await?;
        self.drop_table(ident).await?;
        self.file_io
            .delete_prefix(table.metadata().location())
            .await
    }

    async fn table_exists(&self, ident: &TableIdent) -> iceberg::Result<bool> {
        Ok(self.get_table(ident.name()).await?.is_some())
    }

    async fn rename_table(&self, _src: &TableIdent, _dest: &TableIdent) -> iceberg::Result<()> {
        Err(iceberg::Error::new(
            iceberg::ErrorKind::FeatureUnsupported,
            "skipprd does not rename Glue tables",
        ))
    }

    async fn register_table(
        &self,
        ident: &TableIdent,
        metadata_location: String,
    ) -> iceberg::Result<Table> {
        let metadata = TableMetadata::read_from(&self.file_io, &metadata_location).await?;
        let input = json!({
            "DatabaseName": self.database,
            "TableInput": Self::table_input(ident.name(), &metadata, &metadata_location, None, Map::new()),
        });
        self.api.call("CreateTable", input).await.map_err(|e| {
            glue_err(
                &format!("CreateTable {}.{}", self.database, ident.name()),
                e,
            )
        })?;
        self.build_table(ident.clone(), metadata_location).await
    }

    /// iceberg's own transactions (fast appends, schema changes) commit here: the staged
    /// metadata is written, then the pointer is swapped as in [`GlueCatalog::swap`].
    async fn update_table(&self, commit: TableCommit) -> iceberg::Result<Table> {
        let ident = commit.identifier().clone();
        let current = self.load_table(&ident).await?;
        let old = current.metadata_location_result()?.to_string();
        let staged = commit.apply(current)?;
        let new = MetadataLocation::from_str(staged.metadata_location_result()?)?;
        staged.metadata().write_to(staged.file_io(), &new).await?;
        self.swap(&ident, &old, &new.to_string()).await?;
        self.build_table(ident, new.to_string()).await
    }
}

#[cfg(test)]
#[path = "glue_tests.rs"]
mod tests;
