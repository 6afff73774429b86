//! The WAL's record format: transactions of changes, and relation descriptions, in a compact
//! binary encoding framed by length and CRC32.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::change::{Change, Datum, Lsn, Op, RelColumn, Relation, Txn};

/// File header of a segment.
pub const MAGIC: &[u8; 8] = b"SKWAL001";

/// A WAL record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    Relation(Relation),
    Txn(Txn),
}

fn put_str(b: &mut BytesMut, s: &str) {
    b.put_u32(s.len() as u32);
    b.put_slice(s.as_bytes());
}

fn put_tuple(b: &mut BytesMut, t: &Option<Vec<Datum>>) {
    match t {
        None => b.put_u8(0),
        Some(cols) => {
            b.put_u8(1);
            b.put_u32(cols.len() as u32);
            for d in cols {
                match d {
                    Datum::Null => b.put_u8(b'n'),
                    Datum::Unchanged => b.put_u8(b'u'),
                    Datum::Text(v) => {
                        b.put_u8(b't');
                        b.put_u32(v.len() as u32);
                        b.put_slice(v);
                    }
                }
            }
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
    body.put_u32(r.columns.len() as u32);
    for c in &r.columns {
        body.put_u8(c.is_key as u8);
        put_str(body, &c.name);
        body.put_u32(c.type_oid);
        body.put_i32(c.typmod);
    }
}

/// Appends a transaction record to `out`.
pub fn encode_txn(t: &Txn, out: &mut BytesMut) {
    encode_body(out, |body| {
        body.put_u8(b'X');
        body.put_u32(t.xid);
        body.put_u64(t.commit_lsn.0);
        body.put_u64(t.end_lsn.0);
        body.put_i64(t.commit_time_micros);
        body.put_u32(t.changes.len() as u32);
        for c in &t.changes {
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
    })
}

/// Frames what `write` produces with its length and CRC32, written in place.
fn encode_body(out: &mut BytesMut, write: impl FnOnce(&mut BytesMut)) {
    let start = out.len();
    out.put_u32(0);
    out.put_u32(0);
    let mut body = out.split_off(start + 8);
    write(&mut body);
    let len = body.len() as u32;
    let crc = crc32fast::hash(&body);
    out[start..start + 4].copy_from_slice(&len.to_be_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_be_bytes());
    out.unsplit(body);
}

/// Why a segment could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorruptRecord {
    pub offset: usize,
    pub reason: String,
}

struct Reader {
    buf: Bytes,
}

impl Reader {
    fn need(&self, n: usize) -> Result<(), String> {
        if self.buf.remaining() < n {
            Err("record ends early".into())
        } else {
            Ok(())
        }
    }
    fn u8(&mut self) -> Result<u8, String> {
        self.need(1)?;
        Ok(self.buf.get_u8())
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
    fn bytes(&mut self) -> Result<Bytes, String> {
        let n = self.u32()? as usize;
        self.need(n)?;
        Ok(self.buf.split_to(n))
    }
    fn string(&mut self) -> Result<String, String> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| "string is not UTF-8".to_string())
    }
    fn tuple(&mut self) -> Result<Option<Vec<Datum>>, String> {
        if self.u8()? == 0 {
            return Ok(None);
        }
        let n = self.u32()? as usize;
        let mut out = Vec::with_capacity(n.min(4096));
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
    {
        {
            let id = r.u32()?;
            let namespace = r.string()?;
            let name = r.string()?;
            let replica_identity = r.u8()?;
            let n = r.u32()? as usize;
            let mut columns = Vec::with_capacity(n.min(4096));
            for _ in 0..n {
                let is_key = r.u8()? == 1;
                let name = r.string()?;
                columns.push(RelColumn {
                    is_key,
                    name,
                    type_oid: r.u32()?,
                    typmod: r.i32()?,
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
    }
}

fn decode_body(body: Bytes) -> Result<Record, String> {
    let mut r = Reader { buf: body };
    match r.u8()? {
        b'R' => Ok(Record::Relation(read_relation(&mut r)?)),
        b'X' => {
            let xid = r.u32()?;
            let commit_lsn = Lsn(r.u64()?);
            let end_lsn = Lsn(r.u64()?);
            let commit_time_micros = r.i64()?;
            let n = r.u32()? as usize;
            let mut changes = Vec::with_capacity(n.min(1 << 16));
            for _ in 0..n {
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
                    Some(read_relation(&mut r)?)
                } else {
                    None
                };
                changes.push(Change {
                    op,
                    rel,
                    old,
                    new,
                    relation,
                });
            }
            Ok(Record::Txn(Txn {
                xid,
                commit_lsn,
                end_lsn,
                commit_time_micros,
                changes,
            }))
        }
        k => Err(format!("unknown record kind {k:#x}")),
    }
}

/// Decodes every record of a segment (after its header), verifying each checksum.
pub fn decode_all(mut data: Bytes) -> Result<Vec<Record>, CorruptRecord> {
    let total = data.len();
    let mut out = Vec::new();
    while data.has_remaining() {
        let offset = total - data.remaining();
        let bad = |reason: &str| CorruptRecord {
            offset,
            reason: reason.to_string(),
        };
        if data.remaining() < 8 {
            return Err(bad("torn record header"));
        }
        let len = data.get_u32() as usize;
        let crc = data.get_u32();
        if data.remaining() < len {
            return Err(bad("torn record body"));
        }
        let body = data.split_to(len);
        if crc32fast::hash(&body) != crc {
            return Err(bad("checksum mismatch"));
        }
        out.push(decode_body(body).map_err(|e| bad(&e))?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<Record> {
        vec![
            Record::Relation(Relation {
                id: 7,
                namespace: "public".into(),
                name: "t".into(),
                replica_identity: b'd',
                columns: vec![RelColumn {
                    is_key: true,
                    name: "id".into(),
                    type_oid: 20,
                    typmod: -1,
                }],
            }),
            Record::Txn(Txn {
                xid: 9,
                commit_lsn: Lsn(100),
                end_lsn: Lsn(108),
                commit_time_micros: 5,
                changes: vec![
                    Change {
                        op: Op::Insert,
                        rel: 7,
                        old: None,
                        new: Some(vec![
                            Datum::Text(Bytes::from_static(b"1")),
                            Datum::Null,
                            Datum::Unchanged,
                        ]),
                        relation: None,
                    },
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
                        relation: Some(Relation {
                            id: 7,
                            namespace: "public".into(),
                            name: "t".into(),
                            replica_identity: b'f',
                            columns: vec![],
                        }),
                    },
                ],
            }),
        ]
    }

    #[test]
    fn round_trip() {
        let mut b = BytesMut::new();
        for r in sample() {
            encode(&r, &mut b);
        }
        assert_eq!(decode_all(b.freeze()).unwrap(), sample());
    }

    #[test]
    fn detects_torn_and_corrupt() {
        let mut b = BytesMut::new();
        for r in sample() {
            encode(&r, &mut b);
        }
        let full = b.freeze();
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
