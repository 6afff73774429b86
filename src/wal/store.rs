//! WAL segments on the local file system: atomic, fsynced segment files named by the LSN
//! range they cover, read back in order, and removed once Iceberg holds their changes.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};

use bytes::{Bytes, BytesMut};

use super::codec::{decode_all, encode_relation, encode_txn, Record, MAGIC};
use crate::change::Lsn;
use crate::change::Relation;
use crate::change::Txn;
use crate::error::{Context, Error, ErrorKind, Result};

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
}

fn parse_name(name: &str) -> Option<(Lsn, Lsn)> {
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
        })
    }

    /// Opens an existing WAL for reading only: nothing is created or cleaned up, so a reader
    /// never disturbs the process that writes it. `None` when the folder does not exist.
    pub fn reader(dir: &Path) -> Option<Self> {
        dir.is_dir().then(|| Self {
            dir: dir.to_path_buf(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Complete segments, oldest first.
    pub fn segments(&self) -> Result<Vec<SegmentInfo>> {
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
            let hint = if e.raw_os_error() == Some(28) {
                "; the disk is full: free space or move skipprd_el_storage_path, then restart (nothing was acknowledged, nothing is lost)"
            } else {
                ""
            };
            Error::new(
                ErrorKind::Fatal,
                format!("cannot write WAL segment {}: {e}{hint}", path.display()),
            )
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
        let data = std::fs::read(&seg.path)
            .with_context(|| format!("reading WAL segment {}", seg.path.display()))?;
        Self::decode(seg, data)
    }

    /// Like [`WalStore::read`], but a segment removed since it was listed (because Iceberg
    /// now holds its changes) reads as `None`.
    pub fn read_if_present(&self, seg: &SegmentInfo) -> Result<Option<Vec<Record>>> {
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
            std::fs::remove_file(&s.path)
                .with_context(|| format!("removing WAL segment {}", s.path.display()))?;
        }
        Ok(())
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
