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
use iceberg::spec::{DataFile, Struct};
use parquet::arrow::arrow_reader::statistics::StatisticsConverter;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::arrow::async_reader::{ParquetRecordBatchStream, ParquetRecordBatchStreamBuilder};
use parquet::arrow::PARQUET_FIELD_ID_META_KEY;
use parquet::file::metadata::ParquetMetaData;

use super::positions::LivePositions;
use super::{Segment, TableSink, ROW_GROUP_BYTES};
use crate::error::{Context, Error, Result};
use crate::sink::iceberg::maintenance::LiveFile;
use crate::sink::iceberg::writer::TableWriter;
use crate::storage::iceberg_io::uncached;
use crate::table::partition::Partitioner;

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
    /// Live positions in the file, and how many of them were reached.
    pub(super) keep: LivePositions,
    k: u64,
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
    /// Whether the file is in the table's current write order (else it was written under
    /// an earlier sort order, and is sorted before it is written again).
    pub(super) ordered: bool,
    /// The spec and partition the file was written under.
    pub(super) spec_id: i32,
    pub(super) partition: Struct,
}

impl Input {
    pub(super) async fn open(
        sink: &TableSink,
        no: u32,
        file: &LiveFile,
        keep: LivePositions,
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
            ordered: crate::table::in_current_order(
                sink.table.metadata().properties(),
                file.file_seq,
            ),
            spec_id: file.spec_id,
            partition: file.file.partition().clone(),
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
            let mask: Vec<bool> = (self.base..self.base + n)
                .map(|pos| self.keep.contains(pos))
                .collect();
            self.k += mask.iter().filter(|live| **live).count() as u64;
            self.base += n;
            let live =
                sink.by_field_id(&filter_record_batch(&batch, &BooleanArray::from(mask))?)?;
            if live.num_rows() == 0 {
                continue;
            }
            if let Some(order) = order {
                self.keys = Some(sink.write_order().rows(order, &live)?);
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
        if self.k != self.keep.len() || self.written != self.keep.len() {
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
    let write_order = sink.write_order();
    // Per-column minimums bound the rows only in ascending order with nulls last (keys have
    // no nulls).
    let bounded = write_order
        .columns
        .iter()
        .enumerate()
        .all(|(n, (_, o))| !o.descending && (!o.nulls_first || n >= write_order.sorted_by));
    if !bounded {
        return None;
    }
    let mut cols = Vec::with_capacity(write_order.columns.len());
    for (i, _) in &write_order.columns {
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

/// Which live rows of an input a run of rows is: from the `k`-th on, or each its own.
enum Ks<'a> {
    From(u64),
    Each(&'a [u64]),
}

/// The rewritten files of one partition: the one being written (with its output number and
/// rows so far) and rows for it not yet handed to it (runs of a merge can be one row).
#[derive(Default)]
struct PartOutput {
    writer: Option<(TableWriter, u64, usize)>,
    parts: Vec<RecordBatch>,
    buffered: usize,
}

/// The rewritten files being written, one partition of the current spec each and each cut
/// at `rows_per_file`, and where each rewritten file's live rows went.
pub(super) struct Output {
    prefix: String,
    rows_per_file: u64,
    /// Rows buffered before they are handed to a writer.
    buffer_rows: usize,
    partitioner: Option<Partitioner>,
    open: HashMap<Struct, PartOutput>,
    /// Output files started so far (their numbers are 0..started).
    started: usize,
    files: Vec<(usize, DataFile)>,
    segments: HashMap<u32, Vec<Segment>>,
}

impl Output {
    pub(super) fn new(
        sink: &TableSink,
        prefix: String,
        rows_per_file: u64,
        buffer_rows: usize,
    ) -> Result<Self> {
        Ok(Self {
            prefix,
            rows_per_file,
            buffer_rows,
            partitioner: Partitioner::current(sink.table.metadata())?,
            open: HashMap::new(),
            started: 0,
            files: Vec::new(),
            segments: HashMap::new(),
        })
    }

    /// The runs of rows of one partition of the current spec (all of them when unpartitioned).
    fn runs(&self, rows: &RecordBatch) -> Result<Vec<(Struct, std::ops::Range<usize>)>> {
        Ok(match &self.partitioner {
            None => vec![(Struct::empty(), 0..rows.num_rows())],
            Some(p) => p.runs(rows)?,
        })
    }

    /// Appends `rows`, live rows of file `no` in another order: the `i`-th of them is the
    /// file's `ks[i]`-th live row. Each goes to the file of its partition.
    pub(super) async fn put_each(
        &mut self,
        sink: &TableSink,
        no: u32,
        ks: &[u64],
        rows: RecordBatch,
    ) -> Result<()> {
        for (part, range) in self.runs(&rows)? {
            let n = range.len();
            let each = Ks::Each(&ks[range.clone()]);
            self.put_run(sink, no, each, part, rows.slice(range.start, n))
                .await?;
        }
        Ok(())
    }

    /// Appends `rows`, the live rows of file `no` from its `k`-th one on, each to the file
    /// of its partition.
    pub(super) async fn put(
        &mut self,
        sink: &TableSink,
        no: u32,
        k: u64,
        rows: RecordBatch,
    ) -> Result<()> {
        for (part, range) in self.runs(&rows)? {
            let n = range.len();
            self.put_run(
                sink,
                no,
                Ks::From(k + range.start as u64),
                part,
                rows.slice(range.start, n),
            )
            .await?;
        }
        Ok(())
    }

    async fn put_run(
        &mut self,
        sink: &TableSink,
        no: u32,
        mut ks: Ks<'_>,
        part: Struct,
        mut rows: RecordBatch,
    ) -> Result<()> {
        while rows.num_rows() > 0 {
            let out = self.open.entry(part.clone()).or_default();
            if out.writer.is_none() {
                let name = format!("{}-{}", self.prefix, self.started);
                let w =
                    TableWriter::bounded(&sink.table, name, u64::MAX / 4, Some(ROW_GROUP_BYTES))
                        .await?;
                out.writer = Some((w, 0, self.started));
                self.started += 1;
            }
            let Some((_, in_file, id)) = out.writer.as_mut() else {
                break;
            };
            let (id, at) = (*id, *in_file);
            let take = ((self.rows_per_file - at) as usize).min(rows.num_rows());
            let segs = self.segments.entry(no).or_default();
            // A run that continues where the last one of the same file left off extends it.
            let mut place = |k: u64, pos: u64| {
                let continues = segs.last().is_some_and(|s| {
                    s.out == id && k.checked_sub(s.k).is_some_and(|d| s.pos + d == pos)
                });
                if !continues {
                    segs.push(Segment { k, out: id, pos });
                }
            };
            match &mut ks {
                Ks::From(k) => {
                    place(*k, at);
                    *k += take as u64;
                }
                Ks::Each(each) => {
                    for (i, k) in each[..take].iter().enumerate() {
                        place(*k, at + i as u64);
                    }
                    *each = &each[take..];
                }
            }
            *in_file += take as u64;
            let full = *in_file >= self.rows_per_file;
            out.parts.push(rows.slice(0, take));
            out.buffered += take;
            rows = rows.slice(take, rows.num_rows() - take);
            if full {
                Self::flush(out, &part).await?;
                if let Some((w, _, id)) = out.writer.take() {
                    self.files
                        .extend(w.close().await?.0.into_iter().map(|f| (id, f)));
                }
            } else if out.buffered >= self.buffer_rows {
                Self::flush(out, &part).await?;
            }
        }
        Ok(())
    }

    async fn flush(out: &mut PartOutput, part: &Struct) -> Result<()> {
        if out.parts.is_empty() {
            return Ok(());
        }
        let mut parts = std::mem::take(&mut out.parts);
        out.buffered = 0;
        let batch = match parts.len() {
            1 => parts.remove(0),
            _ => concat_batches(&parts[0].schema(), &parts)?,
        };
        if let Some((w, _, _)) = out.writer.as_mut() {
            w.write_to(part.clone(), batch).await?;
        }
        Ok(())
    }

    /// Closes the files being written (the rows put next start new ones): the end of one
    /// partition's files, so that only the partitions being merged hold a writer.
    pub(super) async fn finish(&mut self) -> Result<()> {
        for (part, mut out) in std::mem::take(&mut self.open) {
            Self::flush(&mut out, &part).await?;
            if let Some((w, _, id)) = out.writer.take() {
                self.files
                    .extend(w.close().await?.0.into_iter().map(|f| (id, f)));
            }
        }
        Ok(())
    }

    /// Every file written, in output number order, and where each input's rows went.
    pub(super) async fn close(
        mut self,
        _sink: &TableSink,
    ) -> Result<(Vec<DataFile>, HashMap<u32, Vec<Segment>>)> {
        self.finish().await?;
        self.files.sort_by_key(|(id, _)| *id);
        if self.files.len() != self.started
            || self.files.iter().enumerate().any(|(i, (id, _))| i != *id)
        {
            return Err(Error::fatal(
                "compaction wrote other than one file for each output it started",
            ));
        }
        // A file's runs reach different outputs in the order of their rows.
        for segs in self.segments.values_mut() {
            segs.sort_by_key(|s| s.k);
        }
        Ok((
            self.files.into_iter().map(|(_, f)| f).collect(),
            self.segments,
        ))
    }
}
