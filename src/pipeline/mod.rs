//! `skipprd sync`: runs one pipeline from the source to the sink. The snapshot phase copies
//! every table not yet copied (see `snapshot`); the CDC phase then streams changes into the
//! WAL and commits them to Iceberg (see `cdc`) through the seams of `seams`, until `--once`
//! has caught up or a shutdown is asked for (see `shutdown`).

use tokio::sync::watch;

pub mod cdc;
mod checks;
pub mod chunks;
pub mod cuts;
#[cfg(test)]
mod doubles;
pub mod landing;
pub mod layout;
mod lock;
pub mod position;
pub mod reload;
mod resume;
pub mod seams;
pub mod shutdown;
mod slot_watch;
mod snapshot;
pub mod state;
#[cfg(test)]
mod tests;

pub use lock::PipelineLock;
pub use shutdown::{bounded, trap_signals};

use crate::catalog::LocalCatalog;
use crate::config::{Config, PipelineConfig};
use crate::error::Result;
use crate::source::postgres::connect::connect;
use crate::task::AbortOnDrop;
use crate::wal::WalStore;
use cdc::{Cadence, IcebergTables};
use checks::watch_partitions;
use seams::PostgresSource;
use snapshot::{resnapshot_reset, snapshot_phase};

/// What one `sync --once` did.
#[derive(Debug, Default)]
pub struct SyncReport {
    pub copied: Vec<String>,
    pub skipped: Vec<String>,
}

/// `sync`: the snapshot of every table not yet copied, then (in the CDC modes) the change
/// stream: up to the server's position at the start of the call with `once`, or until
/// `shutdown` otherwise.
/// The pipeline's WAL as its writer opens it: segments Iceberg holds go into the WAL's
/// history, kept for the pipeline's `snapshot_retention` (time travel between commits).
pub(crate) fn wal_of(config: &Config, p: &PipelineConfig) -> Result<WalStore> {
    let history = crate::wal::WalHistory::for_pipeline(
        &config.storage,
        &config.storage_path,
        &p.name,
        p.maintenance.snapshot_retention,
    )?;
    Ok(
        WalStore::for_pipeline(&config.storage, &config.storage_path, &p.name)?
            .keeping_history(history),
    )
}

/// Takes the tables of the last reload into `p` when they change it and the source can
/// follow them (missing, keyless or unreplicated tables refuse the reload instead of
/// stopping the pipeline).
async fn take_reload(
    reloads: &mut watch::Receiver<Option<std::sync::Arc<Config>>>,
    p: &mut PipelineConfig,
) {
    let Some(new) = reload::take(reloads, p) else {
        return;
    };
    let fits = match layout::require_fit(&new).await {
        Ok(()) => checks::check_added(&new, &p.source.tables).await,
        Err(e) => Err(e),
    };
    match fits {
        Ok(()) => {
            tracing::info!(pipeline = %p.name, tables = new.source.tables.len(), "reload: following the tables skippr.yml lists now");
            *p = new;
        }
        Err(e) => {
            tracing::error!(pipeline = %p.name, error = %e.report(), "reload refused; still following the tables read before")
        }
    }
}

pub async fn sync(
    config: &Config,
    p: &mut PipelineConfig,
    once: bool,
    resnapshot: bool,
    shutdown: watch::Receiver<bool>,
) -> Result<SyncReport> {
    // A layout that does not fit its table is refused before anything is written.
    layout::require_fit(p).await?;
    let _lock = PipelineLock::acquire(config, &p.name)?;
    let _lease = state::hold_lease(config, &p.name).await?;
    if resnapshot {
        resnapshot_reset(config, p).await?;
    }
    // A reload read while the pipeline was away (a retry's wait) applies now; later ones
    // between two runs of the stream.
    let mut reloads = reload::reloads();
    take_reload(&mut reloads, p).await;
    let mut report = snapshot_phase(config, p).await?;
    if p.source.cdc_mode.needs_replication() {
        let catalog = LocalCatalog::for_sink(&p.sink).await?;
        let namespace = catalog.ensure_namespace(&config.workspace).await?;
        let wal = wal_of(config, p)?;
        if once {
            let tables = IcebergTables {
                catalog: &catalog,
                namespace: &namespace,
                p,
                hold: None,
            };
            let client = connect(&p.source).await?;
            let mut source = PostgresSource::new(p, Some(client));
            cdc::catch_up_once(&mut source, &wal, &tables).await?;
        } else {
            let sampler = tokio::spawn(slot_watch::watch_slot(p.clone(), shutdown.clone()));
            let _sampler = AbortOnDrop(sampler);
            // Tables new to the pipeline being copied beside the stream.
            let mut beside: Option<snapshot::Beside> = None;
            loop {
                // The stream stops (flushed, committed, acknowledged) when the user asks,
                // when a followed partitioned table gains or loses a partition (the table is
                // then copied again), when a reload changes the tables (tables asked for by
                // `sync --resnapshot --table` are copied again), or when a copy beside it
                // has committed (its tables then join the stream); then the stream goes on.
                let (stop_tx, stop_rx) = watch::channel(false);
                let stop_tx = std::sync::Arc::new(stop_tx);
                let watcher = tokio::spawn(watch_partitions(
                    p.clone(),
                    shutdown.clone(),
                    stop_tx.clone(),
                ));
                let _watcher = AbortOnDrop(watcher);
                // While a copy runs beside the stream, a reload waits for it to join (the
                // stream does not stop for it): the next run of the stream takes it.
                let reloader = beside.is_none().then(|| {
                    AbortOnDrop(tokio::spawn(reload::watch(
                        config.clone(),
                        p.clone(),
                        reloads.clone(),
                        stop_tx.clone(),
                    )))
                });
                let _reloader = reloader;
                // The stream carries every table; the tables still being copied are not
                // committed to until they join, and the log keeps their changes until then.
                let mut streaming = p.clone();
                if let Some(b) = &beside {
                    streaming.source.tables.retain(|t| !b.tables.contains(t));
                }
                let tables = IcebergTables {
                    catalog: &catalog,
                    namespace: &namespace,
                    p: &streaming,
                    hold: beside.as_ref().map(|b| b.hold),
                };
                let source = PostgresSource::new(p, None);
                let cadence = Cadence::of(p);
                let run = cdc::run_continuous(source, &wal, &tables, &cadence, stop_rx);
                match beside.take() {
                    None => run.await?,
                    Some(b) => {
                        tokio::pin!(run);
                        let mut copy = b.copy;
                        let (streamed, copied) = tokio::select! {
                            streamed = &mut run => (streamed, None),
                            copied = &mut copy => {
                                tracing::info!(pipeline = %p.name, tables = ?b.tables.iter().map(|t| t.to_string()).collect::<Vec<_>>(), "copy beside the stream done: the tables join it");
                                let _ = stop_tx.send(true);
                                ((&mut run).await, Some(copied))
                            }
                        };
                        // A stream stopped first (a partition change) waits for the copy;
                        // a stop or a fault cuts it short, and the next start copies those
                        // tables again.
                        let copied = match copied {
                            Some(c) => Some(c),
                            None if streamed.is_err() || *shutdown.borrow() => {
                                copy.abort();
                                None
                            }
                            None => {
                                let mut stop = shutdown.clone();
                                tokio::select! {
                                    c = &mut copy => Some(c),
                                    _ = stop.wait_for(|s| *s) => {
                                        copy.abort();
                                        None
                                    }
                                }
                            }
                        };
                        streamed?;
                        if let Some(c) = copied {
                            c.map_err(|e| {
                                crate::error::Error::fatal(format!(
                                    "the copy of a table added to the pipeline stopped: {e}"
                                ))
                            })??;
                        }
                    }
                }
                if *shutdown.borrow() {
                    break;
                }
                let before: Vec<crate::config::TableRef> = p.source.tables.clone();
                take_reload(&mut reloads, p).await;
                let added: Vec<crate::config::TableRef> = p
                    .source
                    .tables
                    .iter()
                    .filter(|t| !before.contains(t))
                    .cloned()
                    .collect();
                let (again, copying) =
                    snapshot::snapshot_phase_beside(config, p, &added, true).await?;
                beside = copying;
                report.copied.extend(again.copied);
            }
        }
    }
    Ok(report)
}
