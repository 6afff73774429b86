//! The pipeline's refusals: before a run (the slot lost or moved, a table left the
//! publication, a replica identity that cannot carry updates, another writer on the table)
//! and while it runs (a table dropped or unpublished, partitions attached or detached).
//! Each names the table, the cause and the command that fixes it.

use std::time::Duration;

use tokio::sync::watch;
use tokio_postgres::Client;

use super::landing::TableJob;
use super::state::PipelineState;
use super::SyncReport;
use crate::config::{Config, PipelineConfig, TableRef};
use crate::error::{Error, Result};
use crate::sink::iceberg::{commit, PROP_SOURCE, SUMMARY_PIPELINE};
use crate::source::postgres::carried;
use crate::source::postgres::connect::{connect, server_setting};
use crate::source::postgres::schema::{describe, TableSchema};
use crate::source::postgres::slot::FAILOVER_SLOTS_VERSION;
use crate::source::postgres::slot::{self, slot_info};
use crate::wal::WalStore;

/// How often a continuous sync looks for attached or detached partitions.
const PARTITION_CHECK_INTERVAL: Duration = Duration::from_secs(5);

/// Turns `stop` true when `shutdown` does, or when a followed partitioned table's partitions
/// differ from those recorded when it was copied. A source that cannot be read now is
/// retried at the next interval (the stream reports a lasting failure itself).
pub(super) async fn watch_partitions(
    p: PipelineConfig,
    mut shutdown: watch::Receiver<bool>,
    stop: std::sync::Arc<watch::Sender<bool>>,
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

/// A dropped table, or one removed from the publication, sends no more changes: the stream
/// alone cannot tell. Check the catalog and stop with a clear error instead.
pub(super) async fn check_source(p: &PipelineConfig) -> Result<()> {
    let client = crate::source::postgres::connect::connect(&p.source).await?;
    let mut schemas = Vec::with_capacity(p.source.tables.len());
    for t in &p.source.tables {
        schemas.push(crate::source::postgres::schema::describe_followed(&client, p, t).await?);
    }
    let published =
        crate::source::postgres::slot::publication_tables(&client, &p.source.publication)
            .await?
            .unwrap_or_default();
    for t in &p.source.tables {
        if !published.contains(t) {
            return Err(Error::source_err(format!(
                "table {t} was removed from publication `{}` while the pipeline ran, so its changes are no longer sent; run ALTER PUBLICATION {} ADD TABLE {}; then `skipprd sync --pipeline {} --resnapshot`",
                p.source.publication,
                crate::config::quote_ident(&p.source.publication),
                t.quoted(),
                p.name
            )));
        }
    }
    // A publication changed while the pipeline ran (a column list, a row filter, generated
    // columns no longer sent) would land columns as NULL from then on.
    let version = carried::server_version(&client).await?;
    if let Some(u) = carried::uncarried(&client, p, &schemas, version)
        .await?
        .into_iter()
        .next()
    {
        return Err(Error::source_err(format!(
            "{}; the publication changed while the pipeline ran, so changes since may have lost the column: fix it, then run `skipprd sync --pipeline {} --resnapshot`",
            u.detail, p.name
        )));
    }
    Ok(())
}

/// Refuses an Iceberg table that another pipeline, or another source table, writes: the
/// two would commit their own rows and LSNs on top of each other's.
pub(super) fn check_owner(
    table: &iceberg::table::Table,
    ts: &TableSchema,
    p: &PipelineConfig,
) -> Result<()> {
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
pub(super) async fn require_via_root(
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
pub(super) async fn require_slot_not_moved(
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
    let acknowledged = WalStore::for_pipeline(&config.storage, &config.storage_path, &p.name)?
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
pub(super) async fn require_published(
    client: &Client,
    p: &PipelineConfig,
    report: &SyncReport,
) -> Result<()> {
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
pub(super) async fn require_slot_if_synced(
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

/// Refuses to start when the slot is lost or a table cannot carry updates and deletes.
/// The checks a table added by a reload must pass before the running pipeline takes it:
/// the source describes it (it exists, its key and columns are readable) and can
/// replicate it.
pub(super) async fn check_added(p: &PipelineConfig, before: &[TableRef]) -> Result<()> {
    let added: Vec<&TableRef> = p
        .source
        .tables
        .iter()
        .filter(|t| !before.contains(t))
        .collect();
    if added.is_empty() {
        return Ok(());
    }
    let client = connect(&p.source).await?;
    let mut schemas = Vec::new();
    for t in added {
        schemas.push(crate::source::postgres::schema::describe_followed(&client, p, t).await?);
    }
    if p.source.cdc_mode.needs_replication() {
        check_replication_ready(&client, p, &schemas).await?;
    }
    Ok(())
}

pub(super) async fn check_replication_ready(
    client: &Client,
    p: &PipelineConfig,
    schemas: &[TableSchema],
) -> Result<()> {
    let cfg = &p.source;
    let wal_level = server_setting(client, "wal_level").await?;
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
    let version = carried::server_version(client).await?;
    if version < carried::MIN_VERSION {
        return Err(Error::source_err(format!(
            "the source runs Postgres {}, but the change stream needs Postgres 14 or later (pgoutput sends logical messages, which skipprd's heartbeats and `sync --once` rely on, from 14 on); upgrade the server, or use cdc_mode: snapshot_only",
            version / 10_000
        )));
    }
    if cfg.failover_slot && version < FAILOVER_SLOTS_VERSION {
        return Err(Error::config(format!(
            "data_sources.{}.Postgres.failover_slot is set, but the source runs Postgres {} and failover slots need Postgres 17 or later; remove the key, or upgrade the server",
            cfg.name,
            version / 10_000
        )));
    }
    // `sync` sets the publication's `publish_generated_columns` itself (ensure_publication),
    // on a publication it made.
    let ours = crate::source::postgres::slot::publication_is_ours(client, cfg).await?;
    let refused: Vec<_> = carried::uncarried(client, p, schemas, version)
        .await?
        .into_iter()
        .filter(|u| !(u.publication_setting && ours))
        .collect();
    if !refused.is_empty() {
        let mut message = format!(
            "pipeline `{}`: {} column{} the change stream would not carry; nothing was written",
            p.name,
            refused.len(),
            if refused.len() == 1 { "" } else { "s" }
        );
        for u in &refused {
            message.push_str(&format!("\n  {}", u.detail));
        }
        return Err(Error::source_err(message));
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
