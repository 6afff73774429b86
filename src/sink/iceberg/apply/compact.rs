//! Sink, table maintenance after commits: compaction guided by the key index (small files
//! and files with many deleted rows are rewritten with only their live rows, every delete
//! file is dropped or merged into one), snapshot expiry and orphan cleanup. The index is
//! moved to the rewritten files only once the rewrite is committed.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use arrow::array::BooleanArray;
use arrow::compute::filter_record_batch;
use iceberg::spec::{DataContentType, DataFile};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use super::{Loc, TableSink};
use crate::catalog::LocalCatalog;
use crate::error::{Context, Error, Result};
use crate::sink::iceberg::maintenance::{self, LiveFile, MaintenanceSettings, Rewrite};
use crate::sink::iceberg::rowdelta;
use crate::sink::iceberg::writer::TableWriter;
use crate::telemetry::metrics;

/// A data file with at least this share of its rows deleted is rewritten.
const DELETED_SHARE: f64 = 0.2;
/// Row groups of rewritten files are cut at this much encoded data, so that compaction holds
/// about this much of the output in memory whatever the width of the rows.
const ROW_GROUP_BYTES: usize = 4 * 1024 * 1024;
/// Rows are read from the files rewritten in batches of about this many decoded bytes.
const BATCH_BYTES: usize = 1024 * 1024;

/// Where the live rows of one rewritten file went: from its `k`-th live row on, they are in
/// output `out` from position `pos` on.
#[derive(Debug, Clone, Copy)]
struct Segment {
    k: u64,
    out: usize,
    pos: u64,
}

/// What a compaction plans to rewrite.
struct Plan {
    /// (file number in `files`, its manifest entry) of each data file rewritten.
    chosen: Vec<(u32, LiveFile)>,
    live: Vec<LiveFile>,
}

impl TableSink {
    pub fn set_maintenance(&mut self, settings: MaintenanceSettings) {
        self.maintenance = settings;
    }

    /// Runs the maintenance that is due, between commits (nothing staged). A failure is
    /// logged and leaves the table as its last commit left it; the key index is then read
    /// again from the table, so ingest goes on either way.
    pub async fn maintain(&mut self, catalog: &LocalCatalog, pipeline: &str) -> Result<()> {
        if !self.maintenance.enabled
            || self.has_pending()
            || self.truncated
            || !self.staged.is_empty()
            || !self.staged_deletes.is_empty()
        {
            return Ok(());
        }
        if self
            .last_check
            .is_some_and(|t| t.elapsed() < self.maintenance.check_interval)
        {
            return Ok(());
        }
        self.last_check = Some(Instant::now());
        if let Err(e) = self.maintain_now(catalog, pipeline).await {
            let table = self.table.identifier().name().to_string();
            tracing::warn!(table = %self.table.identifier(), error = %e.report(), "table maintenance failed; the table stays as committed and maintenance is tried again at the next check");
            metrics::add(
                "skippr_maintenance_failures_total",
                "Table maintenance runs that failed (the table stays as committed).",
                &[("pipeline", pipeline), ("table", table.as_str())],
                1.0,
            );
            self.table = catalog
                .catalog
                .load_table(self.table.identifier())
                .await
                .with_context(|| format!("reloading Iceberg table {}", self.table.identifier()))?;
            self.build_index().await?;
        }
        Ok(())
    }

    async fn maintain_now(&mut self, catalog: &LocalCatalog, pipeline: &str) -> Result<()> {
        crate::storage::lease::ensure_held(pipeline)?;
        let table = self.table.identifier().name().to_string();
        let labels = [("pipeline", pipeline), ("table", table.as_str())];
        if let Some(plan) = self.plan().await? {
            let rewritten = plan.chosen.len();
            self.compact(plan, catalog, pipeline).await?;
            metrics::add(
                "skippr_compactions_total",
                "Compaction commits (small files and deletes rewritten).",
                &labels,
                1.0,
            );
            metrics::add(
                "skippr_compacted_files_total",
                "Data files rewritten by compaction.",
                &labels,
                rewritten as f64,
            );
        }
        let now_ms = chrono::Utc::now().timestamp_millis();
        let expiring = maintenance::expiring(&self.table, &self.maintenance, now_ms);
        if !expiring.is_empty() {
            self.table = maintenance::expire(catalog, &self.table, &expiring).await?;
            tracing::debug!(table = %self.table.identifier(), snapshots = expiring.len(), "snapshots expired");
            metrics::add(
                "skippr_expired_snapshots_total",
                "Snapshots expired by table maintenance.",
                &labels,
                expiring.len() as f64,
            );
        }
        if self
            .last_cleanup
            .is_none_or(|t| t.elapsed() >= self.maintenance.cleanup_every())
        {
            self.last_cleanup = Some(Instant::now());
            let removed = maintenance::remove_orphans(&self.table, &self.maintenance).await?;
            if removed > 0 {
                tracing::info!(table = %self.table.identifier(), files = removed, "unreferenced files removed");
            }
            metrics::add(
                "skippr_orphan_files_removed_total",
                "Files no retained snapshot references, removed by table maintenance.",
                &labels,
                removed as f64,
            );
        }
        let meta = self.table.metadata();
        let total = |k: &str| {
            meta.current_snapshot()
                .and_then(|s| s.summary().additional_properties.get(k))
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        metrics::set(
            "skippr_table_data_files",
            "Data files in the table's current snapshot.",
            &labels,
            total("total-data-files"),
        );
        metrics::set(
            "skippr_table_delete_files",
            "Position delete files in the table's current snapshot.",
            &labels,
            total("total-delete-files"),
        );
        metrics::set(
            "skippr_table_snapshots",
            "Snapshots the table's metadata keeps.",
            &labels,
            meta.snapshots().len() as f64,
        );
        Ok(())
    }

    /// Rows of each file (by number) that the index holds live.
    fn live_rows(&self) -> Vec<u64> {
        let mut live = vec![0u64; self.files.len()];
        for loc in self.locs() {
            if let Some(n) = live.get_mut(loc.file as usize) {
                *n += 1;
            }
        }
        live
    }

    fn locs(&self) -> impl Iterator<Item = Loc> + '_ {
        self.index
            .locs()
            .chain(self.extra.values().flatten().copied())
    }

    /// Decides whether a compaction is due and which data files it rewrites: the small
    /// ones and those with many deleted rows.
    async fn plan(&self) -> Result<Option<Plan>> {
        let (live, manifests) = maintenance::live_files(&self.table).await?;
        if live.is_empty() {
            return Ok(None);
        }
        let numbers: HashMap<&str, u32> = self
            .files
            .iter()
            .enumerate()
            .map(|(i, p)| (p.as_str(), i as u32))
            .collect();
        let live_rows = self.live_rows();
        let small = self.maintenance.target_file_size / 4 * 3;
        let (mut smalls, mut heavy, mut delete_files) = (0usize, 0usize, 0usize);
        let mut chosen = Vec::new();
        for f in &live {
            if f.file.content_type() != DataContentType::Data {
                delete_files += 1;
                continue;
            }
            let Some(&no) = numbers.get(f.file.file_path()) else {
                return Err(Error::fatal(format!(
                    "data file {} of Iceberg table {} is not in the key index",
                    f.file.file_path(),
                    self.table.identifier()
                )));
            };
            let rows = f.file.record_count();
            let kept = live_rows[no as usize];
            let deleted_share = if rows == 0 {
                1.0
            } else {
                rows.saturating_sub(kept) as f64 / rows as f64
            };
            if f.file.file_size_in_bytes() < small {
                smalls += 1;
                chosen.push((no, f.clone()));
            } else if deleted_share >= DELETED_SHARE {
                heavy += 1;
                chosen.push((no, f.clone()));
            }
        }
        let min = self.maintenance.compaction_min_files;
        let due = smalls >= min || delete_files >= min || heavy > 0 || manifests >= 4 * min;
        Ok(due.then_some(Plan { chosen, live }))
    }

    /// Rewrites the planned files with their live rows, merges the deletes that still apply
    /// to other files into one delete file, commits, then moves the index to the new files.
    async fn compact(&mut self, plan: Plan, catalog: &LocalCatalog, pipeline: &str) -> Result<()> {
        let started = Instant::now();
        let chosen_nos: HashSet<u32> = plan.chosen.iter().map(|(no, _)| *no).collect();
        // Live positions of each rewritten file, in file order.
        let mut positions: HashMap<u32, Vec<u64>> =
            chosen_nos.iter().map(|no| (*no, Vec::new())).collect();
        for loc in self.locs() {
            if let Some(v) = positions.get_mut(&loc.file) {
                v.push(loc.pos);
            }
        }
        for v in positions.values_mut() {
            v.sort_unstable();
        }
        let (bytes, rows) = plan.chosen.iter().fold((0u64, 0u64), |(b, r), (_, f)| {
            (b + f.file.file_size_in_bytes(), r + f.file.record_count())
        });
        let per_row = (bytes / rows.max(1)).max(1);
        let rows_per_file = (self.maintenance.target_file_size / per_row).max(1);

        let prefix = format!("compact-{}", uuid::Uuid::now_v7().simple());
        let mut outputs: Vec<DataFile> = Vec::new();
        let mut writer: Option<(TableWriter, u64)> = None;
        let mut segments: HashMap<u32, Vec<Segment>> = HashMap::new();
        for (no, f) in &plan.chosen {
            let keep = &positions[no];
            if keep.is_empty() {
                continue;
            }
            let path = f.file.file_path();
            let builder = ParquetRecordBatchReaderBuilder::try_new(self.read_file(path).await?)?;
            // Batches of about BATCH_BYTES decoded, however wide the rows.
            let meta = builder.metadata();
            let (bytes, rows) = meta.row_groups().iter().fold((0i64, 0i64), |(b, r), g| {
                (b + g.total_byte_size(), r + g.num_rows())
            });
            let per_row = (bytes / rows.max(1)).max(1) as usize;
            let batch_rows = (BATCH_BYTES / per_row).clamp(1, 8192);
            let reader = builder.with_batch_size(batch_rows).build()?;
            let (mut base, mut k, mut written) = (0u64, 0usize, 0u64);
            for batch in reader {
                let batch = batch?;
                let n = batch.num_rows() as u64;
                let mut mask = vec![false; batch.num_rows()];
                while k < keep.len() && keep[k] < base + n {
                    mask[(keep[k] - base) as usize] = true;
                    k += 1;
                }
                base += n;
                let kept =
                    self.by_field_id(&filter_record_batch(&batch, &BooleanArray::from(mask))?)?;
                let mut offset = 0;
                while offset < kept.num_rows() {
                    if writer.is_none() {
                        let name = format!("{prefix}-{}", outputs.len());
                        let w = TableWriter::bounded(
                            &self.table,
                            name,
                            u64::MAX / 4,
                            Some(ROW_GROUP_BYTES),
                        )
                        .await?;
                        writer = Some((w, 0));
                    }
                    let Some((w, in_file)) = writer.as_mut() else {
                        break;
                    };
                    let take = ((rows_per_file - *in_file) as usize).min(kept.num_rows() - offset);
                    segments.entry(*no).or_default().push(Segment {
                        k: written,
                        out: outputs.len(),
                        pos: *in_file,
                    });
                    w.write(kept.slice(offset, take)).await?;
                    *in_file += take as u64;
                    written += take as u64;
                    offset += take;
                    if *in_file >= rows_per_file {
                        if let Some((w, _)) = writer.take() {
                            outputs.extend(w.close().await?.0);
                        }
                    }
                }
            }
            if k != keep.len() {
                return Err(Error::fatal(format!(
                    "the key index points past the end of data file {path}"
                )));
            }
        }
        if let Some((w, _)) = writer.take() {
            outputs.extend(w.close().await?.0);
        }

        // The deletes still needed: those of files that stay.
        let removed: HashSet<String> = plan
            .chosen
            .iter()
            .map(|(_, f)| f.file.file_path().to_string())
            .collect();
        let staying: HashSet<String> = plan
            .live
            .iter()
            .filter(|f| f.file.content_type() == DataContentType::Data)
            .map(|f| f.file.file_path().to_string())
            .filter(|p| !removed.contains(p))
            .collect();
        let delete_paths: Vec<String> = plan
            .live
            .iter()
            .filter(|f| f.file.content_type() == DataContentType::PositionDeletes)
            .map(|f| f.file.file_path().to_string())
            .collect();
        let mut added_deletes = Vec::new();
        if !delete_paths.is_empty() {
            let mut deleted = HashSet::new();
            self.read_deletes(&delete_paths, &mut deleted).await?;
            let mut interned: HashMap<String, Arc<str>> = HashMap::new();
            let mut still: Vec<(Arc<str>, i64)> = Vec::new();
            for (path, pos) in deleted {
                if staying.contains(&path) {
                    let p = interned
                        .entry(path)
                        .or_insert_with_key(|k| Arc::from(k.as_str()))
                        .clone();
                    still.push((p, pos));
                }
            }
            if !still.is_empty() {
                added_deletes
                    .push(rowdelta::write_position_deletes(&self.table, still, &prefix).await?);
            }
        }
        let (n_in, n_out, deletes_in) = (plan.chosen.len(), outputs.len(), delete_paths.len());
        let out_paths: Vec<String> = outputs.iter().map(|f| f.file_path().to_string()).collect();
        self.table = maintenance::commit_rewrite(
            catalog,
            &self.table,
            plan.live,
            Rewrite {
                removed,
                remove_all_deletes: true,
                added: outputs,
                added_deletes,
            },
            pipeline,
        )
        .await?;
        self.move_index(&chosen_nos, &positions, &segments, &staying, out_paths)?;
        tracing::info!(
            table = %self.table.identifier(),
            files_in = n_in,
            files_out = n_out,
            delete_files_in = deletes_in,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "compacted"
        );
        Ok(())
    }

    /// Points the index at the files after a compaction: rows of rewritten files at their
    /// new places, rows of other files at their renumbered files.
    fn move_index(
        &mut self,
        chosen: &HashSet<u32>,
        positions: &HashMap<u32, Vec<u64>>,
        segments: &HashMap<u32, Vec<Segment>>,
        staying: &HashSet<String>,
        outputs: Vec<String>,
    ) -> Result<()> {
        let mut files = Vec::new();
        let mut renumber: Vec<Option<u32>> = vec![None; self.files.len()];
        for (i, p) in self.files.iter().enumerate() {
            if !chosen.contains(&(i as u32)) && staying.contains(p) {
                renumber[i] = Some(files.len() as u32);
                files.push(p.clone());
            }
        }
        let first_out = files.len();
        files.extend(outputs);
        let lost = || Error::fatal("the key index names a row that compaction did not keep");
        let moved = |loc: &Loc| -> Result<Loc> {
            if !chosen.contains(&loc.file) {
                let file = renumber
                    .get(loc.file as usize)
                    .copied()
                    .flatten()
                    .ok_or_else(lost)?;
                return Ok(Loc { file, pos: loc.pos });
            }
            let k = positions
                .get(&loc.file)
                .and_then(|p| p.binary_search(&loc.pos).ok())
                .ok_or_else(lost)? as u64;
            let segs = segments.get(&loc.file).ok_or_else(lost)?;
            let at = segs.partition_point(|s| s.k <= k);
            let seg = at.checked_sub(1).map(|i| segs[i]).ok_or_else(lost)?;
            Ok(Loc {
                file: (first_out + seg.out) as u32,
                pos: seg.pos + (k - seg.k),
            })
        };
        self.index.try_remap(|loc| moved(&loc))?;
        for loc in self.extra.values_mut().flatten() {
            *loc = moved(loc)?;
        }
        self.files = files;
        Ok(())
    }
}
