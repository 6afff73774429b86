//! Gateway, point lookups: a query that reads one live table by its whole primary key
//! (`SELECT a, b FROM t WHERE id = $1`, what an application or a dashboard runs most) does
//! not go through DataFusion's planner at each execution. Its shape is recognised once, from
//! the plan made at Parse time; each execution resolves the table as planning would (same
//! search path, same read view), asks the live table for the key's rows with the key as
//! its filter, checks the key again on what comes back and sends the columns asked for.
//! Anything else, or anything that changed since Parse (a column's type, the key), takes
//! the ordinary path.

use std::collections::HashSet;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BooleanArray, RecordBatch, RecordBatchOptions, Scalar};
use arrow::compute::kernels::cmp::eq;
use arrow::compute::{and, filter_record_batch};
use arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::{Column, ParamValues, ScalarValue, TableReference};
use datafusion::datasource::source_as_provider;
use datafusion::logical_expr::utils::split_conjunction;
use datafusion::logical_expr::{BinaryExpr, Expr, LogicalPlan, Operator};
use datafusion::physical_plan::execute_stream;
use datafusion::prelude::SessionContext;
use futures::TryStreamExt;

use crate::query::live::LiveTable;
use crate::query::LiveSchema;

/// A value a key column is compared with.
#[derive(Debug, Clone)]
enum Value {
    /// A parameter of the prepared statement (`$1`).
    Param(String),
    /// A constant in the query text.
    Literal(ScalarValue),
}

/// A query recognised as a lookup by the whole primary key of one live table.
#[derive(Debug, Clone)]
pub struct Lookup {
    table: TableReference,
    /// The live table's columns, in the order of the result.
    columns: Vec<usize>,
    /// Each key column (of the live table) with its value.
    keys: Vec<(usize, Value)>,
    /// `LIMIT n` (at least 1), if any.
    fetch: Option<usize>,
    /// The result's schema, as Parse described it to the client.
    schema: SchemaRef,
}

/// A constant `LIMIT`/`OFFSET` value of a plan, or `None` for any other expression.
fn constant_usize(e: &Expr) -> Option<i64> {
    match e {
        Expr::Literal(v, _) => match v {
            ScalarValue::Int64(Some(n)) => Some(*n),
            ScalarValue::UInt64(Some(n)) => i64::try_from(*n).ok(),
            ScalarValue::Int32(Some(n)) => Some(i64::from(*n)),
            _ => None,
        },
        _ => None,
    }
}

impl Lookup {
    /// Recognises `plan` (a query as planned at Parse, not optimised): `[LIMIT n]` over a
    /// projection of plain columns over `WHERE k1 = v1 AND ...` naming every key column of
    /// a keyed live table exactly once, with parameters or constants for values.
    pub fn of(plan: &LogicalPlan) -> Option<Self> {
        let (fetch, plan) = match plan {
            LogicalPlan::Limit(l) => {
                if let Some(skip) = &l.skip {
                    if constant_usize(skip)? != 0 {
                        return None;
                    }
                }
                let fetch = match &l.fetch {
                    Some(f) => Some(
                        usize::try_from(constant_usize(f)?)
                            .ok()
                            .filter(|n| *n > 0)?,
                    ),
                    None => None,
                };
                (fetch, l.input.as_ref())
            }
            other => (None, other),
        };
        let LogicalPlan::Projection(projection) = plan else {
            return None;
        };
        let LogicalPlan::Filter(filter) = projection.input.as_ref() else {
            return None;
        };
        let LogicalPlan::TableScan(scan) = filter.input.as_ref() else {
            return None;
        };
        if scan.projection.is_some() || !scan.filters.is_empty() || scan.fetch.is_some() {
            return None;
        }
        let provider = source_as_provider(&scan.source).ok()?;
        let live = provider.as_any().downcast_ref::<LiveTable>()?;
        let key_cols = live.key_columns()?;
        let input = scan.projected_schema.as_ref();
        let column = |e: &Expr| -> Option<usize> {
            match e {
                Expr::Column(c) => input.index_of_column(c).ok(),
                _ => None,
            }
        };
        let mut columns = Vec::with_capacity(projection.expr.len());
        for e in &projection.expr {
            let e = match e {
                Expr::Alias(a) => a.expr.as_ref(),
                other => other,
            };
            columns.push(column(e)?);
        }
        let mut keys: Vec<(usize, Value)> = Vec::new();
        for conjunct in split_conjunction(&filter.predicate) {
            let Expr::BinaryExpr(BinaryExpr {
                left,
                op: Operator::Eq,
                right,
            }) = conjunct
            else {
                return None;
            };
            let (col, value) = match (column(left), column(right)) {
                (Some(c), None) => (c, right.as_ref()),
                (None, Some(c)) => (c, left.as_ref()),
                _ => return None,
            };
            let value = match value {
                Expr::Placeholder(p) => Value::Param(p.id.clone()),
                Expr::Literal(v, _) if !v.is_null() => Value::Literal(v.clone()),
                _ => return None,
            };
            if keys.iter().any(|(c, _)| *c == col) {
                return None;
            }
            keys.push((col, value));
        }
        let named: HashSet<usize> = keys.iter().map(|(c, _)| *c).collect();
        let key_set: HashSet<usize> = key_cols.iter().copied().collect();
        if named != key_set || keys.len() != key_cols.len() {
            return None;
        }
        Some(Self {
            table: scan.table_name.clone(),
            columns,
            keys,
            fetch,
            schema: Arc::new(plan.schema().as_arrow().clone()),
        })
    }

    /// Runs the lookup with `params` in the session `ctx` (whose live schema holds the
    /// statement's read view): its result batches, or `None` when the query must take the
    /// ordinary path (the table is no longer a keyed live table with the columns Parse saw,
    /// or a value does not convert exactly to its key column's type).
    pub async fn run(
        &self,
        ctx: &SessionContext,
        params: &ParamValues,
        memory: usize,
    ) -> datafusion::error::Result<Option<(SchemaRef, Vec<RecordBatch>)>> {
        let state = ctx.state();
        let defaults = &state.config_options().catalog;
        let resolved = self
            .table
            .clone()
            .resolve(&defaults.default_catalog, &defaults.default_schema);
        let Some(schema) = ctx
            .catalog(&resolved.catalog)
            .and_then(|c| c.schema(&resolved.schema))
        else {
            return Ok(None);
        };
        if schema.as_any().downcast_ref::<LiveSchema>().is_none() {
            return Ok(None);
        }
        let Some(provider) = schema.table(&resolved.table).await? else {
            return Ok(None);
        };
        let Some(live) = provider.as_any().downcast_ref::<LiveTable>() else {
            return Ok(None);
        };
        let table_schema = live.schema_ref();
        let same_key = live.key_columns().is_some_and(|k| {
            k.len() == self.keys.len() && self.keys.iter().all(|(c, _)| k.contains(c))
        });
        if !same_key {
            return Ok(None);
        }
        // The result columns must still be what Parse described.
        for (out, c) in self.schema.fields().iter().zip(&self.columns) {
            match table_schema.fields().get(*c) {
                Some(f) if f.data_type() == out.data_type() => {}
                _ => return Ok(None),
            }
        }
        let mut filters = Vec::with_capacity(self.keys.len());
        let mut wanted: Vec<(usize, ScalarValue)> = Vec::with_capacity(self.keys.len());
        for (c, value) in &self.keys {
            let v = match value {
                Value::Param(id) => params.get_placeholders_with_values(id)?.value,
                Value::Literal(v) => v.clone(),
            };
            let field = table_schema.field(*c);
            let Some(v) = exact_cast(&v, field.data_type()) else {
                return Ok(None);
            };
            filters.push(
                Expr::Column(Column::new_unqualified(field.name()))
                    .eq(Expr::Literal(v.clone(), None)),
            );
            wanted.push((*c, v));
        }
        // Read the result's columns and the keys (checked again below).
        let mut read: Vec<usize> = self.columns.clone();
        for (c, _) in &wanted {
            if !read.contains(c) {
                read.push(*c);
            }
        }
        read.sort_unstable();
        read.dedup();
        let plan = provider.scan(&state, Some(&read), &filters, None).await?;
        let task = crate::server::wire::lookup_task(&state, memory)?;
        let batches: Vec<RecordBatch> = execute_stream(plan, task)?.try_collect().await?;
        let position = |c: usize| read.iter().position(|r| *r == c);
        let mut out = Vec::new();
        let mut left = self.fetch.unwrap_or(usize::MAX);
        for batch in batches {
            if left == 0 {
                break;
            }
            let mut mask: Option<BooleanArray> = None;
            for (c, v) in &wanted {
                let Some(i) = position(*c) else {
                    return Ok(None);
                };
                let m = eq(batch.column(i), &Scalar::new(v.to_array()?))?;
                mask = Some(match mask {
                    Some(prev) => and(&prev, &m)?,
                    None => m,
                });
            }
            let batch = match mask {
                Some(m) => filter_record_batch(&batch, &m)?,
                None => batch,
            };
            let n = batch.num_rows().min(left);
            if n == 0 {
                continue;
            }
            left -= n;
            let mut cols: Vec<ArrayRef> = Vec::with_capacity(self.columns.len());
            for c in &self.columns {
                let Some(i) = position(*c) else {
                    return Ok(None);
                };
                cols.push(batch.column(i).slice(0, n));
            }
            out.push(RecordBatch::try_new_with_options(
                self.schema.clone(),
                cols,
                &RecordBatchOptions::new().with_row_count(Some(n)),
            )?);
        }
        Ok(Some((self.schema.clone(), out)))
    }
}

/// `v` as `to`, only when the conversion loses nothing (converted back, it is equal):
/// `id = 5.5` on an integer key is not a lookup of 5.
fn exact_cast(v: &ScalarValue, to: &DataType) -> Option<ScalarValue> {
    if v.is_null() {
        return None;
    }
    if &v.data_type() == to {
        return Some(v.clone());
    }
    let cast = v.cast_to(to).ok()?;
    if cast.is_null() {
        return None;
    }
    let back = cast.cast_to(&v.data_type()).ok()?;
    (back == *v).then_some(cast)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_exact_conversions_make_a_lookup() {
        assert_eq!(
            exact_cast(&ScalarValue::Int32(Some(5)), &DataType::Int64),
            Some(ScalarValue::Int64(Some(5)))
        );
        assert_eq!(
            exact_cast(&ScalarValue::Float64(Some(5.5)), &DataType::Int64),
            None
        );
        assert_eq!(
            exact_cast(&ScalarValue::Int64(Some(1 << 40)), &DataType::Int32),
            None
        );
        assert_eq!(
            exact_cast(&ScalarValue::Utf8(Some("7".into())), &DataType::Int64),
            Some(ScalarValue::Int64(Some(7)))
        );
        assert_eq!(
            exact_cast(&ScalarValue::Int64(None), &DataType::Int64),
            None
        );
    }
}
