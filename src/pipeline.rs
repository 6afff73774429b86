//! `skipprd sync`: runs one pipeline from the source to the sink. Today that is the
//! consistent snapshot of every table not yet copied, committed to Iceberg with its LSN.

use std::fs::File;
use std::path::Path;

use tokio::sync::watch;
use tokio_postgres::Client;

use crate::cdc;
use crate::storage::{Location, Store};
use crate::wal::WalStore;

pub mod state;
use state::{PipelineState, TableState};

use crate::catalog::LocalCatalog;
use crate::change::Lsn;
use crate::config::TableRef;
use crate::config::{CdcMode, Config, PipelineConfig, SinkConfig};
use crate::error::{Context, Error, ErrorKind, Result};
use crate::sink::iceberg::{
    commit, schema as ice_schema, PROP_PRIMARY_KEY, PROP_SOURCE, SUMMARY_PIPELINE,
};
use crate::source::postgres::connect::connect;
use crate::source::postgres::schema::{check_partition_overlap, describe, TableSchema};
use crate::source::postgres::slot::{self, create_slot_exporting_snapshot, slot_info};
use crate::source::postgres::snapshot::{copy_tables, TableJob};

/// What one `sync --once` did.
#[derive(Debug, Default)]
pub struct SyncReport {
    pub copied: Vec<String>,
    pub skipped: Vec<String>,
}

/// An exclusive lock on a pipeline, held for the life of the value.
pub struct PipelineLock {
    _file: File,
}

impl PipelineLock {
    pub fn acquire(config: &Config, pipeline: &str) -> Result<Self> {
        let dir = config.storage_path.join("pipelines");
        std::fs::create_dir_all(&dir).with_context(|| {
            format!(
                "cannot create the state folder {}; check skipprd_el_storage_path and its permissions",
                dir.display()
            )
        })?;
        let path = dir.join(format!("{pipeline}.lock"));
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("cannot open the lock file {}", path.display()))?;
        match file.try_lock() {
            Ok(()) => Ok(Self { _file: file }),
            Err(std::fs::TryLockError::WouldBlock) => Err(Error::new(
                ErrorKind::Source,
                format!(
                    "pipeline `{pipeline}` is already running in another skipprd process (lock {}); stop it first",
                    path.display()
                ),
            )),
            Err(std::fs::TryLockError::Error(e)) => {
                Err(Error::from(e)).with_context(|| format!("cannot lock {}", path.display()))
            }
        }
    }
}

/// Opens the pipeline's sink catalog.
pub async fn open_sink(p: &PipelineConfig) -> Result<LocalCatalog> {
    match &p.sink {
        SinkConfig::LocalIceberg { warehouse, .. } => LocalCatalog::open(warehouse).await,
        SinkConfig::AthenaIceberg { sink, .. } => LocalCatalog::open_glue(sink),
    }
}

/// The WAL of a pipeline.
pub fn wal_store(config: &Config, p: &PipelineConfig) -> Result<WalStore> {
    match &config.storage {
        Location::Local(_) => WalStore::open(&config.storage_path.join("wal").join(&p.name)),
        s3 => Ok(WalStore::on_objects(
            Store::open(s3, None)?,
            &format!("wal/{}", p.name),
        )),
    }
}

/// Where a reader (`query`, `serve`) finds a pipeline's WAL without disturbing its writer.
#[derive(Debug, Clone)]
pub enum WalReader {
    /// A local folder, which may not exist until the first segment is written.
    Dir(std::path::PathBuf),
    /// Objects under a prefix (S3 mode).
    Objects(WalStore),
}

impl WalReader {
    pub fn open(&self) -> Option<WalStore> {
        match self {
            Self::Dir(dir) => WalStore::reader(dir),
            Self::Objects(store) => Some(store.clone()),
        }
    }
}

/// The WAL of a pipeline, for reading only.
pub fn wal_reader(config: &Config, p: &PipelineConfig) -> Result<WalReader> {
    Ok(match &config.storage {
        Location::Local(_) => WalReader::Dir(config.storage_path.join("wal").join(&p.name)),
        s3 => WalReader::Objects(WalStore::on_objects(
            Store::open(s3, None)?,
            &format!("wal/{}", p.name),
        )),
    })
}

/// `sync`: the snapshot of every table not yet copied, then (in the CDC modes) the change
/// stream: up to the server's position at the start of the call with `once`, or until
/// `shutdown` otherwise.
pub async fn sync(
    config: &Config,
    p: &PipelineConfig,
    once: bool,
    resnapshot: bool,
    shutdown: watch::Receiver<bool>,
) -> Result<SyncReport> {
    let _lock = PipelineLock::acquire(config, &p.name)?;
    let _lease = state::hold_lease(config, &p.name).await?;
    if resnapshot {
        resnapshot_reset(config, p).await?;
    }
    let mut report = snapshot_phase(config, p).await?;
    if p.source.cdc_mode.needs_replication() {
        let catalog = open_sink(p).await?;
        let namespace = catalog.ensure_namespace(&config.workspace).await?;
        let wal = wal_store(config, p)?;
        if once {
            let client = connect(&p.source).await?;
            cdc::catch_up_once(p, &wal, &catalog, &namespace, &client).await?;
        } else {
            loop {
                // The stream stops (flushed, committed, acknowledged) when the user asks or
                // when a followed partitioned table gains or loses a partition; the table is
                // then copied again and the stream goes on.
                let (stop_tx, stop_rx) = watch::channel(false);
                let watcher = tokio::spawn(watch_partitions(p.clone(), shutdown.clone(), stop_tx));
                let streamed = cdc::run_continuous(p, &wal, &catalog, &namespace, stop_rx).await;
                watcher.abort();
                streamed?;
                if *shutdown.borrow() {
                    break;
                }
                let again = snapshot_phase(config, p).await?;
                report.copied.extend(again.copied);
            }
        }
    }
    Ok(report)
}

/// How often a continuous sync looks for attached or detached partitions.
const PARTITION_CHECK_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// Turns `stop` true when `shutdown` does, or when a followed partitioned table's partitions
/// differ from those recorded when it was copied. A source that cannot be read now is
/// retried at the next interval (the stream reports a lasting failure itself).
async fn watch_partitions(
    p: PipelineConfig,
    mut shutdown: watch::Receiver<bool>,
    stop: watch::Sender<bool>,
) {
    loop {
        if *shutdown.borrow() {
            let _ = stop.send(true);
            return;
        }
        tokio::select! {
            changed = shutdown.changed() => {
                if changed.is_err() {
                    // Nobody can ask for a stop any more: keep checking at the interval.
                    tokio::time::sleep(PARTITION_CHECK_INTERVAL).await;
                }
                continue;
            }
            _ = tokio::time::sleep(PARTITION_CHECK_INTERVAL) => {}
        }
        match partitions_changed(&p).await {
            Ok(Some(table)) => {
                tracing::info!(pipeline = %p.name, table = %table, "partitions attached or detached: stopping the stream to copy the table again");
                let _ = stop.send(true);
                return;
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(pipeline = %p.name, error = %e.report(), "cannot check the partitions of the followed tables; trying again");
            }
        }
    }
}

/// The first followed partitioned table whose partitions differ from the recorded ones.
async fn partitions_changed(p: &PipelineConfig) -> Result<Option<TableRef>> {
    let Some(state) = PipelineState::load(&p.state_file)? else {
        return Ok(None);
    };
    let client = connect(&p.source).await?;
    for t in &p.source.tables {
        let Some(recorded) = state.table(t) else {
            continue;
        };
        let ts = describe(&client, t).await?;
        if ts.partitioned && ts.partitions != recorded.partitions {
            return Ok(Some(t.clone()));
        }
    }
    Ok(None)
}

/// Drops the pipeline's tables, WAL and slot so the next snapshot starts from scratch.
async fn resnapshot_reset(config: &Config, p: &PipelineConfig) -> Result<()> {
    let catalog = open_sink(p).await?;
    let namespace = catalog.ensure_namespace(&config.workspace).await?;
    for t in &p.source.tables {
        let ident = iceberg::TableIdent::new(namespace.clone(), t.iceberg_name());
        if iceberg::Catalog::table_exists(catalog.catalog.as_ref(), &ident)
            .await
            .context("looking up a table")?
        {
            iceberg::Catalog::drop_table(catalog.catalog.as_ref(), &ident)
                .await
                .with_context(|| format!("dropping Iceberg table {ident} for the re-snapshot"))?;
        }
    }
    wal_store(config, p)?.clear()?;
    PipelineState::remove(&p.state_file)?;
    if p.source.cdc_mode.needs_replication() {
        let client = connect(&p.source).await?;
        if slot_info(&client, &p.source.slot).await?.is_some() {
            client
                .execute("SELECT pg_drop_replication_slot($1)", &[&p.source.slot])
                .await
                .with_context(|| format!("dropping replication slot `{}` for the re-snapshot (is another process using it?)", p.source.slot))?;
        }
    }
    tracing::info!(pipeline = %p.name, "re-snapshot: tables, WAL and slot reset");
    Ok(())
}

/// The snapshot of every table that has no committed snapshot yet, or whose committed rows
/// can no longer be trusted to be complete (see [`copy_again`]).
async fn snapshot_phase(config: &Config, p: &PipelineConfig) -> Result<SyncReport> {
    let cfg = &p.source;
    let catalog = open_sink(p).await?;
    let namespace = catalog.ensure_namespace(&config.workspace).await?;
    let client = connect(cfg).await?;

    let mut schemas = Vec::new();
    for t in &cfg.tables {
        schemas.push(describe(&client, t).await?);
    }
    check_partition_overlap(&schemas)?;
    if cfg.cdc_mode.needs_replication() {
        check_replication_ready(&client, p, &schemas).await?;
    }

    let prior = PipelineState::load(&p.state_file)?;
    // Tables that left `tables:` leave the state: nothing follows them any more.
    let mut state = PipelineState {
        wal_removed_through: prior
            .as_ref()
            .map(|s| s.wal_removed_through)
            .unwrap_or_default(),
        ..PipelineState::default()
    };
    let mut report = SyncReport::default();
    let mut todo = Vec::new();
    let mut synced_partitioned = Vec::new();
    for ts in schemas {
        let table = ice_schema::create_or_load(&catalog, &namespace, &ts).await?;
        let Some(lsn) = commit::committed_lsn(&table) else {
            remove_uncommitted_files(&table)?;
            todo.push(job(ts, table, false)?);
            continue;
        };
        check_owner(&table, &ts, p)?;
        let recorded = prior.as_ref().and_then(|s| s.table(&ts.table));
        match copy_again(prior.as_ref(), recorded, &ts, lsn) {
            None => {
                // Without a state yet (a pipeline from before it was kept), adopt what
                // Iceberg records.
                let watermark = recorded.map(|r| r.watermark).unwrap_or(lsn).max(lsn);
                let partitions = recorded
                    .map(|r| r.partitions.clone())
                    .unwrap_or_else(|| ts.partitions.clone());
                state.tables.insert(
                    ts.table.to_string(),
                    TableState {
                        watermark,
                        partitions,
                        copying_at: None,
                    },
                );
                if ts.partitioned {
                    synced_partitioned.push(ts.table.to_string());
                }
                report.skipped.push(ts.table.to_string());
            }
            Some(reason) => {
                tracing::warn!(table = %ts.table, committed_lsn = %lsn, reason = %reason, "copying the table again");
                let (table, replace) = if same_columns(&table, &ts) {
                    (table, true)
                } else {
                    // The source's columns changed while nothing followed them: start the
                    // Iceberg table afresh from the source's current shape.
                    (recreate(&catalog, &namespace, &ts).await?, false)
                };
                todo.push(job(ts, table, replace)?);
            }
        }
    }

    if cfg.cdc_mode.needs_replication() {
        let via_root = require_via_root(&client, p, &todo, &synced_partitioned).await?;
        require_published(&client, p, &report).await?;
        slot::ensure_publication(&client, cfg, via_root).await?;
        require_slot_if_synced(&client, p, &report).await?;
        require_slot_not_moved(config, &client, p, &report, prior.is_some(), &state).await?;
    }

    match cfg.cdc_mode {
        CdcMode::SnapshotOnly => {
            if !todo.is_empty() {
                // A plain transaction exports the snapshot; its LSN is informational.
                let exporter = connect(cfg).await?;
                exporter
                    .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                    .await
                    .context("starting the snapshot transaction")?;
                let row = exporter
                    .query_one(
                        "SELECT pg_export_snapshot(), pg_current_wal_lsn()::text",
                        &[],
                    )
                    .await
                    .context("exporting a snapshot")?;
                let name: String = row.get(0);
                let lsn = Lsn::parse(&row.get::<_, String>(1)).map_err(Error::fatal)?;
                report.copied = names(&todo);
                mark_copying(&mut state, &todo, lsn, &p.state_file)?;
                copy_tables(cfg, &name, lsn, todo, &catalog, &p.name).await?;
                exporter
                    .batch_execute("COMMIT")
                    .await
                    .context("ending the snapshot")?;
            }
        }
        CdcMode::SnapshotThenCdc => {
            if !todo.is_empty() {
                let existing = slot_info(&client, &cfg.slot).await?;
                // The pipeline's slot is created once, with the first snapshot. A later snapshot
                // (an interrupted one, or a table added since) uses a temporary slot of its own:
                // the pipeline slot keeps what it holds, and each table records its own LSN.
                let exported = match existing {
                    None => create_slot_exporting_snapshot(cfg, &cfg.slot, false).await?,
                    Some(_) => {
                        let tmp = format!("{}_snap_{}", cfg.slot, std::process::id());
                        create_slot_exporting_snapshot(cfg, &tmp, true).await?
                    }
                };
                report.copied = names(&todo);
                let lsn = exported.consistent_point;
                mark_copying(&mut state, &todo, lsn, &p.state_file)?;
                copy_tables(cfg, &exported.snapshot_name, lsn, todo, &catalog, &p.name).await?;
                drop(exported.session);
            }
        }
        CdcMode::CdcOnly => {
            let start = match slot_info(&client, &cfg.slot).await? {
                Some(s) => s.confirmed_flush.unwrap_or_default(),
                None => {
                    let created = create_slot_exporting_snapshot(cfg, &cfg.slot, false).await?;
                    created.consistent_point
                }
            };
            // No snapshot: each new table starts empty at the slot's position.
            mark_copying(&mut state, &todo, start, &p.state_file)?;
            for job in todo {
                if job.replace {
                    commit::replace(&catalog, &job.table, Vec::new(), start, "cdc", &p.name)
                        .await?;
                } else {
                    commit::append(&catalog, &job.table, Vec::new(), start, "cdc", &p.name).await?;
                }
                report.copied.push(job.schema.table.to_string());
            }
        }
    }
    for t in state.tables.values_mut() {
        if let Some(lsn) = t.copying_at.take() {
            t.watermark = lsn;
        }
    }
    state.save(&p.state_file)?;
    Ok(report)
}

fn job(schema: TableSchema, table: iceberg::table::Table, replace: bool) -> Result<TableJob> {
    let arrow = ice_schema::arrow_schema(&table)?;
    Ok(TableJob {
        schema,
        table,
        arrow,
        replace,
    })
}

/// Records the tables about to be copied at `lsn` before the copy starts, so that a copy cut
/// short is found and started over (see [`TableState::copying_at`]).
fn mark_copying(
    state: &mut PipelineState,
    todo: &[TableJob],
    lsn: Lsn,
    path: &state::StateFile,
) -> Result<()> {
    for j in todo {
        state.tables.insert(
            j.schema.table.to_string(),
            TableState {
                watermark: Lsn::default(),
                partitions: j.schema.partitions.clone(),
                copying_at: Some(lsn),
            },
        );
    }
    state.save(path)
}

/// Why a table whose Iceberg table records `lsn` must be copied again, if it must: its
/// rows may lack changes that no slot or WAL can deliver any more.
fn copy_again(
    prior: Option<&PipelineState>,
    recorded: Option<&TableState>,
    ts: &TableSchema,
    lsn: Lsn,
) -> Option<String> {
    // Without a state the pipeline predates it: trust the Iceberg table once.
    let prior = prior?;
    let Some(recorded) = recorded else {
        return Some(
            "the pipeline did not follow it for a while (it was left out of `tables:`), so changes made meanwhile are missing".into(),
        );
    };
    if let Some(at) = recorded.copying_at {
        if lsn < at {
            return Some(format!("its copy at {at} was cut short"));
        }
        return None;
    }
    if recorded.partitions != ts.partitions {
        return Some(
            "partitions were attached or detached since it was copied; replication does not carry the rows they bring or take away".into(),
        );
    }
    let complete_through = recorded.watermark.max(lsn);
    if complete_through < prior.wal_removed_through {
        return Some(format!(
            "it is known complete only through {complete_through}, but the pipeline's WAL was already removed through {}",
            prior.wal_removed_through
        ));
    }
    None
}

/// Whether the Iceberg table was made from the source's current columns and key, so that a
/// new copy can replace its rows in place.
fn same_columns(table: &iceberg::table::Table, ts: &TableSchema) -> bool {
    let Some(recorded) = crate::sink::iceberg::evolve::recorded_columns(table) else {
        return false;
    };
    let key = table
        .metadata()
        .properties()
        .get(PROP_PRIMARY_KEY)
        .cloned()
        .unwrap_or_default();
    key == ts.primary_key.join(",")
        && recorded.len() == ts.columns.len()
        && recorded.iter().zip(&ts.columns).all(|(r, c)| {
            r.field.is_none() && r.name == c.name && r.oid == c.type_oid && r.typmod == c.typmod
        })
}

/// Drops the Iceberg table and creates it again from the source's current shape.
async fn recreate(
    catalog: &LocalCatalog,
    namespace: &iceberg::NamespaceIdent,
    ts: &TableSchema,
) -> Result<iceberg::table::Table> {
    let ident = iceberg::TableIdent::new(namespace.clone(), ts.table.iceberg_name());
    iceberg::Catalog::drop_table(catalog.catalog.as_ref(), &ident)
        .await
        .with_context(|| format!("dropping Iceberg table {ident} to copy it again"))?;
    ice_schema::create_or_load(catalog, namespace, ts).await
}

/// Refuses an Iceberg table that another pipeline, or another source table, writes: the
/// two would commit their own rows and LSNs on top of each other's.
fn check_owner(table: &iceberg::table::Table, ts: &TableSchema, p: &PipelineConfig) -> Result<()> {
    let ident = table.identifier();
    if let Some(source) = table.metadata().properties().get(PROP_SOURCE) {
        if *source != ts.table.to_string() {
            return Err(Error::source_err(format!(
                "Iceberg table {ident} holds source table {source} (table property {PROP_SOURCE}), not {}: two source tables map to one Iceberg table; follow only one of them, or drop the Iceberg table and run `skipprd sync --pipeline {}` again",
                ts.table, p.name
            )));
        }
    }
    if let Some(other) = commit::committed_pipeline(table) {
        if other != p.name {
            return Err(Error::source_err(format!(
                "Iceberg table {ident} is written by pipeline `{other}` (snapshot summary {SUMMARY_PIPELINE}), not by `{}`: two pipelines must never write one table; remove {} from one pipeline's `tables:` or give it another data sink, or hand the table over with `skipprd sync --pipeline {} --resnapshot`",
                p.name, ts.table, p.name
            )));
        }
    }
    Ok(())
}

/// A partitioned table is followed through its root: an existing publication that publishes
/// its partitions under their own names would send changes skipprd never applies. Returns
/// whether a partitioned table is followed.
async fn require_via_root(
    client: &Client,
    p: &PipelineConfig,
    todo: &[TableJob],
    synced: &[String],
) -> Result<bool> {
    let cfg = &p.source;
    let partitioned: Vec<String> = todo
        .iter()
        .filter(|j| j.schema.partitioned)
        .map(|j| j.schema.table.to_string())
        .chain(synced.iter().cloned())
        .collect();
    if partitioned.is_empty() {
        return Ok(false);
    }
    if slot::publication_via_root(client, &cfg.publication).await? == Some(false) {
        let resnapshot = if synced.is_empty() {
            String::new()
        } else {
            format!(
                ", then `skipprd sync --pipeline {} --resnapshot`, since the changes of {} made so far were not applied",
                p.name,
                synced.join(", ")
            )
        };
        return Err(Error::source_err(format!(
            "publication `{}` publishes the changes of partitions under the partitions' own names (publish_via_partition_root is off), so the changes of partitioned table(s) {} would never reach their Iceberg table; run {}{resnapshot}",
            cfg.publication,
            partitioned.join(", "),
            slot::via_root_fix_sql(&cfg.publication),
        )));
    }
    Ok(true)
}

/// A slot whose confirmed position is beyond everything this pipeline ever acknowledged was
/// recreated or advanced outside skipprd: the changes in between reached nobody. Tables
/// known complete through that position (copied since) are not affected.
async fn require_slot_not_moved(
    config: &Config,
    client: &Client,
    p: &PipelineConfig,
    report: &SyncReport,
    had_state: bool,
    state: &PipelineState,
) -> Result<()> {
    if report.skipped.is_empty() || !had_state {
        return Ok(());
    }
    let Some(confirmed) = slot_info(client, &p.source.slot)
        .await?
        .and_then(|s| s.confirmed_flush)
    else {
        return Ok(());
    };
    let acknowledged = wal_store(config, p)?
        .acknowledged()?
        .max(state.wal_removed_through);
    let behind: Vec<String> = report
        .skipped
        .iter()
        .filter(|t| {
            let watermark = TableRef::parse(t)
                .and_then(|r| state.table(&r).map(|s| s.watermark))
                .unwrap_or_default();
            watermark.max(acknowledged) < confirmed
        })
        .cloned()
        .collect();
    if behind.is_empty() {
        return Ok(());
    }
    Err(Error::source_err(format!(
        "replication slot `{}` has confirmed position {confirmed}, beyond everything this pipeline received and acknowledged ({acknowledged}): the slot was recreated or advanced outside skipprd, so changes to {} made before {confirmed} are missing; run `skipprd sync --pipeline {} --resnapshot` to copy the tables again",
        p.source.slot,
        behind.join(", "),
        p.name
    )))
}

/// A table already synced that has left the publication has had its changes dropped at
/// the source since: fail closed rather than add it back silently.
async fn require_published(client: &Client, p: &PipelineConfig, report: &SyncReport) -> Result<()> {
    let published = slot::publication_tables(client, &p.source.publication).await?;
    let Some(published) = published else {
        if report.skipped.is_empty() {
            return Ok(());
        }
        return Err(Error::source_err(format!(
            "publication `{}` no longer exists, but tables {} were synced through it, so their changes since may be missing; recreate it (CREATE PUBLICATION {} FOR TABLE ...) and run `skipprd sync --pipeline {} --resnapshot`",
            p.source.publication,
            report.skipped.join(", "),
            crate::config::quote_ident(&p.source.publication),
            p.name
        )));
    };
    for t in &p.source.tables {
        if report.skipped.contains(&t.to_string()) && !published.contains(t) {
            return Err(Error::source_err(format!(
                "table {t} was removed from publication `{}` after it was synced, so its changes since are missing; run ALTER PUBLICATION {} ADD TABLE {}; then `skipprd sync --pipeline {} --resnapshot`",
                p.source.publication,
                crate::config::quote_ident(&p.source.publication),
                t.quoted(),
                p.name
            )));
        }
    }
    Ok(())
}

/// Tables already synced through a slot that no longer exists may have missed changes:
/// fail closed instead of silently starting a new slot at the current position.
async fn require_slot_if_synced(
    client: &Client,
    p: &PipelineConfig,
    report: &SyncReport,
) -> Result<()> {
    if report.skipped.is_empty() || slot_info(client, &p.source.slot).await?.is_some() {
        return Ok(());
    }
    Err(Error::source_err(format!(
        "replication slot `{}` no longer exists, but tables {} were already synced through it, so changes made since may be missing; run `skipprd sync --pipeline {} --resnapshot` to copy the tables again",
        p.source.slot,
        report.skipped.join(", "),
        p.name
    )))
}

fn names(todo: &[TableJob]) -> Vec<String> {
    todo.iter().map(|j| j.schema.table.to_string()).collect()
}

/// Refuses to start when the slot is lost or a table cannot carry updates and deletes.
async fn check_replication_ready(
    client: &Client,
    p: &PipelineConfig,
    schemas: &[TableSchema],
) -> Result<()> {
    let cfg = &p.source;
    let wal_level: String = client
        .query_one("SELECT current_setting('wal_level')", &[])
        .await
        .context("reading wal_level")?
        .get(0);
    if wal_level != "logical" {
        return Err(Error::source_err(format!(
            "cdc_mode {} needs wal_level = logical, but the server has {wal_level}; run ALTER SYSTEM SET wal_level = logical; and restart Postgres (or use cdc_mode: snapshot_only)",
            cfg.cdc_mode.as_str()
        )));
    }
    if let Some(s) = slot_info(client, &cfg.slot).await? {
        if s.wal_status.as_deref() == Some("lost") {
            return Err(Error::source_err(format!(
                "replication slot `{}` is invalidated (wal_status = lost): Postgres removed WAL the pipeline still needed, so changes were lost at the source; run `skipprd sync --pipeline {} --resnapshot` to copy the tables again",
                cfg.slot, p.name
            )));
        }
    }
    for ts in schemas {
        if let Some((detail, fix)) =
            crate::source::postgres::discover::identity_problem(client, p, ts).await?
        {
            return Err(Error::source_err(format!("{detail}; fix: {fix}")));
        }
    }
    Ok(())
}

/// Deletes data files left by an interrupted snapshot of a table that has no snapshot yet:
/// nothing references them, and the copy starts over.
fn remove_uncommitted_files(table: &iceberg::table::Table) -> Result<()> {
    if table.metadata().current_snapshot().is_some() {
        return Ok(());
    }
    let location = table.metadata().location();
    let Some(path) = location.strip_prefix("file://") else {
        return Ok(());
    };
    let data = Path::new(path).join("data");
    if data.is_dir() {
        let mut removed = 0;
        for entry in
            std::fs::read_dir(&data).with_context(|| format!("listing {}", data.display()))?
        {
            let entry = entry.with_context(|| format!("listing {}", data.display()))?;
            if entry.path().extension().is_some_and(|e| e == "parquet") {
                std::fs::remove_file(entry.path())
                    .with_context(|| format!("removing {}", entry.path().display()))?;
                removed += 1;
            }
        }
        if removed > 0 {
            tracing::info!(table = %table.identifier(), files = removed, "removed files of an interrupted snapshot");
        }
    }
    Ok(())
}
