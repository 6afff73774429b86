//! Pipeline state: what each pipeline of this process is doing now (starting, streaming,
//! reconnecting, waiting for disk space, failed, stopped), for `skippr.tables`, the
//! `skippr_pipeline_state` metric and the state file that `skipprd status` reads.
//!
//! The state file is `<storage>/pipelines/<pipeline>.status.json`, rewritten (temporary file,
//! then rename) on every change of state. It is informational: a process killed with
//! SIGKILL leaves its last state behind, so a reader checks `pid` and the pipeline's lock
//! file (`<storage>/pipelines/<pipeline>.lock`) to know whether the pipeline still runs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::metrics;

/// What a pipeline is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Connecting, checking the source, snapshotting tables not yet copied.
    Starting,
    /// Following the slot: changes flow into the WAL and on to Iceberg.
    Streaming,
    /// A transient fault (the source restarting or unreachable, a broken connection, a
    /// timeout): waiting before the next try.
    Reconnecting,
    /// The storage path or the warehouse is full: nothing more is acknowledged until space
    /// is back; tries again by itself.
    StorageFull,
    /// Stopped by an error a person must fix (see `error`); the gateway keeps serving what
    /// is committed and in the WAL.
    Failed,
    /// Stopped cleanly (SIGTERM, or `sync --once` done).
    Stopped,
}

impl State {
    pub const ALL: [State; 6] = [
        State::Starting,
        State::Streaming,
        State::Reconnecting,
        State::StorageFull,
        State::Failed,
        State::Stopped,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            State::Starting => "starting",
            State::Streaming => "streaming",
            State::Reconnecting => "reconnecting",
            State::StorageFull => "storage_full",
            State::Failed => "failed",
            State::Stopped => "stopped",
        }
    }
}

/// The state of one pipeline, as kept in memory and written to its state file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PipelineStatus {
    pub pipeline: String,
    pub state: State,
    /// The error that caused the state (`reconnecting`, `storage_full`, `failed`), with its
    /// causes; never row values or secrets.
    pub error: Option<String>,
    /// When the pipeline entered this state, in milliseconds since the Unix epoch.
    pub since_unix_ms: u64,
    /// Retries after transient faults since the process started.
    pub reconnects: u64,
    /// The process that runs the pipeline.
    pub pid: u32,
    /// Its commit rounds since the process started.
    #[serde(default)]
    pub rounds: Rounds,
    /// The tables of the snapshot running now, or of the last one this process ran.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snapshot: Vec<TableSnapshot>,
}

/// How far the snapshot of one table is.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TableSnapshot {
    pub table: String,
    pub rows_copied: u64,
    /// Postgres's estimate of the table's rows (`pg_class.reltuples`) when the copy started.
    pub rows_estimated: u64,
    /// Since this table's copy started.
    pub rows_per_second: f64,
    /// At that rate, until the estimate is reached; none when done or when the estimate is
    /// already passed (it was stale).
    pub eta_seconds: Option<f64>,
    /// Copied and committed.
    pub done: bool,
}

/// How many rounds the percentiles of [`Rounds`] are taken over (the most recent ones).
const ROUND_WINDOW: usize = 1000;

/// The commit rounds of a pipeline that committed at least one table, since the process
/// started: each commits only the tables with changes, so its time follows the tables that
/// change, not the tables that exist.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Rounds {
    pub count: u64,
    pub last_seconds: Option<f64>,
    /// Tables the last round committed.
    pub last_tables: u64,
    /// Over the last 1000 rounds.
    pub p50_seconds: Option<f64>,
    pub p99_seconds: Option<f64>,
    pub max_seconds: Option<f64>,
}

struct Entry {
    status: PipelineStatus,
    /// The storage folder, when the state is also written to a file.
    storage: Option<PathBuf>,
    /// Durations of the most recent rounds, oldest first.
    recent: std::collections::VecDeque<f64>,
}

static PIPELINES: Mutex<BTreeMap<String, Entry>> = Mutex::new(BTreeMap::new());

fn pipelines() -> MutexGuard<'static, BTreeMap<String, Entry>> {
    PIPELINES.lock().unwrap_or_else(|e| e.into_inner())
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Where a pipeline's state file lives.
pub fn state_file(storage: &Path, pipeline: &str) -> PathBuf {
    storage
        .join("pipelines")
        .join(format!("{pipeline}.status.json"))
}

/// Starts tracking a pipeline of this process (state `starting`), writing its state file
/// under `storage`.
pub fn register(pipeline: &str, storage: &Path) {
    let status = PipelineStatus {
        pipeline: pipeline.to_string(),
        state: State::Starting,
        error: None,
        since_unix_ms: now_ms(),
        reconnects: 0,
        pid: std::process::id(),
        rounds: Rounds::default(),
        snapshot: Vec::new(),
    };
    let mut all = pipelines();
    let reconnects = all.get(pipeline).map(|e| e.status.reconnects).unwrap_or(0);
    let entry = all.entry(pipeline.to_string()).or_insert(Entry {
        status,
        storage: None,
        recent: Default::default(),
    });
    entry.storage = Some(storage.to_path_buf());
    entry.status.reconnects = reconnects;
    publish(entry);
}

/// Moves a tracked pipeline to `state`. `error` is kept for the states that have a cause.
/// A pipeline not registered in this process is ignored.
pub fn set(pipeline: &str, state: State, error: Option<String>) {
    let mut all = pipelines();
    let Some(entry) = all.get_mut(pipeline) else {
        return;
    };
    if entry.status.state == state && entry.status.error == error {
        return;
    }
    if entry.status.state != state {
        entry.status.since_unix_ms = now_ms();
    }
    entry.status.state = state;
    entry.status.error = error;
    publish(entry);
}

/// Counts one retry after a transient fault and moves the pipeline to `state`.
pub fn retry(pipeline: &str, state: State, error: String) {
    metrics::add(
        "skippr_reconnects_total",
        "Retries of a pipeline after a transient fault (source restarting or unreachable, broken connection, timeout, full disk).",
        &[("pipeline", pipeline)],
        1.0,
    );
    {
        let mut all = pipelines();
        if let Some(entry) = all.get_mut(pipeline) {
            entry.status.reconnects += 1;
        }
    }
    set(pipeline, state, Some(error));
}

/// Records a commit round of `pipeline` that committed `tables` tables in `seconds`: the
/// `skippr_commit_round_seconds` histogram, and the figures of the state file.
pub fn round_done(pipeline: &str, seconds: f64, tables: usize) {
    metrics::observe_seconds(
        "skippr_commit_round_seconds",
        "Duration of a pipeline's commit rounds (those that committed at least one table), in seconds.",
        &[("pipeline", pipeline)],
        seconds,
    );
    let mut all = pipelines();
    let Some(entry) = all.get_mut(pipeline) else {
        return;
    };
    if entry.recent.len() == ROUND_WINDOW {
        entry.recent.pop_front();
    }
    entry.recent.push_back(seconds);
    let mut sorted: Vec<f64> = entry.recent.iter().copied().collect();
    sorted.sort_by(f64::total_cmp);
    let at = |q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
    let r = &mut entry.status.rounds;
    r.count += 1;
    r.last_seconds = Some(seconds);
    r.last_tables = tables as u64;
    r.p50_seconds = Some(at(0.5));
    r.p99_seconds = Some(at(0.99));
    r.max_seconds = sorted.last().copied();
    publish(entry);
}

/// Records how far the snapshot of `pipeline` is, table by table: the state file's
/// `snapshot` and the `skippr_snapshot_*` gauges.
pub fn snapshot_progress(pipeline: &str, tables: Vec<TableSnapshot>) {
    for t in &tables {
        let labels = [("pipeline", pipeline), ("table", t.table.as_str())];
        metrics::set(
            "skippr_snapshot_rows_copied",
            "Rows the running (or last) snapshot of a table has copied.",
            &labels,
            t.rows_copied as f64,
        );
        metrics::set(
            "skippr_snapshot_rows_estimated",
            "Postgres's estimate of a table's rows when its snapshot started.",
            &labels,
            t.rows_estimated as f64,
        );
        metrics::set(
            "skippr_snapshot_eta_seconds",
            "Estimated seconds until a table's snapshot is copied (0 once done or when unknown).",
            &labels,
            t.eta_seconds.unwrap_or(0.0),
        );
    }
    let mut all = pipelines();
    let Some(entry) = all.get_mut(pipeline) else {
        return;
    };
    entry.status.snapshot = tables;
    publish(entry);
}

/// The state of a pipeline of this process.
pub fn current(pipeline: &str) -> Option<PipelineStatus> {
    pipelines().get(pipeline).map(|e| e.status.clone())
}

/// The state of a pipeline: this process's own when it runs the pipeline, else what its
/// state file says (another process's, possibly stale: see the module comment).
pub fn read(storage: &Path, pipeline: &str) -> Option<PipelineStatus> {
    if let Some(s) = current(pipeline) {
        return Some(s);
    }
    let text = std::fs::read_to_string(state_file(storage, pipeline)).ok()?;
    serde_json::from_str(&text).ok()
}

/// Updates the metric and the state file of one pipeline.
fn publish(entry: &Entry) {
    let s = &entry.status;
    for st in State::ALL {
        metrics::set(
            "skippr_pipeline_state",
            "1 for the state the pipeline is in (starting, streaming, reconnecting, storage_full, failed, stopped), 0 for the others.",
            &[("pipeline", &s.pipeline), ("state", st.as_str())],
            if st == s.state { 1.0 } else { 0.0 },
        );
    }
    let Some(storage) = &entry.storage else {
        return;
    };
    let path = state_file(storage, &s.pipeline);
    let write = || -> std::io::Result<()> {
        let text = serde_json::to_vec_pretty(s).map_err(std::io::Error::other)?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, &path)
    };
    // A full disk is one of the states this file reports: failing to write it must not
    // change what the pipeline does.
    if let Err(e) = write() {
        tracing::debug!(pipeline = %s.pipeline, file = %path.display(), error = %e, "cannot write the pipeline state file");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_is_kept_in_memory_and_in_the_file() {
        let dir = tempfile::tempdir().unwrap();
        register("state_test_p", dir.path());
        assert_eq!(current("state_test_p").unwrap().state, State::Starting);
        retry(
            "state_test_p",
            State::Reconnecting,
            "the source is restarting".into(),
        );
        set("state_test_p", State::Streaming, None);
        let file: PipelineStatus = serde_json::from_str(
            &std::fs::read_to_string(state_file(dir.path(), "state_test_p")).unwrap(),
        )
        .unwrap();
        assert_eq!(file.state, State::Streaming);
        assert_eq!(file.reconnects, 1);
        assert_eq!(file.error, None);
        let text = metrics::render();
        assert!(
            text.contains("skippr_pipeline_state{pipeline=\"state_test_p\",state=\"streaming\"} 1")
        );
        assert!(text
            .contains("skippr_pipeline_state{pipeline=\"state_test_p\",state=\"reconnecting\"} 0"));
        assert!(text.contains("skippr_reconnects_total{pipeline=\"state_test_p\"} 1"));
        // Another process reads the file.
        let other = read(dir.path(), "state_test_p").unwrap();
        assert_eq!(other.state, State::Streaming);
        assert!(read(dir.path(), "no_such_pipeline").is_none());
    }

    #[test]
    fn snapshot_progress_is_in_the_file_and_the_metrics() {
        let dir = tempfile::tempdir().unwrap();
        register("snap_test_p", dir.path());
        let table = |rows: u64, done: bool| TableSnapshot {
            table: "public.big".into(),
            rows_copied: rows,
            rows_estimated: 1_000,
            rows_per_second: 100.0,
            eta_seconds: (!done).then_some(7.0),
            done,
        };
        snapshot_progress("snap_test_p", vec![table(300, false)]);
        let other = read(dir.path(), "snap_test_p").unwrap();
        assert_eq!(other.snapshot, vec![table(300, false)]);
        let text = metrics::render();
        assert!(text.contains(
            "skippr_snapshot_rows_copied{pipeline=\"snap_test_p\",table=\"public.big\"} 300"
        ));
        assert!(text.contains(
            "skippr_snapshot_eta_seconds{pipeline=\"snap_test_p\",table=\"public.big\"} 7"
        ));
        snapshot_progress("snap_test_p", vec![table(1_000, true)]);
        let file: PipelineStatus = serde_json::from_str(
            &std::fs::read_to_string(state_file(dir.path(), "snap_test_p")).unwrap(),
        )
        .unwrap();
        assert!(file.snapshot[0].done && file.snapshot[0].rows_copied == 1_000);
    }

    #[test]
    fn commit_rounds_are_counted_with_their_percentiles() {
        let dir = tempfile::tempdir().unwrap();
        register("rounds_test_p", dir.path());
        for i in 1..=100 {
            round_done("rounds_test_p", i as f64 / 100.0, 3);
        }
        let file: PipelineStatus = serde_json::from_str(
            &std::fs::read_to_string(state_file(dir.path(), "rounds_test_p")).unwrap(),
        )
        .unwrap();
        let r = file.rounds;
        assert_eq!((r.count, r.last_tables), (100, 3));
        assert_eq!(r.last_seconds, Some(1.0));
        assert_eq!(r.max_seconds, Some(1.0));
        assert_eq!(r.p50_seconds, Some(0.51));
        assert_eq!(r.p99_seconds, Some(0.99));
        let text = metrics::render();
        assert!(text.contains("skippr_commit_round_seconds_count{pipeline=\"rounds_test_p\"} 100"));
        assert!(
            text.contains(
                "skippr_commit_round_seconds_bucket{le=\"0.5\",pipeline=\"rounds_test_p\"} 50"
            ),
            "{text}"
        );
        // A state file from before rounds were recorded still reads.
        let old = r#"{"pipeline":"p","state":"streaming","error":null,"since_unix_ms":1,"reconnects":0,"pid":1}"#;
        let s: PipelineStatus = serde_json::from_str(old).unwrap();
        assert_eq!(s.rounds, Rounds::default());
    }
}
