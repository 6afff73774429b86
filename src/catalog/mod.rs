//! Catalogs: where Iceberg tables are registered. The `LocalIceberg` sink uses a sqlite SQL
//! catalog laid out exactly as PyIceberg's `SqlCatalog`; the `AthenaIceberg` sink uses AWS
//! Glue. Both sit behind [`SinkCatalog`]: iceberg's `Catalog` for creating and loading
//! tables, plus the compare-and-swap of the metadata pointer that our own commits use.

pub mod glue;
pub mod glue_api;
pub mod sql;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use iceberg::io::FileIOBuilder;
use iceberg::table::Table;
use iceberg::{Catalog, NamespaceIdent, TableIdent};

use crate::config::{AthenaIcebergSink, SinkConfig};
use crate::error::{Context, Error, ErrorKind, Result};
use crate::storage::iceberg_io::ObjectStorageFactory;
use crate::storage::{aws, Location, Store};

/// The catalog name under which Skippr registers its tables.
pub const CATALOG_NAME: &str = "skippr";

/// The name the stages used when the sqlite catalog was the only one; it is the same type.
pub use SinkCatalog as LocalCatalog;

/// A sink's catalog (sqlite or Glue) and its tables.
#[derive(Clone, Debug)]
pub struct SinkCatalog {
    pub catalog: Arc<dyn Catalog>,
    pointer: Pointer,
    /// Tables as last loaded for queries, reused while their metadata file is current:
    /// a reused table keeps Iceberg's cache of parsed manifest lists and manifests, which
    /// otherwise every query would read and decode again.
    loaded: Arc<Mutex<HashMap<TableIdent, Table>>>,
}

/// Where the metadata pointer of a table is read and swapped.
#[derive(Clone, Debug)]
enum Pointer {
    Sql(sql::SqlPointer),
    Glue(Arc<glue::GlueCatalog>),
}

impl SinkCatalog {
    /// Opens (creating when missing) a local warehouse folder and its sqlite catalog.
    pub async fn open(warehouse: &Path) -> Result<Self> {
        let (catalog, pointer) = sql::open(warehouse).await?;
        Ok(Self {
            catalog,
            pointer: Pointer::Sql(pointer),
            loaded: Arc::default(),
        })
    }

    /// The Glue catalog of an `AthenaIceberg` sink, with its `s3://` warehouse. Nothing is
    /// contacted yet.
    pub fn open_glue(sink: &AthenaIcebergSink) -> Result<Self> {
        let location = Location::parse_s3(&sink.warehouse).map_err(Error::config)?;
        let region = aws::region(Some(sink.region.as_str()));
        let store = Store::open(&location, Some(&region))?;
        let s3 = store
            .s3()
            .cloned()
            .ok_or_else(|| Error::fatal("an s3:// warehouse opened as a local store"))?;
        let api = Arc::new(glue_api::http_glue(&region, s3)?);
        let file_io = FileIOBuilder::new(Arc::new(ObjectStorageFactory {
            region: Some(region),
        }))
        .build();
        let glue = Arc::new(glue::GlueCatalog::new(
            api,
            &sink.glue_database_name,
            &location.display(),
            file_io,
        ));
        Ok(Self {
            catalog: glue.clone(),
            pointer: Pointer::Glue(glue),
            loaded: Arc::default(),
        })
    }

    /// The catalog a pipeline's data sink names (its sqlite warehouse or Glue database).
    pub async fn for_sink(sink: &SinkConfig) -> Result<Self> {
        match sink {
            SinkConfig::LocalIceberg { warehouse, .. } => Self::open(warehouse).await,
            SinkConfig::AthenaIceberg { sink, .. } => Self::open_glue(sink),
        }
    }

    /// The table's current state for a query. While its metadata file has not changed,
    /// the table loaded before is returned (one catalog lookup instead of reading and
    /// parsing the metadata, the manifest list and every manifest again).
    pub async fn load_current(&self, ident: &TableIdent) -> Result<Table> {
        let location = match self.metadata_location(ident).await {
            Ok(location) => location,
            Err(e) => {
                tracing::debug!(table = %ident, error = %e, "metadata location lookup failed; loading the table");
                None
            }
        };
        if let Some(location) = &location {
            let loaded = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(table) = loaded.get(ident) {
                if table.metadata_location() == Some(location.as_str()) {
                    return Ok(table.clone());
                }
            }
        }
        let table = self
            .catalog
            .load_table(ident)
            .await
            .with_context(|| format!("loading Iceberg table {ident}"))?;
        self.loaded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(ident.clone(), table.clone());
        Ok(table)
    }

    /// Where the catalog points `ident` now, or `None` when it has no such table.
    async fn metadata_location(&self, ident: &TableIdent) -> Result<Option<String>> {
        match &self.pointer {
            Pointer::Sql(p) => p.metadata_location(ident).await,
            Pointer::Glue(g) => g
                .metadata_location(ident)
                .await
                .with_context(|| format!("reading the Glue entry of {ident}")),
        }
    }

    /// Creates the namespace (the workspace; for Glue, the sink's database) when missing.
    pub async fn ensure_namespace(&self, namespace: &str) -> Result<NamespaceIdent> {
        let ns = NamespaceIdent::new(namespace.to_string());
        if !self
            .catalog
            .namespace_exists(&ns)
            .await
            .context("checking the workspace namespace")?
        {
            self.catalog
                .create_namespace(&ns, HashMap::new())
                .await
                .with_context(|| format!("creating namespace `{namespace}` in the catalog"))?;
        }
        Ok(ns)
    }

    /// Points `ident` at `new` if it still points at `old`: the atomic step of a commit.
    /// A concurrent writer is reported as a retryable conflict, never overwritten.
    pub async fn swap_metadata(&self, ident: &TableIdent, old: &str, new: &str) -> Result<()> {
        match &self.pointer {
            Pointer::Sql(p) => p.swap(ident, old, new).await,
            Pointer::Glue(g) => match g.swap(ident, old, new).await {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == iceberg::ErrorKind::CatalogCommitConflicts => Err(
                    Error::new(ErrorKind::Retryable, format!("{e}; it will be retried")),
                ),
                Err(e) => Err(Error::from(e))
                    .with_context(|| format!("committing to Iceberg table {ident} in Glue")),
            },
        }
    }
}
