//! Sink, compaction's merge: each file rewritten read a batch of its live rows at a time (with
//! their keys in the merge order, when the table has a key), and the rewritten files written
//! and cut at a number of rows, recording where each input's live rows went.

use std::collections::HashMap;

use arrow::array::Array;
use arrow::array::{BooleanArray, RecordBatch};
use arrow::compute::{cast, concat_batches, filter_record_batch};
use arrow::datatypes::{Field, Schema};
use arrow::row::{OwnedRow, RowConverter, Rows};
use futures::StreamExt;
use iceberg::arrow::ArrowFileReader;
use iceberg::io::FileMetadata;
use iceberg::spec::DataFile;
use parquet::arrow::arrow_reader::statistics::StatisticsConverter;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::arrow::async_reader::{ParquetRecordBatchStream, ParquetRecordBatchStreamBuilder};
use parquet::arrow::PARQUET_FIELD_ID_META_KEY;
use parquet::file::metadata::ParquetMetaData;

use super::{Segment, TableSink, ROW_GROUP_BYTES};
use crate::error::{Context, Error, Result};
use crate::sink::iceberg::maintenance::LiveFile;
use crate::sink::iceberg::writer::TableWriter;
use crate::storage::iceberg_io::uncached;

/// One file being rewritten: its live rows in file order, a batch at a time.
pub(super) struct Input {
    pub(super) no: u32,
    path: String,
    size: u64,
    /// The footer, until the file is read; then its rows, fetched a row group at a time
    /// once the merge reaches the file (a file is never held whole: the snapshot's files of
    /// a large table are tens of MiB each, and a merge reads several at once).
    meta: Option<ArrowReaderMetadata>,
    rows: Option<ParquetRecordBatchStream<ArrowFileReader>>,
    batch_rows: usize,
    /// Live positions in the file, sorted, and how many of them were reached.
    pub(super) keep: Vec<u64>,
    k: usize,
    /// Position in the file of the next row the stream yields.
    base: u64,
    /// The current batch of live rows (in the table's current schema), its keys in the
    /// merge order, and the first of its rows not yet written.
    pub(super) batch: Option<RecordBatch>,
    pub(super) keys: Option<Rows>,
    pub(super) at: usize,
    /// Live rows written so far.
    pub(super) written: u64,
    /// No row of the file has a smaller key (from its statistics); None if unknown.
    pub(super) lower: Option<OwnedRow>,
    /// Decoded bytes of an average row.
    pub(super) row_bytes: usize,
}

impl Input {
    pub(super) async fn open(
        sink: &TableSink,
        no: u32,
        file: &LiveFile,
        keep: Vec<u64>,
        batch_bytes: usize,
        order: Option<&RowConverter>,
    ) -> Result<Self> {
        let path = file.file.file_path().to_string();
        let size = file.file.file_size_in_bytes();
        let mut reader = file_reader(sink, &path, size).await?;
        let meta = uncached(ArrowReaderMetadata::load_async(
            &mut reader,
            ArrowReaderOptions::new(),
        ))
        .await
        .with_context(|| format!("reading the footer of {path}"))?;
        // Batches of about `batch_bytes` decoded, however wide the rows.
        let (bytes, rows) = meta
            .metadata()
            .row_groups()
            .iter()
            .fold((0i64, 0i64), |(b, r), g| {
                (b + g.total_byte_size(), r + g.num_rows())
            });
        let per_row = (bytes / rows.max(1)).max(1) as usize;
        let batch_rows = (batch_bytes / per_row).clamp(64, 8192);
        let lower = order.and_then(|o| lower_bound(sink, o, meta.metadata(), meta.schema()));
        Ok(Self {
            no,
            path,
            size,
            meta: Some(meta),
            rows: None,
            batch_rows,
            keep,
            k: 0,
            base: 0,
            batch: None,
            keys: None,
            at: 0,
            written: 0,
            lower,
            row_bytes: per_row,
        })
    }

    /// Reads the next batch holding live rows; false at the end of the file.
    pub(super) async fn advance(
        &mut self,
        sink: &TableSink,
        order: Option<&RowConverter>,
    ) -> Result<bool> {
        self.batch = None;
        self.keys = None;
        self.at = 0;
        if let Some(meta) = self.meta.take() {
            // A second reader, opened only now: holding the one that read the footer would
            // keep a file open for every input of the plan, read or not.
            let reader = file_reader(sink, &self.path, self.size).await?;
            self.rows = Some(
                ParquetRecordBatchStreamBuilder::new_with_metadata(reader, meta)
                    .with_batch_size(self.batch_rows)
                    .build()
                    .with_context(|| format!("reading {}", self.path))?,
            );
        }
        while self.k < self.keep.len() {
            let next = match self.rows.as_mut() {
                Some(rows) => uncached(rows.next()).await,
                None => None,
            };
            let Some(batch) = next else {
                break;
            };
            let batch = batch.with_context(|| format!("reading {}", self.path))?;
            let n = batch.num_rows() as u64;
            let mut mask = vec![false; batch.num_rows()];
            while self.k < self.keep.len() && self.keep[self.k] < self.base + n {
                mask[(self.keep[self.k] - self.base) as usize] = true;
                self.k += 1;
            }
            self.base += n;
            let live =
                sink.by_field_id(&filter_record_batch(&batch, &BooleanArray::from(mask))?)?;
            if live.num_rows() == 0 {
                continue;
            }
            if let Some(order) = order {
                let cols: Vec<_> = sink
                    .key_idx
                    .iter()
                    .map(|i| live.column(*i).clone())
                    .collect();
                self.keys = Some(order.convert_columns(&cols)?);
            }
            self.batch = Some(live);
            return Ok(true);
        }
        // The file is done: its bytes are let go.
        self.rows = None;
        Ok(false)
    }

    /// The key of the next row to write.
    pub(super) fn key(&self) -> Option<OwnedRow> {
        let keys = self.keys.as_ref()?;
        (self.at < keys.num_rows()).then(|| keys.row(self.at).owned())
    }

    /// Fails when the key index named rows past the end of the file.
    pub(super) fn finished(&self) -> Result<()> {
        if self.k != self.keep.len() || self.written != self.keep.len() as u64 {
            return Err(Error::fatal(format!(
                "the key index points past the end of data file {}",
                self.path
            )));
        }
        Ok(())
    }
}

/// A reader of the data file at `path` that fetches the byte ranges the Parquet reader asks
/// for (a footer, a row group's column chunks), never the whole file.
async fn file_reader(sink: &TableSink, path: &str, size: u64) -> Result<ArrowFileReader> {
    let read = sink
        .table
        .file_io()
        .new_input(path)?
        .reader()
        .await
        .with_context(|| format!("opening {path}"))?;
    Ok(ArrowFileReader::new(FileMetadata { size }, read))
}

/// A key no row of a file is below: the smallest of its row groups' minimum keys (a tuple of
/// per-column minimums bounds a composite key too; a truncated minimum is still a lower
/// bound). None when a key column lacks statistics.
fn lower_bound(
    sink: &TableSink,
    order: &RowConverter,
    meta: &ParquetMetaData,
    schema: &Schema,
) -> Option<OwnedRow> {
    let id = |f: &Field| -> Option<i32> {
        f.metadata()
            .get(PARQUET_FIELD_ID_META_KEY)
            .and_then(|v| v.parse().ok())
    };
    let mut cols = Vec::with_capacity(sink.key_idx.len());
    for i in &sink.key_idx {
        let field = sink.arrow.field(*i);
        let want = id(field)?;
        let in_file = schema.fields().iter().find(|f| id(f) == Some(want))?;
        let stats = StatisticsConverter::try_new(
            in_file.name(),
            schema,
            meta.file_metadata().schema_descr(),
        )
        .ok()?;
        let mins = stats.row_group_mins(meta.row_groups().iter()).ok()?;
        if mins.is_empty() || mins.null_count() > 0 {
            return None;
        }
        let mins = if mins.data_type() == field.data_type() {
            mins
        } else {
            cast(&mins, field.data_type()).ok()?
        };
        cols.push(mins);
    }
    let rows = order.convert_columns(&cols).ok()?;
    rows.iter().min().map(|r| r.owned())
}

/// The rewritten files being written, each cut at `rows_per_file`, and where each rewritten
/// file's live rows went.
pub(super) struct Output {
    prefix: String,
    rows_per_file: u64,
    /// Rows buffered before they are handed to the writer.
    buffer_rows: usize,
    writer: Option<(TableWriter, u64)>,
    /// Rows for the current writer not yet handed to it (runs of a merge can be one row).
    parts: Vec<RecordBatch>,
    buffered: usize,
    files: Vec<DataFile>,
    written_files: usize,
    segments: HashMap<u32, Vec<Segment>>,
}

impl Output {
    pub(super) fn new(prefix: String, rows_per_file: u64, buffer_rows: usize) -> Self {
        Self {
            prefix,
            rows_per_file,
            buffer_rows,
            writer: None,
            parts: Vec::new(),
            buffered: 0,
            files: Vec::new(),
            written_files: 0,
            segments: HashMap::new(),
        }
    }

    /// Appends `rows`, the live rows of file `no` from its `k`-th one on.
    pub(super) async fn put(
        &mut self,
        sink: &TableSink,
        no: u32,
        mut k: u64,
        mut rows: RecordBatch,
    ) -> Result<()> {
        while rows.num_rows() > 0 {
            if self.writer.is_none() {
                let name = format!("{}-{}", self.prefix, self.written_files);
                let w =
                    TableWriter::bounded(&sink.table, name, u64::MAX / 4, Some(ROW_GROUP_BYTES))
                        .await?;
                self.writer = Some((w, 0));
            }
            let Some((_, in_file)) = self.writer.as_mut() else {
                break;
            };
            let take = ((self.rows_per_file - *in_file) as usize).min(rows.num_rows());
            let segs = self.segments.entry(no).or_default();
            // A run that continues where the last one of the same file left off extends it.
            let continues = segs
                .last()
                .is_some_and(|s| s.out == self.written_files && s.pos + (k - s.k) == *in_file);
            if !continues {
                segs.push(Segment {
                    k,
                    out: self.written_files,
                    pos: *in_file,
                });
            }
            *in_file += take as u64;
            let full = *in_file >= self.rows_per_file;
            self.parts.push(rows.slice(0, take));
            self.buffered += take;
            rows = rows.slice(take, rows.num_rows() - take);
            k += take as u64;
            if full {
                self.flush().await?;
                if let Some((w, _)) = self.writer.take() {
                    self.files.extend(w.close().await?.0);
                    self.written_files += 1;
                }
            } else if self.buffered >= self.buffer_rows {
                self.flush().await?;
            }
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<()> {
        if self.parts.is_empty() {
            return Ok(());
        }
        let mut parts = std::mem::take(&mut self.parts);
        self.buffered = 0;
        let batch = match parts.len() {
            1 => parts.remove(0),
            _ => concat_batches(&parts[0].schema(), &parts)?,
        };
        if let Some((w, _)) = self.writer.as_mut() {
            w.write(batch).await?;
        }
        Ok(())
    }

    pub(super) async fn close(
        mut self,
        _sink: &TableSink,
    ) -> Result<(Vec<DataFile>, HashMap<u32, Vec<Segment>>)> {
        self.flush().await?;
        if let Some((w, _)) = self.writer.take() {
            self.files.extend(w.close().await?.0);
        }
        Ok((self.files, self.segments))
    }
}
