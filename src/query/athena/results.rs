//! Athena's result pages as Arrow: `GetQueryResults` returns every value as text with the
//! column types beside it; this types the columns (numbers stay numbers, so the printer
//! aligns and quotes them as it does the local engine's) and keeps NULL apart from ''.

use std::sync::Arc;

use arrow::array::{
    ArrayRef, RecordBatch, RecordBatchOptions, StringArray, TimestampMicrosecondArray,
};
use arrow::compute::{cast_with_options, CastOptions};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use serde_json::Value;

use crate::error::{Error, Result};

/// The zone a `timestamp with time zone` column is shown in: instants are normalised to
/// UTC, as the local engine shows Iceberg's `timestamptz`.
const UTC: &str = "+00:00";

/// The Arrow type a column of Athena type `info["Type"]` is shown as. Types without an
/// exact Arrow counterpart (varchar, json, arrays, maps, rows, time, varbinary, intervals)
/// stay text, exactly as Athena printed them.
pub fn arrow_type(info: &Value) -> DataType {
    let ty = info["Type"]
        .as_str()
        .unwrap_or("varchar")
        .to_ascii_lowercase();
    let base = ty.split('(').next().unwrap_or_default().trim();
    match base {
        "boolean" => DataType::Boolean,
        "tinyint" => DataType::Int8,
        "smallint" => DataType::Int16,
        "integer" | "int" => DataType::Int32,
        "bigint" => DataType::Int64,
        "float" | "real" => DataType::Float32,
        "double" => DataType::Float64,
        "decimal" => decimal(info, &ty).unwrap_or(DataType::Utf8),
        "date" => DataType::Date32,
        "timestamp" => DataType::Timestamp(TimeUnit::Microsecond, None),
        "timestamp with time zone" => DataType::Timestamp(TimeUnit::Microsecond, Some(UTC.into())),
        _ => DataType::Utf8,
    }
}

/// `decimal(p,s)` from the column's `Precision`/`Scale`, or from the type text.
fn decimal(info: &Value, ty: &str) -> Option<DataType> {
    let from_text = || {
        let inner = ty.split_once('(')?.1.trim_end_matches(')');
        let (p, s) = inner.split_once(',')?;
        Some((p.trim().parse::<u64>().ok()?, s.trim().parse::<u64>().ok()?))
    };
    let (p, s) = match (info["Precision"].as_u64(), info["Scale"].as_u64()) {
        (Some(p), Some(s)) if p > 0 => (p, s),
        _ => from_text()?,
    };
    let p = u8::try_from(p).ok().filter(|p| (1..=38).contains(p))?;
    let s = i8::try_from(s).ok().filter(|s| *s as u8 <= p)?;
    Some(DataType::Decimal128(p, s))
}

/// `2024-01-02 03:04:05.123 UTC` (or `... Europe/Paris`, `... +01:00`) as microseconds
/// since the epoch.
fn parse_tstz(text: &str) -> Option<i64> {
    let (local, zone) = text.trim().rsplit_once(' ')?;
    let naive = chrono::NaiveDateTime::parse_from_str(local, "%Y-%m-%d %H:%M:%S%.f").ok()?;
    let instant = if let Ok(tz) = zone.parse::<chrono_tz::Tz>() {
        naive.and_local_timezone(tz).single()?.timestamp_micros()
    } else {
        let offset = chrono::DateTime::parse_from_str(
            &format!("{local} {zone}"),
            "%Y-%m-%d %H:%M:%S%.f %:z",
        )
        .ok()?;
        offset.timestamp_micros()
    };
    Some(instant)
}

/// One column of text values as `dt`; the text itself when a value does not parse as
/// `dt` (nothing is turned into NULL or dropped on the way).
fn column(values: Vec<Option<&str>>, dt: &DataType) -> (DataType, ArrayRef) {
    let text = StringArray::from(values);
    let typed: Option<ArrayRef> = match dt {
        DataType::Utf8 => None,
        DataType::Timestamp(TimeUnit::Microsecond, Some(tz)) => text
            .iter()
            .map(|v| v.map(parse_tstz).map_or(Some(None), |p| p.map(Some)))
            .collect::<Option<Vec<Option<i64>>>>()
            .map(|v| {
                Arc::new(TimestampMicrosecondArray::from(v).with_timezone(tz.clone())) as ArrayRef
            }),
        _ => cast_with_options(
            &text,
            dt,
            &CastOptions {
                safe: false,
                ..Default::default()
            },
        )
        .ok(),
    };
    match typed {
        Some(a) => (dt.clone(), a),
        None => {
            if *dt != DataType::Utf8 {
                tracing::debug!(data_type = %dt, "an Athena column did not parse as its type; shown as text");
            }
            (DataType::Utf8, Arc::new(text) as ArrayRef)
        }
    }
}

/// The rows of every `GetQueryResults` page as one batch. `header_row`: the statement is
/// a SELECT, whose first row repeats the column names (Athena's CSV header); it is left out
/// when it does.
pub fn to_arrow(pages: &[Value], header_row: bool) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    let infos: Vec<Value> = pages
        .first()
        .and_then(|p| p["ResultSet"]["ResultSetMetadata"]["ColumnInfo"].as_array())
        .cloned()
        .unwrap_or_default();
    let names: Vec<String> = infos
        .iter()
        .map(|i| {
            i["Name"]
                .as_str()
                .or_else(|| i["Label"].as_str())
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    let empty = Vec::new();
    let mut rows: Vec<Vec<Option<&str>>> = Vec::new();
    for (p, page) in pages.iter().enumerate() {
        let page_rows = page["ResultSet"]["Rows"].as_array().unwrap_or(&empty);
        for (r, row) in page_rows.iter().enumerate() {
            let data = row["Data"].as_array().unwrap_or(&empty);
            let values: Vec<Option<&str>> =
                data.iter().map(|d| d["VarCharValue"].as_str()).collect();
            if values.len() != names.len() {
                return Err(Error::fatal(format!(
                    "row {} of result page {} has {} values for {} columns",
                    r + 1,
                    p + 1,
                    values.len(),
                    names.len()
                )));
            }
            let is_header = p == 0
                && r == 0
                && header_row
                && values
                    .iter()
                    .zip(&names)
                    .all(|(v, n)| *v == Some(n.as_str()));
            if !is_header {
                rows.push(values);
            }
        }
    }
    let mut fields = Vec::with_capacity(names.len());
    let mut columns = Vec::with_capacity(names.len());
    for (c, (name, info)) in names.iter().zip(&infos).enumerate() {
        let values = rows.iter().map(|row| row[c]).collect();
        let (dt, array) = column(values, &arrow_type(info));
        fields.push(Field::new(name, dt, true));
        columns.push(array);
    }
    let schema: SchemaRef = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new_with_options(
        schema.clone(),
        columns,
        &RecordBatchOptions::new().with_row_count(Some(rows.len())),
    )?;
    Ok((schema, vec![batch]))
}
