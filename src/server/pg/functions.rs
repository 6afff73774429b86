//! Gateway, Postgres imitation, SQL functions: the Postgres built-ins that BI tools and
//! drivers call in their catalog queries (`format`, `json_build_object`, the privilege
//! checks, visibility checks), evaluated by the query engine while it runs a statement.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, StringArray};
use arrow::datatypes::Field;
use arrow::datatypes::{DataType, Int64Type};
use datafusion::common::ScalarValue;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
};
use datafusion::prelude::SessionContext;

use super::catalog::ident;
use super::udf::{self, arrays, text};

/// An engine function whose count Postgres types `integer` (`array_length`, `cardinality`):
/// the engine's own, its result cast from the engine's unsigned 64 bits.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Int4Count(ScalarUDF);

impl ScalarUDFImpl for Int4Count {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn name(&self) -> &str {
        self.0.name()
    }

    fn aliases(&self) -> &[String] {
        self.0.aliases()
    }

    fn signature(&self) -> &Signature {
        self.0.signature()
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> DfResult<Vec<DataType>> {
        self.0.coerce_types(arg_types)
    }

    fn return_type(&self, _arg_types: &[DataType]) -> DfResult<DataType> {
        Ok(DataType::Int32)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let types: Vec<DataType> = args
            .arg_fields
            .iter()
            .map(|f| f.data_type().clone())
            .collect();
        let engine = Arc::new(Field::new(self.name(), self.0.return_type(&types)?, true));
        let counted = self.0.invoke_with_args(ScalarFunctionArgs {
            return_field: engine,
            ..args
        })?;
        counted.cast_to(&DataType::Int32, None)
    }
}

/// Registers the functions that need no per-connection state.
pub fn register(ctx: &SessionContext) {
    use datafusion::functions_nested::{cardinality::cardinality_udf, length::array_length_udf};
    for engine in [array_length_udf(), cardinality_udf()] {
        ctx.register_udf(ScalarUDF::new_from_impl(Int4Count(engine.as_ref().clone())));
    }
    ctx.register_udf(udf::function("format", DataType::Utf8, |args| {
        let all = arrays(args)?;
        let Some((fmt, rest)) = all.split_first() else {
            return Err(DataFusionError::Plan(
                "format() needs a format string".into(),
            ));
        };
        Ok(ColumnarValue::Array(Arc::new(format_rows(
            fmt,
            rest,
            args.number_rows,
        )?)))
    }));
    ctx.register_udf(udf::function("json_build_object", DataType::Utf8, |args| {
        Ok(ColumnarValue::Array(Arc::new(json_build_object(
            &arrays(args)?,
            args.number_rows,
        )?)))
    }));
    ctx.register_udf(udf::constant(
        "pg_get_serial_sequence",
        ScalarValue::Utf8(None),
    ));
    for name in ["shobj_description", "col_description", "obj_description"] {
        ctx.register_udf(udf::constant(name, ScalarValue::Utf8(None)));
    }
    // A session lists its own temporary schema only: none is another session's.
    ctx.register_udf(udf::constant(
        "pg_is_other_temp_schema",
        ScalarValue::Boolean(Some(false)),
    ));
    for name in ["pg_collation_is_visible", "pg_type_is_visible"] {
        ctx.register_udf(udf::constant(name, ScalarValue::Boolean(Some(true))));
    }
    for name in [
        "has_table_privilege",
        "has_any_column_privilege",
        "has_column_privilege",
        "has_schema_privilege",
        "has_database_privilege",
    ] {
        ctx.register_udf(udf::function(name, DataType::Boolean, move |args| {
            // The privilege is the last argument.
            let last = args.args.len().checked_sub(1).ok_or_else(|| {
                DataFusionError::Plan(format!("{name}() needs a privilege argument"))
            })?;
            let privileges = udf::text_arg(args, last, name)?;
            let privileges = privileges.as_string::<i32>();
            let out: BooleanArray = (0..args.number_rows)
                .map(|i| (!privileges.is_null(i)).then(|| read_only_grants(privileges.value(i))))
                .collect();
            Ok(ColumnarValue::Array(Arc::new(out)))
        }));
    }
}

// ------------------------------------------------------------------------------------------
// format()
// ------------------------------------------------------------------------------------------

/// `format(formatstr, args...)` over arrays: `%s` (text, NULL as empty), `%I` (identifier,
/// quoted when needed), `%L` (literal, NULL as `NULL`), `%%`, with optional argument
/// positions (`%2$s`).
fn format_rows(fmt: &ArrayRef, rest: &[ArrayRef], rows: usize) -> DfResult<StringArray> {
    let fmt = text(fmt)?;
    let fmt = fmt.as_string::<i32>();
    let rest: Vec<ArrayRef> = rest.iter().map(text).collect::<DfResult<_>>()?;
    let mut out = Vec::with_capacity(rows);
    let mut values = Vec::with_capacity(rest.len());
    for row in 0..rows {
        if fmt.is_null(row) {
            out.push(None);
            continue;
        }
        values.clear();
        for a in &rest {
            let a = a.as_string::<i32>();
            values.push((!a.is_null(row)).then(|| a.value(row).to_string()));
        }
        out.push(Some(format_row(fmt.value(row), &values)?));
    }
    Ok(StringArray::from(out))
}

/// Formats one row: `args[i]` is the i-th argument after the format string.
pub(crate) fn format_row(fmt: &str, args: &[Option<String>]) -> DfResult<String> {
    let mut out = String::with_capacity(fmt.len());
    let mut chars = fmt.chars().peekable();
    let mut next_arg = 0usize;
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        // An optional position `n$`.
        let mut digits = String::new();
        while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
            digits.push(*d);
            chars.next();
        }
        let position = if digits.is_empty() {
            None
        } else if chars.peek() == Some(&'$') {
            chars.next();
            Some(digits.parse::<usize>().map_err(|_| {
                DataFusionError::Execution(format!("format(): bad argument position {digits}"))
            })?)
        } else {
            return Err(DataFusionError::NotImplemented(
                "format(): field widths are not supported".into(),
            ));
        };
        let Some(kind) = chars.next() else {
            return Err(DataFusionError::Execution(
                "format(): unterminated format specifier".into(),
            ));
        };
        if kind == '%' && position.is_none() {
            out.push('%');
            continue;
        }
        let index = match position {
            Some(0) => {
                return Err(DataFusionError::Execution(
                    "format(): argument positions start at 1".into(),
                ))
            }
            Some(p) => p - 1,
            None => next_arg,
        };
        next_arg = index + 1;
        let Some(value) = args.get(index) else {
            return Err(DataFusionError::Execution(
                "format(): too few arguments".into(),
            ));
        };
        match kind {
            's' => out.push_str(value.as_deref().unwrap_or("")),
            'I' => match value {
                Some(v) => out.push_str(&ident(v)),
                None => {
                    return Err(DataFusionError::Execution(
                        "format(): NULL cannot be formatted as an SQL identifier".into(),
                    ))
                }
            },
            'L' => match value {
                Some(v) => out.push_str(&quote_literal(v)),
                None => out.push_str("NULL"),
            },
            other => {
                return Err(DataFusionError::Execution(format!(
                    "format(): unrecognized format() type specifier \"{other}\""
                )))
            }
        }
    }
    Ok(out)
}

/// A string as a Postgres literal (`E'...'` when it holds backslashes).
fn quote_literal(v: &str) -> String {
    let body = v.replace('\'', "''");
    if v.contains('\\') {
        format!("E'{}'", body.replace('\\', "\\\\"))
    } else {
        format!("'{body}'")
    }
}

// ------------------------------------------------------------------------------------------
// json_build_object()
// ------------------------------------------------------------------------------------------

/// The JSON value of row `row` of `a`.
fn json_value(a: &ArrayRef, row: usize) -> DfResult<serde_json::Value> {
    use serde_json::Value;
    if a.is_null(row) {
        return Ok(Value::Null);
    }
    Ok(match a.data_type() {
        DataType::Boolean => Value::Bool(a.as_boolean().value(row)),
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32 => {
            let v = arrow::compute::cast(&a.slice(row, 1), &DataType::Int64)?;
            Value::from(v.as_primitive::<Int64Type>().value(0))
        }
        DataType::Float32 | DataType::Float64 => {
            let v = arrow::compute::cast(&a.slice(row, 1), &DataType::Float64)?;
            let f = v.as_primitive::<arrow::datatypes::Float64Type>().value(0);
            serde_json::Number::from_f64(f)
                .map(Value::Number)
                .unwrap_or_else(|| Value::String(f.to_string()))
        }
        _ => {
            let v = arrow::compute::cast(&a.slice(row, 1), &DataType::Utf8)?;
            Value::String(v.as_string::<i32>().value(0).to_string())
        }
    })
}

/// `json_build_object(key, value, ...)` over arrays, as JSON text.
fn json_build_object(all: &[ArrayRef], rows: usize) -> DfResult<StringArray> {
    if !all.len().is_multiple_of(2) {
        return Err(DataFusionError::Execution(
            "json_build_object(): argument list must have even number of elements".into(),
        ));
    }
    let mut out = Vec::with_capacity(rows);
    for row in 0..rows {
        let mut object = serde_json::Map::new();
        for pair in all.chunks(2) {
            let key = text(&pair[0])?;
            let key = key.as_string::<i32>();
            if key.is_null(row) {
                return Err(DataFusionError::Execution(
                    "json_build_object(): argument 1 cannot be null".into(),
                ));
            }
            object.insert(key.value(row).to_string(), json_value(&pair[1], row)?);
        }
        out.push(serde_json::Value::Object(object).to_string());
    }
    Ok(StringArray::from(out))
}

// ------------------------------------------------------------------------------------------
// privileges
// ------------------------------------------------------------------------------------------

/// `has_*_privilege([user,] object, [column,] privilege)`: reading privileges (`SELECT`,
/// `USAGE`, `CONNECT`, ...) are granted and writing ones (`INSERT`, `UPDATE`, `DELETE`,
/// `TRUNCATE`, `CREATE`, ...) are not. The privilege may list several (`'SELECT, INSERT'`):
/// any granted one grants. Whether that grants `privileges` (a comma-separated list).
pub(crate) fn read_only_grants(privileges: &str) -> bool {
    privileges.split(',').any(|p| {
        let p = p.trim().to_ascii_lowercase();
        let p = p.trim_end_matches(" with grant option");
        matches!(p, "select" | "usage" | "connect" | "temporary" | "temp")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(values: &[Option<&str>]) -> Vec<Option<String>> {
        values.iter().map(|v| v.map(str::to_string)).collect()
    }

    #[test]
    fn format_specifiers() {
        assert_eq!(
            format_row("%s", &args(&[Some("int4")])).ok(),
            Some("int4".into())
        );
        assert_eq!(
            format_row("\"%s\".\"%s\"", &args(&[Some("a"), Some("b")])).ok(),
            Some("\"a\".\"b\"".into())
        );
        assert_eq!(
            format_row("%I.%I", &args(&[Some("analytics"), Some("Mixed Case")])).ok(),
            Some("analytics.\"Mixed Case\"".into())
        );
        assert_eq!(
            format_row("%L and %L, 100%%", &args(&[Some("it's"), None])).ok(),
            Some("'it''s' and NULL, 100%".into())
        );
        assert_eq!(
            format_row("%2$s %1$s %s", &args(&[Some("a"), Some("b")])).ok(),
            Some("b a b".into())
        );
        assert_eq!(format_row("%s|", &args(&[None])).ok(), Some("|".into()));
        assert!(format_row("%s %s", &args(&[Some("a")])).is_err());
        assert!(format_row("%I", &args(&[None])).is_err());
        assert!(format_row("%x", &args(&[Some("a")])).is_err());
    }

    #[test]
    fn privileges_of_a_read_only_gateway() {
        assert!(read_only_grants("select"));
        assert!(read_only_grants("USAGE"));
        assert!(read_only_grants("INSERT, SELECT"));
        assert!(!read_only_grants("update"));
        assert!(!read_only_grants("delete"));
        assert!(!read_only_grants("INSERT WITH GRANT OPTION"));
    }
}
