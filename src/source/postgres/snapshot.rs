//! The consistent snapshot: copies tables inside one exported Postgres snapshot, on several
//! connections at once (ctid ranges), decoding COPY rows into Arrow batches that it yields to
//! the pipeline's [`CopyTarget`]: the pipeline writes them (Parquet files) and commits each
//! table once all its chunks are written. The source never touches a table.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use futures::StreamExt;
use tokio::task::JoinSet;

use super::connect::connect;
use super::copy::CopyDecoder;
use super::schema::TableSchema;
use crate::config::{quote_ident, PostgresConfig};
use crate::error::{Context, Error, Result};
use crate::telemetry::state::TableSnapshot;

/// Blocks (8 KiB pages) a copy connection takes on at least: below this, splitting a table
/// costs more than it saves.
const MIN_BLOCKS_PER_CHUNK: i64 = 1024;

/// A table to copy: its source description and the Arrow schema its rows are decoded into.
pub struct CopyJob {
    pub schema: TableSchema,
    pub arrow: SchemaRef,
}

/// Where the copied rows go.
///
/// Contract: [`CopyTarget::writer`] is called once per chunk of table `job` (an index into
/// the jobs given to [`copy_tables`]), from the task that copies the chunk; that writer gets
/// the chunk's rows in order and [`ChunkWriter::finish`] makes them durable. Once every chunk
/// of a table is finished, [`CopyTarget::land`] gets what they returned, in the order they
/// finished, and makes the table's copy visible; an error from either stops the copy (the
/// table is not landed, so the copy is made again).
#[async_trait]
pub trait CopyTarget: Send + Sync + 'static {
    type Writer: ChunkWriter;

    async fn writer(&self, job: usize, prefix: String) -> Result<Self::Writer>;

    async fn land(
        &self,
        job: usize,
        chunks: Vec<<Self::Writer as ChunkWriter>::Done>,
    ) -> Result<()>;

    /// Whether a copy in key chunks finishes each chunk on a writer of its own and reports
    /// it to [`CopyTarget::chunk_copied`] as it ends (a target that records them can go on
    /// after a crash from the chunks it has), rather than sharing a writer among chunks.
    fn keeps_chunks(&self) -> bool {
        false
    }

    /// A chunk of a copy in key chunks has been copied, its writer finished with `done`
    /// (with [`CopyTarget::keeps_chunks`]). An error stops the copy.
    async fn chunk_copied(
        &self,
        _job: usize,
        _seen: &super::key_chunks::ChunkSeen,
        _done: &<Self::Writer as ChunkWriter>::Done,
    ) -> Result<()> {
        Ok(())
    }

    /// How far the copy is, one entry per job in the jobs' order: about twice a second while
    /// it runs, when a table lands, and once at the end (after the last tick). Called from
    /// the copy's own tasks, so it must return quickly (a small file write at most).
    fn progress(&self, _tables: Vec<TableSnapshot>) {}
}

/// Takes one chunk's rows (see [`CopyTarget`]).
#[async_trait]
pub trait ChunkWriter: Send + 'static {
    type Done: Send + 'static;

    async fn write(&mut self, batch: RecordBatch) -> Result<()>;

    async fn finish(self) -> Result<Self::Done>;
}

/// One ctid range of one table.
struct Chunk {
    job: usize,
    lower: Option<i64>,
    upper: Option<i64>,
}

fn chunks_for(job: usize, blocks: i64, parallelism: usize) -> Vec<Chunk> {
    let wanted = (blocks + MIN_BLOCKS_PER_CHUNK - 1) / MIN_BLOCKS_PER_CHUNK;
    let n = wanted.clamp(1, parallelism as i64);
    if n == 1 {
        return vec![Chunk {
            job,
            lower: None,
            upper: None,
        }];
    }
    let step = (blocks + n - 1) / n;
    (0..n)
        .map(|i| Chunk {
            job,
            lower: (i > 0).then_some(i * step),
            // The last range is open: the table may have grown since its size was read.
            upper: (i < n - 1).then_some((i + 1) * step),
        })
        .collect()
}

/// Copies `jobs` inside `snapshot_name` into `target`, which lands each table once all its
/// chunks are written.
pub async fn copy_tables<T: CopyTarget>(
    cfg: &PostgresConfig,
    snapshot_name: &str,
    jobs: Vec<CopyJob>,
    target: Arc<T>,
) -> Result<()> {
    if jobs.is_empty() {
        return Ok(());
    }
    let run_id = uuid::Uuid::now_v7().simple().to_string();
    let jobs: Vec<Arc<CopyJob>> = jobs.into_iter().map(Arc::new).collect();
    let mut pending: Vec<Chunk> = Vec::new();
    let mut remaining: HashMap<usize, usize> = HashMap::new();
    for (i, job) in jobs.iter().enumerate() {
        let chunks = chunks_for(i, job.schema.blocks, cfg.snapshot_parallelism);
        remaining.insert(i, chunks.len());
        pending.extend(chunks);
    }
    let counters: Vec<Arc<AtomicU64>> = jobs.iter().map(|_| Arc::new(AtomicU64::new(0))).collect();
    let report = {
        let target = Arc::clone(&target);
        Arc::new(move |tables: Vec<TableSnapshot>| target.progress(tables))
    };
    let progress = Progress::start(&jobs, &counters, report);

    let mut done: HashMap<usize, Vec<<T::Writer as ChunkWriter>::Done>> = HashMap::new();
    let mut running = JoinSet::new();
    let mut queue = pending.into_iter().enumerate();
    let mut result = Ok(());
    loop {
        while running.len() < cfg.snapshot_parallelism {
            let Some((n, chunk)) = queue.next() else {
                break;
            };
            let job = Arc::clone(&jobs[chunk.job]);
            let cfg = cfg.clone();
            let snapshot = snapshot_name.to_string();
            let counter = Arc::clone(&counters[chunk.job]);
            let prefix = format!("snap-{run_id}-{n:04}");
            let target = Arc::clone(&target);
            progress.started(chunk.job);
            running.spawn(async move {
                let out = match target.writer(chunk.job, prefix).await {
                    Ok(writer) => copy_chunk(&cfg, &snapshot, &job, &chunk, writer, counter).await,
                    Err(e) => Err(e),
                };
                (chunk.job, out)
            });
        }
        let Some(joined) = running.join_next().await else {
            break;
        };
        let (job_index, out) = match joined {
            Ok(v) => v,
            Err(e) => {
                result = Err(Error::fatal(format!("a snapshot copy task failed: {e}")));
                break;
            }
        };
        match out {
            Ok(written) => {
                done.entry(job_index).or_default().push(written);
                let left = remaining.entry(job_index).or_insert(1);
                *left -= 1;
                if *left == 0 {
                    let chunks = done.remove(&job_index).unwrap_or_default();
                    let rows = counters[job_index].load(Ordering::Relaxed);
                    if let Err(e) = target.land(job_index, chunks).await {
                        result = Err(e);
                        break;
                    }
                    progress.done(job_index, rows);
                }
            }
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    if result.is_err() {
        running.abort_all();
    }
    progress.finish().await;
    result
}

async fn copy_chunk<W: ChunkWriter>(
    cfg: &PostgresConfig,
    snapshot_name: &str,
    job: &CopyJob,
    chunk: &Chunk,
    mut writer: W,
    counter: Arc<AtomicU64>,
) -> Result<W::Done> {
    let table = &job.schema.table;
    let client = connect(cfg).await?;
    client
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .await
        .context("starting the snapshot transaction")?;
    client
        .batch_execute(&format!("SET TRANSACTION SNAPSHOT '{snapshot_name}'"))
        .await
        .with_context(|| {
            format!("importing snapshot {snapshot_name} to copy {table}; the snapshot ends when its exporting session does")
        })?;
    let mut conds = Vec::new();
    if let Some(l) = chunk.lower {
        conds.push(format!("ctid >= '({l},0)'::tid"));
    }
    if let Some(u) = chunk.upper {
        conds.push(format!("ctid < '({u},0)'::tid"));
    }
    copy_rows(&client, job, &conds, &mut writer, &counter).await?;
    client
        .batch_execute("COMMIT")
        .await
        .context("ending the snapshot transaction")?;
    writer.finish().await
}

/// Copies the rows of `job` that meet every condition of `conds` (in the transaction open on
/// `client`) into `writer`, counting them in `counter`.
pub(super) async fn copy_rows<W: ChunkWriter>(
    client: &tokio_postgres::Client,
    job: &CopyJob,
    conds: &[String],
    writer: &mut W,
    counter: &AtomicU64,
) -> Result<()> {
    let table = &job.schema.table;
    let cols = job
        .schema
        .columns
        .iter()
        .map(|c| quote_ident(&c.name))
        .collect::<Vec<_>>()
        .join(", ");
    let filter = if conds.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", conds.join(" AND "))
    };
    let sql = format!(
        "COPY (SELECT {cols} FROM {}{filter}) TO STDOUT",
        table.quoted()
    );
    let stream = client
        .copy_out(sql.as_str())
        .await
        .with_context(|| format!("starting to copy {table}"))?;
    futures::pin_mut!(stream);
    let mut decoder = CopyDecoder::new(table.clone(), &job.schema.columns, Arc::clone(&job.arrow));
    let mut batches = Vec::new();
    while let Some(data) = stream.next().await {
        let data = data.with_context(|| format!("copying {table}"))?;
        decoder.feed(&data, &mut batches)?;
        for b in batches.drain(..) {
            counter.fetch_add(b.num_rows() as u64, Ordering::Relaxed);
            writer.write(b).await?;
        }
    }
    if let Some(b) = decoder.finish()? {
        counter.fetch_add(b.num_rows() as u64, Ordering::Relaxed);
        writer.write(b).await?;
    }
    Ok(())
}

/// Per-table progress: a bar per table on a terminal, a log line every 5 s otherwise, and
/// the figures the pipeline reports (state file, metrics) about twice a second.
struct Progress {
    bars: Option<(indicatif::MultiProgress, Vec<indicatif::ProgressBar>)>,
    ticker: Option<tokio::task::JoinHandle<()>>,
    tracks: Arc<Tracks>,
}

/// What the ticker and the copy loop share: each table's name, estimate, counter, and
/// when its first chunk started and when it landed.
struct Tracks {
    tables: Vec<String>,
    estimates: Vec<u64>,
    counters: Vec<Arc<AtomicU64>>,
    times: std::sync::Mutex<Vec<(Option<Instant>, Option<Instant>)>>,
    report: Arc<dyn Fn(Vec<TableSnapshot>) + Send + Sync>,
}

impl Tracks {
    /// The figures of every table now.
    fn figures(&self) -> Vec<TableSnapshot> {
        let times = self.times.lock().unwrap_or_else(|e| e.into_inner());
        self.tables
            .iter()
            .enumerate()
            .map(|(i, table)| {
                let rows = self.counters[i].load(Ordering::Relaxed);
                let (started, landed) = times.get(i).copied().unwrap_or((None, None));
                let done = landed.is_some();
                // A landed table's rate is over its own copy, not until now.
                let secs = started.map_or(0.0, |t| {
                    landed
                        .unwrap_or_else(Instant::now)
                        .saturating_duration_since(t)
                        .as_secs_f64()
                });
                let rate = if secs > 0.0 { rows as f64 / secs } else { 0.0 };
                let estimate = self.estimates[i];
                let eta = (!done && rate > 0.0 && estimate > rows)
                    .then(|| (estimate - rows) as f64 / rate);
                TableSnapshot {
                    table: table.clone(),
                    rows_copied: rows,
                    rows_estimated: estimate,
                    rows_per_second: rate,
                    eta_seconds: eta,
                    done,
                }
            })
            .collect()
    }

    fn report(&self) {
        (self.report)(self.figures());
    }
}

impl Progress {
    fn start(
        jobs: &[Arc<CopyJob>],
        counters: &[Arc<AtomicU64>],
        report: Arc<dyn Fn(Vec<TableSnapshot>) + Send + Sync>,
    ) -> Self {
        use std::io::IsTerminal;
        let tracks = Arc::new(Tracks {
            tables: jobs.iter().map(|j| j.schema.table.to_string()).collect(),
            estimates: jobs
                .iter()
                .map(|j| j.schema.row_estimate.max(0) as u64)
                .collect(),
            counters: counters.to_vec(),
            times: std::sync::Mutex::new(vec![(None, None); jobs.len()]),
            report,
        });
        tracks.report();
        if std::io::stderr().is_terminal() {
            let multi = indicatif::MultiProgress::new();
            let style = indicatif::ProgressStyle::with_template(
                "{prefix:>24} {bar:30} {human_pos:>12}/{human_len} rows {per_sec:>14} eta {eta}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
            let bars: Vec<_> = tracks
                .tables
                .iter()
                .zip(&tracks.estimates)
                .map(|(t, e)| {
                    let b = multi.add(indicatif::ProgressBar::new((*e).max(1)));
                    b.set_style(style.clone());
                    b.set_prefix(t.clone());
                    b
                })
                .collect();
            let bars_for_tick = bars.clone();
            let ticking = Arc::clone(&tracks);
            let ticker = tokio::spawn(async move {
                let mut ticks = 0u64;
                loop {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    for (b, c) in bars_for_tick.iter().zip(&ticking.counters) {
                        let n = c.load(Ordering::Relaxed);
                        if n > b.length().unwrap_or(0) {
                            b.set_length(n);
                        }
                        b.set_position(n);
                    }
                    ticks += 1;
                    if ticks.is_multiple_of(3) {
                        ticking.report();
                    }
                }
            });
            Self {
                bars: Some((multi, bars)),
                ticker: Some(ticker),
                tracks,
            }
        } else {
            let ticking = Arc::clone(&tracks);
            let ticker = tokio::spawn(async move {
                let mut ticks = 0u64;
                loop {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    ticks += 1;
                    let figures = ticking.figures();
                    if ticks.is_multiple_of(10) {
                        for t in figures.iter().filter(|t| !t.done) {
                            tracing::info!(
                                table = %t.table,
                                rows = t.rows_copied,
                                estimate = t.rows_estimated,
                                rows_per_sec = t.rows_per_second as u64,
                                eta_secs = t.eta_seconds.map(|e| e.round() as u64),
                                "snapshot progress"
                            );
                        }
                    }
                    (ticking.report)(figures);
                }
            });
            Self {
                bars: None,
                ticker: Some(ticker),
                tracks,
            }
        }
    }

    /// A chunk of table `job` starts: its rate counts from its first chunk.
    fn started(&self, job: usize) {
        let mut times = self.tracks.times.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = times.get_mut(job) {
            t.0.get_or_insert_with(Instant::now);
        }
    }

    fn done(&self, job: usize, rows: u64) {
        {
            let mut times = self.tracks.times.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(t) = times.get_mut(job) {
                t.1 = Some(Instant::now());
            }
        }
        self.tracks.report();
        if let Some((_, bars)) = &self.bars {
            if let Some(b) = bars.get(job) {
                b.set_length(rows);
                b.set_position(rows);
                b.finish();
            }
        }
    }

    /// Stops the ticker, and only then reports the last figures: a tick still running
    /// could otherwise publish older ones after them.
    async fn finish(mut self) {
        if let Some(t) = self.ticker.take() {
            t.abort();
            let _ = t.await;
        }
        self.tracks.report();
        if let Some((multi, _)) = self.bars.take() {
            let _ = multi.clear();
        }
    }
}

impl Drop for Progress {
    /// A copy dropped before [`Progress::finish`] (its task cancelled) stops its ticker too.
    fn drop(&mut self) {
        if let Some(t) = self.ticker.take() {
            t.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_figures_rate_and_time_left() {
        let reported = Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = Arc::clone(&reported);
        let tracks = Tracks {
            tables: vec![
                "public.big".into(),
                "public.queued".into(),
                "public.stale".into(),
            ],
            estimates: vec![1_000, 500, 10],
            counters: vec![
                Arc::new(AtomicU64::new(200)),
                Arc::new(AtomicU64::new(0)),
                Arc::new(AtomicU64::new(40)),
            ],
            times: std::sync::Mutex::new(vec![
                (Instant::now().checked_sub(Duration::from_secs(2)), None),
                (None, None),
                (Instant::now().checked_sub(Duration::from_secs(1)), None),
            ]),
            report: Arc::new(move |t: Vec<TableSnapshot>| {
                sink.lock().unwrap_or_else(|e| e.into_inner()).push(t)
            }),
        };
        let f = tracks.figures();
        // 200 rows in about 2 s: about 100 rows/s, about 8 s for the 800 left.
        assert!((90.0..=101.0).contains(&f[0].rows_per_second), "{f:?}");
        let eta = f[0].eta_seconds.unwrap_or_default();
        assert!((7.9..=9.0).contains(&eta), "{f:?}");
        // Not started: no rate, no time left to tell.
        assert_eq!((f[1].rows_per_second, f[1].eta_seconds), (0.0, None));
        // Past a stale estimate: no time left to tell either.
        assert_eq!(f[2].eta_seconds, None);
        // Landed 1 s after it started: its rate stays over its own copy.
        tracks.times.lock().unwrap_or_else(|e| e.into_inner())[0].1 =
            Instant::now().checked_sub(Duration::from_secs(1));
        std::thread::sleep(Duration::from_millis(50));
        tracks.report();
        let last = reported.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let done = last.and_then(|t| t.into_iter().next()).unwrap_or_default();
        assert!(done.done && done.eta_seconds.is_none() && done.rows_copied == 200);
        assert!((190.0..=205.0).contains(&done.rows_per_second), "{done:?}");
    }

    #[test]
    fn chunking() {
        assert_eq!(chunks_for(0, 10, 4).len(), 1);
        let c = chunks_for(0, 10_000, 4);
        assert_eq!(c.len(), 4);
        assert_eq!(c[0].lower, None);
        assert_eq!(c[1].lower, Some(2500));
        assert_eq!(c[3].upper, None);
    }
}
