//! Result column names, shared by `skipprd query` and the gateway: a column the query did not
//! name gets the name Postgres would give it (`count`, `sum`, `?column?`), so scripts see the
//! same headers from either.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{Field, Schema, SchemaRef};

use crate::error::Result;

/// The name Postgres gives a result column the query did not name: a function call is named
/// after the function (`count(*)` is `count`), a cast after what it casts, a bare column
/// after the column, anything else `?column?`. Names the query gave stay as they are.
pub fn pg_column_name(name: &str) -> String {
    fn is_ident(s: &str) -> bool {
        let mut chars = s.chars();
        chars.next().is_some_and(|c| c.is_alphabetic() || c == '_')
            && chars.all(|c| c.is_alphanumeric() || c == '_' || c == '$')
    }
    if !name.contains('(') {
        // A qualified column (`schema.table.column`) is named after the column; any other
        // name (a column called `order-id`, say) is kept.
        if name.contains('.') && name.split('.').all(is_ident) {
            return name.rsplit('.').next().unwrap_or(name).to_string();
        }
        return name.to_string();
    }
    let Some((func, rest)) = name.split_once('(') else {
        return "?column?".to_string();
    };
    // One call spanning the whole name: its opening parenthesis closes at the end.
    let mut depth = 0usize;
    let mut closes_at_end = false;
    for (i, c) in rest.char_indices() {
        match c {
            '(' => depth += 1,
            ')' if depth == 0 => {
                closes_at_end = i == rest.len() - 1;
                break;
            }
            ')' => depth -= 1,
            _ => {}
        }
    }
    if !closes_at_end || !is_ident(func) {
        return "?column?".to_string();
    }
    const LITERAL_TYPES: &[&str] = &[
        "Int8",
        "Int16",
        "Int32",
        "Int64",
        "UInt8",
        "UInt16",
        "UInt32",
        "UInt64",
        "Float16",
        "Float32",
        "Float64",
        "Utf8",
        "Utf8View",
        "LargeUtf8",
        "Boolean",
        "Decimal128",
        "Date32",
        "Binary",
        "NULL",
        "Null",
    ];
    if LITERAL_TYPES.contains(&func) || func.starts_with("Timestamp") || func.starts_with("Time64")
    {
        return "?column?".to_string();
    }
    if func.eq_ignore_ascii_case("cast") || func.eq_ignore_ascii_case("try_cast") {
        let inner = &rest[..rest.len() - 1];
        let inner = inner.rsplit_once(" AS ").map(|(e, _)| e).unwrap_or(inner);
        return pg_column_name(inner.trim());
    }
    func.to_ascii_lowercase()
}

/// `schema` and `batches` with every column named as Postgres names it.
pub fn rename_like_postgres(
    schema: &SchemaRef,
    batches: Vec<RecordBatch>,
) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| f.as_ref().clone().with_name(pg_column_name(f.name())))
        .collect();
    let renamed = Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()));
    let batches = batches
        .into_iter()
        .map(|b| RecordBatch::try_new(renamed.clone(), b.columns().to_vec()))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok((renamed, batches))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unnamed_columns_are_named_like_postgres() {
        assert_eq!(pg_column_name("id"), "id");
        assert_eq!(pg_column_name("count(*)"), "count");
        assert_eq!(pg_column_name("sum(analytics.orders.amount)"), "sum");
        assert_eq!(pg_column_name("Int64(1)"), "?column?");
        assert_eq!(
            pg_column_name("analytics.orders.amount * Int64(2)"),
            "?column?"
        );
        assert_eq!(pg_column_name("order-id"), "order-id");
        assert_eq!(pg_column_name("CAST(analytics.t.id AS Utf8)"), "id");
        assert_eq!(pg_column_name("analytics.t.id"), "id");
        assert_eq!(pg_column_name("max(a) + min(b)"), "?column?");
        assert_eq!(pg_column_name("version()"), "version");
    }
}
