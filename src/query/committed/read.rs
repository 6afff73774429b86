//! Queries, committed side: reading one planned data file: the row groups and rows to
//! read (deleted, hidden or not matching), the columns matched to the table's by field id,
//! and the batches handed to the scan's stream.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{
    new_null_array, Array, ArrayRef, AsArray, BooleanArray, Int64Array, RecordBatch,
};
use arrow::compute::{cast, filter_record_batch};
use arrow::datatypes::{DataType, Int64Type, SchemaRef};
use arrow::error::ArrowError;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::physical_plan::metrics::Count;
use futures::stream::BoxStream;
use futures::StreamExt;
use iceberg::io::FileIO;
use parquet::arrow::arrow_reader::{ArrowPredicateFn, RowFilter, RowSelection, RowSelector};
use parquet::arrow::{ParquetRecordBatchStreamBuilder, ProjectionMask};

use super::cache::{footer, KeyColumn, ScanCaches, EXACT_MAX_KEY_BYTES, KEY_BYTES_PER_ROW};
use super::prune::row_groups;
use super::{df_err, field_id, DataFile, Hide, ScanFilter};
use crate::query::file_read::PartReader;

/// The per-partition reading state.
pub(super) struct FileReader {
    pub(super) file_io: FileIO,
    pub(super) table_schema: SchemaRef,
    pub(super) projection: Vec<usize>,
    pub(super) key_cols: Vec<usize>,
    pub(super) hide: Hide,
    pub(super) filter: Option<ScanFilter>,
    pub(super) caches: Arc<ScanCaches>,
    pub(super) schema: SchemaRef,
    pub(super) batch_size: usize,
    pub(super) files_read: Count,
    pub(super) row_groups_read: Count,
    pub(super) row_groups_pruned: Count,
    /// Row groups read without testing a strict filter: their statistics prove it true.
    pub(super) row_groups_proven: Count,
}

impl FileReader {
    /// Opens a Parquet file for reading. With `page_index`, its offset and column indexes
    /// are read too, so that the pages holding none of the selected rows (a filtered scan:
    /// a point lookup selects one row) are neither fetched nor decompressed.
    async fn builder(
        &self,
        path: &str,
        size: u64,
        page_index: bool,
    ) -> DfResult<ParquetRecordBatchStreamBuilder<PartReader>> {
        let (reader, meta) = footer(&self.file_io, &self.caches, path, size, page_index).await?;
        Ok(ParquetRecordBatchStreamBuilder::new_with_metadata(
            reader, meta,
        ))
    }

    /// Positions of rows removed by the file's position deletes (only those in `within`,
    /// ranges of positions in file order, when given).
    async fn deleted(&self, file: &DataFile, within: Option<&[(u64, u64)]>) -> DfResult<Vec<u64>> {
        let mut out = Vec::new();
        for (path, size) in &file.deletes {
            let map = match self.caches.deletes(path) {
                Some(m) => m,
                None => {
                    let mut map: HashMap<String, Vec<u64>> = HashMap::new();
                    let mut stream = self
                        .builder(path, *size, false)
                        .await?
                        .build()
                        .map_err(df_err)?;
                    while let Some(batch) = stream.next().await {
                        let batch = batch.map_err(df_err)?;
                        let (Some(paths), Some(pos)) = (
                            batch.column(0).as_string_opt::<i32>(),
                            batch.column(1).as_primitive_opt::<Int64Type>(),
                        ) else {
                            return Err(DataFusionError::Execution(format!(
                                "position delete file {path} does not have (file_path string, pos long) columns"
                            )));
                        };
                        for i in 0..batch.num_rows() {
                            map.entry(paths.value(i).to_string())
                                .or_default()
                                .push(pos.value(i) as u64);
                        }
                    }
                    for positions in map.values_mut() {
                        positions.sort_unstable();
                    }
                    let map = Arc::new(map);
                    self.caches.put_deletes(path, map.clone());
                    map
                }
            };
            if let Some(p) = map.get(&file.path) {
                match within {
                    None => out.extend_from_slice(p),
                    Some(ranges) => {
                        for (start, end) in ranges {
                            let from = p.partition_point(|x| x < start);
                            let to = p.partition_point(|x| x < end);
                            out.extend_from_slice(&p[from..to]);
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// The file's single integer key column, in file order (cached per file; read once
    /// however many statements want it at the same time).
    async fn key_column(&self, file: &DataFile) -> DfResult<KeyColumn> {
        if let Some(k) = self.caches.keys(&file.path) {
            return Ok(k);
        }
        let cell = {
            let mut loading = self
                .caches
                .loading
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            loading.entry(file.path.clone()).or_default().clone()
        };
        let keys = cell
            .get_or_try_init(|| self.read_key_column(file))
            .await
            .cloned();
        self.caches
            .loading
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&file.path);
        keys
    }

    async fn read_key_column(&self, file: &DataFile) -> DfResult<KeyColumn> {
        if let Some(k) = self.caches.keys(&file.path) {
            return Ok(k);
        }
        let builder = self.builder(&file.path, file.size, false).await?;
        let key = Arc::new(self.table_schema.field(self.key_cols[0]).clone());
        let map = ColumnMap::new(builder.schema(), std::slice::from_ref(&key));
        let mask = ProjectionMask::roots(builder.parquet_schema(), map.roots.iter().copied());
        let mut stream = builder
            .with_projection(mask)
            .with_batch_size(64 * 1024)
            .build()
            .map_err(df_err)?;
        let mut parts: Vec<ArrayRef> = Vec::new();
        while let Some(batch) = stream.next().await {
            let batch = batch.map_err(df_err)?;
            let col = map.columns(&batch, std::slice::from_ref(&key))?.remove(0);
            parts.push(cast(&col, &DataType::Int64)?);
        }
        let refs: Vec<&dyn Array> = parts.iter().map(|a| a.as_ref()).collect();
        let keys = if refs.is_empty() {
            Int64Array::from(Vec::<i64>::new())
        } else {
            arrow::compute::concat(&refs)?
                .as_primitive::<Int64Type>()
                .clone()
        };
        let keys = KeyColumn::new(keys);
        self.caches.put_keys(&file.path, keys.clone());
        Ok(keys)
    }

    /// The positions of the filter's key values in `file`, when a filter pins a single
    /// integer key and the file's key column is small enough to cache;
    /// `None` otherwise (the page index and the row filter find the rows then).
    async fn exact_rows(&self, file: &DataFile) -> DfResult<Option<Vec<u64>>> {
        let Some(values) = self.filter.as_ref().and_then(|f| f.keys.as_ref()) else {
            return Ok(None);
        };
        if self.key_cols.len() != 1
            || file.file_rows.saturating_mul(KEY_BYTES_PER_ROW) > EXACT_MAX_KEY_BYTES
        {
            return Ok(None);
        }
        let keys = self.key_column(file).await?;
        Ok(keys.positions(values))
    }

    /// Opens one data file: the rows to skip are its deleted rows and, when hiding by
    /// position, the rows whose key the tail replaced.
    pub(super) async fn open(
        &self,
        file: DataFile,
    ) -> DfResult<BoxStream<'static, DfResult<RecordBatch>>> {
        // A lookup by key: the rows holding the keys, exactly, when the file's keys are known.
        let exact = self.exact_rows(&file).await?;
        if exact.as_ref().is_some_and(|p| p.is_empty()) {
            return Ok(futures::stream::empty().boxed());
        }
        // A filtered scan (a lookup) reads few rows: hiding them by their decoded key costs
        // less than turning the tail's keys into positions over the whole file's key column.
        let hide_read_keys = self.filter.is_some() && matches!(self.hide, Hide::Positions(_));
        let builder = self
            .builder(&file.path, file.size, self.filter.is_some())
            .await?;
        // Row groups the filters may match, and the rows each covers in the file.
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        let mut start = 0u64;
        for rg in builder.metadata().row_groups() {
            let end = start + rg.num_rows().max(0) as u64;
            ranges.push((start, end));
            start = end;
        }
        let kept: Vec<usize> = match (&file.row_groups, &self.filter) {
            (Some(planned), _) => planned.clone(),
            (None, Some(f)) => {
                row_groups(builder.schema(), builder.metadata(), &self.table_schema, f)
            }
            (None, None) => (0..ranges.len()).collect(),
        };
        let kept: Vec<usize> = match &exact {
            Some(p) => kept
                .into_iter()
                .filter(|rg| {
                    let (start, end) = ranges[*rg];
                    let i = p.partition_point(|x| *x < start);
                    p.get(i).is_some_and(|x| *x < end)
                })
                .collect(),
            None => kept,
        };
        self.files_read.add(1);
        // (A piece of a file split over partitions counts only its own row groups.)
        let candidates = file.row_groups.as_ref().map_or(ranges.len(), Vec::len);
        self.row_groups_pruned
            .add(candidates.saturating_sub(kept.len()));
        if kept.is_empty() {
            return Ok(futures::stream::empty().boxed());
        }
        self.row_groups_read.add(kept.len());
        let kept_ranges: Vec<(u64, u64)> = kept.iter().map(|i| ranges[*i]).collect();
        let within =
            (self.filter.is_some() || file.row_groups.is_some()).then_some(kept_ranges.as_slice());
        let mut skip = self.deleted(&file, within).await?;
        if let (Hide::Positions(hidden), false) = (&self.hide, hide_read_keys) {
            let keys = self.key_column(&file).await?;
            for (pos, k) in keys.values.iter().enumerate() {
                if k.is_some_and(|k| hidden.hides_int(k)) {
                    skip.push(pos as u64);
                }
            }
        }
        let pruned = kept.len() < ranges.len();
        // Within the row groups kept, the pages the filters may match (by the page index).
        let pages = match &exact {
            Some(p) => Some(exact_selection(p, &kept_ranges)),
            None => self
                .filter
                .as_ref()
                .and_then(|f| super::prune::pages(&self.table_schema, &builder, f, &kept)),
        };
        let narrowed = exact.is_none() && pages.is_some();
        // A strict filter is tested on every row, unless the statistics of every row group
        // read prove it true for all of their rows.
        let strict = self.filter.as_ref().filter(|f| {
            f.strict
                && !super::prune::proven_true(
                    builder.schema(),
                    builder.metadata(),
                    &self.table_schema,
                    f,
                    &kept,
                )
        });
        // The columns to read: the projection, plus the keys when hiding by key.
        let mut read: Vec<usize> = self.projection.clone();
        let hide_keys = match &self.hide {
            Hide::Keys(h) => Some(h.clone()),
            Hide::Positions(h) if hide_read_keys => Some(h.clone()),
            _ => None,
        };
        if hide_keys.is_some() {
            for k in &self.key_cols {
                if !read.contains(k) {
                    read.push(*k);
                }
            }
        }
        let proven = self.filter.as_ref().is_some_and(|f| f.strict) && strict.is_none();
        if proven {
            self.row_groups_proven.add(kept.len());
        }
        let row_filter = self
            .filter
            .as_ref()
            .filter(|_| !proven)
            .filter(|f| f.keys.is_some() || narrowed)
            .filter(|f| exact.is_none() || f.columns != self.key_cols)
            // Rows hidden by key after decoding (the tail replaced them) are still decoded
            // here: an error on such a stale row must not fail the statement, so the
            // decoder's filter is strict only when every row it sees is visible.
            .map(|f| {
                row_filter(
                    f,
                    &self.table_schema,
                    &builder,
                    f.strict && hide_keys.is_none(),
                )
            });
        // A strict filter the decoder does not apply (or not strictly) is applied to each
        // batch read, after hiding, from its columns read beside the projection.
        let strict_in_decoder = row_filter.is_some() && hide_keys.is_none();
        let post_filter = strict.filter(|_| !strict_in_decoder).map(|f| {
            for c in &f.columns {
                if !read.contains(c) {
                    read.push(*c);
                }
            }
            let at: Vec<usize> = f
                .columns
                .iter()
                .filter_map(|c| read.iter().position(|r| r == c))
                .collect();
            (f.predicate.clone(), at)
        });
        let targets: Vec<arrow::datatypes::FieldRef> = read
            .iter()
            .map(|i| Arc::new(self.table_schema.field(*i).clone()))
            .collect();
        let map = ColumnMap::new(builder.schema(), &targets);
        let mask = ProjectionMask::roots(builder.parquet_schema(), map.roots.iter().copied());
        // The filters are evaluated while decoding (the other columns decoded only for the
        // rows that pass) when the scan is a search: a lookup by key, or a filter the page
        // index narrowed to some pages. A filter over the whole file is left to DataFusion
        // above, as its own Parquet scan does by default: decoding a selection scattered
        // over every page costs more than the columns it spares (TPC-H at SF 1 ran 7% faster
        // without, Q6 20%). Rows found by their key need no filter on the key again
        // (DataFusion, or the lookup, checks the key of what comes back; a strict filter is
        // applied to them after reading).
        let mut builder = builder
            .with_projection(mask)
            .with_batch_size(self.batch_size);
        if pruned {
            builder = builder.with_row_groups(kept);
        }
        let rows = match (skip.is_empty(), pages) {
            (true, pages) => pages,
            (false, None) => Some(selection(skip, &kept_ranges)),
            (false, Some(pages)) => Some(selection(skip, &kept_ranges).intersection(&pages)),
        };
        if let Some(rows) = rows {
            if !rows.selects_any() {
                return Ok(futures::stream::empty().boxed());
            }
            builder = builder.with_row_selection(rows);
        }
        if let Some(row_filter) = row_filter {
            builder = builder.with_row_filter(row_filter);
        }
        let stream = builder.build().map_err(|e| {
            DataFusionError::Execution(format!("reading Parquet file {}: {e}", file.path))
        })?;
        let key_pos: Vec<usize> = self
            .key_cols
            .iter()
            .filter_map(|k| read.iter().position(|c| c == k))
            .collect();
        let out_n = self.projection.len();
        let schema = self.schema.clone();
        let path = file.path.clone();
        Ok(stream
            .map(move |batch| -> DfResult<RecordBatch> {
                let batch = batch.map_err(|e| {
                    DataFusionError::Execution(format!("reading Parquet file {path}: {e}"))
                })?;
                let mut cols = map.columns(&batch, &targets)?;
                if let Some(hidden) = &hide_keys {
                    let keys: Vec<ArrayRef> = key_pos.iter().map(|k| cols[*k].clone()).collect();
                    let mask = hidden.keep(&keys)?;
                    let rows = RecordBatch::try_new_with_options(
                        schema_of(&targets),
                        cols,
                        &arrow::array::RecordBatchOptions::new()
                            .with_row_count(Some(batch.num_rows())),
                    )?;
                    cols = filter_record_batch(&rows, &mask)?.columns().to_vec();
                }
                if let Some((predicate, at)) = &post_filter {
                    let n = cols.first().map_or(batch.num_rows(), |c| c.len());
                    let tested = RecordBatch::try_new_with_options(
                        predicate_schema(&targets, at),
                        at.iter().map(|i| cols[*i].clone()).collect(),
                        &arrow::array::RecordBatchOptions::new().with_row_count(Some(n)),
                    )?;
                    let keep = predicate.evaluate(&tested)?.into_array(n)?;
                    let keep = keep.as_boolean_opt().ok_or_else(|| {
                        DataFusionError::Execution(format!(
                            "the filter {predicate} does not give a boolean"
                        ))
                    })?;
                    let all = RecordBatch::try_new_with_options(
                        schema_of(&targets),
                        cols,
                        &arrow::array::RecordBatchOptions::new().with_row_count(Some(n)),
                    )?;
                    cols = filter_record_batch(&all, keep)?.columns().to_vec();
                }
                let n = cols.first().map(|c| c.len()).unwrap_or(batch.num_rows());
                cols.truncate(out_n);
                Ok(RecordBatch::try_new_with_options(
                    schema.clone(),
                    cols,
                    &arrow::array::RecordBatchOptions::new().with_row_count(Some(n)),
                )?)
            })
            .boxed())
    }
}

pub(super) fn schema_of(fields: &[arrow::datatypes::FieldRef]) -> SchemaRef {
    Arc::new(arrow::datatypes::Schema::new(fields.to_vec()))
}

/// The schema a scan filter's predicate reads: its columns, found at `at` among `fields`.
fn predicate_schema(fields: &[arrow::datatypes::FieldRef], at: &[usize]) -> SchemaRef {
    Arc::new(arrow::datatypes::Schema::new(
        at.iter().map(|i| fields[*i].clone()).collect::<Vec<_>>(),
    ))
}

/// Rows to read from the row groups read (`ranges`, in file order): exactly `positions`
/// (ascending positions in the file).
pub(super) fn exact_selection(positions: &[u64], ranges: &[(u64, u64)]) -> RowSelection {
    marked(positions, ranges, true)
}

/// Rows to read from the row groups read (`ranges`: each one's rows in the file, in file
/// order), given the sorted or unsorted positions in the file to skip.
pub(super) fn selection(mut skip: Vec<u64>, ranges: &[(u64, u64)]) -> RowSelection {
    skip.sort_unstable();
    skip.dedup();
    marked(&skip, ranges, false)
}

/// A selection over the rows of `ranges` in which the rows at `positions` (ascending,
/// distinct) are selected and the others skipped (`select`), or the other way round.
fn marked(positions: &[u64], ranges: &[(u64, u64)], select: bool) -> RowSelection {
    type Run = fn(usize) -> RowSelector;
    let (mark, rest): (Run, Run) = if select {
        (RowSelector::select, RowSelector::skip)
    } else {
        (RowSelector::skip, RowSelector::select)
    };
    let mut selectors = Vec::new();
    for (start, end) in ranges {
        let mut at = *start;
        let from = positions.partition_point(|p| p < start);
        for p in positions[from..].iter().take_while(|p| *p < end) {
            if *p > at {
                selectors.push(rest((p - at) as usize));
            }
            selectors.push(mark(1));
            at = p + 1;
        }
        if *end > at {
            selectors.push(rest((*end - at) as usize));
        }
    }
    RowSelection::from(selectors)
}

/// A Parquet row filter evaluating the scan's filters on their columns only: the other
/// columns are decoded just for the rows that pass. Unless `strict`, a filter that fails to
/// evaluate keeps every row (DataFusion evaluates it again above the scan and reports the
/// error); a strict one fails the read.
fn row_filter(
    filter: &ScanFilter,
    table_schema: &SchemaRef,
    builder: &ParquetRecordBatchStreamBuilder<PartReader>,
    strict: bool,
) -> RowFilter {
    let targets: Vec<arrow::datatypes::FieldRef> = filter
        .columns
        .iter()
        .map(|i| Arc::new(table_schema.field(*i).clone()))
        .collect();
    let map = ColumnMap::new(builder.schema(), &targets);
    let mask = ProjectionMask::roots(builder.parquet_schema(), map.roots.iter().copied());
    let schema = schema_of(&targets);
    let predicate = filter.predicate.clone();
    let evaluate = move |batch: RecordBatch| -> Result<BooleanArray, ArrowError> {
        let n = batch.num_rows();
        if strict {
            let cols = map
                .columns(&batch, &targets)
                .map_err(|e| ArrowError::ExternalError(Box::new(e)))?;
            let batch = RecordBatch::try_new_with_options(
                schema.clone(),
                cols,
                &arrow::array::RecordBatchOptions::new().with_row_count(Some(n)),
            )?;
            let keep = predicate
                .evaluate(&batch)
                .and_then(|v| v.into_array(n))
                .map_err(|e| ArrowError::ExternalError(Box::new(e)))?;
            return keep.as_boolean_opt().cloned().ok_or_else(|| {
                ArrowError::ComputeError(format!("the filter {predicate} does not give a boolean"))
            });
        }
        let keep_all = || BooleanArray::from(vec![true; n]);
        let Ok(cols) = map.columns(&batch, &targets) else {
            return Ok(keep_all());
        };
        let Ok(batch) = RecordBatch::try_new_with_options(
            schema.clone(),
            cols,
            &arrow::array::RecordBatchOptions::new().with_row_count(Some(n)),
        ) else {
            return Ok(keep_all());
        };
        let Ok(value) = predicate.evaluate(&batch) else {
            return Ok(keep_all());
        };
        let Ok(array) = value.into_array(n) else {
            return Ok(keep_all());
        };
        match array.as_any().downcast_ref::<BooleanArray>() {
            Some(mask) => Ok(mask.clone()),
            None => Ok(keep_all()),
        }
    };
    RowFilter::new(vec![Box::new(ArrowPredicateFn::new(mask, evaluate))])
}

/// How a file's columns map to the table's: by field id, so columns added, renamed or
/// widened since the file was written read correctly (missing ones as NULL, older types
/// cast to the current one).
pub(super) struct ColumnMap {
    /// Root columns of the file to read, ascending.
    pub(super) roots: Vec<usize>,
    /// For each target column, its index among the read columns.
    source: Vec<Option<usize>>,
}

impl ColumnMap {
    pub(super) fn new(file: &SchemaRef, targets: &[arrow::datatypes::FieldRef]) -> Self {
        let file_ids: Vec<Option<i32>> = file.fields().iter().map(|f| field_id(f)).collect();
        let at: Vec<Option<usize>> = targets
            .iter()
            .map(|t| field_id(t).and_then(|id| file_ids.iter().position(|f| *f == Some(id))))
            .collect();
        let mut roots: Vec<usize> = at.iter().flatten().copied().collect();
        roots.sort_unstable();
        roots.dedup();
        let source = at
            .iter()
            .map(|a| a.and_then(|i| roots.iter().position(|r| *r == i)))
            .collect();
        Self { roots, source }
    }

    /// The target columns of a batch read with `roots`.
    pub(super) fn columns(
        &self,
        batch: &RecordBatch,
        targets: &[arrow::datatypes::FieldRef],
    ) -> DfResult<Vec<ArrayRef>> {
        targets
            .iter()
            .zip(&self.source)
            .map(|(t, s)| {
                let dt = t.data_type();
                Ok(match s {
                    Some(j) => {
                        let c = batch.column(*j);
                        if c.data_type() == dt {
                            c.clone()
                        } else {
                            cast(c.as_ref(), dt)?
                        }
                    }
                    None => new_null_array(dt, batch.num_rows()),
                })
            })
            .collect()
    }
}
