//! Commits that iceberg-rust's transactions cannot express: new data files together with
//! position-delete files (updates and deletes), or a table emptied by TRUNCATE. The snapshot
//! is built from the public manifest and metadata writers, and the catalog pointer is swapped
//! with a compare-and-swap, exactly as the SQL catalog and PyIceberg do.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;

use arrow::array::{Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema as ArrowSchema};
use iceberg::spec::{
    DataContentType, DataFile, DataFileBuilder, DataFileFormat, ManifestListWriter,
    ManifestWriterBuilder, Operation, Snapshot, SnapshotReference, SnapshotRetention, Struct,
    Summary, TableMetadataBuilder, MAIN_BRANCH,
};
use iceberg::table::Table;
use iceberg::MetadataLocation;
use parquet::arrow::{AsyncArrowWriter, PARQUET_FIELD_ID_META_KEY};
use parquet::file::properties::{EnabledStatistics, WriterProperties};

use super::durable;
use crate::catalog::LocalCatalog;
use crate::error::{Context, Error, Result};

/// Field id of `file_path` in a position-delete file (Iceberg spec).
const POS_DELETE_FILE_PATH_ID: i32 = 2147483546;
/// Field id of `pos` in a position-delete file (Iceberg spec).
const POS_DELETE_POS_ID: i32 = 2147483545;

/// Writes one position-delete file for `deletes` (data file path, row position).
/// `partition` is the spec id and partition of the data files the deletes are of (a delete
/// file is scoped to one partition); `None` for a table that was never partitioned.
pub async fn write_position_deletes<P: AsRef<str> + Ord>(
    table: &Table,
    mut deletes: Vec<(P, i64)>,
    name: &str,
    partition: Option<&(i32, Struct)>,
) -> Result<DataFile> {
    deletes.sort();
    let schema = Arc::new(ArrowSchema::new(vec![
        Field::new("file_path", DataType::Utf8, false).with_metadata(HashMap::from([(
            PARQUET_FIELD_ID_META_KEY.to_string(),
            POS_DELETE_FILE_PATH_ID.to_string(),
        )])),
        Field::new("pos", DataType::Int64, false).with_metadata(HashMap::from([(
            PARQUET_FIELD_ID_META_KEY.to_string(),
            POS_DELETE_POS_ID.to_string(),
        )])),
    ]));
    let n = deletes.len() as u64;
    let paths = StringArray::from_iter_values(deletes.iter().map(|(p, _)| p.as_ref()));
    let pos = Int64Array::from_iter_values(deletes.iter().map(|(_, p)| *p));
    let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(paths), Arc::new(pos)])?;
    let location = format!(
        "{}/data/{name}-deletes.parquet",
        table.metadata().location()
    );
    // Full (untruncated) statistics let readers match a delete file to the data files it
    // touches instead of applying it to every file.
    let props = WriterProperties::builder()
        .set_statistics_enabled(EnabledStatistics::Chunk)
        .set_statistics_truncate_length(None)
        .build();
    let mut buf = Vec::new();
    {
        let mut w = AsyncArrowWriter::try_new(&mut buf, schema, Some(props))?;
        w.write(&batch).await?;
        w.close().await?;
    }
    let size = buf.len() as u64;
    table
        .file_io()
        .new_output(&location)?
        .write(buf.into())
        .await
        .with_context(|| format!("writing position-delete file {location}"))?;
    let mut b = DataFileBuilder::default();
    b.content(DataContentType::PositionDeletes)
        .file_path(location)
        .file_format(DataFileFormat::Parquet)
        .partition(partition.map(|p| p.1.clone()).unwrap_or_else(Struct::empty))
        .record_count(n)
        .file_size_in_bytes(size)
        .partition_spec_id(
            partition
                .map(|p| p.0)
                .unwrap_or_else(|| table.metadata().default_partition_spec_id()),
        );
    if let (Some(first), Some(last)) = (deletes.first(), deletes.last()) {
        if first.0 == last.0 {
            b.referenced_data_file(Some(first.0.as_ref().to_string()));
        }
        b.lower_bounds(HashMap::from([
            (
                POS_DELETE_FILE_PATH_ID,
                iceberg::spec::Datum::string(first.0.as_ref()),
            ),
            (
                POS_DELETE_POS_ID,
                iceberg::spec::Datum::long(deletes.iter().map(|d| d.1).min().unwrap_or(0)),
            ),
        ]))
        .upper_bounds(HashMap::from([
            (
                POS_DELETE_FILE_PATH_ID,
                iceberg::spec::Datum::string(last.0.as_ref()),
            ),
            (
                POS_DELETE_POS_ID,
                iceberg::spec::Datum::long(deletes.iter().map(|d| d.1).max().unwrap_or(0)),
            ),
        ]));
    }
    b.build()
        .map_err(|e| Error::fatal(format!("describing a position-delete file: {e}")))
}

/// The spec id of each file a commit adds where it is not the table's current spec (the
/// position deletes of data files written under an earlier spec); files not named are of
/// the current spec.
pub type Specs = HashMap<String, i32>;

/// The files grouped by the spec they are written under (each group is one manifest).
pub fn by_spec(
    files: Vec<DataFile>,
    specs: &Specs,
    current: i32,
) -> std::collections::BTreeMap<i32, Vec<DataFile>> {
    let mut out: std::collections::BTreeMap<i32, Vec<DataFile>> = Default::default();
    for f in files {
        let spec = specs.get(f.file_path()).copied().unwrap_or(current);
        out.entry(spec).or_default().push(f);
    }
    out
}

/// Totals carried from one snapshot summary to the next.
const TOTALS: [&str; 6] = [
    "total-records",
    "total-data-files",
    "total-delete-files",
    "total-position-deletes",
    "total-equality-deletes",
    "total-files-size",
];

/// What one snapshot adds: `data` and `deletes` files, after the table's files or, with
/// `replace_all`, instead of them (TRUNCATE); `props` go into the snapshot summary.
pub struct NewFiles {
    pub data: Vec<DataFile>,
    pub deletes: Vec<DataFile>,
    pub replace_all: bool,
    pub props: HashMap<String, String>,
}

impl NewFiles {
    /// Data files only, no deletes.
    pub fn data(data: Vec<DataFile>, replace_all: bool, props: HashMap<String, String>) -> Self {
        Self {
            data,
            deletes: Vec::new(),
            replace_all,
            props,
        }
    }
}

/// Commits `files` in one snapshot.
pub async fn commit(
    catalog: &LocalCatalog,
    table: &Table,
    files: NewFiles,
    specs: &Specs,
) -> Result<Table> {
    let prepared = prepare(catalog.rest().is_some(), table, files, specs).await?;
    finish(catalog, prepared).await
}

/// A commit of new files made ready up to the catalog's swap: its manifests, manifest list
/// and (for a local catalog) next metadata file written and durable with the files they
/// name. [`finish`] makes it current. Two tables' commits can be prepared at once and then
/// made current in a chosen order (a changelog before its table).
pub struct Prepared {
    base: Table,
    pipeline: Option<String>,
    step: PreparedStep,
}

enum PreparedStep {
    /// The next metadata file, written beside the current one.
    Local(Table),
    /// A REST catalog writes the metadata itself: the new metadata and its changes.
    Rest(Box<iceberg::spec::TableMetadata>, Vec<iceberg::TableUpdate>),
}

/// Prepares the commit [`commit`] makes (`rest`: the table's catalog is a REST catalog).
pub async fn prepare(
    rest: bool,
    table: &Table,
    files: NewFiles,
    specs: &Specs,
) -> Result<Prepared> {
    let pipeline = files.props.get(super::SUMMARY_PIPELINE).cloned();
    let (snapshot, new_files) = new_snapshot(table, files, specs).await?;
    let step = if rest {
        let built = add_current(
            TableMetadataBuilder::new_from_metadata(
                table.metadata().clone(),
                table.metadata_location().map(str::to_string),
            ),
            snapshot,
        )?
        .build()?;
        durable::sync_files(new_files.iter().map(String::as_str))?;
        PreparedStep::Rest(Box::new(built.metadata), built.changes)
    } else {
        PreparedStep::Local(stage_metadata(table, &new_files, |b| add_current(b, snapshot)).await?)
    };
    Ok(Prepared {
        base: table.clone(),
        pipeline,
        step,
    })
}

/// Makes a prepared commit current: the catalog's compare-and-swap from the table it was
/// prepared on (failing when another commit came first). Returns the table as committed.
pub async fn finish(catalog: &LocalCatalog, prepared: Prepared) -> Result<Table> {
    // A process that lost its pipeline's lease (S3 mode) must not make anything current.
    if let Some(pipeline) = &prepared.pipeline {
        crate::storage::lease::ensure_held(pipeline)?;
    }
    match prepared.step {
        PreparedStep::Rest(metadata, changes) => {
            durable::pause_point(durable::PAUSE_BEFORE_CATALOG_SWAP).await;
            catalog
                .commit_changes(&prepared.base, *metadata, changes)
                .await
        }
        PreparedStep::Local(staged) => {
            let old = metadata_location(&prepared.base)?;
            swap_in(catalog, &prepared.base, &old, staged).await
        }
    }
}

/// Makes two prepared commits current, `first` before `second` (a changelog before its
/// table): in one catalog transaction where the catalog has them (the SQL catalog), so both
/// become current or neither does; otherwise one after the other, so that a crash between
/// them leaves `first` alone current. Returns each one's outcome; `second` is not tried when
/// `first` failed (it then fails with the same error).
pub async fn finish_pair(
    catalog: &LocalCatalog,
    first: Prepared,
    second: Prepared,
) -> (Result<Table>, Result<Table>) {
    if let (PreparedStep::Local(a), PreparedStep::Local(b)) = (&first.step, &second.step) {
        let together = async {
            for pipeline in [&first.pipeline, &second.pipeline].into_iter().flatten() {
                crate::storage::lease::ensure_held(pipeline)?;
            }
            let (old_a, old_b) = (
                metadata_location(&first.base)?,
                metadata_location(&second.base)?,
            );
            let (new_a, new_b) = (metadata_location(a)?, metadata_location(b)?);
            durable::pause_point(durable::PAUSE_BEFORE_CATALOG_SWAP).await;
            catalog
                .swap_metadata_together(&[
                    (first.base.identifier(), &old_a, &new_a),
                    (second.base.identifier(), &old_b, &new_b),
                ])
                .await
        };
        match together.await {
            Ok(true) => {
                return match (first.step, second.step) {
                    (PreparedStep::Local(a), PreparedStep::Local(b)) => {
                        (Ok(swapped(catalog, a)), Ok(swapped(catalog, b)))
                    }
                    _ => {
                        let e = || {
                            Error::fatal(
                                "a local commit changed its kind while it was made current",
                            )
                        };
                        (Err(e()), Err(e()))
                    }
                };
            }
            Ok(false) => {}
            Err(e) => {
                let again = Error::new(e.kind(), e.to_string());
                return (Err(e), Err(again));
            }
        }
    }
    match finish(catalog, first).await {
        Ok(a) => (Ok(a), finish(catalog, second).await),
        Err(e) => {
            let again = Error::new(e.kind(), e.to_string());
            (Err(e), Err(again))
        }
    }
}

/// Replaces every file of `base` with `data`, written against `staged` (the table with
/// `change` applied in memory), applying `change` and the new snapshot in one metadata commit.
pub async fn replace_reshaped(
    catalog: &LocalCatalog,
    base: &Table,
    staged: &Table,
    data: Vec<DataFile>,
    props: HashMap<String, String>,
    change: impl FnOnce(TableMetadataBuilder) -> iceberg::Result<TableMetadataBuilder>,
) -> Result<Table> {
    let pipeline = props.get(super::SUMMARY_PIPELINE).cloned();
    let (snapshot, new_files) =
        new_snapshot(staged, NewFiles::data(data, true, props), &Specs::new()).await?;
    if let Some(pipeline) = &pipeline {
        crate::storage::lease::ensure_held(pipeline)?;
    }
    commit_metadata(catalog, base, &new_files, |b| {
        add_current(change(b)?, snapshot)
    })
    .await
}

/// Like [`commit`] (without deletes), but the new metadata is only written and made durable,
/// not made current: the returned table is the table as it will be once a catalog swap (or
/// a new catalog entry) names its metadata location. Models of the gateway commit several
/// tables at once this way.
/// Every snapshot before the new one is expired in the same change (a model keeps no
/// history: what only older snapshots read becomes garbage once the change is current).
pub async fn stage(
    table: &Table,
    data: Vec<DataFile>,
    replace_all: bool,
    props: HashMap<String, String>,
) -> Result<Table> {
    let older: Vec<i64> = table
        .metadata()
        .snapshots()
        .map(|s| s.snapshot_id())
        .collect();
    let (snapshot, new_files) = new_snapshot(
        table,
        NewFiles::data(data, replace_all, props),
        &Specs::new(),
    )
    .await?;
    stage_metadata(table, &new_files, |b| {
        let b = add_current(b, snapshot)?;
        Ok(if older.is_empty() {
            b
        } else {
            b.remove_snapshots(&older)
        })
    })
    .await
}

/// Makes `snapshot` the table's current one on the main branch.
fn add_current(
    b: TableMetadataBuilder,
    snapshot: Snapshot,
) -> iceberg::Result<TableMetadataBuilder> {
    let id = snapshot.snapshot_id();
    b.add_snapshot(snapshot)?.set_ref(
        MAIN_BRANCH,
        SnapshotReference::new(id, SnapshotRetention::branch(None, None, None)),
    )
}

/// Writes the manifests and the manifest list of a snapshot adding `files`, and returns the
/// snapshot with the files written for it.
async fn new_snapshot(
    table: &Table,
    files: NewFiles,
    specs: &Specs,
) -> Result<(Snapshot, Vec<String>)> {
    let NewFiles {
        data,
        deletes,
        replace_all,
        props,
    } = files;
    let meta = table.metadata();
    let file_io = table.file_io();
    let commit_id = uuid::Uuid::now_v7();
    let snapshot_id = new_snapshot_id(meta, commit_id);
    let seq = meta.next_sequence_number();
    let parent = meta.current_snapshot();
    let location = meta.location();
    let schema = meta.current_schema().clone();

    let mut manifests = Vec::new();
    if !replace_all {
        if let Some(s) = parent {
            let list = table
                .manifest_list_reader(s)
                .load()
                .await
                .context("reading the current manifest list")?;
            manifests.extend(list.entries().iter().cloned());
        }
    }
    let mut counter = 0;
    let mut write_manifest = |files: Vec<DataFile>, spec_id: i32, deletes: bool| {
        counter += 1;
        let path = format!("{location}/metadata/{commit_id}-m{counter}.avro");
        let schema = schema.clone();
        let spec = meta
            .partition_spec_by_id(spec_id)
            .map(|s| s.as_ref().clone());
        async move {
            let spec = spec.ok_or_else(|| {
                iceberg::Error::new(
                    iceberg::ErrorKind::DataInvalid,
                    format!("a file of partition spec {spec_id}, which the table does not have"),
                )
            })?;
            let out = file_io.new_output(path)?;
            let builder = ManifestWriterBuilder::new(out, Some(snapshot_id), schema, spec);
            let mut w = if deletes {
                builder.build_v2_deletes()
            } else {
                builder.build_v2_data()
            };
            for f in files {
                w.add_file(f, seq)?;
            }
            w.write_manifest_file().await
        }
    };
    // Every file the snapshot adds, made durable before the catalog points at it.
    let mut new_files: Vec<String> = data
        .iter()
        .chain(&deletes)
        .map(|f| f.file_path().to_string())
        .collect();
    let added_records: u64 = data.iter().map(|f| f.record_count()).sum();
    let added_size: u64 = data
        .iter()
        .chain(&deletes)
        .map(|f| f.file_size_in_bytes())
        .sum();
    let added_pos_deletes: u64 = deletes.iter().map(|f| f.record_count()).sum();
    let (n_data, n_deletes) = (data.len() as u64, deletes.len() as u64);
    let current = meta.default_partition_spec_id();
    for (spec_id, files) in by_spec(data, specs, current) {
        let manifest = write_manifest(files, spec_id, false)
            .await
            .context("writing a data manifest")?;
        new_files.push(manifest.manifest_path.clone());
        manifests.push(manifest);
    }
    for (spec_id, files) in by_spec(deletes, specs, current) {
        let manifest = write_manifest(files, spec_id, true)
            .await
            .context("writing a delete manifest")?;
        new_files.push(manifest.manifest_path.clone());
        manifests.push(manifest);
    }

    let list_path = format!("{location}/metadata/snap-{snapshot_id}-1-{commit_id}.avro");
    let mut list = ManifestListWriter::v2(
        file_io.new_output(&list_path)?.writer().await?,
        snapshot_id,
        meta.current_snapshot_id(),
        seq,
    );
    list.add_manifests(manifests.into_iter())?;
    list.close().await.context("writing the manifest list")?;
    new_files.push(list_path.clone());

    // Every total-* key is carried forward and kept numeric, or readers stop trusting them.
    let prev: HashMap<&str, u64> = TOTALS
        .iter()
        .map(|k| {
            let v = if replace_all {
                0
            } else {
                parent
                    .and_then(|s| s.summary().additional_properties.get(*k))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0)
            };
            (*k, v)
        })
        .collect();
    let mut summary = props;
    let mut set = |k: &str, v: u64| {
        summary.insert(k.to_string(), v.to_string());
    };
    set("added-data-files", n_data);
    set("added-records", added_records);
    set("added-delete-files", n_deletes);
    set("added-position-delete-files", n_deletes);
    set("added-position-deletes", added_pos_deletes);
    set("added-files-size", added_size);
    set("total-records", prev["total-records"] + added_records);
    set("total-data-files", prev["total-data-files"] + n_data);
    set("total-delete-files", prev["total-delete-files"] + n_deletes);
    set(
        "total-position-deletes",
        prev["total-position-deletes"] + added_pos_deletes,
    );
    set("total-equality-deletes", prev["total-equality-deletes"]);
    set("total-files-size", prev["total-files-size"] + added_size);
    let operation = if replace_all || n_deletes > 0 {
        Operation::Overwrite
    } else {
        Operation::Append
    };
    let timestamp_ms = chrono::Utc::now()
        .timestamp_millis()
        .max(meta.last_updated_ms() + 1);
    let snapshot = Snapshot::builder()
        .with_snapshot_id(snapshot_id)
        .with_parent_snapshot_id(meta.current_snapshot_id())
        .with_sequence_number(seq)
        .with_timestamp_ms(timestamp_ms)
        .with_manifest_list(list_path)
        .with_summary(Summary {
            operation,
            additional_properties: summary,
        })
        .with_schema_id(meta.current_schema_id())
        .build();
    Ok((snapshot, new_files))
}

/// A snapshot id for the commit `commit_id`, unused in the table so far.
pub fn new_snapshot_id(meta: &iceberg::spec::TableMetadata, commit_id: uuid::Uuid) -> i64 {
    let mut snapshot_id = (commit_id.as_u64_pair().1 & (i64::MAX as u64)) as i64;
    while meta.snapshots().any(|s| s.snapshot_id() == snapshot_id) {
        snapshot_id = snapshot_id.wrapping_add(1) & i64::MAX;
    }
    snapshot_id
}

/// Commits a new current schema (and table properties) in one metadata change.
pub async fn evolve_schema(
    catalog: &LocalCatalog,
    table: &Table,
    schema: iceberg::spec::Schema,
    properties: HashMap<String, String>,
) -> Result<Table> {
    commit_metadata(catalog, table, &[], |b| {
        b.add_current_schema(schema)?.set_properties(properties)
    })
    .await
}

/// Applies `change` to the table's metadata, writes the next metadata file, makes it and
/// `new_files` durable, and swaps the catalog pointer to it (compare-and-swap), then returns
/// the reloaded table.
pub(super) async fn commit_metadata(
    catalog: &LocalCatalog,
    table: &Table,
    new_files: &[String],
    change: impl FnOnce(TableMetadataBuilder) -> iceberg::Result<TableMetadataBuilder>,
) -> Result<Table> {
    if catalog.rest().is_some() {
        // A REST catalog writes the metadata itself: it gets the changes and their
        // requirements, once the files they name are durable.
        let built = change(TableMetadataBuilder::new_from_metadata(
            table.metadata().clone(),
            table.metadata_location().map(str::to_string),
        ))?
        .build()?;
        durable::sync_files(new_files.iter().map(String::as_str))?;
        durable::pause_point(durable::PAUSE_BEFORE_CATALOG_SWAP).await;
        return catalog
            .commit_changes(table, built.metadata, built.changes)
            .await;
    }
    let old_location = metadata_location(table)?;
    let staged = stage_metadata(table, new_files, change).await?;
    swap_in(catalog, table, &old_location, staged).await
}

/// Swaps the catalog's pointer of `table` from `old_location` to the metadata of `staged`
/// (compare-and-swap) and returns `staged`, now the table as committed: the metadata the
/// catalog names is the file `staged` was read from, so it is not read back.
async fn swap_in(
    catalog: &LocalCatalog,
    table: &Table,
    old_location: &str,
    staged: Table,
) -> Result<Table> {
    let new_location = metadata_location(&staged)?;
    durable::pause_point(durable::PAUSE_BEFORE_CATALOG_SWAP).await;
    catalog
        .swap_metadata(table.identifier(), old_location, &new_location)
        .await?;
    Ok(swapped(catalog, staged))
}

/// A staged table after its swap: remembered as this process's last commit (see
/// [`LocalCatalog::remember`]).
fn swapped(catalog: &LocalCatalog, staged: Table) -> Table {
    if let (Some(pipeline), Some(location)) = (
        crate::table::summary::committed_pipeline(&staged),
        staged.metadata_location(),
    ) {
        catalog.remember(staged.identifier(), location, pipeline);
    }
    staged
}

/// Where the table's current metadata file is.
fn metadata_location(table: &Table) -> Result<String> {
    Ok(table
        .metadata_location()
        .ok_or_else(|| {
            Error::fatal(format!(
                "Iceberg table {} has no metadata location",
                table.identifier()
            ))
        })?
        .to_string())
}

/// Applies `change` to the table's metadata, writes the next metadata file and makes it
/// and `new_files` durable; the catalog is not told. Returns the table as that metadata
/// describes it.
pub(super) async fn stage_metadata(
    table: &Table,
    new_files: &[String],
    change: impl FnOnce(TableMetadataBuilder) -> iceberg::Result<TableMetadataBuilder>,
) -> Result<Table> {
    let old_location = metadata_location(table)?;
    let builder = TableMetadataBuilder::new_from_metadata(
        table.metadata().clone(),
        Some(old_location.clone()),
    );
    let new_meta = change(builder)?.build()?.metadata;
    let new_location = MetadataLocation::from_str(&old_location)?
        .with_next_version()
        .with_new_metadata(&new_meta);
    new_meta
        .write_to(table.file_io(), &new_location)
        .await
        .context("writing table metadata")?;
    let new_location = new_location.to_string();
    // A crash (or power loss) after the swap must never leave the catalog naming a file
    // that is not on disk.
    durable::sync_files(
        new_files
            .iter()
            .map(String::as_str)
            .chain(std::iter::once(new_location.as_str())),
    )?;
    Table::builder()
        .runtime(iceberg::Runtime::try_current().context("finding the async runtime")?)
        .file_io(table.file_io().clone())
        .metadata_location(new_location)
        .metadata(new_meta)
        .identifier(table.identifier().clone())
        .build()
        .with_context(|| format!("describing Iceberg table {}", table.identifier()))
}
