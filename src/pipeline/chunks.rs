//! A table copied in key chunks joins the stream: each chunk's rows already hold the changes
//! of the transactions its snapshot saw, so from the WAL it takes, per key, exactly the
//! transactions the snapshot of that key's chunk did not see (up to `through`, the position
//! after which no chunk saw anything). Kept in the pipeline's state until the table has
//! committed past `through`.

use serde::{Deserialize, Serialize};

use crate::change::{Change, Datum, Lsn, Op, Relation};
use crate::error::{Error, Result};
use crate::source::postgres::key_chunks::ChunkSeen;

/// A copy in key chunks under way: the chunks already copied, each with the data files of
/// its rows listed in a manifest of its own, durable before the chunk is recorded, so that a
/// copy cut short (a crash, a lost connection) goes on from them instead of starting over.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CopyProgress {
    /// The integer key column the chunks cut.
    pub key: String,
    /// The source table's oid when it was copied: a table dropped and made again under the
    /// same name is another table, whose copy starts over.
    #[serde(default)]
    pub oid: u32,
    /// The Iceberg table's partition spec the chunks' files were written under.
    #[serde(default)]
    pub spec: i32,
    pub chunks: Vec<CopiedChunk>,
}

/// One chunk of a [`CopyProgress`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CopiedChunk {
    pub seen: ChunkSeen,
    pub rows: u64,
    /// The Avro manifest (in the table's metadata folder) listing the chunk's data files;
    /// none for a chunk without rows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest: Option<String>,
}

/// What a table copied in key chunks takes from the WAL.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChunkFilter {
    /// Transactions ending after this LSN were seen by no chunk.
    #[serde(with = "super::state::lsn_text")]
    pub through: Lsn,
    /// The integer key column the chunks cut.
    pub key: String,
    pub chunks: Vec<ChunkSeen>,
}

impl ChunkFilter {
    /// The change to apply of `c` (transaction `xid`, ending at `end_lsn`), described by
    /// `rel`: all of it, none of it (`None`: its chunk already holds it), or, for an update
    /// that moves a row between a chunk that saw it and one that did not, the half that
    /// chunk lacks.
    pub fn admit(
        &self,
        c: Change,
        rel: &Relation,
        xid: u32,
        end_lsn: Lsn,
    ) -> Result<Option<Change>> {
        if end_lsn > self.through {
            return Ok(Some(c));
        }
        let saw = |tuple: &Option<Vec<Datum>>| -> Result<bool> {
            let key = self.key_of(tuple.as_deref(), rel)?;
            Ok(self
                .chunks
                .iter()
                .find(|ch| ch.holds(key))
                .is_some_and(|ch| ch.saw(xid)))
        };
        match c.op {
            Op::Relation => Ok(Some(c)),
            Op::Insert => Ok((!saw(&c.new)?).then_some(c)),
            Op::Delete => Ok((!saw(&c.old)?).then_some(c)),
            Op::Update => {
                let new_seen = saw(&c.new)?;
                let old_seen = match &c.old {
                    Some(_) => saw(&c.old)?,
                    None => new_seen,
                };
                match (old_seen, new_seen) {
                    (true, true) => Ok(None),
                    (false, false) => Ok(Some(c)),
                    // The old key's chunk saw it (the row is gone there), the new one's did not.
                    (true, false) => {
                        if c.new
                            .as_ref()
                            .is_some_and(|n| n.contains(&Datum::Unchanged))
                        {
                            return Err(self.cannot(rel, "an update moved a row between two chunks of the copy and left a large value out of the change"));
                        }
                        Ok(Some(Change {
                            op: Op::Insert,
                            old: None,
                            ..c
                        }))
                    }
                    (false, true) => Ok(Some(Change {
                        op: Op::Delete,
                        new: None,
                        ..c
                    })),
                }
            }
            Op::Truncate => {
                let seen: Vec<bool> = self.chunks.iter().map(|ch| ch.saw(xid)).collect();
                if seen.iter().all(|s| *s) {
                    Ok(None)
                } else if seen.iter().all(|s| !*s) {
                    Ok(Some(c))
                } else {
                    Err(self.cannot(rel, "a TRUNCATE ran while the table was being copied"))
                }
            }
        }
    }

    fn key_of(&self, tuple: Option<&[Datum]>, rel: &Relation) -> Result<i64> {
        let at = rel
            .columns
            .iter()
            .position(|c| c.name == self.key)
            .ok_or_else(|| self.cannot(rel, &format!("its key column `{}` is gone", self.key)))?;
        match tuple.and_then(|t| t.get(at)) {
            Some(Datum::Text(b)) => std::str::from_utf8(b)
                .ok()
                .and_then(|t| t.parse().ok())
                .ok_or_else(|| self.cannot(rel, "a change carries a key that is not an integer")),
            _ => Err(self.cannot(rel, "a change carries no key")),
        }
    }

    fn cannot(&self, rel: &Relation, what: &str) -> Error {
        Error::fatal(format!(
            "table {} was copied in chunks and {what}, so which chunk holds the change is not known; copy it again with `skipprd sync --pipeline <pipeline> --resnapshot --table {}`",
            rel.qualified(),
            rel.qualified()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::change::RelColumn;

    fn rel() -> Relation {
        Relation {
            id: 1,
            namespace: "public".into(),
            name: "t".into(),
            replica_identity: b'd',
            columns: vec![
                RelColumn::plain(true, "id", 20, -1, "int8"),
                RelColumn::plain(false, "v", 25, -1, "text"),
            ],
        }
    }

    fn row(id: i64, v: &str) -> Option<Vec<Datum>> {
        Some(vec![
            Datum::Text(id.to_string().into()),
            Datum::Text(v.to_string().into()),
        ])
    }

    fn change(op: Op, old: Option<Vec<Datum>>, new: Option<Vec<Datum>>) -> Change {
        Change {
            op,
            rel: 1,
            old,
            new,
            relation: None,
        }
    }

    /// Keys below 100 were copied by a snapshot that saw transaction 10 (not 20); keys from
    /// 100 by one that saw both.
    fn filter() -> ChunkFilter {
        let chunk = ChunkSeen::seen_below;
        ChunkFilter {
            through: Lsn(1_000),
            key: "id".into(),
            chunks: vec![chunk(None, Some(100), 11), chunk(Some(100), None, 21)],
        }
    }

    #[test]
    fn each_key_takes_what_its_chunk_did_not_see() {
        let f = filter();
        let r = rel();
        let ins = |id| change(Op::Insert, None, row(id, "x"));
        // Transaction 10: both chunks saw it.
        assert_eq!(f.admit(ins(1), &r, 10, Lsn(500)).unwrap(), None);
        assert_eq!(f.admit(ins(200), &r, 10, Lsn(500)).unwrap(), None);
        // Transaction 20: only the upper chunk saw it.
        assert!(f.admit(ins(1), &r, 20, Lsn(500)).unwrap().is_some());
        assert_eq!(f.admit(ins(200), &r, 20, Lsn(500)).unwrap(), None);
        // After `through`, every change applies.
        assert!(f.admit(ins(200), &r, 10, Lsn(1_001)).unwrap().is_some());
        // Deletes by their old key.
        let del = change(Op::Delete, row(150, ""), None);
        assert_eq!(f.admit(del.clone(), &r, 20, Lsn(500)).unwrap(), None);
        assert!(f.admit(del, &r, 30, Lsn(500)).unwrap().is_some());
    }

    #[test]
    fn an_update_across_chunks_keeps_the_half_its_chunk_lacks() {
        let (f, r) = (filter(), rel());
        // 150 -> 50 in transaction 20: the upper chunk saw it (150 is gone there), the lower
        // did not (50 is missing there): an insert of 50.
        let moved = change(Op::Update, row(150, ""), row(50, "y"));
        let got = f.admit(moved, &r, 20, Lsn(500)).unwrap().unwrap();
        assert_eq!((got.op, got.old.is_none()), (Op::Insert, true));
        // 50 -> 150: the lower chunk still holds 50, the upper already has 150: a delete.
        let back = change(Op::Update, row(50, ""), row(150, "y"));
        let got = f.admit(back, &r, 20, Lsn(500)).unwrap().unwrap();
        assert_eq!((got.op, got.new.is_none()), (Op::Delete, true));
        // A moved row with a value the change left out cannot be rebuilt: refused.
        let mut partial = change(Op::Update, row(150, ""), row(50, "y"));
        if let Some(n) = partial.new.as_mut() {
            n[1] = Datum::Unchanged;
        }
        let e = f.admit(partial, &r, 20, Lsn(500)).unwrap_err();
        assert!(
            e.message().contains("--resnapshot --table public.t"),
            "{}",
            e.message()
        );
        // A truncate one chunk saw and the other did not is refused too.
        let trunc = change(Op::Truncate, None, None);
        assert!(f.admit(trunc.clone(), &r, 20, Lsn(500)).is_err());
        assert_eq!(f.admit(trunc.clone(), &r, 10, Lsn(500)).unwrap(), None);
        assert!(f.admit(trunc, &r, 30, Lsn(500)).unwrap().is_some());
    }
}
