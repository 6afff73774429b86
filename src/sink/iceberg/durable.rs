//! Durability of a commit: every file a commit adds (data, position deletes, manifests, the
//! manifest list, the metadata file) and the folders that name them are fsynced before the
//! catalog's compare-and-swap makes them visible; plus the named pause points tests use to
//! kill a sync between the steps of a commit.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::error::{Context, Result};

/// Test hook: when this environment variable names a pause point, skipprd stops there
/// (printing `skipprd test hook: paused at <point>` on stderr) and waits forever, so a test
/// can SIGKILL it at exactly that step. Never set it in production.
pub const PAUSE_ENV: &str = "SKIPPR_TEST_PAUSE_AT";
/// Pause point: every file of a commit is durable, the catalog still points at the old
/// metadata.
pub const PAUSE_BEFORE_CATALOG_SWAP: &str = "before-catalog-swap";
/// Pause point: every table has committed, the WAL segments they cover are not deleted yet.
pub const PAUSE_BEFORE_WAL_REMOVAL: &str = "before-wal-removal";

/// Pause point: a table's new copy has committed, the difference it makes is not in the
/// table's changelog yet.
pub const PAUSE_BEFORE_COPY_DIFFERENCE: &str = "before-copy-difference";

/// Pause point: a table added to a running pipeline was copied in key chunks and has landed;
/// it has not joined the stream yet.
pub const PAUSE_AFTER_CHUNKED_COPY: &str = "after-chunked-copy";

/// Pause point with a count, named `copied-chunks:<n>`: a copy in key chunks has made at
/// least n chunks durable; each of its connections stops once its chunk under way is durable.
pub const PAUSE_COPIED_CHUNKS: &str = "copied-chunks";

/// Waits forever when [`PAUSE_ENV`] names `point:<n>` with `n` at most `count`.
pub async fn pause_point_counted(point: &str, count: usize) {
    let Ok(value) = std::env::var(PAUSE_ENV) else {
        return;
    };
    let reached = value
        .strip_prefix(point)
        .and_then(|rest| rest.strip_prefix(':'))
        .and_then(|n| n.parse::<usize>().ok())
        .is_some_and(|n| count >= n);
    if reached {
        eprintln!("skipprd test hook: paused at {value}");
        tracing::warn!(point = %value, "test hook: paused until killed");
        std::future::pending::<()>().await;
    }
}

/// Waits forever when [`PAUSE_ENV`] names `point` (see there); returns at once otherwise.
pub async fn pause_point(point: &str) {
    if std::env::var(PAUSE_ENV).is_ok_and(|v| v == point) {
        eprintln!("skipprd test hook: paused at {point}");
        tracing::warn!(point, "test hook: paused until killed");
        std::future::pending::<()>().await;
    }
}

/// The local path of a `file://` location, or `None` for other stores (an object store's
/// put is durable when it returns).
fn local_path(location: &str) -> Option<PathBuf> {
    location.strip_prefix("file://").map(PathBuf::from)
}

/// Fsyncs every local file in `locations`, then the folder holding each of them and that
/// folder's parent (which names a folder the commit may have created, such as `data/`).
/// The files are synced at once, then the folders at once: the device serves concurrent
/// flushes together, so a commit waits for about one flush per step, not one per file.
pub fn sync_files<'a>(locations: impl IntoIterator<Item = &'a str>) -> Result<()> {
    let mut files = Vec::new();
    let mut dirs: BTreeSet<PathBuf> = BTreeSet::new();
    for location in locations {
        let Some(path) = local_path(location) else {
            continue;
        };
        if let Some(dir) = path.parent() {
            dirs.insert(dir.to_path_buf());
            if let Some(up) = dir.parent() {
                dirs.insert(up.to_path_buf());
            }
        }
        files.push(path);
    }
    sync_all(&files)?;
    sync_all(&dirs.into_iter().collect::<Vec<_>>())
}

/// Files fsynced at once, at most (a copy can write thousands).
const SYNC_AT_ONCE: usize = 16;

/// Fsyncs `paths`, [`SYNC_AT_ONCE`] at a time (one thread each beyond the first of a
/// group); the first error wins.
fn sync_all(paths: &[PathBuf]) -> Result<()> {
    for group in paths.chunks(SYNC_AT_ONCE) {
        sync_group(group)?;
    }
    Ok(())
}

fn sync_group(paths: &[PathBuf]) -> Result<()> {
    let Some((first, rest)) = paths.split_first() else {
        return Ok(());
    };
    std::thread::scope(|scope| {
        let others: Vec<_> = rest
            .iter()
            .map(|p| scope.spawn(move || sync_path(p)))
            .collect();
        let mut outcome = sync_path(first);
        for handle in others {
            let synced = handle.join().unwrap_or_else(|_| {
                Err(crate::error::Error::fatal(
                    "a thread making a commit's files durable stopped unexpectedly",
                ))
            });
            if outcome.is_ok() {
                outcome = synced;
            }
        }
        outcome
    })
}

fn sync_path(path: &Path) -> Result<()> {
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .with_context(|| {
            format!(
                "making {} durable (fsync) before committing it",
                path.display()
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syncs_local_files_and_skips_other_stores() -> Result<()> {
        let dir = tempfile::tempdir().context("temp dir")?;
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data).context("mkdir")?;
        let file = data.join("f.parquet");
        std::fs::write(&file, b"x").context("write")?;
        let location = format!("file://{}", file.display());
        sync_files([location.as_str(), "s3://bucket/key.parquet"])?;
        // A file that is not there is an error, never a silent success.
        let missing = format!("file://{}/nope.parquet", dir.path().display());
        assert!(sync_files([missing.as_str()]).is_err());
        Ok(())
    }
}
