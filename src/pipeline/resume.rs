//! The snapshot phase, before anything is copied: which copies cut short go on from the key
//! chunks they made durable (read back as [`Earlier`]), and the cleanup of those that cannot
//! (their manifests, and the files of a table that has no snapshot yet).

use std::collections::{HashMap, HashSet};
use std::path::Path;

use iceberg::table::Table;
use tokio_postgres::Client;

use super::chunks::CopyProgress;
use super::landing::{Earlier, TableJob};
use super::state::PipelineState;
use crate::change::Lsn;
use crate::config::{CdcMode, Config, PipelineConfig, TableRef};
use crate::error::{Context, ErrorKind, Result};
use crate::sink::iceberg::staged;
use crate::source::postgres::schema::TableSchema;
use crate::source::postgres::slot::{self, slot_info};

/// What to do with a table's copy cut short.
pub(super) enum Verdict {
    /// No copy in key chunks was cut short.
    Nothing,
    /// Go on at this LSN from these chunks.
    GoOn(Lsn, CopyProgress),
    /// Start over, for this reason; the chunks are given up.
    StartOver(String, CopyProgress),
    /// The copy landed; its record is spent (its manifests may be left to remove).
    Spent(CopyProgress),
}

/// Whether a copy of `ts` cut short can go on from the chunks it made durable: it can when
/// nothing in the table moved since (the Iceberg table has not committed it; the source
/// table, its key, columns, partitions and excluded columns, and the Iceberg table's
/// partition spec, are the ones it copied) and the pipeline's WAL removed nothing after the
/// copy's LSN. The slot and the publication are checked once for all tables ([`vet`]).
pub(super) fn verdict(
    prior: Option<&PipelineState>,
    ts: &TableSchema,
    table: &Table,
    committed: Option<Lsn>,
    p: &PipelineConfig,
    same_columns: bool,
) -> Verdict {
    let Some(prior) = prior else {
        return Verdict::Nothing;
    };
    let Some(recorded) = prior.table(&ts.table) else {
        return Verdict::Nothing;
    };
    let (Some(at), Some(progress)) = (recorded.copying_at, recorded.copied.clone()) else {
        return Verdict::Nothing;
    };
    if committed.is_some_and(|lsn| lsn >= at) {
        // It landed: what is left of its record is spent.
        return Verdict::Spent(progress);
    }
    let key = ice_key(ts, table);
    let why = if prior.resnapshot {
        Some("`sync --resnapshot` asked for a new copy of every table".to_string())
    } else if p.source.cdc_mode != CdcMode::SnapshotThenCdc {
        Some("the pipeline no longer streams changes (cdc_mode)".into())
    } else if progress.chunks.is_empty() {
        Some("no chunk was durable yet".into())
    } else if progress.oid != ts.oid {
        Some("the source table was dropped and made again".into())
    } else if key.as_deref() != Some(progress.key.as_str()) {
        Some("its primary key changed".into())
    } else if prior.wal_removed_through > at {
        Some(format!(
            "the pipeline's WAL was removed through {}, after the copy's start {at}",
            prior.wal_removed_through
        ))
    } else if recorded.partitions != ts.partitions {
        Some("partitions were attached or detached".into())
    } else if recorded.excluded != p.source.excluded(&ts.table) {
        Some("exclude_columns changed".into())
    } else if !same_columns {
        Some("the source's columns changed".into())
    } else if table.metadata().default_partition_spec_id() != progress.spec {
        Some("the table's partitioning changed".into())
    } else {
        None
    };
    match why {
        None => Verdict::GoOn(at, progress),
        Some(why) => Verdict::StartOver(why, progress),
    }
}

fn ice_key(ts: &TableSchema, table: &Table) -> Option<String> {
    let arrow = crate::table::schema::arrow_schema(table).ok()?;
    crate::source::postgres::key_chunks::chunk_key(&crate::source::postgres::snapshot::CopyJob {
        schema: ts.clone(),
        arrow,
    })
}

/// Reads back the chunks of a copy that goes on. `None` when they cannot be (a manifest or
/// a data file gone): the chunks are given up and the copy starts over. A passing fault
/// (the object store did not answer) is an error, so the chunks are kept for the retry.
pub(super) async fn take_up(
    table: &Table,
    ts: &TableSchema,
    at: Lsn,
    progress: CopyProgress,
) -> Result<Option<Earlier>> {
    match Earlier::read(table, at, progress.clone()).await {
        Ok(e) => Ok(Some(e)),
        Err(e) if e.kind() == ErrorKind::Retryable => Err(e),
        Err(e) => {
            tracing::warn!(table = %ts.table, error = %e, "the chunks of a copy cut short cannot be read back; copying the table from the start");
            give_up(table, &progress).await;
            Ok(None)
        }
    }
}

/// Removes the manifests of chunks given up (their data files go with the table's files
/// that no snapshot references, or with orphan cleanup).
pub(super) async fn give_up(table: &Table, progress: &CopyProgress) {
    let manifests: Vec<String> = progress
        .chunks
        .iter()
        .filter_map(|c| c.manifest.clone())
        .collect();
    staged::remove_manifests(table, manifests).await;
}

/// Keeps in `earlier` only the copies whose changes since their LSN the pipeline still
/// has: the pipeline's slot exists and was not acknowledged past what its WAL holds after
/// the copy's LSN (a slot made again, or moved outside skipprd, has lost them), and the
/// table is still in the publication (outside it, its changes were not sent). The others
/// start over, their chunks given up, and the log says why. Run before the publication is
/// completed.
pub(super) async fn vet(
    config: &Config,
    client: &Client,
    p: &PipelineConfig,
    wal_removed_through: Lsn,
    earlier: &mut HashMap<TableRef, Earlier>,
    todo: &[TableJob],
) -> Result<()> {
    if earlier.is_empty() {
        return Ok(());
    }
    let confirmed = slot_info(client, &p.source.slot)
        .await?
        .map(|s| s.confirmed_flush);
    let acknowledged =
        crate::wal::WalStore::for_pipeline(&config.storage, &config.storage_path, &p.name)?
            .acknowledged()?
            .max(wal_removed_through);
    let published = slot::publication_tables(client, &p.source.publication).await?;
    let mut out = Vec::new();
    for (t, e) in earlier.iter() {
        let why = match (&confirmed, &published) {
            (None, _) => Some("the pipeline's replication slot is gone".to_string()),
            (Some(Some(c)), _) if *c > e.at.max(acknowledged) => Some(format!(
                "the replication slot was acknowledged through {c}, past what the pipeline received after the copy's start {}",
                e.at
            )),
            (_, None) => Some("the publication is gone".into()),
            (_, Some(list)) if !list.contains(t) => {
                Some("the table left the publication, so its changes were not sent".into())
            }
            _ => None,
        };
        if let Some(why) = why {
            out.push((t.clone(), why));
        }
    }
    for (t, why) in out {
        let Some(e) = earlier.remove(&t) else {
            continue;
        };
        tracing::warn!(table = %t, reason = %why, "a copy cut short starts over");
        if let Some(j) = todo.iter().find(|j| j.schema.table == t) {
            give_up(&j.table, &e.progress).await;
            remove_uncommitted_files(&j.table, &HashSet::new())?;
        }
    }
    Ok(())
}

/// Deletes data files (and chunk manifests) left by an interrupted copy of a table that
/// has no snapshot yet, except those in `keep` (the chunks a copy goes on from): nothing
/// references them.
pub(super) fn remove_uncommitted_files(table: &Table, keep: &HashSet<String>) -> Result<()> {
    if table.metadata().current_snapshot().is_some() {
        return Ok(());
    }
    let location = table.metadata().location();
    let Some(path) = location.strip_prefix("file://") else {
        return Ok(());
    };
    let kept: HashSet<&str> = keep
        .iter()
        .map(|k| k.strip_prefix("file://").unwrap_or(k))
        .collect();
    // Partitioned tables keep each partition's files in a folder of its own.
    let mut todo = vec![Path::new(path).join("data")];
    let mut removed = 0;
    let manifests = Path::new(path).join("metadata");
    let mut found = Vec::new();
    if manifests.is_dir() {
        for entry in std::fs::read_dir(&manifests)
            .with_context(|| format!("listing {}", manifests.display()))?
        {
            let entry = entry.with_context(|| format!("listing {}", manifests.display()))?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with("copy-") && name.ends_with(".avro") {
                found.push(entry.path());
            }
        }
    }
    while let Some(dir) = todo.pop() {
        if !dir.is_dir() {
            continue;
        }
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))?
        {
            let entry = entry.with_context(|| format!("listing {}", dir.display()))?;
            let path = entry.path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|e| e == "parquet") {
                found.push(path);
            }
        }
    }
    for path in found {
        if path.to_str().is_some_and(|p| kept.contains(p)) {
            continue;
        }
        std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        removed += 1;
    }
    if removed > 0 {
        tracing::info!(table = %table.identifier(), files = removed, "removed files of an interrupted snapshot");
    }
    Ok(())
}
