//! Unit tests of the committed scan over partitioned tables: tables of every transform (and
//! of two specs, after an evolution) built with iceberg-rust in memory, each filter's plan
//! checked to keep exactly the files whose partition can match, and its rows checked equal
//! to those of a scan that prunes nothing.

use std::collections::{BTreeSet, HashMap};

use arrow::array::{
    ArrayRef, Date32Array, Int32Array, Int64Array, StringArray, TimestampMicrosecondArray,
};
use arrow::datatypes::{Field, Schema};
use datafusion::datasource::MemTable;
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::collect;
use datafusion::prelude::SessionContext;
use iceberg::arrow::{schema_to_arrow_schema, RecordBatchPartitionSplitter};
use iceberg::spec::{
    DataFile as IcebergFile, DataFileBuilder, DataFileFormat, FormatVersion, ManifestListWriter,
    ManifestWriterBuilder, NestedField, Operation, PrimitiveType, Schema as IcebergSchema,
    Snapshot, SnapshotReference, SnapshotRetention, SortOrder, Summary, TableMetadata,
    TableMetadataBuilder, Transform, Type, UnboundPartitionSpec, MAIN_BRANCH,
};
use iceberg::writer::base_writer::data_file_writer::DataFileWriterBuilder;
use iceberg::writer::file_writer::location_generator::{
    DefaultFileNameGenerator, DefaultLocationGenerator,
};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::{IcebergWriter, IcebergWriterBuilder};
use iceberg::TableIdent;
use parquet::arrow::AsyncArrowWriter;
use parquet::file::properties::{EnabledStatistics, WriterProperties};

use super::*;

pub(super) type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

/// Rows of the test tables.
pub(super) const ROWS: i64 = 240;
/// 2024-01-01 00:00:00 UTC, in microseconds.
const BASE: i64 = 1_704_067_200_000_000;
const HOUR: i64 = 3_600_000_000;
/// 2024-01-01 in days.
const BASE_DAY: i32 = 19_723;

fn iceberg_schema() -> iceberg::Result<IcebergSchema> {
    let f = |id, name: &str, t| Arc::new(NestedField::optional(id, name, Type::Primitive(t)));
    IcebergSchema::builder()
        .with_fields(vec![
            Arc::new(NestedField::required(
                1,
                "id",
                Type::Primitive(PrimitiveType::Long),
            )),
            f(2, "name", PrimitiveType::String),
            f(3, "at", PrimitiveType::Timestamptz),
            f(4, "ts", PrimitiveType::Timestamp),
            f(5, "d", PrimitiveType::Date),
            f(6, "n", PrimitiveType::Int),
        ])
        .with_identifier_field_ids(vec![1])
        .build()
}

/// Rows `ids`: `at` (and `ts`, without a zone) one hour apart from 2024-01-01, `d` five days
/// apart, `n` the id modulo 5, `name` two letters of five and the id.
pub(super) fn rows(schema: &SchemaRef, ids: impl Iterator<Item = i64>) -> DfResult<RecordBatch> {
    let ids: Vec<i64> = ids.collect();
    let letters = ["aa", "ab", "ba", "bb", "ca"];
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(ids.clone())),
        Arc::new(StringArray::from_iter_values(
            ids.iter()
                .map(|i| format!("{}{i}", letters[i.rem_euclid(5) as usize])),
        )),
        Arc::new(
            TimestampMicrosecondArray::from_iter_values(ids.iter().map(|i| BASE + i * HOUR))
                .with_timezone("+00:00"),
        ),
        Arc::new(TimestampMicrosecondArray::from_iter_values(
            ids.iter().map(|i| BASE + i * HOUR),
        )),
        Arc::new(Date32Array::from_iter_values(
            ids.iter().map(|i| BASE_DAY + 5 * *i as i32),
        )),
        Arc::new(Int32Array::from_iter_values(
            ids.iter().map(|i| i.rem_euclid(5) as i32),
        )),
    ];
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

/// A partitioned table built in memory, one commit at a time.
pub(super) struct TestTable {
    io: FileIO,
    meta: TableMetadata,
    /// Each data file written, with its spec id and its rows.
    files: Vec<(IcebergFile, i32, RecordBatch)>,
    deletes: Vec<IcebergFile>,
    /// Ids of the rows the delete files remove.
    deleted: BTreeSet<i64>,
    commits: u32,
}

impl TestTable {
    pub(super) fn new(name: &str, spec: UnboundPartitionSpec) -> iceberg::Result<Self> {
        let meta = TableMetadataBuilder::new(
            iceberg_schema()?,
            spec,
            SortOrder::unsorted_order(),
            format!("memory:///wh/{name}"),
            FormatVersion::V2,
            HashMap::new(),
        )?
        .build()?
        .metadata;
        Ok(Self {
            io: FileIO::new_with_memory(),
            meta,
            files: Vec::new(),
            deletes: Vec::new(),
            deleted: BTreeSet::new(),
            commits: 0,
        })
    }

    /// Makes `spec` the default spec (a partition evolution: files written before keep
    /// theirs).
    fn evolve(&mut self, spec: UnboundPartitionSpec) -> iceberg::Result<()> {
        self.meta = TableMetadataBuilder::new_from_metadata(self.meta.clone(), None)
            .add_partition_spec(spec)?
            .set_default_partition_spec(-1)?
            .build()?
            .metadata;
        Ok(())
    }

    pub(super) fn arrow_schema(&self) -> iceberg::Result<SchemaRef> {
        Ok(Arc::new(schema_to_arrow_schema(
            self.meta.current_schema(),
        )?))
    }

    /// Writes rows `ids` under the default spec, one file per partition, and commits them.
    /// Without `metrics` the files carry no column bounds, so only partitions can prune.
    pub(super) async fn append(
        &mut self,
        ids: impl Iterator<Item = i64>,
        metrics: bool,
    ) -> std::result::Result<(), Box<dyn std::error::Error>> {
        let batch = rows(&self.arrow_schema()?, ids)?;
        let spec = self.meta.default_partition_spec().clone();
        let schema = self.meta.current_schema().clone();
        let parts: Vec<(Option<iceberg::spec::PartitionKey>, RecordBatch)> =
            if spec.is_unpartitioned() {
                vec![(None, batch)]
            } else {
                RecordBatchPartitionSplitter::try_new_with_computed_values(
                    schema.clone(),
                    spec.clone(),
                )?
                .split(&batch)?
                .into_iter()
                .map(|(k, b)| (Some(k), b))
                .collect()
            };
        self.commits += 1;
        let stats = if metrics {
            EnabledStatistics::Chunk
        } else {
            EnabledStatistics::None
        };
        let mut added = Vec::new();
        for (i, (key, part)) in parts.into_iter().enumerate() {
            let props = WriterProperties::builder()
                .set_statistics_enabled(stats)
                .build();
            let rolling = RollingFileWriterBuilder::new_with_default_file_size(
                ParquetWriterBuilder::new(props, schema.clone()),
                self.io.clone(),
                DefaultLocationGenerator::new(&self.meta)?,
                DefaultFileNameGenerator::new(
                    format!("c{}-p{i}", self.commits),
                    None,
                    DataFileFormat::Parquet,
                ),
            );
            let mut writer = DataFileWriterBuilder::new(rolling).build(key).await?;
            writer.write(part.clone()).await?;
            for f in writer.close().await? {
                added.push((f.clone(), spec.spec_id()));
                self.files.push((f, spec.spec_id(), part.clone()));
            }
        }
        self.commit(added, Vec::new()).await
    }

    /// Deletes the first `n` rows of every data file by position, with one delete file per
    /// data file, in the data file's partition and spec.
    async fn delete_first(&mut self, n: usize) -> TestResult {
        self.commits += 1;
        let mut added = Vec::new();
        for (i, (file, spec_id, batch)) in self.files.iter().enumerate() {
            let n = n.min(batch.num_rows());
            let ids = batch
                .column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .ok_or("ids")?;
            self.deleted.extend((0..n).map(|r| ids.value(r)));
            let path = format!(
                "{}/data/c{}-{i}-deletes.parquet",
                self.meta.location(),
                self.commits
            );
            let schema = Arc::new(Schema::new(vec![
                Field::new("file_path", DataType::Utf8, false).with_metadata(HashMap::from([(
                    PARQUET_FIELD_ID_META_KEY.to_string(),
                    "2147483546".to_string(),
                )])),
                Field::new("pos", DataType::Int64, false).with_metadata(HashMap::from([(
                    PARQUET_FIELD_ID_META_KEY.to_string(),
                    "2147483545".to_string(),
                )])),
            ]));
            let rows = RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(StringArray::from_iter_values(
                        (0..n).map(|_| file.file_path()),
                    )),
                    Arc::new(Int64Array::from_iter_values(0..n as i64)),
                ],
            )?;
            let mut buf = Vec::new();
            {
                let mut w = AsyncArrowWriter::try_new(&mut buf, schema, None)?;
                w.write(&rows).await?;
                w.close().await?;
            }
            let size = buf.len() as u64;
            self.io.new_output(&path)?.write(buf.into()).await?;
            let mut b = DataFileBuilder::default();
            b.content(DataContentType::PositionDeletes)
                .file_path(path)
                .file_format(DataFileFormat::Parquet)
                .partition(file.partition().clone())
                .partition_spec_id(*spec_id)
                .record_count(n as u64)
                .file_size_in_bytes(size);
            added.push((b.build()?, *spec_id));
        }
        self.deletes.extend(added.iter().map(|(f, _)| f.clone()));
        self.commit(Vec::new(), added).await
    }

    /// Commits a snapshot adding `data` and `deletes` (each manifest written with the spec
    /// of its files) after every file already live.
    async fn commit(
        &mut self,
        data: Vec<(IcebergFile, i32)>,
        deletes: Vec<(IcebergFile, i32)>,
    ) -> TestResult {
        let snapshot_id = i64::from(self.commits);
        let seq = self.meta.next_sequence_number();
        let location = self.meta.location().to_string();
        let schema = self.meta.current_schema().clone();
        let mut manifests = match self.meta.current_snapshot() {
            Some(s) => self
                .table()?
                .manifest_list_reader(s)
                .load()
                .await?
                .entries()
                .to_vec(),
            None => Vec::new(),
        };
        for (content, files) in [(false, data), (true, deletes)] {
            let mut by_spec: HashMap<i32, Vec<IcebergFile>> = HashMap::new();
            for (f, spec_id) in files {
                by_spec.entry(spec_id).or_default().push(f);
            }
            for (spec_id, files) in by_spec {
                let spec = self
                    .meta
                    .partition_spec_by_id(spec_id)
                    .ok_or("spec")?
                    .as_ref()
                    .clone();
                let path = format!(
                    "{location}/metadata/m{}-{spec_id}-{content}.avro",
                    self.commits
                );
                let b = ManifestWriterBuilder::new(
                    self.io.new_output(path)?,
                    Some(snapshot_id),
                    schema.clone(),
                    spec,
                );
                let mut w = if content {
                    b.build_v2_deletes()
                } else {
                    b.build_v2_data()
                };
                for f in files {
                    w.add_file(f, seq)?;
                }
                manifests.push(w.write_manifest_file().await?);
            }
        }
        let list_path = format!("{location}/metadata/snap-{snapshot_id}.avro");
        let mut list = ManifestListWriter::v2(
            self.io.new_output(&list_path)?.writer().await?,
            snapshot_id,
            self.meta.current_snapshot_id(),
            seq,
        );
        list.add_manifests(manifests.into_iter())?;
        list.close().await?;
        let snapshot = Snapshot::builder()
            .with_snapshot_id(snapshot_id)
            .with_parent_snapshot_id(self.meta.current_snapshot_id())
            .with_sequence_number(seq)
            .with_timestamp_ms(self.meta.last_updated_ms() + 1)
            .with_manifest_list(list_path)
            .with_summary(Summary {
                operation: Operation::Append,
                additional_properties: HashMap::new(),
            })
            .with_schema_id(self.meta.current_schema_id())
            .build();
        self.meta = TableMetadataBuilder::new_from_metadata(self.meta.clone(), None)
            .add_snapshot(snapshot)?
            .set_ref(
                MAIN_BRANCH,
                SnapshotReference::new(snapshot_id, SnapshotRetention::branch(None, None, None)),
            )?
            .build()?
            .metadata;
        Ok(())
    }

    pub(super) fn table(&self) -> iceberg::Result<Table> {
        Table::builder()
            .metadata(self.meta.clone())
            .identifier(TableIdent::from_strs(["ns", "t"])?)
            .file_io(self.io.clone())
            .runtime(iceberg::Runtime::try_current()?)
            .build()
    }

    /// Plans a scan of every column with the filters of `WHERE <filter>` (none for `None`),
    /// keyed by `id` when `keyed`.
    pub(super) async fn plan(&self, filter: Option<&str>, keyed: bool) -> DfResult<CommittedScan> {
        let table = self.table().map_err(df_err)?;
        let schema = self.arrow_schema().map_err(df_err)?;
        let key_cols = if keyed { vec![0] } else { vec![] };
        let ctx = SessionContext::new();
        let scan_filter = match filter {
            Some(f) => {
                let filters = pushed(schema.clone(), f).await?;
                super::super::live::scan_filter(&ctx.state(), &schema, &key_cols, &filters, false)?
            }
            None => None,
        };
        let projection = (0..schema.fields().len()).collect();
        CommittedScan::plan(
            &table,
            schema,
            projection,
            key_cols,
            Hide::None,
            None,
            scan_filter,
            2,
            Arc::new(ScanCaches::default()),
        )
        .await
    }

    /// The data files whose rows hold one that `filter` keeps (before deletes).
    async fn matching_files(&self, filter: &str) -> DfResult<BTreeSet<String>> {
        let mut out = BTreeSet::new();
        for (f, _, batch) in &self.files {
            if !select_ids(vec![batch.clone()], filter).await?.is_empty() {
                out.insert(f.file_path().to_string());
            }
        }
        Ok(out)
    }

    /// The ids of the live rows `filter` keeps.
    async fn expected(&self, filter: &str) -> DfResult<Vec<i64>> {
        let batches = self.files.iter().map(|(_, _, b)| b.clone()).collect();
        let ids = select_ids(batches, filter).await?;
        Ok(ids
            .into_iter()
            .filter(|i| !self.deleted.contains(i))
            .collect())
    }
}

/// The filters DataFusion pushes into a scan of a table of `schema` for
/// `SELECT * FROM t WHERE <filter>`, after its coercion and simplification.
pub(super) async fn pushed(schema: SchemaRef, filter: &str) -> DfResult<Vec<Expr>> {
    #[derive(Debug)]
    struct Recording {
        schema: SchemaRef,
        filters: std::sync::Mutex<Vec<Expr>>,
    }
    #[async_trait::async_trait]
    impl datafusion::datasource::TableProvider for Recording {
        fn as_any(&self) -> &dyn Any {
            self
        }
        fn schema(&self) -> SchemaRef {
            self.schema.clone()
        }
        fn table_type(&self) -> datafusion::datasource::TableType {
            datafusion::datasource::TableType::Base
        }
        fn supports_filters_pushdown(
            &self,
            filters: &[&Expr],
        ) -> DfResult<Vec<datafusion::logical_expr::TableProviderFilterPushDown>> {
            Ok(vec![
                datafusion::logical_expr::TableProviderFilterPushDown::Inexact;
                filters.len()
            ])
        }
        async fn scan(
            &self,
            _state: &dyn datafusion::catalog::Session,
            projection: Option<&Vec<usize>>,
            filters: &[Expr],
            _limit: Option<usize>,
        ) -> DfResult<Arc<dyn ExecutionPlan>> {
            if let Ok(mut f) = self.filters.lock() {
                f.extend(filters.iter().cloned());
            }
            let schema = match projection {
                Some(p) => Arc::new(self.schema.project(p)?),
                None => self.schema.clone(),
            };
            Ok(Arc::new(datafusion::physical_plan::empty::EmptyExec::new(
                schema,
            )))
        }
    }
    let ctx = SessionContext::new();
    let table = Arc::new(Recording {
        schema,
        filters: std::sync::Mutex::new(Vec::new()),
    });
    ctx.register_table("t", table.clone())?;
    ctx.sql(&format!("SELECT * FROM t WHERE {filter}"))
        .await?
        .create_physical_plan()
        .await?;
    let filters = table
        .filters
        .lock()
        .map_err(|_| DataFusionError::Internal("poisoned".into()))?
        .clone();
    Ok(filters)
}

/// The ids of the rows of `batches` that `filter` keeps, sorted.
async fn select_ids(batches: Vec<RecordBatch>, filter: &str) -> DfResult<Vec<i64>> {
    let Some(first) = batches.first() else {
        return Ok(Vec::new());
    };
    let ctx = SessionContext::new();
    let mem = MemTable::try_new(first.schema(), vec![batches])?;
    ctx.register_table("t", Arc::new(mem))?;
    ids_where(&ctx, filter).await
}

/// The `id` column (`bigint`) of `SELECT id FROM t WHERE <filter> ORDER BY id` in `ctx`.
pub(super) async fn ids_where(ctx: &SessionContext, filter: &str) -> DfResult<Vec<i64>> {
    let out = ctx
        .sql(&format!("SELECT id FROM t WHERE {filter} ORDER BY id"))
        .await?
        .collect()
        .await?;
    Ok(out
        .iter()
        .flat_map(|b| {
            b.column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .map(|a| a.values().to_vec())
                .unwrap_or_default()
        })
        .collect())
}

/// The rows the scan returns.
pub(super) async fn run(scan: Arc<CommittedScan>) -> DfResult<Vec<RecordBatch>> {
    collect(scan, SessionContext::new().task_ctx()).await
}

fn planned_paths(scan: &CommittedScan) -> BTreeSet<String> {
    scan.partitions
        .iter()
        .flatten()
        .map(|f| f.path.clone())
        .collect()
}

/// Plans `filter`, checks it keeps exactly the files holding rows it keeps (when `exact`;
/// at least those otherwise), and that the rows it then keeps equal those a scan that
/// prunes nothing keeps, and the table's. Returns the files planned.
async fn check(t: &TestTable, filter: &str, keyed: bool, exact: bool) -> DfResult<FileCounts> {
    let scan = t.plan(Some(filter), keyed).await?;
    let kept = planned_paths(&scan);
    let matching = t.matching_files(filter).await?;
    if exact {
        assert_eq!(kept, matching, "files kept for {filter}");
    } else {
        assert!(kept.is_superset(&matching), "files kept for {filter}");
    }
    let counts = scan.file_counts();
    assert_eq!(counts.files_in_table, t.files.len(), "{filter}");
    assert_eq!(counts.files_scanned, kept.len(), "{filter}");
    let strict = scan.filter.as_ref().is_some_and(|f| f.strict);
    let raw = run(Arc::new(scan)).await?;
    let pruned = select_ids(raw.clone(), filter).await?;
    let full = select_ids(run(Arc::new(t.plan(None, keyed).await?)).await?, filter).await?;
    assert_eq!(pruned, full, "rows of {filter}");
    assert_eq!(pruned, t.expected(filter).await?, "rows of {filter}");
    if strict {
        // Pushed down exactly: the scan alone returns only the rows the filter keeps.
        assert_eq!(
            select_ids(raw, "true").await?,
            pruned,
            "rows the strict scan of {filter} returns"
        );
    }
    Ok(counts)
}

/// A partition field: the source column's field id, the field's name, its transform.
type Part<'a> = (i32, &'a str, Transform);

pub(super) fn spec(fields: &[Part]) -> iceberg::Result<UnboundPartitionSpec> {
    let mut b = UnboundPartitionSpec::builder();
    for (source, name, transform) in fields {
        b = b.add_partition_field(*source, *name, *transform)?;
    }
    Ok(b.build())
}

#[tokio::test]
async fn each_transform_prunes_by_partition_alone() -> TestResult {
    // (spec, filters each keeping exactly the files with a matching row)
    let cases: Vec<(Vec<Part>, Vec<&str>)> = vec![
        (
            vec![(3, "at_day", Transform::Day)],
            vec![
                "at >= '2024-01-08T00:00:00Z'",
                "at < '2024-01-03T00:00:00Z'",
                "at > '2024-01-05T12:00:00Z' AND at <= '2024-01-06T01:00:00Z'",
                "CAST(at AS DATE) = DATE '2024-01-04'",
                "at = '2024-01-09T05:00:00Z'",
            ],
        ),
        (
            vec![(4, "ts_hour", Transform::Hour)],
            vec![
                "ts >= TIMESTAMP '2024-01-10 20:00:00'",
                "ts BETWEEN TIMESTAMP '2024-01-02 03:00:00' AND TIMESTAMP '2024-01-02 05:30:00'",
            ],
        ),
        (
            vec![(5, "d_month", Transform::Month)],
            vec![
                "d >= DATE '2026-06-01'",
                "d BETWEEN DATE '2024-03-01' AND DATE '2024-05-31'",
            ],
        ),
        (
            vec![(5, "d_year", Transform::Year)],
            vec!["d < DATE '2025-01-01'", "d >= DATE '2027-01-01'"],
        ),
        (
            vec![(1, "id_bucket", Transform::Bucket(8))],
            vec!["id = 5", "id IN (5, 6, 200)", "id = 5 OR id = 77"],
        ),
        (
            vec![(2, "name_trunc", Transform::Truncate(2))],
            vec![
                "name LIKE 'ab%'",
                "name = 'ba7'",
                "name IN ('aa0', 'ca4')",
                "name LIKE 'b%'",
            ],
        ),
        (
            vec![(1, "id_trunc", Transform::Truncate(50))],
            vec!["id >= 120", "id < 50", "id = 199"],
        ),
        (
            vec![(6, "n", Transform::Identity)],
            vec!["n = 3", "n IN (0, 4)", "n <> 2"],
        ),
        (
            vec![
                (3, "at_day", Transform::Day),
                (1, "id_bucket", Transform::Bucket(4)),
            ],
            vec![
                "at >= '2024-01-09T00:00:00Z' AND at < '2024-01-10T00:00:00Z' AND id IN (200, 201)",
                "at < '2024-01-02T00:00:00Z'",
            ],
        ),
    ];
    for (i, (fields, filters)) in cases.into_iter().enumerate() {
        let mut t = TestTable::new(&format!("t{i}"), spec(&fields)?)?;
        t.append(0..ROWS, false).await?;
        assert!(
            t.files.len() > 1,
            "{fields:?} writes one file per partition"
        );
        for filter in filters {
            let counts = check(&t, filter, false, true).await?;
            assert!(counts.files_scanned < counts.files_in_table, "{filter}");
        }
    }
    Ok(())
}

#[tokio::test]
async fn a_lookup_skips_the_buckets_and_truncations_its_keys_are_not_in() -> TestResult {
    for (i, transform) in [
        Transform::Bucket(8),
        Transform::Truncate(25),
        Transform::Identity,
    ]
    .into_iter()
    .enumerate()
    {
        let mut t = TestTable::new(&format!("k{i}"), spec(&[(1, "id_part", transform)])?)?;
        // Files without column bounds: only the partition can skip them.
        t.append((0..ROWS).rev(), false).await?;
        for filter in ["id = 5", "id IN (5, 6, 130)"] {
            let scan = t.plan(Some(filter), true).await?;
            assert!(
                scan.filter.as_ref().is_some_and(|f| f.keys.is_some()),
                "{filter} is a lookup"
            );
            check(&t, filter, true, true).await?;
        }
    }
    Ok(())
}

#[tokio::test]
async fn two_specs_in_one_table_each_prune_by_their_own_partition() -> TestResult {
    // First unpartitioned (as every table was), then by day, then by bucket of the key.
    let mut t = TestTable::new("evolved", UnboundPartitionSpec::builder().build())?;
    t.append(0..48, false).await?;
    t.evolve(spec(&[(3, "at_day", Transform::Day)])?)?;
    t.append(48..144, false).await?;
    t.evolve(spec(&[(1, "id_bucket", Transform::Bucket(4))])?)?;
    t.append(144..ROWS, false).await?;
    let specs: BTreeSet<i32> = t.files.iter().map(|(_, s, _)| *s).collect();
    assert_eq!(specs.len(), 3);
    // The unpartitioned file always stays; day files by day; bucket files all stay.
    let counts = check(&t, "at >= '2024-01-05T00:00:00Z'", false, false).await?;
    assert_eq!(counts.files_scanned, 1 + 2 + 4);
    // By the key: every file but the other buckets' of the last spec.
    check(&t, "id = 200", false, false).await?;
    let lookup = check(&t, "id = 200", true, false).await?;
    assert_eq!(lookup.files_scanned, 1 + 4 + 1);
    let both = check(
        &t,
        "id = 200 AND at >= '2024-01-05T00:00:00Z'",
        false,
        false,
    )
    .await?;
    assert_eq!(both.files_scanned, 1 + 2 + 1);
    Ok(())
}

#[tokio::test]
async fn column_metrics_prune_too_and_deletes_of_skipped_partitions_are_not_read() -> TestResult {
    let mut t = TestTable::new("deletes", spec(&[(3, "at_day", Transform::Day)])?)?;
    t.append(0..ROWS, true).await?;
    t.delete_first(3).await?;
    assert_eq!(t.deletes.len(), 10);
    let counts = check(&t, "at >= '2024-01-08T00:00:00Z'", false, true).await?;
    assert_eq!(
        counts,
        FileCounts {
            files_in_table: 10,
            files_scanned: 3,
            delete_files_in_table: 10,
            delete_files_scanned: 3,
        }
    );
    // The metrics of the key narrow a day to nothing.
    let counts = check(&t, "id = 30", false, true).await?;
    assert_eq!((counts.files_scanned, counts.delete_files_scanned), (1, 1));
    let counts = check(&t, "id = 30", true, true).await?;
    assert_eq!((counts.files_scanned, counts.delete_files_scanned), (1, 1));
    // A whole scan reads every delete file once (each with its own data file only).
    let scan = t.plan(None, false).await?;
    assert_eq!(scan.file_counts().delete_files_scanned, 10);
    assert!(scan
        .partitions
        .iter()
        .flatten()
        .all(|f| f.deletes.len() == 1));
    Ok(())
}

#[tokio::test]
async fn a_filter_the_statistics_prove_true_is_not_tested_again() -> TestResult {
    let mut t = TestTable::new("proof", spec(&[(3, "at_day", Transform::Day)])?)?;
    t.append(0..ROWS, true).await?;
    // (filter, whether every row group read is proven to pass it)
    let cases = [
        (
            "at >= '2024-01-03T00:00:00Z' AND at < '2024-01-05T00:00:00Z'",
            true,
        ),
        (
            "at >= '2024-01-03T12:00:00Z' AND at < '2024-01-05T00:00:00Z'",
            false,
        ),
        ("at < '2024-01-02T00:00:00Z' OR n = 3", false),
    ];
    for (filter, all_proven) in cases {
        check(&t, filter, false, true).await?;
        let scan = Arc::new(t.plan(Some(filter), false).await?);
        assert!(
            scan.filter.as_ref().is_some_and(|f| f.strict),
            "{filter} is applied by the scan itself"
        );
        run(scan.clone()).await?;
        let metrics = scan.metrics().ok_or("the scan has metrics")?;
        let count = |name: &str| metrics.sum_by_name(name).map_or(0, |v| v.as_usize());
        let (proven, read) = (count("row_groups_proven"), count("row_groups_read"));
        if all_proven {
            assert_eq!(proven, read, "{filter}: every row group read is proven");
        } else {
            assert!(
                proven < read,
                "{filter}: {proven} of {read} row groups proven"
            );
        }
    }
    Ok(())
}
