//! Queries, live half: walking one table's changes in the WAL read, in order, each as rows in
//! the table's live column order. The reduced tail (`reduce`) and a changelog's live rows
//! (`query::changelog`) both read the WAL through it, so both map columns, check tuples and
//! read keys the same way.

use std::collections::HashMap;

use arrow::array::{ArrayRef, RecordBatch};

use crate::change::types::{ColumnBuilder, PgType};
use crate::change::{Datum, Lsn, Relation, Txn};
use crate::error::{Error, Result};
use crate::query::tail_schema::TableShape;
use crate::query::wal_read::WalRead;
use crate::sink::iceberg::SourceColumn;
use crate::table::apply::RowKeys;
use crate::table::keys::Key;
use crate::wal::{Op, Record};

/// One change of the table, its tuples in the live column order.
pub(crate) struct Step<'a> {
    pub txn: &'a Txn,
    pub op: Op,
    pub old: Option<Vec<Datum>>,
    pub new: Option<Vec<Datum>>,
}

/// What a walk saw besides the changes.
#[derive(Default)]
pub(crate) struct Walked {
    /// Changes of the table after the floor.
    pub changes: u64,
    /// Source commit time of the oldest transaction after the floor touching the table.
    pub oldest_commit_micros: Option<i64>,
    /// Newest transaction end LSN read up to the cut.
    pub wal_lsn: Lsn,
}

/// Reads one table's changes out of a WAL read.
pub(crate) struct Walk<'a> {
    pub shape: &'a TableShape,
    pub names: Vec<&'a str>,
    pub pg: Vec<PgType>,
    /// The key columns, and the key of a row.
    pub keys: RowKeys,
}

impl<'a> Walk<'a> {
    pub fn new(shape: &'a TableShape) -> Self {
        let names: Vec<&str> = shape
            .schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        Self {
            shape,
            names,
            pg: shape.pg_types(),
            keys: RowKeys::new(
                shape.source.clone(),
                &shape.schema,
                shape.key_columns().to_vec(),
            ),
        }
    }

    /// The key of a row (the primary key, or the whole row for a table without one).
    pub fn key_of(&self, row: &[Datum]) -> Result<Key> {
        self.keys.key_of(row)
    }

    /// Calls `step` for each change of the table in the transactions of `read` after
    /// `floor` and up to `through` (by end LSN), in WAL order. A transaction is kept or cut
    /// whole, so only whole transactions show.
    pub fn each(
        &self,
        read: &WalRead,
        floor: Lsn,
        through: Lsn,
        mut step: impl FnMut(Step<'_>) -> Result<()>,
    ) -> Result<Walked> {
        let shape = self.shape;
        // Relation id -> for each live column, the relation column it comes from; and the
        // relation's width, which every change of it must have.
        let mut maps: HashMap<u32, (Vec<Option<usize>>, usize)> = HashMap::new();
        let mut walked = Walked::default();
        for (_, records) in &read.segments {
            for rec in records.iter() {
                let txn = match rec {
                    Record::Relation(r) => {
                        self.relation(r, &mut maps);
                        continue;
                    }
                    Record::Txn(t) => t,
                };
                if txn.end_lsn > through {
                    // After the view's cut: not visible to this statement (segments are in
                    // LSN order, but a cut inside a segment leaves the rest of it).
                    continue;
                }
                walked.wal_lsn = walked.wal_lsn.max(txn.end_lsn);
                // A transaction the snapshot covers still carries the descriptions the later
                // transactions of its segment are read with.
                let covered = txn.end_lsn <= floor;
                for c in &txn.changes {
                    if c.op == Op::Relation {
                        if let Some(r) = &c.relation {
                            self.relation(r, &mut maps);
                        }
                        continue;
                    }
                    if covered {
                        continue;
                    }
                    let Some((map, rel_width)) = maps.get(&c.rel) else {
                        continue;
                    };
                    walked.changes += 1;
                    walked
                        .oldest_commit_micros
                        .get_or_insert(txn.commit_time_micros);
                    // A tuple always has its description's width (the WAL refuses others
                    // when read): a mismatch here is an error, never padded.
                    for t in [&c.old, &c.new].into_iter().flatten() {
                        if t.len() != *rel_width {
                            return Err(Error::fatal(format!(
                                "table {}: a change in the WAL carries {} columns but its description has {rel_width}",
                                shape.source,
                                t.len()
                            )));
                        }
                    }
                    let to_row = |t: &Option<Vec<Datum>>| -> Option<Vec<Datum>> {
                        let tuple = t.as_deref()?;
                        Some(
                            map.iter()
                                .map(|m| {
                                    m.and_then(|i| tuple.get(i).cloned()).unwrap_or(Datum::Null)
                                })
                                .collect(),
                        )
                    };
                    step(Step {
                        txn,
                        op: c.op,
                        old: to_row(&c.old),
                        new: to_row(&c.new),
                    })?;
                }
            }
        }
        Ok(walked)
    }

    /// Notes a relation description of the table: where each live column comes from.
    fn relation(&self, r: &Relation, maps: &mut HashMap<u32, (Vec<Option<usize>>, usize)>) {
        let shape = self.shape;
        if r.namespace != shape.source.schema || r.name != shape.source.name {
            return;
        }
        let mut map = vec![None; self.names.len()];
        for (ri, c) in r.columns.iter().enumerate() {
            let same =
                |x: &&SourceColumn| x.name == c.name && x.oid == c.type_oid && x.typmod == c.typmod;
            let recorded = shape
                .columns
                .as_ref()
                .and_then(|cols| cols.iter().find(|x| x.name == c.name));
            // A column whose type changed since the last commit: its values go where the
            // live schema puts them (a widened or sibling column), or nowhere (NULL) for a
            // type the live schema cannot show before the commit.
            let target = match recorded {
                Some(x) if same(&x) => x.target(),
                Some(_) => match shape.tail_columns.iter().rev().find(same) {
                    Some(x) => x.target(),
                    None => continue,
                },
                None => shape
                    .tail_columns
                    .iter()
                    .rev()
                    .find(same)
                    .map(|x| x.target())
                    .unwrap_or(c.name.as_str()),
            };
            if let Some(ti) = self.names.iter().position(|n| *n == target) {
                map[ti] = Some(ri);
            }
        }
        maps.insert(r.id, (map, r.columns.len()));
    }

    /// `rows` as a batch of the live schema; for each row, the columns an update left
    /// unchanged (NULL in the batch).
    pub fn batch<'r>(
        &self,
        rows: impl ExactSizeIterator<Item = &'r [Datum]>,
    ) -> Result<(RecordBatch, Vec<Vec<usize>>)> {
        let shape = self.shape;
        let mut builders: Vec<ColumnBuilder> = shape
            .schema
            .fields()
            .iter()
            .zip(&self.pg)
            .map(|(f, t)| ColumnBuilder::new(t, f.data_type(), rows.len()))
            .collect();
        let mut unchanged_of = Vec::with_capacity(rows.len());
        for row in rows {
            let mut unchanged = Vec::new();
            for (i, b) in builders.iter_mut().enumerate() {
                match row.get(i) {
                    Some(Datum::Text(v)) => {
                        let s = std::str::from_utf8(v).map_err(|_| {
                            Error::unrepresentable(format!(
                                "table {}, column `{}`: the value is not UTF-8",
                                shape.source, self.names[i]
                            ))
                        })?;
                        b.append_text(s).map_err(|e| {
                            Error::unrepresentable(format!(
                                "table {}, column `{}`: {}",
                                shape.source, self.names[i], e.0
                            ))
                        })?;
                    }
                    Some(Datum::Unchanged) => {
                        unchanged.push(i);
                        b.append_null();
                    }
                    _ => b.append_null(),
                }
            }
            unchanged_of.push(unchanged);
        }
        let columns: Vec<ArrayRef> = builders.iter_mut().map(|b| b.finish()).collect();
        let columns = columns
            .into_iter()
            .zip(shape.schema.fields())
            .map(|(c, f)| {
                if c.data_type() == f.data_type() {
                    Ok(c)
                } else {
                    arrow::compute::cast(&c, f.data_type()).map_err(Error::from)
                }
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((
            RecordBatch::try_new(shape.schema.clone(), columns)?,
            unchanged_of,
        ))
    }
}
