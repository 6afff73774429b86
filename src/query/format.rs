//! Prints query results: an aligned table like psql's, CSV, or newline-delimited JSON.

use std::io::Write;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, Decimal128Array, FixedSizeBinaryArray, LargeBinaryArray, RecordBatch,
    StringArray,
};
use arrow::datatypes::{DataType, Decimal128Type, Field, Schema, SchemaRef};
use arrow::util::display::{ArrayFormatter, FormatOptions};

use crate::error::Result;
use crate::query::numeric::{decimal_text, display_scale, QUOTIENT_SCALE_META};

/// Output formats of `skipprd query`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    Table,
    Csv,
    Json,
}

const TS_FORMAT: &str = "%Y-%m-%d %H:%M:%S%.f";
const TSTZ_FORMAT: &str = "%Y-%m-%d %H:%M:%S%.f%:z";

/// Converts columns that have no readable Arrow display (uuid, binary) to text, the way
/// Postgres prints them.
fn readable(schema: &SchemaRef, batch: &RecordBatch) -> Result<RecordBatch> {
    let mut fields = Vec::with_capacity(schema.fields().len());
    let mut cols: Vec<ArrayRef> = Vec::with_capacity(batch.num_columns());
    for (f, col) in schema.fields().iter().zip(batch.columns()) {
        let converted: Option<ArrayRef> = match f.data_type() {
            DataType::FixedSizeBinary(16) => col
                .as_any()
                .downcast_ref::<FixedSizeBinaryArray>()
                .map(|a| {
                    Arc::new(StringArray::from_iter((0..a.len()).map(|i| {
                        (!a.is_null(i)).then(|| {
                            uuid::Uuid::from_slice(a.value(i))
                                .map(|u| u.to_string())
                                .unwrap_or_default()
                        })
                    }))) as ArrayRef
                }),
            DataType::LargeBinary => col.as_any().downcast_ref::<LargeBinaryArray>().map(|a| {
                Arc::new(StringArray::from_iter((0..a.len()).map(|i| {
                    (!a.is_null(i)).then(|| {
                        let mut s = String::from("\\x");
                        for b in a.value(i) {
                            s.push_str(&format!("{b:02x}"));
                        }
                        s
                    })
                }))) as ArrayRef
            }),
            _ => None,
        };
        match converted {
            Some(c) => {
                fields.push(Field::new(f.name(), DataType::Utf8, f.is_nullable()));
                cols.push(c);
            }
            None => {
                fields.push(f.as_ref().clone());
                cols.push(col.clone());
            }
        }
    }
    Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), cols)?)
}

fn options() -> FormatOptions<'static> {
    FormatOptions::new()
        .with_null("")
        .with_timestamp_format(Some(TS_FORMAT))
        .with_timestamp_tz_format(Some(TSTZ_FORMAT))
}

fn is_numeric(dt: &DataType) -> bool {
    dt.is_numeric()
}

/// Writes `batches` in `format`.
pub fn write(
    out: &mut dyn Write,
    format: OutputFormat,
    schema: &SchemaRef,
    batches: &[RecordBatch],
) -> Result<()> {
    let batches = batches
        .iter()
        .map(|b| readable(schema, b))
        .collect::<Result<Vec<_>>>()?;
    let display_schema = batches
        .first()
        .map(|b| b.schema())
        .unwrap_or_else(|| schema.clone());
    match format {
        OutputFormat::Table => write_table(out, &display_schema, &batches),
        OutputFormat::Csv => {
            let mut w = arrow_csv::WriterBuilder::new()
                .with_header(true)
                .with_timestamp_format(TS_FORMAT.to_string())
                .with_timestamp_tz_format(TSTZ_FORMAT.to_string())
                .build(&mut *out);
            if batches.is_empty() {
                // Still print the header.
                w.write(&RecordBatch::new_empty(display_schema.clone()))?;
            }
            for b in &batches {
                w.write(b)?;
            }
            Ok(())
        }
        OutputFormat::Json => {
            let mut w = arrow_json::WriterBuilder::new()
                .with_explicit_nulls(true)
                .build::<_, arrow_json::writer::LineDelimited>(&mut *out);
            let refs: Vec<&RecordBatch> = batches.iter().collect();
            w.write_batches(&refs)?;
            w.finish()?;
            Ok(())
        }
    }
}

fn write_table(out: &mut dyn Write, schema: &SchemaRef, batches: &[RecordBatch]) -> Result<()> {
    let opts = options();
    let ncols = schema.fields().len();
    let mut cells: Vec<Vec<String>> = Vec::new();
    for b in batches {
        let fmts = b
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &opts))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        // Means show the digits Postgres shows for each value.
        let means: Vec<Option<(&Decimal128Array, i8, i8)>> = schema
            .fields()
            .iter()
            .zip(b.columns())
            .map(|(f, c)| {
                let input_scale = f.metadata().get(QUOTIENT_SCALE_META)?.parse().ok()?;
                let DataType::Decimal128(_, scale) = c.data_type() else {
                    return None;
                };
                Some((c.as_primitive::<Decimal128Type>(), *scale, input_scale))
            })
            .collect();
        for row in 0..b.num_rows() {
            cells.push(
                fmts.iter()
                    .zip(&means)
                    .map(|(f, mean)| match mean {
                        Some((a, scale, input)) if a.is_valid(row) => {
                            let v = a.value(row);
                            decimal_text(v, *scale, display_scale(v, *scale, *input))
                        }
                        _ => f.value(row).to_string(),
                    })
                    .collect(),
            );
        }
    }
    let mut widths: Vec<usize> = schema
        .fields()
        .iter()
        .map(|f| f.name().chars().count())
        .collect();
    for row in &cells {
        for (w, v) in widths.iter_mut().zip(row) {
            *w = (*w).max(v.chars().count());
        }
    }
    let right: Vec<bool> = schema
        .fields()
        .iter()
        .map(|f| is_numeric(f.data_type()))
        .collect();
    // Header: names centred, as psql does.
    let mut line = String::new();
    for (i, f) in schema.fields().iter().enumerate() {
        let name = f.name();
        let pad = widths[i] - name.chars().count();
        let left = pad / 2;
        line.push(' ');
        line.push_str(&" ".repeat(left));
        line.push_str(name);
        line.push_str(&" ".repeat(pad - left));
        line.push(' ');
        if i + 1 < ncols {
            line.push('|');
        }
    }
    writeln!(out, "{}", line.trim_end())?;
    let sep: Vec<String> = widths.iter().map(|w| "-".repeat(w + 2)).collect();
    writeln!(out, "{}", sep.join("+"))?;
    for row in &cells {
        let mut line = String::new();
        for (i, v) in row.iter().enumerate() {
            let pad = widths[i] - v.chars().count();
            line.push(' ');
            if right[i] {
                line.push_str(&" ".repeat(pad));
                line.push_str(v);
            } else {
                line.push_str(v);
                line.push_str(&" ".repeat(pad));
            }
            line.push(' ');
            if i + 1 < ncols {
                line.push('|');
            }
        }
        writeln!(out, "{}", line.trim_end())?;
    }
    let n = cells.len();
    writeln!(out, "({n} {})", if n == 1 { "row" } else { "rows" })?;
    Ok(())
}
