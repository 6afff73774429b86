//! Decodes pgoutput (protocol version 1) messages from the replication stream: relations,
//! inserts, updates, deletes and truncates, with their tuples in text format.

use bytes::{Buf, Bytes};

use crate::change::Datum;

/// A column as a relation message describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawColumn {
    pub is_key: bool,
    pub name: String,
    /// The declared type (a domain, not its base) and its modifier.
    pub type_oid: u32,
    pub typmod: i32,
}

/// A relation message as Postgres sends it: names and declared types only. The stream
/// completes it from the catalog (see `relation`) before it enters the WAL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelationMessage {
    /// The table's oid.
    pub id: u32,
    pub namespace: String,
    pub name: String,
    pub replica_identity: u8,
    pub columns: Vec<RawColumn>,
}

/// A decoded message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Relation(RelationMessage),
    Insert {
        rel: u32,
        new: Vec<Datum>,
    },
    Update {
        rel: u32,
        /// The old key ('K') or old row ('O', replica identity full), when sent.
        old: Option<Vec<Datum>>,
        new: Vec<Datum>,
    },
    Delete {
        rel: u32,
        old: Vec<Datum>,
    },
    Truncate {
        rels: Vec<u32>,
        cascade: bool,
        restart_identity: bool,
    },
    /// Messages that carry nothing we store (Begin/Commit are handled by the transport;
    /// Type and Origin are informational).
    Other(u8),
}

/// A malformed message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError(pub String);

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "malformed pgoutput message: {}", self.0)
    }
}

impl std::error::Error for DecodeError {}

type DResult<T> = Result<T, DecodeError>;

fn need(buf: &Bytes, n: usize, what: &str) -> DResult<()> {
    if buf.remaining() < n {
        Err(DecodeError(format!("truncated {what}")))
    } else {
        Ok(())
    }
}

fn cstr(buf: &mut Bytes) -> DResult<String> {
    let end = buf
        .iter()
        .position(|&b| b == 0)
        .ok_or_else(|| DecodeError("unterminated string".into()))?;
    let s = String::from_utf8(buf.split_to(end).to_vec())
        .map_err(|_| DecodeError("string is not UTF-8".into()))?;
    buf.advance(1);
    Ok(s)
}

fn tuple(buf: &mut Bytes) -> DResult<Vec<Datum>> {
    need(buf, 2, "tuple")?;
    let n = buf.get_i16();
    if n < 0 {
        return Err(DecodeError("negative column count".into()));
    }
    let mut out = Vec::with_capacity(n as usize);
    for _ in 0..n {
        need(buf, 1, "tuple column")?;
        match buf.get_u8() {
            b'n' => out.push(Datum::Null),
            b'u' => out.push(Datum::Unchanged),
            b't' | b'b' => {
                need(buf, 4, "value length")?;
                let len = buf.get_i32();
                if len < 0 {
                    return Err(DecodeError("negative value length".into()));
                }
                need(buf, len as usize, "value")?;
                out.push(Datum::Text(buf.split_to(len as usize)));
            }
            k => return Err(DecodeError(format!("unknown tuple value kind {k:#x}"))),
        }
    }
    Ok(out)
}

/// Decodes one pgoutput message.
pub fn decode(mut buf: Bytes) -> DResult<Message> {
    need(&buf, 1, "message")?;
    let tag = buf.get_u8();
    match tag {
        b'R' => {
            need(&buf, 4, "relation")?;
            let id = buf.get_u32();
            let namespace = cstr(&mut buf)?;
            let name = cstr(&mut buf)?;
            need(&buf, 3, "relation")?;
            let replica_identity = buf.get_u8();
            let n = buf.get_i16();
            let mut columns = Vec::with_capacity(n.max(0) as usize);
            for _ in 0..n {
                need(&buf, 1, "relation column")?;
                let flags = buf.get_u8();
                let name = cstr(&mut buf)?;
                need(&buf, 8, "relation column")?;
                columns.push(RawColumn {
                    is_key: flags & 1 == 1,
                    name,
                    type_oid: buf.get_u32(),
                    typmod: buf.get_i32(),
                });
            }
            Ok(Message::Relation(RelationMessage {
                id,
                namespace,
                name,
                replica_identity,
                columns,
            }))
        }
        b'I' => {
            need(&buf, 5, "insert")?;
            let rel = buf.get_u32();
            match buf.get_u8() {
                b'N' => Ok(Message::Insert {
                    rel,
                    new: tuple(&mut buf)?,
                }),
                k => Err(DecodeError(format!("insert without new tuple ({k:#x})"))),
            }
        }
        b'U' => {
            need(&buf, 5, "update")?;
            let rel = buf.get_u32();
            let mut kind = buf.get_u8();
            let mut old = None;
            if kind == b'K' || kind == b'O' {
                old = Some(tuple(&mut buf)?);
                need(&buf, 1, "update")?;
                kind = buf.get_u8();
            }
            if kind != b'N' {
                return Err(DecodeError(format!("update without new tuple ({kind:#x})")));
            }
            Ok(Message::Update {
                rel,
                old,
                new: tuple(&mut buf)?,
            })
        }
        b'D' => {
            need(&buf, 5, "delete")?;
            let rel = buf.get_u32();
            match buf.get_u8() {
                b'K' | b'O' => Ok(Message::Delete {
                    rel,
                    old: tuple(&mut buf)?,
                }),
                k => Err(DecodeError(format!("delete without old tuple ({k:#x})"))),
            }
        }
        b'T' => {
            need(&buf, 5, "truncate")?;
            let n = buf.get_u32();
            let options = buf.get_u8();
            need(&buf, 4 * n as usize, "truncate")?;
            let rels = (0..n).map(|_| buf.get_u32()).collect();
            Ok(Message::Truncate {
                rels,
                cascade: options & 1 != 0,
                restart_identity: options & 2 != 0,
            })
        }
        other => Ok(Message::Other(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BufMut;

    #[test]
    fn relation_and_insert() {
        let mut b = bytes::BytesMut::new();
        b.put_u8(b'R');
        b.put_u32(42);
        b.put_slice(b"public\0orders\0");
        b.put_u8(b'd');
        b.put_i16(2);
        b.put_u8(1);
        b.put_slice(b"id\0");
        b.put_u32(20);
        b.put_i32(-1);
        b.put_u8(0);
        b.put_slice(b"note\0");
        b.put_u32(25);
        b.put_i32(-1);
        let Message::Relation(r) = decode(b.freeze()).unwrap() else {
            panic!()
        };
        assert_eq!(r.name, "orders");
        assert!(r.columns[0].is_key);

        let mut b = bytes::BytesMut::new();
        b.put_u8(b'I');
        b.put_u32(42);
        b.put_u8(b'N');
        b.put_i16(3);
        b.put_u8(b't');
        b.put_i32(2);
        b.put_slice(b"17");
        b.put_u8(b'n');
        b.put_u8(b'u');
        let m = decode(b.freeze()).unwrap();
        assert_eq!(
            m,
            Message::Insert {
                rel: 42,
                new: vec![
                    Datum::Text(Bytes::from_static(b"17")),
                    Datum::Null,
                    Datum::Unchanged
                ]
            }
        );
    }

    #[test]
    fn truncated_is_error() {
        assert!(decode(Bytes::from_static(b"I\0\0")).is_err());
        assert!(decode(Bytes::from_static(b"U\0\0\0\x01N\0\x01t\0\0\0\x09ab")).is_err());
    }
}
