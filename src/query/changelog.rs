//! Queries, changelog tables live: a changelog table (`pipelines.<p>.tables.<t>.changelog`)
//! as its committed change rows UNION the change rows its table's changes still in the WAL
//! will become, made as the sink makes them (`sink/iceberg/apply/changelog.rs`): one row per
//! change in (commit LSN, order) order, values an update left unchanged filled from the
//! previous version, a key change as a delete and an insert, a TRUNCATE as a delete of every
//! row. So a query sees the same rows before and after the commit round that writes them.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{new_null_array, Array, ArrayRef, RecordBatch};
use datafusion::datasource::TableProvider;
use iceberg::table::Table;

use super::live::{CommittedRows, LiveTable};
use super::tail::walk::Walk;
use super::tail::TailSnapshot;
use super::tail_schema::TableShape;
use super::view::ViewHandle;
use super::wal_read::WalRead;
use super::{TableEntry, Workspace};
use crate::change::{Datum, Lsn};
use crate::error::{Error, Result};
use crate::table::apply::{Committed, Pending};
use crate::table::changelog::{self, ChangeOp};
use crate::table::keys::Key;
use crate::table::schema as ice_schema;
use crate::wal::Op;

/// One change row of the tail.
struct Row {
    op: ChangeOp,
    /// In the table's live column order; `Unchanged` where an update left a value that
    /// `fill_from` holds.
    values: Vec<Datum>,
    /// The committed row of the table holding the values an update left unchanged.
    fill_from: Option<Key>,
    txn: Txn,
}

/// The transaction of a change row.
#[derive(Clone, Copy)]
struct Txn {
    commit_lsn: Lsn,
    /// Source commit time, Postgres epoch.
    time: i64,
    /// Counts the transactions of the tail: the change order restarts with each.
    n: usize,
}

/// A TRUNCATE's deletes of the table's committed rows, placed before row `at`: every
/// committed row except the copies the tail had already replaced or deleted (`replaced`:
/// key -> copies, `u32::MAX` for all); none after an earlier TRUNCATE of the tail.
struct Truncate {
    at: usize,
    replaced: Option<HashMap<Key, u32>>,
    txn: Txn,
}

/// The change rows of a table's tail, before the committed rows they need are read.
pub(crate) struct ChangeTail {
    rows: Vec<Row>,
    truncates: Vec<Truncate>,
}

impl ChangeTail {
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty() && self.truncates.is_empty()
    }
}

/// The committed rows as the live changelog sees them: like the live tail ([`super::tail`]),
/// it counts the copies of each key the tail replaced or deleted, and names the committed
/// row of that key as the place of the values an update left unchanged; after a TRUNCATE
/// in the tail (`replaced` is `None`) no committed row holds anything.
struct Replacing<'a> {
    replaced: &'a mut Option<HashMap<Key, u32>>,
}

impl Committed for Replacing<'_> {
    type Place = Option<Key>;

    fn remove(&mut self, key: &Key, _row: &[Datum], all: bool) -> Result<Option<Option<Key>>> {
        let Some(r) = self.replaced.as_mut() else {
            return Ok(Some(None));
        };
        let n = r.entry(key.clone()).or_insert(0);
        *n = if all { u32::MAX } else { n.saturating_add(1) };
        Ok(Some(Some(key.clone())))
    }
}

/// The change rows of `shape`'s table in the transactions of `read` after its changelog's
/// LSN (`log_floor`) and up to `through`. Changes after the table's own LSN (`state_floor`)
/// are followed to know each row's previous version. A change the changelog lacks although
/// the table holds it (the changelog is behind: only after a re-snapshot) is refused, as
/// the sink refuses it.
pub(crate) fn changes(
    shape: &TableShape,
    read: &WalRead,
    state_floor: Lsn,
    log_floor: Lsn,
    through: Lsn,
) -> Result<ChangeTail> {
    let walk = Walk::new(shape);
    let keyed = !shape.key.is_empty();
    let mut pending: Pending<Option<Key>> = Pending::new(keyed);
    // Committed rows the tail replaced or deleted; None once the tail truncated the table.
    let mut replaced: Option<HashMap<Key, u32>> = Some(HashMap::new());
    let mut out = ChangeTail {
        rows: Vec::new(),
        truncates: Vec::new(),
    };
    let mut txn: Option<(Lsn, Txn)> = None;
    walk.each(read, state_floor.min(log_floor), through, |step| {
        let t = match txn {
            Some((end, t)) if end == step.txn.end_lsn => t,
            _ => {
                let t = Txn {
                    commit_lsn: step.txn.commit_lsn,
                    time: step.txn.commit_time_micros,
                    n: txn.map_or(0, |(_, t)| t.n + 1),
                };
                txn = Some((step.txn.end_lsn, t));
                t
            }
        };
        let log = step.txn.end_lsn > log_floor;
        if log && step.txn.end_lsn <= state_floor {
            return Err(Error::query(format!(
                "the changelog of {} is behind the table's own commits; run `skipprd sync --resnapshot`",
                shape.source
            )));
        }
        let emit = |out: &mut ChangeTail, op: ChangeOp, values: Vec<Datum>, fill_from| {
            if log {
                out.rows.push(Row {
                    op,
                    values,
                    fill_from,
                    txn: t,
                });
            }
        };
        let mut committed = Replacing {
            replaced: &mut replaced,
        };
        match step.op {
            Op::Relation => {}
            Op::Truncate => {
                if log {
                    out.truncates.push(Truncate {
                        at: out.rows.len(),
                        replaced: committed.replaced.clone(),
                        txn: t,
                    });
                }
                for v in pending.take() {
                    emit(&mut out, ChangeOp::Delete, v.values, v.previous.flatten());
                }
                *committed.replaced = None;
            }
            Op::Insert => {
                let row = step.new.unwrap_or_default();
                let key = walk.key_of(&row)?;
                let row = pending.insert(&mut committed, key, row)?;
                emit(&mut out, ChangeOp::Insert, row.values.clone(), None);
            }
            Op::Delete => {
                let old = step.old.unwrap_or_default();
                let key = walk.key_of(&old)?;
                pending.delete(&mut committed, &key, &old)?;
                emit(&mut out, ChangeOp::Delete, old, None);
            }
            Op::Update => {
                let mut row = step.new.unwrap_or_default();
                let (old_key, new_key) = walk.keys.update_keys(&mut row, step.old.as_deref())?;
                let moved = old_key != new_key;
                let updated =
                    pending.update(&mut committed, &old_key, step.old.as_deref(), new_key, row)?;
                // The tail's committed rows always answer: an update always lands.
                let Some(updated) = updated else {
                    return Ok(());
                };
                let values = updated.values.clone();
                let fill_from = updated.previous.clone().flatten();
                match step.old {
                    // A row that changes its key (or a row without a key, which is its whole
                    // content) is a delete and an insert, as the sink writes it.
                    Some(old) if moved || !keyed => {
                        emit(&mut out, ChangeOp::Delete, old, None);
                        emit(&mut out, ChangeOp::Insert, values, fill_from);
                    }
                    _ => emit(&mut out, ChangeOp::Update, values, fill_from),
                }
            }
        }
        Ok(())
    })?;
    Ok(out)
}

/// The change rows of `tail` as rows of the changelog (`log_schema`): values left
/// unchanged read from the table's committed rows (`state`), a TRUNCATE's deletes of them
/// too, each row's order in its transaction counted as the sink counts it.
pub(crate) async fn materialize(
    tail: ChangeTail,
    shape: &TableShape,
    state: &Table,
    log_schema: &arrow::datatypes::SchemaRef,
) -> Result<Option<RecordBatch>> {
    if tail.is_empty() {
        return Ok(None);
    }
    // A delete row holds the old key only: every column may be NULL in a changelog.
    let shape = &TableShape {
        schema: nullable(&shape.schema),
        ..shape.clone()
    };
    let walk = Walk::new(shape);
    let (values, unchanged) = walk.batch(tail.rows.iter().map(|r| r.values.as_slice()))?;
    let mut fill = Vec::new();
    for (i, (row, cols)) in tail.rows.iter().zip(unchanged).enumerate() {
        if cols.is_empty() {
            continue;
        }
        let Some(from) = &row.fill_from else {
            return Err(Error::fatal(format!(
                "table {}: an update left a large (TOAST) value unchanged, but the previous version of the row is not known; run `skipprd sync --resnapshot`",
                shape.source
            )));
        };
        fill.push((i, from.clone(), cols));
    }
    let whole = tail.truncates.iter().any(|t| t.replaced.is_some());
    let committed = if fill.is_empty() && !whole {
        None
    } else {
        let wanted: std::collections::HashSet<&Key> = fill.iter().map(|(_, k, _)| k).collect();
        Some(
            CommittedRows::read(state, &shape.schema, walk.keys.columns(), |k| {
                whole || wanted.contains(k)
            })
            .await?,
        )
    };
    let values = match &committed {
        Some(c) if !fill.is_empty() => c.fill(state, &values, &fill)?,
        _ => values,
    };
    // The committed rows in the live schema (columns the tail adds are NULL there).
    let committed: Vec<RecordBatch> = match committed {
        Some(c) if whole => c
            .batches
            .iter()
            .map(|b| in_schema(b, &shape.schema))
            .collect::<Result<_>>()?,
        _ => Vec::new(),
    };
    // The output, in order: (source batch, row) and the change it is.
    let encoder = walk.keys.encoder();
    let mut order: Vec<(usize, usize)> = Vec::new();
    let mut meta: Vec<(ChangeOp, Txn)> = Vec::new();
    let mut truncates = tail.truncates.into_iter().peekable();
    for r in 0..=tail.rows.len() {
        while let Some(t) = truncates.next_if(|t| t.at == r) {
            let Some(mut replaced) = t.replaced else {
                continue;
            };
            for (b, batch) in committed.iter().enumerate() {
                let keys: Vec<ArrayRef> = walk
                    .keys
                    .columns()
                    .iter()
                    .map(|i| batch.column(*i).clone())
                    .collect();
                for row in 0..batch.num_rows() {
                    if let Some(n) = encoder
                        .from_arrays(&keys, row)
                        .and_then(|k| replaced.get_mut(&k))
                        .filter(|n| **n > 0)
                    {
                        if *n != u32::MAX {
                            *n -= 1;
                        }
                        continue;
                    }
                    order.push((b + 1, row));
                    meta.push((ChangeOp::Delete, t.txn));
                }
            }
        }
        if let Some(row) = tail.rows.get(r) {
            order.push((0, r));
            meta.push((row.op, row.txn));
        }
    }
    let sources: Vec<&RecordBatch> = std::iter::once(&values).chain(committed.iter()).collect();
    let columns = (0..values.num_columns())
        .map(|c| {
            let parts: Vec<&dyn Array> = sources.iter().map(|b| b.column(c).as_ref()).collect();
            arrow::compute::interleave(&parts, &order)
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let values = RecordBatch::try_new(values.schema(), columns)?;
    // Each change's order inside its transaction, from 0.
    let mut seq = 0i64;
    let mut last = None;
    let meta = meta.into_iter().map(|(op, t)| {
        if last != Some(t.n) {
            last = Some(t.n);
            seq = 0;
        }
        seq += 1;
        (op, t.commit_lsn, t.time, seq - 1)
    });
    Ok(Some(changelog::batch(&values, log_schema, meta)?))
}

/// A changelog's schema `log` with the schema changes its table's live schema `state` has
/// (see `tail_schema::extend`): a column it lacks added at the end, as its next commit adds
/// it, and a type widened in place.
fn live_schema(
    log: &arrow::datatypes::SchemaRef,
    state: &arrow::datatypes::SchemaRef,
) -> arrow::datatypes::SchemaRef {
    let mut fields: Vec<arrow::datatypes::Field> =
        log.fields().iter().map(|f| f.as_ref().clone()).collect();
    for f in state.fields() {
        match fields.iter_mut().find(|l| l.name() == f.name()) {
            Some(l) if l.data_type() != f.data_type() => {
                *l = l.clone().with_data_type(f.data_type().clone());
            }
            Some(_) => {}
            None => fields.push(arrow::datatypes::Field::new(
                f.name(),
                f.data_type().clone(),
                true,
            )),
        }
    }
    Arc::new(arrow::datatypes::Schema::new_with_metadata(
        fields,
        log.metadata().clone(),
    ))
}

/// `batch` (a committed read) with the columns of `schema`: by position, cast where the
/// live type is wider, NULL for columns it lacks.
fn in_schema(batch: &RecordBatch, schema: &arrow::datatypes::SchemaRef) -> Result<RecordBatch> {
    let columns = schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| match batch.columns().get(i) {
            Some(c) if c.data_type() == f.data_type() => Ok(c.clone()),
            Some(c) => arrow::compute::cast(c, f.data_type()).map_err(Error::from),
            None => Ok(new_null_array(f.data_type(), batch.num_rows())),
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new_with_options(
        nullable(schema),
        columns,
        &arrow::array::RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
    )?)
}

/// `schema` with every field nullable.
fn nullable(schema: &arrow::datatypes::SchemaRef) -> arrow::datatypes::SchemaRef {
    Arc::new(arrow::datatypes::Schema::new_with_metadata(
        schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect::<Vec<_>>(),
        schema.metadata().clone(),
    ))
}

impl Workspace {
    /// The changelog table `name` (of the table `entry` names) live in the statement's read
    /// view: its committed rows and the change rows of its table's tail.
    pub(super) async fn live_changelog(
        &self,
        name: &str,
        entry: &TableEntry,
        views: &ViewHandle,
    ) -> Result<Option<Arc<dyn TableProvider>>> {
        let Some((pipeline, _, source)) = &entry.pipeline else {
            return Ok(None);
        };
        let view = views.view(self, pipeline).await?;
        if let Some(reason) = view.refused.get(name) {
            return Err(Error::query(reason.clone()));
        }
        let Some(log) = view.tables.get(name) else {
            return Ok(None);
        };
        let mut log_schema = ice_schema::arrow_schema(log)?;
        let log_floor = crate::table::summary::committed_lsn(log).unwrap_or_default();
        let rows = match view.tables.get(&source.iceberg_name()) {
            Some(state) => {
                let base = self.shape(state)?;
                let mut shape = TableShape {
                    source: source.clone(),
                    ..(*base).clone()
                };
                super::tail_schema::extend(&mut shape, &view.read);
                if !shape.tail_columns.is_empty() {
                    // The table's columns changed in the tail: the changelog takes the same
                    // change at its next commit, and reads with it now.
                    log_schema = live_schema(&log_schema, &shape.schema);
                }
                let state_floor = crate::table::summary::committed_lsn(state).unwrap_or_default();
                let through = view.lsn.max(state_floor).max(log_floor);
                let tail = changes(&shape, &view.read, state_floor, log_floor, through)?;
                materialize(tail, &shape, state, &log_schema).await?
            }
            None => None,
        };
        let tail = TailSnapshot {
            floor: log_floor,
            schema: log_schema,
            hidden: Default::default(),
            changes: rows.as_ref().map_or(0, |r| r.num_rows() as u64),
            rows,
            fill: Vec::new(),
            oldest_commit_micros: None,
            wal_lsn: view.lsn,
        };
        let table = LiveTable::new(
            log,
            Vec::new(),
            false,
            Arc::new(tail),
            self.scan_caches.clone(),
        )
        .await?;
        Ok(Some(Arc::new(table)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query::tail::tests::{change, read, shape, t};

    /// (op, id, txn, fill_from set) of each row.
    fn rows(tail: &ChangeTail) -> Vec<(ChangeOp, String, usize, bool)> {
        tail.rows
            .iter()
            .map(|r| {
                let id = match &r.values[0] {
                    Datum::Text(b) => String::from_utf8_lossy(b).to_string(),
                    _ => "NULL".into(),
                };
                (r.op, id, r.txn.n, r.fill_from.is_some())
            })
            .collect()
    }

    #[test]
    fn each_change_is_a_row_and_a_key_change_a_delete_and_an_insert() -> Result<()> {
        let r = read(vec![
            vec![
                change(Op::Insert, None, Some(vec![t("1"), t("a")])),
                change(Op::Delete, Some(vec![t("1"), Datum::Null]), None),
                change(Op::Update, None, Some(vec![t("2"), Datum::Unchanged])),
            ],
            vec![
                change(
                    Op::Update,
                    Some(vec![t("2"), Datum::Null]),
                    Some(vec![t("3"), Datum::Unchanged]),
                ),
                change(Op::Update, None, Some(vec![t("3"), t("c")])),
            ],
        ]);
        let tail = changes(&shape(true), &r, Lsn(0), Lsn(0), Lsn(u64::MAX))?;
        use ChangeOp::*;
        assert_eq!(
            rows(&tail),
            vec![
                (Insert, "1".into(), 0, false),
                (Delete, "1".into(), 0, false),
                // Its unchanged value is the committed row's of key 2.
                (Update, "2".into(), 0, true),
                (Delete, "2".into(), 1, false),
                // Still the committed row's, through the tail's version of key 2.
                (Insert, "3".into(), 1, true),
                (Update, "3".into(), 1, false),
            ]
        );
        Ok(())
    }

    #[test]
    fn only_transactions_after_the_changelogs_lsn_are_rows() -> Result<()> {
        let r = read(vec![
            vec![change(Op::Insert, None, Some(vec![t("1"), t("a")]))],
            vec![change(
                Op::Update,
                None,
                Some(vec![t("1"), Datum::Unchanged]),
            )],
        ]);
        // The changelog holds the first transaction (LSN 100), the table neither.
        let tail = changes(&shape(true), &r, Lsn(0), Lsn(100), Lsn(u64::MAX))?;
        assert_eq!(rows(&tail), vec![(ChangeOp::Update, "1".into(), 1, false)]);
        assert!(
            matches!(&tail.rows[0].values[1], Datum::Text(v) if v.as_ref() == b"a"),
            "the unchanged value comes from the tail's version the changelog already holds"
        );
        Ok(())
    }

    #[test]
    fn a_changelog_behind_its_table_is_refused() {
        let r = read(vec![
            vec![change(Op::Insert, None, Some(vec![t("1"), t("a")]))],
            vec![change(Op::Insert, None, Some(vec![t("2"), t("b")]))],
        ]);
        // The table holds LSN 110, the changelog only 100: the change at 110 is missing.
        let err = changes(&shape(true), &r, Lsn(110), Lsn(100), Lsn(u64::MAX))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("is behind") && err.contains("--resnapshot"),
            "{err}"
        );
    }

    #[test]
    fn a_truncate_deletes_the_committed_rows_the_tail_kept_then_its_own() -> Result<()> {
        let r = read(vec![vec![
            change(Op::Delete, Some(vec![t("5"), Datum::Null]), None),
            change(Op::Insert, None, Some(vec![t("7"), t("x")])),
            change(Op::Truncate, None, None),
            change(Op::Insert, None, Some(vec![t("8"), t("y")])),
        ]]);
        let tail = changes(&shape(true), &r, Lsn(0), Lsn(0), Lsn(u64::MAX))?;
        use ChangeOp::*;
        assert_eq!(
            rows(&tail),
            vec![
                (Delete, "5".into(), 0, false),
                (Insert, "7".into(), 0, false),
                (Delete, "7".into(), 0, false),
                (Insert, "8".into(), 0, false),
            ]
        );
        let [truncate] = tail.truncates.as_slice() else {
            panic!("one truncate expected");
        };
        assert_eq!(truncate.at, 2, "the committed rows' deletes come first");
        let replaced = truncate.replaced.as_ref().map(|r| r.len());
        assert_eq!(
            replaced,
            Some(2),
            "keys 5 and 7 are no committed rows to delete"
        );
        Ok(())
    }
}
