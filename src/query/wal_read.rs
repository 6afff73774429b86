//! Queries, live half, first step: the WAL of a pipeline as a statement reads it at one
//! moment, its segments decoded once and shared by every query of the process.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::change::Lsn;
use crate::error::Result;
use crate::wal::{Record, SegmentInfo, WalStore};

/// Decoded WAL segments, shared by every query of the process. Segments are immutable once
/// written, so a decoded segment is valid for as long as its file exists.
#[derive(Default)]
pub struct TailCache {
    segments: Mutex<HashMap<PathBuf, Arc<Vec<Record>>>>,
}

/// The WAL of one pipeline as read at one moment.
#[derive(Default, Clone)]
pub struct WalRead {
    /// Segments read, oldest first.
    pub segments: Vec<(SegmentInfo, Arc<Vec<Record>>)>,
    /// Segments listed but removed before they could be read: their changes were
    /// committed to Iceberg in the meantime.
    pub vanished: Vec<SegmentInfo>,
}

impl WalRead {
    /// The newest LSN of a removed segment: an Iceberg snapshot read afterwards must cover it,
    /// or the read raced with a commit and must be repeated.
    pub fn vanished_through(&self) -> Option<Lsn> {
        self.vanished.iter().map(|s| s.last).max()
    }

    pub fn bytes(&self) -> u64 {
        self.segments.iter().map(|(s, _)| s.bytes).sum()
    }

    /// The end LSN of the newest transaction read at or before `cut` (zero when none is):
    /// two cuts with the same one see the same transactions.
    pub fn newest_through(&self, cut: Lsn) -> Lsn {
        self.segments
            .iter()
            .flat_map(|(_, records)| records.iter())
            .filter_map(|r| match r {
                Record::Txn(t) if t.end_lsn <= cut => Some(t.end_lsn),
                _ => None,
            })
            .max()
            .unwrap_or_default()
    }

    /// The end LSN of the newest transaction read (zero when the read holds none).
    pub fn newest(&self) -> Lsn {
        self.segments
            .iter()
            .flat_map(|(_, records)| records.iter())
            .filter_map(|r| match r {
                Record::Txn(t) => Some(t.end_lsn),
                Record::Relation(_) => None,
            })
            .max()
            .unwrap_or_default()
    }

    /// Identifies this read, for caching what is derived from it.
    pub(super) fn fingerprint(&self) -> Vec<PathBuf> {
        self.segments.iter().map(|(s, _)| s.path.clone()).collect()
    }
}

impl TailCache {
    /// Lists and decodes the WAL of the pipeline whose segments live in `dir`. Reading never
    /// writes, creates or removes anything.
    pub fn read(&self, dir: &Path) -> Result<WalRead> {
        self.read_store(WalStore::reader(dir))
    }

    /// Like [`TailCache::read`], for a WAL already opened for reading (S3 mode); `None`
    /// reads as an empty WAL.
    pub fn read_store(&self, store: Option<WalStore>) -> Result<WalRead> {
        let Some(store) = store else {
            return Ok(WalRead::default());
        };
        let listed = store.segments()?;
        let mut out = WalRead::default();
        let mut fresh = Vec::new();
        {
            let cache = self.lock();
            for seg in &listed {
                match cache.get(&seg.path) {
                    Some(r) => out.segments.push((seg.clone(), r.clone())),
                    None => fresh.push(seg.clone()),
                }
            }
        }
        for seg in fresh {
            match store.read_if_present(&seg)? {
                Some(records) => {
                    let records = Arc::new(records);
                    self.lock().insert(seg.path.clone(), records.clone());
                    out.segments.push((seg, records));
                }
                None => out.vanished.push(seg),
            }
        }
        out.segments.sort_by_key(|(s, _)| (s.first, s.last));
        // Forget segments of this WAL that are gone.
        let keep: HashSet<&PathBuf> = listed.iter().map(|s| &s.path).collect();
        self.lock()
            .retain(|p, _| !p.starts_with(store.dir()) || keep.contains(p));
        Ok(out)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, Arc<Vec<Record>>>> {
        // A panic while holding the lock cannot leave the map inconsistent: keep using it.
        self.segments.lock().unwrap_or_else(|e| e.into_inner())
    }
}
