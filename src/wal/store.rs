//! WAL segments on the local file system: atomic, fsynced segment files named by the LSN
//! range they cover, read back in order, and removed once Iceberg holds their changes.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};

use bytes::{Bytes, BytesMut};

use super::codec::{decode_all, encode_relation, encode_txn, Record, MAGIC};
use super::objects::ObjectWal;
use crate::change::Lsn;
use crate::change::Relation;
use crate::change::Txn;
use crate::error::{Context, Error, ErrorKind, Result};

/// File in the WAL folder holding the newest position acknowledged without a segment.
const ACKNOWLEDGED_FILE: &str = "acknowledged";
use crate::storage::Store;

/// A complete segment on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentInfo {
    pub path: PathBuf,
    /// End LSN of its first transaction.
    pub first: Lsn,
    /// End LSN of its last transaction.
    pub last: Lsn,
    pub bytes: u64,
}

/// The WAL of one pipeline.
#[derive(Debug, Clone)]
pub struct WalStore {
    dir: PathBuf,
    /// Set when the WAL lives in object storage (S3 mode); `dir` is then its key prefix.
    objects: Option<ObjectWal>,
}

pub(super) fn parse_name(name: &str) -> Option<(Lsn, Lsn)> {
    let stem = name.strip_suffix(".seg")?;
    let (a, b) = stem.split_once('-')?;
    Some((
        Lsn(u64::from_str_radix(a, 16).ok()?),
        Lsn(u64::from_str_radix(b, 16).ok()?),
    ))
}

impl WalStore {
    /// Opens (creating) the folder and deletes temporary files a crash left behind.
    pub fn open(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| {
            format!(
                "cannot create the WAL folder {}; check skipprd_el_storage_path and its permissions",
                dir.display()
            )
        })?;
        for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
            let entry = entry.with_context(|| format!("listing {}", dir.display()))?;
            if entry.path().extension().is_some_and(|e| e == "tmp") {
                tracing::warn!(file = %entry.path().display(), "removing an incomplete WAL segment left by a crash (its changes were never acknowledged)");
                std::fs::remove_file(entry.path())
                    .with_context(|| format!("removing {}", entry.path().display()))?;
            }
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            objects: None,
        })
    }

    /// The WAL under `prefix` in an object store (S3 mode). Opening reads and writes
    /// nothing: a segment PUT is atomic, so no partial segment can be left behind.
    pub fn on_objects(store: Store, prefix: &str) -> Self {
        Self {
            dir: PathBuf::from(prefix.trim_matches('/')),
            objects: Some(ObjectWal::new(store, prefix)),
        }
    }

    /// Opens an existing WAL for reading only: nothing is created or cleaned up, so a reader
    /// never disturbs the process that writes it. `None` when the folder does not exist.
    pub fn reader(dir: &Path) -> Option<Self> {
        dir.is_dir().then(|| Self {
            dir: dir.to_path_buf(),
            objects: None,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Complete segments, oldest first.
    pub fn segments(&self) -> Result<Vec<SegmentInfo>> {
        if let Some(objects) = &self.objects {
            return objects.segments();
        }
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.dir)
            .with_context(|| format!("listing {}", self.dir.display()))?
        {
            let entry = entry.with_context(|| format!("listing {}", self.dir.display()))?;
            let name = entry.file_name();
            let Some((first, last)) = name.to_str().and_then(parse_name) else {
                continue;
            };
            let bytes = entry.metadata().map(|m| m.len()).unwrap_or(0);
            out.push(SegmentInfo {
                path: entry.path(),
                first,
                last,
                bytes,
            });
        }
        out.sort_by_key(|s| (s.first, s.last));
        Ok(out)
    }

    /// Writes `data` (records, without header) as a complete segment, durably.
    pub fn write_segment(&self, first: Lsn, last: Lsn, data: &[u8]) -> Result<SegmentInfo> {
        if let Some(objects) = &self.objects {
            return objects.write_segment(first, last, data);
        }
        let name = format!("{:016X}-{:016X}.seg", first.0, last.0);
        let path = self.dir.join(&name);
        let tmp = self.dir.join(format!("{name}.tmp"));
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(MAGIC)?;
            f.write_all(data)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            std::fs::File::open(&self.dir)?.sync_all()
        };
        write().map_err(|e| {
            // A partial segment is never left behind: its changes were not acknowledged, so
            // the source sends them again.
            let _ = std::fs::remove_file(&tmp);
            let (kind, hint) = if crate::error::is_storage_full_io(&e) {
                (
                    ErrorKind::Retryable,
                    "; storage full: free space under skipprd_el_storage_path and ingest resumes by itself (nothing was acknowledged, nothing is lost)",
                )
            } else {
                (crate::error::io_kind(&e), "")
            };
            let message = format!("cannot write WAL segment {}: {e}{hint}", path.display());
            Error::new(kind, message).with_source(e)
        })?;
        Ok(SegmentInfo {
            path,
            first,
            last,
            bytes: (MAGIC.len() + data.len()) as u64,
        })
    }

    /// Reads every record of a segment. A damaged segment is an error, never skipped.
    pub fn read(&self, seg: &SegmentInfo) -> Result<Vec<Record>> {
        if let Some(objects) = &self.objects {
            return match objects.get(seg)? {
                Some(data) => Self::decode(seg, data.to_vec()),
                None => Err(Error::fatal(format!(
                    "WAL segment {} disappeared while it was still needed; was the state prefix changed by hand? Run `skipprd sync --resnapshot`",
                    objects.describe(seg)
                ))),
            };
        }
        let data = std::fs::read(&seg.path)
            .with_context(|| format!("reading WAL segment {}", seg.path.display()))?;
        Self::decode(seg, data)
    }

    /// Like [`WalStore::read`], but a segment removed since it was listed (because Iceberg
    /// now holds its changes) reads as `None`.
    pub fn read_if_present(&self, seg: &SegmentInfo) -> Result<Option<Vec<Record>>> {
        if let Some(objects) = &self.objects {
            return objects
                .get(seg)?
                .map(|data| Self::decode(seg, data.to_vec()))
                .transpose();
        }
        match std::fs::read(&seg.path) {
            Ok(data) => Self::decode(seg, data).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading WAL segment {}", seg.path.display())),
        }
    }

    fn decode(seg: &SegmentInfo, data: Vec<u8>) -> Result<Vec<Record>> {
        if !data.starts_with(MAGIC) {
            return Err(Error::fatal(format!(
                "WAL segment {} is not a Skippr WAL segment (bad header); move it away only if you know its changes are in Iceberg",
                seg.path.display()
            )));
        }
        let body = Bytes::from(data).slice(MAGIC.len()..);
        decode_all(body).map_err(|c| {
            Error::fatal(format!(
                "WAL segment {} is damaged at byte {} ({}); skipprd stops rather than misread it. Restore the file, or run `skipprd sync --resnapshot`",
                seg.path.display(),
                c.offset + MAGIC.len(),
                c.reason
            ))
        })
    }

    /// Deletes segments whose every transaction ends at or before `lsn`.
    pub fn remove_through(&self, lsn: Lsn) -> Result<usize> {
        let mut n = 0;
        for s in self.segments()? {
            if s.last <= lsn {
                if let Some(objects) = &self.objects {
                    objects.remove(&s)?;
                    n += 1;
                    continue;
                }
                std::fs::remove_file(&s.path)
                    .with_context(|| format!("removing WAL segment {}", s.path.display()))?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// Deletes every segment (used by a re-snapshot).
    pub fn clear(&self) -> Result<()> {
        for s in self.segments()? {
            if let Some(objects) = &self.objects {
                objects.remove(&s)?;
                continue;
            }
            std::fs::remove_file(&s.path)
                .with_context(|| format!("removing WAL segment {}", s.path.display()))?;
        }
        if let Some(objects) = &self.objects {
            return objects.remove_marker(ACKNOWLEDGED_FILE);
        }
        let ack = self.dir.join(ACKNOWLEDGED_FILE);
        match std::fs::remove_file(&ack) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(e).with_context(|| format!("removing {}", ack.display()))
            }
            _ => Ok(()),
        }
    }

    /// Records, durably, that the stream is about to acknowledge `lsn` to the source although
    /// no segment ends there (a stretch with no change for the pipeline's tables). With the
    /// segments, this bounds every position the pipeline ever acknowledged: a slot found
    /// beyond it was moved by someone else.
    pub fn note_acknowledged(&self, lsn: Lsn) -> Result<()> {
        if lsn <= self.acknowledged()? {
            return Ok(());
        }
        if let Some(objects) = &self.objects {
            return objects.put_marker(ACKNOWLEDGED_FILE, lsn.to_string().into_bytes().into());
        }
        let path = self.dir.join(ACKNOWLEDGED_FILE);
        let tmp = self.dir.join(format!("{ACKNOWLEDGED_FILE}.tmp"));
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(lsn.to_string().as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            std::fs::File::open(&self.dir)?.sync_all()
        };
        write().map_err(|e| {
            Error::new(
                ErrorKind::Fatal,
                format!("cannot write {}: {e}", path.display()),
            )
        })
    }

    /// The highest position this WAL may have acknowledged to the source: the end of its
    /// newest segment, or a later position noted by [`WalStore::note_acknowledged`].
    pub fn acknowledged(&self) -> Result<Lsn> {
        let path = self.dir.join(ACKNOWLEDGED_FILE);
        let text = match &self.objects {
            Some(objects) => match objects.get_marker(ACKNOWLEDGED_FILE)? {
                Some(b) => Ok(String::from_utf8_lossy(&b).into_owned()),
                None => Err(std::io::Error::from(std::io::ErrorKind::NotFound)),
            },
            None => std::fs::read_to_string(&path),
        };
        let noted = match text {
            Ok(t) => Lsn::parse(t.trim()).map_err(|e| {
                Error::fatal(format!(
                    "{} is damaged ({e}); remove it only after checking the slot with `skipprd discover`",
                    path.display()
                ))
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Lsn::default(),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let last = self.segments()?.last().map(|s| s.last).unwrap_or_default();
        Ok(noted.max(last))
    }
}

/// Collects whole transactions into the next segment, writing each relation description
/// before the first transaction of the segment that uses it.
#[derive(Default)]
pub struct SegmentBuilder {
    buf: BytesMut,
    relations: HashMap<u32, Relation>,
    written: HashSet<u32>,
    first: Option<Lsn>,
    last: Lsn,
    txns: usize,
}

impl SegmentBuilder {
    /// Records the latest description of a relation (from the stream).
    pub fn relation(&mut self, r: Relation) {
        self.written.remove(&r.id);
        self.relations.insert(r.id, r);
    }

    pub fn push(&mut self, txn: &Txn) {
        for c in &txn.changes {
            if !self.written.contains(&c.rel) {
                if let Some(r) = self.relations.get(&c.rel) {
                    encode_relation(r, &mut self.buf);
                }
                self.written.insert(c.rel);
            }
        }
        encode_txn(txn, &mut self.buf);
        self.first.get_or_insert(txn.end_lsn);
        self.last = txn.end_lsn;
        self.txns += 1;
    }

    pub fn len_bytes(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.txns == 0
    }

    /// Writes the segment and starts a new one. Returns the last LSN made durable.
    pub fn flush(&mut self, store: &WalStore) -> Result<Option<Lsn>> {
        let Some(first) = self.first else {
            return Ok(None);
        };
        store.write_segment(first, self.last, &self.buf)?;
        self.buf.clear();
        self.written.clear();
        self.first = None;
        self.txns = 0;
        Ok(Some(self.last))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::change::Datum;
    use crate::change::{Change, Op};

    #[test]
    fn write_read_gc() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("x.seg.tmp"), b"partial").unwrap();
        let store = WalStore::open(dir.path()).unwrap();
        assert!(!dir.path().join("x.seg.tmp").exists());
        let mut b = SegmentBuilder::default();
        b.relation(Relation {
            id: 1,
            namespace: "public".into(),
            name: "t".into(),
            replica_identity: b'd',
            columns: vec![],
        });
        for i in 1..=3u64 {
            b.push(&Txn {
                xid: i as u32,
                commit_lsn: Lsn(i * 10),
                end_lsn: Lsn(i * 10 + 1),
                commit_time_micros: 0,
                changes: vec![Change {
                    op: Op::Insert,
                    rel: 1,
                    old: None,
                    new: Some(vec![Datum::Null]),
                    relation: None,
                }],
            });
        }
        assert_eq!(b.flush(&store).unwrap(), Some(Lsn(31)));
        let segs = store.segments().unwrap();
        assert_eq!(segs.len(), 1);
        let recs = store.read(&segs[0]).unwrap();
        assert_eq!(recs.len(), 4);
        assert!(matches!(recs[0], Record::Relation(_)));
        assert_eq!(store.remove_through(Lsn(30)).unwrap(), 0);
        assert_eq!(store.remove_through(Lsn(31)).unwrap(), 1);
    }
}
