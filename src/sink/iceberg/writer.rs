//! Writes record batches into Parquet data files of a table, rolling to a new file at the
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

use crate::error::{Context, Result};

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

/// A writer of data files for one table.
pub struct TableWriter {
    inner: Inner,
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
        let schema = table.metadata().current_schema();
        let mut props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::try_new(1)?))
            .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
            .set_data_page_row_count_limit(PAGE_ROWS)
            .set_dictionary_page_size_limit(DICTIONARY_BYTES)
            .set_max_row_group_bytes(row_group_bytes.filter(|b| *b > 0));
        // Key columns are unique: a dictionary would only be decoded, never useful.
        for id in schema.identifier_field_ids() {
            if let Some(field) = schema.field_by_id(id) {
                props = props.set_column_dictionary_enabled(
                    ColumnPath::new(vec![field.name.clone()]),
                    false,
                );
            }
        }
        let props = props.build();
        let parquet = ParquetWriterBuilder::new(props, table.metadata().current_schema().clone());
        let location = DefaultLocationGenerator::new(table.metadata())?;
        let names = DefaultFileNameGenerator::new(prefix, None, DataFileFormat::Parquet);
        let rolling = RollingFileWriterBuilder::new(
            parquet,
            target_file_size as usize,
            table.file_io().clone(),
            location,
            names,
        );
        let inner = DataFileWriterBuilder::new(rolling)
            .build(None)
            .await
            .context("starting a Parquet data file writer")?;
        Ok(Self { inner, rows: 0 })
    }

    pub async fn write(&mut self, batch: RecordBatch) -> Result<()> {
        self.rows += batch.num_rows() as u64;
        self.inner
            .write(batch)
            .await
            .context("writing a Parquet data file")
    }

    /// Closes the current file and returns every data file written.
    pub async fn close(mut self) -> Result<(Vec<DataFile>, u64)> {
        let files = self
            .inner
            .close()
            .await
            .context("closing a Parquet data file")?;
        Ok((files, self.rows))
    }
}
