//! The table layer, snapshot summaries: what every skipprd commit records in its snapshot
//! (the source LSN it covers, the phase and the pipeline), and reading it back.

use std::collections::HashMap;

use iceberg::spec::{
    SnapshotRef, SnapshotReference, SnapshotRetention, TableMetadataBuilder, MAIN_BRANCH,
};
use iceberg::table::Table;

use super::{SUMMARY_LSN, SUMMARY_PHASE, SUMMARY_PIPELINE};
use crate::change::Lsn;

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

/// `table` with `snapshot_id` as its current snapshot, in memory only (read-only), so that
/// every reader sees the table's rows as they were then, read into the current schema by
/// field id.
pub fn at_snapshot(table: &Table, snapshot_id: i64) -> iceberg::Result<Table> {
    let meta = table.metadata();
    if meta.current_snapshot_id() == Some(snapshot_id) {
        return Ok(table.clone());
    }
    let meta = TableMetadataBuilder::new_from_metadata(meta.clone(), None)
        .set_ref(
            MAIN_BRANCH,
            SnapshotReference::new(snapshot_id, SnapshotRetention::branch(None, None, None)),
        )?
        .build()?
        .metadata;
    let mut b = Table::builder()
        .metadata(meta)
        .identifier(table.identifier().clone())
        .file_io(table.file_io().clone())
        .runtime(iceberg::Runtime::try_current()?)
        .readonly(true);
    if let Some(loc) = table.metadata_location() {
        b = b.metadata_location(loc);
    }
    b.build()
}
