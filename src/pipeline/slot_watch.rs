//! The pipeline while it streams: samples its replication slot's health on the source every
//! few seconds into the metrics (`skippr_slot_*`), and warns in the log when the WAL the slot
//! holds back passes `max_retained_wal` (again every few minutes while it stays past it).

use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::config::PipelineConfig;
use crate::source::postgres::slot::{self, SlotHealth};
use crate::telemetry::metrics;

/// How often the slot is sampled.
const SAMPLE_INTERVAL: Duration = Duration::from_secs(10);
/// How often a warning that still holds is logged again.
const WARN_AGAIN: Duration = Duration::from_secs(300);

/// Samples until `shutdown` turns true.
pub(super) async fn watch_slot(p: PipelineConfig, mut shutdown: watch::Receiver<bool>) {
    let mut warned: Option<Instant> = None;
    loop {
        let health = slot::health(&p.source).await;
        publish(&p, &health);
        let over = health
            .retained_wal_bytes
            .is_some_and(|r| r > p.source.max_retained_wal);
        if over {
            if warned.is_none_or(|at| at.elapsed() >= WARN_AGAIN) {
                for w in health.warnings(&p.source) {
                    tracing::warn!(
                        pipeline = %p.name,
                        slot = %p.source.slot,
                        retained_wal_bytes = health.retained_wal_bytes,
                        max_retained_wal = p.source.max_retained_wal,
                        "{w}"
                    );
                }
                warned = Some(Instant::now());
            }
        } else if warned.take().is_some() {
            tracing::info!(pipeline = %p.name, slot = %p.source.slot, retained_wal_bytes = health.retained_wal_bytes, "retained WAL is back under max_retained_wal");
        }
        if let Some(e) = &health.error {
            tracing::debug!(pipeline = %p.name, error = %e, "cannot sample the slot's health");
        }
        tokio::select! {
            _ = tokio::time::sleep(SAMPLE_INTERVAL) => {}
            changed = shutdown.changed() => {
                if changed.is_err() || *shutdown.borrow() {
                    return;
                }
            }
        }
    }
}

fn publish(p: &PipelineConfig, h: &SlotHealth) {
    let l = [("pipeline", p.name.as_str())];
    if let Some(v) = h.retained_wal_bytes {
        metrics::set(
            "skippr_slot_retained_wal_bytes",
            "WAL the source keeps for the pipeline's slot (current LSN minus restart_lsn), in bytes.",
            &l,
            v as f64,
        );
        metrics::set(
            "skippr_slot_retained_wal_over_limit",
            "1 while the slot's retained WAL is past max_retained_wal, else 0.",
            &l,
            if v > p.source.max_retained_wal {
                1.0
            } else {
                0.0
            },
        );
    }
    metrics::set(
        "skippr_slot_max_retained_wal_bytes",
        "The pipeline's max_retained_wal, in bytes.",
        &l,
        p.source.max_retained_wal as f64,
    );
    if let Some(v) = h.safe_wal_size {
        metrics::set(
            "skippr_slot_safe_wal_size_bytes",
            "WAL the source can still write before it invalidates the slot (absent when unbounded).",
            &l,
            v as f64,
        );
    }
    if let Some(v) = h.lag_bytes {
        metrics::set(
            "skippr_slot_lag_bytes",
            "Source WAL not yet acknowledged by the pipeline (current LSN minus confirmed_flush_lsn), in bytes.",
            &l,
            v as f64,
        );
    }
    if let Some(v) = h.lag_seconds {
        metrics::set(
            "skippr_slot_lag_seconds",
            "How long acknowledged WAL trails the source (flush_lag of the slot's connection), in seconds.",
            &l,
            v,
        );
    }
}
