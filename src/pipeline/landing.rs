//! The snapshot phase, where copied rows land: the tables a snapshot copies, each chunk the
//! source yields written to data files of its table (the sink's writer), and each table
//! committed at the snapshot's LSN once all its chunks are (see the source's `CopyTarget`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arrow::array::RecordBatch;
use async_trait::async_trait;
use iceberg::spec::DataFile;
use iceberg::table::Table;

use crate::catalog::LocalCatalog;
use crate::change::Lsn;
use crate::error::{Error, Result};
use crate::sink::iceberg::writer::TableWriter;
use crate::sink::iceberg::{commit, reshape::Reshape};
use crate::source::postgres::key_chunks::{chunk_key, copy_in_key_chunks};
use crate::source::postgres::schema::TableSchema;
use crate::source::postgres::snapshot::{copy_tables, ChunkWriter, CopyJob, CopyTarget};
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
    let landing = landing(cfg, todo, catalog, lsn, pipeline);
    copy_tables(cfg, snapshot_name, copies, landing).await
}

/// Whether every table of `todo` can be copied in key chunks (an integer first key column).
pub(super) fn chunkable(todo: &[TableJob]) -> bool {
    todo.iter().all(|j| chunk_key(&copy_job(j)).is_some())
}

/// Where the copies of `todo` land: each table committed at `lsn`.
fn landing(
    cfg: &crate::config::PostgresConfig,
    todo: Vec<TableJob>,
    catalog: &LocalCatalog,
    lsn: Lsn,
    pipeline: &str,
) -> Arc<Landing> {
    Arc::new(Landing {
        jobs: todo,
        catalog: catalog.clone(),
        lsn,
        pipeline: pipeline.to_string(),
        file_size: cfg.parquet_target_file_size,
    })
}

fn copy_job(j: &TableJob) -> CopyJob {
    CopyJob {
        schema: j.schema.clone(),
        arrow: j.arrow.clone(),
    }
}

/// Copies `todo` in key chunks, each chunk in a short transaction of its own (no snapshot
/// is held for longer than one chunk), and commits each table at `lsn`, a position every
/// chunk's snapshot is later than. Before a table lands, the state records what each chunk
/// saw, for the stream to apply to each key exactly what its chunk lacks (see
/// [`super::chunks`]).
pub(super) async fn copy_in_chunks(
    cfg: &crate::config::PostgresConfig,
    exported: crate::source::postgres::slot::ExportedSlot,
    todo: Vec<TableJob>,
    catalog: &LocalCatalog,
    pipeline: &str,
    state_file: &crate::storage::state_file::StateFile,
) -> Result<()> {
    // The slot's consistent point is where the table lands and the WAL is kept from; its
    // snapshot is needed only until every later snapshot sees what it saw.
    let lsn = exported.consistent_point;
    crate::source::postgres::key_chunks::settle(cfg, &exported.snapshot_name).await?;
    drop(exported.session);
    let copies: Vec<CopyJob> = todo.iter().map(copy_job).collect();
    let landing = landing(cfg, todo, catalog, lsn, pipeline);
    for (i, job) in copies.into_iter().enumerate() {
        let Some(key) = chunk_key(&job) else {
            return Err(Error::fatal(format!(
                "table {} has no integer key to copy it in chunks by",
                job.schema.table
            )));
        };
        let job = Arc::new(job);
        let counter = Arc::new(AtomicU64::new(0));
        let ticker = AbortOnDrop(tokio::spawn(report_progress(
            Arc::clone(&landing),
            Arc::clone(&job),
            Arc::clone(&counter),
        )));
        let copied = copy_in_key_chunks(
            cfg,
            Arc::clone(&job),
            i,
            &key,
            Arc::clone(&landing),
            Arc::clone(&counter),
        )
        .await;
        drop(ticker);
        let (done, chunks) = copied?;
        // Every chunk's snapshot was taken before this position: a transaction ending after
        // it was seen by none of them.
        let through = wal_position(cfg).await?;
        tracing::info!(table = %job.schema.table, chunks = chunks.len(), through = %through, "copied in key chunks");
        super::state::record_chunks(
            state_file,
            &job.schema.table,
            super::chunks::ChunkFilter {
                through,
                key,
                chunks,
            },
        )?;
        landing.land(i, done).await?;
        landing.progress(vec![figures(&job, &counter, true)]);
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

/// Stops a task when dropped (the copy's progress ticker, however the copy ends).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The copy's figures for `skipprd status` and the metrics, about twice a second.
async fn report_progress(landing: Arc<Landing>, job: Arc<CopyJob>, counter: Arc<AtomicU64>) {
    let started = std::time::Instant::now();
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let mut f = figures(&job, &counter, false);
        let secs = started.elapsed().as_secs_f64();
        f.rows_per_second = f.rows_copied as f64 / secs.max(0.001);
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
    use crate::change::schema::Column;
    use crate::change::types::PgType;
    use crate::config::layout::Layout;

    fn column(name: &str, pg: PgType, pg_type_name: &str) -> Column {
        Column::for_test(name, pg, pg_type_name)
    }

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
        let catalog = LocalCatalog::open(dir.path()).await?;
        let namespace = catalog.ensure_namespace("app").await?;
        let schema = TableSchema::for_test(
            "public.items",
            vec![
                column("id", PgType::Int8, "bigint"),
                column("note", PgType::Text, "text"),
            ],
        );
        let table =
            crate::table::schema::create_or_load(&catalog, &namespace, &schema, &Layout::default())
                .await?;
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
