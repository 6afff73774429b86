//! The table layer, partitions and write order: which partition of a table's current spec
//! each row belongs to, and the order rows are written in inside a file (the table's sort
//! order, then its primary key), for every writer (snapshot, changes, compaction).

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, RecordBatch, StructArray, UInt32Array};
use arrow::compute::SortOptions;
use arrow::row::{RowConverter, Rows, SortField};
use iceberg::arrow::{arrow_struct_to_literal, PartitionValueCalculator};
use iceberg::spec::{
    Literal, NullOrder, PartitionKey, PartitionSpecRef, SchemaRef, SortDirection, Struct,
    StructType, TableMetadata,
};

use crate::error::{Error, Result};

/// The partitions of the rows written to a table under its current (default) spec.
pub struct Partitioner {
    spec: PartitionSpecRef,
    schema: SchemaRef,
    calculator: PartitionValueCalculator,
    partition_type: StructType,
}

impl Partitioner {
    /// The table's current spec, or `None` when it is unpartitioned.
    pub fn current(meta: &TableMetadata) -> Result<Option<Self>> {
        let spec = meta.default_partition_spec().clone();
        if spec.is_unpartitioned() {
            return Ok(None);
        }
        let schema = meta.current_schema().clone();
        let calculator = PartitionValueCalculator::try_new(&spec, &schema)?;
        let partition_type = spec.partition_type(&schema)?;
        Ok(Some(Self {
            spec,
            schema,
            calculator,
            partition_type,
        }))
    }

    /// The key a writer of partition `data` is built with.
    pub fn key(&self, data: Struct) -> PartitionKey {
        PartitionKey::new(self.spec.as_ref().clone(), self.schema.clone(), data)
    }

    /// The spec id of the partitions given out.
    pub fn spec_id(&self) -> i32 {
        self.spec.spec_id()
    }

    /// Each row's partition, as the distinct partitions of `batch` (in the order of their
    /// first row) and, for each row, the index of its partition among them.
    ///
    /// Rows are grouped by the bytes of their partition values; only one Iceberg value is
    /// made per distinct partition, not one per row (a snapshot's batch of 8192 rows
    /// usually holds a handful of partitions).
    pub fn groups(&self, batch: &RecordBatch) -> Result<(Vec<Struct>, Vec<u32>)> {
        let array = self.calculator.calculate(batch)?;
        let Some(values) = array.as_any().downcast_ref::<StructArray>() else {
            return Err(Error::fatal(
                "the partition values of a batch are not a struct array",
            ));
        };
        let fields: Vec<SortField> = values
            .columns()
            .iter()
            .map(|c| SortField::new(c.data_type().clone()))
            .collect();
        let (firsts, of_row) = match RowConverter::new(fields) {
            Ok(converter) => {
                let rows = converter.convert_columns(values.columns())?;
                let mut firsts: Vec<u32> = Vec::new();
                let mut at: HashMap<arrow::row::Row<'_>, u32> = HashMap::new();
                let mut of_row: Vec<u32> = Vec::with_capacity(rows.num_rows());
                let mut last: Option<(arrow::row::Row<'_>, u32)> = None;
                for (i, row) in rows.iter().enumerate() {
                    // Neighbouring rows mostly share a partition: no hash for them.
                    let g = match last {
                        Some((r, g)) if r == row => g,
                        _ => *at.entry(row).or_insert_with(|| {
                            firsts.push(i as u32);
                            firsts.len() as u32 - 1
                        }),
                    };
                    last = Some((row, g));
                    of_row.push(g);
                }
                (firsts, of_row)
            }
            // A partition type the row format cannot hold: one value per row.
            Err(_) => ((0..batch.num_rows() as u32).collect(), Vec::new()),
        };
        let picked = arrow::compute::take(&array, &UInt32Array::from(firsts), None)?;
        let parts: Vec<Struct> = arrow_struct_to_literal(&picked, &self.partition_type)?
            .into_iter()
            .map(|v| match v {
                Some(Literal::Struct(s)) => Ok(s),
                _ => Err(Error::fatal(
                    "a row's partition value is not a struct of the partition type",
                )),
            })
            .collect::<Result<_>>()?;
        if !of_row.is_empty() || batch.num_rows() == 0 {
            return Ok((parts, of_row));
        }
        // Per-row values: merge equal ones.
        let mut distinct: Vec<Struct> = Vec::new();
        let mut at: HashMap<Struct, u32> = HashMap::new();
        let of_row = parts
            .into_iter()
            .map(|v| {
                *at.entry(v.clone()).or_insert_with(|| {
                    distinct.push(v);
                    distinct.len() as u32 - 1
                })
            })
            .collect();
        Ok((distinct, of_row))
    }

    /// The rows of `batch` grouped by partition: groups in the order of their first row,
    /// the rows of each group in batch order.
    pub fn split(&self, batch: &RecordBatch) -> Result<Vec<(Struct, Vec<u32>)>> {
        let (parts, of_row) = self.groups(batch)?;
        let mut groups: Vec<(Struct, Vec<u32>)> =
            parts.into_iter().map(|p| (p, Vec::new())).collect();
        for (row, g) in of_row.into_iter().enumerate() {
            groups[g as usize].1.push(row as u32);
        }
        Ok(groups)
    }

    /// The runs of consecutive rows of one partition, in batch order.
    pub fn runs(&self, batch: &RecordBatch) -> Result<Vec<(Struct, Range<usize>)>> {
        let (parts, of_row) = self.groups(batch)?;
        let mut runs: Vec<(u32, Range<usize>)> = Vec::new();
        for (row, g) in of_row.into_iter().enumerate() {
            match runs.last_mut() {
                Some((last, range)) if *last == g => range.end = row + 1,
                _ => runs.push((g, row..row + 1)),
            }
        }
        Ok(runs
            .into_iter()
            .map(|(g, range)| (parts[g as usize].clone(), range))
            .collect())
    }
}

/// The order rows are written in inside a file: the table's sort order (`sort_by`), then
/// its primary key, as columns of the written batches with their direction and nulls.
#[derive(Debug, Clone, Default)]
pub struct WriteOrder {
    /// (column index in the table's Arrow schema, how it sorts).
    pub columns: Vec<(usize, SortOptions)>,
    /// How many of the leading columns come from `sort_by` (0: key order only).
    pub sorted_by: usize,
}

impl WriteOrder {
    /// The table's current sort order followed by `key` (columns of the Arrow schema, each
    /// once), over the table's columns by name.
    pub fn of(meta: &TableMetadata, names: &[String], key: &[usize]) -> Self {
        let schema = meta.current_schema();
        let mut columns: Vec<(usize, SortOptions)> = Vec::new();
        for f in meta.default_sort_order().fields.iter() {
            let Some(name) = schema.name_by_field_id(f.source_id) else {
                continue;
            };
            let Some(i) = names.iter().position(|n| n == name) else {
                continue;
            };
            if columns.iter().any(|(c, _)| *c == i) {
                continue;
            }
            columns.push((
                i,
                SortOptions {
                    descending: f.direction == SortDirection::Descending,
                    nulls_first: f.null_order == NullOrder::First,
                },
            ));
        }
        let sorted_by = columns.len();
        for k in key {
            if !columns.iter().any(|(c, _)| c == k) {
                columns.push((*k, SortOptions::default()));
            }
        }
        Self { columns, sorted_by }
    }

    /// Whether rows are ordered at all.
    pub fn is_empty(&self) -> bool {
        self.columns.is_empty()
    }

    /// A converter whose rows compare in this order, for the batches of `schema`.
    pub fn converter(&self, schema: &arrow::datatypes::Schema) -> Result<Option<RowConverter>> {
        if self.columns.is_empty() {
            return Ok(None);
        }
        let fields = self
            .columns
            .iter()
            .map(|(i, o)| SortField::new_with_options(schema.field(*i).data_type().clone(), *o))
            .collect();
        match RowConverter::new(fields) {
            Ok(c) => Ok(Some(c)),
            // A column type the row format cannot order: the rows keep the order they have.
            Err(_) => Ok(None),
        }
    }

    /// The rows of `batch` in this order (as comparable rows).
    pub fn rows(&self, converter: &RowConverter, batch: &RecordBatch) -> Result<Rows> {
        let cols: Vec<ArrayRef> = self
            .columns
            .iter()
            .map(|(i, _)| batch.column(*i).clone())
            .collect();
        Ok(converter.convert_columns(&cols)?)
    }

    /// The positions of `batch`'s rows in this order, or `None` when it has none.
    pub fn sort(&self, batch: &RecordBatch) -> Result<Option<UInt32Array>> {
        let Some(converter) = self.converter(batch.schema().as_ref())? else {
            return Ok(None);
        };
        let rows = self.rows(&converter, batch)?;
        let mut order: Vec<u32> = (0..batch.num_rows() as u32).collect();
        order.sort_by(|a, b| rows.row(*a as usize).cmp(&rows.row(*b as usize)));
        Ok(Some(UInt32Array::from(order)))
    }
}

/// Where one data file belongs: the id of the spec it is written under and its partition.
pub type FilePartition = (i32, Struct);

/// Where each data file of a table belongs: its spec id and partition values, from the
/// manifests of the current snapshot (files written since are added as they are written).
#[derive(Debug, Default, Clone)]
pub struct FilePartitions {
    of: HashMap<Arc<str>, FilePartition>,
}

impl FilePartitions {
    /// Records where `path` belongs.
    pub fn insert(&mut self, path: &str, spec_id: i32, partition: Struct) {
        self.of.insert(Arc::from(path), (spec_id, partition));
    }

    pub fn get(&self, path: &str) -> Option<&FilePartition> {
        self.of.get(path)
    }

    /// Forgets a file (removed from the table).
    pub fn remove(&mut self, path: &str) {
        self.of.remove(path);
    }

    /// Adds every file `other` knows.
    pub fn extend(&mut self, other: FilePartitions) {
        self.of.extend(other.of);
    }

    /// Reads the data files of the table's current snapshot from its manifests.
    pub async fn load(table: &iceberg::table::Table) -> Result<Self> {
        let mut out = Self::default();
        let Some(snapshot) = table.metadata().current_snapshot() else {
            return Ok(out);
        };
        let list = table.manifest_list_reader(snapshot).load().await?;
        for m in list.entries() {
            let manifest = m.load_manifest(table.file_io()).await?;
            for e in manifest.entries() {
                if e.is_alive() {
                    let f = e.data_file();
                    out.insert(f.file_path(), m.partition_spec_id, f.partition().clone());
                }
            }
        }
        Ok(out)
    }
}

/// Whether every spec the table has ever had is unpartitioned (then every file is of the one
/// unpartitioned partition and nothing needs to know where files belong).
pub fn never_partitioned(meta: &TableMetadata) -> bool {
    meta.partition_specs_iter().all(|s| s.is_unpartitioned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema as ArrowSchema};
    use iceberg::spec::{
        NestedField, PrimitiveType, Schema, SortOrder, Transform, Type, UnboundPartitionSpec,
    };
    use parquet::arrow::PARQUET_FIELD_ID_META_KEY;

    use crate::table::layout::Layout;

    fn metadata(layout: &Layout) -> TableMetadata {
        let schema = Schema::builder()
            .with_fields(vec![
                NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
                NestedField::optional(2, "kind", Type::Primitive(PrimitiveType::String)).into(),
            ])
            .build()
            .expect("schema");
        let spec: UnboundPartitionSpec = layout.partition_spec(&schema).expect("spec");
        let order: SortOrder = layout.sort_order(&schema).expect("order");
        crate::table::fixtures::metadata(schema, spec, order)
    }

    fn batch(ids: &[i64], kinds: &[Option<&str>]) -> RecordBatch {
        let field = |name: &str, dt: DataType, null: bool, id: i32| {
            Field::new(name, dt, null)
                .with_metadata([(PARQUET_FIELD_ID_META_KEY.to_string(), id.to_string())].into())
        };
        let schema = ArrowSchema::new(vec![
            field("id", DataType::Int64, false, 1),
            field("kind", DataType::Utf8, true, 2),
        ]);
        RecordBatch::try_new(
            Arc::new(schema),
            vec![
                Arc::new(Int64Array::from(ids.to_vec())),
                Arc::new(StringArray::from(kinds.to_vec())),
            ],
        )
        .expect("batch")
    }

    #[test]
    fn rows_are_grouped_and_run_by_their_partition() {
        let layout = Layout::parse(&["kind".into(), "bucket(4, id)".into()], &[]).expect("layout");
        let meta = metadata(&layout);
        let p = Partitioner::current(&meta)
            .expect("partitioner")
            .expect("partitioned");
        let b = batch(
            &[1, 1, 2, 1, 1],
            &[Some("a"), Some("a"), Some("b"), None, Some("a")],
        );
        let (parts, of_row) = p.groups(&b).expect("groups");
        assert_eq!(
            of_row,
            vec![0, 0, 1, 2, 0],
            "equal partitions share one group"
        );
        assert_eq!(parts.len(), 3, "one value per distinct partition");
        let values: Vec<&Struct> = of_row.iter().map(|g| &parts[*g as usize]).collect();
        assert_ne!(values[0], values[3], "a NULL is a partition of its own");
        let groups = p.split(&b).expect("split");
        let rows: Vec<u32> = groups.iter().flat_map(|(_, r)| r.clone()).collect();
        let mut sorted = rows.clone();
        sorted.sort_unstable();
        assert_eq!(
            sorted,
            vec![0, 1, 2, 3, 4],
            "every row in exactly one group"
        );
        assert_eq!(groups[0].1, [0, 1, 4], "groups keep batch order");
        let runs = p.runs(&b).expect("runs");
        let ranges: Vec<_> = runs.iter().map(|r| r.1.clone()).collect();
        assert_eq!(ranges, vec![0..2, 2..3, 3..4, 4..5]);
        assert_eq!(runs[0].0, runs[3].0);
        // The values are the spec's: the bucket of 1 is Iceberg's murmur3 bucket.
        let bucket = iceberg::transform::create_transform_function(&Transform::Bucket(4))
            .expect("bucket")
            .transform_literal_result(&iceberg::spec::Datum::long(1))
            .expect("bucket of 1");
        assert_eq!(
            values[0].iter().nth(1).flatten().cloned(),
            Some(Literal::Primitive(bucket.literal().clone()))
        );
    }

    #[test]
    fn an_unpartitioned_table_has_no_partitioner() {
        let meta = metadata(&Layout::default());
        assert!(Partitioner::current(&meta).expect("partitioner").is_none());
        assert!(never_partitioned(&meta));
    }

    #[test]
    fn the_write_order_is_the_sort_order_then_the_key() {
        let layout = Layout::parse(&[], &["kind desc".into()]).expect("layout");
        let meta = metadata(&layout);
        let names = vec!["id".to_string(), "kind".to_string()];
        let order = WriteOrder::of(&meta, &names, &[0]);
        assert_eq!(order.sorted_by, 1);
        assert_eq!(
            order.columns.iter().map(|c| c.0).collect::<Vec<_>>(),
            [1, 0]
        );
        let b = batch(&[3, 1, 2, 4], &[Some("a"), Some("b"), Some("a"), None]);
        let sorted = order.sort(&b).expect("sort").expect("an order");
        // kind descending, nulls last (Spark's rule for desc), then id ascending.
        assert_eq!(sorted.values().to_vec(), vec![1, 2, 0, 3]);
        assert!(WriteOrder::of(&metadata(&Layout::default()), &names, &[]).is_empty());
    }
}
