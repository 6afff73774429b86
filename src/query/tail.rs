//! Queries, live half: the WAL tail of a table (changes durable in Skippr's WAL but not yet
//! committed to Iceberg), reduced to the newest version of each key, ready to be merged
//! with the committed Iceberg snapshot.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;

use super::hidden::Hidden;
use super::tail_schema::TableShape;
use super::wal_read::WalRead;
use crate::change::Datum;
use crate::change::Lsn;
use crate::config::TableRef;
use crate::error::Result;
use crate::table::apply::{Committed, Pending, RowKeys};
use crate::table::keys::Key;
use crate::wal::Op;

/// A table's tail, reduced: the committed rows it hides and the rows it adds.
#[derive(Debug, Clone)]
pub struct TailSnapshot {
    /// The Iceberg snapshot LSN the tail starts after.
    pub floor: Lsn,
    /// The live schema: the committed one, plus the columns the tail adds (see
    /// `tail_schema`).
    pub schema: SchemaRef,
    pub hidden: Hidden,
    /// Rows the tail adds, in the live schema (values an update left unchanged are NULL
    /// there and listed in `fill`).
    pub rows: Option<RecordBatch>,
    /// Rows of `rows` with values an update left unchanged, and the key of the committed row
    /// that holds them.
    pub fill: Vec<(usize, Key, Vec<usize>)>,
    /// Changes of this table in the tail.
    pub changes: u64,
    /// Source commit time of the oldest transaction in the tail touching this table.
    pub oldest_commit_micros: Option<i64>,
    /// Newest LSN in the WAL.
    pub wal_lsn: Lsn,
}

/// The committed rows as the tail sees them: it cannot tell which exist, so it hides every
/// key a change removes (every copy with a primary key, one more copy without) and names
/// the committed row of that key as the place of the values an update left unchanged.
struct Hiding<'a> {
    hidden: &'a mut Hidden,
    keys: &'a RowKeys,
}

impl Committed for Hiding<'_> {
    type Place = Key;

    fn remove(&mut self, key: &Key, row: &[Datum], all: bool) -> Result<Option<Key>> {
        // After a TRUNCATE in the tail, no committed row is visible anyway.
        if !self.hidden.all {
            let n = self.hidden.keys.entry(key.clone()).or_insert(0);
            *n = if all { u32::MAX } else { n.saturating_add(1) };
            if !self.hidden.texts.contains_key(key) {
                self.hidden.texts.insert(key.clone(), self.keys.texts(row));
            }
        }
        Ok(Some(key.clone()))
    }
}

/// Reduces the WAL read to the tail of one table over `(floor, through]`: after the LSN its
/// Iceberg snapshot covers, up to the read view's cut. Only whole transactions exist in the
/// WAL and a transaction is kept or cut whole (by its end LSN), so only whole transactions
/// show. Changes apply as the sink applies them ([`crate::table::apply`]).
pub fn reduce(
    shape: &TableShape,
    read: &WalRead,
    floor: Lsn,
    through: Lsn,
) -> Result<TailSnapshot> {
    let walk = walk::Walk::new(shape);
    let mut pending: Pending<Key> = Pending::new(shape.keyed());
    let mut hidden = Hidden::default();
    let walked = walk.each(read, floor, through, |step| {
        let mut committed = Hiding {
            hidden: &mut hidden,
            keys: &walk.keys,
        };
        match step.op {
            Op::Relation => {}
            Op::Truncate => {
                *committed.hidden = Hidden {
                    all: true,
                    ..Hidden::default()
                };
                pending.clear();
            }
            Op::Insert => {
                let row = step.new.unwrap_or_default();
                let key = walk.key_of(&row)?;
                pending.insert(&mut committed, key, row)?;
            }
            Op::Delete => {
                let old = step.old.unwrap_or_default();
                let key = walk.key_of(&old)?;
                pending.delete(&mut committed, &key, &old)?;
            }
            Op::Update => {
                let mut row = step.new.unwrap_or_default();
                let (old_key, new_key) = walk.keys.update_keys(&mut row, step.old.as_deref())?;
                pending.update(&mut committed, &old_key, step.old.as_deref(), new_key, row)?;
            }
        }
        Ok(())
    })?;

    let live = pending.take();
    let mut fill = Vec::new();
    let batch = if live.is_empty() {
        None
    } else {
        let (batch, unchanged) = walk.batch(live.iter().map(|p| p.values.as_slice()))?;
        for (r, (row, unchanged)) in live.iter().zip(unchanged).enumerate() {
            if !unchanged.is_empty() {
                let from = row.previous.clone().unwrap_or_else(|| row.key.clone());
                fill.push((r, from, unchanged));
            }
        }
        Some(batch)
    };
    Ok(TailSnapshot {
        floor,
        schema: shape.schema.clone(),
        hidden,
        rows: batch,
        fill,
        changes: walked.changes,
        oldest_commit_micros: walked.oldest_commit_micros,
        wal_lsn: walked.wal_lsn,
    })
}

/// Caches the reduced tail of each table for as long as neither the WAL nor the table's
/// committed snapshot changes.
#[derive(Default)]
pub struct ReducedCache {
    entries: Mutex<HashMap<String, CachedTail>>,
}

/// A reduced tail, with the snapshot LSN, the cut, the WAL segments and the committed shape
/// (with the source it reads) it was reduced from.
struct CachedTail {
    lsns: (Lsn, Lsn),
    paths: Vec<PathBuf>,
    base: Arc<TableShape>,
    source: TableRef,
    snap: Arc<TailSnapshot>,
}

impl ReducedCache {
    /// The tail of `table` over `(floor, through]` of `read`, for the committed shape `base`
    /// read from `source`: the shape is extended by the tail's schema changes (see
    /// `tail_schema`) and the tail reduced only when no statement did so for the same
    /// inputs already.
    pub fn get_or_reduce(
        &self,
        table: &str,
        base: &Arc<TableShape>,
        source: &TableRef,
        read: &WalRead,
        floor: Lsn,
        through: Lsn,
    ) -> Result<Arc<TailSnapshot>> {
        let fp = read.fingerprint();
        // Cuts that differ only by WAL with no transaction in this read (keepalive positions,
        // other databases' writes) see the same tail: they share one entry, so statements of
        // a held view and fresh ones do not evict each other's reductions.
        let through = read.newest_through(through);
        {
            let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(c) = entries.get(table) {
                if c.lsns == (floor, through)
                    && c.paths == fp
                    && Arc::ptr_eq(&c.base, base)
                    && c.source == *source
                {
                    return Ok(c.snap.clone());
                }
            }
        }
        let mut shape = TableShape {
            source: source.clone(),
            ..(**base).clone()
        };
        super::tail_schema::extend(&mut shape, read);
        let snap = Arc::new(reduce(&shape, read, floor, through)?);
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                table.to_string(),
                CachedTail {
                    lsns: (floor, through),
                    paths: fp,
                    base: base.clone(),
                    source: source.clone(),
                    snap: snap.clone(),
                },
            );
        Ok(snap)
    }
}

#[cfg(test)]
pub(crate) mod tests;
pub(crate) mod walk;
