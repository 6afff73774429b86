//! The recorded state of each pipeline (`running`, `reconnecting`, `stopped`, `failed` and
//! its error), kept in a small JSON file in the storage folder so that `skipprd status` and
//! other processes can read what a running `sync` or `serve` is doing.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// What a pipeline last recorded about itself.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PipelineState {
    /// `running`, `reconnecting`, `stopped` or `failed`.
    pub state: String,
    /// The error that stopped it (for `failed`) or the cause of the retry (`reconnecting`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// When it was recorded (RFC 3339).
    pub updated_at: String,
}

fn path(storage: &Path, pipeline: &str) -> PathBuf {
    storage.join("state").join(format!("{pipeline}.json"))
}

/// The last recorded state, if any (a missing or unreadable file reads as none).
pub fn read(storage: &Path, pipeline: &str) -> Option<PipelineState> {
    let text = std::fs::read_to_string(path(storage, pipeline)).ok()?;
    serde_json::from_str(&text).ok()
}

/// Records `state` (best effort: a status file that cannot be written is logged, never fatal).
pub fn write(storage: &Path, pipeline: &str, state: &str, error: Option<String>) {
    let record = PipelineState {
        state: state.to_string(),
        error,
        updated_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
    };
    let file = path(storage, pipeline);
    let result = (|| -> std::io::Result<()> {
        if let Some(dir) = file.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = file.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(&record)?)?;
        std::fs::rename(&tmp, &file)
    })();
    if let Err(e) = result {
        tracing::warn!(pipeline, error = %e, file = %file.display(), "could not record the pipeline state");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_missing() {
        let dir = tempfile::tempdir().expect("temp dir");
        assert_eq!(read(dir.path(), "p"), None);
        write(dir.path(), "p", "failed", Some("slot lost".into()));
        let s = read(dir.path(), "p").expect("recorded");
        assert_eq!(s.state, "failed");
        assert_eq!(s.error.as_deref(), Some("slot lost"));
    }
}
