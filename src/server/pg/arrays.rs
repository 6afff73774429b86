//! Gateway, Postgres imitation, arrays and vectors: what clients do with the catalog's
//! arrays (see [`super::catalog_types`]) works as on Postgres. Casts between text and arrays
//! read and print Postgres's text forms (`{1,2}`, and `1 2` for `int2vector` and
//! `oidvector`); a vector's subscripts start at 0 (`indkey[0]` is its first value,
//! `generate_subscripts(indkey, 1)` counts from 0); `pg_typeof` names a value's Postgres type;
//! `'1 2'::int2vector` and `'0 0'::oidvector` make vectors.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int64Builder, ListBuilder};
use arrow::datatypes::{DataType, Field, TimeUnit};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::Transformed;
use datafusion::common::{ExprSchema, ScalarValue};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{
    ColumnarValue, Expr, ExprSchemable, LogicalPlan, ScalarFunctionArgs, ScalarUDF,
};
use datafusion::optimizer::AnalyzerRule;
use datafusion::prelude::SessionContext;

use super::catalog_types::{carrier, field_pg_type, is_vector, list_text, parse_lists};
use super::udf::field_function;
use crate::query::live::PG_TYPE_META;

/// A field named `name` of type `dt` that carries the Postgres type `pg_type`.
fn pg_field(name: &str, dt: DataType, pg_type: &str) -> Field {
    Field::new(name, dt, true).with_metadata(HashMap::from([(
        PG_TYPE_META.to_string(),
        pg_type.to_string(),
    )]))
}

fn list_of(item: DataType) -> DataType {
    DataType::List(Arc::new(Field::new("item", item, true)))
}

fn first_arg(args: &ScalarFunctionArgs, function: &str) -> DfResult<ArrayRef> {
    match args.args.first() {
        Some(a) => a.to_array(args.number_rows),
        None => Err(DataFusionError::Plan(format!(
            "{function}() needs an argument"
        ))),
    }
}

/// The Postgres name of a value's type (as `format_type` prints it): the catalog type its
/// field carries when the value is still held as that type (a cast keeps its column's field
/// metadata, not its type), else the type that holds its Arrow type.
pub fn pg_type_name(field: &Field) -> String {
    if let Some(t) = field_pg_type(field).filter(|t| fits(t, field.data_type())) {
        return t.to_string();
    }
    arrow_type_name(field.data_type())
}

/// Whether a value of Arrow type `dt` can be a value of the Postgres type `pg_type`: a cast
/// of a catalog column keeps the column's field metadata but not its type.
pub fn fits(pg_type: &str, dt: &DataType) -> bool {
    let list = matches!(dt, DataType::List(_) | DataType::LargeList(_));
    if pg_type.ends_with("[]") || is_vector(pg_type) {
        // `indkey::int4[]` is no longer an int2vector.
        let element = |t: &DataType| match t {
            DataType::List(f) | DataType::LargeList(f) => Some(f.data_type().clone()),
            _ => None,
        };
        return list && element(&carrier(pg_type, dt)).is_none_or(|e| Some(e) == element(dt));
    }
    let text = matches!(
        dt,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
    );
    match pg_type {
        "name" | "\"char\"" | "character varying" | "text" | "regproc" | "regtype"
        | "pg_node_tree" | "pg_lsn" | "json" | "jsonb" => text,
        "oid" | "xid" => text || dt.is_integer(),
        "smallint" | "integer" | "bigint" => dt.is_integer(),
        _ => !list && !text,
    }
}

fn arrow_type_name(dt: &DataType) -> String {
    match dt {
        DataType::Null => "unknown".into(),
        DataType::Boolean => "boolean".into(),
        DataType::Int8 | DataType::Int16 | DataType::UInt8 => "smallint".into(),
        DataType::Int32 | DataType::UInt16 => "integer".into(),
        DataType::Int64 | DataType::UInt32 | DataType::UInt64 => "bigint".into(),
        DataType::Float16 | DataType::Float32 => "real".into(),
        DataType::Float64 => "double precision".into(),
        DataType::Decimal32(..)
        | DataType::Decimal64(..)
        | DataType::Decimal128(..)
        | DataType::Decimal256(..) => "numeric".into(),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "text".into(),
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => "bytea".into(),
        DataType::FixedSizeBinary(16) => "uuid".into(),
        DataType::Date32 | DataType::Date64 => "date".into(),
        DataType::Time32(_) | DataType::Time64(_) => "time without time zone".into(),
        DataType::Timestamp(_, Some(_)) => "timestamp with time zone".into(),
        DataType::Timestamp(_, None) => "timestamp without time zone".into(),
        DataType::Interval(_) | DataType::Duration(TimeUnit::Microsecond) => "interval".into(),
        DataType::List(item) | DataType::LargeList(item) | DataType::FixedSizeList(item, _) => {
            format!("{}[]", pg_type_name(item))
        }
        _ => "text".into(),
    }
}

/// `skippr_array_text(a)`: an array's (or vector's, by its field) Postgres text form.
fn array_text() -> ScalarUDF {
    field_function(
        "skippr_array_text",
        |_| Ok(Field::new("skippr_array_text", DataType::Utf8, true)),
        |args| {
            let a = first_arg(args, "skippr_array_text")?;
            let vector = args
                .arg_fields
                .first()
                .and_then(|f| field_pg_type(f))
                .is_some_and(is_vector);
            Ok(ColumnarValue::Array(list_text(&a, vector)?))
        },
    )
}

/// A function reading text as an array of `item` (a list: cast its elements), typed
/// `pg_type` (`int2vector`, `smallint[]` ...).
fn array_in(name: &str, item: DataType, pg_type: String) -> ScalarUDF {
    let dt = list_of(item.clone());
    let returned = dt.clone();
    let fname = name.to_string();
    field_function(
        name,
        move |_| Ok(pg_field(&fname, returned.clone(), &pg_type)),
        move |args| {
            let a = first_arg(args, "array input")?;
            let out = match a.data_type() {
                DataType::List(_) | DataType::LargeList(_) => arrow::compute::cast(&a, &dt)?,
                _ => {
                    let text = arrow::compute::cast(&a, &DataType::Utf8)?;
                    parse_lists(text.as_string::<i32>(), &item)?
                }
            };
            Ok(ColumnarValue::Array(out))
        },
    )
}

/// The name of the text-to-array function of element type `item`.
fn array_in_name(item: &DataType) -> String {
    format!(
        "skippr_array_in_{}",
        arrow_type_name(item).replace([' ', '[', ']'], "_")
    )
}

/// `skippr_subscripts(a, dim)`: the subscripts of dimension `dim` of a one-dimensional
/// array (from 1), or of a vector (from 0); none for another dimension.
fn subscripts() -> ScalarUDF {
    field_function(
        "skippr_subscripts",
        |_| {
            Ok(Field::new(
                "skippr_subscripts",
                list_of(DataType::Int64),
                true,
            ))
        },
        |args| {
            let a = first_arg(args, "generate_subscripts")?;
            let dims = match args.args.get(1) {
                Some(d) => arrow::compute::cast(&d.to_array(args.number_rows)?, &DataType::Int64)?,
                None => {
                    return Err(DataFusionError::Plan(
                        "generate_subscripts() needs an array and a dimension".into(),
                    ))
                }
            };
            let dims = dims.as_primitive::<arrow::datatypes::Int64Type>();
            let vector = args
                .arg_fields
                .first()
                .and_then(|f| field_pg_type(f))
                .is_some_and(is_vector);
            let first = if vector { 0 } else { 1 };
            let mut b = ListBuilder::new(Int64Builder::new());
            let lists = match a.data_type() {
                DataType::List(_) => a.as_list::<i32>().clone(),
                DataType::Null => {
                    let mut b = ListBuilder::new(Int64Builder::new());
                    (0..a.len()).for_each(|_| b.append(false));
                    return Ok(ColumnarValue::Array(Arc::new(b.finish())));
                }
                other => {
                    return Err(DataFusionError::Plan(format!(
                        "function generate_subscripts({}, integer) does not exist",
                        arrow_type_name(other)
                    )))
                }
            };
            for i in 0..lists.len() {
                if lists.is_null(i) || dims.is_null(i) || dims.value(i) != 1 {
                    b.append(false);
                    continue;
                }
                let n = lists.value(i).len() as i64;
                for s in first..first + n {
                    b.values().append_value(s);
                }
                b.append(true);
            }
            Ok(ColumnarValue::Array(Arc::new(b.finish())))
        },
    )
}

/// `skippr_expandarray(a)`: the rows `information_schema._pg_expandarray(a)` returns, as a
/// list of `(x, n)` records to unnest: each element with its position, counted from 1.
fn expandarray() -> ScalarUDF {
    let record = |item: &DataType| {
        DataType::Struct(
            vec![
                Field::new("x", item.clone(), true),
                Field::new("n", DataType::Int32, false),
            ]
            .into(),
        )
    };
    field_function(
        "skippr_expandarray",
        move |fields| {
            let item = match fields.first().map(|f| f.data_type()) {
                Some(DataType::List(item)) => item.data_type().clone(),
                _ => DataType::Null,
            };
            Ok(Field::new(
                "skippr_expandarray",
                list_of(record(&item)),
                true,
            ))
        },
        move |args| {
            let a = first_arg(args, "_pg_expandarray")?;
            let DataType::List(item) = a.data_type() else {
                return Err(DataFusionError::Plan(format!(
                    "function _pg_expandarray({}) does not exist",
                    arrow_type_name(a.data_type())
                )));
            };
            let lists = a.as_list::<i32>();
            let mut positions = Vec::with_capacity(lists.values().len());
            let offsets = lists.offsets();
            for w in offsets.windows(2) {
                let start = w[0];
                positions.extend((0..(w[1] - start)).map(|j| j + 1));
            }
            // Positions of the values outside any list (before the first offset) are unused.
            let first = offsets.first().copied().unwrap_or(0).max(0) as usize;
            let mut n = vec![0i32; first];
            n.extend(positions);
            n.resize(lists.values().len(), 0);
            let DataType::Struct(fields) = record(item.data_type()) else {
                return Err(DataFusionError::Internal("a record is a struct".into()));
            };
            let records = arrow::array::StructArray::try_new(
                fields.clone(),
                vec![
                    lists.values().clone(),
                    Arc::new(arrow::array::Int32Array::from(n)),
                ],
                None,
            )?;
            let out = arrow::array::ListArray::try_new(
                Arc::new(Field::new("item", DataType::Struct(fields), true)),
                offsets.clone(),
                Arc::new(records),
                lists.nulls().cloned(),
            )?;
            Ok(ColumnarValue::Array(Arc::new(out)))
        },
    )
}

/// `skippr_vector_element(v, i)`: element `i` of a vector, counted from 0 (`indkey[0]`);
/// NULL outside it.
fn vector_element() -> ScalarUDF {
    field_function(
        "skippr_vector_element",
        |fields| {
            let item = match fields.first().map(|f| f.data_type()) {
                Some(DataType::List(item)) => item.data_type().clone(),
                _ => DataType::Null,
            };
            Ok(Field::new("skippr_vector_element", item, true))
        },
        |args| {
            let a = first_arg(args, "a vector subscript")?;
            let index = match args.args.get(1) {
                Some(i) => arrow::compute::cast(&i.to_array(args.number_rows)?, &DataType::Int64)?,
                None => {
                    return Err(DataFusionError::Plan(
                        "a vector subscript needs an index".into(),
                    ))
                }
            };
            let index = index.as_primitive::<arrow::datatypes::Int64Type>();
            let DataType::List(_) = a.data_type() else {
                return Err(DataFusionError::Plan(format!(
                    "cannot subscript type {} because it is not an array",
                    arrow_type_name(a.data_type())
                )));
            };
            let lists = a.as_list::<i32>();
            let offsets = lists.offsets();
            let picks: arrow::array::UInt64Array = (0..lists.len())
                .map(|r| {
                    if lists.is_null(r) || index.is_null(r) {
                        return None;
                    }
                    let (start, end) = (offsets[r] as i64, offsets[r + 1] as i64);
                    let at = start.checked_add(index.value(r))?;
                    (index.value(r) >= 0 && at < end).then_some(at as u64)
                })
                .collect();
            Ok(ColumnarValue::Array(arrow::compute::take(
                lists.values().as_ref(),
                &picks,
                None,
            )?))
        },
    )
}

/// `pg_typeof(x)`: the name of `x`'s Postgres type (a `regtype`, printed as its name).
fn pg_typeof() -> ScalarUDF {
    field_function(
        "pg_typeof",
        |_| Ok(pg_field("pg_typeof", DataType::Utf8, "regtype")),
        |args| {
            let name = args
                .arg_fields
                .first()
                .map(|f| pg_type_name(f))
                .ok_or_else(|| DataFusionError::Plan("pg_typeof() needs an argument".into()))?;
            Ok(ColumnarValue::Scalar(ScalarValue::Utf8(Some(name))))
        },
    )
}

/// Registers `pg_typeof`, the vector input functions and the helpers the rewrites call.
pub fn register(ctx: &SessionContext) {
    ctx.register_udf(pg_typeof());
    ctx.register_udf(array_text());
    ctx.register_udf(subscripts());
    ctx.register_udf(expandarray());
    ctx.register_udf(array_in(
        "int2vector",
        DataType::Int16,
        "int2vector".to_string(),
    ));
    ctx.register_udf(array_in(
        "oidvector",
        DataType::Int32,
        "oidvector".to_string(),
    ));
}

/// Rewrites of plans for arrays and vectors: casts between text and arrays in Postgres's
/// text forms, and subscripts of vectors from 0.
#[derive(Debug, Default)]
pub struct ArrayCasts;

impl ArrayCasts {
    fn rewrite(e: Expr, schema: &dyn ExprSchema) -> DfResult<Transformed<Expr>> {
        match &e {
            Expr::Cast(c) => {
                let Ok(field) = c.expr.to_field(schema) else {
                    return Ok(Transformed::no(e));
                };
                Self::cast(&e, &c.expr, field.1.as_ref(), &c.data_type)
            }
            Expr::TryCast(c) => {
                let Ok(field) = c.expr.to_field(schema) else {
                    return Ok(Transformed::no(e));
                };
                Self::cast(&e, &c.expr, field.1.as_ref(), &c.data_type)
            }
            Expr::ScalarFunction(f) if f.func.name() == "array_element" && f.args.len() == 2 => {
                let vector = f.args[0]
                    .to_field(schema)
                    .ok()
                    .and_then(|(_, field)| field_pg_type(&field).map(is_vector))
                    .unwrap_or(false);
                if !vector {
                    return Ok(Transformed::no(e));
                }
                // A call of its own, so a second analysis of the plan does not shift it again.
                Ok(Transformed::yes(Expr::ScalarFunction(
                    ScalarFunction::new_udf(Arc::new(vector_element()), f.args.clone()),
                )))
            }
            _ => Ok(Transformed::no(e)),
        }
    }

    fn cast(e: &Expr, inner: &Expr, from: &Field, to: &DataType) -> DfResult<Transformed<Expr>> {
        let text = matches!(
            to,
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
        );
        match (from.data_type(), to) {
            (DataType::List(_), _) if text => {
                let call = Expr::ScalarFunction(ScalarFunction::new_udf(
                    Arc::new(array_text()),
                    vec![inner.clone()],
                ));
                Ok(Transformed::yes(if to == &DataType::Utf8 {
                    call
                } else {
                    Expr::Cast(datafusion::logical_expr::Cast::new(
                        Box::new(call),
                        to.clone(),
                    ))
                }))
            }
            (DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View, DataType::List(item)) => {
                let item = item.data_type().clone();
                let pg = format!("{}[]", arrow_type_name(&item));
                let udf = array_in(&array_in_name(&item), item, pg);
                Ok(Transformed::yes(Expr::ScalarFunction(
                    ScalarFunction::new_udf(Arc::new(udf), vec![inner.clone()]),
                )))
            }
            _ => Ok(Transformed::no(e.clone())),
        }
    }
}

impl AnalyzerRule for ArrayCasts {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> DfResult<LogicalPlan> {
        // A rewritten cast keeps its column's name.
        super::compat::rewrite_expressions(plan, Self::rewrite)
    }

    fn name(&self) -> &str {
        "skippr_array_casts"
    }
}

/// Text of a one-row string array (tests).
#[cfg(test)]
fn only_text(a: &ArrayRef) -> String {
    let t = arrow::compute::cast(a, &DataType::Utf8)
        .unwrap_or_else(|_| Arc::new(arrow::array::StringArray::from(vec![""])));
    t.as_string::<i32>().value(0).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn one_row(ctx: &SessionContext, sql: &str) -> DfResult<Vec<String>> {
        let batches = ctx.sql(sql).await?.collect().await?;
        let b = &batches[0];
        Ok((0..b.num_columns())
            .map(|c| only_text(&b.column(c).slice(0, 1)))
            .collect())
    }

    fn context() -> SessionContext {
        let ctx = SessionContext::new();
        register(&ctx);
        ctx.add_analyzer_rule(Arc::new(ArrayCasts));
        ctx
    }

    #[tokio::test]
    async fn vectors_and_arrays_read_and_print_as_postgres() -> DfResult<()> {
        let ctx = context();
        // Analysed twice, as the gateway's statements are (optimise, then the physical plan).
        let plan = ctx
            .sql("SELECT int2vector('7 8 9')[0] AS a, int2vector('7 8 9')[2] AS b, int2vector('7 8 9')[3] AS c")
            .await?
            .into_optimized_plan()?;
        let twice = ctx.execute_logical_plan(plan).await?.collect().await?;
        let text = arrow::util::pretty::pretty_format_batches(&twice)?.to_string();
        assert!(text.contains("| 7 | 9 |   |"), "{text}");
        let row = one_row(
            &ctx,
            "SELECT CAST(int2vector('1 3') AS VARCHAR), CAST(CAST('{1,2}' AS SMALLINT[]) AS TEXT), \
             int2vector('1 3')[0], CAST('{1,2}' AS SMALLINT[])[1], \
             pg_typeof(int2vector('1 3')), pg_typeof(CAST('{1,2}' AS SMALLINT[])), \
             CAST(3 AS SMALLINT) = ANY(int2vector('1 3')), array_length(int2vector('1 3'), 1)",
        )
        .await?;
        assert_eq!(
            row,
            [
                "1 3",
                "{1,2}",
                "1",
                "1",
                "int2vector",
                "smallint[]",
                "true",
                "2"
            ]
        );
        Ok(())
    }

    #[tokio::test]
    async fn subscripts_of_vectors_start_at_zero() -> DfResult<()> {
        let ctx = context();
        let batches = ctx
            .sql(
                "SELECT unnest(skippr_subscripts(int2vector('4 5 6'), 1)) AS s, \
                 unnest(skippr_subscripts(CAST('{4,5}' AS INT[]), 1)) AS t",
            )
            .await?
            .collect()
            .await?;
        let text = arrow::util::pretty::pretty_format_batches(&batches)?.to_string();
        assert!(text.contains("| 0 | 1 |"), "{text}");
        assert!(text.contains("| 2 |   |"), "{text}");
        Ok(())
    }

    #[tokio::test]
    async fn expandarray_gives_each_element_its_position() -> DfResult<()> {
        let ctx = context();
        let batches = ctx
            .sql(
                "SELECT k['x'] AS x, k['n'] AS n FROM \
                 (SELECT unnest(skippr_expandarray(int2vector('3 1'))) AS k) AS e",
            )
            .await?
            .collect()
            .await?;
        let text = arrow::util::pretty::pretty_format_batches(&batches)?.to_string();
        assert!(
            text.contains("| 3 | 1 |") && text.contains("| 1 | 2 |"),
            "{text}"
        );
        Ok(())
    }
}
