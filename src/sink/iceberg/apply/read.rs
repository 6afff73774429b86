//! Reading a table's committed files for the sink: the key index rebuilt from the live data
//! files and their position deletes, and the previous versions of rows whose large (TOAST)
//! values an update left unchanged; columns are matched by Iceberg field id, never by name.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{new_null_array, Array, ArrayRef, RecordBatch, UInt32Array};
use arrow::compute::{cast, concat_batches, interleave, take};
use arrow::datatypes::DataType;
use bytes::Bytes;
use futures::StreamExt;
use iceberg::arrow::ArrowFileReader;
use iceberg::io::FileMetadata;
use iceberg::spec::{DataContentType, ManifestStatus};
use parquet::arrow::arrow_reader::{
    ArrowReaderOptions, ParquetRecordBatchReaderBuilder, RowSelection, RowSelector,
};
use parquet::arrow::PARQUET_FIELD_ID_META_KEY;
use parquet::arrow::{ParquetRecordBatchStreamBuilder, ProjectionMask};
use parquet::file::metadata::PageIndexPolicy;

use super::{file_numbers, Loc, PendingRow, TableSink};
use crate::change::types::ColumnBuilder;
use crate::change::Datum;
use crate::error::{Context, Error, Result};

/// Deleted row positions by data file, as position delete files list them: eight bytes a
/// deleted row and one path a file (a pair of path and position a row took over 100 bytes,
/// which made the deletes, not the table, the peak of a compaction after many changes).
#[derive(Default)]
pub(super) struct Deleted {
    by_file: HashMap<Arc<str>, Vec<u64>>,
    /// The file of the last position added: delete files are sorted by path, so most
    /// additions go to the same file as the one before.
    last: Option<Arc<str>>,
}

impl Deleted {
    /// Adds a deleted position; a negative one (never written by a valid delete file)
    /// deletes nothing.
    pub(super) fn add(&mut self, path: &str, pos: i64) {
        let Ok(pos) = u64::try_from(pos) else {
            return;
        };
        if let Some(last) = self.last.as_ref().filter(|l| l.as_ref() == path) {
            if let Some(v) = self.by_file.get_mut(last) {
                v.push(pos);
                return;
            }
        }
        let key = match self.by_file.get_key_value(path) {
            Some((k, _)) => Arc::clone(k),
            None => Arc::from(path),
        };
        self.by_file.entry(Arc::clone(&key)).or_default().push(pos);
        self.last = Some(key);
    }

    /// The deleted positions of each file, ascending, each once.
    pub(super) fn into_sorted(self) -> HashMap<Arc<str>, Vec<u64>> {
        let mut by_file = self.by_file;
        for positions in by_file.values_mut() {
            positions.sort_unstable();
            positions.dedup();
            positions.shrink_to_fit();
        }
        by_file
    }
}

impl TableSink {
    /// Rebuilds key -> (file, position) from the live data files and their position deletes,
    /// and the files spilled for the next commit. What is staged for that commit (rows it
    /// removes, versions pending rows came from) keeps pointing at the same rows.
    pub(super) async fn build_index(&mut self) -> Result<()> {
        let old_files = std::mem::take(&mut self.files);
        self.index.clear();
        self.extra.clear();
        let path_of = |l: &Loc| -> Result<(String, i64)> {
            old_files
                .get(l.file as usize)
                .map(|p| (p.clone(), l.pos as i64))
                .ok_or_else(|| Error::fatal("a staged change points at no data file"))
        };
        let pending_deletes: Vec<(String, i64)> =
            self.deletes.iter().map(path_of).collect::<Result<_>>()?;
        let mut deleted = Deleted::default();
        for (path, pos) in &pending_deletes {
            deleted.add(path, *pos);
        }
        let mut data_files: Vec<(String, u64)> = Vec::new();
        // After a TRUNCATE staged for the next commit, no committed row is live.
        if !self.truncated {
            let (committed, committed_deletes) = self.committed_files().await?;
            data_files = committed;
            self.read_deletes(&committed_deletes, &mut deleted).await?;
        }
        // Deletes spilled for the next commit count as well.
        let staged_deletes: Vec<String> = self
            .staged_deletes
            .iter()
            .map(|f| f.file_path().to_string())
            .collect();
        self.read_deletes(&staged_deletes, &mut deleted).await?;
        data_files.extend(
            self.staged
                .iter()
                .map(|f| (f.file_path().to_string(), f.file_size_in_bytes())),
        );
        // Deleted positions by file, sorted.
        let mut deleted_in = deleted.into_sorted();
        let expected: u64 = self.expected_rows();
        // With a primary key each key is live once: load in bulk and sort once. Without
        // one, equal rows are told apart as they come (see `index_insert`).
        if self.keyed {
            self.index
                .begin_load(usize::try_from(expected).unwrap_or(usize::MAX));
        }
        let mut indexed = Ok(());
        for (path, size) in data_files {
            let gone = deleted_in.remove(path.as_str()).unwrap_or_default();
            indexed = self.index_file(path, size, &gone).await;
            if indexed.is_err() {
                break;
            }
        }
        let ended = self.index.end_load();
        indexed?;
        ended?;
        // Renumber what the staged changes point at.
        let numbers = file_numbers(&self.files);
        let renumber = |path: &str, pos: u64| -> Result<Loc> {
            numbers
                .get(path)
                .map(|&file| Loc { file, pos })
                .ok_or_else(|| {
                    Error::fatal(format!(
                        "data file {path}, which a staged change points at, is no longer in the table; run `skipprd sync` again"
                    ))
                })
        };
        self.deletes = pending_deletes
            .iter()
            .map(|(p, pos)| renumber(p, *pos as u64))
            .collect::<Result<_>>()?;
        for prev in self.pending.places_mut() {
            let (p, pos) = path_of(prev)?;
            *prev = renumber(&p, pos as u64)?;
        }
        tracing::info!(table = %self.table.identifier(), rows = self.index.len(), index_mib = self.index.bytes() >> 20, index_disk_mib = self.index.disk_bytes() >> 20, files = self.files.len(), "key index loaded");
        self.index_ready = true;
        Ok(())
    }

    /// The live data files and position delete files of the current snapshot.
    async fn committed_files(&self) -> Result<(Vec<(String, u64)>, Vec<String>)> {
        let mut data_files = Vec::new();
        let mut delete_files = Vec::new();
        let meta = self.table.metadata();
        let Some(snapshot) = meta.current_snapshot() else {
            return Ok((data_files, delete_files));
        };
        let file_io = self.table.file_io();
        let list = self
            .table
            .manifest_list_reader(snapshot)
            .load()
            .await
            .context("reading the manifest list")?;
        for mf in list.entries() {
            let manifest = mf
                .load_manifest(file_io)
                .await
                .context("reading a manifest")?;
            for entry in manifest.entries() {
                if entry.status() == ManifestStatus::Deleted {
                    continue;
                }
                let df = entry.data_file();
                match df.content_type() {
                    DataContentType::Data => {
                        data_files.push((df.file_path().to_string(), df.file_size_in_bytes()))
                    }
                    DataContentType::PositionDeletes => delete_files.push(df.file_path().to_string()),
                    DataContentType::EqualityDeletes => {
                        return Err(Error::unrepresentable(format!(
                            "Iceberg table {} has equality deletes, which skipprd does not write or apply; it must only be written by skipprd",
                            self.table.identifier()
                        )))
                    }
                }
            }
        }
        Ok((data_files, delete_files))
    }

    /// Adds the (file, position) pairs of position delete files to `deleted`.
    pub(super) async fn read_deletes(
        &self,
        delete_files: &[String],
        deleted: &mut Deleted,
    ) -> Result<()> {
        for path in delete_files {
            let bytes = self.read_file(path).await?;
            let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)?.build()?;
            for batch in reader {
                let batch = batch?;
                let paths = batch
                    .column(0)
                    .as_any()
                    .downcast_ref::<arrow::array::StringArray>();
                let pos = batch
                    .column(1)
                    .as_any()
                    .downcast_ref::<arrow::array::Int64Array>();
                if let (Some(paths), Some(pos)) = (paths, pos) {
                    for i in 0..batch.num_rows() {
                        deleted.add(paths.value(i), pos.value(i));
                    }
                }
            }
        }
        Ok(())
    }

    /// Rows the current snapshot holds (its summary's `total-records`), to size the index.
    fn expected_rows(&self) -> u64 {
        self.table
            .metadata()
            .current_snapshot()
            .and_then(|s| s.summary().additional_properties.get("total-records"))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    /// Indexes the live rows of one data file (as file number `files.len()`), reading only
    /// its key columns; `deleted`: its deleted positions, sorted.
    async fn index_file(&mut self, path: String, size: u64, deleted: &[u64]) -> Result<()> {
        let file_no = self.files.len() as u32;
        let reader = file_reader(&self.table, &path, size).await?;
        let builder = ParquetRecordBatchStreamBuilder::new(reader)
            .await
            .with_context(|| format!("reading the footer of {path}"))?;
        // Match key columns by field id, not position: the file may predate columns
        // added, renamed or widened since. Missing columns read NULL; older types are
        // cast to the current one.
        let file_ids: Vec<Option<i32>> = builder.schema().fields().iter().map(field_id).collect();
        let wanted: Vec<(Option<usize>, DataType)> = self
            .keys
            .columns()
            .iter()
            .map(|k| {
                let field = &self.arrow.fields()[*k];
                (
                    field_id(field).and_then(|id| file_ids.iter().position(|f| *f == Some(id))),
                    field.data_type().clone(),
                )
            })
            .collect();
        let mut roots: Vec<usize> = wanted.iter().filter_map(|(i, _)| *i).collect();
        roots.sort();
        roots.dedup();
        let mask = ProjectionMask::roots(builder.parquet_schema(), roots.iter().copied());
        let mut stream = builder
            .with_projection(mask)
            .with_batch_size(64 * 1024)
            .build()
            .with_context(|| format!("reading the keys of {path}"))?;
        let mut pos: u64 = 0;
        let mut gone = deleted.iter().copied().peekable();
        while let Some(batch) = stream.next().await {
            let batch = batch.with_context(|| format!("reading the keys of {path}"))?;
            let mut cols: Vec<ArrayRef> = Vec::with_capacity(wanted.len());
            for (file_col, dt) in &wanted {
                let col = match file_col.and_then(|i| roots.iter().position(|r| *r == i)) {
                    Some(j) => {
                        let c = batch.column(j);
                        if c.data_type() == dt {
                            c.clone()
                        } else {
                            cast(c.as_ref(), dt)?
                        }
                    }
                    None => new_null_array(dt, batch.num_rows()),
                };
                cols.push(col);
            }
            for row in 0..batch.num_rows() {
                let p = pos + row as u64;
                while gone.next_if(|g| *g < p).is_some() {}
                if gone.next_if_eq(&p).is_some() {
                    continue;
                }
                if let Some(key) = self.keys.encoder().from_arrays(&cols, row) {
                    self.index_insert(
                        key,
                        Loc {
                            file: file_no,
                            pos: p,
                        },
                    )?;
                }
            }
            pos += batch.num_rows() as u64;
        }
        self.files.push(path);
        Ok(())
    }

    pub(super) async fn read_file(&self, path: &str) -> Result<Bytes> {
        self.table
            .file_io()
            .new_input(path)?
            .read()
            .await
            .with_context(|| format!("reading {path}"))
    }

    /// Decodes pending rows into a batch, filling values an update left unchanged from the
    /// previous version of the row in Iceberg.
    pub(super) async fn build_batch(&self, live: &[PendingRow]) -> Result<RecordBatch> {
        let columns = self.build_columns(live).await?;
        Ok(RecordBatch::try_new(self.arrow.clone(), columns)?)
    }

    /// The columns of [`TableSink::build_batch`], not checked against the table's NOT NULLs
    /// (a changelog's delete rows hold the key only).
    pub(super) async fn build_columns(&self, live: &[PendingRow]) -> Result<Vec<ArrayRef>> {
        let mut builders: Vec<ColumnBuilder> = self
            .arrow
            .fields()
            .iter()
            .zip(&self.pg)
            .map(|(f, pg)| ColumnBuilder::new(pg, f.data_type(), live.len()))
            .collect();
        for row in live {
            for (i, (b, d)) in builders.iter_mut().zip(&row.values).enumerate() {
                match d {
                    Datum::Null | Datum::Unchanged => b.append_null(),
                    Datum::Text(v) => {
                        let s = std::str::from_utf8(v).map_err(|_| {
                            Error::unrepresentable(format!(
                                "table {}, column `{}`: the value is not UTF-8",
                                self.source, self.names[i]
                            ))
                        })?;
                        b.append_text(s).map_err(|e| {
                            Error::unrepresentable(format!(
                                "table {}, column `{}`: {}; nothing of it was committed: update or delete the row at the source, then run `skipprd sync` again (the row's later version replaces this value before anything is written)",
                                self.source, self.names[i], e.0
                            ))
                        })?;
                    }
                }
            }
        }
        let mut columns: Vec<ArrayRef> = builders.iter_mut().map(|b| b.finish()).collect();

        // Values left unchanged by an update: read the previous versions and interleave them.
        let needs: Vec<(usize, Loc)> = live
            .iter()
            .enumerate()
            .filter(|(_, r)| r.values.iter().any(|d| matches!(d, Datum::Unchanged)))
            .filter_map(|(i, r)| r.previous.map(|l| (i, l)))
            .collect();
        if !needs.is_empty() {
            let previous = self
                .read_rows(&needs.iter().map(|(_, l)| *l).collect::<Vec<_>>())
                .await?;
            for (c, col) in columns.iter_mut().enumerate() {
                let mut indices: Vec<(usize, usize)> = (0..live.len()).map(|r| (0, r)).collect();
                let mut any = false;
                for (k, (r, _)) in needs.iter().enumerate() {
                    if matches!(live[*r].values[c], Datum::Unchanged) {
                        indices[*r] = (1, k);
                        any = true;
                    }
                }
                if any {
                    *col = interleave(&[col.as_ref(), previous.column(c).as_ref()], &indices)?;
                }
            }
        }
        Ok(columns)
    }

    /// Reads whole rows at `locs`, in that order, shaped like the table's current schema.
    pub(super) async fn read_rows(&self, locs: &[Loc]) -> Result<RecordBatch> {
        let mut by_file: HashMap<u32, Vec<(usize, u64)>> = HashMap::new();
        for (i, l) in locs.iter().enumerate() {
            by_file.entry(l.file).or_default().push((i, l.pos));
        }
        let mut parts: Vec<RecordBatch> = Vec::new();
        let mut order: Vec<usize> = Vec::new();
        for (file, wanted) in by_file {
            let path = &self.files[file as usize];
            let mut positions: Vec<u64> = wanted.iter().map(|(_, p)| *p).collect();
            positions.sort_unstable();
            positions.dedup();
            let all = self.read_positions(path, &positions).await?;
            // Each wanted row's place among the rows read (ascending, unique positions).
            let idx = wanted
                .iter()
                .map(|(_, p)| {
                    positions
                        .binary_search(p)
                        .map(|k| k as u32)
                        .map_err(|_| Error::fatal("a row position was not read back"))
                })
                .collect::<Result<UInt32Array>>()?;
            let cols = all
                .columns()
                .iter()
                .map(|c| take(c.as_ref(), &idx, None))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            let rows = RecordBatch::try_new(all.schema(), cols)?;
            parts.push(self.by_field_id(&rows)?);
            order.extend(wanted.iter().map(|(i, _)| *i));
        }
        let merged = concat_batches(&self.arrow, &parts)?;
        // Put rows back in the order asked for.
        let mut inverse = vec![0u32; order.len()];
        for (pos, i) in order.iter().enumerate() {
            inverse[*i] = pos as u32;
        }
        let idx = UInt32Array::from(inverse);
        let cols = merged
            .columns()
            .iter()
            .map(|c| take(c.as_ref(), &idx, None))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(RecordBatch::try_new(self.arrow.clone(), cols)?)
    }

    /// Reads the rows at `positions` (ascending, unique) of a data file, every column, in
    /// that order: only the pages holding them are fetched and decoded (by the offset index),
    /// so memory follows the rows asked for, not the file's size.
    async fn read_positions(&self, path: &str, positions: &[u64]) -> Result<RecordBatch> {
        let input = self.table.file_io().new_input(path)?;
        let size = input
            .metadata()
            .await
            .with_context(|| format!("reading the size of {path}"))?
            .size;
        let reader = file_reader(&self.table, path, size).await?;
        let options = ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Optional);
        let builder = ParquetRecordBatchStreamBuilder::new_with_options(reader, options)
            .await
            .with_context(|| format!("reading the footer of {path}"))?;
        let total = builder.metadata().file_metadata().num_rows().max(0) as u64;
        let mut selectors = Vec::new();
        let mut at = 0u64;
        for &p in positions {
            if p >= total {
                return Err(Error::fatal(format!(
                    "the key index points past the end of data file {path}"
                )));
            }
            if p > at {
                selectors.push(RowSelector::skip((p - at) as usize));
            }
            selectors.push(RowSelector::select(1));
            at = p + 1;
        }
        if total > at {
            selectors.push(RowSelector::skip((total - at) as usize));
        }
        let schema = builder.schema().clone();
        let mut stream = builder
            .with_row_selection(RowSelection::from(selectors))
            .build()
            .with_context(|| format!("reading {path}"))?;
        let mut batches = Vec::new();
        while let Some(batch) = stream.next().await {
            batches.push(batch.with_context(|| format!("reading {path}"))?);
        }
        let rows = concat_batches(&schema, &batches)?;
        if rows.num_rows() != positions.len() {
            return Err(Error::fatal(format!(
                "read {} rows of data file {path} where {} were asked for",
                rows.num_rows(),
                positions.len()
            )));
        }
        Ok(rows)
    }

    /// Reshapes rows read from a data file to the table's current schema (see [`by_field_id`]).
    pub(super) fn by_field_id(&self, rows: &RecordBatch) -> Result<RecordBatch> {
        by_field_id(rows, &self.arrow)
    }
}

/// A reader of the data file at `path` (of `size` bytes) of `table`.
pub(super) async fn file_reader(
    table: &iceberg::table::Table,
    path: &str,
    size: u64,
) -> Result<ArrowFileReader> {
    let input = table.file_io().new_input(path)?;
    Ok(ArrowFileReader::new(
        FileMetadata { size },
        input
            .reader()
            .await
            .with_context(|| format!("opening {path}"))?,
    ))
}

/// Reshapes rows read from a data file to `target` (a table's current schema), matching
/// columns by Iceberg field id (a renamed column keeps its id, never its name): older types
/// are cast to the current one, fields the file predates read NULL.
pub(super) fn by_field_id(
    rows: &RecordBatch,
    target: &arrow::datatypes::SchemaRef,
) -> Result<RecordBatch> {
    let file_ids: Vec<Option<i32>> = rows.schema().fields().iter().map(field_id).collect();
    let cols = target
        .fields()
        .iter()
        .map(|f| {
            let at = field_id(f).and_then(|id| file_ids.iter().position(|x| *x == Some(id)));
            match at {
                Some(i) if rows.column(i).data_type() == f.data_type() => {
                    Ok(rows.column(i).clone())
                }
                Some(i) => Ok(cast(rows.column(i).as_ref(), f.data_type())?),
                None => Ok(new_null_array(f.data_type(), rows.num_rows())),
            }
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(target.clone(), cols)?)
}

/// The Iceberg field id a Parquet/Arrow field carries.
fn field_id(f: &arrow::datatypes::FieldRef) -> Option<i32> {
    f.metadata()
        .get(PARQUET_FIELD_ID_META_KEY)
        .and_then(|v| v.parse().ok())
}

#[cfg(test)]
mod deleted_tests {
    use super::Deleted;

    #[test]
    fn positions_by_file_sorted_once_and_negative_ignored() {
        let mut d = Deleted::default();
        for (path, pos) in [("a", 5), ("a", 1), ("b", 7), ("a", 5), ("b", -1), ("a", 3)] {
            d.add(path, pos);
        }
        let by_file = d.into_sorted();
        assert_eq!(by_file.len(), 2);
        assert_eq!(by_file.get("a").map(Vec::as_slice), Some(&[1, 3, 5][..]));
        assert_eq!(by_file.get("b").map(Vec::as_slice), Some(&[7][..]));
    }
}
