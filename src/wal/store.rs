//! WAL segments on the local file system: atomic, fsynced segment files named by the LSN
//! range they cover, read back in order, and removed once Iceberg holds their changes.

use std::collections::{HashMap, HashSet};
use std::io::{Seek, Write};
use std::path::{Path, PathBuf};

use bytes::BytesMut;

use super::codec::{encode_relation, encode_txn, frame_header, txn_prefix, Record, MAGIC};
use super::history::WalHistory;
use super::items::{Item, SegmentItems, WHOLE_RECORD_MAX};
use super::objects::ObjectWal;
pub use super::segment::SegmentInfo;
use super::segment::{decode, parse_name, read_file_if_present, segment_name, self_dir};
use super::spill::{Finished, SpillFile, Uses, SPILL_DIR};
use crate::change::{Lsn, Relation, Txn};
use crate::error::{Context, Error, ErrorKind, Result};
use crate::storage::Store;

/// File in the WAL folder holding the newest position acknowledged without a segment.
const ACKNOWLEDGED_FILE: &str = "acknowledged";

/// The WAL of one pipeline.
#[derive(Debug, Clone)]
pub struct WalStore {
    dir: PathBuf,
    /// Set when the WAL lives in object storage (S3 mode); `dir` is then its key prefix.
    objects: Option<ObjectWal>,
    /// Where committed segments go instead of being deleted (the writer's, for time travel).
    history: Option<std::sync::Arc<WalHistory>>,
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
        // Spill files belong to transactions that were never acknowledged: Postgres sends
        // them again.
        let spill = dir.join(SPILL_DIR);
        if spill.is_dir() {
            std::fs::remove_dir_all(&spill)
                .with_context(|| format!("removing stale spill files in {}", spill.display()))?;
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            objects: None,
            history: None,
        })
    }

    /// The WAL under `prefix` in an object store (S3 mode). Opening reads and writes
    /// nothing: a segment PUT is atomic, so no partial segment can be left behind.
    pub fn on_objects(store: Store, prefix: &str) -> Self {
        Self {
            dir: PathBuf::from(prefix.trim_matches('/')),
            objects: Some(ObjectWal::new(store, prefix)),
            history: None,
        }
    }

    /// Committed segments are moved into `history` (and expire there) instead of being
    /// deleted (see [`WalStore::remove_through`]).
    pub fn keeping_history(mut self, history: WalHistory) -> Self {
        self.history = Some(std::sync::Arc::new(history));
        self
    }

    /// Marks an object WAL as `pipeline`'s, opened by its writer or by a reader (see
    /// `view.rs`); a local WAL is unchanged.
    pub fn with_role(mut self, pipeline: &str, writer: bool) -> Self {
        self.objects = self.objects.map(|o| o.with_role(pipeline, writer));
        self
    }

    /// Where transactions larger than the memory budget are spilled while they stream: beside
    /// the segments, or, when the WAL is in an object store, in the local temp folder.
    pub fn spill_dir(&self) -> PathBuf {
        if self.objects.is_some() {
            return std::env::temp_dir()
                .join("skippr-spill")
                .join(self.dir.to_string_lossy().replace('/', "_"));
        }
        self.dir.join(SPILL_DIR)
    }

    /// Opens an existing WAL for reading only: nothing is created or cleaned up, so a reader
    /// never disturbs the process that writes it. `None` when the folder does not exist.
    pub fn reader(dir: &Path) -> Option<Self> {
        dir.is_dir().then(|| Self {
            dir: dir.to_path_buf(),
            objects: None,
            history: None,
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
        self.write_segment_with(first, last, |f| f.write_all(data))
    }

    /// Writes a complete segment whose records `body` writes after the header: to a
    /// temporary name, fsynced, renamed, and the folder fsynced.
    fn write_segment_with(
        &self,
        first: Lsn,
        last: Lsn,
        body: impl FnOnce(&mut std::fs::File) -> std::io::Result<()>,
    ) -> Result<SegmentInfo> {
        if let Some(objects) = &self.objects {
            // The records are assembled in a local scratch file first, then sent from there
            // (in parts when large): a spilled transaction is never held in memory whole.
            let scratch_dir = self.spill_dir();
            let scratch = scratch_dir.join(format!("upload-{:016X}.tmp", last.0));
            let assemble = || -> std::io::Result<()> {
                std::fs::create_dir_all(&scratch_dir)?;
                let mut f = std::fs::File::create(&scratch)?;
                f.write_all(MAGIC)?;
                body(&mut f)
            };
            let written = assemble()
                .with_context(|| format!("assembling WAL segment in {}", scratch_dir.display()))
                .and_then(|()| objects.write_segment_file(first, last, &scratch));
            let _ = std::fs::remove_file(&scratch);
            return written;
        }
        let name = segment_name(first, last);
        let path = self.dir.join(&name);
        let tmp = self.dir.join(format!("{name}.tmp"));
        let write = || -> std::io::Result<u64> {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(MAGIC)?;
            body(&mut f)?;
            f.sync_all()?;
            let bytes = f.metadata()?.len();
            std::fs::rename(&tmp, &path)?;
            std::fs::File::open(&self.dir)?.sync_all()?;
            Ok(bytes)
        };
        let bytes = write().map_err(|e| {
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
            bytes,
        })
    }

    /// Reads every record of a segment. A damaged segment is an error, never skipped.
    pub fn read(&self, seg: &SegmentInfo) -> Result<Vec<Record>> {
        if let Some(objects) = &self.objects {
            return match objects.get(seg)? {
                Some(data) => decode(seg, data.to_vec()),
                None => Err(Error::fatal(format!(
                    "WAL segment {} disappeared while it was still needed; was the state prefix changed by hand? Run `skipprd sync --resnapshot`",
                    objects.describe(seg)
                ))),
            };
        }
        let data = std::fs::read(&seg.path)
            .with_context(|| format!("reading WAL segment {}", seg.path.display()))?;
        decode(seg, data)
    }

    /// The items of a segment, one change at a time (see `items`): a transaction of any
    /// size is applied in bounded memory. A damaged segment is an error, never skipped.
    pub fn items(
        &self,
        seg: &SegmentInfo,
    ) -> Result<Box<dyn Iterator<Item = Result<Item>> + Send>> {
        let dir = self_dir(seg).display().to_string();
        if let Some(objects) = &self.objects {
            let name = objects.describe(seg);
            let gone = || {
                Error::fatal(format!(
                    "WAL segment {name} disappeared while it was still needed; was the state prefix changed by hand? Run `skipprd sync --resnapshot`"
                ))
            };
            // Up to this size a segment is fetched in one GET and read from memory.
            const FETCH_WHOLE_MAX: u64 = 2 * WHOLE_RECORD_MAX;
            if seg.bytes <= FETCH_WHOLE_MAX {
                let data = objects.get(seg)?.ok_or_else(gone)?;
                return Ok(Box::new(SegmentItems::new(
                    std::io::Cursor::new(data),
                    name.clone(),
                    &dir,
                )?));
            }
            // A large segment is copied to a local scratch file (removed as soon as it is
            // open) and read from there.
            let scratch_dir = self.spill_dir();
            let scratch = scratch_dir.join(format!("read-{:016X}.tmp", seg.last.0));
            let open = || -> Result<Option<std::fs::File>> {
                std::fs::create_dir_all(&scratch_dir)
                    .with_context(|| format!("creating {}", scratch_dir.display()))?;
                let mut f = std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(true)
                    .read(true)
                    .write(true)
                    .open(&scratch)
                    .with_context(|| format!("creating {}", scratch.display()))?;
                let present = {
                    let mut w = std::io::BufWriter::new(&mut f);
                    let present = objects.download(seg, &mut w)?;
                    w.flush()
                        .with_context(|| format!("writing {}", scratch.display()))?;
                    present
                };
                f.seek(std::io::SeekFrom::Start(0))
                    .with_context(|| format!("reading {}", scratch.display()))?;
                Ok(present.then_some(f))
            };
            let f = open();
            let _ = std::fs::remove_file(&scratch);
            let f = f?.ok_or_else(gone)?;
            return Ok(Box::new(SegmentItems::new(
                std::io::BufReader::with_capacity(256 * 1024, f),
                name,
                &dir,
            )?));
        }
        let f = std::fs::File::open(&seg.path)
            .with_context(|| format!("reading WAL segment {}", seg.path.display()))?;
        Ok(Box::new(SegmentItems::new(
            std::io::BufReader::with_capacity(256 * 1024, f),
            seg.path.display().to_string(),
            &dir,
        )?))
    }

    /// Like [`WalStore::read`], but a segment removed since it was listed (because Iceberg
    /// now holds its changes) reads as `None`.
    pub fn read_if_present(&self, seg: &SegmentInfo) -> Result<Option<Vec<Record>>> {
        if let Some(objects) = &self.objects {
            return objects
                .get(seg)?
                .map(|data| decode(seg, data.to_vec()))
                .transpose();
        }
        read_file_if_present(seg)
    }

    /// Removes from the WAL the segments whose every transaction ends at or before `lsn`:
    /// into the history when the WAL keeps one (which then drops what is past its
    /// retention), deleted otherwise.
    pub fn remove_through(&self, lsn: Lsn) -> Result<usize> {
        let done: Vec<SegmentInfo> = self
            .segments()?
            .into_iter()
            .filter(|s| s.last <= lsn)
            .collect();
        match &self.history {
            Some(h) => h.keep(&done, |s| self.remove_segment(s))?,
            None => {
                for s in &done {
                    self.remove_segment(s)?;
                }
            }
        }
        let n = done.len();
        if let Some(h) = &self.history {
            let expired = h.expire()?;
            if expired > 0 {
                tracing::debug!(
                    segments = expired,
                    "WAL history segments past snapshot_retention removed"
                );
            }
        }
        Ok(n)
    }

    /// Deletes one segment.
    pub(super) fn remove_segment(&self, s: &SegmentInfo) -> Result<()> {
        if let Some(objects) = &self.objects {
            return objects.remove(s);
        }
        std::fs::remove_file(&s.path)
            .with_context(|| format!("removing WAL segment {}", s.path.display()))
    }

    /// Deletes every segment, and the history (used by a re-snapshot).
    pub fn clear(&self) -> Result<()> {
        for s in self.segments()? {
            self.remove_segment(&s)?;
        }
        if let Some(h) = &self.history {
            h.clear()?;
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
            // Nothing is acknowledged before the note is durable: a full disk is waited out
            // like a segment that cannot be written.
            let _ = std::fs::remove_file(&tmp);
            let (kind, hint) = if crate::error::is_storage_full_io(&e) {
                (
                    ErrorKind::Retryable,
                    "; storage full: free space under skipprd_el_storage_path and ingest resumes by itself (nothing was acknowledged, nothing is lost)",
                )
            } else {
                (ErrorKind::Fatal, "")
            };
            Error::new(kind, format!("cannot write {}: {e}{hint}", path.display())).with_source(e)
        })
    }

    /// The highest position this WAL may have acknowledged to the source: the end of its
    /// newest segment, or a later position noted by [`WalStore::note_acknowledged`].
    pub fn acknowledged(&self) -> Result<Lsn> {
        let noted = self.noted_acknowledged()?;
        let last = self.segments()?.last().map(|s| s.last).unwrap_or_default();
        Ok(noted.max(last))
    }

    /// The position noted by [`WalStore::note_acknowledged`] alone (zero when none): every
    /// source transaction of the pipeline's tables ending at or before it is in a segment
    /// written before the note (or already committed to Iceberg).
    pub fn noted_acknowledged(&self) -> Result<Lsn> {
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
        Ok(noted)
    }
}

/// Collects whole transactions into the next segment. Each segment is self-contained: before
/// a transaction, it holds the description in effect of every relation the transaction
/// changes before describing it anew (the inline descriptions follow in the transaction, in
/// order with its changes).
#[derive(Default)]
pub struct SegmentBuilder {
    buf: BytesMut,
    /// Descriptions in effect after the last transaction pushed.
    relations: HashMap<u32, Relation>,
    written: HashSet<u32>,
    /// A transaction too large for memory, last in the segment: its changes are copied from
    /// its spill file when the segment is written.
    spilled: Option<(BytesMut, SpillFile)>,
    first: Option<Lsn>,
    last: Lsn,
    txns: usize,
}

impl SegmentBuilder {
    /// Records the description of a relation that arrived outside any transaction.
    pub fn relation(&mut self, r: Relation) {
        self.written.remove(&r.id);
        self.relations.insert(r.id, r);
    }

    /// Writes the descriptions a transaction is read with, ahead of it.
    fn prelude(&mut self, uses: &Uses) {
        for rel in &uses.needs {
            if self.written.insert(*rel) {
                if let Some(r) = self.relations.get(rel) {
                    encode_relation(r, &mut self.buf);
                }
            }
        }
    }

    /// After a transaction: its inline descriptions are in the segment and in effect.
    fn after(&mut self, txn: &Txn, uses: Uses) {
        for r in uses.inline {
            self.written.insert(r.id);
            self.relations.insert(r.id, r);
        }
        self.first.get_or_insert(txn.end_lsn);
        self.last = txn.end_lsn;
        self.txns += 1;
    }

    /// Adds a transaction held in memory. A segment that already ends with a spilled
    /// transaction must be flushed first (see [`SegmentBuilder::must_flush`]).
    pub fn push(&mut self, txn: &Txn) {
        let uses = Uses::of(txn);
        self.prelude(&uses);
        encode_txn(txn, &mut self.buf);
        self.after(txn, uses);
    }

    /// Adds a finished transaction, whether held in memory or spilled.
    pub fn push_finished(&mut self, finished: Finished) {
        match finished {
            Finished::Memory(txn, _) => self.push(&txn),
            Finished::Spilled(txn, spill, uses) => {
                self.prelude(&uses);
                let prefix = txn_prefix(&txn, spill.changes());
                self.after(&txn, uses);
                self.spilled = Some((prefix, spill));
            }
        }
    }

    /// Whether the segment must be written before another transaction is added: a spilled
    /// transaction is always the last of its segment.
    pub fn must_flush(&self) -> bool {
        self.spilled.is_some()
    }

    pub fn len_bytes(&self) -> usize {
        let spilled = self.spilled.as_ref().map_or(0, |(p, s)| {
            p.len()
                .saturating_add(usize::try_from(s.bytes()).unwrap_or(usize::MAX))
        });
        self.buf.len().saturating_add(spilled)
    }

    pub fn is_empty(&self) -> bool {
        self.txns == 0
    }

    /// Writes the segment and starts a new one. Returns the last LSN made durable.
    pub fn flush(&mut self, store: &WalStore) -> Result<Option<Lsn>> {
        let Some(first) = self.first else {
            return Ok(None);
        };
        let spilled = self.spilled.take();
        let buf = &self.buf;
        store.write_segment_with(first, self.last, |f| {
            f.write_all(buf)?;
            if let Some((prefix, spill)) = &spilled {
                // The record's body is the prefix and the spill file, copied without
                // holding it in memory; its checksum is combined from the two parts.
                let mut crc = crc32fast::Hasher::new();
                crc.update(prefix);
                crc.combine(spill.crc());
                let len = prefix.len() as u64 + spill.bytes();
                f.write_all(&frame_header(len, crc.finalize()))?;
                f.write_all(prefix)?;
                let mut src = std::fs::File::open(spill.path())?;
                let copied = std::io::copy(&mut src, f)?;
                if copied != spill.bytes() {
                    return Err(std::io::Error::other(format!(
                        "spill file {} holds {copied} bytes, {} expected",
                        spill.path().display(),
                        spill.bytes()
                    )));
                }
            }
            Ok(())
        })?;
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

    fn rel(columns: usize) -> Relation {
        Relation {
            id: 1,
            namespace: "public".into(),
            name: "t".into(),
            replica_identity: b'd',
            columns: (0..columns)
                .map(|i| crate::change::RelColumn::plain(i == 0, &format!("c{i}"), 25, -1, "text"))
                .collect(),
        }
    }

    fn change(op: Op, width: usize, relation: Option<Relation>) -> Change {
        Change {
            op,
            rel: 1,
            old: None,
            new: (op != Op::Relation).then(|| vec![Datum::Null; width]),
            relation,
        }
    }

    fn txn(i: u64, changes: Vec<Change>) -> Txn {
        Txn {
            xid: i as u32,
            commit_lsn: Lsn(i * 10),
            end_lsn: Lsn(i * 10 + 1),
            commit_time_micros: 0,
            changes,
        }
    }

    /// A new WAL in a temporary folder, and a segment builder holding its first transaction,
    /// which describes the table with one column and inserts a row.
    fn described() -> (tempfile::TempDir, WalStore, SegmentBuilder) {
        let dir = tempfile::tempdir().unwrap();
        let store = WalStore::open(dir.path()).unwrap();
        let mut b = SegmentBuilder::default();
        b.push(&txn(
            1,
            vec![
                change(Op::Relation, 0, Some(rel(1))),
                change(Op::Insert, 1, None),
            ],
        ));
        (dir, store, b)
    }

    #[test]
    fn a_transaction_that_alters_its_table_is_read_with_each_description_in_turn() {
        // Session: the table is described with one column in a first transaction.
        let (_dir, store, mut b) = described();
        b.flush(&store).unwrap();
        // Next segment: update (one column), ADD COLUMN, update (two columns).
        b.push(&txn(
            2,
            vec![
                change(Op::Update, 1, None),
                change(Op::Relation, 0, Some(rel(2))),
                change(Op::Update, 2, None),
            ],
        ));
        // And a later transaction in the same segment uses the newest description.
        b.push(&txn(3, vec![change(Op::Insert, 2, None)]));
        b.flush(&store).unwrap();
        let segs = store.segments().unwrap();
        let recs = store.read(&segs[1]).unwrap();
        assert!(
            matches!(&recs[0], Record::Relation(r) if r.columns.len() == 1),
            "the description in effect before the transaction leads the segment"
        );
        assert_eq!(recs.len(), 3);
        // A third segment starts with the description the second one ended with.
        b.push(&txn(4, vec![change(Op::Insert, 2, None)]));
        b.flush(&store).unwrap();
        let recs = store.read(&store.segments().unwrap()[2]).unwrap();
        assert!(matches!(&recs[0], Record::Relation(r) if r.columns.len() == 2));
    }

    #[test]
    fn a_spilled_transaction_is_copied_into_its_segment_and_reads_back_whole() {
        use crate::wal::spill::TxnBuffer;
        let (_dir, store, mut b) = described();
        let mut buffer = TxnBuffer::begin(txn(2, vec![]), 4096, &store.spill_dir());
        let big = Datum::Text(bytes::Bytes::from(vec![b'v'; 1000]));
        for _ in 0..50 {
            let mut c = change(Op::Insert, 1, None);
            c.new = Some(vec![big.clone()]);
            buffer.push(c).unwrap();
        }
        buffer.push(change(Op::Relation, 0, Some(rel(2)))).unwrap();
        buffer.push(change(Op::Insert, 2, None)).unwrap();
        let finished = buffer.finish(Lsn(20), Lsn(21)).unwrap();
        assert!(matches!(finished, Finished::Spilled(..)));
        b.push_finished(finished);
        assert!(b.must_flush());
        assert_eq!(b.flush(&store).unwrap(), Some(Lsn(21)));
        assert!(!b.must_flush());
        assert_eq!(
            std::fs::read_dir(store.spill_dir()).unwrap().count(),
            0,
            "the spill file is gone once its segment is written"
        );
        let recs = store.read(&store.segments().unwrap()[0]).unwrap();
        // The first transaction describes the table inline: no record leads the segment.
        assert_eq!(recs.len(), 2);
        let Record::Txn(t) = &recs[1] else {
            panic!("not a transaction: {:?}", recs[1])
        };
        assert_eq!(t.changes.len(), 52);
        assert_eq!(t.end_lsn, Lsn(21));
        assert_eq!(t.changes[49].new.as_deref(), Some(&[big][..]));
        assert_eq!(t.changes[51].new.as_ref().map(Vec::len), Some(2));
    }

    #[test]
    fn segments_of_an_older_format_are_refused_with_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("0000000000000001-0000000000000002.seg"),
            b"SKWAL001\0\0\0\0",
        )
        .unwrap();
        let store = WalStore::open(dir.path()).unwrap();
        let seg = &store.segments().unwrap()[0];
        let msg = store.read(seg).unwrap_err().to_string();
        assert!(msg.contains("format 001"), "{msg}");
        assert!(msg.contains("--resnapshot"), "{msg}");
        assert!(msg.contains("earlier version"), "{msg}");
    }

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
            columns: vec![crate::change::RelColumn::plain(true, "id", 23, -1, "int4")],
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
