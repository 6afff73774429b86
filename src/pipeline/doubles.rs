//! In-memory doubles of the pipeline's seams (change source, change log, table sink), so the
//! unit tests drive the real orchestration of `cdc` without Postgres, files or Iceberg. Each
//! double keeps its contract strictly (a row applied twice or an update of a missing row is
//! an error) and can be told to fail at one step, so a test sees exactly what the
//! orchestration does then.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::watch;

use super::cdc::{Sinks, Tables};
use super::seams::{ChangeLog, ChangeSource, TableSink, Until};
use crate::change::{Change, Datum, Lsn, Op, RelColumn, Relation, Txn};
use crate::config::TableRef;
use crate::error::{Error, Result};
use crate::table::cuts::{cut_time, CutSettings, TableCut};
use crate::wal::{Record, SegmentInfo};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A test that panicked while holding the lock has failed already.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn table(name: &str) -> TableRef {
    TableRef {
        schema: "public".into(),
        name: name.into(),
    }
}

/// `public.<name>` (id integer primary key, v text).
pub fn relation(id: u32, name: &str) -> Relation {
    Relation {
        id,
        namespace: "public".into(),
        name: name.into(),
        replica_identity: b'd',
        columns: vec![
            RelColumn::plain(true, "id", 23, -1, "int4"),
            RelColumn::plain(false, "v", 25, -1, "text"),
        ],
    }
}

fn text(s: &str) -> Datum {
    Datum::Text(Bytes::copy_from_slice(s.as_bytes()))
}

fn row(id: i64, v: &str) -> Vec<Datum> {
    vec![text(&id.to_string()), text(v)]
}

pub fn insert(rel: u32, id: i64, v: &str) -> Change {
    Change {
        op: Op::Insert,
        rel,
        old: None,
        new: Some(row(id, v)),
        relation: None,
    }
}

pub fn update(rel: u32, id: i64, v: &str) -> Change {
    Change {
        op: Op::Update,
        rel,
        old: None,
        new: Some(row(id, v)),
        relation: None,
    }
}

pub fn delete(rel: u32, id: i64) -> Change {
    Change {
        op: Op::Delete,
        rel,
        old: Some(vec![text(&id.to_string()), Datum::Null]),
        new: None,
        relation: None,
    }
}

pub fn txn(end: u64, changes: Vec<Change>) -> Txn {
    Txn::ending_at(end, changes)
}

/// A source whose committed transactions the test lists.
#[derive(Clone, Default)]
pub struct MemSource {
    inner: Arc<Mutex<SourceState>>,
}

#[derive(Default)]
struct SourceState {
    relations: Vec<Relation>,
    txns: Vec<Txn>,
    acknowledged: Lsn,
    /// Every acknowledgement, in order.
    acks: Vec<Lsn>,
    /// Breaks off (a retryable error) after delivering this many transactions.
    fail_after: Option<usize>,
}

impl MemSource {
    pub fn new(relations: Vec<Relation>) -> Self {
        let s = Self::default();
        lock(&s.inner).relations = relations;
        s
    }

    /// A transaction committed at the source.
    pub fn commit(&self, t: Txn) {
        lock(&self.inner).txns.push(t);
    }

    pub fn acks(&self) -> Vec<Lsn> {
        lock(&self.inner).acks.clone()
    }

    pub fn fail_after(&self, n: Option<usize>) {
        lock(&self.inner).fail_after = n;
    }
}

#[async_trait]
impl<L: ChangeLog> ChangeSource<L> for MemSource {
    async fn stream_into(
        &mut self,
        log: &L,
        start: Lsn,
        until: Until,
        mut shutdown: watch::Receiver<bool>,
        durable: &watch::Sender<Lsn>,
    ) -> Result<Lsn> {
        let (relations, pending, fail_after) = {
            let s = lock(&self.inner);
            // Like a slot: from the given position, or from the acknowledged one.
            let from = if start == Lsn::default() {
                s.acknowledged
            } else {
                start
            };
            let pending: Vec<Txn> = s
                .txns
                .iter()
                .filter(|t| t.end_lsn > from)
                .cloned()
                .collect();
            (s.relations.clone(), pending, s.fail_after)
        };
        let mut last = start;
        for (n, t) in pending.iter().enumerate() {
            if fail_after == Some(n) {
                return Err(Error::retryable("the test source broke off"));
            }
            if let Some(lsn) = log.append(&relations, std::slice::from_ref(t))? {
                last = lsn;
                let _ = durable.send(lsn);
            }
            // Like a network stream, it waits between transactions: what runs beside it
            // (the applier of `sync --once`) gets its turn.
            tokio::task::yield_now().await;
        }
        if until == Until::Shutdown {
            let _ = shutdown.wait_for(|stop| *stop).await;
        }
        Ok(last)
    }

    async fn acknowledge(&mut self, lsn: Lsn) -> Result<()> {
        let mut s = lock(&self.inner);
        s.acks.push(lsn);
        s.acknowledged = s.acknowledged.max(lsn);
        Ok(())
    }
}

/// A change log held in memory; each append is one segment.
#[derive(Clone, Default)]
pub struct MemLog {
    inner: Arc<Mutex<LogState>>,
}

#[derive(Default)]
struct LogState {
    segments: Vec<(SegmentInfo, Vec<Record>)>,
    appended: usize,
    fail_appends: bool,
    fail_removal: bool,
    /// Every LSN the log was asked to truncate through, in order.
    removals: Vec<Lsn>,
}

impl MemLog {
    /// Appends fail (a full disk) while set.
    pub fn fail_appends(&self, on: bool) {
        lock(&self.inner).fail_appends = on;
    }

    /// Truncation fails (the process dies right before it) while set.
    pub fn fail_removal(&self, on: bool) {
        lock(&self.inner).fail_removal = on;
    }

    pub fn removals(&self) -> Vec<Lsn> {
        lock(&self.inner).removals.clone()
    }

    /// End LSNs of the transactions the log still holds.
    pub fn held(&self) -> Vec<Lsn> {
        lock(&self.inner)
            .segments
            .iter()
            .flat_map(|(_, records)| records.iter())
            .filter_map(|r| match r {
                Record::Txn(t) => Some(t.end_lsn),
                Record::Relation(_) => None,
            })
            .collect()
    }
}

impl ChangeLog for MemLog {
    fn append(&self, relations: &[Relation], txns: &[Txn]) -> Result<Option<Lsn>> {
        let mut s = lock(&self.inner);
        if s.fail_appends {
            return Err(Error::retryable("the test log is full"));
        }
        let (Some(first), Some(last)) = (txns.first(), txns.last()) else {
            return Ok(None);
        };
        let info = SegmentInfo {
            path: PathBuf::from(format!("mem-{}", s.appended)),
            first: first.end_lsn,
            last: last.end_lsn,
            bytes: 0,
        };
        let records = relations
            .iter()
            .cloned()
            .map(Record::Relation)
            .chain(txns.iter().cloned().map(Record::Txn))
            .collect();
        s.appended += 1;
        s.segments.push((info, records));
        Ok(Some(last.end_lsn))
    }

    fn segments(&self) -> Result<Vec<SegmentInfo>> {
        Ok(lock(&self.inner)
            .segments
            .iter()
            .map(|(i, _)| i.clone())
            .collect())
    }

    fn read(&self, seg: &SegmentInfo) -> Result<Vec<Record>> {
        lock(&self.inner)
            .segments
            .iter()
            .find(|(i, _)| i == seg)
            .map(|(_, r)| r.clone())
            .ok_or_else(|| Error::fatal(format!("segment {} is gone", seg.path.display())))
    }

    fn remove_through(&self, lsn: Lsn) -> Result<usize> {
        let mut s = lock(&self.inner);
        if s.fail_removal {
            return Err(Error::fatal(
                "the test process died before truncating the log",
            ));
        }
        s.removals.push(lsn);
        let before = s.segments.len();
        s.segments.retain(|(i, _)| i.last > lsn);
        Ok(before - s.segments.len())
    }
}

/// What a destination table holds, shared by every sink loaded from it (as an Iceberg table
/// outlives the process that writes it).
#[derive(Default)]
pub struct Stored {
    pub rows: BTreeMap<i64, String>,
    /// The LSN recorded with the last commit.
    pub lsn: Lsn,
    pub commits: usize,
    /// How often staged changes were spilled (to files, for an Iceberg table).
    pub spills: usize,
    /// The next this many commits fail.
    pub fail_commits: usize,
    /// Consistent cuts by tag name: the committed LSN and rows the tag points to.
    pub tags: BTreeMap<String, (Lsn, BTreeMap<i64, String>)>,
    /// The next this many tag commits fail.
    pub fail_tags: usize,
}

/// One table's sink over a [`Stored`].
pub struct MemTable {
    source: TableRef,
    stored: Arc<Mutex<Stored>>,
    staged: Option<BTreeMap<i64, String>>,
    committed: Lsn,
    pending_lsn: Lsn,
    pending: u64,
    /// Staged changes not spilled yet.
    unspilled: u64,
}

fn key_of(t: &Option<Vec<Datum>>) -> Result<i64> {
    match t.as_ref().and_then(|r| r.first()) {
        Some(Datum::Text(b)) => String::from_utf8_lossy(b)
            .parse()
            .map_err(|e| Error::fatal(format!("bad test key: {e}"))),
        _ => Err(Error::fatal("a change without a key")),
    }
}

fn value_of(t: &Option<Vec<Datum>>) -> String {
    match t.as_ref().and_then(|r| r.get(1)) {
        Some(Datum::Text(b)) => String::from_utf8_lossy(b).into_owned(),
        _ => "NULL".into(),
    }
}

impl MemTable {
    fn missing(&self, key: i64) -> Error {
        Error::fatal(format!("table {}: no row {key} to change", self.source))
    }
}

#[async_trait]
impl TableSink for MemTable {
    fn source(&self) -> &TableRef {
        &self.source
    }

    fn committed(&self) -> Lsn {
        self.committed
    }

    fn covered(&self) -> Lsn {
        if self.pending > 0 {
            self.committed
        } else {
            self.pending_lsn
        }
    }

    async fn describe(&mut self, relation: &Relation) -> Result<()> {
        if relation.name != self.source.name {
            return Err(Error::fatal(format!(
                "table {} was given the description of {}",
                self.source,
                relation.qualified()
            )));
        }
        Ok(())
    }

    fn apply(&mut self, change: &Change, end_lsn: Lsn) -> Result<()> {
        let stored = &self.stored;
        let rows = self.staged.get_or_insert_with(|| lock(stored).rows.clone());
        match change.op {
            Op::Insert => {
                let key = key_of(&change.new)?;
                if rows.insert(key, value_of(&change.new)).is_some() {
                    return Err(Error::fatal(format!(
                        "table {}: row {key} inserted twice",
                        self.source
                    )));
                }
            }
            Op::Update => {
                let old = key_of(change.old.as_ref().map_or(&change.new, |_| &change.old))?;
                if rows.remove(&old).is_none() {
                    return Err(self.missing(old));
                }
                rows.insert(key_of(&change.new)?, value_of(&change.new));
            }
            Op::Delete => {
                let key = key_of(&change.old)?;
                if rows.remove(&key).is_none() {
                    return Err(self.missing(key));
                }
            }
            Op::Truncate => rows.clear(),
            Op::Relation => {}
        }
        self.pending += 1;
        self.unspilled += 1;
        self.pending_lsn = self.pending_lsn.max(end_lsn);
        Ok(())
    }

    fn advance(&mut self, end_lsn: Lsn) {
        self.pending_lsn = self.pending_lsn.max(end_lsn);
    }

    fn pending_changes(&self) -> u64 {
        self.pending
    }

    fn pending_bytes(&self) -> u64 {
        self.unspilled * 16
    }

    async fn spill(&mut self) -> Result<()> {
        if self.unspilled > 0 {
            lock(&self.stored).spills += 1;
            self.unspilled = 0;
        }
        Ok(())
    }

    async fn commit(&mut self) -> Result<()> {
        if self.pending == 0 {
            return Ok(());
        }
        let mut stored = lock(&self.stored);
        if stored.fail_commits > 0 {
            stored.fail_commits -= 1;
            return Err(Error::retryable(format!(
                "table {}: the test commit failed",
                self.source
            )));
        }
        if let Some(rows) = self.staged.take() {
            stored.rows = rows;
        }
        stored.lsn = self.pending_lsn;
        stored.commits += 1;
        self.committed = self.pending_lsn;
        self.pending = 0;
        self.unspilled = 0;
        Ok(())
    }

    fn has_snapshot(&self) -> bool {
        true
    }

    fn cuts(&self) -> Result<Vec<TableCut>> {
        let mut out: Vec<TableCut> = lock(&self.stored)
            .tags
            .keys()
            .filter_map(|name| {
                cut_time(name).map(|time| TableCut {
                    name: name.clone(),
                    time,
                    snapshot_id: time,
                })
            })
            .collect();
        out.sort_by_key(|c| c.time);
        Ok(out)
    }

    async fn tag_cut(&mut self, tag: Option<&str>, drop: &[String]) -> Result<()> {
        if self.pending > 0 {
            return Err(Error::fatal("a cut with changes staged"));
        }
        let mut stored = lock(&self.stored);
        if stored.fail_tags > 0 {
            stored.fail_tags -= 1;
            return Err(Error::retryable(format!(
                "table {}: the test tag failed",
                self.source
            )));
        }
        for name in drop {
            stored.tags.remove(name);
        }
        if let Some(name) = tag {
            let at = (stored.lsn, stored.rows.clone());
            stored.tags.insert(name.to_string(), at);
        }
        Ok(())
    }
}

/// The tables of a test pipeline.
pub struct MemTables {
    pub tables: Vec<(TableRef, Arc<Mutex<Stored>>)>,
    pub append_only: Vec<TableRef>,
    pub state_file: crate::storage::state_file::StateFile,
    /// Bytes of staged changes before they are spilled.
    pub budget: u64,
    /// Consistent cuts after the commit rounds.
    pub cuts: Option<CutSettings>,
    /// The log kept after this LSN (a table copied beside the stream).
    pub hold: Option<Lsn>,
    /// Tables copied in key chunks, with what each chunk saw.
    pub filters: HashMap<TableRef, super::chunks::ChunkFilter>,
}

impl MemTables {
    pub fn new(names: &[&str], state_dir: &Path) -> Self {
        Self {
            tables: names
                .iter()
                .map(|n| (table(n), Arc::new(Mutex::new(Stored::default()))))
                .collect(),
            append_only: Vec::new(),
            state_file: crate::storage::state_file::StateFile::Local(
                state_dir.join("app.state.json"),
            ),
            budget: 256 * 1024 * 1024,
            cuts: None,
            hold: None,
            filters: HashMap::new(),
        }
    }

    /// A sink of every table, at what the table holds.
    pub fn sinks(&self) -> Vec<MemTable> {
        self.tables
            .iter()
            .map(|(source, stored)| {
                let lsn = lock(stored).lsn;
                MemTable {
                    source: source.clone(),
                    stored: stored.clone(),
                    staged: None,
                    committed: lsn,
                    pending_lsn: lsn,
                    pending: 0,
                    unspilled: 0,
                }
            })
            .collect()
    }

    pub fn stored(&self, name: &str) -> MutexGuard<'_, Stored> {
        let (_, s) = self
            .tables
            .iter()
            .find(|(t, _)| t.name == name)
            .unwrap_or_else(|| panic!("no test table {name}"));
        lock(s)
    }
}

#[async_trait]
impl Tables for MemTables {
    type Sink = MemTable;

    async fn load(&self) -> Result<Sinks<MemTable>> {
        Ok(Sinks::new(
            self.sinks(),
            self.append_only.clone(),
            self.state_file.clone(),
            self.budget,
        )
        .cutting(self.cuts)
        .holding(self.hold)
        .filtering(self.filters.clone()))
    }

    async fn check_source(&self) -> Result<()> {
        Ok(())
    }
}
