//! Storage, the lease holder's memory of small objects (S3 mode): the pipeline state and the
//! WAL's markers that the process holding a pipeline's lease writes. Readers in the same
//! process (`serve`'s queries) take them from here instead of a GET per statement.
//!
//! An entry is trusted only while the lease hold it was recorded under is current: under one
//! hold no other process writes the pipeline's objects, so the last value this process wrote
//! or read is the store's.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock};

use bytes::Bytes;

use super::lease::current_hold;

struct Known {
    pipeline: String,
    hold: u64,
    /// `None`: the object does not exist.
    bytes: Option<Bytes>,
}

fn known() -> MutexGuard<'static, HashMap<String, Known>> {
    static KNOWN: OnceLock<Mutex<HashMap<String, Known>>> = OnceLock::new();
    KNOWN
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// The object at `location` of `pipeline` as this process last wrote or read it under the
/// current hold: `Some(None)` when it is known to be absent, `None` when unknown.
pub fn get(location: &str, pipeline: &str) -> Option<Option<Bytes>> {
    let hold = current_hold(pipeline);
    let mut known = known();
    let k = known.get(location)?;
    if hold == Some(k.hold) && k.pipeline == pipeline {
        return Some(k.bytes.clone());
    }
    known.remove(location);
    None
}

/// This process wrote (or removed, `None`) the object: it replaces what was known.
pub fn wrote(location: &str, pipeline: &str, bytes: Option<Bytes>) {
    let Some(hold) = current_hold(pipeline) else {
        return;
    };
    known().insert(
        location.to_string(),
        Known {
            pipeline: pipeline.to_string(),
            hold,
            bytes,
        },
    );
}

/// This process read the object from the store: known from now on, unless a write of its
/// own was recorded meanwhile (that one is newer than what the read returned, or equal).
pub fn read(location: &str, pipeline: &str, bytes: Option<Bytes>) {
    let Some(hold) = current_hold(pipeline) else {
        return;
    };
    let mut known = known();
    if known
        .get(location)
        .is_some_and(|k| k.hold == hold && k.pipeline == pipeline)
    {
        return;
    }
    known.insert(
        location.to_string(),
        Known {
            pipeline: pipeline.to_string(),
            hold,
            bytes,
        },
    );
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::error::Result;
    use crate::storage::lease::{Lease, LeaseSettings};
    use crate::storage::{Location, Store};

    #[tokio::test]
    async fn known_only_under_the_hold_it_was_recorded_under() -> Result<()> {
        let (loc, pipeline) = ("s3://bucket/state/held_t.json", "held_t");
        // No lease: nothing is recorded, every read goes to the store.
        wrote(loc, pipeline, Some(Bytes::from_static(b"a")));
        assert!(get(loc, pipeline).is_none());

        let dir = tempfile::tempdir()?;
        let store = Store::open(&Location::Local(dir.path().to_path_buf()), None)?;
        let settings = LeaseSettings {
            renew_every: Duration::from_secs(30),
            expire_after: Duration::from_secs(120),
        };
        let lease =
            Lease::acquire(store, "pipelines/held_t.lease.json", pipeline, settings).await?;
        // A read is kept; an older read arriving after a write does not replace the write.
        read(loc, pipeline, Some(Bytes::from_static(b"old")));
        assert_eq!(get(loc, pipeline), Some(Some(Bytes::from_static(b"old"))));
        wrote(loc, pipeline, Some(Bytes::from_static(b"new")));
        read(loc, pipeline, Some(Bytes::from_static(b"old")));
        assert_eq!(get(loc, pipeline), Some(Some(Bytes::from_static(b"new"))));
        wrote(loc, pipeline, None);
        assert_eq!(get(loc, pipeline), Some(None));
        // Another pipeline's name does not match.
        assert!(get(loc, "other").is_none());
        // Released: unknown again.
        drop(lease);
        assert!(get(loc, pipeline).is_none());
        Ok(())
    }
}
