//! The WAL's history: segments whose changes Iceberg already holds, moved aside instead of
//! deleted and kept for the pipeline's `snapshot_retention`, so that time travel to a point
//! between two commits (`SET skippr.as_of`, `skipprd query --as-of`) rebuilds that state
//! exactly from the snapshot before it and the transactions after it.
//!
//! The history is a sibling of the WAL (`wal-history/<pipeline>` beside `wal/<pipeline>`,
//! on local disk or under the S3 prefix) holding segments in the WAL's own format and names.
//! A marker, `from`, records the position after which the history and the live WAL together
//! hold every transaction of the pipeline's tables: segments leave the live WAL only by
//! being moved here, and leave the history oldest first, each raising the marker before it
//! goes. A reader may therefore trust any position after the marker; before it, time travel
//! refuses as it did without a history.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;

use super::codec::Record;
use super::objects::ObjectWal;
use super::segment::{decode, parse_name, read_file_if_present, segment_name, SegmentInfo};
use crate::change::Lsn;
use crate::error::{Context, Error, Result};
use crate::storage::{join_key, Location, Store};

/// The marker holding the position after which the history is complete.
const FROM_MARKER: &str = "from";

/// Where the history lives.
#[derive(Debug, Clone)]
enum Place {
    Dir(PathBuf),
    Objects { store: Store, prefix: String },
}

/// The history of one pipeline's WAL.
#[derive(Debug, Clone)]
pub struct WalHistory {
    place: Place,
    /// How long a segment is kept after it left the live WAL.
    retention: Duration,
    /// When the writer last removed expired segments (the listing is not repeated every round).
    expired_at: Arc<Mutex<Option<Instant>>>,
    /// Whether the history holds a segment, once known to the writer (it is then not listed
    /// at every round to find out).
    holds: Arc<Mutex<Option<bool>>>,
}

/// A segment in the history and when it left the live WAL.
#[derive(Debug, Clone)]
struct Kept {
    seg: SegmentInfo,
    retired: Option<SystemTime>,
}

/// What a reader found in the history.
#[derive(Debug, Default)]
pub struct HistoryRead {
    /// The segments read, oldest first.
    pub segments: Vec<(SegmentInfo, Arc<Vec<Record>>)>,
    /// Every transaction ending after this position is in `segments` or in the live WAL;
    /// `None` when the history holds nothing to build on.
    pub from: Option<Lsn>,
}

impl WalHistory {
    /// The history of pipeline `name`'s WAL (see [`crate::wal::WalStore::for_pipeline`]), keeping
    /// segments for `retention`. Opening reads and writes nothing.
    pub fn for_pipeline(
        storage: &Location,
        storage_path: &Path,
        name: &str,
        retention: Duration,
    ) -> Result<Self> {
        let place = match storage {
            Location::Local(_) => Place::Dir(storage_path.join("wal-history").join(name)),
            s3 => Place::Objects {
                store: Store::open(s3, None)?,
                prefix: format!("wal-history/{name}"),
            },
        };
        Ok(Self {
            place,
            retention,
            expired_at: Arc::default(),
            holds: Arc::default(),
        })
    }

    fn describe(&self) -> String {
        match &self.place {
            Place::Dir(d) => d.display().to_string(),
            Place::Objects { store, prefix } => store.describe(prefix),
        }
    }

    /// The history's segments, oldest first, with when each left the live WAL.
    fn list(&self) -> Result<Vec<Kept>> {
        let mut out = Vec::new();
        match &self.place {
            Place::Dir(dir) => {
                let entries = match std::fs::read_dir(dir) {
                    Ok(e) => e,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
                    Err(e) => return Err(e).with_context(|| format!("listing {}", dir.display())),
                };
                for entry in entries {
                    let entry = entry.with_context(|| format!("listing {}", dir.display()))?;
                    let Some((first, last)) = entry.file_name().to_str().and_then(parse_name)
                    else {
                        continue;
                    };
                    let meta = entry.metadata().ok();
                    out.push(Kept {
                        seg: SegmentInfo {
                            path: entry.path(),
                            first,
                            last,
                            bytes: meta.as_ref().map(|m| m.len()).unwrap_or(0),
                        },
                        retired: meta.and_then(|m| m.modified().ok()),
                    });
                }
            }
            Place::Objects { store, prefix } => {
                let under = format!("{prefix}/");
                for e in store.blocking(store.list(&under))? {
                    let Some((first, last)) = e.key.strip_prefix(&under).and_then(parse_name)
                    else {
                        continue;
                    };
                    out.push(Kept {
                        seg: SegmentInfo {
                            path: PathBuf::from(&e.key),
                            first,
                            last,
                            bytes: e.size,
                        },
                        retired: e.modified,
                    });
                }
            }
        }
        out.sort_by_key(|k| (k.seg.first, k.seg.last));
        Ok(out)
    }

    /// The marker: the position after which the history is complete (`None`: never written).
    fn from(&self) -> Result<Option<Lsn>> {
        let text = match &self.place {
            Place::Dir(dir) => match std::fs::read_to_string(dir.join(FROM_MARKER)) {
                Ok(t) => t,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => {
                    return Err(e)
                        .with_context(|| format!("reading {}", dir.join(FROM_MARKER).display()))
                }
            },
            Place::Objects { store, prefix } => {
                let key = join_key(prefix, FROM_MARKER);
                match store.blocking(store.get(&key))? {
                    Some((b, _)) => String::from_utf8_lossy(&b).into_owned(),
                    None => return Ok(None),
                }
            }
        };
        Lsn::parse(text.trim()).map(Some).map_err(|e| {
            Error::fatal(format!(
                "{}/{FROM_MARKER} is damaged ({e}); remove the folder {} (time travel between commits then starts over from the next commit)",
                self.describe(),
                self.describe()
            ))
        })
    }

    /// Writes the marker, durably.
    fn set_from(&self, lsn: Lsn) -> Result<()> {
        let text = Bytes::from(lsn.to_string().into_bytes());
        match &self.place {
            Place::Dir(dir) => {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
                let store = Store::open(&Location::Local(dir.clone()), None)?;
                store.blocking(store.put(FROM_MARKER, text)).map(|_| ())
            }
            Place::Objects { store, prefix } => store
                .blocking(store.put(&join_key(prefix, FROM_MARKER), text))
                .map(|_| ()),
        }
    }

    /// Moves `segs` (oldest first) out of the live WAL into the history; `remove` deletes a
    /// segment from the live WAL once it is copied (an object WAL's; a segment on disk is
    /// renamed). The first segment kept by an empty history sets the marker to just before
    /// it: the live WAL held every transaction from there on, and that segment is the oldest
    /// of them.
    pub fn keep(
        &self,
        segs: &[SegmentInfo],
        remove: impl Fn(&SegmentInfo) -> Result<()>,
    ) -> Result<()> {
        let Some(first) = segs.first() else {
            return Ok(());
        };
        let holds = *self.holds.lock().unwrap_or_else(|e| e.into_inner());
        let empty = match holds {
            Some(h) => !h,
            None => self.list()?.is_empty(),
        };
        if empty {
            let before = Lsn(first.first.0.saturating_sub(1));
            if self.from()?.is_none_or(|f| f < before) {
                self.set_from(before)?;
            }
        }
        for seg in segs {
            self.keep_one(seg, &remove)?;
        }
        *self.holds.lock().unwrap_or_else(|e| e.into_inner()) = Some(true);
        Ok(())
    }

    fn keep_one(
        &self,
        seg: &SegmentInfo,
        remove: impl Fn(&SegmentInfo) -> Result<()>,
    ) -> Result<()> {
        let name = seg
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| segment_name(seg.first, seg.last));
        match &self.place {
            Place::Dir(dir) => {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
                let to = dir.join(&name);
                let moved = || -> std::io::Result<()> {
                    std::fs::rename(&seg.path, &to)?;
                    std::fs::File::open(dir)?.sync_all()
                };
                moved().with_context(|| {
                    format!(
                        "moving WAL segment {} into the history {}; check the permissions of skipprd_el_storage_path",
                        seg.path.display(),
                        dir.display()
                    )
                })?;
                // Its age in the history counts from now. Should this fail, it counts from
                // when it was written: it then expires early, and time travel refuses
                // sooner, never answers otherwise.
                let _ = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&to)
                    .and_then(|f| f.set_modified(SystemTime::now()));
                Ok(())
            }
            Place::Objects { store, prefix } => {
                let from = seg.path.to_string_lossy().into_owned();
                store.blocking(store.copy(&from, &join_key(prefix, &name)))?;
                remove(seg)
            }
        }
    }

    /// Removes, oldest first, the segments that left the live WAL longer ago than the
    /// retention, raising the marker past each before it goes. Runs at most every tenth of
    /// the retention (and at least every minute); returns how many went.
    pub fn expire(&self) -> Result<usize> {
        let every = (self.retention / 10).clamp(Duration::from_secs(1), Duration::from_secs(60));
        {
            let mut at = self.expired_at.lock().unwrap_or_else(|e| e.into_inner());
            if at.is_some_and(|t| t.elapsed() < every) {
                return Ok(0);
            }
            *at = Some(Instant::now());
        }
        let Some(cutoff) = SystemTime::now().checked_sub(self.retention) else {
            return Ok(0);
        };
        let kept = self.list()?;
        // Oldest first, and only a prefix: the history stays contiguous.
        let gone: Vec<&Kept> = kept
            .iter()
            .take_while(|k| k.retired.is_none_or(|r| r < cutoff))
            .collect();
        let Some(through) = gone.iter().map(|k| k.seg.last).max() else {
            return Ok(0);
        };
        if self.from()?.is_none_or(|f| f < through) {
            self.set_from(through)?;
        }
        for k in &gone {
            self.remove(&k.seg)?;
        }
        *self.holds.lock().unwrap_or_else(|e| e.into_inner()) = Some(gone.len() < kept.len());
        Ok(gone.len())
    }

    fn remove(&self, seg: &SegmentInfo) -> Result<()> {
        match &self.place {
            Place::Dir(_) => match std::fs::remove_file(&seg.path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e).with_context(|| {
                    format!("removing WAL history segment {}", seg.path.display())
                }),
                _ => Ok(()),
            },
            Place::Objects { store, .. } => {
                store.blocking(store.delete(&seg.path.to_string_lossy()))
            }
        }
    }

    /// Removes the whole history (a re-snapshot starts the WAL over).
    pub fn clear(&self) -> Result<()> {
        for k in self.list()? {
            self.remove(&k.seg)?;
        }
        *self.holds.lock().unwrap_or_else(|e| e.into_inner()) = Some(false);
        match &self.place {
            Place::Dir(dir) => match std::fs::remove_file(dir.join(FROM_MARKER)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(e).with_context(|| format!("removing {}", dir.join(FROM_MARKER).display()))
                }
                _ => Ok(()),
            },
            Place::Objects { store, prefix } => {
                store.blocking(store.delete(&join_key(prefix, FROM_MARKER)))
            }
        }
    }

    /// Reads the segments holding transactions that end after `after` and at or before
    /// `through` (no upper bound when `None`), for time travel. A segment expired while it
    /// was read is left out and the history then counts as complete only after it.
    pub fn read(&self, after: Lsn, through: Option<Lsn>) -> Result<HistoryRead> {
        let kept = self.list()?;
        // Objects are named by their full keys here.
        let objects = match &self.place {
            Place::Dir(_) => None,
            Place::Objects { store, .. } => Some(ObjectWal::new(store.clone(), "")),
        };
        let mut out = HistoryRead::default();
        let mut vanished = Lsn::default();
        for k in kept {
            if through.is_some_and(|t| k.seg.first > t) {
                break;
            }
            if k.seg.last <= after {
                continue;
            }
            let records = match &objects {
                Some(o) => o
                    .get(&k.seg)?
                    .map(|d| decode(&k.seg, d.to_vec()))
                    .transpose()?,
                None => read_file_if_present(&k.seg)?,
            };
            match records {
                Some(records) => out.segments.push((k.seg, Arc::new(records))),
                None => vanished = vanished.max(k.seg.last),
            }
        }
        // Read after the segments: an expiry that raced with the read raised it first.
        out.from = self.from()?.map(|f| f.max(vanished));
        if let Some(f) = out.from {
            out.segments.retain(|(s, _)| s.last > f);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wal::WalStore;

    fn seg_bytes() -> Vec<u8> {
        Vec::new()
    }

    fn history(root: &Path, retention: Duration) -> WalHistory {
        WalHistory::for_pipeline(&Location::Local(root.to_path_buf()), root, "p", retention)
            .unwrap()
    }

    #[test]
    fn segments_move_into_the_history_and_expire_oldest_first() {
        let dir = tempfile::tempdir().unwrap();
        let live = WalStore::open(&dir.path().join("wal").join("p")).unwrap();
        let h = history(dir.path(), Duration::from_secs(3600));
        assert!(
            h.read(Lsn(0), None).unwrap().from.is_none(),
            "nothing kept yet"
        );
        let a = live.write_segment(Lsn(10), Lsn(20), &seg_bytes()).unwrap();
        let b = live.write_segment(Lsn(30), Lsn(40), &seg_bytes()).unwrap();
        let c = live.write_segment(Lsn(50), Lsn(60), &seg_bytes()).unwrap();
        h.keep(&[a, b], |s| live.remove_segment(s)).unwrap();
        assert_eq!(
            live.segments().unwrap(),
            vec![c.clone()],
            "moved, not copied"
        );
        let read = h.read(Lsn(0), None).unwrap();
        assert_eq!(
            read.from,
            Some(Lsn(9)),
            "complete from just before the first kept"
        );
        assert_eq!(
            read.segments
                .iter()
                .map(|(s, _)| (s.first, s.last))
                .collect::<Vec<_>>(),
            vec![(Lsn(10), Lsn(20)), (Lsn(30), Lsn(40))]
        );
        assert_eq!(h.read(Lsn(0), Some(Lsn(25))).unwrap().segments.len(), 1);
        assert_eq!(h.read(Lsn(20), None).unwrap().segments.len(), 1, "after 20");
        // Nothing is old enough yet.
        assert_eq!(h.expire().unwrap(), 0);

        // With no retention left, both go, and the marker passes them.
        let h0 = history(dir.path(), Duration::ZERO);
        assert_eq!(h0.expire().unwrap(), 2);
        let read = h0.read(Lsn(0), None).unwrap();
        assert_eq!(read.from, Some(Lsn(40)));
        assert!(read.segments.is_empty());
        // A later segment continues the history from the marker.
        h0.keep(std::slice::from_ref(&c), |s| live.remove_segment(s))
            .unwrap();
        assert_eq!(h0.read(Lsn(0), None).unwrap().from, Some(Lsn(49)));
        h0.clear().unwrap();
        assert!(h0.read(Lsn(0), None).unwrap().from.is_none());
    }
}
