//! The change half of a pipeline: streams the slot into the WAL (durable, then
//! acknowledged), and commits the WAL to Iceberg in batches, per table exactly once.

use std::collections::HashMap;
use std::time::Duration;

use iceberg::{NamespaceIdent, TableIdent};
use tokio::sync::watch;

use crate::catalog::LocalCatalog;
use crate::change::Lsn;
use crate::change::Relation;
use crate::config::{PipelineConfig, TableRef};
use crate::error::{Context, Error, ErrorKind, Result};
use crate::sink::iceberg::apply::TableSink;
use crate::source::postgres::slot::advance_slot;
use crate::source::postgres::stream::{stream_to_wal, StopAt, ONCE_MARKER_PREFIX};
use crate::wal::{Op, Record, WalStore};

/// Changes held in memory before a commit is forced, whatever the interval.
const COMMIT_MAX_CHANGES: u64 = 500_000;
/// Approximate bytes of pending rows before a commit is forced (wide rows hit this first).
const COMMIT_MAX_BYTES: u64 = 256 * 1024 * 1024;

/// The Iceberg side of every table of a pipeline.
pub struct Sinks {
    tables: Vec<TableSink>,
    by_name: HashMap<TableRef, usize>,
    /// Relation id -> (table, latest description, whether the table has taken it yet).
    rel: HashMap<u32, (usize, Relation, bool)>,
    append_only: Vec<TableRef>,
    /// End LSN of the last WAL transaction applied (duplicates at or below it are skipped).
    applied_through: Lsn,
    /// The pipeline's state file, where each table's watermark is kept.
    state_file: crate::storage::state_file::StateFile,
}

impl Sinks {
    pub async fn load(
        catalog: &LocalCatalog,
        namespace: &NamespaceIdent,
        p: &PipelineConfig,
    ) -> Result<Self> {
        let mut tables = Vec::new();
        let mut by_name = HashMap::new();
        for t in &p.source.tables {
            let ident = TableIdent::new(namespace.clone(), t.iceberg_name());
            let table = catalog
                .catalog
                .load_table(&ident)
                .await
                .with_context(|| format!("loading Iceberg table {ident}"))?;
            by_name.insert(t.clone(), tables.len());
            tables.push(TableSink::load(t.clone(), table).await?);
        }
        let applied_through = tables.iter().map(|t| t.lsn).min().unwrap_or_default();
        Ok(Self {
            tables,
            by_name,
            rel: HashMap::new(),
            append_only: p.source.append_only.clone(),
            applied_through,
            state_file: p.state_file.clone(),
        })
    }

    /// Each table and the LSN through which Iceberg holds all its changes, idle stretches
    /// included.
    pub fn watermarks(&self) -> Vec<(TableRef, Lsn)> {
        self.tables
            .iter()
            .map(|t| (t.source.clone(), t.covered()))
            .collect()
    }

    /// The LSN below which every table has committed all its changes.
    pub fn covered(&self) -> Lsn {
        self.tables
            .iter()
            .map(|t| t.covered())
            .min()
            .unwrap_or_default()
    }

    fn pending_changes(&self) -> u64 {
        self.tables.iter().map(|t| t.pending_changes()).sum()
    }

    fn pending_bytes(&self) -> u64 {
        self.tables.iter().map(|t| t.pending_bytes()).sum()
    }

    /// Applies WAL records in order. A relation description is taken by its table only when
    /// a change that follows it is applied, so replaying a segment never re-applies a schema
    /// the table has already moved past.
    pub async fn apply(
        &mut self,
        records: Vec<Record>,
        catalog: &LocalCatalog,
        pipeline: &str,
    ) -> Result<()> {
        for rec in records {
            match rec {
                Record::Relation(r) => {
                    let name = TableRef {
                        schema: r.namespace.clone(),
                        name: r.name.clone(),
                    };
                    if let Some(&i) = self.by_name.get(&name) {
                        self.rel.insert(r.id, (i, r, false));
                    }
                }
                Record::Txn(t) => {
                    let skipped = t.end_lsn <= self.applied_through;
                    for c in &t.changes {
                        // A transaction already applied still carries the descriptions the
                        // later transactions of its segment are read with.
                        if skipped && c.op != Op::Relation {
                            continue;
                        }
                        if let (Op::Relation, Some(r)) = (c.op, &c.relation) {
                            let name = TableRef {
                                schema: r.namespace.clone(),
                                name: r.name.clone(),
                            };
                            if let Some(&i) = self.by_name.get(&name) {
                                self.rel.insert(r.id, (i, r.clone(), false));
                            }
                            continue;
                        }
                        // Only tables of this pipeline have a description here (the WAL
                        // refuses a change without one when it is read).
                        let Some((i, _, taken)) = self.rel.get(&c.rel) else {
                            continue;
                        };
                        let (i, taken) = (*i, *taken);
                        if t.end_lsn <= self.tables[i].lsn {
                            continue;
                        }
                        if !taken {
                            // The description in the WAL is complete: the source is not asked.
                            if let Some(rel) = self.rel.get(&c.rel).map(|x| x.1.clone()) {
                                self.tables[i].relation(&rel, catalog, pipeline).await?;
                            }
                            if let Some(entry) = self.rel.get_mut(&c.rel) {
                                entry.2 = true;
                            }
                        }
                        let sink = &mut self.tables[i];
                        if matches!(c.op, Op::Update | Op::Delete)
                            && self.append_only.contains(&sink.source)
                        {
                            return Err(Error::unrepresentable(format!(
                                "table {} is marked append_only, but an {} arrived (transaction {}); give the table a primary key or REPLICA IDENTITY FULL and remove it from `append_only`, then run `skipprd sync --resnapshot`",
                                sink.source,
                                if c.op == Op::Update { "UPDATE" } else { "DELETE" },
                                t.xid
                            )));
                        }
                        sink.apply(c, t.end_lsn)?;
                    }
                    if skipped {
                        continue;
                    }
                    for sink in &mut self.tables {
                        sink.advance(t.end_lsn);
                    }
                    self.applied_through = t.end_lsn;
                }
            }
        }
        Ok(())
    }

    pub async fn commit(&mut self, catalog: &LocalCatalog, pipeline: &str) -> Result<()> {
        for t in &mut self.tables {
            t.commit(catalog, pipeline).await?;
        }
        Ok(())
    }
}

/// Applies every WAL segment not yet applied, commits, and removes what Iceberg now holds.
pub async fn apply_wal(
    wal: &WalStore,
    sinks: &mut Sinks,
    catalog: &LocalCatalog,
    pipeline: &str,
) -> Result<()> {
    for seg in wal.segments()? {
        if seg.last <= sinks.applied_through {
            continue;
        }
        let records = wal.read(&seg)?;
        sinks.apply(records, catalog, pipeline).await?;
        if sinks.pending_changes() >= COMMIT_MAX_CHANGES
            || sinks.pending_bytes() >= COMMIT_MAX_BYTES
        {
            sinks.commit(catalog, pipeline).await?;
        }
    }
    sinks.commit(catalog, pipeline).await?;
    // The watermarks are recorded before the WAL that backs them goes, and only what every
    // table has durably committed goes (the commits fsynced their files).
    let covered = sinks.covered();
    crate::pipeline::state::record_commit(&sinks.state_file, &sinks.watermarks(), covered)?;
    crate::sink::iceberg::durable::pause_point(
        crate::sink::iceberg::durable::PAUSE_BEFORE_WAL_REMOVAL,
    )
    .await;
    let removed = wal.remove_through(covered)?;
    if removed > 0 {
        tracing::debug!(
            segments = removed,
            "WAL segments committed to Iceberg and removed"
        );
    }
    Ok(())
}

/// How often a running pipeline checks that its tables still exist and are published.
const SOURCE_CHECK_INTERVAL: Duration = Duration::from_secs(10);

/// A dropped table, or one removed from the publication, sends no more changes: the stream
/// alone cannot tell. Check the catalog and stop with a clear error instead.
async fn check_source(p: &PipelineConfig) -> Result<()> {
    let client = crate::source::postgres::connect::connect(&p.source).await?;
    for t in &p.source.tables {
        crate::source::postgres::schema::describe(&client, t).await?;
    }
    let published =
        crate::source::postgres::slot::publication_tables(&client, &p.source.publication)
            .await?
            .unwrap_or_default();
    for t in &p.source.tables {
        if !published.contains(t) {
            return Err(Error::source_err(format!(
                "table {t} was removed from publication `{}` while the pipeline ran, so its changes are no longer sent; run ALTER PUBLICATION {} ADD TABLE {}; then `skipprd sync --pipeline {} --resnapshot`",
                p.source.publication,
                crate::config::quote_ident(&p.source.publication),
                t.quoted(),
                p.name
            )));
        }
    }
    Ok(())
}

/// Where the stream resumes: after the newest transaction already in the WAL, or, with an
/// empty WAL, at the slot's confirmed position.
fn resume_point(wal: &WalStore) -> Result<Lsn> {
    Ok(wal.segments()?.last().map(|s| s.last).unwrap_or_default())
}

/// `sync --once`: streams everything committed before this call, commits it, and returns.
pub async fn catch_up_once(
    p: &PipelineConfig,
    wal: &WalStore,
    catalog: &LocalCatalog,
    namespace: &NamespaceIdent,
    client: &tokio_postgres::Client,
) -> Result<()> {
    let nonce = uuid::Uuid::new_v4().to_string();
    client
        .query_one(
            "SELECT pg_logical_emit_message(false, $1, $2)::text",
            &[&ONCE_MARKER_PREFIX, &nonce],
        )
        .await
        .context("marking the current WAL position (pg_logical_emit_message)")?;
    let (_shutdown_tx, shutdown_rx) = watch::channel(false);
    let (durable_tx, _) = watch::channel(Lsn::default());
    let start = resume_point(wal)?;
    let durable = stream_to_wal(
        &p.source,
        wal,
        start,
        StopAt::Marker(nonce),
        p.transaction_memory_budget,
        shutdown_rx,
        &durable_tx,
    )
    .await?;
    advance_slot(client, &p.source.slot, durable).await?;
    let mut sinks = Sinks::load(catalog, namespace, p).await?;
    apply_wal(wal, &mut sinks, catalog, &p.name).await
}

/// Continuous `sync`: streams and commits until `shutdown` turns true, then flushes,
/// commits and returns. A transient fault (the stream breaking, the source restarting, a
/// full disk) commits what is already durable and returns its retryable error: the caller
/// (`supervise`) waits and runs the pipeline again, which resumes where the WAL ends.
pub async fn run_continuous(
    p: &PipelineConfig,
    wal: &WalStore,
    catalog: &LocalCatalog,
    namespace: &NamespaceIdent,
    shutdown: watch::Receiver<bool>,
) -> Result<()> {
    let mut sinks = Sinks::load(catalog, namespace, p).await?;
    // Anything already in the WAL (from before a crash) is committed first. When a value
    // there cannot be stored, the change that fixes it (the row updated or deleted at the
    // source) may still be in the slot: stream first, and let the next apply of both decide.
    if let Err(e) = apply_wal(wal, &mut sinks, catalog, &p.name).await {
        if e.kind() != ErrorKind::Unrepresentable {
            return Err(e);
        }
        tracing::warn!(pipeline = %p.name, error = %e.report(), "the WAL holds a change that cannot be applied yet; streaming first, in case a later change replaces it");
        sinks = Sinks::load(catalog, namespace, p).await?;
    }
    let (durable_tx, _) = watch::channel(Lsn::default());
    let start = resume_point(wal)?;
    let cfg = p.source.clone();
    let stream_wal = wal.clone();
    let stream_shutdown = shutdown.clone();
    let tx = durable_tx.clone();
    let budget = p.transaction_memory_budget;
    let stream = tokio::spawn(async move {
        stream_to_wal(
            &cfg,
            &stream_wal,
            start,
            StopAt::Shutdown,
            budget,
            stream_shutdown,
            &tx,
        )
        .await
    });
    // An early return (a failed commit) must not leave the stream running beside the next
    // try: it would hold the slot and write the same WAL.
    let mut stream = AbortOnDrop(stream);
    let mut ticker = tokio::time::interval(p.commit_interval);
    let mut checked = std::time::Instant::now();
    ticker.tick().await;
    let outcome = loop {
        tokio::select! {
            res = &mut stream.0 => break res,
            _ = ticker.tick() => {
                apply_wal(wal, &mut sinks, catalog, &p.name).await?;
                if checked.elapsed() >= SOURCE_CHECK_INTERVAL {
                    bounded(p.source.peer_timeout, "checking the source's tables and publication", check_source(p)).await?;
                    checked = std::time::Instant::now();
                }
            }
        }
    };
    let stream_result =
        outcome.map_err(|e| Error::fatal(format!("the replication task failed: {e}")))?;
    match stream_result {
        Ok(durable) => {
            apply_wal(wal, &mut sinks, catalog, &p.name).await?;
            let ack = async {
                let client = crate::source::postgres::connect::connect(&p.source).await?;
                advance_slot(&client, &p.source.slot, durable).await
            };
            bounded(p.source.peer_timeout, "acknowledging the slot", ack).await?;
            tracing::info!(pipeline = %p.name, "stopped: changes flushed, committed and acknowledged");
            Ok(())
        }
        Err(e) => {
            if e.kind() == ErrorKind::Retryable {
                // What the stream made durable before the fault goes to Iceberg now; if that
                // fails too, the next try does it.
                if let Err(commit) = apply_wal(wal, &mut sinks, catalog, &p.name).await {
                    tracing::debug!(pipeline = %p.name, error = %commit.report(), "commit after a replication fault failed; the next try commits");
                }
            }
            Err(e)
        }
    }
}

/// Aborts a spawned task when dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs `f` for at most `limit`: a source that stopped answering (a cut network) gives a
/// retryable error instead of a hang.
pub async fn bounded<T>(
    limit: Duration,
    what: &str,
    f: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(limit, f).await {
        Ok(r) => r,
        Err(_) => Err(Error::retryable(format!(
            "{what}: no answer from the source within {}s (skippr.reconnect.peer_timeout)",
            limit.as_secs()
        ))),
    }
}

/// Resolves when SIGTERM or SIGINT arrives, then flips `tx` to true.
pub fn trap_signals(tx: watch::Sender<bool>) {
    tokio::spawn(async move {
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term => {}
        }
        tracing::info!("shutdown requested: flushing");
        let _ = tx.send(true);
    });
}
