//! Reading a WAL segment for the sinks, one item at a time: a relation description, the start
//! of a transaction, one change, the end of a transaction. Small records are decoded whole; a
//! record larger than `WHOLE_RECORD_MAX` (a transaction that spilled while it streamed) has
//! its checksum verified in one streaming pass and is then decoded change by change, so a
//! transaction of any size is applied in bounded memory.

use std::collections::VecDeque;
use std::io::{Read, Seek, SeekFrom};

use bytes::{Bytes, BytesMut};

use super::codec::{
    decode_body, read_change, read_txn_prefix, Described, Reader, Record, ENDS_EARLY, FRAME_HEADER,
    MAGIC,
};
use crate::change::{Change, Datum, Relation, Txn};
use crate::error::{Error, Result};

/// Records up to this size are read and decoded whole.
pub const WHOLE_RECORD_MAX: u64 = 4 * 1024 * 1024;
/// How much of a large record is read at a time.
const CHUNK: usize = 1024 * 1024;

/// One step of a segment, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    /// A description that changes after it are read with (outside any transaction).
    Relation(Relation),
    /// A transaction starts; its `changes` are empty (they follow as [`Item::Change`]).
    Begin(Txn),
    Change(Change),
    /// The transaction last begun is complete.
    End,
}

/// The items of decoded records (for logs held in memory, and for tests).
pub fn items_of(records: Vec<Record>) -> impl Iterator<Item = Item> + Send {
    records.into_iter().flat_map(|r| -> Vec<Item> {
        match r {
            Record::Relation(r) => vec![Item::Relation(r)],
            Record::Txn(mut t) => {
                let changes = std::mem::take(&mut t.changes);
                let mut out = Vec::with_capacity(changes.len() + 2);
                out.push(Item::Begin(t));
                out.extend(changes.into_iter().map(Item::Change));
                out.push(Item::End);
                out
            }
        }
    })
}

/// A large transaction record being decoded piece by piece.
struct Large {
    xid: u32,
    /// Read but not yet decoded.
    window: Bytes,
    /// Bytes of the record not yet read into `window`.
    left: u64,
    changes_left: usize,
    offset: u64,
}

/// The items of one segment, read from `src` (positioned at the segment's start).
pub struct SegmentItems<R> {
    src: R,
    /// Names the segment in errors.
    name: String,
    /// Offset of the next frame in the segment.
    offset: u64,
    described: Described,
    queue: VecDeque<Item>,
    large: Option<Large>,
    failed: bool,
}

impl<R: Read + Seek> SegmentItems<R> {
    /// Checks the segment's header; the items follow.
    pub fn new(mut src: R, name: String, dir: &str) -> Result<Self> {
        let mut header = [0u8; MAGIC.len()];
        let got = read_full(&mut src, &mut header)
            .map_err(|e| Error::retryable(format!("reading WAL segment {name}: {e}")))?;
        super::segment::check_header(&header[..got], &name, dir)?;
        Ok(Self {
            src,
            name,
            offset: MAGIC.len() as u64,
            described: Described::default(),
            queue: VecDeque::new(),
            large: None,
            failed: false,
        })
    }

    fn damaged(&self, offset: u64, reason: &str) -> Error {
        Error::fatal(format!(
            "WAL segment {} is damaged at byte {offset} ({reason}); skipprd stops rather than misread it. Restore the file, or run `skipprd sync --resnapshot`",
            self.name
        ))
    }

    fn io(&self, e: std::io::Error) -> Error {
        Error::new(
            crate::error::io_kind(&e),
            format!("reading WAL segment {}: {e}", self.name),
        )
        .with_source(e)
    }

    fn step(&mut self) -> Result<Option<Item>> {
        if let Some(item) = self.queue.pop_front() {
            return Ok(Some(item));
        }
        if self.large.is_some() {
            return self.large_step().map(Some);
        }
        let start = self.offset;
        let mut header = [0u8; FRAME_HEADER];
        match read_full(&mut self.src, &mut header).map_err(|e| self.io(e))? {
            0 => return Ok(None),
            FRAME_HEADER => {}
            _ => return Err(self.damaged(start, "torn record header")),
        }
        let len = u64::from_be_bytes(header[..8].try_into().unwrap_or_default());
        let crc = u32::from_be_bytes(header[8..].try_into().unwrap_or_default());
        self.offset += FRAME_HEADER as u64;
        if len > WHOLE_RECORD_MAX {
            return self.large_begin(start, len, crc).map(Some);
        }
        // At most WHOLE_RECORD_MAX: fits in usize.
        let mut body = vec![0u8; len as usize];
        if read_full(&mut self.src, &mut body).map_err(|e| self.io(e))? != body.len() {
            return Err(self.damaged(start, "torn record body"));
        }
        self.offset += len;
        if crc32fast::hash(&body) != crc {
            return Err(self.damaged(start, "checksum mismatch"));
        }
        match decode_body(Bytes::from(body)).map_err(|e| self.damaged(start, &e))? {
            Record::Relation(r) => {
                self.described.relation(&r);
                Ok(Some(Item::Relation(r)))
            }
            Record::Txn(mut t) => {
                let changes = std::mem::take(&mut t.changes);
                for c in &changes {
                    self.described
                        .change(t.xid, c)
                        .map_err(|e| self.damaged(start, &e))?;
                }
                self.queue.extend(changes.into_iter().map(Item::Change));
                self.queue.push_back(Item::End);
                Ok(Some(Item::Begin(t)))
            }
        }
    }

    /// Verifies a large record's checksum in one pass, then starts decoding it.
    fn large_begin(&mut self, start: u64, len: u64, crc: u32) -> Result<Item> {
        let body_at = self.src.stream_position().map_err(|e| self.io(e))?;
        let mut hasher = crc32fast::Hasher::new();
        let mut buf = vec![0u8; CHUNK];
        let mut left = len;
        while left > 0 {
            let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
            let got = read_full(&mut self.src, &mut buf[..want]).map_err(|e| self.io(e))?;
            if got == 0 {
                return Err(self.damaged(start, "torn record body"));
            }
            hasher.update(&buf[..got]);
            left -= got as u64;
        }
        if hasher.finalize() != crc {
            return Err(self.damaged(start, "checksum mismatch"));
        }
        self.src
            .seek(SeekFrom::Start(body_at))
            .map_err(|e| self.io(e))?;
        let mut large = Large {
            xid: 0,
            window: Bytes::new(),
            left: len,
            changes_left: 0,
            offset: start,
        };
        // The kind byte and the transaction's fixed part come first.
        let (txn, n) = loop {
            let mut r = Reader {
                buf: large.window.clone(),
                more: large.left,
            };
            let parsed = match r.u8() {
                Ok(b'X') => read_txn_prefix(&mut r),
                Ok(k) => {
                    return Err(self.damaged(
                        start,
                        &format!("a record of kind {k:#x} larger than {WHOLE_RECORD_MAX} bytes"),
                    ))
                }
                Err(e) => Err(e),
            };
            match parsed {
                Ok(v) => {
                    large.window = r.buf;
                    break v;
                }
                Err(e) if e == ENDS_EARLY && large.left > 0 => self.refill(&mut large)?,
                Err(e) => return Err(self.damaged(start, &e)),
            }
        };
        self.offset += len;
        large.xid = txn.xid;
        large.changes_left = n;
        self.large = Some(large);
        Ok(Item::Begin(txn))
    }

    /// The next change of the large record, or its end.
    fn large_step(&mut self) -> Result<Item> {
        let Some(mut large) = self.large.take() else {
            return Err(Error::fatal("no large WAL record is being read"));
        };
        if large.changes_left == 0 {
            if !large.window.is_empty() || large.left > 0 {
                return Err(self.damaged(large.offset, "record has trailing bytes"));
            }
            return Ok(Item::End);
        }
        let change = loop {
            let mut r = Reader {
                buf: large.window.clone(),
                more: large.left,
            };
            match read_change(&mut r) {
                Ok(c) => {
                    large.window = r.buf;
                    break c;
                }
                Err(e) if e == ENDS_EARLY && large.left > 0 => self.refill(&mut large)?,
                Err(e) => return Err(self.damaged(large.offset, &e)),
            }
        };
        // Values are copied out of the window, so that a change kept for the next commit
        // does not pin a whole chunk of the record in memory.
        let change = owned(change);
        self.described
            .change(large.xid, &change)
            .map_err(|e| self.damaged(large.offset, &e))?;
        large.changes_left -= 1;
        self.large = Some(large);
        Ok(Item::Change(change))
    }

    /// Reads more of the large record into its window (at least doubling it, so that a
    /// change of any size is eventually whole in it).
    fn refill(&mut self, large: &mut Large) -> Result<()> {
        let want = CHUNK.max(large.window.len());
        let want = want.min(usize::try_from(large.left).unwrap_or(usize::MAX));
        let mut buf = BytesMut::with_capacity(large.window.len() + want);
        buf.extend_from_slice(&large.window);
        let at = buf.len();
        buf.resize(at + want, 0);
        let got = read_full(&mut self.src, &mut buf[at..]).map_err(|e| self.io(e))?;
        if got != want {
            return Err(self.damaged(large.offset, "torn record body"));
        }
        large.left -= want as u64;
        large.window = buf.freeze();
        Ok(())
    }
}

impl<R: Read + Seek> Iterator for SegmentItems<R> {
    type Item = Result<Item>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        match self.step() {
            Ok(item) => item.map(Ok),
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}

/// A change whose values own their bytes.
fn owned(mut c: Change) -> Change {
    for tuple in [&mut c.old, &mut c.new].into_iter().flatten() {
        for d in tuple.iter_mut() {
            if let Datum::Text(b) = d {
                *b = Bytes::copy_from_slice(b);
            }
        }
    }
    c
}

/// Reads until `buf` is full or the source ends; returns how many bytes were read.
fn read_full(src: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match src.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::change::{Op, RelColumn};
    use crate::wal::codec::encode;
    use std::io::Cursor;

    fn relation(width: usize) -> Relation {
        Relation {
            id: 3,
            namespace: "public".into(),
            name: "t".into(),
            replica_identity: b'd',
            columns: (0..width)
                .map(|i| RelColumn::plain(i == 0, &format!("c{i}"), 25, -1, "text"))
                .collect(),
        }
    }

    fn insert(i: usize, value_len: usize) -> Change {
        Change {
            op: Op::Insert,
            rel: 3,
            old: None,
            new: Some(vec![
                Datum::Text(Bytes::from(i.to_string())),
                Datum::Text(Bytes::from(vec![b'a' + (i % 26) as u8; value_len])),
            ]),
            relation: None,
        }
    }

    fn segment(records: &[Record]) -> Vec<u8> {
        let mut b = BytesMut::new();
        b.extend_from_slice(MAGIC);
        for r in records {
            encode(r, &mut b);
        }
        b.to_vec()
    }

    fn read(data: Vec<u8>) -> Result<Vec<Item>> {
        SegmentItems::new(Cursor::new(data), "test".into(), ".")?.collect()
    }

    fn sample() -> Vec<Record> {
        // A small transaction, a large one (several chunks, one value larger than a chunk),
        // then a small one again.
        let mut big: Vec<Change> = (0..3000).map(|i| insert(i, 3000)).collect();
        big.push(insert(5000, 3 * CHUNK));
        big.push(Change {
            op: Op::Relation,
            rel: 3,
            old: None,
            new: None,
            relation: Some(relation(2)),
        });
        big.push(insert(5001, 10));
        vec![
            Record::Relation(relation(2)),
            Record::Txn(Txn::ending_at(10, vec![insert(1, 10)])),
            Record::Txn(Txn::ending_at(20, big)),
            Record::Txn(Txn::ending_at(30, vec![insert(2, 10), insert(3, 10)])),
        ]
    }

    #[test]
    fn large_and_small_records_read_as_the_same_items() {
        let records = sample();
        let data = segment(&records);
        assert!(data.len() as u64 > 2 * WHOLE_RECORD_MAX);
        let items = read(data).unwrap();
        assert_eq!(items, items_of(records).collect::<Vec<_>>());
    }

    #[test]
    fn a_damaged_large_record_is_an_error_before_any_of_its_changes() {
        let mut data = segment(&sample());
        let n = data.len();
        data[n / 2] ^= 0x40;
        let mut items = SegmentItems::new(Cursor::new(data), "test".into(), ".").unwrap();
        let mut seen = Vec::new();
        let err = loop {
            match items.next() {
                Some(Ok(i)) => seen.push(i),
                Some(Err(e)) => break e,
                None => panic!("a damaged segment read to its end"),
            }
        };
        assert!(err.to_string().contains("checksum mismatch"), "{err}");
        // Only the first (small) transaction came out: the large one was refused whole.
        assert_eq!(seen.len(), 4);
        assert!(items.next().is_none());
    }

    #[test]
    fn a_torn_large_record_is_an_error() {
        let mut data = segment(&sample());
        data.truncate(data.len() - 100 - WHOLE_RECORD_MAX as usize);
        let err = read(data).unwrap_err();
        assert!(err.to_string().contains("torn record body"), "{err}");
    }

    #[test]
    fn a_large_change_wider_than_its_description_is_refused() {
        let mut wide = insert(7, 10);
        if let Some(t) = wide.new.as_mut() {
            t.push(Datum::Null);
        }
        let mut changes: Vec<Change> = (0..2000).map(|i| insert(i, 3000)).collect();
        changes.push(wide);
        let data = segment(&[
            Record::Relation(relation(2)),
            Record::Txn(Txn::ending_at(10, changes)),
        ]);
        let err = read(data).unwrap_err();
        assert!(err.to_string().contains("damaged"), "{err}");
    }
}
