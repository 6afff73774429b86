//! Decodes the rows of `COPY ... TO STDOUT` (text format) into Arrow record batches: the
//! snapshot half of the source, between Postgres and the Iceberg writer.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;

use super::schema::Column;
use crate::change::types::ColumnBuilder;
use crate::config::TableRef;
use crate::error::{Error, Result};

/// Rows per record batch handed to the writer.
pub const BATCH_ROWS: usize = 8192;

/// Turns COPY text data into record batches of at most [`BATCH_ROWS`] rows.
pub struct CopyDecoder {
    table: TableRef,
    names: Vec<String>,
    schema: SchemaRef,
    builders: Vec<ColumnBuilder>,
    carry: Vec<u8>,
    scratch: String,
    rows: usize,
}

impl CopyDecoder {
    pub fn new(table: TableRef, columns: &[Column], schema: SchemaRef) -> Self {
        let builders = columns
            .iter()
            .zip(schema.fields())
            .map(|(c, f)| ColumnBuilder::new(&c.pg, f.data_type(), BATCH_ROWS))
            .collect();
        Self {
            table,
            names: columns.iter().map(|c| c.name.clone()).collect(),
            schema,
            builders,
            carry: Vec::new(),
            scratch: String::new(),
            rows: 0,
        }
    }

    /// Rows decoded but not yet taken as a batch.
    pub fn pending_rows(&self) -> usize {
        self.rows
    }

    /// Feeds a chunk of COPY data; complete lines are decoded, a partial line is kept.
    pub fn feed(&mut self, chunk: &[u8], out: &mut Vec<RecordBatch>) -> Result<()> {
        let mut data = chunk;
        let owned;
        if !self.carry.is_empty() {
            self.carry.extend_from_slice(chunk);
            owned = std::mem::take(&mut self.carry);
            data = &owned;
        }
        let mut start = 0;
        while let Some(nl) = memchr(b'\n', &data[start..]) {
            let line = &data[start..start + nl];
            self.decode_line(line)?;
            start += nl + 1;
            if self.rows >= BATCH_ROWS {
                out.push(self.take_batch()?);
            }
        }
        if start < data.len() {
            self.carry.extend_from_slice(&data[start..]);
        }
        Ok(())
    }

    /// Ends the stream: fails on a dangling partial line, returns the last batch if any.
    pub fn finish(&mut self) -> Result<Option<RecordBatch>> {
        if !self.carry.is_empty() {
            return Err(Error::source_err(format!(
                "the COPY stream of {} ended in the middle of a row",
                self.table
            )));
        }
        if self.rows == 0 {
            return Ok(None);
        }
        self.take_batch().map(Some)
    }

    fn take_batch(&mut self) -> Result<RecordBatch> {
        let arrays = self.builders.iter_mut().map(|b| b.finish()).collect();
        self.rows = 0;
        Ok(RecordBatch::try_new(Arc::clone(&self.schema), arrays)?)
    }

    fn decode_line(&mut self, line: &[u8]) -> Result<()> {
        let mut fields = line.split(|&b| b == b'\t');
        for (i, builder) in self.builders.iter_mut().enumerate() {
            let raw = fields.next().ok_or_else(|| {
                Error::source_err(format!(
                    "a COPY row of {} has fewer columns than expected ({})",
                    self.table,
                    self.names.len()
                ))
            })?;
            let result = if raw == b"\\N" {
                builder.append_null();
                Ok(())
            } else if raw.contains(&b'\\') {
                unescape(raw, &mut self.scratch)
                    .and_then(|()| builder.append_text(&self.scratch).map_err(|e| e.0))
            } else {
                match std::str::from_utf8(raw) {
                    Ok(s) => builder.append_text(s).map_err(|e| e.0),
                    Err(_) => Err("the value is not valid UTF-8".to_string()),
                }
            };
            if let Err(reason) = result {
                return Err(Error::unrepresentable(format!(
                    "table {}, column `{}`: {reason}",
                    self.table, self.names[i]
                )));
            }
        }
        if fields.next().is_some() {
            return Err(Error::source_err(format!(
                "a COPY row of {} has more columns than expected ({}); did the table change during the snapshot?",
                self.table,
                self.names.len()
            )));
        }
        self.rows += 1;
        Ok(())
    }
}

fn memchr(needle: u8, hay: &[u8]) -> Option<usize> {
    hay.iter().position(|&b| b == needle)
}

/// Undoes COPY's text escapes (`\\`, `\t`, `\n`, `\r`, `\b`, `\f`, `\v`, octal, `\xHH`).
fn unescape(raw: &[u8], out: &mut String) -> std::result::Result<(), String> {
    let mut bytes = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let c = raw[i];
        if c != b'\\' {
            bytes.push(c);
            i += 1;
            continue;
        }
        i += 1;
        let Some(&e) = raw.get(i) else {
            return Err("a COPY value ends with a lone backslash".into());
        };
        i += 1;
        match e {
            b'b' => bytes.push(8),
            b'f' => bytes.push(12),
            b'n' => bytes.push(b'\n'),
            b'r' => bytes.push(b'\r'),
            b't' => bytes.push(b'\t'),
            b'v' => bytes.push(11),
            b'0'..=b'7' => {
                let mut v = (e - b'0') as u32;
                for _ in 0..2 {
                    match raw.get(i) {
                        Some(&d @ b'0'..=b'7') => {
                            v = v * 8 + (d - b'0') as u32;
                            i += 1;
                        }
                        _ => break,
                    }
                }
                bytes.push(v as u8);
            }
            b'x' => {
                let mut v = 0u32;
                let mut n = 0;
                while n < 2 {
                    match raw.get(i).and_then(|d| (*d as char).to_digit(16)) {
                        Some(d) => {
                            v = v * 16 + d;
                            i += 1;
                            n += 1;
                        }
                        None => break,
                    }
                }
                bytes.push(v as u8);
            }
            other => bytes.push(other),
        }
    }
    out.clear();
    match String::from_utf8(bytes) {
        Ok(s) => {
            *out = s;
            Ok(())
        }
        Err(_) => Err("the value is not valid UTF-8".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unescapes() {
        let mut s = String::new();
        unescape(br"a\tb\\c\nd\101", &mut s).unwrap();
        assert_eq!(s, "a\tb\\c\ndA");
    }
}
