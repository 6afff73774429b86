//! Sink, the end of a batch of applied changes: the pending rows and position deletes
//! written to files (early, for a transaction larger than memory) and committed in one
//! Iceberg snapshot that records the LSN it covers.

use std::collections::HashMap;

use super::{Loc, PendingRow, TableSink};
use crate::catalog::LocalCatalog;
use crate::change::Datum;
use crate::error::{Error, Result};
use crate::sink::iceberg::writer::TableWriter;
use crate::sink::iceberg::{
    evolve, rowdelta, PG_EPOCH_MICROS, SUMMARY_COMMIT_TIME, SUMMARY_FIRST_COMMIT_TIME,
    SUMMARY_FIRST_LSN, SUMMARY_LSN, SUMMARY_PHASE, SUMMARY_PIPELINE,
};
use crate::table::partition::{self, FilePartition, FilePartitions, Partitioner};
use crate::telemetry::metrics;
use iceberg::spec::Struct;

/// Decoded bytes gathered at a time when a change file is written in key order.
const SORTED_WRITE_BYTES: usize = 256 * 1024;

impl TableSink {
    /// Pending rows (in memory) that are still live, in the order they were applied.
    fn take_live(&mut self) -> Vec<PendingRow> {
        self.pending_bytes = 0;
        self.pending.take()
    }

    /// A NULL in a required field: the source allowed it when the change was made (its NOT
    /// NULL was dropped, perhaps set again before the catalog was read), so the field
    /// becomes optional rather than the change being refused or lost.
    async fn relax_for(&mut self, live: &[PendingRow], catalog: &LocalCatalog) -> Result<()> {
        let nulls: Vec<String> = self
            .arrow
            .fields()
            .iter()
            .enumerate()
            .filter(|(i, f)| {
                !f.is_nullable() && live.iter().any(|r| matches!(r.values[*i], Datum::Null))
            })
            .map(|(_, f)| f.name().clone())
            .collect();
        if !nulls.is_empty() {
            let names: Vec<&str> = nulls.iter().map(String::as_str).collect();
            let relaxed = evolve::make_optional(&self.table, &names)?;
            self.take_optional(relaxed, catalog).await?;
        }
        Ok(())
    }

    /// Writes live pending rows to new data files (not committed), one per partition of
    /// the table's current spec, and indexes them there.
    async fn write_live(
        &mut self,
        live: Vec<PendingRow>,
        catalog: &LocalCatalog,
    ) -> Result<Vec<iceberg::spec::DataFile>> {
        if live.is_empty() {
            return Ok(Vec::new());
        }
        self.relax_for(&live, catalog).await?;
        let batch = self.build_batch(&live).await?;
        // Written in the table's order (its sort order, then its key): a lookup then reads
        // one page of each column, and compaction merges the files instead of sorting them.
        let order: Vec<u32> = match self.key_sort(&batch)? {
            Some(order) => order,
            None => (0..batch.num_rows() as u32).collect(),
        };
        // Each row's partition; rows of one partition go to one file, in order.
        let partitioner = Partitioner::current(self.table.metadata())?;
        let (groups, of_row): (Vec<Struct>, Vec<u32>) = match &partitioner {
            None => (vec![Struct::empty()], vec![0; batch.num_rows()]),
            Some(p) => p.groups(&batch)?,
        };
        // Each group's rows in order, and where each pending row landed in its file.
        let mut rows_of: Vec<Vec<u32>> = vec![Vec::new(); groups.len()];
        let mut at: Vec<u64> = vec![0; live.len()];
        for row in order {
            let g = &mut rows_of[of_row[row as usize] as usize];
            at[row as usize] = g.len() as u64;
            g.push(row);
        }
        let name = format!("cdc-{}", uuid::Uuid::now_v7().simple());
        let mut w = TableWriter::new(&self.table, name, u64::MAX / 4).await?;
        // Gathered a slice of the order at a time: a sorted copy of a whole transaction
        // larger than memory would double what it holds.
        let row_bytes = batch.get_array_memory_size() / batch.num_rows().max(1);
        let chunk = (SORTED_WRITE_BYTES / row_bytes.max(1)).clamp(64, 8192);
        for (part, rows) in groups.iter().zip(&rows_of) {
            for piece in rows.chunks(chunk) {
                let piece = arrow::array::UInt32Array::from(piece.to_vec());
                w.write_to(
                    part.clone(),
                    arrow::compute::take_record_batch(&batch, &piece)?,
                )
                .await?;
            }
        }
        let (files, _) = w.close().await?;
        // Each partition's rows are in exactly one file.
        let mut file_of: Vec<Option<u32>> = vec![None; groups.len()];
        let spec_id = self.table.metadata().default_partition_spec_id();
        for file in &files {
            let g = groups
                .iter()
                .position(|p| p == file.partition())
                .filter(|g| file_of[*g].is_none())
                .ok_or_else(|| {
                    Error::fatal("a change batch was written to other than one file a partition")
                })?;
            file_of[g] = Some(self.files.len() as u32);
            self.files.push(file.file_path().to_string());
            self.parts
                .insert(file.file_path(), spec_id, file.partition().clone());
        }
        for (i, row) in live.into_iter().enumerate() {
            let file = file_of[of_row[i] as usize].ok_or_else(|| {
                Error::fatal("a change batch was written to other than one file a partition")
            })?;
            self.index_insert(row.key, Loc { file, pos: at[i] })?;
        }
        Ok(files)
    }

    /// Writes the rows staged in memory to a data file that the next commit adds, so that a
    /// transaction larger than memory is applied in bounded memory. Nothing becomes visible:
    /// the file is referenced only by that commit (a crash before it leaves an unreferenced
    /// file, and the changes are applied again from the WAL).
    pub async fn spill(&mut self, catalog: &LocalCatalog, pipeline: &str) -> Result<()> {
        let live = self.take_live();
        if live.is_empty() && self.deletes.is_empty() {
            return Ok(());
        }
        // Making a field optional commits a schema: only the lease holder may.
        crate::storage::lease::ensure_held(pipeline)?;
        let rows = live.len();
        let written = self.write_live(live, catalog).await?;
        self.staged.extend(written);
        let deletes = self.deletes.len();
        let written = self.write_deletes().await?;
        self.staged_deletes.extend(written);
        self.spill_changelog().await?;
        tracing::debug!(table = %self.table.identifier(), rows, deletes, files = self.staged.len() + self.staged_deletes.len(), "staged changes spilled to files for the next commit");
        Ok(())
    }

    /// Writes the pending position deletes to new delete files (not committed), one per
    /// partition of the data files they delete from.
    async fn write_deletes(&mut self) -> Result<Vec<iceberg::spec::DataFile>> {
        if self.deletes.is_empty() {
            return Ok(Vec::new());
        }
        let deletes: Vec<(String, i64)> = self
            .deletes
            .iter()
            .map(|l| (self.files[l.file as usize].clone(), l.pos as i64))
            .collect();
        let name = format!("cdc-{}", uuid::Uuid::now_v7().simple());
        let meta = self.table.metadata();
        if partition::never_partitioned(meta) {
            let file = rowdelta::write_position_deletes(&self.table, deletes, &name, None).await?;
            self.deletes.clear();
            return Ok(vec![file]);
        }
        let current = meta.default_partition_spec_id();
        let mut groups: Vec<(FilePartition, Vec<(String, i64)>)> = Vec::new();
        let mut at: HashMap<FilePartition, usize> = HashMap::new();
        for (path, pos) in deletes {
            let part = self.partition_of(&path).await?;
            let g = *at.entry(part.clone()).or_insert_with(|| {
                groups.push((part, Vec::new()));
                groups.len() - 1
            });
            groups[g].1.push((path, pos));
        }
        let mut files = Vec::with_capacity(groups.len());
        for (n, (part, deletes)) in groups.into_iter().enumerate() {
            let file = rowdelta::write_position_deletes(
                &self.table,
                deletes,
                &format!("{name}-{n}"),
                Some(&part),
            )
            .await?;
            if part.0 != current {
                self.delete_specs
                    .insert(file.file_path().to_string(), part.0);
            }
            files.push(file);
        }
        self.deletes.clear();
        Ok(files)
    }

    /// The spec and partition of a data file of the table (read from the manifests the first
    /// time one is needed).
    pub(super) async fn partition_of(&mut self, path: &str) -> Result<FilePartition> {
        if self.parts.get(path).is_none() && !self.parts_loaded {
            let committed = FilePartitions::load(&self.table).await?;
            self.parts.extend(committed);
            self.parts_loaded = true;
        }
        self.parts.get(path).cloned().ok_or_else(|| {
            Error::fatal(format!(
                "data file {path} of Iceberg table {} is in no manifest of it",
                self.table.identifier()
            ))
        })
    }

    /// Commits everything applied since the last commit in one Iceberg snapshot.
    pub async fn commit(&mut self, catalog: &LocalCatalog, pipeline: &str) -> Result<()> {
        if !self.has_pending() {
            return Ok(());
        }
        // Checked before the schema a NULL may relax, as well as before the data (rowdelta).
        crate::storage::lease::ensure_held(pipeline)?;
        let live = self.take_live();
        let mut props = HashMap::from([
            (SUMMARY_LSN.to_string(), self.pending_lsn.to_string()),
            (SUMMARY_PHASE.to_string(), "cdc".to_string()),
            (SUMMARY_PIPELINE.to_string(), pipeline.to_string()),
        ]);
        if let Some(first) = self.first_pending_lsn {
            props.insert(SUMMARY_FIRST_LSN.to_string(), first.to_string());
        }
        for (key, time) in [
            (SUMMARY_COMMIT_TIME, self.pending_time),
            (SUMMARY_FIRST_COMMIT_TIME, self.first_pending_time),
        ] {
            if let Some(t) = time {
                props.insert(key.to_string(), (t + PG_EPOCH_MICROS).to_string());
            }
        }
        // The changelog's rows are written to a file and its snapshot prepared on another
        // thread while the table's are; both are then made current in one catalog
        // transaction, or changelog first where the catalog has no transactions: a crash
        // between the two leaves it ahead, and the replay then applies the changes to the
        // table alone.
        let rest = catalog.rest().is_some();
        let log_prepare = self.start_changelog(self.pending_lsn, rest, &props).await?;
        let mut data_files = std::mem::take(&mut self.staged);
        let written = self.write_live(live, catalog).await;
        let written = match written {
            Ok(w) => w,
            Err(e) => {
                self.staged = data_files;
                return Err(e);
            }
        };
        data_files.extend(written);
        // After a TRUNCATE, the deletes are of rows spilled since (older ones were dropped).
        let mut delete_files = std::mem::take(&mut self.staged_deletes);
        match self.write_deletes().await {
            Ok(written) => delete_files.extend(written),
            Err(e) => {
                self.staged = data_files;
                self.staged_deletes = delete_files;
                return Err(e);
            }
        }
        let files = rowdelta::NewFiles {
            data: data_files.clone(),
            deletes: delete_files.clone(),
            replace_all: self.truncated,
            props,
        };
        let prepared = rowdelta::prepare(rest, &self.table, files, &self.delete_specs).await;
        let log_prepared = Self::changelog_prepared(log_prepare).await;
        let (prepared, log_prepared) = match (prepared, log_prepared) {
            (Ok(p), Ok(l)) => (p, l),
            (Err(e), _) | (_, Err(e)) => {
                self.staged = data_files;
                self.staged_deletes = delete_files;
                return Err(e);
            }
        };
        self.table = match log_prepared {
            // Made current together where the catalog can (one transaction), else the
            // changelog first.
            Some(log) => {
                let (logged, committed) = rowdelta::finish_pair(catalog, log, prepared).await;
                self.changelog_committed(logged?, self.pending_lsn);
                committed?
            }
            None => rowdelta::finish(catalog, prepared).await?,
        };
        self.delete_specs.clear();
        // The index already follows the commit: a TRUNCATE cleared it when it was applied,
        // and the rows written since are indexed in their new files.
        tracing::info!(table = %self.table.identifier(), changes = self.pending_changes, lsn = %self.pending_lsn, "changes committed");
        let table_name = self.table.identifier().name().to_string();
        let labels = [("pipeline", pipeline), ("table", table_name.as_str())];
        metrics::add(
            "skippr_commits_total",
            "Iceberg commits of changes.",
            &labels,
            1.0,
        );
        metrics::add(
            "skippr_committed_changes_total",
            "Row changes committed to Iceberg.",
            &labels,
            self.pending_changes as f64,
        );
        self.lsn = self.pending_lsn;
        self.deletes.clear();
        self.truncated = false;
        self.pending_changes = 0;
        self.first_pending_lsn = None;
        self.first_pending_time = None;
        Ok(())
    }
}
