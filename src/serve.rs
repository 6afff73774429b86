//! `skipprd serve`: every pipeline's continuous sync, the Postgres-wire gateway over the live
//! tables and the Prometheus endpoint, in one process that stops cleanly on SIGTERM.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::config::Config;
use crate::error::Result;
use crate::query::{tail_lag_seconds, Workspace};
use crate::server::Gateway;
use crate::telemetry::{endpoint, metrics};

/// How long a stop waits for statements in flight.
const QUERY_GRACE: Duration = Duration::from_secs(30);
/// How long a stop waits for the pipelines to flush, commit and acknowledge.
const PIPELINE_GRACE: Duration = Duration::from_secs(30);
/// Worker threads of the pipelines' own runtime.
const INGEST_THREADS: usize = 2;
/// How often the list of tables is read again (a first snapshot creates tables while serving).
const REFRESH_INTERVAL: Duration = Duration::from_secs(2);

/// Runs until SIGTERM/SIGINT (exit 0). A pipeline that fails stops alone; the gateway and
/// the other pipelines keep running.
pub async fn run(config: &Config) -> Result<()> {
    let (stop_tx, stop_rx) = watch::channel(false);
    crate::pipeline::trap_signals(stop_tx.clone());
    crate::pipeline::reload::trap_reload(config.file.clone());
    let ws = Workspace::open(config).await?;
    let gateway = Gateway::bind(&config.query, ws.clone()).await?;
    let metrics_listener = endpoint::bind(config.metrics_listen).await?;

    let mut services = JoinSet::new();
    services.spawn(gateway.run(stop_rx.clone(), QUERY_GRACE));
    services.spawn(endpoint::serve(
        metrics_listener,
        Some(table_gauges(ws.clone(), false)),
        stop_rx.clone(),
    ));
    services.spawn(refresh_tables(ws.clone(), stop_rx.clone()));
    services.spawn(follow_reloads(ws.clone(), config.clone(), stop_rx.clone()));

    // The pipelines run on threads of their own: statements of the gateway keep the main
    // runtime's workers busy while they compute, and the ingest loop, the WAL appender and
    // the commit path must never wait behind them (the OS shares the cores between both).
    let ingest = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(INGEST_THREADS)
        .thread_name("skippr-ingest")
        .enable_all()
        .build()
        .map_err(|e| crate::error::Error::fatal(format!("cannot start the ingest runtime: {e}")))?;
    let mut pipelines = JoinSet::new();
    for p in &config.pipelines {
        let (config, p, rx) = (config.clone(), p.clone(), stop_rx.clone());
        // A pipeline rides out transient faults by itself (see `supervise`); one that fails
        // for good is marked `failed` in skippr.tables, and the gateway keeps answering
        // over what it committed and what its WAL holds.
        pipelines.spawn_on(
            async move {
                crate::supervise::run(&config, &p, crate::supervise::Mode::Serve, rx)
                    .await
                    .map(|_| ())
            },
            ingest.handle(),
        );
    }

    let mut stop = stop_rx.clone();
    loop {
        tokio::select! {
            done = pipelines.join_next(), if !pipelines.is_empty() => {
                if let Some(Err(e)) = done {
                    tracing::error!(error = %e, "a pipeline task failed");
                }
            }
            _ = stop.wait_for(|s| *s) => break,
        }
    }
    // Stopping: pipelines flush, commit and acknowledge; one that cannot (its source is
    // away) is cut off after the grace, which loses nothing (its WAL keeps the changes).
    let stopping = async { while pipelines.join_next().await.is_some() {} };
    if tokio::time::timeout(PIPELINE_GRACE, stopping)
        .await
        .is_err()
    {
        tracing::warn!(
            grace_s = PIPELINE_GRACE.as_secs(),
            "pipelines did not stop in time; what they made durable stays in the WAL"
        );
        pipelines.abort_all();
    }
    while let Some(done) = services.join_next().await {
        match done {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e.report(), "service stopped with an error"),
            Err(e) => tracing::warn!(error = %e, "service task failed"),
        }
    }
    // Dropping a runtime may not block inside another one.
    ingest.shutdown_background();
    tracing::info!("skipprd serve stopped");
    Ok(())
}

/// Gives the gateway the tables a reload makes each pipeline follow, and reports a pipeline
/// that a reload adds (a new pipeline starts with the next start of `serve`).
async fn follow_reloads(
    ws: Arc<Workspace>,
    started: Config,
    mut stop: watch::Receiver<bool>,
) -> Result<()> {
    let mut reloads = crate::pipeline::reload::reloads();
    loop {
        let changed = tokio::select! {
            changed = reloads.changed() => changed.is_ok(),
            _ = stop.wait_for(|s| *s) => false,
        };
        if !changed {
            return Ok(());
        }
        let Some(config) = reloads.borrow_and_update().clone() else {
            continue;
        };
        ws.follow(&config);
        for p in &config.pipelines {
            if !started.pipelines.iter().any(|s| s.name == p.name) {
                tracing::warn!(pipeline = %p.name, "reload: a new pipeline starts with the next start of skipprd serve");
            }
        }
        if let Err(e) = ws.refresh().await {
            tracing::warn!(error = %e.report(), "cannot list the workspace's tables");
        }
    }
}

async fn refresh_tables(ws: Arc<Workspace>, mut stop: watch::Receiver<bool>) -> Result<()> {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(REFRESH_INTERVAL) => {
                if let Err(e) = ws.refresh().await {
                    tracing::warn!(error = %e.report(), "cannot list the workspace's tables");
                }
            }
            _ = stop.changed() => {
                if *stop.borrow() {
                    return Ok(());
                }
            }
        }
    }
}

/// The endpoint of `skipprd sync` (when `skippr.metrics.listen` is set): the same metrics as
/// serve's, over a workspace of its own that reads the table list again at each scrape, since
/// the sync creates tables as it goes.
pub async fn spawn_sync_metrics(
    config: &Config,
    stop: watch::Receiver<bool>,
) -> Result<tokio::task::JoinHandle<Result<()>>> {
    let listener = endpoint::bind(config.metrics_listen).await?;
    let ws = Workspace::open(config).await?;
    Ok(tokio::spawn(endpoint::serve(
        listener,
        Some(table_gauges(ws, true)),
        stop,
    )))
}

/// The scrape hook that sets the per-table gauges.
fn table_gauges(ws: Arc<Workspace>, refresh: bool) -> endpoint::ScrapeHook {
    Arc::new(move || {
        let ws = ws.clone();
        Box::pin(async move {
            if refresh {
                if let Err(e) = ws.refresh().await {
                    tracing::warn!(error = %e.report(), "cannot list the workspace's tables");
                }
            }
            update_table_gauges(&ws).await
        })
    })
}

/// Gauges that are read from the tables' state when scraped.
async fn update_table_gauges(ws: &Workspace) {
    let states = match ws.states().await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e.report(), "cannot read the tables' state for metrics");
            return;
        }
    };
    for s in states {
        let table = s.table.identifier().name().to_string();
        let labels = [("table", table.as_str())];
        metrics::set(
            "skippr_table_lag_seconds",
            "Age of the oldest change of the table not yet committed to Iceberg (0 when none).",
            &labels,
            tail_lag_seconds(&s.tail),
        );
        metrics::set(
            "skippr_table_wal_tail_rows",
            "Rows of the table in the WAL tail (live, not yet in Iceberg).",
            &labels,
            s.tail.rows.as_ref().map(|b| b.num_rows()).unwrap_or(0) as f64,
        );
        metrics::set(
            "skippr_table_committed_lsn",
            "Source LSN covered by the table's last Iceberg commit.",
            &labels,
            crate::sink::iceberg::commit::committed_lsn(&s.table)
                .map(|l| l.0)
                .unwrap_or(0) as f64,
        );
        if let Some(p) = &s.pipeline {
            metrics::set(
                "skippr_wal_bytes",
                "Bytes of WAL segments not yet removed (changes not yet in Iceberg).",
                &[("pipeline", p.as_str())],
                s.wal_bytes as f64,
            );
        }
    }
}
