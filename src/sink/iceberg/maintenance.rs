//! Table maintenance, after the sink's commits: the rewrite commit that replaces compacted
//! files (one data manifest, at most one delete manifest, the same source LSN), snapshot
//! expiry by age and count, and the removal of files no retained snapshot references.
//! Which files to compact is decided with the key index (see `apply/compact.rs`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::SystemTime;

use iceberg::spec::{
    DataContentType, DataFile, ManifestListWriter, ManifestStatus, ManifestWriter,
    ManifestWriterBuilder, Operation, Snapshot, SnapshotReference, SnapshotRetention, Summary,
    MAIN_BRANCH,
};
use iceberg::table::Table;

use super::{commit, rowdelta, SUMMARY_COMMIT_TIME, SUMMARY_LSN, SUMMARY_PHASE, SUMMARY_PIPELINE};
use crate::catalog::LocalCatalog;
use crate::config::MaintenanceSettings;
use crate::error::{Context, Error, Result};
use crate::storage::{Location, Store};

pub use crate::table::{PROP_LAST_COMPACTION, SUMMARY_MAINTENANCE};

/// One file of the current snapshot, with the numbers its manifest entry carries.
#[derive(Debug, Clone)]
pub struct LiveFile {
    pub file: DataFile,
    pub snapshot_id: i64,
    pub seq: i64,
    pub file_seq: Option<i64>,
    /// The partition spec the file is written under (its manifest's).
    pub spec_id: i32,
}

/// The live files of the current snapshot and how many manifests hold them.
pub async fn live_files(table: &Table) -> Result<(Vec<LiveFile>, usize)> {
    let Some(snapshot) = table.metadata().current_snapshot() else {
        return Ok((Vec::new(), 0));
    };
    let list = table
        .manifest_list_reader(snapshot)
        .load()
        .await
        .context("reading the manifest list")?;
    let mut out = Vec::new();
    for mf in list.entries() {
        let manifest = mf
            .load_manifest(table.file_io())
            .await
            .context("reading a manifest")?;
        for entry in manifest.entries() {
            if entry.status() == ManifestStatus::Deleted {
                continue;
            }
            out.push(LiveFile {
                file: entry.data_file().clone(),
                snapshot_id: entry.snapshot_id().unwrap_or(snapshot.snapshot_id()),
                seq: entry
                    .sequence_number()
                    .unwrap_or(snapshot.sequence_number()),
                file_seq: entry.file_sequence_number.or(entry.sequence_number()),
                spec_id: mf.partition_spec_id,
            });
        }
    }
    Ok((out, list.entries().len()))
}

/// What a rewrite commit changes.
pub struct Rewrite {
    /// Data files taken out (their live rows are in `added`).
    pub removed: HashSet<String>,
    /// Whether every delete file is taken out (the deletes still needed are in `added_deletes`).
    pub remove_all_deletes: bool,
    pub added: Vec<DataFile>,
    pub added_deletes: Vec<DataFile>,
    /// The spec of added files not of the current spec (deletes of files of an earlier one).
    pub specs: rowdelta::Specs,
}

/// Commits a rewrite of the current snapshot: the same rows in other files. The new snapshot
/// (operation `replace`) lists every file in one data manifest and at most one delete
/// manifest, so it also merges manifests, and carries the source LSN, phase and pipeline of
/// the snapshot it replaces: for readers and for exactly-once bookkeeping nothing changed.
pub async fn commit_rewrite(
    catalog: &LocalCatalog,
    table: &Table,
    live: Vec<LiveFile>,
    rewrite: Rewrite,
    pipeline: &str,
) -> Result<Table> {
    let meta = table.metadata();
    let parent = meta
        .current_snapshot()
        .ok_or_else(|| Error::fatal("a rewrite of a table without a snapshot"))?;
    let file_io = table.file_io();
    let commit_id = uuid::Uuid::now_v7();
    let snapshot_id = rowdelta::new_snapshot_id(meta, commit_id);
    let seq = meta.next_sequence_number();
    let location = meta.location();
    let schema = meta.current_schema().clone();

    let mut writers: BTreeMap<(i32, bool), (String, ManifestWriter)> = BTreeMap::new();
    let mut counter = 0u32;
    // One manifest per spec and content (data or deletes), each made when first needed.
    let mut writer = |writers: &mut BTreeMap<(i32, bool), (String, ManifestWriter)>,
                      spec_id: i32,
                      deletes: bool|
     -> Result<()> {
        if writers.contains_key(&(spec_id, deletes)) {
            return Ok(());
        }
        counter += 1;
        let path = format!("{location}/metadata/{commit_id}-m{counter}.avro");
        let spec = meta.partition_spec_by_id(spec_id).ok_or_else(|| {
            Error::fatal(format!(
                "a file of partition spec {spec_id}, which table {} does not have",
                table.identifier()
            ))
        })?;
        let out = file_io.new_output(&path)?;
        let b = ManifestWriterBuilder::new(
            out,
            Some(snapshot_id),
            schema.clone(),
            spec.as_ref().clone(),
        );
        let w = if deletes {
            b.build_v2_deletes()
        } else {
            b.build_v2_data()
        };
        writers.insert((spec_id, deletes), (path, w));
        Ok(())
    };
    let current = meta.default_partition_spec_id();
    let (mut n_data, mut n_deletes) = (0u64, 0u64);
    let (mut records, mut pos_deletes, mut size) = (0u64, 0u64, 0u64);
    let (mut removed_data, mut removed_deletes) = (0u64, 0u64);
    for f in live {
        let is_data = f.file.content_type() == DataContentType::Data;
        let gone = if is_data {
            rewrite.removed.contains(f.file.file_path())
        } else {
            rewrite.remove_all_deletes
        };
        writer(&mut writers, f.spec_id, !is_data)?;
        let w = manifest(&mut writers, f.spec_id, !is_data)?;
        if gone {
            if is_data {
                removed_data += 1;
            } else {
                removed_deletes += 1;
            }
            w.add_delete_file(f.file, f.seq, f.file_seq)?;
            continue;
        }
        if is_data {
            n_data += 1;
            records += f.file.record_count();
        } else {
            n_deletes += 1;
            pos_deletes += f.file.record_count();
        }
        size += f.file.file_size_in_bytes();
        w.add_existing_file(f.file, f.snapshot_id, f.seq, f.file_seq)?;
    }
    let mut new_files: Vec<String> = Vec::new();
    let (added_data, added_deletes) = (rewrite.added.len(), rewrite.added_deletes.len());
    for f in rewrite.added {
        n_data += 1;
        records += f.record_count();
        size += f.file_size_in_bytes();
        new_files.push(f.file_path().to_string());
        writer(&mut writers, current, false)?;
        manifest(&mut writers, current, false)?.add_file(f, seq)?;
    }
    for f in rewrite.added_deletes {
        n_deletes += 1;
        pos_deletes += f.record_count();
        size += f.file_size_in_bytes();
        new_files.push(f.file_path().to_string());
        let spec = rewrite.specs.get(f.file_path()).copied().unwrap_or(current);
        writer(&mut writers, spec, true)?;
        manifest(&mut writers, spec, true)?.add_file(f, seq)?;
    }
    let mut manifests = Vec::new();
    for ((_, deletes), (path, w)) in writers {
        let manifest = w.write_manifest_file().await.context(if deletes {
            "writing a delete manifest"
        } else {
            "writing a data manifest"
        })?;
        // A manifest of removed entries only still records their removal.
        manifests.push(manifest);
        new_files.push(path);
    }
    let list_path = format!("{location}/metadata/snap-{snapshot_id}-1-{commit_id}.avro");
    let mut list = ManifestListWriter::v2(
        file_io.new_output(&list_path)?.writer().await?,
        snapshot_id,
        Some(parent.snapshot_id()),
        seq,
    );
    list.add_manifests(manifests.into_iter())?;
    list.close().await.context("writing the manifest list")?;
    new_files.push(list_path.clone());

    let mut summary: HashMap<String, String> = parent
        .summary()
        .additional_properties
        .iter()
        // The same state at the same LSN, reached in the source at the same time (its first
        // change is its parent's: a compaction adds none).
        .filter(|(k, _)| {
            [
                SUMMARY_LSN,
                SUMMARY_PHASE,
                SUMMARY_PIPELINE,
                SUMMARY_COMMIT_TIME,
            ]
            .contains(&k.as_str())
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    summary.insert(SUMMARY_MAINTENANCE.to_string(), "compaction".to_string());
    for (k, v) in [
        ("added-data-files", added_data as u64),
        ("deleted-data-files", removed_data),
        ("added-delete-files", added_deletes as u64),
        ("removed-delete-files", removed_deletes),
        ("total-records", records),
        ("total-data-files", n_data),
        ("total-delete-files", n_deletes),
        ("total-position-deletes", pos_deletes),
        ("total-equality-deletes", 0),
        ("total-files-size", size),
    ] {
        summary.insert(k.to_string(), v.to_string());
    }
    let now = chrono::Utc::now().timestamp_millis();
    let timestamp_ms = now.max(meta.last_updated_ms() + 1);
    let snapshot = Snapshot::builder()
        .with_snapshot_id(snapshot_id)
        .with_parent_snapshot_id(Some(parent.snapshot_id()))
        .with_sequence_number(seq)
        .with_timestamp_ms(timestamp_ms)
        .with_manifest_list(list_path)
        .with_summary(Summary {
            operation: Operation::Replace,
            additional_properties: summary,
        })
        .with_schema_id(meta.current_schema_id())
        .build();
    crate::storage::lease::ensure_held(pipeline)?;
    let props = HashMap::from([(PROP_LAST_COMPACTION.to_string(), timestamp_ms.to_string())]);
    rowdelta::commit_metadata(catalog, table, &new_files, |b| {
        b.add_snapshot(snapshot)?
            .set_ref(
                MAIN_BRANCH,
                SnapshotReference::new(snapshot_id, SnapshotRetention::branch(None, None, None)),
            )?
            .set_properties(props)
    })
    .await
}

/// The manifest writer of one spec and content, made by the rewrite before.
fn manifest(
    writers: &mut BTreeMap<(i32, bool), (String, ManifestWriter)>,
    spec_id: i32,
    deletes: bool,
) -> Result<&mut ManifestWriter> {
    writers
        .get_mut(&(spec_id, deletes))
        .map(|(_, w)| w)
        .ok_or_else(|| Error::fatal("a rewrite lost a manifest writer"))
}

/// The snapshots that expire now: replaced (their successor committed) longer ago than the
/// retention, oldest first, leaving at least `min_snapshots_to_keep`. The current snapshot,
/// the newest one that carries the source LSN and every snapshot a tag or branch points to
/// (the tags of consistent cuts among them) are never expired.
pub fn expiring(table: &Table, settings: &MaintenanceSettings, now_ms: i64) -> Result<Vec<i64>> {
    let meta = table.metadata();
    let mut snaps: Vec<_> = meta.snapshots().collect();
    snaps.sort_by_key(|s| (s.sequence_number(), s.timestamp_ms()));
    let mut keep: HashSet<i64> = [
        meta.current_snapshot_id(),
        commit::last_skippr_snapshot(table).map(|s| s.snapshot_id()),
    ]
    .into_iter()
    .flatten()
    .collect();
    keep.extend(
        crate::table::cuts::refs(meta)?
            .values()
            .map(|r| r.snapshot_id),
    );
    let cutoff = now_ms - settings.snapshot_retention.as_millis() as i64;
    let removable = snaps.len().saturating_sub(settings.min_snapshots_to_keep);
    let mut out = Vec::new();
    for pair in snaps.windows(2) {
        if out.len() >= removable {
            break;
        }
        let (s, successor) = (pair[0], pair[1]);
        if successor.timestamp_ms() >= cutoff {
            break;
        }
        if !keep.contains(&s.snapshot_id()) {
            out.push(s.snapshot_id());
        }
    }
    Ok(out)
}

/// Removes `ids` from the table's snapshots (their files go with the next orphan cleanup).
pub async fn expire(catalog: &LocalCatalog, table: &Table, ids: &[i64]) -> Result<Table> {
    rowdelta::commit_metadata(catalog, table, &[], |b| Ok(b.remove_snapshots(ids))).await
}

/// Tags the current snapshot with the cut `tag` (when given) and removes the cut tags
/// `drop` the table holds, in one metadata commit; the snapshots dropped cuts kept expire
/// with the next snapshot expiry.
pub async fn set_cut_tags(
    catalog: &LocalCatalog,
    table: &Table,
    tag: Option<&str>,
    drop: &[String],
) -> Result<Table> {
    let held = crate::table::cuts::refs(table.metadata())?;
    let current = table.metadata().current_snapshot_id();
    let tag = match (tag, current) {
        (Some(name), Some(id)) => Some((name, id)),
        (Some(_), None) => {
            return Err(Error::fatal(format!(
                "Iceberg table {} has no snapshot to tag",
                table.identifier()
            )))
        }
        (None, _) => None,
    };
    let drop: Vec<&String> = drop.iter().filter(|n| held.contains_key(*n)).collect();
    if tag.is_none() && drop.is_empty() {
        return Ok(table.clone());
    }
    rowdelta::commit_metadata(catalog, table, &[], |mut b| {
        for name in drop {
            b = b.remove_ref(name);
        }
        match tag {
            Some((name, id)) => b.set_ref(name, crate::table::cuts::cut_ref(id)),
            None => Ok(b),
        }
    })
    .await
}

/// Every file the table's metadata references: of each retained snapshot its manifest
/// list, manifests and live files, and the metadata files of the log.
pub(super) async fn referenced(table: &Table) -> Result<HashSet<String>> {
    let meta = table.metadata();
    let mut out: HashSet<String> = meta
        .metadata_log()
        .iter()
        .map(|l| l.metadata_file.clone())
        .collect();
    out.extend(table.metadata_location().map(str::to_string));
    let mut seen_manifests = HashSet::new();
    for snap in meta.snapshots() {
        out.insert(snap.manifest_list().to_string());
        let list = table
            .manifest_list_reader(snap)
            .load()
            .await
            .context("reading a manifest list")?;
        for mf in list.entries() {
            if !seen_manifests.insert(mf.manifest_path.clone()) {
                continue;
            }
            out.insert(mf.manifest_path.clone());
            let manifest = mf
                .load_manifest(table.file_io())
                .await
                .context("reading a manifest")?;
            for e in manifest.entries() {
                if e.status() != ManifestStatus::Deleted {
                    out.insert(e.file_path().to_string());
                }
            }
        }
    }
    Ok(out)
}

/// A file's path without the `file:` scheme a local location may carry.
fn plain_path(p: &str) -> &str {
    p.strip_prefix("file://")
        .or_else(|| p.strip_prefix("file:"))
        .unwrap_or(p)
}

/// Where a table location is, as a store root.
fn table_root(location: &str) -> Result<Location> {
    if location.starts_with("s3://") {
        return Location::parse_s3(location).map_err(Error::fatal);
    }
    Ok(Location::Local(plain_path(location).into()))
}

/// Deletes the files under the table's `data/` and `metadata/` that no retained snapshot or
/// metadata file references and that are older than `orphan_file_age` (a younger one may
/// belong to a commit in flight). Returns how many were removed.
pub async fn remove_orphans(table: &Table, settings: &MaintenanceSettings) -> Result<usize> {
    // The current metadata file is referenced by location only: a table known without it
    // (committed in a REST round) waits for a load that names it.
    if table.metadata_location().is_none() {
        return Ok(0);
    }
    let location = table
        .metadata()
        .location()
        .trim_end_matches('/')
        .to_string();
    // With the storage settings the table was loaded with (a REST catalog's vended keys).
    let s3 = crate::storage::iceberg_io::s3_settings(table.file_io().config().props(), None);
    let store = Store::open_with(&table_root(&location)?, settings.region.as_deref(), &s3)?;
    let referenced: HashSet<String> = referenced(table)
        .await?
        .iter()
        .map(|p| plain_path(p).to_string())
        .collect();
    let cutoff = SystemTime::now()
        .checked_sub(settings.orphan_file_age)
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let mut removed = 0;
    for dir in ["data", "metadata"] {
        for entry in store.list(dir).await? {
            if referenced.contains(plain_path(&format!("{location}/{}", entry.key))) {
                continue;
            }
            if entry.modified.is_none_or(|m| m > cutoff) {
                continue;
            }
            store.delete(&entry.key).await?;
            removed += 1;
        }
    }
    Ok(removed)
}
