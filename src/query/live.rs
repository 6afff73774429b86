//! Queries, the live table: one Iceberg snapshot UNION the WAL tail after it, merged by
//! primary key. Committed rows the tail replaces are hidden, the tail's newest rows are added,
//! and filters and projections reach both sides.

use std::any::Any;
use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BooleanArray, RecordBatch};
use arrow::compute::filter_record_batch;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::common::DFSchema;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::logical_expr::expr_rewriter::unnormalize_col;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_expr::{conjunction, PhysicalExpr};
use datafusion::physical_optimizer::pruning::PruningPredicate;
use datafusion::physical_plan::union::UnionExec;
use datafusion::physical_plan::ExecutionPlan;
use futures::StreamExt;
use iceberg::table::Table;

use super::committed::{iceberg_predicate, CommittedScan, Hide, ScanCaches, ScanFilter};
use super::hidden::HiddenSet;
use super::tail::TailSnapshot;
use crate::error::{Context, Result};
use crate::table::keys::{Key, KeyEncoder};
use crate::table::schema as ice_schema;
use crate::table::SourceColumn;

/// A replicated table as queries see it: committed snapshot plus WAL tail.
#[derive(Debug)]
pub struct LiveTable {
    schema: SchemaRef,
    key_cols: Vec<usize>,
    keyed: bool,
    table: Table,
    tail: Arc<TailSnapshot>,
    caches: Arc<ScanCaches>,
    /// The live schema has columns (or wider types) the committed table does not have yet.
    extended: bool,
}

impl LiveTable {
    /// Builds the live view of `table` (already loaded) with its reduced tail.
    pub async fn new(
        table: &Table,
        key_cols: Vec<usize>,
        keyed: bool,
        tail: Arc<TailSnapshot>,
        caches: Arc<ScanCaches>,
    ) -> Result<Self> {
        // The tail may show columns the committed table does not have yet (see
        // `tail_schema`): then the live schema is the tail's.
        let committed = ice_schema::arrow_schema(table)?;
        let extended = committed.fields().len() != tail.schema.fields().len()
            || committed
                .fields()
                .iter()
                .zip(tail.schema.fields())
                .any(|(a, b)| a.name() != b.name() || a.data_type() != b.data_type());
        let base = if extended {
            tail.schema.clone()
        } else {
            committed
        };
        Ok(Self {
            schema: with_pg_types(&base, table),
            extended,
            table: table.clone(),
            key_cols,
            keyed,
            tail,
            caches,
        })
    }

    /// A table with no tail (a model the gateway built): its committed rows only.
    pub async fn committed(table: &Table, caches: Arc<ScanCaches>) -> Result<Self> {
        let tail = TailSnapshot {
            floor: Default::default(),
            schema: ice_schema::arrow_schema(table)?,
            hidden: Default::default(),
            rows: None,
            fill: Vec::new(),
            changes: 0,
            oldest_commit_micros: None,
            wal_lsn: Default::default(),
        };
        Self::new(table, Vec::new(), false, Arc::new(tail), caches).await
    }

    /// The live table's columns (the tail's, when it has columns the committed table lacks).
    pub fn schema_ref(&self) -> &SchemaRef {
        &self.schema
    }

    /// The primary key's columns, for a table keyed by one (not one keyed by the whole row).
    pub fn key_columns(&self) -> Option<&[usize]> {
        (self.keyed && !self.key_cols.is_empty()).then_some(self.key_cols.as_slice())
    }

    /// The tail's rows, with values left unchanged by an update read from Iceberg (only
    /// when a query scans the table, never for catalog lookups).
    async fn rows(&self) -> Result<Option<RecordBatch>> {
        match (&self.tail.rows, self.tail.fill.is_empty()) {
            (Some(batch), false) => Ok(Some(
                fill_unchanged(&self.table, &self.schema, &self.key_cols, batch, &self.tail)
                    .await?,
            )),
            (rows, _) => Ok(rows.clone()),
        }
    }
}

/// Field metadata naming the Postgres type of a column whose Arrow type does not say it
/// (`json`, `jsonb`): the gateway sends such columns with that type.
pub const PG_TYPE_META: &str = "skippr.pg_type";

/// Field metadata holding the Postgres type the source declared for a column, as
/// `<oid>:<typmod>`: a model made with `CREATE TABLE AS` from the column records it, so the
/// catalog reports the model's column as Postgres would (`smallint`, `varchar(20)`).
pub const PG_DECLARED_META: &str = "skippr.pg_declared";

/// The table's schema with [`PG_TYPE_META`] on its json and jsonb columns and
/// [`PG_DECLARED_META`] on every column, as the source declared them (`skippr.columns`).
fn with_pg_types(schema: &SchemaRef, table: &Table) -> SchemaRef {
    let recorded: Vec<SourceColumn> =
        crate::table::source_columns(table.metadata().properties()).unwrap_or_default();
    let mut changed = false;
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| {
            let Some(column) = recorded.iter().find(|c| c.target() == f.name()) else {
                return f.as_ref().clone();
            };
            changed = true;
            let mut meta = f.metadata().clone();
            meta.insert(
                PG_DECLARED_META.to_string(),
                format!("{}:{}", column.oid, column.typmod),
            );
            let json = match column.oid {
                114 => Some("json"),
                3802 => Some("jsonb"),
                _ => None,
            };
            if let Some(n) = json.filter(|_| f.data_type() == &DataType::Utf8) {
                meta.insert(PG_TYPE_META.to_string(), n.to_string());
            }
            f.as_ref().clone().with_metadata(meta)
        })
        .collect();
    if !changed {
        return schema.clone();
    }
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// Values an update left unchanged (large TOAST values) are read from the committed row.
async fn fill_unchanged(
    table: &Table,
    schema: &SchemaRef,
    key_cols: &[usize],
    batch: &RecordBatch,
    tail: &TailSnapshot,
) -> Result<RecordBatch> {
    let wanted: std::collections::HashSet<&Key> = tail.fill.iter().map(|(_, k, _)| k).collect();
    let committed = CommittedRows::read(table, schema, key_cols, |k| wanted.contains(k)).await?;
    committed.fill(table, batch, &tail.fill)
}

/// Committed rows of a table read in full (the rows of the keys asked for, or all of them),
/// found by key: what the tail's values left unchanged are filled from, and what a TRUNCATE
/// in a changelog's tail deletes.
pub(super) struct CommittedRows {
    pub batches: Vec<RecordBatch>,
    /// Key -> (batch, row) of each row kept.
    pub found: HashMap<Key, (usize, usize)>,
}

impl CommittedRows {
    /// Reads the committed rows of `table` whose key (`key_cols` of `schema`) `want` keeps.
    pub async fn read(
        table: &Table,
        schema: &SchemaRef,
        key_cols: &[usize],
        want: impl Fn(&Key) -> bool,
    ) -> Result<Self> {
        let encoder = KeyEncoder::new(
            key_cols
                .iter()
                .map(|i| schema.field(*i).data_type().clone())
                .collect(),
        );
        let mut found: HashMap<Key, (usize, usize)> = HashMap::new();
        let mut batches: Vec<RecordBatch> = Vec::new();
        let stream = table
            .scan()
            .build()
            .context("planning a read of the committed rows")?
            .to_arrow()
            .await
            .context("reading the committed rows")?;
        let mut stream = Box::pin(stream);
        while let Some(b) = stream.next().await {
            let b = b.context("reading the committed rows")?;
            // Keys in the live types (a key column the tail widened is read wider).
            let cols = key_cols
                .iter()
                .map(|i| {
                    let (c, t) = (b.column(*i), schema.field(*i).data_type());
                    if c.data_type() == t {
                        Ok(c.clone())
                    } else {
                        arrow::compute::cast(c, t)
                    }
                })
                .collect::<std::result::Result<Vec<ArrayRef>, _>>()?;
            let mut keep = false;
            for row in 0..b.num_rows() {
                if let Some(k) = encoder.from_arrays(&cols, row) {
                    if want(&k) {
                        found.insert(k, (batches.len(), row));
                        keep = true;
                    }
                }
            }
            if keep {
                batches.push(b);
            }
        }
        Ok(Self { batches, found })
    }

    /// `batch` with the values `fill` lists (row, key of the committed row, columns) taken
    /// from the committed rows.
    pub fn fill(
        &self,
        table: &Table,
        batch: &RecordBatch,
        fill: &[(usize, Key, Vec<usize>)],
    ) -> Result<RecordBatch> {
        let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
        for (c, col) in columns.iter_mut().enumerate() {
            let sources: Vec<(usize, &Key)> = fill
                .iter()
                .filter(|(_, _, cols)| cols.contains(&c))
                .map(|(r, k, _)| (*r, k))
                .collect();
            if sources.is_empty() {
                continue;
            }
            let mut parts: Vec<ArrayRef> = vec![col.clone()];
            let mut indices: Vec<(usize, usize)> = (0..batch.num_rows()).map(|r| (0, r)).collect();
            for (r, k) in sources {
                let Some((b, row)) = self.found.get(k) else {
                    return Err(crate::error::Error::fatal(format!(
                        "table {}: an update left a large (TOAST) value unchanged, but the previous version of the row is not in Iceberg; run `skipprd sync --resnapshot`",
                        table.identifier()
                    )));
                };
                // A column the tail adds has no committed value: it stays NULL.
                if c >= self.batches[*b].num_columns() {
                    continue;
                }
                let value = self.batches[*b].column(c).slice(*row, 1);
                let value = if value.data_type() == col.data_type() {
                    value
                } else {
                    arrow::compute::cast(&value, col.data_type())?
                };
                indices[r] = (parts.len(), 0);
                parts.push(value);
            }
            let refs: Vec<&dyn Array> = parts.iter().map(|a| a.as_ref()).collect();
            *col = arrow::compute::interleave(&refs, &indices)?;
        }
        Ok(RecordBatch::try_new(batch.schema(), columns)?)
    }
}

#[async_trait]
impl TableProvider for LiveTable {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DfResult<Vec<TableProviderFilterPushDown>> {
        Ok(filters
            .iter()
            .map(|f| {
                if applied_exactly(&self.schema, f) {
                    TableProviderFilterPushDown::Exact
                } else {
                    TableProviderFilterPushDown::Inexact
                }
            })
            .collect())
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let hidden = &self.tail.hidden;
        let rows = self
            .rows()
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        let wanted: Vec<usize> = match projection {
            Some(p) => p.clone(),
            None => (0..self.schema.fields().len()).collect(),
        };
        // The committed side: our reader (parallel, hides by position, skips files, row
        // groups and rows by the filters, fills columns older files lack with NULLs).
        let mut inputs: Vec<Arc<dyn ExecutionPlan>> = Vec::new();
        if !hidden.all {
            let hide = if hidden.is_empty() {
                Hide::None
            } else {
                // A bitmap is only read, so all statements on this tail share one; a set of
                // keys counts down the copies it hid, so each scan gets its own.
                let shared = hidden.shared.get_or_init(|| {
                    HiddenSet::bitmap(&self.tail.hidden, &self.schema, &self.key_cols, self.keyed)
                        .map(Arc::new)
                });
                match shared {
                    Some(set) => Hide::Positions(set.clone()),
                    None => Hide::Keys(Arc::new(HiddenSet::keys(
                        &self.tail.hidden,
                        &self.schema,
                        &self.key_cols,
                    ))),
                }
            };
            let limit = if filters.is_empty() && hidden.is_empty() {
                limit
            } else {
                None
            };
            inputs.push(Arc::new(
                CommittedScan::plan(
                    &self.table,
                    self.schema.clone(),
                    wanted.clone(),
                    self.key_cols.clone(),
                    hide,
                    limit,
                    scan_filter(state, &self.schema, &self.key_cols, filters, self.extended)?,
                    state.config().target_partitions(),
                    self.caches.clone(),
                )
                .await?,
            ));
        }
        if let Some(rows) = rows.as_ref().filter(|b| b.num_rows() > 0) {
            let rows = filter_tail(state, &self.schema, rows, filters, |f| {
                applied_exactly(&self.schema, f)
            })?;
            let projected = rows.project(&wanted)?;
            let schema = projected.schema();
            inputs.push(MemorySourceConfig::try_new_exec(
                &[vec![projected]],
                schema,
                None,
            )?);
        }
        match inputs.len() {
            0 => {
                let schema = Arc::new(self.schema.project(&wanted)?);
                Ok(MemorySourceConfig::try_new_exec(&[vec![]], schema, None)?)
            }
            1 => Ok(inputs.remove(0)),
            _ => UnionExec::try_new(inputs),
        }
    }
}

/// Whether the live scan applies `filter` itself to every row it returns, so that
/// DataFusion need not filter again above it (`Exact` pushdown): a deterministic filter over
/// the table's own columns that compiles without the session (no parameter left unbound,
/// no subquery). The committed reader and the tail then evaluate it strictly (an error is
/// the statement's error, not a row kept).
fn applied_exactly(schema: &SchemaRef, filter: &Expr) -> bool {
    if filter.is_volatile() {
        return false;
    }
    let expr = unnormalize_col(filter.clone());
    let refs = expr.column_refs();
    if refs.is_empty() || refs.iter().any(|c| schema.index_of(&c.name).is_err()) {
        return false;
    }
    let Ok(df_schema) = DFSchema::try_from(schema.as_ref().clone()) else {
        return false;
    };
    datafusion::physical_expr::create_physical_expr(
        &expr,
        &df_schema,
        &datafusion::execution::context::ExecutionProps::new(),
    )
    .is_ok()
}

/// The pushed-down filters in the forms the committed reader skips data with; `None` when
/// none of them can be evaluated on the table's columns alone. When some were pushed down
/// `Exact` ([`applied_exactly`]), the filter is strict: the reader returns only rows they
/// keep.
pub(super) fn scan_filter(
    state: &dyn Session,
    schema: &SchemaRef,
    key_cols: &[usize],
    filters: &[Expr],
    extended: bool,
) -> DfResult<Option<ScanFilter>> {
    if filters.is_empty() {
        return Ok(None);
    }
    let strict = filters.iter().any(|f| applied_exactly(schema, f));
    let exprs: Vec<Expr> = filters.iter().map(|f| unnormalize_col(f.clone())).collect();
    let mut columns: Vec<usize> = exprs
        .iter()
        .flat_map(|e| e.column_refs())
        .filter_map(|c| schema.index_of(&c.name).ok())
        .collect();
    columns.sort_unstable();
    columns.dedup();
    let sub = Arc::new(schema.project(&columns)?);
    let df_schema = DFSchema::try_from(sub.as_ref().clone())?;
    let mut compiled: Vec<Arc<dyn PhysicalExpr>> = Vec::new();
    let mut used: Vec<Expr> = Vec::new();
    for (filter, expr) in filters.iter().zip(&exprs) {
        match state.create_physical_expr(expr.clone(), &df_schema) {
            Ok(c) => {
                compiled.push(c);
                used.push(expr.clone());
            }
            // DataFusion filters again above the scan: the filter only reads more here.
            Err(_) if !applied_exactly(schema, filter) => {}
            Err(e) => return Err(e.context("compiling a filter the live scan applies")),
        }
    }
    if compiled.is_empty() {
        return Ok(None);
    }
    let predicate = conjunction(compiled);
    let pruning = PruningPredicate::try_new(predicate.clone(), sub.clone())
        .ok()
        .filter(|p| !p.always_true())
        .map(Arc::new);
    let proof = if strict {
        proof_of(state, &used, &df_schema, sub)
    } else {
        None
    };
    let keys = match key_cols {
        [k] if crate::query::committed::int_key(schema.field(*k).data_type()) => {
            key_values(&exprs, schema.field(*k).name())
        }
        _ => None,
    };
    Ok(Some(ScanFilter {
        strict,
        proof,
        keys,
        // Iceberg binds names to the committed schema: not when the tail adds columns.
        iceberg: if extended {
            None
        } else {
            iceberg_predicate(&exprs, schema)
        },
        columns,
        predicate,
        pruning,
    }))
}

/// The negation of `filters` (NOT pushed down to the comparisons, as the simplifier does)
/// as a pruner over `sub`, the filter columns: where it prunes a row group whose filter
/// columns hold no NULL, every row passes the filters. `None` when statistics cannot prove
/// that of any row group.
fn proof_of(
    state: &dyn Session,
    filters: &[Expr],
    df_schema: &DFSchema,
    sub: SchemaRef,
) -> Option<Arc<PruningPredicate>> {
    use datafusion::optimizer::simplify_expressions::ExprSimplifier;
    // Parquet statistics leave NaN out of a float column's bounds, so bounds cannot prove a
    // float comparison true for every row.
    if sub.fields().iter().any(|f| f.data_type().is_floating()) {
        return None;
    }
    let all = filters.iter().cloned().reduce(Expr::and)?;
    let context = datafusion::logical_expr::simplify::SimplifyContext::default()
        .with_schema(Arc::new(df_schema.clone()));
    let negated = ExprSimplifier::new(context).simplify(!all).ok()?;
    let compiled = state.create_physical_expr(negated, df_schema).ok()?;
    PruningPredicate::try_new(compiled, sub)
        .ok()
        .filter(|p| !p.always_true())
        .map(Arc::new)
}

/// The values a single integer key column must take by one of the filters (`k = 5`,
/// `5 = k`, `k IN (1, 2)`, and `k = 1 OR k = 2 OR k = 3`, the form DataFusion's
/// simplifier gives a short IN list), sorted and without duplicates; `None` when no filter
/// pins it.
fn key_values(filters: &[Expr], key: &str) -> Option<Vec<i64>> {
    filters.iter().find_map(|f| {
        let mut v = pinned(f, key)?;
        v.sort_unstable();
        v.dedup();
        Some(v)
    })
}

/// The key values `f` pins the key column `key` to, when it does.
fn pinned(f: &Expr, key: &str) -> Option<Vec<i64>> {
    use datafusion::common::ScalarValue;
    use datafusion::logical_expr::{BinaryExpr, Operator};
    let int = |e: &Expr| match e {
        Expr::Literal(v, _) => match v {
            ScalarValue::Int16(Some(x)) => Some(i64::from(*x)),
            ScalarValue::Int32(Some(x)) => Some(i64::from(*x)),
            ScalarValue::Int64(Some(x)) => Some(*x),
            _ => None,
        },
        _ => None,
    };
    let is_key = |e: &Expr| matches!(e, Expr::Column(c) if c.name == key);
    match f {
        Expr::BinaryExpr(BinaryExpr {
            left,
            op: Operator::Eq,
            right,
        }) => {
            if is_key(left) {
                int(right).map(|v| vec![v])
            } else if is_key(right) {
                int(left).map(|v| vec![v])
            } else {
                None
            }
        }
        Expr::BinaryExpr(BinaryExpr {
            left,
            op: Operator::Or,
            right,
        }) => {
            let mut v = pinned(left, key)?;
            v.extend(pinned(right, key)?);
            Some(v)
        }
        Expr::InList(list) if !list.negated && is_key(&list.expr) => {
            list.list.iter().map(int).collect::<Option<Vec<i64>>>()
        }
        _ => None,
    }
}

/// Applies the pushed-down filters to the tail's rows (DataFusion filters again above the
/// scan: this only keeps the tail small).
fn filter_tail(
    state: &dyn Session,
    schema: &SchemaRef,
    rows: &RecordBatch,
    filters: &[Expr],
    exact: impl Fn(&Expr) -> bool,
) -> DfResult<RecordBatch> {
    if filters.is_empty() {
        return Ok(rows.clone());
    }
    let df_schema = DFSchema::try_from(schema.as_ref().clone())?;
    let mut out = rows.clone();
    for f in filters {
        let expr = unnormalize_col(f.clone());
        let mask = state
            .create_physical_expr(expr, &df_schema)
            .and_then(|physical| physical.evaluate(&out))
            .and_then(|value| value.into_array(out.num_rows()));
        let mask = match mask {
            Ok(array) => array,
            // DataFusion filters again above the scan, and reports what fails there.
            Err(_) if !exact(f) => continue,
            Err(e) => return Err(e.context("filtering the WAL tail's rows")),
        };
        match mask.as_any().downcast_ref::<BooleanArray>() {
            Some(mask) => out = filter_record_batch(&out, mask)?,
            None if !exact(f) => {}
            None => {
                return Err(DataFusionError::Plan(format!(
                    "the filter {f} does not give a boolean"
                )))
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::{col, lit};

    #[test]
    fn key_values_come_from_an_equality_or_an_in_list_on_the_key() {
        let f = [col("status").eq(lit("x")), lit(7i64).eq(col("id"))];
        assert_eq!(key_values(&f, "id"), Some(vec![7]));
        let f = [col("id").in_list(vec![lit(3i32), lit(1i32), lit(3i32)], false)];
        assert_eq!(key_values(&f, "id"), Some(vec![1, 3]));
        assert_eq!(key_values(&[col("id").gt(lit(3i64))], "id"), None);
        assert_eq!(
            key_values(&[col("id").in_list(vec![lit(1i64)], true)], "id"),
            None
        );
        assert_eq!(key_values(&[col("n").eq(lit(1i64))], "id"), None);
        // A short IN list, as DataFusion's simplifier rewrites it.
        let f = [col("id")
            .eq(lit(9i64))
            .or(col("id").eq(lit(2i64)))
            .or(col("id").eq(lit(9i64)))];
        assert_eq!(key_values(&f, "id"), Some(vec![2, 9]));
        let f = [col("id").eq(lit(9i64)).or(col("n").eq(lit(2i64)))];
        assert_eq!(key_values(&f, "id"), None);
    }
}
