//! The seams the CDC phase drives, source -> change log (WAL) -> table sinks: each is a narrow
//! trait whose doc comment states its contract, with the real implementation beside it (the
//! Postgres slot, Skippr's `WalStore`, an Iceberg table). The unit tests drive the same
//! orchestration code with in-memory doubles of each (see `doubles`).

use std::sync::Arc;

use async_trait::async_trait;
use iceberg::{NamespaceIdent, TableIdent};
use tokio::sync::watch;

use crate::catalog::LocalCatalog;
use crate::change::{Change, Lsn, Relation, Txn};
use crate::config::{PipelineConfig, PostgresConfig, TableRef};
use crate::error::{Context, Result};
use crate::sink::iceberg::apply::TableSink as IcebergSink;
use crate::sink::iceberg::keyindex::Spill;
use crate::source::postgres::slot::advance_slot;
use crate::source::postgres::stream::{stream, StopAt, ONCE_MARKER_PREFIX};
use crate::table::cuts::TableCut;
use crate::wal::appender::WalAppender;
use crate::wal::items::items_of;
use crate::wal::store::SegmentBuilder;
use crate::wal::{Item, Record, SegmentInfo, WalStore};

/// When a stream of changes stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// Once everything the source committed before the call is durable in the log
    /// (`sync --once`).
    Now,
    /// When the shutdown channel turns true (continuous `sync`, `serve`).
    Shutdown,
}

/// Where changes come from: the source's committed transactions, in order.
///
/// Contract:
/// - Transactions arrive whole and in commit-LSN order: each one's end LSN is greater than
///   the one before it, and a transaction is never split between two appends to the log.
/// - A transaction is appended to the log, durably, before its end LSN is published on
///   `durable` or reported to the source as received; nothing that is not durable in the
///   log is ever acknowledged.
/// - [`ChangeSource::acknowledge`] of an LSN means everything up to it may be discarded by
///   the source: it is never delivered again. The pipeline acknowledges only what `stream_into`
///   returned as durable.
#[async_trait]
pub trait ChangeSource<L: ChangeLog>: Send + 'static {
    /// Streams into `log` every transaction the source committed after `start` (after the
    /// source's own acknowledged position when `start` is zero) until `until`. Returns the
    /// last LSN durable in `log` (at least `start`). An error leaves in the log only whole,
    /// durable transactions.
    async fn stream_into(
        &mut self,
        log: &L,
        start: Lsn,
        until: Until,
        shutdown: watch::Receiver<bool>,
        durable: &watch::Sender<Lsn>,
    ) -> Result<Lsn>;

    /// Tells the source it may discard everything up to `lsn`.
    async fn acknowledge(&mut self, lsn: Lsn) -> Result<()>;
}

/// The change log (Skippr's WAL): what the source delivered, kept until every table has
/// committed it.
///
/// Contract:
/// - [`ChangeLog::append`] is durable before it returns (fsynced, or stored by the object
///   store): a crash afterwards loses nothing of it; a crash during it leaves nothing of it.
/// - Segments are listed oldest first; each holds whole transactions with increasing end
///   LSNs (`first..=last`) and the relation descriptions they are read with, so a reader can
///   start at any segment and skip those that end at or below an LSN it already has.
/// - [`ChangeLog::remove_through`] deletes only segments whose every transaction ends at or
///   below the given LSN; the pipeline passes only an LSN that every table has committed.
pub trait ChangeLog: Clone + Send + Sync + 'static {
    /// Appends whole transactions, read with `relations` (the descriptions in effect for the
    /// relations they change, as far as the transactions do not describe them inline).
    /// Returns the last end LSN made durable; `None` when there was nothing to append.
    fn append(&self, relations: &[Relation], txns: &[Txn]) -> Result<Option<Lsn>>;

    /// The complete segments, oldest first.
    fn segments(&self) -> Result<Vec<SegmentInfo>>;

    /// Every record of a segment. A damaged segment is an error, never skipped.
    fn read(&self, seg: &SegmentInfo) -> Result<Vec<Record>>;

    /// The records of a segment as items, in order: what the sinks apply. A log may yield a
    /// large transaction change by change, so that applying it takes bounded memory; a
    /// damaged segment is an error (at the latest when its damaged record is reached, and
    /// always before any change of that record).
    fn items(&self, seg: &SegmentInfo) -> Result<Box<dyn Iterator<Item = Result<Item>> + Send>> {
        Ok(Box::new(items_of(self.read(seg)?).map(Ok)))
    }

    /// Deletes the segments whose every transaction ends at or below `lsn`.
    fn remove_through(&self, lsn: Lsn) -> Result<usize>;

    /// Where the next stream resumes: the end of the newest transaction held (zero when the
    /// log is empty: the source's own acknowledged position then).
    fn resume_point(&self) -> Result<Lsn> {
        Ok(self.segments()?.last().map(|s| s.last).unwrap_or_default())
    }
}

/// One destination table.
///
/// Contract:
/// - [`TableSink::committed`] is the end LSN of the last transaction the table's last commit
///   holds (recorded in the same atomic commit as its rows). Changes of transactions ending
///   at or below it are already in the table: the pipeline does not apply them again, so
///   replaying the log after a crash creates no duplicates (apply is idempotent above the
///   committed LSN).
/// - [`TableSink::apply`] stages a change; nothing is visible to readers until
///   [`TableSink::commit`], which makes everything staged durable in one atomic commit (the
///   log is truncated only after it). An UPDATE or DELETE whose old row cannot be found is an
///   error, never ignored.
/// - [`TableSink::covered`] is the LSN through which the table holds every change, stretches
///   without a change for it included; while changes are staged it is the committed LSN.
#[async_trait]
pub trait TableSink: Send + 'static {
    /// The source table this sink follows.
    fn source(&self) -> &TableRef;
    fn committed(&self) -> Lsn;
    fn covered(&self) -> Lsn;
    /// Takes the relation description the following changes are read with.
    async fn describe(&mut self, relation: &Relation) -> Result<()>;
    /// Stages one change of a transaction ending at `end_lsn`.
    fn apply(&mut self, change: &Change, end_lsn: Lsn) -> Result<()>;
    /// Marks the table complete through `end_lsn` although the transaction did not change it.
    fn advance(&mut self, end_lsn: Lsn);
    /// A transaction committed in the source at `commit_lsn` and `commit_micros` (Postgres
    /// epoch) starts: the changes and the `advance` that follow are of it (recorded for time
    /// travel and changelogs).
    fn begin_txn(&mut self, _commit_lsn: Lsn, _commit_micros: i64) {}
    fn pending_changes(&self) -> u64;
    /// Memory the staged changes hold.
    fn pending_bytes(&self) -> u64;
    /// Moves what is staged in memory to storage that no reader sees before
    /// [`TableSink::commit`] (files the next commit adds), so that a transaction larger than
    /// memory is applied in bounded memory; the changes stay staged, nothing is committed.
    async fn spill(&mut self) -> Result<()>;
    /// Commits everything staged, atomically and durably, with its LSN.
    async fn commit(&mut self) -> Result<()>;
    /// Runs the table maintenance that is due (compaction, snapshot expiry, orphan
    /// cleanup). Called between commits, with nothing staged; it changes how the committed
    /// rows are stored, never which rows or the committed LSN.
    async fn maintain(&mut self) -> Result<()> {
        Ok(())
    }
    /// The run ends with everything committed: keeps what makes the next start fast (the
    /// key index). Never fails the run.
    fn keep_index(&mut self) {}
    /// Whether the table has a committed snapshot (one a consistent cut can tag).
    fn has_snapshot(&self) -> bool;
    /// The consistent cuts the table holds (its `skippr-cut-...` tags), oldest first.
    fn cuts(&self) -> Result<Vec<TableCut>>;
    /// Tags the current snapshot with the cut `tag` (when given) and removes the cut tags
    /// named in `drop` that the table holds, in one atomic commit of the table's metadata
    /// (staged with the round's other tables when the catalog commits rounds at once).
    /// Called between commits, with nothing staged: the current snapshot then holds every
    /// change through [`TableSink::covered`]. It changes no rows and no committed LSN.
    async fn tag_cut(&mut self, tag: Option<&str>, drop: &[String]) -> Result<()>;
}

/// The Postgres replication slot of a pipeline.
pub struct PostgresSource {
    cfg: PostgresConfig,
    /// The pipeline's name (metrics and state are labelled with it).
    pipeline: String,
    /// Memory budget of one transaction before it spills to disk.
    budget: u64,
    /// A plain SQL session (marks and acknowledgements), opened when first needed.
    client: Option<tokio_postgres::Client>,
}

impl PostgresSource {
    pub fn new(p: &PipelineConfig, client: Option<tokio_postgres::Client>) -> Self {
        Self {
            cfg: p.source.clone(),
            pipeline: p.name.clone(),
            budget: p.transaction_memory_budget,
            client,
        }
    }

    async fn client(&mut self) -> Result<&tokio_postgres::Client> {
        if self.client.as_ref().is_none_or(|c| c.is_closed()) {
            self.client = Some(crate::source::postgres::connect::connect(&self.cfg).await?);
        }
        self.client
            .as_ref()
            .ok_or_else(|| crate::error::Error::fatal("the source session was not opened"))
    }
}

#[async_trait]
impl ChangeSource<WalStore> for PostgresSource {
    async fn stream_into(
        &mut self,
        log: &WalStore,
        start: Lsn,
        until: Until,
        shutdown: watch::Receiver<bool>,
        durable: &watch::Sender<Lsn>,
    ) -> Result<Lsn> {
        let stop = match until {
            Until::Shutdown => StopAt::Shutdown,
            Until::Now => {
                // A logical message marks "now" in the stream: everything committed before it
                // has arrived when it does.
                let nonce = uuid::Uuid::new_v4().to_string();
                self.client()
                    .await?
                    .query_one(
                        "SELECT pg_logical_emit_message(false, $1, $2)::text",
                        &[&ONCE_MARKER_PREFIX, &nonce],
                    )
                    .await
                    .context("marking the current WAL position (pg_logical_emit_message)")?;
                StopAt::Marker(nonce)
            }
        };
        let mut out = WalAppender::new(log, self.budget);
        stream(
            &self.cfg,
            &self.pipeline,
            &mut out,
            start,
            stop,
            shutdown,
            durable,
        )
        .await
    }

    async fn acknowledge(&mut self, lsn: Lsn) -> Result<()> {
        let slot = self.cfg.slot.clone();
        advance_slot(self.client().await?, &slot, lsn).await
    }
}

impl ChangeLog for WalStore {
    fn append(&self, relations: &[Relation], txns: &[Txn]) -> Result<Option<Lsn>> {
        let mut builder = SegmentBuilder::default();
        for r in relations {
            builder.relation(r.clone());
        }
        for t in txns {
            builder.push(t);
        }
        builder.flush(self)
    }

    fn segments(&self) -> Result<Vec<SegmentInfo>> {
        WalStore::segments(self)
    }

    fn read(&self, seg: &SegmentInfo) -> Result<Vec<Record>> {
        WalStore::read(self, seg)
    }

    fn items(&self, seg: &SegmentInfo) -> Result<Box<dyn Iterator<Item = Result<Item>> + Send>> {
        WalStore::items(self, seg)
    }

    fn remove_through(&self, lsn: Lsn) -> Result<usize> {
        WalStore::remove_through(self, lsn)
    }
}

/// One Iceberg table of a pipeline, with the catalog it commits through.
pub struct IcebergTable {
    sink: IcebergSink,
    catalog: LocalCatalog,
    pipeline: String,
    /// Where the key index is saved between runs.
    key_index_dir: std::path::PathBuf,
}

impl IcebergTable {
    /// Loads every table of the pipeline from its catalog: committed LSN and key index.
    pub async fn load_all(
        catalog: &LocalCatalog,
        namespace: &NamespaceIdent,
        p: &PipelineConfig,
    ) -> Result<Vec<Self>> {
        let mut tables = Vec::new();
        for t in &p.source.tables {
            let ident = TableIdent::new(namespace.clone(), t.iceberg_name());
            let table = catalog
                .catalog
                .load_table(&ident)
                .await
                .with_context(|| format!("loading Iceberg table {ident}"))?;
            let place = Arc::new(Spill {
                dir: p.key_index_dir.clone(),
                budget: usize::try_from(p.key_index_memory_budget).unwrap_or(usize::MAX),
            });
            let mut sink = IcebergSink::load(t.clone(), table, Some(place)).await?;
            sink.set_maintenance(p.maintenance.clone());
            if let Some(name) = p.changelog(t) {
                let changelog = crate::table::changelog::create_or_load(
                    catalog,
                    namespace,
                    name,
                    t,
                    &sink.table,
                )
                .await?;
                sink.attach_changelog(changelog, catalog, &p.name).await?;
            }
            tables.push(Self {
                sink,
                catalog: catalog.clone(),
                pipeline: p.name.clone(),
                key_index_dir: p.key_index_dir.clone(),
            });
        }
        Ok(tables)
    }
}

#[async_trait]
impl TableSink for IcebergTable {
    fn source(&self) -> &TableRef {
        &self.sink.source
    }

    fn committed(&self) -> Lsn {
        self.sink.committed()
    }

    fn covered(&self) -> Lsn {
        self.sink.covered()
    }

    async fn describe(&mut self, relation: &Relation) -> Result<()> {
        self.sink
            .relation(relation, &self.catalog, &self.pipeline)
            .await
    }

    fn apply(&mut self, change: &Change, end_lsn: Lsn) -> Result<()> {
        self.sink.apply(change, end_lsn)
    }

    fn advance(&mut self, end_lsn: Lsn) {
        self.sink.advance(end_lsn)
    }

    fn begin_txn(&mut self, commit_lsn: Lsn, commit_micros: i64) {
        self.sink.begin_txn(commit_lsn, commit_micros)
    }

    fn pending_changes(&self) -> u64 {
        self.sink.pending_changes()
    }

    fn pending_bytes(&self) -> u64 {
        self.sink.pending_bytes()
    }

    async fn spill(&mut self) -> Result<()> {
        self.sink.spill(&self.catalog, &self.pipeline).await
    }

    async fn commit(&mut self) -> Result<()> {
        self.sink.commit(&self.catalog, &self.pipeline).await
    }

    async fn maintain(&mut self) -> Result<()> {
        self.sink.maintain(&self.catalog, &self.pipeline).await
    }

    fn keep_index(&mut self) {
        self.sink.save_index(&self.key_index_dir);
    }

    fn has_snapshot(&self) -> bool {
        self.sink.table.metadata().current_snapshot_id().is_some()
    }

    fn cuts(&self) -> Result<Vec<TableCut>> {
        self.sink.cuts()
    }

    async fn tag_cut(&mut self, tag: Option<&str>, drop: &[String]) -> Result<()> {
        self.sink
            .tag_cut(tag, drop, &self.catalog, &self.pipeline)
            .await
    }
}
