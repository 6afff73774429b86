//! Queries, live half: the WAL tail of a table (changes durable in Skippr's WAL but not yet
//! committed to Iceberg), reduced to the newest version of each key, ready to be merged
//! with the committed Iceberg snapshot.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;

use crate::change::types::PgType;
use crate::change::Datum;
use crate::change::Lsn;
use crate::config::TableRef;
use crate::error::Result;
use crate::sink::iceberg::keys::Key;
use crate::sink::iceberg::SourceColumn;
use crate::wal::{Op, Record, SegmentInfo, WalStore};

/// Decoded WAL segments, shared by every query of the process. Segments are immutable once
/// written, so a decoded segment is valid for as long as its file exists.
#[derive(Default)]
pub struct TailCache {
    segments: Mutex<HashMap<PathBuf, Arc<Vec<Record>>>>,
}

/// The WAL of one pipeline as read at one moment.
#[derive(Default, Clone)]
pub struct WalRead {
    /// Segments read, oldest first.
    pub segments: Vec<(SegmentInfo, Arc<Vec<Record>>)>,
    /// Segments listed but removed before they could be read: their changes were
    /// committed to Iceberg in the meantime.
    pub vanished: Vec<SegmentInfo>,
}

impl WalRead {
    /// The newest LSN of a removed segment: an Iceberg snapshot read afterwards must cover it,
    /// or the read raced with a commit and must be repeated.
    pub fn vanished_through(&self) -> Option<Lsn> {
        self.vanished.iter().map(|s| s.last).max()
    }

    pub fn bytes(&self) -> u64 {
        self.segments.iter().map(|(s, _)| s.bytes).sum()
    }

    /// The end LSN of the newest transaction read at or before `cut` (zero when none is):
    /// two cuts with the same one see the same transactions.
    pub fn newest_through(&self, cut: Lsn) -> Lsn {
        self.segments
            .iter()
            .flat_map(|(_, records)| records.iter())
            .filter_map(|r| match r {
                Record::Txn(t) if t.end_lsn <= cut => Some(t.end_lsn),
                _ => None,
            })
            .max()
            .unwrap_or_default()
    }

    /// The end LSN of the newest transaction read (zero when the read holds none).
    pub fn newest(&self) -> Lsn {
        self.segments
            .iter()
            .flat_map(|(_, records)| records.iter())
            .filter_map(|r| match r {
                Record::Txn(t) => Some(t.end_lsn),
                Record::Relation(_) => None,
            })
            .max()
            .unwrap_or_default()
    }

    /// Identifies this read, for caching what is derived from it.
    fn fingerprint(&self) -> Vec<PathBuf> {
        self.segments.iter().map(|(s, _)| s.path.clone()).collect()
    }
}

impl TailCache {
    /// Lists and decodes the WAL of the pipeline whose segments live in `dir`. Reading never
    /// writes, creates or removes anything.
    pub fn read(&self, dir: &Path) -> Result<WalRead> {
        self.read_store(WalStore::reader(dir))
    }

    /// Like [`TailCache::read`], for a WAL already opened for reading (S3 mode); `None`
    /// reads as an empty WAL.
    pub fn read_store(&self, store: Option<WalStore>) -> Result<WalRead> {
        let Some(store) = store else {
            return Ok(WalRead::default());
        };
        let listed = store.segments()?;
        let mut out = WalRead::default();
        let mut fresh = Vec::new();
        {
            let cache = self.lock();
            for seg in &listed {
                match cache.get(&seg.path) {
                    Some(r) => out.segments.push((seg.clone(), r.clone())),
                    None => fresh.push(seg.clone()),
                }
            }
        }
        for seg in fresh {
            match store.read_if_present(&seg)? {
                Some(records) => {
                    let records = Arc::new(records);
                    self.lock().insert(seg.path.clone(), records.clone());
                    out.segments.push((seg, records));
                }
                None => out.vanished.push(seg),
            }
        }
        out.segments.sort_by_key(|(s, _)| (s.first, s.last));
        // Forget segments of this WAL that are gone.
        let keep: HashSet<&PathBuf> = listed.iter().map(|s| &s.path).collect();
        self.lock()
            .retain(|p, _| !p.starts_with(store.dir()) || keep.contains(p));
        Ok(out)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, Arc<Vec<Record>>>> {
        // A panic while holding the lock cannot leave the map inconsistent: keep using it.
        self.segments.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What a query needs to know about a table to read its tail.
#[derive(Clone)]
pub struct TableShape {
    pub source: TableRef,
    /// The live schema (the Iceberg table's, as DataFusion reads it).
    pub schema: SchemaRef,
    /// Primary key columns (indices into `schema`); empty for tables keyed by the whole row.
    pub key: Vec<usize>,
    /// Columns making up the whole-row key of a table without a primary key.
    pub row_key: Vec<usize>,
    /// Source columns as the Iceberg table records them (name -> field, declared type).
    pub columns: Option<Vec<SourceColumn>>,
    /// Source columns of the tail's newest relation that the committed table does not
    /// record yet (see `tail_schema`), and the live field each one fills.
    pub tail_columns: Vec<SourceColumn>,
}

impl TableShape {
    fn keyed(&self) -> bool {
        !self.key.is_empty()
    }

    pub(crate) fn key_columns(&self) -> &[usize] {
        if self.keyed() {
            &self.key
        } else {
            &self.row_key
        }
    }

    fn pg_types(&self) -> Vec<PgType> {
        self.schema
            .fields()
            .iter()
            .map(|f| PgType::from_arrow(f.data_type()))
            .collect()
    }
}

/// Committed rows the tail replaces: by key, how many copies to hide (`u32::MAX`: all).
#[derive(Debug, Clone, Default)]
pub struct Hidden {
    pub all: bool,
    pub keys: HashMap<Key, u32>,
    /// The key values as text, in key order (for fast paths on integer keys).
    pub texts: HashMap<Key, Vec<Option<String>>>,
    /// The set a scan hides committed rows by, when it can be shared: built by the first
    /// scan of this tail, then reused by every statement that reads the same tail.
    pub shared: std::sync::OnceLock<Option<Arc<super::live::HiddenSet>>>,
}

impl Hidden {
    pub fn is_empty(&self) -> bool {
        !self.all && self.keys.is_empty()
    }
}

/// A table's tail, reduced: the committed rows it hides and the rows it adds.
#[derive(Debug, Clone)]
pub struct TailSnapshot {
    /// The Iceberg snapshot LSN the tail starts after.
    pub floor: Lsn,
    /// The live schema: the committed one, plus the columns the tail adds (see
    /// `tail_schema`).
    pub schema: SchemaRef,
    pub hidden: Hidden,
    /// Rows the tail adds, in the live schema (values an update left unchanged are NULL
    /// there and listed in `fill`).
    pub rows: Option<RecordBatch>,
    /// Rows of `rows` with values an update left unchanged, and the key of the committed row
    /// that holds them.
    pub fill: Vec<(usize, Key, Vec<usize>)>,
    /// Changes of this table in the tail.
    pub changes: u64,
    /// Source commit time of the oldest transaction in the tail touching this table.
    pub oldest_commit_micros: Option<i64>,
    /// Newest LSN in the WAL.
    pub wal_lsn: Lsn,
}

struct Pending {
    key: Key,
    values: Vec<Datum>,
}

/// Reduces the WAL read to the tail of one table over `(floor, through]`: after the LSN its
/// Iceberg snapshot covers, up to the read view's cut. Only whole transactions exist in the
/// WAL and a transaction is kept or cut whole (by its end LSN), so only whole transactions
/// show.
pub fn reduce(
    shape: &TableShape,
    read: &WalRead,
    floor: Lsn,
    through: Lsn,
) -> Result<TailSnapshot> {
    let walk = walk::Walk::new(shape);
    let keyed = shape.keyed();
    let width = walk.names.len();
    let mut rows: Vec<Option<Pending>> = Vec::new();
    let mut by_key: HashMap<Key, Vec<usize>> = HashMap::new();
    let mut hidden = Hidden::default();
    let walked = walk.each(read, floor, through, |step| {
        match step.op {
            Op::Relation => {}
            Op::Truncate => {
                hidden = Hidden {
                    all: true,
                    ..Hidden::default()
                };
                rows.clear();
                by_key.clear();
            }
            Op::Insert => {
                let row = step.new.unwrap_or_default();
                let (key, texts) = walk.key_of(&row)?;
                if keyed {
                    take_pending(&mut rows, &mut by_key, &key, true);
                    hide(&mut hidden, key.clone(), texts, true);
                }
                push(&mut rows, &mut by_key, key, row);
            }
            Op::Delete => {
                let old = step.old.unwrap_or_default();
                let (key, texts) = walk.key_of(&old)?;
                let taken = take_pending(&mut rows, &mut by_key, &key, keyed);
                if keyed || taken.is_none() {
                    hide(&mut hidden, key, texts, keyed);
                }
            }
            Op::Update => {
                let mut row = step.new.unwrap_or_default();
                let old = step.old;
                if let Some(old) = &old {
                    fill_from_old(&mut row, old);
                }
                let (new_key, _) = walk.key_of(&row)?;
                let (old_key, old_texts) = match &old {
                    Some(o) => walk.key_of(o)?,
                    None => walk.key_of(&row)?,
                };
                let previous = take_pending(&mut rows, &mut by_key, &old_key, keyed);
                if keyed || previous.is_none() {
                    hide(&mut hidden, old_key.clone(), old_texts, keyed);
                }
                if keyed && new_key != old_key {
                    take_pending(&mut rows, &mut by_key, &new_key, true);
                    let (_, new_texts) = walk.key_of(&row)?;
                    hide(&mut hidden, new_key.clone(), new_texts, true);
                }
                // Where values still unchanged live: the committed row of the old
                // key, or wherever the pending version said its own came from.
                let mut fill_from = Datum::Text(old_key.to_vec().into());
                if let Some(mut p) = previous {
                    if p.values.len() > width {
                        fill_from = p.values.swap_remove(width);
                    }
                    for (d, v) in row.iter_mut().zip(p.values) {
                        if matches!(d, Datum::Unchanged) {
                            *d = v;
                        }
                    }
                }
                if row.iter().any(|d| matches!(d, Datum::Unchanged)) {
                    row.push(fill_from);
                }
                push(&mut rows, &mut by_key, new_key, row);
            }
        }
        Ok(())
    })?;

    let live: Vec<Pending> = rows.into_iter().flatten().collect();
    let mut fill = Vec::new();
    let batch = if live.is_empty() {
        None
    } else {
        let (batch, unchanged) = walk.batch(live.iter().map(|p| p.values.as_slice()))?;
        for (r, (row, unchanged)) in live.iter().zip(unchanged).enumerate() {
            if !unchanged.is_empty() {
                let from = match row.values.get(width) {
                    Some(Datum::Text(k)) => Key::from(k.to_vec()),
                    _ => row.key.clone(),
                };
                fill.push((r, from, unchanged));
            }
        }
        Some(batch)
    };
    Ok(TailSnapshot {
        floor,
        schema: shape.schema.clone(),
        hidden,
        rows: batch,
        fill,
        changes: walked.changes,
        oldest_commit_micros: walked.oldest_commit_micros,
        wal_lsn: walked.wal_lsn,
    })
}

/// Values a TOASTed column left unchanged in `row`, taken from a full old row (replica
/// identity full) where it has them; a key-only old row has NULL there and gives nothing.
pub(crate) fn fill_from_old(row: &mut [Datum], old: &[Datum]) {
    for (d, o) in row.iter_mut().zip(old) {
        if matches!(d, Datum::Unchanged) && matches!(o, Datum::Text(_)) {
            *d = o.clone();
        }
    }
}

fn take_pending(
    rows: &mut [Option<Pending>],
    by_key: &mut HashMap<Key, Vec<usize>>,
    key: &Key,
    all: bool,
) -> Option<Pending> {
    let list = by_key.get_mut(key)?;
    let mut last = None;
    while let Some(i) = list.pop() {
        last = rows[i].take().or(last);
        if !all {
            break;
        }
    }
    if list.is_empty() {
        by_key.remove(key);
    }
    last
}

fn push(
    rows: &mut Vec<Option<Pending>>,
    by_key: &mut HashMap<Key, Vec<usize>>,
    key: Key,
    values: Vec<Datum>,
) {
    by_key.entry(key.clone()).or_default().push(rows.len());
    rows.push(Some(Pending { key, values }));
}

fn hide(hidden: &mut Hidden, key: Key, texts: Vec<Option<String>>, all: bool) {
    if hidden.all {
        // After a TRUNCATE in the tail, no committed row is visible anyway.
        return;
    }
    let n = hidden.keys.entry(key.clone()).or_insert(0);
    *n = if all { u32::MAX } else { n.saturating_add(1) };
    hidden.texts.entry(key).or_insert(texts);
}

/// Caches the reduced tail of each table for as long as neither the WAL nor the table's
/// committed snapshot changes.
#[derive(Default)]
pub struct ReducedCache {
    entries: Mutex<HashMap<String, CachedTail>>,
}

/// A reduced tail, with the snapshot LSN, the cut, the WAL segments and the committed shape
/// (with the source it reads) it was reduced from.
struct CachedTail {
    lsns: (Lsn, Lsn),
    paths: Vec<PathBuf>,
    base: Arc<TableShape>,
    source: TableRef,
    snap: Arc<TailSnapshot>,
}

impl ReducedCache {
    /// The tail of `table` over `(floor, through]` of `read`, for the committed shape `base`
    /// read from `source`: the shape is extended by the tail's schema changes (see
    /// `tail_schema`) and the tail reduced only when no statement did so for the same
    /// inputs already.
    pub fn get_or_reduce(
        &self,
        table: &str,
        base: &Arc<TableShape>,
        source: &TableRef,
        read: &WalRead,
        floor: Lsn,
        through: Lsn,
    ) -> Result<Arc<TailSnapshot>> {
        let fp = read.fingerprint();
        // Cuts that differ only by WAL with no transaction in this read (keepalive positions,
        // other databases' writes) see the same tail: they share one entry, so statements of
        // a held view and fresh ones do not evict each other's reductions.
        let through = read.newest_through(through);
        {
            let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(c) = entries.get(table) {
                if c.lsns == (floor, through)
                    && c.paths == fp
                    && Arc::ptr_eq(&c.base, base)
                    && c.source == *source
                {
                    return Ok(c.snap.clone());
                }
            }
        }
        let mut shape = TableShape {
            source: source.clone(),
            ..(**base).clone()
        };
        super::tail_schema::extend(&mut shape, read);
        let snap = Arc::new(reduce(&shape, read, floor, through)?);
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                table.to_string(),
                CachedTail {
                    lsns: (floor, through),
                    paths: fp,
                    base: base.clone(),
                    source: source.clone(),
                    snap: snap.clone(),
                },
            );
        Ok(snap)
    }
}

#[cfg(test)]
pub(crate) mod tests;
pub(crate) mod walk;
