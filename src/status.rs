//! `skipprd status`: what is running, read from the same places a pipeline writes (the
//! Iceberg tables, the WAL folder, the replication slot) without disturbing it.

use std::path::Path;

use serde::Serialize;

use crate::config::Config;
use crate::error::Result;
use crate::query::{committed_lsn_text, tail_lag_seconds, Workspace};
use crate::telemetry::human_bytes;

/// One table of a pipeline.
#[derive(Debug, Serialize)]
pub struct TableStatus {
    pub table: String,
    /// The source LSN the Iceberg table holds every change through.
    pub committed_lsn: String,
    /// Bytes of source WAL between the committed LSN and the source's current LSN.
    pub lag_bytes: Option<u64>,
    /// Age of the oldest change in the WAL tail that is not committed yet (0 when none).
    pub lag_seconds: f64,
    /// Changes in the WAL tail, not yet committed to Iceberg (already visible to queries).
    pub tail_changes: u64,
    /// When the table's current Iceberg snapshot was committed (RFC 3339).
    pub last_commit_time: Option<String>,
    pub rows: Option<u64>,
    pub data_files: Option<u64>,
    pub delete_files: Option<u64>,
}

/// One pipeline.
#[derive(Debug, Serialize)]
pub struct PipelineStatus {
    pub pipeline: String,
    /// `starting`, `streaming`, `reconnecting`, `storage_full`, `failed` or `stopped` as the
    /// pipeline last recorded it, or `unknown` when it has recorded nothing.
    pub state: String,
    /// The error that stopped the pipeline, when it failed.
    pub error: Option<String>,
    pub slot: String,
    /// The position up to which the source was acknowledged (durable in Skippr's WAL).
    pub slot_confirmed_lsn: Option<String>,
    /// The source's current WAL position.
    pub source_current_lsn: Option<String>,
    /// Bytes of source WAL not yet acknowledged.
    pub slot_lag_bytes: Option<u64>,
    /// Why the source could not be asked, when it could not.
    pub source_error: Option<String>,
    /// WAL the server keeps for the slot (its current LSN minus the slot's `restart_lsn`).
    pub retained_wal_bytes: Option<u64>,
    /// `reserved`, `extended`, `unreserved` or `lost`, as `pg_replication_slots` says.
    pub wal_status: Option<String>,
    /// WAL the server can still write before it invalidates the slot (`null`: unbounded).
    pub safe_wal_size: Option<i64>,
    /// Source WAL not yet acknowledged (the same as `slot_lag_bytes`).
    pub lag_bytes: Option<u64>,
    /// How long acknowledged WAL trails the server (`null` while nothing streams).
    pub lag_seconds: Option<f64>,
    /// `data_sources.<name>.Postgres.max_retained_wal`, in bytes.
    pub max_retained_wal: u64,
    /// What deserves attention: retained WAL past `max_retained_wal`, a slot about to be
    /// invalidated.
    pub warnings: Vec<String>,
    /// Bytes of Skippr's WAL on disk (changes not yet committed to Iceberg).
    pub wal_bytes: u64,
    /// The commit rounds of the process that runs (or last ran) the pipeline: how many, the
    /// last one's duration and tables, p50, p99 and max over the last 1000.
    pub commit_rounds: crate::telemetry::state::Rounds,
    /// The tables of the snapshot running now (or of the last one the process ran): rows
    /// copied, Postgres's estimate, rate and estimated time left.
    pub snapshot: Vec<crate::telemetry::state::TableSnapshot>,
    pub tables: Vec<TableStatus>,
}

/// Total size of the files under `dir` (0 when it does not exist).
fn folder_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => folder_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

fn summary_u64(snapshot: &iceberg::spec::Snapshot, key: &str) -> Option<u64> {
    snapshot
        .summary()
        .additional_properties
        .get(key)
        .and_then(|v| v.parse().ok())
}

/// Collects the status of `only` (or every pipeline).
pub async fn collect(config: &Config, only: Option<&str>) -> Result<Vec<PipelineStatus>> {
    let ws = Workspace::open(config).await?;
    let states = ws.states().await?;
    let mut out = Vec::new();
    for p in &config.pipelines {
        if only.is_some_and(|o| o != p.name) {
            continue;
        }
        let pos = crate::source::postgres::slot::health(&p.source).await;
        // What the process that runs (or last ran) the pipeline recorded; `unknown` if none.
        let recorded = crate::telemetry::state::read(&config.storage_path, &p.name);
        let state = recorded
            .as_ref()
            .map_or("unknown".to_string(), |s| s.state.as_str().to_string());
        let (error, commit_rounds, snapshot) = recorded
            .map(|r| (r.error, r.rounds, r.snapshot))
            .unwrap_or_default();
        let mut tables = Vec::new();
        for s in states
            .iter()
            .filter(|s| s.pipeline.as_deref() == Some(&p.name))
        {
            let committed = crate::sink::iceberg::commit::committed_lsn(&s.table);
            let snap = s.table.metadata().current_snapshot();
            tables.push(TableStatus {
                table: format!("{}.{}", ws.name, s.table.identifier().name()),
                committed_lsn: committed_lsn_text(&s.table),
                // A table with nothing in the WAL tail has every change through what the
                // slot acknowledged, however long ago it last committed.
                lag_bytes: pos.current.map(|cur| {
                    let through = match pos.confirmed_flush {
                        Some(acked) if s.tail.changes == 0 => {
                            committed.unwrap_or_default().max(acked)
                        }
                        _ => committed.unwrap_or_default(),
                    };
                    cur.0.saturating_sub(through.0)
                }),
                lag_seconds: tail_lag_seconds(&s.tail),
                tail_changes: s.tail.changes,
                last_commit_time: snap.and_then(|sn| {
                    chrono::DateTime::from_timestamp_millis(sn.timestamp_ms())
                        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
                }),
                rows: snap.and_then(|sn| summary_u64(sn, "total-records")),
                data_files: snap.and_then(|sn| summary_u64(sn, "total-data-files")),
                delete_files: snap.and_then(|sn| summary_u64(sn, "total-delete-files")),
            });
        }
        out.push(PipelineStatus {
            pipeline: p.name.clone(),
            state,
            error,
            slot: p.source.slot.clone(),
            slot_confirmed_lsn: pos.confirmed_flush.map(|l| l.to_string()),
            source_current_lsn: pos.current.map(|l| l.to_string()),
            slot_lag_bytes: pos.lag_bytes,
            retained_wal_bytes: pos.retained_wal_bytes,
            wal_status: pos.wal_status.clone(),
            safe_wal_size: pos.safe_wal_size,
            lag_bytes: pos.lag_bytes,
            lag_seconds: pos.lag_seconds,
            max_retained_wal: p.source.max_retained_wal,
            warnings: pos.warnings(&p.source),
            source_error: pos.error,
            wal_bytes: folder_bytes(&config.storage_path.join("wal").join(&p.name)),
            commit_rounds,
            snapshot,
            tables,
        });
    }
    if let Some(name) = only {
        if out.is_empty() {
            return Err(crate::error::Error::config(format!(
                "no pipeline named `{name}` in {}; `skipprd validate` lists them",
                config.file.display()
            )));
        }
    }
    Ok(out)
}

fn opt<T: std::fmt::Display>(v: &Option<T>) -> String {
    v.as_ref()
        .map(|x| x.to_string())
        .unwrap_or_else(|| "-".into())
}

/// Human-readable rendering.
pub fn render_text(report: &[PipelineStatus]) -> String {
    let mut s = String::new();
    for p in report {
        s.push_str(&format!("pipeline {}: {}\n", p.pipeline, p.state));
        if let Some(e) = &p.error {
            s.push_str(&format!("  error: {e}\n"));
        }
        s.push_str(&format!(
            "  slot {}: confirmed {}, source at {}, lag {} bytes\n",
            p.slot,
            opt(&p.slot_confirmed_lsn),
            opt(&p.source_current_lsn),
            opt(&p.slot_lag_bytes)
        ));
        if let Some(e) = &p.source_error {
            s.push_str(&format!("  source: {e}\n"));
        }
        if let Some(retained) = p.retained_wal_bytes {
            s.push_str(&format!(
                "  retained WAL on the server: {retained} bytes ({}; max_retained_wal {}), wal_status {}, safe_wal_size {}, lag {} s\n",
                human_bytes(retained),
                human_bytes(p.max_retained_wal),
                opt(&p.wal_status),
                p.safe_wal_size
                    .map(|b| b.to_string())
                    .unwrap_or_else(|| "unlimited".into()),
                p.lag_seconds
                    .map(|l| format!("{l:.1}"))
                    .unwrap_or_else(|| "-".into())
            ));
        }
        for w in &p.warnings {
            s.push_str(&format!("  warning: {w}\n"));
        }
        s.push_str(&format!("  WAL on disk: {} bytes\n", p.wal_bytes));
        let r = &p.commit_rounds;
        if let Some(last) = r.last_seconds {
            let secs = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
            s.push_str(&format!(
                "  commit rounds: {}, last {last:.3} s ({} tables), p50 {} s, p99 {} s, max {} s\n",
                r.count,
                r.last_tables,
                secs(r.p50_seconds),
                secs(r.p99_seconds),
                secs(r.max_seconds)
            ));
        }
        // The snapshot runs while the pipeline starts; a copy left unfinished by a process
        // that failed or stopped goes on at the next start (from its last durable chunk when
        // it was copied in key chunks).
        if p.state != "starting" {
            for t in p.snapshot.iter().filter(|t| !t.done) {
                s.push_str(&format!(
                    "  snapshot cut short: {} at {} rows (the copy goes on when the pipeline starts: from its last durable chunk when it was copied in key chunks, from the start otherwise)\n",
                    t.table, t.rows_copied
                ));
            }
        } else if p.snapshot.iter().any(|t| !t.done) {
            s.push_str("  snapshot:\n");
            for t in &p.snapshot {
                let progress = if t.done {
                    format!("{} rows, done", t.rows_copied)
                } else {
                    format!(
                        "{} of about {} rows, {:.0} rows/s, eta {}",
                        t.rows_copied,
                        t.rows_estimated,
                        t.rows_per_second,
                        t.eta_seconds
                            .map_or("-".to_string(), |e| format!("{:.0} s", e.ceil()))
                    )
                };
                s.push_str(&format!("    {:<30} {progress}\n", t.table));
            }
        }
        s.push_str(&format!(
            "  {:<32} {:>14} {:>12} {:>9} {:>8} {:>12} {:>6} {:>7}  {}\n",
            "table",
            "committed_lsn",
            "lag_bytes",
            "lag_s",
            "tail",
            "rows",
            "files",
            "deletes",
            "last_commit"
        ));
        for t in &p.tables {
            s.push_str(&format!(
                "  {:<32} {:>14} {:>12} {:>9.1} {:>8} {:>12} {:>6} {:>7}  {}\n",
                t.table,
                t.committed_lsn,
                opt(&t.lag_bytes),
                t.lag_seconds,
                t.tail_changes,
                opt(&t.rows),
                opt(&t.data_files),
                opt(&t.delete_files),
                opt(&t.last_commit_time)
            ));
        }
    }
    s
}
