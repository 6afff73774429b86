//! Queries: a DataFusion session over the workspace's live tables (Iceberg snapshot UNION
//! WAL tail), used by `skipprd query` and by the Postgres-wire gateway of `skipprd serve`.

pub mod as_of;
pub mod athena;
mod changelog;
pub mod committed;
mod cuts;
mod file_read;
pub mod format;
pub mod hidden;
pub mod limits;
mod listing;
pub mod live;
pub mod models;
pub mod naming;
pub mod numeric;
pub mod pipeline_view;
pub mod system;
pub mod tail;
pub mod tail_schema;
pub mod view;
pub mod wal_read;
pub mod yielding;

use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use datafusion::catalog::SchemaProvider;
use datafusion::datasource::TableProvider;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::prelude::{SessionConfig, SessionContext};
use iceberg::table::Table;
use iceberg::{NamespaceIdent, TableIdent};

use crate::catalog::LocalCatalog;
use crate::change::Lsn;
use crate::config::{Config, SinkConfig, TableRef};
use crate::error::{Context, Error, Result};
use crate::sink::iceberg::apply::whole_row_key;
use crate::table::schema as ice_schema;
use crate::wal::WalReader;
use live::LiveTable;
use tail::{ReducedCache, TailSnapshot};
use tail_schema::TableShape;
use view::{PipelineView, ViewHandle};
use wal_read::TailCache;

/// The DataFusion catalog that holds the workspace and the `skippr` system schema.
pub const CATALOG: &str = "skippr";
/// The schema of Skippr's system tables.
pub const SYSTEM_SCHEMA: &str = "skippr";

/// Where a replicated table lives.
#[derive(Debug, Clone)]
struct TableEntry {
    sink: usize,
    ident: TableIdent,
    /// The pipeline writing it (and the folder of its WAL), when one still does; for a
    /// changelog table, the table whose changes it holds.
    pipeline: Option<(String, WalReader, TableRef)>,
    /// It is the changelog table of `pipeline`'s table.
    changelog: bool,
}

/// A pipeline writing to one of the workspace's sinks.
#[derive(Debug, Clone, Default)]
struct Followed {
    tables: Vec<TableRef>,
    changelogs: BTreeMap<TableRef, String>,
}

struct PipelineEntry {
    name: String,
    wal: WalReader,
    /// The WAL's history, which time travel between commits reads.
    history: crate::wal::WalHistory,
    /// The tables it follows and the changelog table of each table that has one, by Iceberg
    /// name (a reload of `serve` may change both: see [`Workspace::follow`]).
    followed: RwLock<Followed>,
    /// Its state (how far its WAL was removed, for the read view's cut).
    state_file: crate::storage::state_file::StateFile,
    /// Its source, for the gateway's `skippr.wait_lsn(NULL)` (queries never connect to it).
    source: crate::config::PostgresConfig,
    /// The newest view read for statements, shared by those that arrive while it is read
    /// (see [`Workspace::current_view`]).
    latest: view::Latest,
}

/// Every replicated table of a workspace, read live. One per process, shared by queries.
pub struct Workspace {
    pub name: String,
    /// `skipprd_el_storage_path`: where the pipelines' state files are.
    pub storage_path: PathBuf,
    sinks: Vec<LocalCatalog>,
    /// For each sink, the pipelines writing to it.
    pipelines: Vec<Vec<PipelineEntry>>,
    tables: RwLock<BTreeMap<String, TableEntry>>,
    tail: TailCache,
    reduced: ReducedCache,
    /// Each table's shape, by table, for the metadata file it was read from: reading it
    /// (Arrow schema, recorded source columns, key) is the same for every statement until
    /// the next commit.
    shapes: std::sync::Mutex<HashMap<String, (String, Arc<TableShape>)>>,
    scan_caches: Arc<committed::ScanCaches>,
    /// The models built through the gateway, in the first `LocalIceberg` warehouse (none
    /// when the workspace has no such sink).
    pub models: Option<Arc<models::Models>>,
}

/// A table's live state at one moment.
pub struct LiveState {
    pub table: Table,
    pub pipeline: Option<String>,
    pub tail: Arc<TailSnapshot>,
    pub wal_bytes: u64,
    /// The LSN of the read view the state belongs to (none for a table no pipeline writes).
    pub visible_lsn: Option<Lsn>,
}

impl Workspace {
    /// Each pipeline's name and source, in the file's order.
    pub fn sources(&self) -> Vec<(String, crate::config::PostgresConfig)> {
        self.pipelines
            .iter()
            .flatten()
            .map(|p| (p.name.clone(), p.source.clone()))
            .collect()
    }
    /// Opens every sink of the configuration and lists the workspace's tables.
    pub async fn open(config: &Config) -> Result<Arc<Self>> {
        let mut sinks = Vec::new();
        let mut pipelines: Vec<Vec<PipelineEntry>> = Vec::new();
        let mut warehouses: Vec<String> = Vec::new();
        for p in &config.pipelines {
            // Pipelines writing to the same catalog share one sink.
            let warehouse = match &p.sink {
                SinkConfig::LocalIceberg { warehouse, .. } => warehouse.display().to_string(),
                SinkConfig::AthenaIceberg { sink, .. } => {
                    format!(
                        "glue:{}:{}:{}",
                        sink.region, sink.glue_database_name, sink.warehouse
                    )
                }
                SinkConfig::RestIceberg {
                    sink, namespace, ..
                } => format!(
                    "rest:{}:{}:{}",
                    sink.uri,
                    sink.warehouse.as_deref().unwrap_or_default(),
                    namespace.as_deref().unwrap_or_default()
                ),
            };
            let i = match warehouses.iter().position(|w| *w == warehouse) {
                Some(i) => i,
                None => {
                    warehouses.push(warehouse.clone());
                    sinks.push(LocalCatalog::for_sink(&p.sink).await?);
                    pipelines.push(Vec::new());
                    sinks.len() - 1
                }
            };
            pipelines[i].push(PipelineEntry {
                name: p.name.clone(),
                wal: WalReader::for_pipeline(&config.storage, &config.storage_path, &p.name)?,
                history: crate::wal::WalHistory::for_pipeline(
                    &config.storage,
                    &config.storage_path,
                    &p.name,
                    p.maintenance.snapshot_retention,
                )?,
                followed: RwLock::new(Followed {
                    tables: p.source.tables.clone(),
                    changelogs: p.changelogs.clone(),
                }),
                state_file: p.state_file.clone(),
                source: p.source.clone(),
                latest: view::Latest::default(),
            });
        }
        let scan_caches: Arc<committed::ScanCaches> = Arc::default();
        let protected = vec![
            config.workspace.clone(),
            SYSTEM_SCHEMA.to_string(),
            "pg_catalog".to_string(),
            "information_schema".to_string(),
        ];
        let models = sinks
            .iter()
            .find_map(|s| s.models(protected.clone()))
            .map(|c| Arc::new(models::Models::new(c, scan_caches.clone())));
        let ws = Arc::new(Self {
            name: config.workspace.clone(),
            storage_path: config.storage_path.clone(),
            sinks,
            pipelines,
            tables: RwLock::new(BTreeMap::new()),
            tail: TailCache::default(),
            reduced: ReducedCache::default(),
            shapes: Default::default(),
            scan_caches,
            models,
        });
        ws.refresh().await?;
        Ok(ws)
    }

    /// Lists the workspace's tables again (a first snapshot creates them while serving).
    pub async fn refresh(&self) -> Result<()> {
        let ns = NamespaceIdent::new(self.name.clone());
        let mut found = BTreeMap::new();
        for (i, sink) in self.sinks.iter().enumerate() {
            if !sink
                .catalog
                .namespace_exists(&ns)
                .await
                .context("reading the catalog")?
            {
                continue;
            }
            let followed: Vec<Followed> = self.pipelines[i]
                .iter()
                .map(|p| p.followed.read().unwrap_or_else(|e| e.into_inner()).clone())
                .collect();
            for ident in sink
                .catalog
                .list_tables(&ns)
                .await
                .context("listing the workspace's tables")?
            {
                let pipeline = self.pipelines[i].iter().zip(&followed).find_map(|(p, f)| {
                    f.tables
                        .iter()
                        .find(|t| t.iceberg_name() == ident.name())
                        .map(|t| (p.name.clone(), p.wal.clone(), t.clone()))
                });
                let changelog_of = match pipeline {
                    Some(_) => None,
                    None => self.pipelines[i].iter().zip(&followed).find_map(|(p, f)| {
                        f.changelogs
                            .iter()
                            .find(|(_, name)| name.as_str() == ident.name())
                            .map(|(t, _)| (p.name.clone(), p.wal.clone(), t.clone()))
                    }),
                };
                let changelog = changelog_of.is_some();
                found.insert(
                    ident.name().to_string(),
                    TableEntry {
                        sink: i,
                        ident,
                        pipeline: pipeline.or(changelog_of),
                        changelog,
                    },
                );
            }
        }
        *self.tables.write().unwrap_or_else(|e| e.into_inner()) = found;
        Ok(())
    }

    /// Takes the tables each pipeline of `config` follows now (a reload of `serve`); the
    /// next [`Workspace::refresh`] lists them under their pipeline.
    pub fn follow(&self, config: &Config) {
        for entry in self.pipelines.iter().flatten() {
            if let Some(p) = config.pipelines.iter().find(|p| p.name == entry.name) {
                *entry.followed.write().unwrap_or_else(|e| e.into_inner()) = Followed {
                    tables: p.source.tables.clone(),
                    changelogs: p.changelogs.clone(),
                };
            }
        }
    }

    pub fn table_names(&self) -> Vec<String> {
        self.tables
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned()
            .collect()
    }

    fn entry(&self, name: &str) -> Option<TableEntry> {
        self.tables
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
    }

    /// Every pipeline of the workspace, with where its source is now (see
    /// [`crate::pipeline::position`]).
    pub fn pipeline_positions(
        &self,
    ) -> Vec<(String, Arc<dyn crate::pipeline::position::SourcePosition>)> {
        self.pipelines
            .iter()
            .flatten()
            .map(|p| {
                (
                    p.name.clone(),
                    crate::pipeline::position::of(&p.name, &p.source),
                )
            })
            .collect()
    }

    fn pipeline(&self, name: &str) -> Option<&PipelineEntry> {
        self.pipelines.iter().flatten().find(|p| p.name == name)
    }

    /// The workspace's tables that `pipeline` writes, by name.
    fn entries_of(&self, pipeline: &str) -> Vec<(String, TableEntry)> {
        self.tables
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(_, e)| e.pipeline.as_ref().is_some_and(|p| p.0 == pipeline))
            .map(|(n, e)| (n.clone(), e.clone()))
            .collect()
    }

    /// Reads a table's committed snapshot and its WAL tail, consistently, in a view of its
    /// own (see [`view`]).
    pub async fn state(&self, name: &str) -> Result<Option<LiveState>> {
        self.state_with(name, &ViewHandle::default()).await
    }

    /// A table's state in the view `views` holds for the current statement.
    pub async fn state_with(&self, name: &str, views: &ViewHandle) -> Result<Option<LiveState>> {
        let Some(entry) = self.entry(name) else {
            return Ok(None);
        };
        let Some((pipeline, _, source)) = &entry.pipeline else {
            // Nothing writes it any more: its committed state is the whole of it.
            let table = self.sinks[entry.sink].load_current(&entry.ident).await?;
            let shape = self.shape(&table)?;
            let floor = crate::table::summary::committed_lsn(&table).unwrap_or_default();
            let tail = self.reduced.get_or_reduce(
                entry.ident.name(),
                &shape,
                &shape.source,
                &wal_read::WalRead::default(),
                floor,
                floor,
            )?;
            return Ok(Some(LiveState {
                table,
                pipeline: None,
                tail,
                wal_bytes: 0,
                visible_lsn: None,
            }));
        };
        let view = views.view(self, pipeline).await?;
        if let Some(reason) = view.refused.get(name) {
            return Err(Error::query(reason.clone()));
        }
        let Some(table) = view.tables.get(name).cloned() else {
            // Created after the view was read (a first copy while serving): not in it.
            return Ok(None);
        };
        self.state_in(name, &entry, source.clone(), table, &view)
            .map(Some)
    }

    fn state_in(
        &self,
        name: &str,
        entry: &TableEntry,
        source: TableRef,
        table: Table,
        view: &PipelineView,
    ) -> Result<LiveState> {
        let floor = crate::table::summary::committed_lsn(&table).unwrap_or_default();
        // A changelog's live rows are made when a statement reads it (`live_changelog`).
        let read = if entry.changelog {
            &wal_read::WalRead::default()
        } else {
            &view.read
        };
        let tail = self.reduced.get_or_reduce(
            entry.ident.name(),
            &self.shape(&table)?,
            &source,
            read,
            floor,
            view.lsn.max(floor),
        )?;
        tracing::trace!(table = name, floor = %floor, lsn = %view.lsn, "table in read view");
        Ok(LiveState {
            table,
            pipeline: Some(view.pipeline.clone()),
            tail,
            wal_bytes: view.read.bytes(),
            visible_lsn: Some(view.lsn),
        })
    }

    /// `table`'s shape as committed (the source named after the table), read once per
    /// metadata file.
    fn shape(&self, table: &Table) -> Result<Arc<TableShape>> {
        let name = table.identifier().to_string();
        let Some(location) = table.metadata_location() else {
            return Ok(Arc::new(shape_of(table, None)?));
        };
        {
            let shapes = self.shapes.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((at, shape)) = shapes.get(&name) {
                if at == location {
                    return Ok(shape.clone());
                }
            }
        }
        let shape = Arc::new(shape_of(table, None)?);
        self.shapes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name, (location.to_string(), shape.clone()));
        Ok(shape)
    }

    /// A table's committed schema and properties (no WAL read), for catalog lookups.
    pub async fn table_meta(
        &self,
        name: &str,
    ) -> Result<Option<(arrow::datatypes::SchemaRef, HashMap<String, String>)>> {
        let Some(entry) = self.entry(name) else {
            return Ok(None);
        };
        let table = self.sinks[entry.sink].load_current(&entry.ident).await?;
        Ok(Some((
            ice_schema::arrow_schema(&table)?,
            table.metadata().properties().clone(),
        )))
    }

    /// The live table `name` in the statement's read view, or `None` when the workspace
    /// has no such table.
    pub async fn live_table(
        &self,
        name: &str,
        views: &ViewHandle,
    ) -> Result<Option<Arc<dyn TableProvider>>> {
        if self.entry(name).is_none() {
            self.refresh().await?;
        }
        if let Some(entry) = self.entry(name).filter(|e| e.changelog) {
            return self.live_changelog(name, &entry, views).await;
        }
        let Some(state) = self.state_with(name, views).await? else {
            return Ok(None);
        };
        let shape = self.shape(&state.table)?;
        let keyed = !shape.key.is_empty();
        let key_cols = if keyed {
            shape.key.clone()
        } else {
            shape.row_key.clone()
        };
        let table = LiveTable::new(
            &state.table,
            key_cols,
            keyed,
            state.tail,
            self.scan_caches.clone(),
        )
        .await?;
        Ok(Some(Arc::new(table)))
    }

    /// Every table of the workspace at its current metadata (no WAL read), with the
    /// pipeline that writes it: what `skippr.cuts` reads the cuts' tags from.
    pub async fn committed_tables(&self) -> Result<Vec<(Option<String>, Table)>> {
        self.refresh().await?;
        let entries: Vec<TableEntry> = self
            .tables
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        let mut out = Vec::with_capacity(entries.len());
        for e in entries {
            let table = self.sinks[e.sink].load_current(&e.ident).await?;
            out.push((e.pipeline.map(|p| p.0), table));
        }
        Ok(out)
    }

    /// Every table's state, for `skippr.tables` and the metrics: the tables of a pipeline
    /// in one read view.
    pub async fn states(&self) -> Result<Vec<LiveState>> {
        self.refresh().await?;
        let views = ViewHandle::default();
        let mut out = Vec::new();
        for name in self.table_names() {
            // A table whose copy has not committed yet has no state to show.
            if let Some(entry) = self.entry(&name) {
                if let Some((pipeline, _, _)) = &entry.pipeline {
                    let view = views.view(self, pipeline).await?;
                    if !view.tables.contains_key(&name) && view.refused.contains_key(&name) {
                        continue;
                    }
                }
            }
            if let Some(s) = self.state_with(&name, &views).await? {
                out.push(s);
            }
        }
        Ok(out)
    }
}

/// The key layout of a table, as recorded in its properties.
fn shape_of(table: &Table, source: Option<TableRef>) -> Result<TableShape> {
    let schema = ice_schema::arrow_schema(table)?;
    let names: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
    let key = crate::table::primary_key(table.metadata().properties())
        .iter()
        .filter_map(|k| names.iter().position(|n| n == k))
        .collect();
    let source = source.unwrap_or_else(|| TableRef {
        schema: String::new(),
        name: table.identifier().name().to_string(),
    });
    Ok(TableShape {
        source,
        row_key: whole_row_key(table, &names),
        key,
        columns: crate::table::source_columns(table.metadata().properties()),
        tail_columns: Vec::new(),
        schema,
    })
}

/// The workspace as a DataFusion schema: each table is resolved live, in the read view of
/// the session's current statement (see [`view`]).
pub struct LiveSchema(pub Arc<Workspace>, pub Arc<ViewHandle>);

impl std::fmt::Debug for LiveSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LiveSchema({})", self.0.name)
    }
}

#[async_trait]
impl SchemaProvider for LiveSchema {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn table_names(&self) -> Vec<String> {
        self.0.table_names()
    }

    async fn table(&self, name: &str) -> DfResult<Option<Arc<dyn TableProvider>>> {
        self.0
            .live_table(name, &self.1)
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))
    }

    fn table_exist(&self, name: &str) -> bool {
        self.0.entry(name).is_some()
    }
}

/// A session configuration with the workspace as the default schema, its statements split
/// into `target_partitions` parts (`skippr.query.target_partitions`).
pub fn session_config(workspace: &str, target_partitions: usize) -> SessionConfig {
    SessionConfig::new()
        .with_target_partitions(target_partitions.max(1))
        .with_information_schema(true)
        .with_default_catalog_and_schema(CATALOG, workspace)
}

/// Registers the workspace's live schema and the system schema in `ctx`'s default catalog,
/// and the functions that answer as Postgres's do.
pub fn register(ctx: &SessionContext, ws: &Arc<Workspace>) -> Result<()> {
    register_with(ctx, ws, Arc::new(ViewHandle::default()))
}

/// Like [`register`], with the session's read views in `views` (moved back in time, say).
fn register_with(ctx: &SessionContext, ws: &Arc<Workspace>, views: Arc<ViewHandle>) -> Result<()> {
    // Postgres's avg(): a numeric mean of integers and numerics, rounded as Postgres rounds.
    ctx.register_udaf(numeric::avg());
    let catalog = ctx
        .catalog(CATALOG)
        .ok_or_else(|| Error::fatal("the query session has no default catalog"))?;
    catalog
        .register_schema(&ws.name, Arc::new(LiveSchema(ws.clone(), views)))
        .map_err(Error::from)?;
    if ws.name != SYSTEM_SCHEMA {
        catalog
            .register_schema(
                SYSTEM_SCHEMA,
                Arc::new(system::SystemSchema::new(ws.clone())),
            )
            .map_err(Error::from)?;
    }
    Ok(())
}

/// Builds a session where every table of the workspace is visible, live, as
/// `<workspace>.<table>`, and the workspace is the default schema; the models built through
/// the gateway are visible in their schemas.
/// Its statements run under `skippr.query`'s `statement_timeout` and `max_query_memory`.
pub async fn session(config: &Config) -> Result<SessionContext> {
    session_as_of(config, None).await
}

/// How long `skipprd query --as-of` waits for an LSN the WAL does not hold yet (as the
/// gateway's `skippr.wait_timeout` does by default).
const AS_OF_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Like [`session`], with the tables read as of `as_of` (`skipprd query --as-of`), as the
/// gateway's `SET skippr.as_of` reads them: an LSN not reached yet is waited for.
pub async fn session_as_of(config: &Config, as_of: Option<as_of::AsOf>) -> Result<SessionContext> {
    let ws = Workspace::open(config).await?;
    let limits = limits::Limits::from(&config.query);
    let runtime = limits::session_runtime(
        limits.max_memory,
        limits.max_query_memory,
        &limits::spill_path(config),
    )?;
    let state = datafusion::execution::SessionStateBuilder::new()
        .with_config(
            session_config(&config.workspace, config.query.target_partitions)
                .with_extension(Arc::new(limits)),
        )
        .with_runtime_env(runtime)
        .with_default_features()
        .with_physical_optimizer_rule(Arc::new(yielding::YieldPoints))
        .build();
    let ctx = SessionContext::new_with_state(state);
    let views = Arc::new(ViewHandle::default());
    if let Some(a) = as_of {
        let fence = match a {
            as_of::AsOf::Lsn(min_lsn) => Some(view::Fence {
                min_lsn,
                timeout: AS_OF_WAIT,
            }),
            _ => None,
        };
        views.begin_statement(fence, Some(a));
    }
    register_with(&ctx, &ws, views)?;
    register_models(&ctx, &ws).await?;
    Ok(ctx)
}

/// Registers the models schemas as they are committed now (a one-statement session sees
/// one state of them).
async fn register_models(ctx: &SessionContext, ws: &Workspace) -> Result<()> {
    let Some(models) = &ws.models else {
        return Ok(());
    };
    let state = models.state().await?;
    let catalog = ctx
        .catalog(CATALOG)
        .ok_or_else(|| Error::fatal("the query session has no default catalog"))?;
    let view: Arc<dyn models::ModelsView> = Arc::new(models::Fixed {
        state: state.clone(),
        session: models::session_of(ctx),
    });
    for name in &state.namespaces {
        catalog
            .register_schema(
                name,
                Arc::new(models::ModelSchema {
                    name: name.clone(),
                    models: models.clone(),
                    view: view.clone(),
                }),
            )
            .map_err(Error::from)?;
    }
    Ok(())
}

/// What the engine may plan for a reader: no DDL, no DML (`COPY ... TO` a file included), no
/// statement that changes the engine. The gateway and `skipprd query` both plan with these.
pub fn read_only_options() -> datafusion::execution::context::SQLOptions {
    datafusion::execution::context::SQLOptions::new()
        .with_allow_ddl(false)
        .with_allow_dml(false)
        .with_allow_statements(false)
}

/// Runs one SQL statement and collects its result, within the session's limits (see
/// [`session`]): past its timeout the statement is dropped, which stops its work. Only
/// reads are planned (see [`read_only_options`]).
pub async fn run(
    ctx: &SessionContext,
    sql: &str,
) -> Result<(arrow::datatypes::SchemaRef, Vec<arrow::array::RecordBatch>)> {
    let limits = ctx
        .state()
        .config()
        .get_extension::<limits::Limits>()
        .map(|l| *l);
    let work = async {
        let state = ctx.state();
        let dialect = state.config().options().sql_parser.dialect;
        let mut statement = state.sql_to_statement(sql, &dialect)?;
        if let datafusion::sql::parser::Statement::Statement(s) = &mut statement {
            // Columns named as Postgres names them (duplicates included).
            naming::name_like_postgres(s);
        }
        let plan = state.statement_to_plan(statement).await?;
        read_only_options().verify_plan(&plan)?;
        let df = ctx.execute_logical_plan(plan).await?;
        let schema = Arc::new(df.schema().as_arrow().clone());
        let batches = df.collect().await?;
        Ok::<_, DataFusionError>((schema, batches))
    };
    let done = match limits.and_then(|l| l.statement_timeout) {
        Some(t) => tokio::time::timeout(t, work)
            .await
            .map_err(|_| limits::timeout_error(t))?,
        None => work.await,
    };
    let (schema, batches) = done.map_err(|e| {
        limits
            .and_then(|l| limits::memory_error(&e, &l))
            .unwrap_or_else(|| query_error(e))
    })?;
    naming::rename_like_postgres(&schema, batches)
}

fn query_error(e: DataFusionError) -> Error {
    match e {
        DataFusionError::External(inner) => match inner.downcast::<Error>() {
            Ok(err) => *err,
            Err(other) => Error::query(other.to_string()),
        },
        DataFusionError::Context(_, inner) => query_error(*inner),
        other => Error::query(other.to_string()),
    }
}

/// Lag, in seconds, of a table's tail: how old its oldest uncommitted change is.
pub fn tail_lag_seconds(tail: &TailSnapshot) -> f64 {
    tail.oldest_commit_micros
        .map(|t| {
            let now = chrono::Utc::now().timestamp_micros();
            // Postgres commit times count from 2000-01-01.
            let t = t + 946_684_800_000_000;
            ((now - t) as f64 / 1e6).max(0.0)
        })
        .unwrap_or(0.0)
}

/// The committed LSN of a table, as text.
pub fn committed_lsn_text(table: &Table) -> String {
    crate::table::summary::committed_lsn(table)
        .unwrap_or_default()
        .to_string()
}
