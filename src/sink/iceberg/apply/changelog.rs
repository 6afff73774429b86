//! Sink, the changelog table beside a table (see `crate::table::changelog`): each change the
//! table applies is staged as a row of its changelog too, with values an update left
//! unchanged (TOAST) filled from the table's previous version of the row; the rows are
//! written as files (early, beside a spill) and appended in one snapshot of the same commit
//! round and LSN, before the table's own commit. A changelog that begins after its table
//! holds rows starts with one `insert` per live row at the table's LSN.

use std::sync::Arc;

use arrow::array::RecordBatch;
use futures::StreamExt;
use iceberg::spec::{DataContentType, DataFile};
use iceberg::table::Table;
use parquet::arrow::ParquetRecordBatchStreamBuilder;

use super::{Loc, PendingRow, TableSink};
use crate::catalog::LocalCatalog;
use crate::change::{Datum, Lsn};
use crate::error::{Context, Error, Result};
use crate::sink::iceberg::writer::TableWriter;
use crate::sink::iceberg::{
    evolve, maintenance, rowdelta, PG_EPOCH_MICROS, PROP_COLUMNS, SUMMARY_COMMIT_TIME,
};
use crate::table::changelog::{self, ChangeOp};

/// Rows of the table read at a time when a changelog starts from the table's live rows.
const SEED_ROWS: usize = 64 * 1024;

/// One change, staged for the changelog.
struct Entry {
    op: ChangeOp,
    row: PendingRow,
    lsn: Lsn,
    /// Source commit time, Postgres epoch.
    time: i64,
    seq: i64,
}

/// The changelog of one table, and what is staged for its next commit.
pub struct Changelog {
    pub table: Table,
    /// The LSN its last commit covers.
    pub lsn: Lsn,
    entries: Vec<Entry>,
    bytes: u64,
    /// Files written for the next commit (entries spilled with the table's rows).
    staged: Vec<DataFile>,
    /// The transaction being applied: its commit LSN, and the order of its next change.
    txn_lsn: Lsn,
    seq: i64,
}

impl TableSink {
    /// Follows the table's changes into `table`, its changelog. A changelog without a commit
    /// starts with the table's live rows, as inserts at the table's LSN.
    pub async fn attach_changelog(
        &mut self,
        table: Table,
        catalog: &LocalCatalog,
        pipeline: &str,
    ) -> Result<()> {
        let lsn = crate::table::summary::committed_lsn(&table);
        self.changelog = Some(Changelog {
            table,
            lsn: lsn.unwrap_or_default(),
            entries: Vec::new(),
            bytes: 0,
            staged: Vec::new(),
            txn_lsn: Lsn::default(),
            seq: 0,
        });
        match lsn {
            None if crate::table::summary::committed_lsn(&self.table).is_some() => {
                self.ensure_index().await?;
                self.seed_changelog(catalog, pipeline).await?;
            }
            Some(logged) if logged < self.lsn => {
                if let Some(copy) = super::copied::copied_since(&self.table, logged)? {
                    self.log_copy(copy, catalog, pipeline).await?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Records in the changelog the difference a copy of the table made (see
    /// [`TableSink::copy_difference`]), as its next snapshot, at the copy's LSN.
    async fn log_copy(
        &mut self,
        copy: super::copied::Copied,
        catalog: &LocalCatalog,
        pipeline: &str,
    ) -> Result<()> {
        let Some(c) = &self.changelog else {
            return Ok(());
        };
        let log = c.table.clone();
        let (table_cols, log_cols) = (
            evolve::recorded_columns(&self.table).unwrap_or_default(),
            evolve::recorded_columns(&log).unwrap_or_default(),
        );
        let same = table_cols.len() == log_cols.len()
            && table_cols.iter().zip(&log_cols).all(|(a, b)| {
                a.name == b.name && a.oid == b.oid && a.typmod == b.typmod && a.field == b.field
            })
            && super::copied::same_fields(&self.table, copy.before);
        if !same {
            return Err(Error::config(format!(
                "Iceberg table {} was copied again with columns its changelog {} does not have (the source's columns changed while nothing followed them), so the difference the copy made cannot be recorded there: drop the changelog table (in your catalog) and it starts over from the table's rows",
                self.table.identifier(),
                log.identifier()
            )));
        }
        let lsn = self.lsn;
        let time_micros = self.commit_time_micros();
        let before = crate::table::summary::at_snapshot(&self.table, copy.before).map_err(|e| {
            Error::fatal(format!(
                "reading Iceberg table {} at snapshot {}: {e}",
                self.table.identifier(),
                copy.before
            ))
        })?;
        crate::sink::iceberg::durable::pause_point(
            crate::sink::iceberg::durable::PAUSE_BEFORE_COPY_DIFFERENCE,
        )
        .await;
        let started = std::time::Instant::now();
        let (files, rows) = self
            .copy_difference(before, &log, lsn, time_micros - PG_EPOCH_MICROS)
            .await?;
        let table = append_copy(catalog, &log, files, lsn, pipeline, time_micros).await?;
        if let Some(c) = &mut self.changelog {
            c.table = table;
            c.lsn = lsn;
        }
        tracing::info!(table = %self.table.identifier(), rows, lsn = %lsn, elapsed_ms = started.elapsed().as_millis() as u64, "changelog took the difference the table's new copy made");
        Ok(())
    }

    /// The source commit time (microseconds since 1970) of the table's current snapshot:
    /// recorded in its summary, else the snapshot's own time.
    fn commit_time_micros(&self) -> i64 {
        let current = self.table.metadata().current_snapshot();
        current
            .and_then(|s| s.summary().additional_properties.get(SUMMARY_COMMIT_TIME))
            .and_then(|t| t.parse::<i64>().ok())
            .or_else(|| current.map(|s| s.timestamp_ms() * 1000))
            .unwrap_or_default()
    }

    /// Whether a change of the transaction ending at `end_lsn` goes to the changelog.
    pub(super) fn logs(&self, end_lsn: Lsn) -> bool {
        self.changelog.as_ref().is_some_and(|c| end_lsn > c.lsn)
    }

    /// The LSN through which both the table and its changelog hold every change.
    pub fn committed(&self) -> Lsn {
        match &self.changelog {
            Some(c) => self.lsn.min(c.lsn),
            None => self.lsn,
        }
    }

    /// A transaction starts: its commit LSN, and its changes counted from 0.
    pub(super) fn changelog_txn(&mut self, commit_lsn: Lsn) {
        if let Some(c) = &mut self.changelog {
            c.txn_lsn = commit_lsn;
            c.seq = 0;
        }
    }

    /// Stages one change row: `values` in the table's column order; values an update left
    /// unchanged are read from `previous` when written.
    pub(super) fn log_change(&mut self, op: ChangeOp, values: Vec<Datum>, previous: Option<Loc>) {
        let time = self.txn_time.unwrap_or_default();
        // Change rows are never looked up by key.
        let key = super::Key::default();
        let Some(c) = &mut self.changelog else {
            return;
        };
        c.bytes += 96 + super::values_bytes(&values);
        c.entries.push(Entry {
            op,
            row: PendingRow {
                key,
                values,
                previous,
            },
            lsn: c.txn_lsn,
            time,
            seq: c.seq,
        });
        c.seq += 1;
    }

    /// Stages a `delete` row for every live row of the table (a TRUNCATE): read from the
    /// table's files when written, or taken from the rows pending in memory.
    pub(super) fn log_truncate(&mut self) -> Result<()> {
        if self.changelog.is_none() {
            return Ok(());
        }
        let width = self.names.len();
        let mut locs = Vec::new();
        self.for_each_loc(|l| locs.push(l))?;
        locs.sort_unstable_by_key(|l| (l.file, l.pos));
        for loc in locs {
            self.log_change(ChangeOp::Delete, vec![Datum::Unchanged; width], Some(loc));
        }
        let pending: Vec<PendingRow> = self.pending.rows().cloned().collect();
        for row in pending {
            self.log_change(ChangeOp::Delete, row.values, row.previous);
        }
        Ok(())
    }

    /// Memory the staged change rows hold.
    pub(super) fn changelog_bytes(&self) -> u64 {
        self.changelog.as_ref().map_or(0, |c| c.bytes)
    }

    /// Widens staged rows to the table's current width (after columns were added).
    pub(super) fn changelog_widen(&mut self) {
        let width = self.names.len();
        if let Some(c) = &mut self.changelog {
            for e in &mut c.entries {
                e.row.values.resize(width, Datum::Null);
            }
        }
    }

    /// Gives the changelog the schema change the table just took (the same decisions from
    /// the same recorded source columns: added, widened, renamed and sibling columns).
    pub(super) async fn changelog_follow(
        &mut self,
        relation: &crate::change::Relation,
        catalog: &LocalCatalog,
    ) -> Result<()> {
        let pk = self.primary_key();
        let Some(c) = &mut self.changelog else {
            return Ok(());
        };
        if let Some(evo) = evolve::plan(&self.source, &c.table, &pk, relation)? {
            let mut props = c.table.metadata().properties().clone();
            props.insert(
                PROP_COLUMNS.to_string(),
                serde_json::to_string(&evo.columns)?,
            );
            c.table = rowdelta::evolve_schema(catalog, &c.table, evo.schema, props).await?;
        }
        Ok(())
    }

    /// Tags the changelog's current snapshot with the cut `tag` and removes the cut tags
    /// `drop` (see `TableSink::tag_cut`).
    pub(super) async fn tag_changelog_cut(
        &mut self,
        catalog: &LocalCatalog,
        tag: Option<&str>,
        drop: &[String],
    ) -> Result<()> {
        let Some(c) = &mut self.changelog else {
            return Ok(());
        };
        if c.table.metadata().current_snapshot().is_none() {
            return Ok(());
        }
        c.table = maintenance::set_cut_tags(catalog, &c.table, tag, drop).await?;
        Ok(())
    }

    /// Writes the staged change rows to files for the next changelog commit.
    pub(super) async fn spill_changelog(&mut self) -> Result<()> {
        let Some(c) = &mut self.changelog else {
            return Ok(());
        };
        let entries = std::mem::take(&mut c.entries);
        c.bytes = 0;
        if entries.is_empty() {
            return Ok(());
        }
        let batch = self.changelog_batch(&entries).await?;
        if let Some(c) = &mut self.changelog {
            let files = write_changelog_batch(&c.table, batch).await?;
            c.staged.extend(files);
        }
        Ok(())
    }

    /// Starts the changelog's part of a commit round at `lsn`: the staged change rows are
    /// made into a batch here (values an update left unchanged are read through the table's
    /// index); on another thread, beside the table's own work, they are written to a file and
    /// the changelog's snapshot of it (and of any files spilled before) is prepared with the
    /// summary `props`. The snapshot is made current with the table's (see `commit`).
    pub(super) async fn start_changelog(
        &mut self,
        lsn: Lsn,
        rest: bool,
        props: &std::collections::HashMap<String, String>,
    ) -> Result<Option<tokio::task::JoinHandle<Result<rowdelta::Prepared>>>> {
        if !self.logs(lsn) {
            return Ok(None);
        }
        let Some(c) = &mut self.changelog else {
            return Ok(None);
        };
        let entries = std::mem::take(&mut c.entries);
        c.bytes = 0;
        let batch = if entries.is_empty() {
            None
        } else {
            Some(self.changelog_batch(&entries).await?)
        };
        let Some(c) = &self.changelog else {
            return Ok(None);
        };
        let (table, mut files, props) = (c.table.clone(), c.staged.clone(), props.clone());
        Ok(Some(tokio::spawn(async move {
            if let Some(batch) = batch {
                files.extend(write_changelog_batch(&table, batch).await?);
            }
            prepare_append(rest, &table, files, props).await
        })))
    }

    /// The changelog's prepared snapshot, once its task is done.
    pub(super) async fn changelog_prepared(
        prepared: Option<tokio::task::JoinHandle<Result<rowdelta::Prepared>>>,
    ) -> Result<Option<rowdelta::Prepared>> {
        match prepared {
            Some(p) => joined(p.await).map(Some),
            None => Ok(None),
        }
    }

    /// The changelog's snapshot at `lsn` is current (`table`): its staged files are in it.
    pub(super) fn changelog_committed(&mut self, table: Table, lsn: Lsn) {
        if let Some(c) = &mut self.changelog {
            c.table = table;
            c.lsn = lsn;
            c.staged.clear();
        }
    }

    /// The change rows `entries` as rows of the changelog.
    async fn changelog_batch(&self, entries: &[Entry]) -> Result<RecordBatch> {
        let Some(c) = &self.changelog else {
            return Err(Error::fatal(
                "a changelog batch was made for a table without one",
            ));
        };
        let rows: Vec<PendingRow> = entries.iter().map(|e| e.row.clone()).collect();
        let columns = self.build_columns(&rows).await?;
        let nullable: Vec<arrow::datatypes::FieldRef> = self
            .arrow
            .fields()
            .iter()
            .map(|f| Arc::new(f.as_ref().clone().with_nullable(true)))
            .collect();
        let values =
            RecordBatch::try_new(Arc::new(arrow::datatypes::Schema::new(nullable)), columns)?;
        changelog::batch(
            &values,
            &crate::table::schema::arrow_schema(&c.table)?,
            entries.iter().map(|e| (e.op, e.lsn, e.time, e.seq)),
        )
    }

    /// The changelog's first rows: every live row of the table, as an insert at the table's
    /// LSN and commit time, committed as the changelog's first snapshot.
    async fn seed_changelog(&mut self, catalog: &LocalCatalog, pipeline: &str) -> Result<()> {
        let lsn = self.lsn;
        let time_micros = self.commit_time_micros();
        let mut locs = Vec::new();
        self.for_each_loc(|l| locs.push(l))?;
        locs.sort_unstable_by_key(|l| (l.file, l.pos));
        let Some(c) = &self.changelog else {
            return Ok(());
        };
        let target = crate::table::schema::arrow_schema(&c.table)?;
        let name = format!("changelog-{}", uuid::Uuid::now_v7().simple());
        let mut w = TableWriter::new(&c.table, name, u64::MAX / 4).await?;
        let mut seq = 0i64;
        for chunk in locs.chunks(SEED_ROWS) {
            let values = self.read_rows(chunk).await?;
            let n = values.num_rows() as i64;
            // The rows are the table as of its LSN: they carry that LSN.
            let meta =
                (seq..seq + n).map(|s| (ChangeOp::Insert, lsn, time_micros - PG_EPOCH_MICROS, s));
            w.write(changelog::batch(&values, &target, meta)?).await?;
            seq += n;
        }
        let (files, _) = w.close().await?;
        let Some(c) = &mut self.changelog else {
            return Ok(());
        };
        c.table = append_copy(catalog, &c.table, files, lsn, pipeline, time_micros).await?;
        c.lsn = lsn;
        tracing::info!(table = %c.table.identifier(), rows = seq, lsn = %lsn, "changelog started from the table's rows");
        Ok(())
    }
}

impl TableSink {
    /// The changelog's maintenance, beside the table's: small files merged (a `replace`
    /// snapshot of the same rows, which streaming readers skip by design: the history stays
    /// append-only), snapshots expired, unreferenced files removed with the table's.
    pub(super) async fn maintain_changelog(
        &mut self,
        catalog: &LocalCatalog,
        pipeline: &str,
        cleanup: bool,
    ) -> Result<()> {
        let settings = self.maintenance.clone();
        let Some(c) = &mut self.changelog else {
            return Ok(());
        };
        let (live, _) = maintenance::live_files(&c.table).await?;
        let small = settings.target_file_size / 4 * 3;
        let smalls: Vec<&maintenance::LiveFile> = live
            .iter()
            .filter(|f| {
                f.file.content_type() == DataContentType::Data
                    && f.file.file_size_in_bytes() < small
            })
            .collect();
        if smalls.len() >= settings.compaction_min_files.max(2) {
            let started = std::time::Instant::now();
            let target = crate::table::schema::arrow_schema(&c.table)?;
            let name = format!("changelog-merged-{}", uuid::Uuid::now_v7().simple());
            let mut w = TableWriter::new(&c.table, name, settings.target_file_size).await?;
            // Oldest first: the merged files keep the history in the order it was appended.
            let mut inputs = smalls.clone();
            inputs.sort_by_key(|f| f.seq);
            for f in &inputs {
                let path = f.file.file_path();
                let reader =
                    super::read::file_reader(&c.table, path, f.file.file_size_in_bytes()).await?;
                let mut stream = ParquetRecordBatchStreamBuilder::new(reader)
                    .await
                    .with_context(|| format!("reading the footer of {path}"))?
                    .build()
                    .with_context(|| format!("reading {path}"))?;
                while let Some(batch) = stream.next().await {
                    let batch = batch.with_context(|| format!("reading {path}"))?;
                    w.write(super::read::by_field_id(&batch, &target)?).await?;
                }
            }
            let (added, _) = w.close().await?;
            let removed = inputs
                .iter()
                .map(|f| f.file.file_path().to_string())
                .collect();
            let (files_in, files_out) = (inputs.len(), added.len());
            c.table = maintenance::commit_rewrite(
                catalog,
                &c.table,
                live,
                maintenance::Rewrite {
                    removed,
                    remove_all_deletes: false,
                    added,
                    added_deletes: Vec::new(),
                    specs: rowdelta::Specs::new(),
                },
                pipeline,
            )
            .await?;
            tracing::info!(table = %c.table.identifier(), files_in, files_out, elapsed_ms = started.elapsed().as_millis() as u64, "changelog files merged");
        }
        let now_ms = chrono::Utc::now().timestamp_millis();
        let expiring = maintenance::expiring(&c.table, &settings, now_ms)?;
        if !expiring.is_empty() {
            c.table = maintenance::expire(catalog, &c.table, &expiring).await?;
            tracing::debug!(table = %c.table.identifier(), snapshots = expiring.len(), "snapshots expired");
        }
        if cleanup {
            let removed = maintenance::remove_orphans(&c.table, &settings).await?;
            if removed > 0 {
                tracing::info!(table = %c.table.identifier(), files = removed, "unreferenced files removed");
            }
        }
        Ok(())
    }
}

/// Appends `files` to the changelog `log` as rows taken from the table's copy at `lsn`
/// (source commit time `time_micros`, since 1970): a `snapshot`-phase append.
async fn append_copy(
    catalog: &LocalCatalog,
    log: &Table,
    files: Vec<DataFile>,
    lsn: Lsn,
    pipeline: &str,
    time_micros: i64,
) -> Result<Table> {
    let mut props = crate::table::summary::summary(lsn, "snapshot", pipeline);
    props.insert(SUMMARY_COMMIT_TIME.to_string(), time_micros.to_string());
    crate::storage::lease::ensure_held(pipeline)?;
    let prepared = prepare_append(catalog.rest().is_some(), log, files, props).await?;
    rowdelta::finish(catalog, prepared).await
}

/// Prepares the snapshot that appends `files` to the changelog `log`, with the summary
/// `props` (a changelog is only appended to; see [`rowdelta::prepare`]).
async fn prepare_append(
    rest: bool,
    log: &Table,
    files: Vec<DataFile>,
    props: std::collections::HashMap<String, String>,
) -> Result<rowdelta::Prepared> {
    let files = rowdelta::NewFiles::data(files, false, props);
    rowdelta::prepare(rest, log, files, &rowdelta::Specs::new()).await
}

/// Writes change rows as data files of the changelog `table` (not committed).
async fn write_changelog_batch(table: &Table, batch: RecordBatch) -> Result<Vec<DataFile>> {
    let name = format!("changelog-{}", uuid::Uuid::now_v7().simple());
    let mut w = TableWriter::new(table, name, u64::MAX / 4).await?;
    w.write(batch).await?;
    Ok(w.close().await?.0)
}

/// The result of a task of the commit round, or its failure as an error.
fn joined<T>(r: std::result::Result<Result<T>, tokio::task::JoinError>) -> Result<T> {
    r.map_err(|e| Error::fatal(format!("a changelog task of the commit round failed: {e}")))?
}
