//! The change half of a pipeline: streams the source into the change log (durable, then
//! acknowledged), and commits the log to the table sinks in batches, per table exactly once;
//! the log is truncated only through what every table has committed. The steps run through
//! the seams of `seams`, so the unit tests drive this very code with in-memory doubles.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use iceberg::NamespaceIdent;
use tokio::sync::watch;

use super::checks::check_source;
use super::seams::{ChangeLog, ChangeSource, IcebergTable, TableSink, Until};
use super::shutdown::{bounded, AbortOnDrop};
use crate::catalog::LocalCatalog;
use crate::change::{Change, Lsn, Relation};
use crate::config::{PipelineConfig, TableRef};
use crate::error::{Error, ErrorKind, Result};
use crate::wal::items::items_of;
use crate::wal::{Item, Op, Record};

/// Changes held in memory before a commit is forced, whatever the interval.
const COMMIT_MAX_CHANGES: u64 = 500_000;
/// Approximate bytes of pending rows before a commit is forced (wide rows hit this first).
const COMMIT_MAX_BYTES: u64 = 256 * 1024 * 1024;
/// Changes applied between checks of all tables' staged memory against the budget.
const BUDGET_CHECK_EVERY: u32 = 1024;

/// The destination side of every table of a pipeline.
pub struct Sinks<T: TableSink> {
    tables: Vec<T>,
    by_name: HashMap<TableRef, usize>,
    /// Relation id -> (table, latest description, whether the table has taken it yet).
    rel: HashMap<u32, (usize, Relation, bool)>,
    append_only: Vec<TableRef>,
    /// End LSN of the last log transaction applied (duplicates at or below it are skipped).
    applied_through: Lsn,
    /// The pipeline's state file, where each table's watermark is kept.
    state_file: crate::storage::state_file::StateFile,
    /// Memory staged changes may hold before they are spilled to files.
    budget: u64,
    /// Changes applied since the budget of all tables together was last checked.
    since_check: u32,
    /// The pipeline whose rounds the metrics and the state file record (see [`Sinks::named`]).
    pipeline: Option<String>,
    /// When the next consistent cut is due (see [`Sinks::cutting`]).
    cuts: Option<super::cuts::CutClock>,
    /// The log is kept after this LSN whatever the tables hold (see [`Sinks::holding`]).
    hold: Option<Lsn>,
    /// Per table (in `tables`' order): for a table copied in key chunks, the WAL
    /// transactions each chunk already holds (see [`Sinks::filtering`]).
    filters: Vec<Option<super::chunks::ChunkFilter>>,
}

impl<T: TableSink> Sinks<T> {
    /// Records each commit round under `pipeline` (metrics, `skipprd status`).
    pub fn named(mut self, pipeline: &str) -> Self {
        self.pipeline = Some(pipeline.to_string());
        self
    }

    /// Takes consistent cuts after the commit rounds (see [`super::cuts`]).
    pub fn cutting(mut self, settings: Option<crate::table::cuts::CutSettings>) -> Self {
        self.cuts = settings.map(super::cuts::CutClock::new);
        self
    }

    /// Keeps the log after `hold`, for a table being copied beside the stream: its changes
    /// after its copy's LSN must still be in the log when it joins.
    pub fn holding(mut self, hold: Option<Lsn>) -> Self {
        self.hold = hold;
        self
    }

    /// Applies to each table copied in key chunks only the WAL transactions its chunks lack
    /// (see [`super::chunks`]).
    pub fn filtering(mut self, mut filters: HashMap<TableRef, super::chunks::ChunkFilter>) -> Self {
        self.filters = self
            .tables
            .iter()
            .map(|t| filters.remove(t.source()))
            .collect();
        self
    }

    /// Saves what makes the next start fast (each table's key index), once a run ended with
    /// everything committed.
    pub fn keep_indexes(&mut self) {
        for t in &mut self.tables {
            t.keep_index();
        }
    }

    /// The pipeline's tables; those in `append_only` refuse updates and deletes. Staged
    /// changes are spilled to files beyond `budget` bytes.
    pub fn new(
        tables: Vec<T>,
        append_only: Vec<TableRef>,
        state_file: crate::storage::state_file::StateFile,
        budget: u64,
    ) -> Self {
        let by_name = tables
            .iter()
            .enumerate()
            .map(|(i, t)| (t.source().clone(), i))
            .collect();
        let applied_through = tables
            .iter()
            .map(|t| t.committed())
            .min()
            .unwrap_or_default();
        Self {
            tables,
            by_name,
            rel: HashMap::new(),
            append_only,
            applied_through,
            state_file,
            budget,
            since_check: 0,
            pipeline: None,
            cuts: None,
            hold: None,
            filters: Vec::new(),
        }
    }

    /// Each table and the LSN through which it holds all its changes, idle stretches
    /// included.
    pub fn watermarks(&self) -> Vec<(TableRef, Lsn)> {
        self.tables
            .iter()
            .map(|t| (t.source().clone(), t.covered()))
            .collect()
    }

    /// The LSN below which every table has committed all its changes (and no table being
    /// copied beside the stream still needs the log: see [`Sinks::holding`]).
    pub fn covered(&self) -> Lsn {
        let tables = self
            .tables
            .iter()
            .map(|t| t.covered())
            .min()
            .unwrap_or_default();
        match self.hold {
            Some(h) => tables.min(h),
            None => tables,
        }
    }

    fn pending_changes(&self) -> u64 {
        self.tables.iter().map(|t| t.pending_changes()).sum()
    }

    fn pending_bytes(&self) -> u64 {
        self.tables.iter().map(|t| t.pending_bytes()).sum()
    }

    /// Applies WAL records in order (see [`Sinks::apply_items`]).
    pub async fn apply(&mut self, records: Vec<Record>) -> Result<()> {
        self.apply_items(items_of(records).map(Ok)).await
    }

    /// Applies the items of WAL segments in order. A relation description is taken by its
    /// table only when a change that follows it is applied, so replaying a segment never
    /// re-applies a schema the table has already moved past. A table whose staged changes
    /// reach the memory budget spills them (see [`TableSink::spill`]), so a transaction of
    /// any size is applied in bounded memory.
    pub async fn apply_items(
        &mut self,
        items: impl Iterator<Item = Result<Item>> + Send,
    ) -> Result<()> {
        // The transaction being applied: its end LSN, xid, and whether it was applied before.
        let mut txn: Option<(Lsn, u32, bool)> = None;
        for item in items {
            match item? {
                Item::Relation(r) => self.note_description(r),
                Item::Begin(t) => {
                    if txn.is_some() {
                        return Err(Error::fatal(format!(
                            "the WAL holds transaction {} inside another one; run `skipprd sync --resnapshot`",
                            t.xid
                        )));
                    }
                    txn = Some((t.end_lsn, t.xid, t.end_lsn <= self.applied_through));
                    for sink in &mut self.tables {
                        sink.begin_txn(t.commit_lsn, t.commit_time_micros);
                    }
                }
                Item::Change(c) => {
                    let Some((end_lsn, xid, skipped)) = txn else {
                        return Err(Error::fatal(
                            "the WAL holds a change outside any transaction; run `skipprd sync --resnapshot`",
                        ));
                    };
                    // A transaction already applied still carries the descriptions the
                    // later transactions of its segment are read with.
                    if skipped && c.op != Op::Relation {
                        continue;
                    }
                    self.apply_change(c, end_lsn, xid).await?;
                }
                Item::End => {
                    let Some((end_lsn, _, skipped)) = txn.take() else {
                        return Err(Error::fatal(
                            "the WAL ends a transaction it never began; run `skipprd sync --resnapshot`",
                        ));
                    };
                    if skipped {
                        continue;
                    }
                    for sink in &mut self.tables {
                        sink.advance(end_lsn);
                    }
                    self.applied_through = end_lsn;
                }
            }
        }
        if let Some((_, xid, _)) = txn {
            return Err(Error::fatal(format!(
                "a WAL segment ends inside transaction {xid}; run `skipprd sync --resnapshot`"
            )));
        }
        Ok(())
    }

    /// Records the description the next changes of a relation are read with (when it is
    /// one of this pipeline's tables); its table takes it at the first change that follows.
    fn note_description(&mut self, r: Relation) {
        let name = TableRef {
            schema: r.namespace.clone(),
            name: r.name.clone(),
        };
        if let Some(&i) = self.by_name.get(&name) {
            self.rel.insert(r.id, (i, r, false));
        }
    }

    /// Applies one change of the transaction `xid` ending at `end_lsn`.
    async fn apply_change(&mut self, c: Change, end_lsn: Lsn, xid: u32) -> Result<()> {
        if c.op == Op::Relation {
            if let Some(r) = c.relation {
                self.note_description(r);
            }
            return Ok(());
        }
        // Only tables of this pipeline have a description here (the WAL refuses a change
        // without one when it is read).
        let Some((i, _, taken)) = self.rel.get(&c.rel) else {
            return Ok(());
        };
        let (i, taken) = (*i, *taken);
        if end_lsn <= self.tables[i].committed() {
            return Ok(());
        }
        if !taken {
            // The description in the WAL is complete: the source is not asked.
            if let Some(rel) = self.rel.get(&c.rel).map(|x| x.1.clone()) {
                self.tables[i].describe(&rel).await?;
            }
            if let Some(entry) = self.rel.get_mut(&c.rel) {
                entry.2 = true;
            }
        }
        // A table copied in key chunks takes only what the chunk of each key lacks.
        let c = match (self.filters.get(i), self.rel.get(&c.rel)) {
            (Some(Some(filter)), Some((_, rel, _))) => match filter.admit(c, rel, xid, end_lsn)? {
                Some(c) => c,
                None => return Ok(()),
            },
            _ => c,
        };
        let sink = &mut self.tables[i];
        if matches!(c.op, Op::Update | Op::Delete) && self.append_only.contains(sink.source()) {
            return Err(Error::unrepresentable(format!(
                "table {} is marked append_only, but an {} arrived (transaction {xid}); give the table a primary key or REPLICA IDENTITY FULL and remove it from `append_only`, then run `skipprd sync --resnapshot`",
                sink.source(),
                if c.op == Op::Update { "UPDATE" } else { "DELETE" },
            )));
        }
        sink.apply(&c, end_lsn)?;
        self.keep_within_budget(i).await
    }

    /// Spills staged changes to files when they reach the memory budget: the table just
    /// changed when it alone does, and, checked every so often, the largest tables until
    /// all of them together hold at most half the budget.
    async fn keep_within_budget(&mut self, changed: usize) -> Result<()> {
        if self.tables[changed].pending_bytes() >= self.budget {
            self.tables[changed].spill().await?;
        }
        self.since_check += 1;
        if self.since_check < BUDGET_CHECK_EVERY {
            return Ok(());
        }
        self.since_check = 0;
        let mut total = self.pending_bytes();
        if total < self.budget {
            return Ok(());
        }
        let mut by_size: Vec<usize> = (0..self.tables.len()).collect();
        by_size.sort_by_key(|&i| std::cmp::Reverse(self.tables[i].pending_bytes()));
        for i in by_size {
            if total <= self.budget / 2 {
                break;
            }
            total = total.saturating_sub(self.tables[i].pending_bytes());
            self.tables[i].spill().await?;
        }
        Ok(())
    }

    /// Commits every table in one round: with a REST catalog that offers multi-table
    /// commits, all of them in one atomic catalog request (see [`crate::catalog::Round`]).
    pub async fn commit(&mut self) -> Result<()> {
        let started = std::time::Instant::now();
        let pending = self
            .tables
            .iter()
            .filter(|t| t.pending_changes() > 0)
            .count();
        let round = crate::catalog::Round::default();
        round
            .run(async {
                for t in &mut self.tables {
                    t.commit().await?;
                }
                Ok::<(), crate::error::Error>(())
            })
            .await?;
        let staged = started.elapsed();
        let in_one = round.finish().await?;
        if pending > 0 {
            if let Some(p) = &self.pipeline {
                crate::telemetry::state::round_done(p, started.elapsed().as_secs_f64(), pending);
            }
            tracing::debug!(
                tables = pending,
                in_one_request = in_one,
                round_ms = started.elapsed().as_secs_f64() * 1000.0,
                catalog_ms = (started.elapsed() - staged).as_secs_f64() * 1000.0,
                "commit round"
            );
        }
        Ok(())
    }

    /// Takes a consistent cut when one is due and every table is committed through one LSN
    /// (see [`super::cuts::cut_if_due`]); called right after a commit round.
    pub async fn cut(&mut self) -> Result<Option<super::cuts::Cut>> {
        let Some(clock) = &mut self.cuts else {
            return Ok(None);
        };
        let pipeline = self.pipeline.as_deref().unwrap_or_default();
        let now_ms = chrono::Utc::now().timestamp_millis();
        super::cuts::cut_if_due(&mut self.tables, clock, pipeline, now_ms).await
    }

    /// Runs each table's due maintenance (see [`TableSink::maintain`]).
    pub async fn maintain(&mut self) -> Result<()> {
        for t in &mut self.tables {
            t.maintain().await?;
        }
        Ok(())
    }
}

/// Applies every log segment not yet applied, commits, and removes what every table now
/// holds.
pub async fn apply_log<L: ChangeLog, T: TableSink>(log: &L, sinks: &mut Sinks<T>) -> Result<()> {
    apply_segments(log, sinks).await?;
    sinks.commit().await?;
    // The watermarks are recorded before the log that backs them goes, and only what every
    // table has durably committed goes (the commits fsynced their files).
    let covered = sinks.covered();
    super::state::record_commit(&sinks.state_file, &sinks.watermarks(), covered)?;
    crate::sink::iceberg::durable::pause_point(
        crate::sink::iceberg::durable::PAUSE_BEFORE_WAL_REMOVAL,
    )
    .await;
    let removed = log.remove_through(covered)?;
    if removed > 0 {
        tracing::debug!(
            segments = removed,
            "WAL segments committed to Iceberg and removed"
        );
    }
    // The round left every table committed through what the log held: a consistent cut,
    // when one is due, tags their snapshots now, before maintenance adds any.
    sinks.cut().await?;
    // Maintenance comes after the log is truncated: it never holds back acknowledgements.
    sinks.maintain().await
}

/// Applies the log's segments not yet applied, committing only when the pending changes
/// reach the limits of one commit.
async fn apply_segments<L: ChangeLog, T: TableSink>(log: &L, sinks: &mut Sinks<T>) -> Result<()> {
    for seg in log.segments()? {
        if seg.last <= sinks.applied_through {
            continue;
        }
        sinks.apply_items(log.items(&seg)?).await?;
        if sinks.pending_changes() >= COMMIT_MAX_CHANGES
            || sinks.pending_bytes() >= COMMIT_MAX_BYTES
        {
            sinks.commit().await?;
        }
    }
    Ok(())
}

/// `sync --once`'s applier: applies each segment as soon as the stream has made it durable,
/// on a task of its own, so that decoding the stream and applying it use both cores. Ends
/// at a segment boundary when `done` fires (the stream ended, or failed) and returns the
/// tables. It commits only where applying after the stream would (at the limits of one
/// commit, after the same segments), so the outcome, a failure included, is the same.
async fn apply_as_it_lands<L: ChangeLog, T: TableSink>(
    log: L,
    mut sinks: Sinks<T>,
    mut durable: watch::Receiver<Lsn>,
    mut done: tokio::sync::oneshot::Receiver<()>,
) -> Result<Sinks<T>> {
    loop {
        tokio::select! {
            _ = &mut done => return Ok(sinks),
            changed = durable.changed() => {
                if changed.is_err() {
                    return Ok(sinks);
                }
            }
        }
        apply_segments(&log, &mut sinks).await?;
    }
}

/// The tables a CDC run commits to, loaded afresh at its start (and after an apply that
/// failed, since a failed apply leaves staged changes behind), and the check that the
/// source still sends every table's changes.
#[async_trait]
pub trait Tables: Send + Sync {
    type Sink: TableSink;
    async fn load(&self) -> Result<Sinks<Self::Sink>>;
    /// Fails when a table was dropped at the source or left the publication.
    async fn check_source(&self) -> Result<()>;
}

/// A pipeline's Iceberg tables.
pub struct IcebergTables<'a> {
    pub catalog: &'a LocalCatalog,
    pub namespace: &'a NamespaceIdent,
    pub p: &'a PipelineConfig,
    /// Keeps the log after this LSN (a table copied beside the stream: see [`Sinks::holding`]).
    pub hold: Option<Lsn>,
}

#[async_trait]
impl Tables for IcebergTables<'_> {
    type Sink = IcebergTable;

    async fn load(&self) -> Result<Sinks<IcebergTable>> {
        let tables = IcebergTable::load_all(self.catalog, self.namespace, self.p).await?;
        Ok(Sinks::new(
            tables,
            self.p.source.append_only.clone(),
            self.p.state_file.clone(),
            self.p.transaction_memory_budget,
        )
        .named(&self.p.name)
        .cutting(self.p.consistent_cuts)
        .holding(self.hold)
        .filtering(chunk_filters(self.p)?))
    }

    async fn check_source(&self) -> Result<()> {
        check_source(self.p).await
    }
}

/// The tables of `p` copied in key chunks that still lack WAL transactions, as the state
/// records them.
fn chunk_filters(p: &PipelineConfig) -> Result<HashMap<TableRef, super::chunks::ChunkFilter>> {
    let Some(state) = super::state::PipelineState::load(&p.state_file)? else {
        return Ok(HashMap::new());
    };
    Ok(p.source
        .tables
        .iter()
        .filter_map(|t| {
            let filter = state.table(t)?.chunked.clone()?;
            Some((t.clone(), filter))
        })
        .collect())
}

/// The timing of a continuous run.
#[derive(Debug, Clone)]
pub struct Cadence {
    pub pipeline: String,
    /// How often the log is committed to the tables.
    pub commit_interval: Duration,
    /// How long the source may stay silent before it counts as gone.
    pub peer_timeout: Duration,
}

impl Cadence {
    pub fn of(p: &PipelineConfig) -> Self {
        Self {
            pipeline: p.name.clone(),
            commit_interval: p.commit_interval,
            peer_timeout: p.source.peer_timeout,
        }
    }
}

/// How often a running pipeline checks that its tables still exist and are published.
const SOURCE_CHECK_INTERVAL: Duration = Duration::from_secs(10);

/// `sync --once`: streams everything committed before this call into the log, acknowledges
/// what is durable there, commits it to the tables, and returns.
pub async fn catch_up_once<S, L, T>(source: &mut S, log: &L, tables: &T) -> Result<()>
where
    S: ChangeSource<L>,
    L: ChangeLog,
    T: Tables,
{
    let (_shutdown_tx, shutdown_rx) = watch::channel(false);
    let (durable_tx, durable_rx) = watch::channel(Lsn::default());
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let start = log.resume_point()?;
    // The tables load (their key indexes) while the changes stream in, and then apply
    // what is durable on a task of their own while the source decodes the rest.
    let stream = async {
        let durable = source
            .stream_into(log, start, Until::Now, shutdown_rx, &durable_tx)
            .await;
        let _ = done_tx.send(());
        durable
    };
    let applier = async {
        let sinks = tables.load().await?;
        let mut task = AbortOnDrop(tokio::spawn(apply_as_it_lands(
            log.clone(),
            sinks,
            durable_rx,
            done_rx,
        )));
        (&mut task.0)
            .await
            .map_err(|e| Error::fatal(format!("the applying task failed: {e}")))?
    };
    // Both run to their end (the applier stops at a segment boundary once the stream
    // ended or failed), so nothing is cut off in the middle of a commit. What is durable in
    // the log is acknowledged even when applying failed: the log keeps it.
    let (durable, applied) = tokio::join!(stream, applier);
    source.acknowledge(durable?).await?;
    let mut sinks = applied?;
    apply_log(log, &mut sinks).await?;
    sinks.keep_indexes();
    Ok(())
}

/// Continuous `sync`: streams and commits until `shutdown` turns true, then flushes,
/// commits and returns. A transient fault (the stream breaking, the source restarting, a
/// full disk) commits what is already durable and returns its retryable error: the caller
/// (`supervise`) waits and runs the pipeline again, which resumes where the log ends.
pub async fn run_continuous<S, L, T>(
    source: S,
    log: &L,
    tables: &T,
    cadence: &Cadence,
    shutdown: watch::Receiver<bool>,
) -> Result<()>
where
    S: ChangeSource<L>,
    L: ChangeLog,
    T: Tables,
{
    let pipeline = &cadence.pipeline;
    let mut sinks = tables.load().await?;
    // Anything already in the log (from before a crash) is committed first. When a value
    // there cannot be stored, the change that fixes it (the row updated or deleted at the
    // source) may still be in the slot: stream first, and let the next apply of both decide.
    if let Err(e) = apply_log(log, &mut sinks).await {
        if e.kind() != ErrorKind::Unrepresentable {
            return Err(e);
        }
        tracing::warn!(pipeline = %pipeline, error = %e.report(), "the WAL holds a change that cannot be applied yet; streaming first, in case a later change replaces it");
        sinks = tables.load().await?;
    }
    let (durable_tx, _) = watch::channel(Lsn::default());
    let start = log.resume_point()?;
    let stream_log = log.clone();
    let stream_shutdown = shutdown.clone();
    let tx = durable_tx.clone();
    let mut source = source;
    let stream = tokio::spawn(async move {
        let streamed = source
            .stream_into(&stream_log, start, Until::Shutdown, stream_shutdown, &tx)
            .await;
        (source, streamed)
    });
    // An early return (a failed commit) must not leave the stream running beside the next
    // try: it would hold the slot and write the same log.
    let mut stream = AbortOnDrop(stream);
    let mut ticker = tokio::time::interval(cadence.commit_interval);
    let mut checked = std::time::Instant::now();
    ticker.tick().await;
    let outcome = loop {
        tokio::select! {
            res = &mut stream.0 => break res,
            _ = ticker.tick() => {
                apply_log(log, &mut sinks).await?;
                if checked.elapsed() >= SOURCE_CHECK_INTERVAL {
                    bounded(cadence.peer_timeout, "checking the source's tables and publication", tables.check_source()).await?;
                    checked = std::time::Instant::now();
                }
            }
        }
    };
    let (mut source, stream_result) =
        outcome.map_err(|e| Error::fatal(format!("the replication task failed: {e}")))?;
    match stream_result {
        Ok(durable) => {
            apply_log(log, &mut sinks).await?;
            bounded(
                cadence.peer_timeout,
                "acknowledging the slot",
                source.acknowledge(durable),
            )
            .await?;
            tracing::info!(pipeline = %pipeline, "stopped: changes flushed, committed and acknowledged");
            sinks.keep_indexes();
            Ok(())
        }
        Err(e) => {
            if e.kind() == ErrorKind::Retryable {
                // What the stream made durable before the fault goes to the tables now; if
                // that fails too, the next try does it.
                match apply_log(log, &mut sinks).await {
                    // The next try starts from the saved index instead of rebuilding it.
                    Ok(()) => sinks.keep_indexes(),
                    Err(commit) => {
                        tracing::debug!(pipeline = %pipeline, error = %commit.report(), "commit after a replication fault failed; the next try commits");
                    }
                }
            }
            Err(e)
        }
    }
}
