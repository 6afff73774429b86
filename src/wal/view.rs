//! WAL in S3 mode, the writer's view: the segments that the process holding a pipeline's
//! lease has listed, written and removed. Queries in the same process (`serve`) read the
//! segment list from here instead of listing the prefix for every statement; a process that
//! does not hold the lease (another `serve` replica) lists as before.
//!
//! The view is trusted only while the lease hold it was built under is still current: under
//! one hold no other process writes the WAL, so the view is the whole truth.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard, OnceLock};

use super::segment::SegmentInfo;
use crate::storage::lease::current_hold;

struct View {
    pipeline: String,
    hold: u64,
    /// Set once a full listing was merged in (before that, the view misses older segments).
    ready: bool,
    segments: BTreeMap<String, SegmentInfo>,
}

fn views() -> MutexGuard<'static, HashMap<String, View>> {
    static VIEWS: OnceLock<Mutex<HashMap<String, View>>> = OnceLock::new();
    VIEWS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

fn key_of(seg: &SegmentInfo) -> String {
    seg.path.to_string_lossy().into_owned()
}

/// The writer starts a listing of `root`: segments written from now on are recorded, so
/// that none written during the listing is missed. Returns the hold it lists under.
pub fn begin_listing(root: &str, pipeline: &str) -> Option<u64> {
    let hold = current_hold(pipeline)?;
    let mut views = views();
    let stale = views
        .get(root)
        .is_none_or(|v| v.hold != hold || v.pipeline != pipeline);
    if stale {
        views.insert(
            root.to_string(),
            View {
                pipeline: pipeline.to_string(),
                hold,
                ready: false,
                segments: BTreeMap::new(),
            },
        );
    }
    Some(hold)
}

/// The writer's listing under `hold` completed: what it found joins the view. Segments are
/// only ever removed by [`removed`], so a listing older than a write cannot drop it.
pub fn listed(root: &str, hold: u64, segments: &[SegmentInfo]) {
    if let Some(v) = views().get_mut(root).filter(|v| v.hold == hold) {
        for s in segments {
            v.segments.entry(key_of(s)).or_insert_with(|| s.clone());
        }
        v.ready = true;
    }
}

/// The writer wrote `seg` durably.
pub fn written(root: &str, seg: &SegmentInfo) {
    if let Some(v) = views().get_mut(root) {
        v.segments.insert(key_of(seg), seg.clone());
    }
}

/// A write or removal under `root` failed: it may have happened anyway (a PUT can land
/// after its answer was lost), so the view is not trusted until the next full listing.
pub fn unsure(root: &str) {
    if let Some(v) = views().get_mut(root) {
        v.ready = false;
    }
}

/// The writer removed `seg`.
pub fn removed(root: &str, seg: &SegmentInfo) {
    if let Some(v) = views().get_mut(root) {
        v.segments.remove(&key_of(seg));
    }
}

/// The segments of `root`, oldest first, when this process writes them under a current
/// lease hold; `None` when a reader must list them itself.
pub fn segments(root: &str, pipeline: &str) -> Option<Vec<SegmentInfo>> {
    let hold = current_hold(pipeline)?;
    let views = views();
    let v = views
        .get(root)
        .filter(|v| v.ready && v.hold == hold && v.pipeline == pipeline)?;
    let mut out: Vec<SegmentInfo> = v.segments.values().cloned().collect();
    out.sort_by_key(|s| (s.first, s.last));
    Some(out)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use super::*;
    use crate::change::Lsn;
    use crate::error::Result;
    use crate::storage::lease::{Lease, LeaseSettings};
    use crate::storage::{Location, Store};

    fn seg(first: u64, last: u64) -> SegmentInfo {
        SegmentInfo {
            path: PathBuf::from(format!("wal/p/{first:016X}-{last:016X}.seg")),
            first: Lsn(first),
            last: Lsn(last),
            bytes: 1,
        }
    }

    #[tokio::test]
    async fn the_view_is_used_only_under_the_hold_it_was_listed_under() -> Result<()> {
        let (root, pipeline) = ("s3://bucket/wal/view_t", "view_t");
        // No lease held: readers list for themselves.
        assert_eq!(begin_listing(root, pipeline), None);
        assert!(segments(root, pipeline).is_none());

        let dir = tempfile::tempdir()?;
        let store = Store::open(&Location::Local(dir.path().to_path_buf()), None)?;
        let settings = LeaseSettings {
            renew_every: Duration::from_secs(30),
            expire_after: Duration::from_secs(120),
        };
        let lease = Lease::acquire(
            store.clone(),
            "pipelines/view_t.lease.json",
            pipeline,
            settings,
        )
        .await?;
        let hold =
            begin_listing(root, pipeline).ok_or_else(|| crate::error::Error::fatal("no hold"))?;
        // Not complete before its listing is merged in.
        assert!(segments(root, pipeline).is_none());
        // A segment written while the listing runs is kept, though the listing missed it.
        written(root, &seg(30, 40));
        listed(root, hold, &[seg(10, 20)]);
        let got = segments(root, pipeline).unwrap_or_default();
        assert_eq!(got, vec![seg(10, 20), seg(30, 40)]);
        // A later listing that is older than a write does not drop it; removals do.
        written(root, &seg(50, 60));
        removed(root, &seg(10, 20));
        listed(root, hold, &[seg(30, 40)]);
        let got = segments(root, pipeline).unwrap_or_default();
        assert_eq!(got, vec![seg(30, 40), seg(50, 60)]);
        // A failed write may have landed: not trusted until the next full listing.
        unsure(root);
        assert!(segments(root, pipeline).is_none());
        listed(root, hold, &[seg(30, 40), seg(50, 60), seg(61, 70)]);
        let got = segments(root, pipeline).unwrap_or_default();
        assert_eq!(got, vec![seg(30, 40), seg(50, 60), seg(61, 70)]);
        removed(root, &seg(61, 70));

        // Another hold (the lease lost and taken again) starts from scratch.
        drop(lease);
        assert!(segments(root, pipeline).is_none());
        let again =
            Lease::acquire(store, "pipelines/view_t2.lease.json", pipeline, settings).await?;
        assert!(
            segments(root, pipeline).is_none(),
            "a view of an earlier hold was trusted"
        );
        let hold2 =
            begin_listing(root, pipeline).ok_or_else(|| crate::error::Error::fatal("no hold"))?;
        assert_ne!(hold, hold2);
        listed(root, hold2, &[seg(50, 60)]);
        assert_eq!(
            segments(root, pipeline).unwrap_or_default(),
            vec![seg(50, 60)]
        );
        drop(again);
        Ok(())
    }
}
