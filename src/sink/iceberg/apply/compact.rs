//! Sink, table maintenance after commits: compaction guided by the key index (small files
//! and files with many deleted rows are rewritten with only their live rows, every delete
//! file is dropped or merged into one), snapshot expiry and orphan cleanup. The index is
//! moved to the rewritten files only once the rewrite is committed.

mod merge;
mod positions;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, VecDeque};

use arrow::array::RecordBatch;
use arrow::row::{OwnedRow, RowConverter};
use iceberg::spec::DataContentType;

use self::merge::{Input, Output};
use self::positions::LivePositions;
use super::{file_numbers, Loc, TableSink};
use crate::catalog::LocalCatalog;
use crate::config::MaintenanceSettings;
use crate::error::{Context, Error, Result};
use crate::sink::iceberg::maintenance::{self, LiveFile, Rewrite};
use crate::sink::iceberg::rowdelta;
use crate::table::partition::{self, FilePartition, WriteOrder};
use crate::telemetry::metrics;

/// A data file with at least this share of its rows deleted is rewritten.
const DELETED_SHARE: f64 = 0.2;
/// Row groups of rewritten files are cut at this much encoded data, so that compaction holds
/// about this much of the output in memory whatever the width of the rows.
const ROW_GROUP_BYTES: usize = 4 * 1024 * 1024;
/// The batches read from all the files a compaction merges hold about this many decoded
/// bytes together (at least 64 KiB a file).
const MERGE_BYTES: usize = 16 * 1024 * 1024;
/// A file written under an earlier sort order is sorted this many decoded bytes at a time.
const SORT_PIECE_BYTES: usize = 64 * 1024 * 1024;
/// Rows handed to the Parquet writer at once, at most...
const OUTPUT_ROWS: usize = 8192;
/// ... and about this many decoded bytes of them, however wide the rows (buffered slices keep
/// the batches they were cut from alive, so the buffer costs a multiple of this).
const OUTPUT_BYTES: usize = 256 * 1024;

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
            // What is known of the files is read from the manifests again when needed.
            self.parts_loaded = false;
        }
        Ok(())
    }

    /// The consistent cuts the table holds, oldest first (see [`crate::table::cuts`]).
    pub fn cuts(&self) -> Result<Vec<crate::table::cuts::TableCut>> {
        crate::table::cuts::cuts_of(self.table.metadata())
    }

    /// Tags the current snapshot with the cut `tag` and removes the cut tags `drop`, in one
    /// metadata commit (nothing staged: the current snapshot holds every committed change).
    pub async fn tag_cut(
        &mut self,
        tag: Option<&str>,
        drop: &[String],
        catalog: &LocalCatalog,
        pipeline: &str,
    ) -> Result<()> {
        if self.has_pending() || !self.staged.is_empty() || !self.staged_deletes.is_empty() {
            return Err(Error::fatal(format!(
                "a cut of Iceberg table {} was asked for with changes staged",
                self.table.identifier()
            )));
        }
        crate::storage::lease::ensure_held(pipeline)?;
        self.table = maintenance::set_cut_tags(catalog, &self.table, tag, drop).await?;
        // The changelog is committed with the table, through the same LSN: its current
        // snapshot belongs to the cut too.
        self.tag_changelog_cut(catalog, tag, drop).await
    }

    async fn maintain_now(&mut self, catalog: &LocalCatalog, pipeline: &str) -> Result<()> {
        crate::storage::lease::ensure_held(pipeline)?;
        let table = self.table.identifier().name().to_string();
        let labels = [("pipeline", pipeline), ("table", table.as_str())];
        // Compaction is planned on the key index: a table whose index this run has not
        // needed yet (no change arrived) is left as it is until one does.
        let plan = if self.index_ready {
            self.plan().await?
        } else {
            None
        };
        if let Some(plan) = plan {
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
        let expiring = maintenance::expiring(&self.table, &self.maintenance, now_ms)?;
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
        let cleanup = self
            .last_cleanup
            .is_none_or(|t| t.elapsed() >= self.maintenance.cleanup_every());
        self.maintain_changelog(catalog, pipeline, cleanup).await?;
        if cleanup {
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

    /// The order rows are written in: the table's sort order (`sort_by`), then its primary
    /// key (see [`WriteOrder`]).
    pub(super) fn write_order(&self) -> WriteOrder {
        let key: &[usize] = if self.keyed { self.keys.columns() } else { &[] };
        WriteOrder::of(self.table.metadata(), &self.names, key)
    }

    /// A converter whose rows compare in the write order (numbers by value, text by bytes,
    /// as Parquet's statistics compare them). None for a table without an order, or a
    /// column type the row format cannot order.
    pub(super) fn key_converter(&self) -> Result<Option<RowConverter>> {
        self.write_order().converter(self.arrow.as_ref())
    }

    /// The order of `batch`'s rows in the write order, or None when they are in order
    /// already (or the table has no order).
    pub(super) fn key_sort(&self, batch: &RecordBatch) -> Result<Option<Vec<u32>>> {
        let order = self.write_order();
        let Some(converter) = order.converter(self.arrow.as_ref())? else {
            return Ok(None);
        };
        let keys = order.rows(&converter, batch)?;
        if (1..keys.num_rows()).all(|i| keys.row(i - 1) <= keys.row(i)) {
            return Ok(None);
        }
        let mut sorted: Vec<u32> = (0..keys.num_rows() as u32).collect();
        sorted.sort_unstable_by(|a, b| keys.row(*a as usize).cmp(&keys.row(*b as usize)));
        Ok(Some(sorted))
    }

    /// Rows of each file (by number) that the index holds live.
    fn live_rows(&self) -> Result<Vec<u64>> {
        let mut live = vec![0u64; self.files.len()];
        self.for_each_loc(|loc| {
            if let Some(n) = live.get_mut(loc.file as usize) {
                *n += 1;
            }
        })?;
        Ok(live)
    }

    /// Calls `f` with the location of every live committed row.
    pub(super) fn for_each_loc(&self, mut f: impl FnMut(Loc)) -> Result<()> {
        self.index.for_each_loc(&mut f)?;
        self.extra.values().flatten().copied().for_each(f);
        Ok(())
    }

    /// Decides whether a compaction is due and which data files it rewrites: the small
    /// ones and those with many deleted rows.
    async fn plan(&self) -> Result<Option<Plan>> {
        let (live, manifests) = maintenance::live_files(&self.table).await?;
        if live.is_empty() {
            return Ok(None);
        }
        let numbers = file_numbers(&self.files);
        let live_rows = self.live_rows()?;
        let small = self.maintenance.target_file_size / 4 * 3;
        let (mut smalls, mut heavy, mut delete_files) = (0usize, 0usize, 0usize);
        let current_spec = self.table.metadata().default_partition_spec_id();
        let mut old_spec = 0usize;
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
            if f.spec_id != current_spec {
                // Written under an earlier spec: rewritten into the current one.
                old_spec += 1;
                chosen.push((no, f.clone()));
            } else if f.file.file_size_in_bytes() < small {
                smalls += 1;
                chosen.push((no, f.clone()));
            } else if deleted_share >= DELETED_SHARE {
                heavy += 1;
                chosen.push((no, f.clone()));
            }
        }
        let min = self.maintenance.compaction_min_files;
        let due = smalls >= min
            || delete_files >= min
            || heavy > 0
            || old_spec > 0
            || manifests >= 4 * min;
        Ok(due.then_some(Plan { chosen, live }))
    }

    /// Rewrites the planned files with their live rows, merges the deletes that still apply
    /// to other files into one delete file, commits, then moves the index to the new files.
    async fn compact(&mut self, plan: Plan, catalog: &LocalCatalog, pipeline: &str) -> Result<()> {
        let started = Instant::now();
        let chosen_nos: HashSet<u32> = plan.chosen.iter().map(|(no, _)| *no).collect();
        // Live positions of each rewritten file, in file order (gathered by file number: the
        // index is walked once, row by row).
        let mut by_file: Vec<Option<LivePositions>> = (0..self.files.len()).map(|_| None).collect();
        for no in &chosen_nos {
            if let Some(slot) = by_file.get_mut(*no as usize) {
                *slot = Some(LivePositions::default());
            }
        }
        self.for_each_loc(|loc| {
            if let Some(Some(v)) = by_file.get_mut(loc.file as usize) {
                v.insert(loc.pos);
            }
        })?;
        let mut positions: HashMap<u32, LivePositions> = HashMap::new();
        for (no, v) in by_file.into_iter().enumerate() {
            if let Some(mut v) = v {
                v.seal();
                positions.insert(no as u32, v);
            }
        }
        let (bytes, rows) = plan.chosen.iter().fold((0u64, 0u64), |(b, r), (_, f)| {
            (b + f.file.file_size_in_bytes(), r + f.file.record_count())
        });
        let per_row = (bytes / rows.max(1)).max(1);
        let rows_per_file = (self.maintenance.target_file_size / per_row).max(1);

        let prefix = format!("compact-{}", uuid::Uuid::now_v7().simple());
        // The rewritten files are merged by key, so that the output is in key order (a lookup
        // then reads one page of one row group); the files written since the last compaction
        // are each in key order already (see `write_live`). A file is read only once the merge
        // reaches the smallest key its statistics allow, so files of disjoint key ranges (the
        // parts of one large transaction, say) are read one after the other, not all at once.
        let order = self.key_converter()?;
        let batch_bytes = (MERGE_BYTES / plan.chosen.len().max(1)).clamp(64 * 1024, 1024 * 1024);
        let mut inputs = Vec::new();
        for (no, f) in &plan.chosen {
            let keep = std::mem::take(
                positions
                    .get_mut(no)
                    .ok_or_else(|| Error::fatal("compaction lost track of a file it rewrites"))?,
            );
            if !keep.is_empty() {
                inputs.push(Input::open(self, *no, f, keep, batch_bytes, order.as_ref()).await?);
            }
        }
        let widest = inputs.iter().map(|i| i.row_bytes).max().unwrap_or(1);
        let mut out = Output::new(
            self,
            prefix.clone(),
            rows_per_file,
            (OUTPUT_BYTES / widest.max(1)).clamp(64, OUTPUT_ROWS),
        )?;
        // Most files read at the same time (each holds a batch and a row group's column chunks).
        let mut max_open = 1usize;
        // Files are merged a partition at a time (the partition they were written under):
        // only that partition's outputs are open, and files of one partition of the current
        // spec are merged with each other only.
        let mut groups: Vec<(FilePartition, Vec<Input>)> = Vec::new();
        for input in inputs {
            let part = (input.spec_id, input.partition.clone());
            match groups.iter_mut().find(|(p, _)| *p == part) {
                Some((_, g)) => g.push(input),
                None => groups.push((part, vec![input])),
            }
        }
        let mut done: Vec<Input> = Vec::new();
        for (_, inputs) in groups {
            // Files written under an earlier sort order are sorted a piece at a time (each
            // piece its own files); the others are merged.
            let (mut inputs, unordered): (Vec<Input>, Vec<Input>) = inputs
                .into_iter()
                .partition(|i| i.ordered || order.is_none());
            for mut input in unordered {
                self.sort_pieces(&mut input, &mut out).await?;
                done.push(input);
            }
            match &order {
                // Without a primary key there is no order to keep: the files are concatenated.
                None => {
                    for input in inputs.iter_mut() {
                        while input.advance(self, None).await? {
                            if let Some(batch) = input.batch.take() {
                                let n = batch.num_rows();
                                out.put(self, input.no, input.written, batch).await?;
                                input.written += n as u64;
                            }
                        }
                    }
                }
                Some(order) => {
                    // Files not read yet, by lower bound (files without one first).
                    let mut waiting: Vec<usize> = (0..inputs.len()).collect();
                    waiting.sort_by(|a, b| match (&inputs[*a].lower, &inputs[*b].lower) {
                        (None, None) => Ordering::Equal,
                        (None, Some(_)) => Ordering::Less,
                        (Some(_), None) => Ordering::Greater,
                        (Some(x), Some(y)) => x.cmp(y),
                    });
                    let mut waiting = VecDeque::from(waiting);
                    let mut heap: BinaryHeap<Reverse<(OwnedRow, usize)>> = BinaryHeap::new();
                    let mut open = 0usize;
                    loop {
                        // Start reading every file that may hold a key at or below the smallest
                        // key in hand.
                        while let Some(&j) = waiting.front() {
                            let due = match (&inputs[j].lower, heap.peek()) {
                                (None, _) | (_, None) => true,
                                (Some(lower), Some(Reverse((top, _)))) => lower <= top,
                            };
                            if !due {
                                break;
                            }
                            waiting.pop_front();
                            if inputs[j].advance(self, Some(order)).await? {
                                if let Some(key) = inputs[j].key() {
                                    heap.push(Reverse((key, j)));
                                    open += 1;
                                    max_open = max_open.max(open);
                                }
                            }
                        }
                        let Some(Reverse((_, i))) = heap.pop() else {
                            break;
                        };
                        // The run of this file's rows up to the next file's smallest key, or the
                        // lower bound of the next file not read yet.
                        let open_next = heap.peek().map(|Reverse((k, _))| k.clone());
                        let waiting_next = waiting.front().and_then(|j| inputs[*j].lower.clone());
                        let next = match (open_next, waiting_next) {
                            (Some(a), Some(b)) => Some(a.min(b)),
                            (a, b) => a.or(b),
                        };
                        let input = &mut inputs[i];
                        let Some(batch) = input.batch.clone() else {
                            continue;
                        };
                        let end = match (&next, input.keys.as_ref()) {
                            (Some(next), Some(keys)) => {
                                let mut end = input.at + 1;
                                while end < batch.num_rows() && keys.row(end) <= next.row() {
                                    end += 1;
                                }
                                end
                            }
                            _ => batch.num_rows(),
                        };
                        let n = end - input.at;
                        out.put(self, input.no, input.written, batch.slice(input.at, n))
                            .await?;
                        input.written += n as u64;
                        input.at = end;
                        if input.at == batch.num_rows() && !input.advance(self, Some(order)).await?
                        {
                            open = open.saturating_sub(1);
                            continue;
                        }
                        if let Some(key) = input.key() {
                            heap.push(Reverse((key, i)));
                        }
                    }
                }
            }
            out.finish().await?;
            done.extend(inputs);
        }
        let inputs = done;
        for input in &inputs {
            input.finished()?;
        }
        let (outputs, segments) = out.close(self).await?;
        // The live positions of each rewritten file again, for moving the index.
        for input in inputs {
            positions.insert(input.no, input.keep);
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
        let mut delete_specs = rowdelta::Specs::new();
        if !delete_paths.is_empty() {
            let mut deleted = super::read::Deleted::default();
            self.read_deletes(&delete_paths, &mut deleted).await?;
            let mut still: Vec<(Arc<str>, i64)> = Vec::new();
            for (path, positions) in deleted.into_sorted() {
                if staying.contains(path.as_ref()) {
                    still.extend(positions.into_iter().map(|p| (Arc::clone(&path), p as i64)));
                }
            }
            if !still.is_empty() {
                if partition::never_partitioned(self.table.metadata()) {
                    added_deletes.push(
                        rowdelta::write_position_deletes(&self.table, still, &prefix, None).await?,
                    );
                } else {
                    // One delete file per partition of the data files they delete from.
                    let current = self.table.metadata().default_partition_spec_id();
                    type Deletes = Vec<(Arc<str>, i64)>;
                    let mut by_part: Vec<(FilePartition, Deletes)> = Vec::new();
                    for (path, pos) in still {
                        let part = self.partition_of(&path).await?;
                        match by_part.iter_mut().find(|(p, _)| *p == part) {
                            Some((_, v)) => v.push((path, pos)),
                            None => by_part.push((part, vec![(path, pos)])),
                        }
                    }
                    for (n, (part, deletes)) in by_part.into_iter().enumerate() {
                        let file = rowdelta::write_position_deletes(
                            &self.table,
                            deletes,
                            &format!("{prefix}-{n}"),
                            Some(&part),
                        )
                        .await?;
                        if part.0 != current {
                            delete_specs.insert(file.file_path().to_string(), part.0);
                        }
                        added_deletes.push(file);
                    }
                }
            }
        }
        let (n_in, n_out, deletes_in) = (plan.chosen.len(), outputs.len(), delete_paths.len());
        let out_paths: Vec<String> = outputs.iter().map(|f| f.file_path().to_string()).collect();
        let current = self.table.metadata().default_partition_spec_id();
        for f in &outputs {
            self.parts
                .insert(f.file_path(), current, f.partition().clone());
        }
        // The rewritten files leave the table (and what is known of them).
        for (_, f) in &plan.chosen {
            self.parts.remove(f.file.file_path());
        }
        self.table = maintenance::commit_rewrite(
            catalog,
            &self.table,
            plan.live,
            Rewrite {
                removed,
                remove_all_deletes: true,
                added: outputs,
                added_deletes,
                specs: delete_specs,
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
            files_read_at_once = max_open,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "compacted"
        );
        Ok(())
    }

    /// Writes the live rows of a file that is not in the table's current order, sorted a
    /// piece of about [`SORT_PIECE_BYTES`] at a time; each piece goes to files of its own.
    async fn sort_pieces(&self, input: &mut Input, out: &mut Output) -> Result<()> {
        let mut piece: Vec<RecordBatch> = Vec::new();
        let mut bytes = 0usize;
        loop {
            let more = input.advance(self, None).await?;
            if let Some(batch) = input.batch.take() {
                bytes += batch.get_array_memory_size();
                piece.push(batch);
            }
            if (!more || bytes >= SORT_PIECE_BYTES) && !piece.is_empty() {
                let batches = std::mem::take(&mut piece);
                bytes = 0;
                let all = arrow::compute::concat_batches(&batches[0].schema(), &batches)?;
                drop(batches);
                let first = input.written;
                let n = all.num_rows() as u64;
                let order: Vec<u32> = match self.key_sort(&all)? {
                    Some(order) => order,
                    None => (0..n as u32).collect(),
                };
                let ks: Vec<u64> = order.iter().map(|i| first + *i as u64).collect();
                let sorted = arrow::compute::take_record_batch(
                    &all,
                    &arrow::array::UInt32Array::from(order),
                )?;
                drop(all);
                out.put_each(self, input.no, &ks, sorted).await?;
                out.finish().await?;
                input.written += n;
            }
            if !more {
                return Ok(());
            }
        }
    }

    /// Points the index at the files after a compaction: rows of rewritten files at their
    /// new places, rows of other files at their renumbered files.
    fn move_index(
        &mut self,
        chosen: &HashSet<u32>,
        positions: &HashMap<u32, LivePositions>,
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
        // Per file number, for the walk over every row of the index: a rewritten file's
        // live positions as ranks, and its output segments.
        let none = LivePositions::default();
        let mut rewritten: Vec<Option<(&LivePositions, &[Segment])>> =
            (0..self.files.len()).map(|_| None).collect();
        for no in chosen {
            if let Some(slot) = rewritten.get_mut(*no as usize) {
                let ranks = positions.get(no).unwrap_or(&none);
                let segs = segments.get(no).map_or(&[][..], Vec::as_slice);
                *slot = Some((ranks, segs));
            }
        }
        let lost = || Error::fatal("the key index names a row that compaction did not keep");
        let moved = |loc: &Loc| -> Result<Loc> {
            let Some(Some((ranks, segs))) = rewritten.get(loc.file as usize) else {
                let file = renumber
                    .get(loc.file as usize)
                    .copied()
                    .flatten()
                    .ok_or_else(lost)?;
                return Ok(Loc { file, pos: loc.pos });
            };
            let k = ranks.rank(loc.pos).ok_or_else(lost)?;
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
