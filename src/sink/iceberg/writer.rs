//! Writes record batches into Parquet data files of a table, one partition of its current
//! spec per file (rows in its sort order, when it has one), rolling to a new file at the
//! configured target size. Files only become visible when a commit adds them.

use arrow::array::RecordBatch;
use iceberg::spec::{DataFile, DataFileFormat};
use iceberg::table::Table;
use iceberg::writer::base_writer::data_file_writer::{DataFileWriter, DataFileWriterBuilder};
use iceberg::writer::file_writer::location_generator::{
    DefaultFileNameGenerator, DefaultLocationGenerator,
};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::{IcebergWriter, IcebergWriterBuilder};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use parquet::schema::types::ColumnPath;

use std::collections::HashMap;

use iceberg::spec::Struct;

use crate::error::{Context, Error, Result};
use crate::table::partition::{Partitioner, WriteOrder};

/// Rows per Parquet row group.
const ROW_GROUP_ROWS: usize = 128 * 1024;
/// Rows per data page at most: the page index (min, max per page) lets a lookup by key
/// fetch and decompress one page of each column instead of a whole row group. A lookup
/// decompresses a whole page per column to read one row, so pages are kept small (32 KiB of
/// a 64-bit column); a scan decodes 4Ki values per page, still well past per-page costs.
const PAGE_ROWS: usize = 4 * 1024;
/// A column's dictionary page at most, after which the column chunk falls back to plain
/// encoding: a reader of any page of a chunk first decodes its whole dictionary, so a large
/// one (a column of unique values) costs a lookup more than the page it wants.
const DICTIONARY_BYTES: usize = 32 * 1024;

type Inner =
    DataFileWriter<ParquetWriterBuilder, DefaultLocationGenerator, DefaultFileNameGenerator>;
type Builder =
    DataFileWriterBuilder<ParquetWriterBuilder, DefaultLocationGenerator, DefaultFileNameGenerator>;

/// Partitions written to at the same time at most: writing to one more closes the file of
/// the one written to least recently (a snapshot in an order unrelated to the partitions
/// then makes more, smaller files, which compaction merges, instead of holding a row group
/// of every partition in memory).
const MAX_OPEN_PARTITIONS: usize = 32;
/// Row groups of a partitioned table's files are cut at this much encoded data at most, so
/// that the partitions written at once hold a bounded amount between them.
const PARTITIONED_ROW_GROUP_BYTES: usize = 8 * 1024 * 1024;
/// Decoded rows a sorted table's writer gathers before it writes the largest partition's
/// rows, sorted, as one file.
const SORT_BUFFER_BYTES: usize = 64 * 1024 * 1024;

/// What a table's file writers are made of, before the first rows are seen.
struct Pending {
    props: parquet::file::properties::WriterPropertiesBuilder,
    schema: iceberg::spec::SchemaRef,
    file_io: iceberg::io::FileIO,
    location: DefaultLocationGenerator,
    names: DefaultFileNameGenerator,
    target_file_size: usize,
}

impl Pending {
    /// The builder of the table's file writers, with dictionary encoding turned off for
    /// every column the first rows show as nearly unique.
    fn build(self, first: &RecordBatch) -> Builder {
        let mut props = self.props;
        for name in nearly_unique(first) {
            props = props.set_column_dictionary_enabled(ColumnPath::new(vec![name]), false);
        }
        let parquet = ParquetWriterBuilder::new(props.build(), self.schema);
        let rolling = RollingFileWriterBuilder::new(
            parquet,
            self.target_file_size,
            self.file_io,
            self.location,
            self.names,
        );
        DataFileWriterBuilder::new(rolling)
    }
}

/// Rows sampled from a table's first batch to judge each column's distinct values.
const SAMPLE_ROWS: usize = 4096;

/// The top-level columns of flat types whose values in the batch's first rows are more than
/// half distinct (ids, timestamps, free text). Dictionary encoding such a column only interns
/// every value until the dictionary page limit is passed and the chunk falls back to plain
/// encoding; the rows of a partition file are often too few to ever reach that limit, so the
/// whole chunk would be interned and written as a dictionary nobody reads twice.
fn nearly_unique(batch: &RecordBatch) -> Vec<String> {
    use std::collections::HashSet;
    let rows = batch.num_rows().min(SAMPLE_ROWS);
    if rows < 256 {
        return Vec::new();
    }
    let mut out = Vec::new();
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        if field.data_type().is_nested() {
            continue;
        }
        let Ok(converter) = arrow::row::RowConverter::new(vec![arrow::row::SortField::new(
            field.data_type().clone(),
        )]) else {
            continue;
        };
        let Ok(values) = converter.convert_columns(&[column.slice(0, rows)]) else {
            continue;
        };
        let distinct: HashSet<&[u8]> = values.iter().map(|r| r.data()).collect();
        if distinct.len() * 2 > rows {
            out.push(field.name().clone());
        }
    }
    out
}

/// Rows of one partition gathered to be written sorted.
struct Gathered {
    batches: Vec<RecordBatch>,
    bytes: usize,
}

/// A writer of data files for one table: each file holds the rows of one partition of the
/// table's current spec, and with a sort order (`sort_by`) its rows in that order.
pub struct TableWriter {
    /// The writers' builder, made when the first rows have chosen each column's encoding.
    builder: Option<Builder>,
    pending: Option<Pending>,
    partitioner: Option<Partitioner>,
    /// The order rows are gathered into before they are written, for a sorted table.
    order: Option<WriteOrder>,
    open: HashMap<Struct, (Inner, u64)>,
    /// Counts writes, to find the partition written to least recently.
    tick: u64,
    gathered: HashMap<Struct, Gathered>,
    gathered_bytes: usize,
    files: Vec<DataFile>,
    rows: u64,
}

impl TableWriter {
    /// `prefix` makes file names unique per run and per writer.
    pub async fn new(table: &Table, prefix: String, target_file_size: u64) -> Result<Self> {
        Self::bounded(table, prefix, target_file_size, None).await
    }

    /// Like [`TableWriter::new`], with row groups also cut at `row_group_bytes` of encoded
    /// data, which bounds the memory the writer holds however wide the rows are.
    pub async fn bounded(
        table: &Table,
        prefix: String,
        target_file_size: u64,
        row_group_bytes: Option<usize>,
    ) -> Result<Self> {
        let meta = table.metadata();
        let partitioner = Partitioner::current(meta)?;
        let row_group_bytes = match (&partitioner, row_group_bytes.filter(|b| *b > 0)) {
            (Some(_), b) => Some(
                b.unwrap_or(PARTITIONED_ROW_GROUP_BYTES)
                    .min(PARTITIONED_ROW_GROUP_BYTES),
            ),
            (None, b) => b,
        };
        let schema = meta.current_schema();
        let mut props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::try_new(1)?))
            .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
            .set_data_page_row_count_limit(PAGE_ROWS)
            .set_dictionary_page_size_limit(DICTIONARY_BYTES)
            .set_max_row_group_bytes(row_group_bytes);
        // Key columns are unique: a dictionary would only be decoded, never useful.
        for id in schema.identifier_field_ids() {
            if let Some(field) = schema.field_by_id(id) {
                props = props.set_column_dictionary_enabled(
                    ColumnPath::new(vec![field.name.clone()]),
                    false,
                );
            }
        }
        let pending = Pending {
            props,
            schema: schema.clone(),
            file_io: table.file_io().clone(),
            location: DefaultLocationGenerator::new(meta)?,
            names: DefaultFileNameGenerator::new(prefix, None, DataFileFormat::Parquet),
            target_file_size: target_file_size as usize,
        };
        let order = if meta.default_sort_order().is_unsorted() {
            None
        } else {
            let names: Vec<String> = schema
                .as_struct()
                .fields()
                .iter()
                .map(|f| f.name.clone())
                .collect();
            let key: Vec<usize> = crate::table::primary_key(meta.properties())
                .iter()
                .filter_map(|k| names.iter().position(|n| n == k))
                .collect();
            Some(WriteOrder::of(meta, &names, &key))
        };
        Ok(Self {
            builder: None,
            pending: Some(pending),
            partitioner,
            order,
            open: HashMap::new(),
            tick: 0,
            gathered: HashMap::new(),
            gathered_bytes: 0,
            files: Vec::new(),
            rows: 0,
        })
    }

    /// Writes rows in the order given: each to its partition's file (a sorted table's rows
    /// are gathered and written in its order, see [`SORT_BUFFER_BYTES`]).
    pub async fn write(&mut self, batch: RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let parts = match &self.partitioner {
            None => vec![(Struct::empty(), batch)],
            Some(p) => {
                let groups = p.split(&batch)?;
                if groups.len() == 1 {
                    groups
                        .into_iter()
                        .map(|(part, _)| (part, batch.clone()))
                        .collect()
                } else {
                    let mut out = Vec::with_capacity(groups.len());
                    for (part, rows) in groups {
                        let rows = arrow::array::UInt32Array::from(rows);
                        out.push((part, arrow::compute::take_record_batch(&batch, &rows)?));
                    }
                    out
                }
            }
        };
        for (part, rows) in parts {
            if self.order.is_some() {
                self.gather(part, rows).await?;
            } else {
                self.write_to(part, rows).await?;
            }
        }
        Ok(())
    }

    /// Writes rows that all belong to `partition` (a value of [`Partitioner::groups`], or
    /// the empty struct for an unpartitioned table), in the order given, to that
    /// partition's file.
    pub async fn write_to(&mut self, partition: Struct, batch: RecordBatch) -> Result<()> {
        self.rows += batch.num_rows() as u64;
        self.tick += 1;
        let tick = self.tick;
        if !self.open.contains_key(&partition) {
            if self.open.len() >= MAX_OPEN_PARTITIONS {
                let oldest = self
                    .open
                    .iter()
                    .min_by_key(|(_, (_, t))| *t)
                    .map(|(k, _)| k.clone());
                if let Some(k) = oldest {
                    self.close_partition(&k).await?;
                }
            }
            let key = self.partitioner.as_ref().map(|p| p.key(partition.clone()));
            if self.builder.is_none() {
                self.builder = self.pending.take().map(|p| p.build(&batch));
            }
            let Some(builder) = &self.builder else {
                return Err(Error::fatal("a table writer lost its builder"));
            };
            let w = builder
                .build(key)
                .await
                .context("starting a Parquet data file writer")?;
            self.open.insert(partition.clone(), (w, tick));
        }
        let Some((w, used)) = self.open.get_mut(&partition) else {
            return Err(Error::fatal("a partition's writer went missing"));
        };
        *used = tick;
        w.write(batch).await.context("writing a Parquet data file")
    }

    /// Closes the file of one partition (the next rows of it start a new file).
    async fn close_partition(&mut self, partition: &Struct) -> Result<()> {
        if let Some((mut w, _)) = self.open.remove(partition) {
            let files = w.close().await.context("closing a Parquet data file")?;
            self.files.extend(files);
        }
        Ok(())
    }

    /// Gathers rows of a sorted table; past the budget, the largest partition's are written.
    async fn gather(&mut self, partition: Struct, batch: RecordBatch) -> Result<()> {
        let bytes = batch.get_array_memory_size();
        let g = self.gathered.entry(partition).or_insert(Gathered {
            batches: Vec::new(),
            bytes: 0,
        });
        g.batches.push(batch);
        g.bytes += bytes;
        self.gathered_bytes += bytes;
        while self.gathered_bytes > SORT_BUFFER_BYTES {
            let largest = self
                .gathered
                .iter()
                .max_by_key(|(_, g)| g.bytes)
                .map(|(k, _)| k.clone());
            match largest {
                Some(k) => self.write_gathered(&k).await?,
                None => break,
            }
        }
        Ok(())
    }

    /// Writes one partition's gathered rows, sorted, as a file of their own.
    async fn write_gathered(&mut self, partition: &Struct) -> Result<()> {
        let Some(g) = self.gathered.remove(partition) else {
            return Ok(());
        };
        self.gathered_bytes = self.gathered_bytes.saturating_sub(g.bytes);
        let Some(first) = g.batches.first() else {
            return Ok(());
        };
        let all = arrow::compute::concat_batches(&first.schema(), &g.batches)?;
        drop(g);
        let sorted = match self
            .order
            .as_ref()
            .map(|o| o.sort(&all))
            .transpose()?
            .flatten()
        {
            Some(order) => arrow::compute::take_record_batch(&all, &order)?,
            None => all,
        };
        // Handed over in slices: one large batch would be encoded at once.
        let mut at = 0;
        while at < sorted.num_rows() {
            let n = (sorted.num_rows() - at).min(8192);
            self.write_to(partition.clone(), sorted.slice(at, n))
                .await?;
            at += n;
        }
        self.close_partition(partition).await
    }

    /// Closes every file and returns every data file written, with the rows written.
    pub async fn close(mut self) -> Result<(Vec<DataFile>, u64)> {
        let gathered: Vec<Struct> = self.gathered.keys().cloned().collect();
        for k in gathered {
            self.write_gathered(&k).await?;
        }
        let open: Vec<Struct> = self.open.keys().cloned().collect();
        for k in open {
            self.close_partition(&k).await?;
        }
        Ok((self.files, self.rows))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{ArrayRef, Int64Array, StringArray};
    use std::sync::Arc;

    #[test]
    fn only_nearly_unique_flat_columns_lose_their_dictionary() {
        let n = 5000;
        let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(0..n as i64));
        let kinds: ArrayRef = Arc::new(StringArray::from_iter_values(
            (0..n).map(|i| ["open", "paid", "shipped"][i % 3]),
        ));
        let halves: ArrayRef = Arc::new(Int64Array::from_iter_values((0..n as i64).map(|i| i / 2)));
        let batch =
            RecordBatch::try_from_iter(vec![("id", ids), ("kind", kinds), ("half", halves)])
                .unwrap();
        // Half distinct is not more than half: still worth a dictionary.
        assert_eq!(nearly_unique(&batch), vec!["id".to_string()]);
        // Too few rows to judge: every column keeps its dictionary.
        assert!(nearly_unique(&batch.slice(0, 100)).is_empty());
    }
}
