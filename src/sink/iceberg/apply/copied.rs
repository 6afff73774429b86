//! Sink, a table copied again while it has a changelog (`sync --resnapshot`, or a copy made
//! because the WAL could no longer complete the table): the difference between the rows the
//! table held before the copy and the copy's rows becomes change rows of the changelog, at
//! the copy's LSN, so that replaying the changelog still rebuilds the table.

use arrow::array::{ArrayRef, RecordBatch, UInt32Array};
use arrow::row::{RowConverter, SortField};
use iceberg::spec::DataFile;
use iceberg::table::Table;

use super::{Key, Loc, TableSink};
use crate::change::Lsn;
use crate::error::{Error, Result};
use crate::sink::iceberg::writer::TableWriter;
use crate::table::changelog::{self, ChangeOp};
use crate::table::{SUMMARY_LSN, SUMMARY_PHASE};

/// Rows of the copy compared at a time.
const DIFF_ROWS: usize = 64 * 1024;

/// A copy of the table that its changelog has not recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Copied {
    /// The table's snapshot before the copy: the rows the changelog replays to.
    pub before: i64,
}

/// The copy (or copies) the table took after `logged`, the LSN of its changelog's last
/// commit: the table's history is walked back from its current snapshot through every
/// snapshot newer than `logged`; the oldest of them written by a copy (phase `snapshot`)
/// names the snapshot before it. `None` when no copy is among them.
pub(super) fn copied_since(table: &Table, logged: Lsn) -> Result<Option<Copied>> {
    let meta = table.metadata();
    let name = table.identifier();
    let mut next = meta.current_snapshot();
    let mut oldest = None;
    // Bounded by the number of snapshots, so a malformed parent cycle cannot loop forever.
    for _ in 0..=meta.snapshots().len() {
        let Some(s) = next else {
            break;
        };
        let props = &s.summary().additional_properties;
        if let Some(lsn) = props.get(SUMMARY_LSN).and_then(|v| Lsn::parse(v).ok()) {
            if lsn <= logged {
                break;
            }
            if props.get(SUMMARY_PHASE).map(String::as_str) == Some("snapshot") {
                oldest = Some(s.clone());
            }
        }
        next = s
            .parent_snapshot_id()
            .and_then(|id| meta.snapshot_by_id(id));
    }
    let Some(copy) = oldest else {
        return Ok(None);
    };
    let before = copy.parent_snapshot_id().ok_or_else(|| {
        Error::config(format!(
            "Iceberg table {name} was created anew by a copy after its changelog's last commit at {logged}, so the changelog's history cannot be continued: drop the changelog table (in your catalog) and it starts over from the table's rows"
        ))
    })?;
    let Some(prior) = meta.snapshot_by_id(before) else {
        return Err(Error::config(format!(
            "Iceberg table {name} was copied again after its changelog's last commit at {logged}, but its snapshot from before the copy ({before}) has expired, so the difference the copy made cannot be recorded: drop the changelog table (in your catalog) and it starts over from the table's rows"
        )));
    };
    let prior_lsn = crate::table::cuts::snapshot_lsn(meta, prior.snapshot_id());
    if prior_lsn.is_some_and(|l| l > logged) {
        return Err(Error::fatal(format!(
            "the changelog of Iceberg table {name} is behind the table's commits before its copy (changelog at {logged}, table at {}): drop the changelog table (in your catalog) and it starts over from the table's rows",
            prior_lsn.unwrap_or_default()
        )));
    }
    if prior_lsn.is_some_and(|l| l < logged) {
        // A crash between the changelog's commit and its table's (catalogs that commit them
        // one after the other), then a re-snapshot before the table caught up: the
        // changelog holds changes the table before the copy lacks, so a difference from that
        // table would record them twice.
        return Err(Error::config(format!(
            "the changelog of Iceberg table {name} was ahead of the table when it was copied again (changelog at {logged}, table at {}), so the difference the copy made cannot be recorded exactly: drop the changelog table (in your catalog) and it starts over from the table's rows",
            prior_lsn.unwrap_or_default()
        )));
    }
    Ok(Some(Copied { before }))
}

/// Whether the table's current columns are those of its snapshot `before` (the same field
/// ids under the same names): a copy that gave the table new columns (fresh field ids) has
/// no row-by-row difference with the rows before it.
pub(super) fn same_fields(table: &Table, before: i64) -> bool {
    let meta = table.metadata();
    let Some(earlier) = meta
        .snapshot_by_id(before)
        .and_then(|s| s.schema_id())
        .and_then(|id| meta.schema_by_id(id))
    else {
        return false;
    };
    let current = meta.current_schema();
    let key_ids: Vec<i32> = current.identifier_field_ids().collect();
    current.as_struct().fields().iter().all(|f| {
        match earlier
            .as_struct()
            .fields()
            .iter()
            .find(|e| e.name == f.name)
        {
            Some(e) => e.id == f.id,
            // A column added since: its earlier rows read NULL; a key column must be there.
            None => !key_ids.contains(&f.id),
        }
    }) && earlier.identifier_field_ids().collect::<Vec<_>>() == key_ids
}

impl TableSink {
    /// Writes, as change rows of `log` (the changelog) at `lsn` and source commit time
    /// `time` (Postgres epoch), the difference between the rows of `before` (this table at
    /// an earlier snapshot, read in the current schema) and the table's live rows: an
    /// `insert` per row only the copy has, an `update` (the new values) per key whose row
    /// changed, and a `delete` (the row as it was) per key the copy no longer has. Keys are
    /// compared as the key index compares them; the rows, every column by field id. A
    /// table without a primary key records a changed row as a delete and an insert.
    /// Returns the files written and how many rows they hold.
    pub(super) async fn copy_difference(
        &mut self,
        before: Table,
        log: &Table,
        lsn: Lsn,
        time: i64,
    ) -> Result<(Vec<DataFile>, i64)> {
        self.ensure_index().await?;
        // The earlier rows' index moves to disk beyond the same budget as the table's own.
        let mut earlier = TableSink::load(self.source.clone(), before, self.index.spill()).await?;
        earlier.build_index().await?;
        let mut locs = Vec::new();
        self.for_each_loc(|l| locs.push(l))?;
        locs.sort_unstable_by_key(|l| (l.file, l.pos));
        let target = crate::table::schema::arrow_schema(log)?;
        let name = format!("changelog-{}", uuid::Uuid::now_v7().simple());
        let mut w = TableWriter::new(log, name, u64::MAX / 4).await?;
        let fields = self
            .arrow
            .fields()
            .iter()
            .map(|f| SortField::new(f.data_type().clone()))
            .collect();
        let rows = RowConverter::new(fields)?;
        let mut seq = 0i64;
        let emit = |values: &RecordBatch, ops: &[ChangeOp], seq: &mut i64| {
            let meta = ops
                .iter()
                .enumerate()
                .map(|(i, op)| (*op, lsn, time, *seq + i as i64));
            let batch = changelog::batch(values, &target, meta);
            *seq += ops.len() as i64;
            batch
        };
        for chunk in locs.chunks(DIFF_ROWS) {
            let now = self.read_rows(chunk).await?;
            let key_cols: Vec<ArrayRef> = self
                .keys
                .columns()
                .iter()
                .map(|i| now.column(*i).clone())
                .collect();
            let (mut fresh, mut matched, mut partners) = (Vec::new(), Vec::new(), Vec::new());
            for row in 0..now.num_rows() {
                let partner = match self.keys.encoder().from_arrays(&key_cols, row) {
                    Some(key) => earlier.take_indexed(&key)?,
                    None => None,
                };
                match partner {
                    Some(loc) => {
                        matched.push(row as u32);
                        partners.push(loc);
                    }
                    None => fresh.push(row as u32),
                }
            }
            let mut changed = Vec::new();
            let mut gone = Vec::new();
            if !matched.is_empty() {
                // Read in the table's current schema (by field id, see `same_fields`).
                let was = earlier.read_rows(&partners).await?;
                let is = pick(&now, &matched)?;
                let (a, b) = (
                    rows.convert_columns(was.columns())?,
                    rows.convert_columns(is.columns())?,
                );
                for (j, row) in matched.iter().enumerate() {
                    if a.row(j) != b.row(j) {
                        changed.push(*row);
                        gone.push(j as u32);
                    }
                }
                if !self.keyed && !gone.is_empty() {
                    // Without a key, a changed row is another row: the old one leaves.
                    let old = pick(&was, &gone)?;
                    w.write(emit(&old, &vec![ChangeOp::Delete; gone.len()], &mut seq)?)
                        .await?;
                }
            }
            if !changed.is_empty() {
                let op = if self.keyed {
                    ChangeOp::Update
                } else {
                    ChangeOp::Insert
                };
                let values = pick(&now, &changed)?;
                w.write(emit(&values, &vec![op; changed.len()], &mut seq)?)
                    .await?;
            }
            if !fresh.is_empty() {
                let values = pick(&now, &fresh)?;
                w.write(emit(
                    &values,
                    &vec![ChangeOp::Insert; fresh.len()],
                    &mut seq,
                )?)
                .await?;
            }
        }
        // What the copy no longer has.
        let mut left = Vec::new();
        earlier.for_each_loc(|l| left.push(l))?;
        left.sort_unstable_by_key(|l| (l.file, l.pos));
        for chunk in left.chunks(DIFF_ROWS) {
            let old = earlier.read_rows(chunk).await?;
            w.write(emit(&old, &vec![ChangeOp::Delete; chunk.len()], &mut seq)?)
                .await?;
        }
        let (files, _) = w.close().await?;
        Ok((files, seq))
    }

    /// Takes the live row of `key` out of the index (one of its copies, for a table keyed by
    /// the whole row), if there is one.
    fn take_indexed(&mut self, key: &Key) -> Result<Option<Loc>> {
        if let Some(loc) = self.extra.get_mut(key).and_then(Vec::pop) {
            return Ok(Some(loc));
        }
        self.index.remove(key)
    }
}

/// Rows `idx` of `batch`, in that order.
fn pick(batch: &RecordBatch, idx: &[u32]) -> Result<RecordBatch> {
    Ok(arrow::compute::take_record_batch(
        batch,
        &UInt32Array::from(idx.to_vec()),
    )?)
}
