//! `skipprd sync`: runs one pipeline from the source to the sink. Today that is the
//! consistent snapshot of every table not yet copied, committed to Iceberg with its LSN.

use std::fs::File;
use std::path::Path;

use tokio::sync::watch;
use tokio_postgres::Client;

use crate::cdc;
use crate::wal::WalStore;

use crate::catalog::LocalCatalog;
use crate::change::Lsn;
use crate::config::{CdcMode, Config, PipelineConfig, SinkConfig};
use crate::error::{Context, Error, ErrorKind, Result};
use crate::sink::iceberg::{commit, schema as ice_schema};
use crate::source::postgres::connect::connect;
use crate::source::postgres::schema::{describe, TableSchema};
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
        SinkConfig::AthenaIceberg { name, .. } => Err(Error::config(format!(
            "data sink `{name}` is AthenaIceberg, which this version of skipprd can validate but not yet write to; use a LocalIceberg sink for now"
        ))),
    }
}

/// The WAL of a pipeline.
pub fn wal_store(config: &Config, p: &PipelineConfig) -> Result<WalStore> {
    WalStore::open(&config.storage_path.join("wal").join(&p.name))
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
    if resnapshot {
        resnapshot_reset(config, p).await?;
    }
    let report = snapshot_phase(config, p).await?;
    if p.source.cdc_mode.needs_replication() {
        let catalog = open_sink(p).await?;
        let namespace = catalog.ensure_namespace(&config.workspace).await?;
        let wal = wal_store(config, p)?;
        if once {
            let client = connect(&p.source).await?;
            cdc::catch_up_once(p, &wal, &catalog, &namespace, &client).await?;
        } else {
            cdc::run_continuous(p, &wal, &catalog, &namespace, shutdown).await?;
        }
    }
    Ok(report)
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

/// The snapshot of every table that has no committed snapshot yet.
async fn snapshot_phase(config: &Config, p: &PipelineConfig) -> Result<SyncReport> {
    let cfg = &p.source;
    let catalog = open_sink(p).await?;
    let namespace = catalog.ensure_namespace(&config.workspace).await?;
    let client = connect(cfg).await?;

    let mut schemas = Vec::new();
    for t in &cfg.tables {
        schemas.push(describe(&client, t).await?);
    }
    if cfg.cdc_mode.needs_replication() {
        check_replication_ready(&client, p, &schemas).await?;
    }

    let mut report = SyncReport::default();
    let mut todo = Vec::new();
    for ts in schemas {
        let table = ice_schema::create_or_load(&catalog, &namespace, &ts).await?;
        if commit::committed_lsn(&table).is_some() {
            report.skipped.push(ts.table.to_string());
            continue;
        }
        remove_uncommitted_files(&table)?;
        let arrow = ice_schema::arrow_schema(&table)?;
        todo.push(TableJob {
            schema: ts,
            table,
            arrow,
        });
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
                copy_tables(cfg, &name, lsn, todo, &catalog, &p.name).await?;
                exporter
                    .batch_execute("COMMIT")
                    .await
                    .context("ending the snapshot")?;
            }
        }
        CdcMode::SnapshotThenCdc => {
            require_published(&client, p, &report).await?;
            slot::ensure_publication(&client, cfg).await?;
            require_slot_if_synced(&client, p, &report).await?;
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
                copy_tables(
                    cfg,
                    &exported.snapshot_name,
                    exported.consistent_point,
                    todo,
                    &catalog,
                    &p.name,
                )
                .await?;
                drop(exported.session);
            }
        }
        CdcMode::CdcOnly => {
            require_published(&client, p, &report).await?;
            slot::ensure_publication(&client, cfg).await?;
            require_slot_if_synced(&client, p, &report).await?;
            let start = match slot_info(&client, &cfg.slot).await? {
                Some(s) => s.confirmed_flush.unwrap_or_default(),
                None => {
                    let created = create_slot_exporting_snapshot(cfg, &cfg.slot, false).await?;
                    created.consistent_point
                }
            };
            // No snapshot: each new table starts empty at the slot's position.
            for job in todo {
                commit::append(
                    catalog.catalog.as_ref(),
                    &job.table,
                    Vec::new(),
                    start,
                    "cdc",
                    &p.name,
                )
                .await?;
                report.copied.push(job.schema.table.to_string());
            }
        }
    }
    Ok(report)
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
        if ts.primary_key.is_empty()
            && ts.replica_identity != "full"
            && !cfg.append_only.contains(&ts.table)
        {
            return Err(Error::source_err(format!(
                "table {} has no primary key and replica identity {}, so its updates and deletes cannot be applied; add a primary key, run ALTER TABLE {} REPLICA IDENTITY FULL;, or list it under `append_only:` if it only ever receives inserts; if its primary key was dropped after it was synced, also run `skipprd sync --pipeline {} --resnapshot`",
                ts.table,
                ts.replica_identity,
                ts.table.quoted(),
                p.name
            )));
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
