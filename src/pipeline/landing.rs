//! The snapshot phase, where copied rows land: the tables a snapshot copies, each chunk the
//! source yields written to data files of its table (the sink's writer), and each table
//! committed at the snapshot's LSN once all its chunks are (see the source's `CopyTarget`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arrow::array::RecordBatch;
use async_trait::async_trait;
use iceberg::spec::DataFile;
use iceberg::table::Table;

use super::chunks::{CopiedChunk, CopyProgress};
use super::state::StateFile;
use crate::catalog::LocalCatalog;
use crate::change::Lsn;
use crate::error::{Error, Result};
use crate::sink::iceberg::staged;
use crate::sink::iceberg::writer::TableWriter;
use crate::sink::iceberg::{commit, reshape::Reshape};
use crate::source::postgres::key_chunks::{chunk_key, copy_in_key_chunks, ChunkSeen, KeyRange};
use crate::source::postgres::schema::TableSchema;
use crate::source::postgres::snapshot::{copy_tables, ChunkWriter, CopyJob, CopyTarget};
use crate::task::AbortOnDrop;
use crate::telemetry::state::TableSnapshot;

/// A table to copy and the Iceberg table it lands in.
pub struct TableJob {
    pub schema: TableSchema,
    pub table: Table,
    pub arrow: arrow::datatypes::SchemaRef,
    /// The Iceberg table already holds rows (a table copied again): the copy replaces them
    /// in one snapshot instead of adding to them.
    pub replace: bool,
    /// The source's columns changed since the table was made: `table` is the table staged
    /// under its new shape, which becomes current with the copy's rows in one commit.
    pub reshape: Option<Reshape>,
}

impl TableJob {
    /// Commits `files` as the table's copy at `lsn`: appended to a new table, or replacing
    /// the rows (and, reshaped, the columns) of one copied again, in one snapshot.
    pub async fn land(
        &self,
        catalog: &LocalCatalog,
        files: Vec<DataFile>,
        lsn: Lsn,
        phase: &str,
        pipeline: &str,
    ) -> Result<Table> {
        match &self.reshape {
            Some(r) => {
                r.commit(catalog, &self.table, files, lsn, phase, pipeline)
                    .await
            }
            None => {
                commit::commit_files(
                    catalog,
                    &self.table,
                    files,
                    self.replace,
                    lsn,
                    phase,
                    pipeline,
                )
                .await
            }
        }
    }
}

/// The tables a snapshot copies, as the source's [`CopyTarget`]: each chunk written to data
/// files of its table, each table committed at the snapshot's LSN once all its chunks are.
struct Landing {
    jobs: Vec<TableJob>,
    catalog: LocalCatalog,
    lsn: Lsn,
    pipeline: String,
    file_size: u64,
    /// For a copy in key chunks: the pipeline state, where each chunk is recorded as it
    /// ends (its files listed in a manifest of its own), so that a copy cut short goes on.
    keep: Option<StateFile>,
}

#[async_trait]
impl CopyTarget for Landing {
    type Writer = TableWriter;

    async fn writer(&self, job: usize, prefix: String) -> Result<TableWriter> {
        let job = self.job(job)?;
        TableWriter::new(&job.table, prefix, self.file_size).await
    }

    async fn land(&self, job: usize, chunks: Vec<(Vec<DataFile>, u64)>) -> Result<()> {
        let table = self.job(job)?;
        let rows: u64 = chunks.iter().map(|(_, rows)| rows).sum();
        let files: Vec<DataFile> = chunks.into_iter().flat_map(|(f, _)| f).collect();
        let n_files = files.len();
        table
            .land(&self.catalog, files, self.lsn, "snapshot", &self.pipeline)
            .await?;
        tracing::info!(
            table = %table.schema.table,
            rows,
            files = n_files,
            lsn = %self.lsn,
            "snapshot committed"
        );
        Ok(())
    }

    fn keeps_chunks(&self) -> bool {
        self.keep.is_some()
    }

    async fn chunk_copied(
        &self,
        job: usize,
        seen: &ChunkSeen,
        done: &(Vec<DataFile>, u64),
    ) -> Result<()> {
        let Some(state_file) = &self.keep else {
            return Ok(());
        };
        let job = self.job(job)?;
        let key = chunk_key(&copy_job(job)).ok_or_else(|| {
            Error::fatal(format!(
                "table {} has no integer key to copy it in chunks by",
                job.schema.table
            ))
        })?;
        let (files, rows) = done;
        let manifest = if files.is_empty() {
            None
        } else {
            let name = format!("copy-{}", uuid::Uuid::now_v7().simple());
            Some(staged::write_manifest(&job.table, files, &name).await?)
        };
        let start = || CopyProgress {
            key,
            oid: job.schema.oid,
            spec: job.table.metadata().default_partition_spec_id(),
            chunks: Vec::new(),
        };
        let recorded = super::state::record_copied_chunk(
            state_file,
            &job.schema.table,
            start,
            CopiedChunk {
                seen: seen.clone(),
                rows: *rows,
                manifest,
            },
        )?;
        crate::sink::iceberg::durable::pause_point_counted(
            crate::sink::iceberg::durable::PAUSE_COPIED_CHUNKS,
            recorded,
        )
        .await;
        Ok(())
    }

    fn progress(&self, tables: Vec<crate::telemetry::state::TableSnapshot>) {
        crate::telemetry::state::snapshot_progress(&self.pipeline, tables);
    }
}

impl Landing {
    fn job(&self, job: usize) -> Result<&TableJob> {
        self.jobs
            .get(job)
            .ok_or_else(|| Error::fatal(format!("the snapshot has no table number {job}")))
    }
}

#[async_trait]
impl ChunkWriter for TableWriter {
    type Done = (Vec<DataFile>, u64);

    async fn write(&mut self, batch: RecordBatch) -> Result<()> {
        TableWriter::write(self, batch).await
    }

    async fn finish(self) -> Result<(Vec<DataFile>, u64)> {
        self.close().await
    }
}

/// Copies `todo` inside the exported snapshot `snapshot_name` and commits each table at
/// `lsn`.
pub(super) async fn copy_into(
    cfg: &crate::config::PostgresConfig,
    snapshot_name: &str,
    lsn: Lsn,
    todo: Vec<TableJob>,
    catalog: &LocalCatalog,
    pipeline: &str,
) -> Result<()> {
    let copies = todo.iter().map(copy_job).collect();
    let landing = landing(cfg, todo, catalog, lsn, pipeline, None);
    copy_tables(cfg, snapshot_name, copies, landing).await
}

/// Whether every table of `todo` can be copied in key chunks (an integer first key column).
pub(super) fn chunkable(todo: &[TableJob]) -> bool {
    todo.iter().all(|j| j.chunk_key().is_some())
}

impl TableJob {
    /// The column the table can be copied in key chunks by (see [`chunk_key`]).
    pub(super) fn chunk_key(&self) -> Option<String> {
        chunk_key(&copy_job(self))
    }
}

/// Where the copies of `todo` land: each table committed at `lsn`.
fn landing(
    cfg: &crate::config::PostgresConfig,
    todo: Vec<TableJob>,
    catalog: &LocalCatalog,
    lsn: Lsn,
    pipeline: &str,
    keep: Option<StateFile>,
) -> Arc<Landing> {
    Arc::new(Landing {
        jobs: todo,
        catalog: catalog.clone(),
        lsn,
        pipeline: pipeline.to_string(),
        file_size: cfg.parquet_target_file_size,
        keep,
    })
}

fn copy_job(j: &TableJob) -> CopyJob {
    CopyJob {
        schema: j.schema.clone(),
        arrow: j.arrow.clone(),
    }
}

/// The chunks a copy cut short made durable, read back from their manifests.
pub(super) struct Earlier {
    /// The copy's LSN, where the table lands.
    pub at: Lsn,
    /// Each chunk's snapshot, data files and rows.
    pub chunks: Vec<(ChunkSeen, Vec<DataFile>, u64)>,
    /// What the state recorded, kept until the copy lands.
    pub progress: CopyProgress,
}

impl Earlier {
    /// Reads the chunks `progress` records for `table`; an error when one of them can no
    /// longer be read (its manifest or a data file gone).
    pub(super) async fn read(table: &Table, at: Lsn, mut progress: CopyProgress) -> Result<Self> {
        // A chunk recorded by a copy task that was stopping while the next copy had started
        // may overlap one of that copy: the first recorded holds the keys, the other goes.
        let mut kept: Vec<CopiedChunk> = Vec::new();
        let mut dropped = Vec::new();
        for c in std::mem::take(&mut progress.chunks) {
            if kept.iter().any(|k| overlap(&k.seen, &c.seen)) {
                dropped.extend(c.manifest);
            } else {
                kept.push(c);
            }
        }
        progress.chunks = kept;
        staged::remove_manifests(table, dropped).await;
        let mut chunks = Vec::new();
        for c in &progress.chunks {
            let files = match &c.manifest {
                Some(m) => staged::read_manifest(table, m).await?,
                None => Vec::new(),
            };
            chunks.push((c.seen.clone(), files, c.rows));
        }
        Ok(Self {
            at,
            chunks,
            progress,
        })
    }

    /// The manifests of the chunks.
    pub(super) fn manifests(&self) -> Vec<String> {
        manifests_of(&self.progress)
    }

    /// Every file the chunks hold: their data files and their manifests.
    pub(super) fn files(&self) -> std::collections::HashSet<String> {
        self.chunks
            .iter()
            .flat_map(|(_, files, _)| files.iter().map(|f| f.file_path().to_string()))
            .chain(self.manifests())
            .collect()
    }
}

/// Whether two chunks share a key.
fn overlap(a: &ChunkSeen, b: &ChunkSeen) -> bool {
    let below = |hi: Option<i64>, lo: Option<i64>| matches!((hi, lo), (Some(h), Some(l)) if h <= l);
    !below(a.hi, b.lo) && !below(b.hi, a.lo)
}

fn manifests_of(progress: &CopyProgress) -> Vec<String> {
    progress
        .chunks
        .iter()
        .filter_map(|c| c.manifest.clone())
        .collect()
}

/// Where a copy in key chunks starts.
pub(super) enum ChunkStart {
    /// At the consistent point of a slot just created: the copy first waits until new
    /// snapshots see everything the slot's exported snapshot saw, then releases it.
    Exported(crate::source::postgres::slot::ExportedSlot),
    /// Going on with copies cut short, consistent with this LSN (their start had settled
    /// before their first chunk was recorded).
    Resumed(Lsn),
}

/// Copies `todo` in key chunks, each chunk in a short transaction of its own (no snapshot
/// is held for longer than one chunk), and commits each table at the start's LSN, a
/// position every chunk's snapshot is later than. `earlier` holds, per job, the chunks a
/// copy cut short already made durable: only the rest of the keys is copied. Each chunk is
/// recorded in the state as it ends; before a table lands, the state records what each chunk
/// saw, for the stream to apply to each key exactly what its chunk lacks (see
/// [`super::chunks`]).
pub(super) async fn copy_in_chunks(
    cfg: &crate::config::PostgresConfig,
    start: ChunkStart,
    todo: Vec<TableJob>,
    earlier: Vec<Option<Earlier>>,
    catalog: &LocalCatalog,
    pipeline: &str,
    state_file: &StateFile,
) -> Result<()> {
    // The slot's consistent point is where the table lands and the WAL is kept from; its
    // snapshot is needed only until every later snapshot sees what it saw.
    let lsn = match start {
        ChunkStart::Exported(exported) => {
            crate::source::postgres::key_chunks::settle(cfg, &exported.snapshot_name).await?;
            drop(exported.session);
            exported.consistent_point
        }
        ChunkStart::Resumed(lsn) => lsn,
    };
    let copies: Vec<CopyJob> = todo.iter().map(copy_job).collect();
    let landing = landing(cfg, todo, catalog, lsn, pipeline, Some(state_file.clone()));
    let mut earlier = earlier.into_iter();
    for (i, job) in copies.into_iter().enumerate() {
        let Some(key) = chunk_key(&job) else {
            return Err(Error::fatal(format!(
                "table {} has no integer key to copy it in chunks by",
                job.schema.table
            )));
        };
        let table = &landing.job(i)?.table;
        // The chunks a copy cut short left: their snapshots, files and rows.
        let mut files = Vec::new();
        let mut chunks = Vec::new();
        let mut manifests = Vec::new();
        let mut rows_before = 0;
        if let Some(e) = earlier.next().flatten() {
            manifests = e.manifests();
            for (seen, f, rows) in e.chunks {
                rows_before += rows;
                files.push((f, rows));
                chunks.push(seen);
            }
        }
        if !chunks.is_empty() {
            tracing::info!(table = %job.schema.table, chunks = chunks.len(), rows = rows_before, lsn = %lsn, "going on with a copy cut short, after the chunks it made durable");
        }
        let done: Vec<KeyRange> = chunks.iter().map(|c| (c.lo, c.hi)).collect();
        let job = Arc::new(job);
        let counter = Arc::new(AtomicU64::new(rows_before));
        let started = std::time::Instant::now();
        let ticker = AbortOnDrop(tokio::spawn(report_progress(
            Arc::clone(&landing),
            Arc::clone(&job),
            Arc::clone(&counter),
        )));
        let result = copy_in_key_chunks(
            cfg,
            Arc::clone(&job),
            i,
            &key,
            &done,
            Arc::clone(&landing),
            Arc::clone(&counter),
        )
        .await;
        drop(ticker);
        let (now, seen) = result?;
        chunks.extend(seen);
        chunks.sort_by_key(|c| c.lo);
        // Every chunk's snapshot was taken before this position: a transaction ending after
        // it was seen by none of them.
        let through = wal_position(cfg).await?;
        let rows_now = counter.load(Ordering::Relaxed).saturating_sub(rows_before);
        tracing::info!(table = %job.schema.table, chunks = chunks.len(), rows_now, through = %through, "copied in key chunks");
        super::state::record_chunks(
            state_file,
            &job.schema.table,
            super::chunks::ChunkFilter {
                through,
                key,
                chunks,
            },
        )?;
        files.extend(now);
        landing.land(i, files).await?;
        let mut last = figures(&job, &counter, true);
        last.rows_per_second = rows_now as f64 / started.elapsed().as_secs_f64().max(0.001);
        landing.progress(vec![last]);
        // The chunks' manifests listed files now in the table.
        let recorded = super::state::PipelineState::load(state_file)?
            .and_then(|s| s.table(&job.schema.table).and_then(|t| t.copied.clone()));
        manifests.extend(recorded.iter().flat_map(manifests_of));
        manifests.sort();
        manifests.dedup();
        staged::remove_manifests(table, manifests).await;
        crate::sink::iceberg::durable::pause_point(
            crate::sink::iceberg::durable::PAUSE_AFTER_CHUNKED_COPY,
        )
        .await;
    }
    Ok(())
}

/// The source's current WAL position (its replay position on a standby).
async fn wal_position(cfg: &crate::config::PostgresConfig) -> Result<Lsn> {
    let client = crate::source::postgres::connect::connect(cfg).await?;
    let text: String = client
        .query_one(
            "SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_insert_lsn() END)::text",
            &[],
        )
        .await
        .map_err(Error::from)
        .map_err(|e| Error::new(e.kind(), format!("reading the source's WAL position: {}", e.message())))?
        .try_get::<_, Option<String>>(0)
        .map_err(|e| Error::fatal(format!("reading the source's WAL position: {e}")))?
        .ok_or_else(|| Error::retryable("the source did not report its WAL position (a standby that has not replayed any WAL yet); retrying"))?;
    Lsn::parse(&text).map_err(Error::fatal)
}

fn figures(job: &CopyJob, counter: &AtomicU64, done: bool) -> TableSnapshot {
    TableSnapshot {
        table: job.schema.table.to_string(),
        rows_copied: counter.load(Ordering::Relaxed),
        rows_estimated: job.schema.row_estimate.max(0) as u64,
        rows_per_second: 0.0,
        eta_seconds: None,
        done,
    }
}

/// The copy's figures for `skipprd status` and the metrics, about twice a second.
async fn report_progress(landing: Arc<Landing>, job: Arc<CopyJob>, counter: Arc<AtomicU64>) {
    let started = std::time::Instant::now();
    // Rows a copy cut short had made durable count as copied, not toward the rate.
    let before = counter.load(Ordering::Relaxed);
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let mut f = figures(&job, &counter, false);
        let secs = started.elapsed().as_secs_f64();
        f.rows_per_second = f.rows_copied.saturating_sub(before) as f64 / secs.max(0.001);
        if f.rows_per_second > 0.0 && f.rows_estimated > f.rows_copied {
            f.eta_seconds = Some((f.rows_estimated - f.rows_copied) as f64 / f.rows_per_second);
        }
        landing.progress(vec![f]);
    }
}

#[cfg(test)]
mod tests {
    //! The pipeline's side of the `CopyTarget` seam, driven as the source drives it: chunks
    //! written on writers of their own, then the table landed once.

    use arrow::array::{Int64Array, StringArray};

    use super::*;

    fn batch(arrow: &arrow::datatypes::SchemaRef, ids: std::ops::Range<i64>) -> RecordBatch {
        let notes: Vec<String> = ids.clone().map(|i| format!("n{i}")).collect();
        RecordBatch::try_new(
            arrow.clone(),
            vec![
                Arc::new(Int64Array::from_iter_values(ids)),
                Arc::new(StringArray::from(notes)),
            ],
        )
        .expect("a batch of the table's schema")
    }

    #[tokio::test]
    async fn a_table_lands_once_with_every_chunk_at_the_snapshot_lsn() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let (catalog, schema, table) = crate::testing::items_table(dir.path()).await?;
        let arrow = crate::table::schema::arrow_schema(&table)?;
        let landing = Landing {
            jobs: vec![TableJob {
                schema,
                table,
                arrow: arrow.clone(),
                replace: false,
                reshape: None,
            }],
            catalog: catalog.clone(),
            lsn: Lsn(0x1234),
            pipeline: "app".into(),
            file_size: 1 << 20,
            keep: None,
        };
        // Two chunks, as two copy connections write them.
        let mut first = landing.writer(0, "snap-test-0000".into()).await?;
        let mut second = landing.writer(0, "snap-test-0001".into()).await?;
        first.write(batch(&arrow, 0..50)).await?;
        second.write(batch(&arrow, 50..80)).await?;
        first.write(batch(&arrow, 80..100)).await?;
        let chunks = vec![second.finish().await?, first.finish().await?];
        assert_eq!(chunks.iter().map(|(_, rows)| rows).sum::<u64>(), 100);
        landing.land(0, chunks).await?;
        let ident = landing.jobs[0].table.identifier().clone();
        let landed = catalog.load_current(&ident).await?;
        assert_eq!(
            crate::table::summary::committed_lsn(&landed),
            Some(Lsn(0x1234))
        );
        let snapshot = landed
            .metadata()
            .current_snapshot()
            .ok_or_else(|| Error::fatal("no snapshot"))?;
        assert_eq!(
            snapshot
                .summary()
                .additional_properties
                .get("total-records")
                .map(String::as_str),
            Some("100")
        );
        // A table the snapshot does not copy is refused, not guessed.
        let err = landing.land(7, Vec::new()).await.unwrap_err();
        assert!(err.to_string().contains("no table number 7"), "{err}");
        Ok(())
    }
}
