//! Gateway, Postgres imitation, the functions that print catalog objects as Postgres does
//! where pg_catalog's own differ: `pg_get_expr` of a NULL expression is NULL (pgjdbc reads a
//! column without a default from it), and `format_type` of an array keeps its element's type
//! modifier (`numeric(8,3)[]`, which SQLAlchemy reflects as `ARRAY(NUMERIC(8, 3))`).

use std::sync::Arc;

use arrow::array::{Array, AsArray, Int32Array, StringArray};
use arrow::datatypes::{DataType, Field, Int32Type};
use datafusion::error::Result as DfResult;
use datafusion::execution::FunctionRegistry;
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDF};
use datafusion::prelude::SessionContext;

use super::udf;

/// The element type of a built-in array type.
fn element_of(array_oid: i32) -> Option<i32> {
    Some(match array_oid {
        1000 => 16,
        1001 => 17,
        1005 => 21,
        1007 => 23,
        1016 => 20,
        1009 => 25,
        1014 => 1042,
        1015 => 1043,
        1021 => 700,
        1022 => 701,
        1231 => 1700,
        1182 => 1082,
        1183 => 1083,
        1115 => 1114,
        1185 => 1184,
        1187 => 1186,
        199 => 114,
        3807 => 3802,
        2951 => 2950,
        _ => return None,
    })
}

/// Calls `f` on `columns` (int4 arguments) as the planner would.
fn call(f: &ScalarUDF, columns: Vec<Arc<dyn Array>>, rows: usize) -> DfResult<ColumnarValue> {
    let fields = columns
        .iter()
        .enumerate()
        .map(|(i, c)| Arc::new(Field::new(format!("a{i}"), c.data_type().clone(), true)))
        .collect();
    f.invoke_with_args(ScalarFunctionArgs {
        args: columns.into_iter().map(ColumnarValue::Array).collect(),
        arg_fields: fields,
        number_rows: rows,
        return_field: Arc::new(Field::new(f.name(), DataType::Utf8, true)),
        config_options: Arc::default(),
    })
}

/// Registers the functions above over pg_catalog's (call after pg_catalog's setup).
pub fn register(ctx: &SessionContext) {
    if let Ok(original) = ctx.udf("format_type") {
        ctx.register_udf(udf::function("format_type", DataType::Utf8, move |args| {
            format_type(&original, args)
        }));
    }
    ctx.register_udf(udf::function("pg_get_expr", DataType::Utf8, |args| {
        // No expression the gateway serves has a node tree: NULL for NULL, the text as is.
        let expr = udf::text_arg(args, 0, "pg_get_expr")?;
        Ok(ColumnarValue::Array(expr))
    }));
}

fn format_type(original: &ScalarUDF, args: &ScalarFunctionArgs) -> DfResult<ColumnarValue> {
    let n = args.number_rows;
    let oids = arrow::compute::cast(&udf::arg(args, 0, "format_type")?, &DataType::Int32)?;
    let oids = oids.as_primitive::<Int32Type>();
    let mods = match args.args.get(1) {
        Some(m) => arrow::compute::cast(&m.to_array(n)?, &DataType::Int32)?,
        None => Arc::new(Int32Array::new_null(n)),
    };
    let mods = mods.as_primitive::<Int32Type>();
    // An array with a type modifier: its element type, formatted with the modifier, and `[]`.
    let mut array = vec![false; oids.len()];
    let elements: Int32Array = (0..oids.len())
        .map(|i| {
            if oids.is_null(i) {
                return None;
            }
            match element_of(oids.value(i)) {
                Some(e) if mods.is_valid(i) && mods.value(i) >= 0 => {
                    array[i] = true;
                    Some(e)
                }
                _ => Some(oids.value(i)),
            }
        })
        .collect();
    let out = call(
        original,
        vec![Arc::new(elements), Arc::new(mods.clone())],
        oids.len(),
    )?
    .to_array(oids.len())?;
    let out = arrow::compute::cast(&out, &DataType::Utf8)?;
    let out = out.as_string::<i32>();
    let formatted: StringArray = (0..out.len())
        .map(|i| {
            (!out.is_null(i)).then(|| {
                if array[i] {
                    format!("{}[]", out.value(i))
                } else {
                    out.value(i).to_string()
                }
            })
        })
        .collect();
    Ok(ColumnarValue::Array(Arc::new(formatted)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn arrays_keep_their_type_modifier_and_null_expressions_stay_null() -> DfResult<()> {
        let ctx = SessionContext::new();
        datafusion_postgres::datafusion_pg_catalog::pg_catalog::setup_pg_catalog(
            &ctx,
            "datafusion",
            datafusion_postgres::datafusion_pg_catalog::pg_catalog::context::EmptyContextProvider,
        )
        .map_err(|e| datafusion::error::DataFusionError::External(e.to_string().into()))?;
        register(&ctx);
        let batches = ctx
            .sql(
                "SELECT format_type(1231, 524295) AS a, format_type(1700, 524295) AS b, \
                 format_type(1007, -1) AS c, pg_get_expr(NULL, 1) IS NULL AS d",
            )
            .await?
            .collect()
            .await?;
        let text = arrow::util::pretty::pretty_format_batches(&batches)?.to_string();
        assert!(
            text.contains("| numeric(8,3)[] | numeric(8,3) | integer[] | true |"),
            "{text}"
        );
        Ok(())
    }
}
