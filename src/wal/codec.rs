//! The WAL's record format: transactions of changes, and the relation descriptions they are
//! read with, in a compact binary encoding framed by length and CRC32.
//!
//! Format 2 (`SKWAL002`) is self-describing: a relation carries what the source's catalog
//! said about each column (storage type, type name, attnum, default, nullability) when the
//! relation message arrived, so replay and live queries never ask the source about the past.
//! Lengths and counts are unsigned LEB128 varints and a record's length is 64 bits: records
//! of any size round-trip. Each segment is self-contained: every change is preceded, in the
//! same segment, by the description of its relation in effect when Postgres wrote it, and a
//! change whose width differs from that description is refused when the segment is read.

use std::collections::HashMap;

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::change::{Change, Datum, Lsn, Op, RelColumn, Relation, Txn, TypeInfo};

/// File header of a segment: the format version is its last three digits.
pub const MAGIC: &[u8; 8] = b"SKWAL002";
/// What every version's header starts with.
pub const MAGIC_PREFIX: &[u8; 5] = b"SKWAL";
/// Bytes before a record's body: its length (u64) and CRC32 (u32), big-endian.
pub const FRAME_HEADER: usize = 12;

/// A WAL record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    Relation(Relation),
    Txn(Txn),
}

/// Appends `v` as an unsigned LEB128 varint.
pub fn put_varint(b: &mut BytesMut, mut v: u64) {
    while v >= 0x80 {
        b.put_u8((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    b.put_u8(v as u8);
}

fn put_len(b: &mut BytesMut, n: usize) {
    // usize is at most 64 bits on every supported target: this widening never truncates.
    put_varint(b, n as u64);
}

fn put_str(b: &mut BytesMut, s: &str) {
    put_len(b, s.len());
    b.put_slice(s.as_bytes());
}

fn put_tuple(b: &mut BytesMut, t: &Option<Vec<Datum>>) {
    match t {
        None => b.put_u8(0),
        Some(cols) => {
            b.put_u8(1);
            put_len(b, cols.len());
            for d in cols {
                match d {
                    Datum::Null => b.put_u8(b'n'),
                    Datum::Unchanged => b.put_u8(b'u'),
                    Datum::Text(v) => {
                        b.put_u8(b't');
                        put_len(b, v.len());
                        b.put_slice(v);
                    }
                }
            }
        }
    }
}

/// Encodes a tri-state flag: 0 unknown, 1 false, 2 true.
fn put_opt_bool(b: &mut BytesMut, v: Option<bool>) {
    b.put_u8(match v {
        None => 0,
        Some(false) => 1,
        Some(true) => 2,
    });
}

fn put_type(b: &mut BytesMut, t: &TypeInfo) {
    b.put_u32(t.oid);
    b.put_i32(t.typmod);
    // typtype is one ASCII letter; anything else is stored as `?` and read back as such.
    b.put_u8(if t.typtype.is_ascii() {
        t.typtype as u8
    } else {
        b'?'
    });
    match &t.element {
        None => b.put_u8(0),
        Some(e) => {
            b.put_u8(1);
            put_type(b, e);
        }
    }
}

/// Appends one framed record to `out`.
pub fn encode(record: &Record, out: &mut BytesMut) {
    match record {
        Record::Relation(r) => encode_relation(r, out),
        Record::Txn(t) => encode_txn(t, out),
    }
}

/// Appends a relation record to `out`.
pub fn encode_relation(r: &Relation, out: &mut BytesMut) {
    encode_body(out, |body| {
        body.put_u8(b'R');
        put_relation(body, r);
    })
}

fn put_relation(body: &mut BytesMut, r: &Relation) {
    body.put_u32(r.id);
    put_str(body, &r.namespace);
    put_str(body, &r.name);
    body.put_u8(r.replica_identity);
    put_len(body, r.columns.len());
    for c in &r.columns {
        body.put_u8(c.is_key as u8);
        put_str(body, &c.name);
        body.put_u32(c.type_oid);
        body.put_i32(c.typmod);
        put_str(body, &c.type_name);
        put_type(body, &c.storage);
        match c.attnum {
            None => body.put_u8(0),
            Some(n) => {
                body.put_u8(1);
                body.put_i16(n);
            }
        }
        put_opt_bool(body, c.has_default);
        put_opt_bool(body, c.not_null);
    }
}

/// The fixed part of a transaction record's body, up to and including its change count; the
/// changes (see [`encode_change`]) follow it.
pub fn txn_prefix(t: &Txn, changes: u64) -> BytesMut {
    let mut body = BytesMut::with_capacity(48);
    body.put_u8(b'X');
    body.put_u32(t.xid);
    body.put_u64(t.commit_lsn.0);
    body.put_u64(t.end_lsn.0);
    body.put_i64(t.commit_time_micros);
    put_varint(&mut body, changes);
    body
}

/// Appends one change of a transaction record's body to `body`.
pub fn encode_change(c: &Change, body: &mut BytesMut) {
    body.put_u8(match c.op {
        Op::Insert => b'I',
        Op::Update => b'U',
        Op::Delete => b'D',
        Op::Truncate => b'T',
        Op::Relation => b'R',
    });
    body.put_u32(c.rel);
    put_tuple(body, &c.old);
    put_tuple(body, &c.new);
    if let (Op::Relation, Some(r)) = (c.op, &c.relation) {
        put_relation(body, r);
    }
}

/// Appends a transaction record to `out`.
pub fn encode_txn(t: &Txn, out: &mut BytesMut) {
    encode_body(out, |body| {
        body.unsplit(txn_prefix(t, t.changes.len() as u64));
        for c in &t.changes {
            encode_change(c, body);
        }
    })
}

/// The frame header of a record whose body has `len` bytes and checksum `crc`.
pub fn frame_header(len: u64, crc: u32) -> [u8; FRAME_HEADER] {
    let mut h = [0u8; FRAME_HEADER];
    h[..8].copy_from_slice(&len.to_be_bytes());
    h[8..].copy_from_slice(&crc.to_be_bytes());
    h
}

/// Frames what `write` produces with its length and CRC32, written in place.
fn encode_body(out: &mut BytesMut, write: impl FnOnce(&mut BytesMut)) {
    let start = out.len();
    out.put_slice(&[0u8; FRAME_HEADER]);
    let mut body = out.split_off(start + FRAME_HEADER);
    write(&mut body);
    let header = frame_header(body.len() as u64, crc32fast::hash(&body));
    out[start..start + FRAME_HEADER].copy_from_slice(&header);
    out.unsplit(body);
}

/// Why a segment could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorruptRecord {
    pub offset: usize,
    pub reason: String,
}

/// The error of a read past the bytes at hand: at the end of a record it means the record
/// is damaged; while a large record is read piece by piece it means "read more".
pub(super) const ENDS_EARLY: &str = "record ends early";

pub(super) struct Reader {
    pub(super) buf: Bytes,
    /// Bytes of the record beyond `buf`, not read yet (zero when the record is whole).
    pub(super) more: u64,
}

impl Reader {
    pub(super) fn whole(buf: Bytes) -> Self {
        Self { buf, more: 0 }
    }

    fn need(&self, n: usize) -> Result<(), String> {
        if self.buf.remaining() < n {
            Err(ENDS_EARLY.into())
        } else {
            Ok(())
        }
    }
    pub(super) fn u8(&mut self) -> Result<u8, String> {
        self.need(1)?;
        Ok(self.buf.get_u8())
    }
    fn i16(&mut self) -> Result<i16, String> {
        self.need(2)?;
        Ok(self.buf.get_i16())
    }
    fn u32(&mut self) -> Result<u32, String> {
        self.need(4)?;
        Ok(self.buf.get_u32())
    }
    fn i32(&mut self) -> Result<i32, String> {
        self.need(4)?;
        Ok(self.buf.get_i32())
    }
    fn u64(&mut self) -> Result<u64, String> {
        self.need(8)?;
        Ok(self.buf.get_u64())
    }
    fn i64(&mut self) -> Result<i64, String> {
        self.need(8)?;
        Ok(self.buf.get_i64())
    }
    fn varint(&mut self) -> Result<u64, String> {
        let mut v: u64 = 0;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("length is not a valid varint".into())
    }
    /// A length or count, which must fit what is left of the record (each element takes at
    /// least `min` bytes): a damaged length is an error, never a huge allocation.
    fn len(&mut self, min: usize) -> Result<usize, String> {
        let n = self.varint()?;
        let n = usize::try_from(n).map_err(|_| "length does not fit in memory".to_string())?;
        let left = (self.buf.remaining() as u64).saturating_add(self.more);
        if (n as u64).saturating_mul(min as u64) > left {
            return Err("record ends early (a length exceeds the record)".into());
        }
        Ok(n)
    }
    fn bytes(&mut self) -> Result<Bytes, String> {
        let n = self.len(1)?;
        self.need(n)?;
        Ok(self.buf.split_to(n))
    }
    fn string(&mut self) -> Result<String, String> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| "string is not UTF-8".to_string())
    }
    fn opt_bool(&mut self) -> Result<Option<bool>, String> {
        match self.u8()? {
            0 => Ok(None),
            1 => Ok(Some(false)),
            2 => Ok(Some(true)),
            k => Err(format!("unknown flag value {k:#x}")),
        }
    }
    fn type_info(&mut self, depth: usize) -> Result<TypeInfo, String> {
        let oid = self.u32()?;
        let typmod = self.i32()?;
        let typtype = char::from(self.u8()?);
        let element = match self.u8()? {
            0 => None,
            _ if depth >= 8 => return Err("type nested too deeply".into()),
            _ => Some(Box::new(self.type_info(depth + 1)?)),
        };
        Ok(TypeInfo {
            oid,
            typmod,
            typtype,
            element,
        })
    }
    fn tuple(&mut self) -> Result<Option<Vec<Datum>>, String> {
        if self.u8()? == 0 {
            return Ok(None);
        }
        let n = self.len(1)?;
        let mut out = Vec::with_capacity(n.min(2048));
        for _ in 0..n {
            out.push(match self.u8()? {
                b'n' => Datum::Null,
                b'u' => Datum::Unchanged,
                b't' => Datum::Text(self.bytes()?),
                k => return Err(format!("unknown datum kind {k:#x}")),
            });
        }
        Ok(Some(out))
    }
}

fn read_relation(r: &mut Reader) -> Result<Relation, String> {
    let id = r.u32()?;
    let namespace = r.string()?;
    let name = r.string()?;
    let replica_identity = r.u8()?;
    let n = r.len(16)?;
    let mut columns = Vec::with_capacity(n);
    for _ in 0..n {
        let is_key = r.u8()? == 1;
        let name = r.string()?;
        let type_oid = r.u32()?;
        let typmod = r.i32()?;
        let type_name = r.string()?;
        let storage = r.type_info(0)?;
        let attnum = match r.u8()? {
            0 => None,
            _ => Some(r.i16()?),
        };
        columns.push(RelColumn {
            is_key,
            name,
            type_oid,
            typmod,
            type_name,
            storage,
            attnum,
            has_default: r.opt_bool()?,
            not_null: r.opt_bool()?,
        });
    }
    Ok(Relation {
        id,
        namespace,
        name,
        replica_identity,
        columns,
    })
}

pub(super) fn read_change(r: &mut Reader) -> Result<Change, String> {
    let op = match r.u8()? {
        b'I' => Op::Insert,
        b'U' => Op::Update,
        b'D' => Op::Delete,
        b'T' => Op::Truncate,
        b'R' => Op::Relation,
        k => return Err(format!("unknown change kind {k:#x}")),
    };
    let rel = r.u32()?;
    let old = r.tuple()?;
    let new = r.tuple()?;
    let relation = if op == Op::Relation {
        Some(read_relation(r)?)
    } else {
        None
    };
    Ok(Change {
        op,
        rel,
        old,
        new,
        relation,
    })
}

/// Reads the fixed part of a transaction record after its kind byte: the transaction (with
/// no changes yet) and how many changes follow.
pub(super) fn read_txn_prefix(r: &mut Reader) -> Result<(Txn, usize), String> {
    let xid = r.u32()?;
    let commit_lsn = Lsn(r.u64()?);
    let end_lsn = Lsn(r.u64()?);
    let commit_time_micros = r.i64()?;
    // A change takes at least 7 bytes (kind, relation id, two tuple flags).
    let n = r.len(7)?;
    let txn = Txn {
        xid,
        commit_lsn,
        end_lsn,
        commit_time_micros,
        changes: Vec::new(),
    };
    Ok((txn, n))
}

pub(super) fn decode_body(body: Bytes) -> Result<Record, String> {
    let mut r = Reader::whole(body);
    let record = match r.u8()? {
        b'R' => Record::Relation(read_relation(&mut r)?),
        b'X' => {
            let (mut txn, n) = read_txn_prefix(&mut r)?;
            // The count is bounded by the record's size; the vector grows as changes are read.
            txn.changes.reserve(n.min(1 << 16));
            for _ in 0..n {
                txn.changes.push(read_change(&mut r)?);
            }
            Record::Txn(txn)
        }
        k => return Err(format!("unknown record kind {k:#x}")),
    };
    if r.buf.has_remaining() {
        return Err("record has trailing bytes".into());
    }
    Ok(record)
}

/// Checks every change of a segment against the relation description in effect at that
/// point of the segment: a change of an undescribed relation, or a row whose width differs
/// from its description, makes the segment unreadable (never padded with NULLs).
#[derive(Default)]
pub(super) struct Described {
    relations: HashMap<u32, Relation>,
}

impl Described {
    fn check(&mut self, record: &Record) -> Result<(), String> {
        match record {
            Record::Relation(r) => self.relation(r),
            Record::Txn(t) => {
                for c in &t.changes {
                    self.change(t.xid, c)?;
                }
            }
        }
        Ok(())
    }

    pub(super) fn relation(&mut self, r: &Relation) {
        self.relations.insert(r.id, r.clone());
    }

    /// Checks one change of transaction `xid` (and takes the description it carries).
    pub(super) fn change(&mut self, xid: u32, c: &Change) -> Result<(), String> {
        if let (Op::Relation, Some(r)) = (c.op, &c.relation) {
            self.relation(r);
            return Ok(());
        }
        let Some(r) = self.relations.get(&c.rel) else {
            return Err(format!(
                "transaction {xid} changes relation id {} before any description of it",
                c.rel
            ));
        };
        for tuple in [&c.old, &c.new].into_iter().flatten() {
            if tuple.len() != r.columns.len() {
                return Err(r.width_mismatch(tuple.len()));
            }
        }
        Ok(())
    }
}

/// Decodes every record of a segment (after its header), verifying each checksum and that
/// every change matches the relation description it is read with.
pub fn decode_all(mut data: Bytes) -> Result<Vec<Record>, CorruptRecord> {
    let total = data.len();
    let mut out = Vec::new();
    let mut described = Described::default();
    while data.has_remaining() {
        let offset = total - data.remaining();
        let bad = |reason: &str| CorruptRecord {
            offset,
            reason: reason.to_string(),
        };
        if data.remaining() < FRAME_HEADER {
            return Err(bad("torn record header"));
        }
        let len = data.get_u64();
        let crc = data.get_u32();
        let len = match usize::try_from(len) {
            Ok(n) if n <= data.remaining() => n,
            _ => return Err(bad("torn record body")),
        };
        let body = data.split_to(len);
        if crc32fast::hash(&body) != crc {
            return Err(bad("checksum mismatch"));
        }
        let record = decode_body(body).map_err(|e| bad(&e))?;
        described.check(&record).map_err(|e| bad(&e))?;
        out.push(record);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn relation(id: u32, columns: Vec<RelColumn>) -> Relation {
        Relation {
            id,
            namespace: "public".into(),
            name: "t".into(),
            replica_identity: b'd',
            columns,
        }
    }

    fn enum_column() -> RelColumn {
        RelColumn {
            is_key: false,
            name: "mood".into(),
            type_oid: 16_500,
            typmod: -1,
            type_name: "mood".into(),
            storage: TypeInfo {
                oid: 16_500,
                typmod: -1,
                typtype: 'e',
                element: None,
            },
            attnum: Some(4),
            has_default: Some(true),
            not_null: Some(false),
        }
    }

    fn array_column() -> RelColumn {
        let mut c = RelColumn::plain(false, "tags", 1009, -1, "_text");
        c.storage.element = Some(Box::new(TypeInfo {
            oid: 25,
            typmod: -1,
            typtype: 'b',
            element: None,
        }));
        c.not_null = Some(true);
        c
    }

    fn insert(rel: u32, new: Vec<Datum>) -> Change {
        Change {
            op: Op::Insert,
            rel,
            old: None,
            new: Some(new),
            relation: None,
        }
    }

    fn sample() -> Vec<Record> {
        vec![
            Record::Relation(relation(
                7,
                vec![
                    RelColumn::plain(true, "id", 20, -1, "int8"),
                    enum_column(),
                    array_column(),
                ],
            )),
            Record::Txn(Txn {
                xid: 9,
                commit_lsn: Lsn(100),
                end_lsn: Lsn(108),
                commit_time_micros: 5,
                changes: vec![
                    insert(
                        7,
                        vec![
                            Datum::Text(Bytes::from_static(b"1")),
                            Datum::Null,
                            Datum::Unchanged,
                        ],
                    ),
                    Change {
                        op: Op::Truncate,
                        rel: 7,
                        old: None,
                        new: None,
                        relation: None,
                    },
                    Change {
                        op: Op::Relation,
                        rel: 7,
                        old: None,
                        new: None,
                        relation: Some(relation(7, vec![])),
                    },
                    insert(7, vec![]),
                ],
            }),
        ]
    }

    fn encoded(records: &[Record]) -> Bytes {
        let mut b = BytesMut::new();
        for r in records {
            encode(r, &mut b);
        }
        b.freeze()
    }

    #[test]
    fn round_trip() {
        assert_eq!(decode_all(encoded(&sample())).unwrap(), sample());
    }

    #[test]
    fn varints_round_trip_at_every_width() {
        for v in [
            0,
            1,
            127,
            128,
            300,
            u32::MAX as u64,
            u32::MAX as u64 + 1,
            u64::MAX,
        ] {
            let mut b = BytesMut::new();
            put_varint(&mut b, v);
            let mut r = Reader::whole(b.freeze());
            assert_eq!(r.varint().unwrap(), v);
            assert!(!r.buf.has_remaining());
        }
    }

    #[test]
    fn huge_values_and_many_changes_round_trip() {
        // A value far above the old 16-bit change-count and beyond any small fixed buffer,
        // and a transaction with more changes than a u16 can count.
        let big = Bytes::from(vec![b'x'; 48 * 1024 * 1024 + 3]);
        let mut changes = vec![insert(1, vec![Datum::Text(big.clone())])];
        changes.extend((0..70_000).map(|i| insert(1, vec![Datum::Text(i.to_string().into())])));
        let records = vec![
            Record::Relation(relation(
                1,
                vec![RelColumn::plain(false, "v", 25, -1, "text")],
            )),
            Record::Txn(Txn {
                xid: 1,
                commit_lsn: Lsn(1),
                end_lsn: Lsn(2),
                commit_time_micros: 0,
                changes,
            }),
        ];
        let back = decode_all(encoded(&records)).unwrap();
        let Record::Txn(t) = &back[1] else {
            panic!("not a transaction")
        };
        assert_eq!(t.changes.len(), 70_001);
        assert_eq!(t.changes[0].new.as_deref(), Some(&[Datum::Text(big)][..]));
        assert_eq!(back, records);
    }

    #[test]
    fn a_record_longer_than_four_gib_is_framed_with_its_full_length() {
        // The frame carries 64 bits: a length above u32::MAX is kept, and a segment that
        // ends before such a body is torn, not misread as a short record.
        let h = frame_header(u32::MAX as u64 + 10, 7);
        assert_eq!(
            u64::from_be_bytes(h[..8].try_into().unwrap()),
            u32::MAX as u64 + 10
        );
        let mut data = h.to_vec();
        data.extend_from_slice(b"Xshort");
        assert!(decode_all(Bytes::from(data))
            .unwrap_err()
            .reason
            .contains("torn"));
    }

    #[test]
    fn a_row_whose_width_differs_from_its_relation_is_refused() {
        let mut records = sample();
        records.push(Record::Txn(Txn {
            xid: 10,
            commit_lsn: Lsn(200),
            end_lsn: Lsn(208),
            commit_time_micros: 0,
            // The last description of relation 7 (inline in the previous transaction) has
            // no columns: one value is one too many.
            changes: vec![insert(7, vec![Datum::Null])],
        }));
        let err = decode_all(encoded(&records)).unwrap_err();
        assert!(err.reason.contains("public.t"), "{}", err.reason);
        assert!(err.reason.contains("carries 1 columns"), "{}", err.reason);

        let narrow = vec![
            Record::Relation(relation(
                3,
                vec![RelColumn::plain(true, "id", 23, -1, "int4")],
            )),
            Record::Txn(Txn {
                xid: 1,
                commit_lsn: Lsn(1),
                end_lsn: Lsn(2),
                commit_time_micros: 0,
                changes: vec![Change {
                    op: Op::Update,
                    rel: 3,
                    old: Some(vec![]),
                    new: Some(vec![Datum::Null]),
                    relation: None,
                }],
            }),
        ];
        assert!(decode_all(encoded(&narrow))
            .unwrap_err()
            .reason
            .contains("has 1"));
    }

    #[test]
    fn a_change_without_a_description_is_refused() {
        let records = vec![Record::Txn(Txn {
            xid: 4,
            commit_lsn: Lsn(1),
            end_lsn: Lsn(2),
            commit_time_micros: 0,
            changes: vec![insert(9, vec![Datum::Null])],
        })];
        assert!(decode_all(encoded(&records))
            .unwrap_err()
            .reason
            .contains("before any description"));
    }

    #[test]
    fn detects_torn_and_corrupt() {
        let full = encoded(&sample());
        let torn = full.slice(..full.len() - 3);
        assert!(decode_all(torn).unwrap_err().reason.contains("torn"));
        let mut corrupt = full.to_vec();
        let last = corrupt.len() - 1;
        corrupt[last] ^= 0xff;
        assert!(decode_all(Bytes::from(corrupt))
            .unwrap_err()
            .reason
            .contains("checksum"));
    }
}
