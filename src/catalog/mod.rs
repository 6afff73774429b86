//! Catalogs: where Iceberg tables are registered. The `LocalIceberg` sink uses a sqlite SQL
//! catalog laid out exactly as PyIceberg's `SqlCatalog`; the `AthenaIceberg` sink uses AWS
//! Glue; the `RestIceberg` sink an Iceberg REST catalog. All sit behind [`SinkCatalog`]:
//! iceberg's `Catalog` for creating and loading tables, plus the commit our own snapshots
//! use (the compare-and-swap of the metadata pointer for sqlite and Glue; the changes with
//! their requirements for REST, several tables at once in a [`Round`]).

pub mod glue;
pub mod glue_api;
pub mod models;
pub mod rest;
pub mod rest_auth;
pub mod rest_checks;
mod round;
pub mod sql;

pub use round::Round;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use iceberg::io::FileIOBuilder;
use iceberg::table::Table;
use iceberg::{Catalog, NamespaceIdent, TableIdent};

use crate::config::{AthenaIcebergSink, RestIcebergSink, SinkConfig};
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
    /// Names the catalog among the process's catalogs (see [`pointers`]).
    key: String,
}

/// Where the metadata pointer of a table is read and swapped.
#[derive(Clone, Debug)]
enum Pointer {
    Sql(sql::SqlPointer),
    Glue(Arc<glue::GlueCatalog>),
    Rest(Arc<rest::RestCatalog>),
}

impl SinkCatalog {
    /// Opens (creating when missing) a local warehouse folder and its sqlite catalog.
    pub async fn open(warehouse: &Path) -> Result<Self> {
        let (catalog, pointer) = sql::open(warehouse).await?;
        Ok(Self {
            catalog,
            pointer: Pointer::Sql(pointer),
            loaded: Arc::default(),
            key: format!("sql:{}", warehouse.display()),
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
            vended: None,
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
            key: format!("glue:{}:{}", sink.region, sink.glue_database_name),
        })
    }

    /// The REST catalog of a `RestIceberg` sink (every table in `namespace` when given,
    /// else in the namespace asked for). Nothing is contacted yet.
    pub fn open_rest(sink: &RestIcebergSink, namespace: Option<&str>) -> Result<Self> {
        let rest = rest::RestCatalog::new(sink, namespace)?;
        Ok(Self {
            catalog: rest.clone(),
            pointer: Pointer::Rest(rest),
            loaded: Arc::default(),
            key: format!(
                "rest:{}:{}",
                sink.uri,
                sink.warehouse.as_deref().unwrap_or_default()
            ),
        })
    }

    /// The REST catalog, when this is one (it writes table metadata itself: commits send
    /// changes, see [`SinkCatalog::commit_changes`]).
    pub fn rest(&self) -> Option<&Arc<rest::RestCatalog>> {
        match &self.pointer {
            Pointer::Rest(r) => Some(r),
            _ => None,
        }
    }

    /// The catalog a pipeline's data sink names (its sqlite warehouse or Glue database).
    pub async fn for_sink(sink: &SinkConfig) -> Result<Self> {
        match sink {
            SinkConfig::LocalIceberg { warehouse, .. } => Self::open(warehouse).await,
            SinkConfig::AthenaIceberg { sink, .. } => Self::open_glue(sink),
            SinkConfig::RestIceberg {
                sink, namespace, ..
            } => Self::open_rest(sink, namespace.as_deref()),
        }
    }

    /// The models (schemas, tables and views built through the gateway) of this catalog,
    /// beside its replicated tables; `protected` namespaces are never models. Only the
    /// sqlite catalog of a `LocalIceberg` warehouse holds models.
    pub fn models(&self, protected: Vec<String>) -> Option<models::ModelsCatalog> {
        match &self.pointer {
            Pointer::Sql(p) => {
                let db = p.db().to_path_buf();
                let warehouse = db.parent()?.to_path_buf();
                Some(models::ModelsCatalog::new(db, &warehouse, protected))
            }
            Pointer::Glue(_) | Pointer::Rest(_) => None,
        }
    }

    /// The table's current state for a query. While its metadata file has not changed,
    /// the table loaded before is returned (one catalog lookup instead of reading and
    /// parsing the metadata, the manifest list and every manifest again).
    pub async fn load_current(&self, ident: &TableIdent) -> Result<Table> {
        self.load_current_of(ident, None).await
    }

    /// Like [`LocalCatalog::load_current`], for a table that `pipeline` writes: while this
    /// process holds that pipeline's lease, the pointer read from Glue is remembered, so the
    /// next statements need no lookup until the lease changes hands.
    pub async fn load_current_of(
        &self,
        ident: &TableIdent,
        pipeline: Option<&str>,
    ) -> Result<Table> {
        // Glue: where this process itself last pointed a table it writes needs no lookup.
        if let (Pointer::Glue(g), Some(known)) = (&self.pointer, pointers::get(&self.key, ident)) {
            if let Some(table) = self.cached(ident, &known) {
                return Ok(table);
            }
            let table = g
                .build_table(ident.clone(), known)
                .await
                .with_context(|| format!("loading Iceberg table {ident}"))?;
            return Ok(self.keep(ident, table));
        }
        // REST: the load answers the metadata location; a table loaded before at the same
        // location keeps its cache of manifests.
        if let Pointer::Rest(r) = &self.pointer {
            let table = r
                .load_table(ident)
                .await
                .with_context(|| format!("loading Iceberg table {ident}"))?;
            if let Some(cached) = table
                .metadata_location()
                .and_then(|l| self.cached(ident, l))
            {
                return Ok(cached);
            }
            return Ok(self.keep(ident, table));
        }
        let location = match self.metadata_location(ident).await {
            Ok(Some(location)) => {
                if let Some(pipeline) = pipeline {
                    // Kept only under the current hold of this process (see `pointers`).
                    self.remember(ident, &location, pipeline);
                }
                Some(location)
            }
            Ok(None) => None,
            Err(e) => {
                tracing::debug!(table = %ident, error = %e, "metadata location lookup failed; loading the table");
                None
            }
        };
        if let Some(table) = location.and_then(|l| self.cached(ident, &l)) {
            return Ok(table);
        }
        let table = self
            .catalog
            .load_table(ident)
            .await
            .with_context(|| format!("loading Iceberg table {ident}"))?;
        Ok(self.keep(ident, table))
    }

    /// Keeps a loaded table for the next load of the same metadata.
    fn keep(&self, ident: &TableIdent, table: Table) -> Table {
        self.loaded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(ident.clone(), table.clone());
        table
    }

    /// The table loaded before, if its metadata file is `location`.
    fn cached(&self, ident: &TableIdent, location: &str) -> Option<Table> {
        let loaded = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        loaded
            .get(ident)
            .filter(|t| t.metadata_location() == Some(location))
            .cloned()
    }

    /// Records that this process pointed `ident` at `location` while writing it for
    /// `pipeline` (see [`pointers`]).
    pub fn remember(&self, ident: &TableIdent, location: &str, pipeline: &str) {
        if matches!(self.pointer, Pointer::Glue(_)) {
            pointers::set(&self.key, ident, location, pipeline);
        }
    }

    /// Forgets where this process pointed `ident` (the table is dropped or replaced).
    pub fn forget(&self, ident: &TableIdent) {
        pointers::forget(&self.key, ident);
    }

    /// Where the catalog points `ident` now, or `None` when it has no such table.
    async fn metadata_location(&self, ident: &TableIdent) -> Result<Option<String>> {
        match &self.pointer {
            Pointer::Sql(p) => p.metadata_location(ident).await,
            Pointer::Glue(g) => g
                .metadata_location(ident)
                .await
                .with_context(|| format!("reading the Glue entry of {ident}")),
            Pointer::Rest(r) => match r.load_table(ident).await {
                Ok(t) => Ok(t.metadata_location().map(str::to_string)),
                Err(e) if e.kind() == iceberg::ErrorKind::TableNotFound => Ok(None),
                Err(e) => Err(Error::from(e)).with_context(|| format!("loading {ident}")),
            },
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
            Pointer::Rest(_) => Err(Error::fatal(
                "a REST catalog writes table metadata itself: its commits send changes, not a new metadata file",
            )),
        }
    }

    /// Compare-and-swaps of several tables' pointers in one catalog transaction, when the
    /// catalog has transactions (the SQL catalog): returns `false`, having done nothing,
    /// when it has not, and the caller swaps them one by one.
    pub async fn swap_metadata_together(
        &self,
        swaps: &[(&TableIdent, &str, &str)],
    ) -> Result<bool> {
        match &self.pointer {
            Pointer::Sql(p) => p.swap_all(swaps).await.map(|()| true),
            Pointer::Glue(_) | Pointer::Rest(_) => Ok(false),
        }
    }

    /// Commits to a REST catalog: `updates` (which made `new` from the table's metadata)
    /// with the requirements that keep a concurrent writer from being overwritten. Inside
    /// a [`Round`] and when the catalog offers multi-table commits, the change is staged
    /// and sent with the round's other tables in one request; the table returned is then
    /// the table as it will be.
    pub async fn commit_changes(
        &self,
        table: &Table,
        new: iceberg::spec::TableMetadata,
        updates: Vec<iceberg::TableUpdate>,
    ) -> Result<Table> {
        let Pointer::Rest(rest) = &self.pointer else {
            return Err(Error::fatal(
                "changes committed to a catalog that is not REST",
            ));
        };
        let ident = table.identifier();
        let change = rest::table_change(&table.metadata_ref(), updates);
        let retryable = |e: iceberg::Error| {
            if e.retryable() || e.kind() == iceberg::ErrorKind::CatalogCommitConflicts {
                Error::new(ErrorKind::Retryable, format!("{e}; it will be retried"))
            } else {
                Error::from(e)
            }
        };
        let change = if rest.offers_transactions().await.map_err(retryable)? {
            match Round::stage(&self.key, rest, ident, change) {
                Some(change) => change,
                None => {
                    return Table::builder()
                        .file_io(table.file_io().clone())
                        .metadata(new)
                        .identifier(ident.clone())
                        .runtime(
                            iceberg::Runtime::try_current().context("finding the async runtime")?,
                        )
                        .build()
                        .with_context(|| format!("describing Iceberg table {ident}"))
                }
            }
        } else {
            change
        };
        rest.commit(ident, change, table.file_io().clone())
            .await
            .map_err(retryable)
            .with_context(|| format!("committing to Iceberg table {ident}"))
    }
}

/// Where this process pointed the tables it writes (S3 mode, Glue): queries in the same
/// process (`serve`) then need no Glue lookup per statement. An entry is trusted only while
/// the lease hold it was recorded under is current: under one hold no other process commits
/// to the pipeline's tables, so the last pointer this process set is the catalog's.
mod pointers {
    use std::collections::HashMap;
    use std::sync::{Mutex, MutexGuard, OnceLock};

    use iceberg::TableIdent;

    use crate::storage::lease::current_hold;

    struct Known {
        location: String,
        pipeline: String,
        hold: u64,
    }

    fn known() -> MutexGuard<'static, HashMap<(String, TableIdent), Known>> {
        static KNOWN: OnceLock<Mutex<HashMap<(String, TableIdent), Known>>> = OnceLock::new();
        KNOWN
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn set(catalog: &str, ident: &TableIdent, location: &str, pipeline: &str) {
        let Some(hold) = current_hold(pipeline) else {
            return;
        };
        known().insert(
            (catalog.to_string(), ident.clone()),
            Known {
                location: location.to_string(),
                pipeline: pipeline.to_string(),
                hold,
            },
        );
    }

    pub(super) fn forget(catalog: &str, ident: &TableIdent) {
        known().remove(&(catalog.to_string(), ident.clone()));
    }

    pub(super) fn get(catalog: &str, ident: &TableIdent) -> Option<String> {
        let mut known = known();
        let key = (catalog.to_string(), ident.clone());
        let k = known.get(&key)?;
        if current_hold(&k.pipeline) == Some(k.hold) {
            return Some(k.location.clone());
        }
        known.remove(&key);
        None
    }
}
