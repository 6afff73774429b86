//! The Iceberg sink, models: tables built by SQL through the gateway (dbt models, seeds,
//! snapshots) rather than replicated. Their Iceberg schema comes from the query's Arrow
//! schema (or a `CREATE TABLE`'s columns), their rows from the query's batches; every change
//! is staged as a new metadata file that the gateway's catalog commit makes current,
//! together with the other changes of the same transaction.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::{DataType, Schema as ArrowSchema, SchemaRef};
use iceberg::io::FileIO;
use iceberg::spec::{
    DataFile, ListType, NestedField, PrimitiveType, Schema, StructType, TableMetadataBuilder, Type,
};
use iceberg::table::Table;
use iceberg::{MetadataLocation, TableCreation, TableIdent};

use super::writer::TableWriter;
use super::{durable, maintenance, rowdelta, schema as ice_schema, SourceColumn, PROP_COLUMNS};
use crate::error::{Context, Error, ErrorKind, Result};

/// Table property marking a table the gateway built (a model), never a replicated one.
pub const PROP_MODEL: &str = "skippr.model";
/// Snapshot summary key: the SQL command that wrote the snapshot.
pub const SUMMARY_COMMAND: &str = "skippr.command";
/// Data files of a model roll over at this size.
const TARGET_FILE_SIZE: u64 = 128 * 1024 * 1024;

/// An error in what the statement asks (a type no Iceberg column holds, a NULL in a NOT
/// NULL column): the client's to fix, never retried.
fn refused(message: String) -> Error {
    Error::new(ErrorKind::Fatal, message)
}

/// The Iceberg schema of a model whose rows have the Arrow schema `arrow`. `required`
/// names the columns declared NOT NULL.
pub fn iceberg_schema(arrow: &ArrowSchema, required: &[String]) -> Result<Schema> {
    let n = arrow.fields().len() as i32;
    let mut next_nested = n;
    let mut fields = Vec::with_capacity(arrow.fields().len());
    for (i, f) in arrow.fields().iter().enumerate() {
        let ty = iceberg_type(f.data_type(), &mut next_nested, f.name())?;
        let id = i as i32 + 1;
        let field = if required.iter().any(|r| r == f.name()) {
            NestedField::required(id, f.name(), ty)
        } else {
            NestedField::optional(id, f.name(), ty)
        };
        fields.push(Arc::new(field));
    }
    Schema::builder()
        .with_fields(fields)
        .build()
        .context("building the Iceberg schema of a model")
}

/// The Iceberg type that holds an Arrow type; nested fields take ids from `next`.
fn iceberg_type(dt: &DataType, next: &mut i32, column: &str) -> Result<Type> {
    let p = |t: PrimitiveType| Ok(Type::Primitive(t));
    match dt {
        DataType::Boolean => p(PrimitiveType::Boolean),
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::UInt8 | DataType::UInt16 => {
            p(PrimitiveType::Int)
        }
        DataType::Int64 | DataType::UInt32 | DataType::UInt64 => p(PrimitiveType::Long),
        DataType::Float16 | DataType::Float32 => p(PrimitiveType::Float),
        DataType::Float64 => p(PrimitiveType::Double),
        DataType::Decimal32(pr, s) | DataType::Decimal64(pr, s) | DataType::Decimal128(pr, s)
            if *pr <= 38 =>
        {
            p(PrimitiveType::Decimal {
                precision: *pr as u32,
                scale: (*s).max(0) as u32,
            })
        }
        // Postgres names an untyped NULL `text` in CREATE TABLE AS.
        DataType::Null | DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
            p(PrimitiveType::String)
        }
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => p(PrimitiveType::Binary),
        DataType::FixedSizeBinary(16) => p(PrimitiveType::Uuid),
        DataType::FixedSizeBinary(n) => p(PrimitiveType::Fixed(*n as u64)),
        DataType::Date32 | DataType::Date64 => p(PrimitiveType::Date),
        DataType::Time32(_) | DataType::Time64(_) => p(PrimitiveType::Time),
        DataType::Timestamp(_, None) => p(PrimitiveType::Timestamp),
        DataType::Timestamp(_, Some(_)) => p(PrimitiveType::Timestamptz),
        DataType::Dictionary(_, value) => iceberg_type(value, next, column),
        DataType::List(item) | DataType::LargeList(item) | DataType::FixedSizeList(item, _) => {
            *next += 1;
            let id = *next;
            let element = iceberg_type(item.data_type(), next, column)?;
            Ok(Type::List(ListType::new(Arc::new(NestedField::optional(
                id,
                "element",
                element,
            )))))
        }
        DataType::Struct(children) => {
            let mut fields = Vec::with_capacity(children.len());
            for c in children {
                *next += 1;
                let id = *next;
                let ty = iceberg_type(c.data_type(), next, column)?;
                fields.push(Arc::new(NestedField::optional(id, c.name(), ty)));
            }
            Ok(Type::Struct(StructType::new(fields)))
        }
        other => Err(refused(format!(
            "column \"{column}\" has type {other}, which an Iceberg table cannot hold: cast it in the query (for example to text, or an interval to its number of seconds)"
        ))),
    }
}

/// Writes the first metadata of a new model table `ident` at `location` (a folder of its
/// own), in no catalog yet: the table exists for others once a catalog commit registers
/// its metadata location. `declared` records the Postgres types a `CREATE TABLE` named.
pub async fn create(
    file_io: &FileIO,
    ident: TableIdent,
    location: String,
    schema: Schema,
    declared: Option<Vec<SourceColumn>>,
) -> Result<Table> {
    let mut props = HashMap::from([
        (PROP_MODEL.to_string(), "true".to_string()),
        (
            "write.parquet.compression-codec".to_string(),
            "zstd".to_string(),
        ),
    ]);
    if let Some(declared) = declared {
        props.insert(PROP_COLUMNS.to_string(), serde_json::to_string(&declared)?);
    }
    let creation = TableCreation::builder()
        .name(ident.name().to_string())
        .location(location.clone())
        .schema(schema)
        .properties(props)
        .build();
    let metadata = TableMetadataBuilder::from_table_creation(creation)
        .and_then(|b| b.build())
        .with_context(|| format!("describing the new table {ident}"))?
        .metadata;
    let metadata_location = MetadataLocation::new_with_metadata(location, &metadata);
    metadata
        .write_to(file_io, &metadata_location)
        .await
        .with_context(|| format!("writing the metadata of the new table {ident}"))?;
    let metadata_location = metadata_location.to_string();
    durable::sync_files([metadata_location.as_str()])?;
    Table::builder()
        .runtime(iceberg::Runtime::try_current().context("finding the async runtime")?)
        .file_io(file_io.clone())
        .metadata_location(metadata_location)
        .metadata(metadata)
        .identifier(ident)
        .build()
        .context("describing a new model table")
}

/// `batch` with the model's column types (Postgres's assignment casts), checking NOT NULL
/// columns. `target` is the table's Arrow schema.
pub fn conform(batch: &RecordBatch, target: &SchemaRef) -> Result<RecordBatch> {
    if batch.num_columns() != target.fields().len() {
        return Err(refused(format!(
            "the rows have {} columns, the table {}",
            batch.num_columns(),
            target.fields().len()
        )));
    }
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(batch.num_columns());
    for (col, field) in batch.columns().iter().zip(target.fields()) {
        let col = if col.data_type() == field.data_type() {
            col.clone()
        } else {
            arrow::compute::cast(col, field.data_type()).map_err(|e| {
                refused(format!(
                    "column \"{}\" is of type {} but the value is of type {}: {e}; cast the value in the query",
                    field.name(),
                    field.data_type(),
                    col.data_type()
                ))
            })?
        };
        if !field.is_nullable() && col.null_count() > 0 {
            return Err(refused(format!(
                "null value in column \"{}\" violates not-null constraint",
                field.name()
            )));
        }
        columns.push(col);
    }
    RecordBatch::try_new(target.clone(), columns).context("shaping rows for a model table")
}

/// The Arrow schema rows of `table` are written with (with the Iceberg field ids).
pub fn write_schema(table: &Table) -> Result<SchemaRef> {
    ice_schema::arrow_schema(table)
}

/// Writes rows (already in [`write_schema`]'s shape) as data files of `table`.
pub struct ModelWriter {
    writer: TableWriter,
}

impl ModelWriter {
    pub async fn new(table: &Table) -> Result<Self> {
        let prefix = format!("model-{}", uuid::Uuid::now_v7());
        Ok(Self {
            writer: TableWriter::new(table, prefix, TARGET_FILE_SIZE).await?,
        })
    }

    pub async fn write(&mut self, batch: RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        self.writer.write(batch).await
    }

    /// The data files written, and the number of rows.
    pub async fn close(self) -> Result<(Vec<DataFile>, u64)> {
        self.writer.close().await
    }
}

/// A staged version of a model table, the files only the versions it replaces read
/// (garbage once it is current, and once no statement still reads those versions), and the
/// files it added (garbage if it never becomes current).
pub struct Staged {
    pub table: Table,
    pub garbage: Vec<String>,
    pub written: Vec<String>,
}

/// Stages a snapshot adding `files` (after the table's rows, or instead of them with
/// `replace_all`): made durable, not yet current (see [`rowdelta::stage`]). Older
/// snapshots are expired with it: a model keeps no history.
pub async fn stage(
    table: &Table,
    files: Vec<DataFile>,
    replace_all: bool,
    command: &str,
) -> Result<Staged> {
    let context = || format!("writing a new version of table {}", table.identifier());
    let before = maintenance::referenced(table).await.with_context(context)?;
    let props = HashMap::from([(SUMMARY_COMMAND.to_string(), command.to_string())]);
    let staged = rowdelta::stage(table, files, replace_all, props)
        .await
        .with_context(context)?;
    let after = maintenance::referenced(&staged)
        .await
        .with_context(context)?;
    let root = format!("{}/", table.metadata().location().trim_end_matches('/'));
    let only = |a: &HashSet<String>, b: &HashSet<String>| -> Vec<String> {
        let mut files: Vec<String> = a
            .iter()
            .filter(|f| !b.contains(*f) && f.starts_with(&root))
            .cloned()
            .collect();
        files.sort();
        files
    };
    Ok(Staged {
        garbage: only(&before, &after),
        written: only(&after, &before),
        table: staged,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::{Field, TimeUnit};

    #[test]
    fn arrow_types_map_to_iceberg() -> Result<()> {
        let arrow = ArrowSchema::new(vec![
            Field::new("id", DataType::Int32, false),
            Field::new("amount", DataType::Decimal128(12, 2), true),
            Field::new(
                "at",
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                true,
            ),
            Field::new("tags", DataType::new_list(DataType::Utf8, true), true),
            Field::new("nothing", DataType::Null, true),
        ]);
        let schema = iceberg_schema(&arrow, &["id".to_string()])?;
        let id = schema
            .field_by_name("id")
            .ok_or_else(|| Error::fatal("no id"))?;
        assert!(id.required);
        let tags = schema
            .field_by_name("tags")
            .ok_or_else(|| Error::fatal("no tags"))?;
        assert!(matches!(tags.field_type.as_ref(), Type::List(_)));
        let nothing = schema
            .field_by_name("nothing")
            .ok_or_else(|| Error::fatal("no nothing"))?;
        assert_eq!(
            nothing.field_type.as_ref(),
            &Type::Primitive(PrimitiveType::String)
        );
        let interval = ArrowSchema::new(vec![Field::new(
            "gap",
            DataType::Interval(arrow::datatypes::IntervalUnit::MonthDayNano),
            true,
        )]);
        let err = iceberg_schema(&interval, &[]).err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("\"gap\"") && e.contains("cast it")));
        Ok(())
    }
}
