//! Queries, committed side: the planner's statistics of a scan (rows, bounds, nulls, sizes),
//! from the manifests' column metrics, computed when the scan is planned.

use arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::stats::Precision;
use datafusion::common::Statistics;

use std::sync::Arc;

use super::{field_id, DataFile, ScanFilter};
use crate::query::listing::ColumnMetrics;

/// The planner's statistics of reading `files` (projected to `schema`, whose columns have
/// the field ids `ids`), from the manifests: rows, and each column's bounds, null count and
/// size. All inexact: deletes and the rows the tail replaced are not subtracted, a string's
/// bounds may be truncated, and a piece of a file gets its share of the file's nulls and
/// bytes. A column some file has no metric for has none.
///
/// Without them the planner sees row counts alone: it cannot tell how much of a table a
/// filter keeps or how many rows a join makes, and builds hash tables on the large side
/// (TPC-H Q4 built one on 3.8M filtered `lineitem` rows instead of 57k `orders`).
pub(super) fn statistics<'a>(
    files: impl Iterator<Item = &'a DataFile> + Clone,
    schema: &SchemaRef,
    ids: &[Option<i32>],
    limit: Option<usize>,
) -> Statistics {
    let mut rows: usize = files.clone().map(|f| f.rows as usize).sum();
    let mut stats = Statistics::new_unknown(schema);
    for ((field, id), column) in schema
        .fields()
        .iter()
        .zip(ids)
        .zip(stats.column_statistics.iter_mut())
    {
        let Some(id) = id else { continue };
        let metrics = files.clone().map(|f| {
            let share = f.rows as f64 / f.file_rows.max(1) as f64;
            (f.columns.as_ref().and_then(|c| c.get(id)), share)
        });
        *column = column_statistics(metrics, field.data_type(), rows);
    }
    if let Some(limit) = limit {
        rows = rows.min(limit);
        for c in &mut stats.column_statistics {
            c.byte_size = Precision::Absent;
            c.null_count = Precision::Absent;
        }
    }
    stats.num_rows = Precision::Inexact(rows);
    let sizes: Option<usize> = stats
        .column_statistics
        .iter()
        .map(|c| c.byte_size.get_value().copied())
        .sum();
    stats.total_byte_size = Precision::Inexact(sizes.unwrap_or_else(|| {
        let width: usize = schema
            .fields()
            .iter()
            .map(|f| f.data_type().primitive_width().unwrap_or(24))
            .sum();
        rows.saturating_mul(width.max(1))
    }));
    stats
}

/// The share of the rows of `files` that `filter` keeps, estimated as DataFusion's filter
/// does above a scan (interval analysis of the predicate over the filter columns' bounds,
/// its default of 20% where the predicate is beyond that analysis).
pub(super) fn selectivity<'a>(
    filter: &ScanFilter,
    files: impl Iterator<Item = &'a DataFile> + Clone,
    table_schema: &SchemaRef,
) -> datafusion::error::Result<f64> {
    use datafusion::physical_expr::analysis::{analyze, AnalysisContext};
    use datafusion::physical_expr::intervals::utils::check_support;
    const DEFAULT: f64 = 0.2;
    let sub = Arc::new(table_schema.project(&filter.columns)?);
    if !check_support(&filter.predicate, &sub) {
        return Ok(DEFAULT);
    }
    let ids: Vec<Option<i32>> = filter
        .columns
        .iter()
        .map(|i| field_id(table_schema.field(*i)))
        .collect();
    let input = statistics(files, &sub, &ids, None);
    let analysed = AnalysisContext::try_from_statistics(&sub, &input.column_statistics)
        .and_then(|context| analyze(&filter.predicate, context, &sub));
    Ok(match analysed {
        Ok(a) => a.selectivity.unwrap_or(1.0),
        Err(_) => DEFAULT,
    })
}

/// `stats` after a filter keeping `selectivity` of the rows (unchanged without one).
pub(super) fn filtered(mut stats: Statistics, selectivity: Option<f64>) -> Statistics {
    let Some(s) = selectivity else {
        return stats;
    };
    stats.num_rows = stats.num_rows.with_estimated_selectivity(s);
    stats.total_byte_size = stats.total_byte_size.with_estimated_selectivity(s);
    for c in &mut stats.column_statistics {
        c.byte_size = c.byte_size.with_estimated_selectivity(s);
        c.null_count = c.null_count.with_estimated_selectivity(s);
    }
    stats
}

/// One column's statistics over some files: each file's metrics (if it has them) and the
/// share of its rows read. A fixed-width column's size is its width times `rows`; another's
/// is its bytes in the files, compressed (the manifests hold nothing closer).
fn column_statistics<'a>(
    metrics: impl Iterator<Item = (Option<&'a ColumnMetrics>, f64)>,
    data_type: &DataType,
    rows: usize,
) -> datafusion::common::ColumnStatistics {
    use datafusion::common::{ColumnStatistics, ScalarValue};
    let mut min: Option<ScalarValue> = None;
    let mut max: Option<ScalarValue> = None;
    let (mut bounded, mut nulls, mut bytes) = (true, Some(0f64), Some(0f64));
    for (m, share) in metrics {
        let m = m.cloned().unwrap_or_default();
        nulls = nulls.zip(m.nulls).map(|(a, n)| a + n as f64 * share);
        bytes = bytes.zip(m.size).map(|(a, n)| a + n as f64 * share);
        let lower = m.lower.as_ref().and_then(|l| scalar(l, data_type));
        let upper = m.upper.as_ref().and_then(|l| scalar(l, data_type));
        match (lower, upper) {
            (Some(lo), Some(hi)) if bounded => {
                if min
                    .as_ref()
                    .is_none_or(|m| lo.partial_cmp(m).is_some_and(|o| o.is_lt()))
                {
                    min = Some(lo);
                }
                if max
                    .as_ref()
                    .is_none_or(|m| hi.partial_cmp(m).is_some_and(|o| o.is_gt()))
                {
                    max = Some(hi);
                }
            }
            _ => bounded = false,
        }
    }
    let inexact = |v: Option<ScalarValue>| match v {
        Some(v) if bounded => Precision::Inexact(v),
        _ => Precision::Absent,
    };
    let byte_size = match data_type.primitive_width() {
        Some(w) => Precision::Inexact(w.saturating_mul(rows)),
        None => bytes.map_or(Precision::Absent, |b| Precision::Inexact(b as usize)),
    };
    ColumnStatistics {
        null_count: nulls.map_or(Precision::Absent, |n| Precision::Inexact(n as usize)),
        min_value: inexact(min),
        max_value: inexact(max),
        byte_size,
        ..ColumnStatistics::new_unknown()
    }
}

/// A manifest bound as a value of the table's type of its column; None when it cannot be
/// one (a type the planner has no use for, or a bound written under an older type that does
/// not convert).
fn scalar(
    literal: &iceberg::spec::PrimitiveLiteral,
    data_type: &DataType,
) -> Option<datafusion::common::ScalarValue> {
    use datafusion::common::ScalarValue;
    use iceberg::spec::PrimitiveLiteral as L;
    let value = match (literal, data_type) {
        (L::Int128(v), DataType::Decimal128(p, s)) => ScalarValue::Decimal128(Some(*v), *p, *s),
        (L::Int128(_), _) => return None,
        (L::Boolean(v), _) => ScalarValue::Boolean(Some(*v)),
        (L::Int(v), _) => ScalarValue::Int32(Some(*v)),
        (L::Long(v), _) => ScalarValue::Int64(Some(*v)),
        (L::Float(v), _) => ScalarValue::Float32(Some(v.0)),
        (L::Double(v), _) => ScalarValue::Float64(Some(v.0)),
        (L::String(v), _) => ScalarValue::Utf8(Some(v.clone())),
        _ => return None,
    };
    if value.data_type() == *data_type {
        Some(value)
    } else {
        value.cast_to(data_type).ok()
    }
}
