//! Queries, committed side: skipping data the scan's filters rule out: row groups by their
//! Parquet statistics and pages by the page index, before any of it is read.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BooleanArray};
use arrow::compute::cast;
use arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::pruning::PruningStatistics;
use parquet::arrow::arrow_reader::statistics::StatisticsConverter;
use parquet::arrow::arrow_reader::{RowSelection, RowSelector};
use parquet::arrow::ParquetRecordBatchStreamBuilder;

use super::{field_id, ScanFilter};
use crate::query::file_read::PartReader;

/// The row groups of a file that the filters may match, by their Parquet statistics.
pub(super) fn row_groups(
    file: &SchemaRef,
    metadata: &parquet::file::metadata::ParquetMetaData,
    table_schema: &SchemaRef,
    filter: &ScanFilter,
) -> Vec<usize> {
    let all: Vec<usize> = (0..metadata.num_row_groups()).collect();
    let Some(pruning) = &filter.pruning else {
        return all;
    };
    let stats = RowGroupStats::of(file, metadata, table_schema, filter);
    match pruning.prune(&stats) {
        Ok(keep) => all.into_iter().filter(|i| keep[*i]).collect(),
        Err(e) => {
            tracing::debug!(error = %e, "row-group statistics not usable; reading every row group");
            all
        }
    }
}

/// Whether every row of the row groups `kept` passes the filters, by the file's statistics:
/// the filters' negation ([`ScanFilter::proof`]) rules out each of them, and none holds a
/// NULL in a filter column (where a filter gives NULL, the row does not pass). False when a
/// filter column is missing from the file or has no statistics.
pub(super) fn proven_true(
    file: &SchemaRef,
    metadata: &parquet::file::metadata::ParquetMetaData,
    table_schema: &SchemaRef,
    filter: &ScanFilter,
    kept: &[usize],
) -> bool {
    let Some(proof) = &filter.proof else {
        return false;
    };
    if kept.is_empty() {
        return false;
    }
    let stats = RowGroupStats::of(file, metadata, table_schema, filter);
    let no_nulls = stats.targets.iter().all(|t| {
        let column = datafusion::common::Column::new_unqualified(t.name());
        stats.null_counts(&column).is_some_and(|counts| {
            counts
                .as_any()
                .downcast_ref::<arrow::array::UInt64Array>()
                .is_some_and(|c| {
                    kept.iter()
                        .all(|rg| *rg < c.len() && c.is_valid(*rg) && c.value(*rg) == 0)
                })
        })
    });
    no_nulls
        && proof
            .prune(&stats)
            .is_ok_and(|may_fail| kept.iter().all(|rg| may_fail.get(*rg) == Some(&false)))
}

/// The rows of the row groups `kept` on the pages that the filters may match, judged by
/// the file's column index (each page's min, max and null count); None when the filters
/// read more than one column (pages of different columns do not line up), when the file
/// has no page index, or when no page can be skipped. `table_schema`: the scan's.
pub(super) fn pages(
    table_schema: &SchemaRef,
    builder: &ParquetRecordBatchStreamBuilder<PartReader>,
    filter: &ScanFilter,
    kept: &[usize],
) -> Option<RowSelection> {
    let pruning = filter.pruning.as_ref()?;
    let [column] = filter.columns.as_slice() else {
        return None;
    };
    let metadata = builder.metadata();
    let (column_index, offset_index) = (metadata.column_index()?, metadata.offset_index()?);
    let stats = RowGroupStats {
        file: builder.schema().clone(),
        parquet: builder.parquet_schema(),
        row_groups: metadata.row_groups(),
        targets: vec![table_schema.field(*column).clone()],
    };
    let target = datafusion::common::Column::from_name(table_schema.field(*column).name());
    let leaf = stats.converter(&target)?.0.parquet_column_index()?;
    let mut selectors = Vec::new();
    let mut skipped = false;
    for rg in kept {
        let rows = metadata.row_group(*rg).num_rows().max(0) as usize;
        let locations = offset_index.get(*rg)?.get(leaf)?.page_locations();
        let pages = PageStats {
            row_group: stats.clone(),
            column_index,
            offset_index,
            at: [*rg],
            pages: locations.len(),
        };
        let keep = match pruning.prune(&pages) {
            Ok(keep) if keep.len() == locations.len() => keep,
            _ => vec![true; locations.len()],
        };
        for (i, page) in locations.iter().enumerate() {
            let first = page.first_row_index.max(0) as usize;
            let end = locations
                .get(i + 1)
                .map_or(rows, |next| next.first_row_index.max(0) as usize);
            let n = end.saturating_sub(first);
            if n == 0 {
                continue;
            }
            if keep[i] {
                selectors.push(RowSelector::select(n));
            } else {
                selectors.push(RowSelector::skip(n));
                skipped = true;
            }
        }
    }
    skipped.then(|| RowSelection::from(selectors))
}

/// The page index of one column in one row group, as pruning statistics: one container per
/// data page.
struct PageStats<'a> {
    row_group: RowGroupStats<'a>,
    column_index: &'a parquet::file::metadata::ParquetColumnIndex,
    offset_index: &'a parquet::file::metadata::ParquetOffsetIndex,
    at: [usize; 1],
    pages: usize,
}

impl PageStats<'_> {
    fn bound(&self, column: &datafusion::common::Column, max: bool) -> Option<ArrayRef> {
        let (converter, dt) = self.row_group.converter(column)?;
        let values = if max {
            converter.data_page_maxes(self.column_index, self.offset_index, &self.at)
        } else {
            converter.data_page_mins(self.column_index, self.offset_index, &self.at)
        }
        .ok()?;
        in_table_type(values, dt)
    }
}

impl PruningStatistics for PageStats<'_> {
    fn min_values(&self, column: &datafusion::common::Column) -> Option<ArrayRef> {
        self.bound(column, false)
    }

    fn max_values(&self, column: &datafusion::common::Column) -> Option<ArrayRef> {
        self.bound(column, true)
    }

    fn num_containers(&self) -> usize {
        self.pages
    }

    fn null_counts(&self, column: &datafusion::common::Column) -> Option<ArrayRef> {
        let (converter, _) = self.row_group.converter(column)?;
        let counts = converter
            .data_page_null_counts(self.column_index, self.offset_index, &self.at)
            .ok()?;
        Some(Arc::new(counts))
    }

    fn row_counts(&self, column: &datafusion::common::Column) -> Option<ArrayRef> {
        let (converter, _) = self.row_group.converter(column)?;
        let counts = converter
            .data_page_row_counts(self.offset_index, self.row_group.row_groups, &self.at)
            .ok()??;
        Some(Arc::new(counts))
    }

    fn contained(
        &self,
        _column: &datafusion::common::Column,
        _values: &std::collections::HashSet<datafusion::common::ScalarValue>,
    ) -> Option<BooleanArray> {
        None
    }
}

/// Min, max and null counts of the filter columns, per row group of one file, for
/// [`PruningPredicate`](datafusion::physical_optimizer::pruning::PruningPredicate): columns
/// found by field id, values cast to the table's types.
#[derive(Clone)]
struct RowGroupStats<'a> {
    file: SchemaRef,
    parquet: &'a parquet::schema::types::SchemaDescriptor,
    row_groups: &'a [parquet::file::metadata::RowGroupMetaData],
    targets: Vec<arrow::datatypes::Field>,
}

impl<'a> RowGroupStats<'a> {
    /// The statistics of the filter columns of every row group of one file.
    fn of(
        file: &SchemaRef,
        metadata: &'a parquet::file::metadata::ParquetMetaData,
        table_schema: &SchemaRef,
        filter: &ScanFilter,
    ) -> Self {
        RowGroupStats {
            file: file.clone(),
            parquet: metadata.file_metadata().schema_descr(),
            row_groups: metadata.row_groups(),
            targets: filter
                .columns
                .iter()
                .map(|i| table_schema.field(*i).clone())
                .collect(),
        }
    }

    /// The file's column and the table's type for a filter column.
    fn converter(
        &self,
        column: &datafusion::common::Column,
    ) -> Option<(StatisticsConverter<'_>, &DataType)> {
        let target = self.targets.iter().find(|t| t.name() == &column.name)?;
        let id = field_id(target)?;
        let file_field = self
            .file
            .fields()
            .iter()
            .find(|f| field_id(f) == Some(id))?;
        let converter =
            StatisticsConverter::try_new(file_field.name(), &self.file, self.parquet).ok()?;
        Some((converter, target.data_type()))
    }

    fn bound(&self, column: &datafusion::common::Column, max: bool) -> Option<ArrayRef> {
        let (converter, dt) = self.converter(column)?;
        let values = if max {
            converter.row_group_maxes(self.row_groups).ok()?
        } else {
            converter.row_group_mins(self.row_groups).ok()?
        };
        in_table_type(values, dt)
    }
}

/// Statistics read from a file, in the table's type of the column (older files may hold a
/// narrower one); None when they cannot be cast.
fn in_table_type(values: ArrayRef, dt: &DataType) -> Option<ArrayRef> {
    if values.data_type() == dt {
        Some(values)
    } else {
        cast(&values, dt).ok()
    }
}

impl PruningStatistics for RowGroupStats<'_> {
    fn min_values(&self, column: &datafusion::common::Column) -> Option<ArrayRef> {
        self.bound(column, false)
    }

    fn max_values(&self, column: &datafusion::common::Column) -> Option<ArrayRef> {
        self.bound(column, true)
    }

    fn num_containers(&self) -> usize {
        self.row_groups.len()
    }

    fn null_counts(&self, column: &datafusion::common::Column) -> Option<ArrayRef> {
        let (converter, _) = self.converter(column)?;
        let counts = converter.row_group_null_counts(self.row_groups).ok()?;
        Some(Arc::new(counts))
    }

    fn row_counts(&self, _column: &datafusion::common::Column) -> Option<ArrayRef> {
        Some(Arc::new(arrow::array::UInt64Array::from_iter_values(
            self.row_groups.iter().map(|rg| rg.num_rows().max(0) as u64),
        )))
    }

    fn contained(
        &self,
        _column: &datafusion::common::Column,
        _values: &std::collections::HashSet<datafusion::common::ScalarValue>,
    ) -> Option<BooleanArray> {
        None
    }
}
