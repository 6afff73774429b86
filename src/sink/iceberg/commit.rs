//! Atomic commits to Iceberg: new data files and the source LSN they cover land in one
//! snapshot, so a reader (and a restart) sees either all of a batch or none of it.

use std::collections::HashMap;

use iceberg::spec::{DataFile, SnapshotRef};
use iceberg::table::Table;

use super::{rowdelta, SUMMARY_LSN, SUMMARY_PHASE, SUMMARY_PIPELINE};
use crate::catalog::LocalCatalog;
use crate::change::Lsn;
use crate::error::{Context, Result};

/// Appends `files` in one snapshot whose summary records `lsn` and the writing phase. The
/// files and the new metadata are fsynced before the catalog swap (see [`rowdelta::commit`]).
pub async fn append(
    catalog: &LocalCatalog,
    table: &Table,
    files: Vec<DataFile>,
    lsn: Lsn,
    phase: &str,
    pipeline: &str,
) -> Result<Table> {
    commit_files(catalog, table, files, false, summary(lsn, phase, pipeline)).await
}

/// Replaces every file of the table with `files` in one snapshot (a table copied again):
/// readers see the old rows or the new ones, never a mix.
pub async fn replace(
    catalog: &LocalCatalog,
    table: &Table,
    files: Vec<DataFile>,
    lsn: Lsn,
    phase: &str,
    pipeline: &str,
) -> Result<Table> {
    commit_files(catalog, table, files, true, summary(lsn, phase, pipeline)).await
}

async fn commit_files(
    catalog: &LocalCatalog,
    table: &Table,
    files: Vec<DataFile>,
    replace_all: bool,
    props: HashMap<String, String>,
) -> Result<Table> {
    rowdelta::commit(catalog, table, files, Vec::new(), replace_all, props)
        .await
        .with_context(|| format!("committing to Iceberg table {}", table.identifier()))
}

/// The snapshot summary every skipprd commit carries: the LSN it covers, the phase that
/// wrote it and the pipeline.
pub fn summary(lsn: Lsn, phase: &str, pipeline: &str) -> HashMap<String, String> {
    HashMap::from([
        (SUMMARY_LSN.to_string(), lsn.to_string()),
        (SUMMARY_PHASE.to_string(), phase.to_string()),
        (SUMMARY_PIPELINE.to_string(), pipeline.to_string()),
    ])
}

/// The newest snapshot written by skipprd: the current one, or, when another engine
/// committed on top (compaction, a manual fix), the nearest ancestor that carries
/// `skippr.lsn`. The walk follows parent ids and stops at a missing (expired) parent.
pub fn last_skippr_snapshot(table: &Table) -> Option<&SnapshotRef> {
    let meta = table.metadata();
    let mut next = meta.current_snapshot();
    // Bounded by the number of snapshots, so a malformed parent cycle cannot loop forever.
    for _ in 0..=meta.snapshots().len() {
        let s = next?;
        if s.summary().additional_properties.contains_key(SUMMARY_LSN) {
            return Some(s);
        }
        next = s
            .parent_snapshot_id()
            .and_then(|id| meta.snapshot_by_id(id));
    }
    None
}

/// The source LSN covered by the table's newest skipprd snapshot (see
/// [`last_skippr_snapshot`]), if it has one.
pub fn committed_lsn(table: &Table) -> Option<Lsn> {
    last_skippr_snapshot(table)
        .and_then(|s| s.summary().additional_properties.get(SUMMARY_LSN))
        .and_then(|v| Lsn::parse(v).ok())
}

/// The pipeline recorded by the table's newest skipprd snapshot.
pub fn committed_pipeline(table: &Table) -> Option<&str> {
    last_skippr_snapshot(table)
        .and_then(|s| s.summary().additional_properties.get(SUMMARY_PIPELINE))
        .map(String::as_str)
}
