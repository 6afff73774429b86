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
}

struct Entry {
    status: PipelineStatus,
    /// The storage folder, when the state is also written to a file.
    storage: Option<PathBuf>,
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
    };
    let mut all = pipelines();
    let reconnects = all.get(pipeline).map(|e| e.status.reconnects).unwrap_or(0);
    let entry = all.entry(pipeline.to_string()).or_insert(Entry {
        status,
        storage: None,
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
}
