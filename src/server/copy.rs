//! Gateway, `COPY ... TO STDOUT` (what psql's `\copy ... to` sends): a query's or a
//! table's rows go to the client in COPY text or CSV format, spelled exactly as the rows of
//! a query are (the same encoder). COPY never touches a file on the server; the classifier
//! refuses every other form before this runs.

use std::sync::Arc;

use bytes::Bytes;
use datafusion::common::TableReference;
use datafusion::prelude::{DataFrame, SessionContext};
use datafusion::sql::sqlparser::ast::{
    CopyLegacyCsvOption, CopyLegacyOption, CopyOption, CopySource, Ident, ObjectName, Statement,
};
use futures::{stream, StreamExt};
use pgwire::api::portal::Format;
use pgwire::api::results::{CopyResponse, Response};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::copy::CopyData;
use pgwire::messages::data::DataRow;
use pgwire::types::format::FormatOptions;

use super::wire::{self, Exec};
use crate::error::sqlstate;

/// How rows are written.
#[derive(Debug, Clone, PartialEq)]
pub struct CopyFormat {
    csv: bool,
    header: bool,
    delimiter: char,
    null: String,
    quote: char,
}

impl Default for CopyFormat {
    fn default() -> Self {
        Self {
            csv: false,
            header: false,
            delimiter: '\t',
            null: "\\N".to_string(),
            quote: '"',
        }
    }
}

fn unsupported(what: impl std::fmt::Display) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "ERROR".to_string(),
        sqlstate::FEATURE_NOT_SUPPORTED.to_string(),
        format!("COPY {what} is not supported: use FORMAT text or csv, with HEADER, DELIMITER, NULL or QUOTE"),
    )))
}

/// Reads the options of `COPY ... TO STDOUT` (the `WITH (...)` form and the older one).
pub fn copy_format(
    options: &[CopyOption],
    legacy: &[CopyLegacyOption],
) -> PgWireResult<CopyFormat> {
    let mut f = CopyFormat::default();
    let mut null: Option<String> = None;
    let mut delimiter: Option<char> = None;
    for o in options {
        match o {
            CopyOption::Format(name) => match name.value.to_ascii_lowercase().as_str() {
                "text" => f.csv = false,
                "csv" => f.csv = true,
                other => return Err(unsupported(format!("FORMAT {other}"))),
            },
            CopyOption::Header(h) => f.header = *h,
            CopyOption::Delimiter(c) => delimiter = Some(*c),
            CopyOption::Null(n) => null = Some(n.clone()),
            CopyOption::Quote(c) => f.quote = *c,
            CopyOption::Encoding(e)
                if e.eq_ignore_ascii_case("utf8") || e.eq_ignore_ascii_case("utf-8") => {}
            other => return Err(unsupported(format!("option {other}"))),
        }
    }
    for o in legacy {
        match o {
            CopyLegacyOption::Csv(csv) => {
                f.csv = true;
                for c in csv {
                    match c {
                        CopyLegacyCsvOption::Header => f.header = true,
                        CopyLegacyCsvOption::Quote(q) => f.quote = *q,
                        other => return Err(unsupported(format!("option {other}"))),
                    }
                }
            }
            CopyLegacyOption::Header => f.header = true,
            CopyLegacyOption::Delimiter(c) => delimiter = Some(*c),
            CopyLegacyOption::Null(n) => null = Some(n.clone()),
            CopyLegacyOption::Binary => return Err(unsupported("BINARY")),
            other => return Err(unsupported(format!("option {other}"))),
        }
    }
    if f.csv {
        f.delimiter = ',';
        f.null = String::new();
    }
    if let Some(d) = delimiter {
        f.delimiter = d;
    }
    if let Some(n) = null {
        f.null = n;
    }
    if f.header && !f.csv {
        return Err(unsupported("HEADER in text format"));
    }
    Ok(f)
}

/// One field of a COPY line.
fn push_field(line: &mut String, value: Option<&str>, f: &CopyFormat) {
    let Some(v) = value else {
        line.push_str(&f.null);
        return;
    };
    if f.csv {
        let needs_quotes = v.is_empty() && f.null.is_empty()
            || v == f.null
            || v.contains([f.delimiter, f.quote, '\n', '\r'])
            || v == "\\.";
        if needs_quotes {
            line.push(f.quote);
            for c in v.chars() {
                if c == f.quote {
                    line.push(f.quote);
                }
                line.push(c);
            }
            line.push(f.quote);
        } else {
            line.push_str(v);
        }
        return;
    }
    for c in v.chars() {
        match c {
            '\\' => line.push_str("\\\\"),
            '\n' => line.push_str("\\n"),
            '\r' => line.push_str("\\r"),
            '\t' if f.delimiter == '\t' => line.push_str("\\t"),
            c if c == f.delimiter => {
                line.push('\\');
                line.push(c);
            }
            c => line.push(c),
        }
    }
}

/// The values of a text-format DataRow: each an i32 length (-1: NULL) and its bytes.
fn row_values(row: &DataRow) -> Vec<Option<String>> {
    let mut out = Vec::with_capacity(row.field_count.max(0) as usize);
    let mut buf: &[u8] = &row.data;
    for _ in 0..row.field_count {
        let Some((len, rest)) = buf.split_first_chunk::<4>() else {
            break;
        };
        let len = i32::from_be_bytes(*len);
        if len < 0 {
            out.push(None);
            buf = rest;
            continue;
        }
        let len = (len as usize).min(rest.len());
        out.push(Some(String::from_utf8_lossy(&rest[..len]).into_owned()));
        buf = &rest[len..];
    }
    out
}

/// A line of `values` in `f`, ending with a newline.
fn line(values: &[Option<String>], f: &CopyFormat) -> String {
    let mut line = String::new();
    for (i, v) in values.iter().enumerate() {
        if i > 0 {
            line.push(f.delimiter);
        }
        push_field(&mut line, v.as_deref(), f);
    }
    line.push('\n');
    line
}

/// The rows `COPY` sends: the query's, or the table's (all columns or those listed),
/// planned from the statement as parsed.
async fn source_frame(ctx: &SessionContext, source: &CopySource) -> PgWireResult<DataFrame> {
    let api = |e: datafusion::error::DataFusionError| PgWireError::ApiError(Box::new(e));
    match source {
        CopySource::Query(q) => {
            let statement = Statement::Query(q.clone());
            let plan = ctx
                .state()
                .statement_to_plan(datafusion::sql::parser::Statement::Statement(Box::new(
                    statement,
                )))
                .await
                .map_err(api)?;
            super::planning::verify_read_only(&plan).map_err(api)?;
            ctx.execute_logical_plan(plan).await.map_err(api)
        }
        CopySource::Table {
            table_name,
            columns,
        } => {
            let df = ctx.table(table_reference(table_name)).await.map_err(api)?;
            if columns.is_empty() {
                return Ok(df);
            }
            let names: Vec<String> = columns.iter().map(normalized).collect();
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            df.select_columns(&names).map_err(api)
        }
    }
}

/// An identifier as the planner resolves it: unquoted names fold to lower case.
fn normalized(ident: &Ident) -> String {
    match ident.quote_style {
        Some(_) => ident.value.clone(),
        None => ident.value.to_lowercase(),
    }
}

fn table_reference(name: &ObjectName) -> TableReference {
    let parts: Vec<String> = name
        .0
        .iter()
        .filter_map(|p| p.as_ident().map(normalized))
        .collect();
    match parts.as_slice() {
        [c, s, t] => TableReference::full(c.clone(), s.clone(), t.clone()),
        [s, t] => TableReference::partial(s.clone(), t.clone()),
        [t] => TableReference::bare(t.clone()),
        _ => TableReference::bare(name.to_string()),
    }
}

/// Runs `COPY <source> TO STDOUT` with `format`.
pub async fn copy_out(
    ctx: &SessionContext,
    source: &CopySource,
    format: CopyFormat,
    options: Arc<FormatOptions>,
    time_zone: Option<&str>,
    exec: &Exec,
) -> PgWireResult<Response> {
    let df = exec.interrupts.run(source_frame(ctx, source)).await?;
    let columns = df.schema().fields().len();
    let header = format.header.then(|| {
        let names: Vec<Option<String>> = df
            .schema()
            .fields()
            .iter()
            .map(|f| Some(crate::query::naming::pg_column_name(f.name())))
            .collect();
        line(&names, &format)
    });
    let rows = wire::encode_dataframe(
        df,
        &[],
        &Format::UnifiedText,
        Some(options),
        time_zone,
        exec,
    )
    .await?;
    let data = rows
        .data_rows
        .map(move |row| row.map(|r| CopyData::new(Bytes::from(line(&row_values(&r), &format)))));
    let head = stream::iter(header.map(|h| Ok(CopyData::new(Bytes::from(h)))));
    Ok(Response::CopyOut(CopyResponse::new(
        0,
        columns,
        head.chain(data),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_and_csv_lines_escape_like_postgres() {
        let text = CopyFormat::default();
        let values = vec![
            Some("a\tb".to_string()),
            None,
            Some("back\\slash\nnew".to_string()),
            Some(String::new()),
        ];
        assert_eq!(line(&values, &text), "a\\tb\t\\N\tback\\\\slash\\nnew\t\n");
        let csv = copy_format(&[CopyOption::Format(Ident::new("csv"))], &[]).unwrap_or_default();
        assert_eq!(
            line(&values, &csv),
            "a\tb,,\"back\\slash\nnew\",\"\"\n",
            "NULL is empty and unquoted, an empty string is quoted"
        );
        let quoted = vec![Some("say \"hi\", ok".to_string())];
        assert_eq!(line(&quoted, &csv), "\"say \"\"hi\"\", ok\"\n");
    }

    #[test]
    fn unsupported_options_are_named() {
        let err = copy_format(&[CopyOption::Format(Ident::new("binary"))], &[]);
        assert!(matches!(err, Err(PgWireError::UserError(e)) if e.message.contains("binary")));
    }

    #[test]
    fn data_rows_decode_to_their_values() {
        let mut data = bytes::BytesMut::new();
        data.extend_from_slice(&2i32.to_be_bytes());
        data.extend_from_slice(b"hi");
        data.extend_from_slice(&(-1i32).to_be_bytes());
        let row = DataRow::new(data, 2);
        assert_eq!(row_values(&row), vec![Some("hi".to_string()), None]);
    }
}
