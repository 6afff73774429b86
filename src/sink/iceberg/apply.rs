//! Applies WAL transactions to one Iceberg table: inserts become a data file, updates and
//! deletes become position deletes found through a primary-key index, TRUNCATE replaces the
//! table, and the commit records the LSN it covers, so a restart neither loses nor repeats
//! a change.

mod changelog;
mod commit;
mod compact;
mod copied;
mod read;
mod saved;

use std::collections::HashMap;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use iceberg::table::Table;

use super::keyindex::{KeyIndex, Loc, Spill};
use super::keys::Key;
use super::{evolve, PROP_COLUMNS};
use super::{rowdelta, schema as ice_schema};
use crate::catalog::LocalCatalog;
use crate::change::types::PgType;
use crate::change::Lsn;
use crate::change::{Datum, Relation};
use crate::config::MaintenanceSettings;
use crate::config::TableRef;
use crate::error::{Error, Result};
use crate::table::apply::{Committed, Pending, RowKeys};
use crate::table::changelog::ChangeOp;
use crate::table::partition::FilePartitions;
use crate::wal::{Change, Op};

/// A row waiting for the next commit, in the table's column order; values an update left
/// unchanged (TOAST) are read at `previous`, the committed version's place.
type PendingRow = crate::table::apply::PendingRow<Loc>;

/// The sink state of one table.
pub struct TableSink {
    pub source: TableRef,
    pub table: Table,
    arrow: SchemaRef,
    pg: Vec<PgType>,
    names: Vec<String>,
    keyed: bool,
    /// The key columns, and the key of a row as the stream gives it.
    keys: RowKeys,
    /// Source LSN covered by the last commit.
    pub lsn: Lsn,
    index: KeyIndex,
    /// Further copies of a key: only tables keyed by the whole row can have equal rows.
    extra: HashMap<Key, Vec<Loc>>,
    files: Vec<String>,
    /// Where each data file belongs (spec and partition): every file written since the
    /// table was loaded, and the committed ones once read from the manifests (when a delete
    /// first needs one, see `parts_loaded`).
    parts: FilePartitions,
    parts_loaded: bool,
    /// The spec of each delete file written for the next commit that is not of the current
    /// spec (deletes of rows in files of an earlier spec).
    delete_specs: rowdelta::Specs,
    /// Rows changed since the last commit (see [`crate::table::apply`]).
    pending: Pending<Loc>,
    /// Committed rows the changes since the last commit removed.
    deletes: Vec<Loc>,
    /// Data files already written for the next commit: rows spilled from memory while a
    /// large transaction was applied (see [`TableSink::spill`]). Their rows are in `index`.
    staged: Vec<iceberg::spec::DataFile>,
    /// Position delete files already written for the next commit (deletes spilled).
    staged_deletes: Vec<iceberg::spec::DataFile>,
    truncated: bool,
    pending_lsn: Lsn,
    /// The end LSN of the first transaction among the pending changes (recorded as
    /// `skippr.first-lsn`).
    first_pending_lsn: Option<Lsn>,
    /// The source commit time of the transaction being applied, of the one at
    /// `first_pending_lsn` and of the one at `pending_lsn` (Postgres epoch).
    txn_time: Option<i64>,
    first_pending_time: Option<i64>,
    pending_time: Option<i64>,
    pending_changes: u64,
    /// Approximate memory held by pending rows, in bytes.
    pending_bytes: u64,
    /// Relation id -> for each table column, the relation column it comes from.
    rel_maps: HashMap<u32, Vec<Option<usize>>>,
    /// Relation id -> whether its replica identity carries every key column, so that the old
    /// row of an UPDATE or DELETE can be found by key.
    rel_identity: HashMap<u32, bool>,
    /// Compaction, snapshot expiry and orphan cleanup (see `compact.rs`).
    maintenance: MaintenanceSettings,
    last_check: Option<std::time::Instant>,
    last_cleanup: Option<std::time::Instant>,
    /// The snapshot whose index the saved copy on disk holds (nothing to save again).
    index_saved_for: Option<i64>,
    /// The table's changelog table, when it has one (see `changelog.rs`).
    changelog: Option<changelog::Changelog>,
    /// Where the key index is saved between runs; and whether it is loaded. A table is
    /// loaded without it: the index is read (or rebuilt) when the table's first change
    /// arrives, so the tables a run does not change cost no memory and no start-up time.
    index_place: Option<Arc<Spill>>,
    index_ready: bool,
}

impl TableSink {
    /// Loads a table's state: its committed LSN; the key index of its live rows follows when
    /// first needed (see [`TableSink::ensure_index`]: from its copy saved in `index_place`'s
    /// folder when that describes the current snapshot, else rebuilt from the data files).
    /// With no place, the index is neither saved nor moved to disk.
    pub async fn load(
        source: TableRef,
        table: Table,
        index_place: Option<Arc<Spill>>,
    ) -> Result<Self> {
        let arrow = ice_schema::arrow_schema(&table)?;
        let names: Vec<String> = arrow.fields().iter().map(|f| f.name().clone()).collect();
        let pg: Vec<PgType> = arrow
            .fields()
            .iter()
            .map(|f| PgType::from_arrow(f.data_type()))
            .collect();
        let pk = crate::table::primary_key(table.metadata().properties());
        let keys = RowKeys::new(source.clone(), &arrow, key_columns(&table, &names, &pk)?);
        let lsn = super::commit::committed_lsn(&table).unwrap_or_default();
        Ok(Self {
            source,
            table,
            arrow,
            pg,
            names,
            keyed: !pk.is_empty(),
            keys,
            lsn,
            index: KeyIndex::new(index_place.clone()),
            extra: HashMap::new(),
            files: Vec::new(),
            parts: FilePartitions::default(),
            parts_loaded: false,
            delete_specs: rowdelta::Specs::new(),
            pending: Pending::new(!pk.is_empty()),
            deletes: Vec::new(),
            staged: Vec::new(),
            staged_deletes: Vec::new(),
            truncated: false,
            pending_lsn: lsn,
            first_pending_lsn: None,
            txn_time: None,
            first_pending_time: None,
            pending_time: None,
            pending_changes: 0,
            pending_bytes: 0,
            rel_maps: HashMap::new(),
            rel_identity: HashMap::new(),
            maintenance: MaintenanceSettings::default(),
            last_check: None,
            last_cleanup: None,
            index_saved_for: None,
            changelog: None,
            index_place,
            index_ready: false,
        })
    }

    /// Loads the key index (from its saved copy when that describes the current snapshot,
    /// else from the data files), if it is not loaded yet.
    pub async fn ensure_index(&mut self) -> Result<()> {
        if self.index_ready {
            return Ok(());
        }
        let place = self.index_place.clone();
        if !place.is_some_and(|place| self.load_saved_index(&place.dir)) {
            self.build_index().await?;
        }
        self.index_ready = true;
        Ok(())
    }

    /// Learns how a relation's columns map to the table's columns, first evolving the
    /// Iceberg schema when the relation shows a schema change (pending changes are committed
    /// before it, so data and schema changes land in order).
    pub async fn relation(
        &mut self,
        r: &Relation,
        catalog: &LocalCatalog,
        pipeline: &str,
    ) -> Result<()> {
        // A process that lost its pipeline's lease (S3 mode) must not commit a schema either.
        crate::storage::lease::ensure_held(pipeline)?;
        // The table's first change of this run follows: its key index is needed now.
        self.ensure_index().await?;
        let pk = self.primary_key();
        if let Some(evo) = evolve::plan(&self.source, &self.table, &pk, r)? {
            // Pending rows stay pending: fields are only ever appended, widened, renamed or
            // made optional, so a row of the old shape is a row of the new one with NULLs
            // at the end. The schema commits first, the data after it.
            let mut props = self.table.metadata().properties().clone();
            props.insert(
                PROP_COLUMNS.to_string(),
                serde_json::to_string(&evo.columns)?,
            );
            self.table = rowdelta::evolve_schema(catalog, &self.table, evo.schema, props).await?;
            for change in &evo.changes {
                tracing::info!(table = %self.table.identifier(), change = %change, "schema changed");
            }
            for col in &evo.added_with_default {
                tracing::warn!(
                    table = %self.table.identifier(),
                    column = %col,
                    "column added with a DEFAULT: Postgres shows the default on rows that existed before, Iceberg shows NULL for them; run `skipprd sync --resnapshot` to backfill"
                );
            }
            self.refresh_schema()?;
            if !self.keyed {
                // The whole-row key changed shape: index the committed rows again.
                self.build_index().await?;
            }
            self.pending.widen(self.names.len());
            if !self.keyed {
                let keys = &self.keys;
                self.pending.rekey(|values| keys.key_of(values))?;
            }
        }
        self.changelog_widen();
        self.changelog_follow(r, catalog).await?;
        let relaxed = evolve::relax_not_null(r, &self.table)?;
        self.take_optional(relaxed, catalog).await?;
        let columns = evolve::recorded_columns(&self.table);
        let mut map = vec![None; self.names.len()];
        for (ri, c) in r.columns.iter().enumerate() {
            let target = columns
                .as_ref()
                .and_then(|cols| cols.iter().find(|x| x.name == c.name))
                .map(|x| x.target().to_string())
                .unwrap_or_else(|| c.name.clone());
            match self.names.iter().position(|n| *n == target) {
                Some(ti) => map[ti] = Some(ri),
                None => {
                    return Err(Error::unrepresentable(format!(
                        "table {} has column `{}`, which Iceberg table {} does not have, and the table carries no record of its source columns to evolve from; run `skipprd sync --resnapshot`",
                        self.source,
                        c.name,
                        self.table.identifier()
                    )))
                }
            }
        }
        // Replica identity full sends the whole old row; otherwise the old row carries only
        // the identity columns, which must include every column of the key.
        let identity = r.replica_identity == b'f'
            || (self.keyed
                && self
                    .keys
                    .columns()
                    .iter()
                    .all(|k| map[*k].is_some_and(|ri| r.columns[ri].is_key)));
        self.rel_identity.insert(r.id, identity);
        self.rel_maps.insert(r.id, map);
        Ok(())
    }

    /// Commits a schema whose fields were made optional (NOT NULL dropped at the source).
    async fn take_optional(
        &mut self,
        relaxed: Option<(iceberg::spec::Schema, Vec<String>)>,
        catalog: &LocalCatalog,
    ) -> Result<()> {
        let Some((schema, relaxed)) = relaxed else {
            return Ok(());
        };
        let props = self.table.metadata().properties().clone();
        self.table = rowdelta::evolve_schema(catalog, &self.table, schema, props).await?;
        for column in &relaxed {
            tracing::info!(table = %self.table.identifier(), column = %column, "NOT NULL dropped at the source: the field is optional now");
        }
        // Fields keep their places: how relations map onto them is unchanged.
        let maps = std::mem::take(&mut self.rel_maps);
        let identity = std::mem::take(&mut self.rel_identity);
        self.refresh_schema()?;
        self.rel_maps = maps;
        self.rel_identity = identity;
        Ok(())
    }

    /// Refuses an UPDATE or DELETE of a relation whose replica identity does not carry the
    /// key: its old row could not be found, and applying it would lose or duplicate rows.
    fn require_identity(&self, change: &Change) -> Result<()> {
        if self.rel_identity.get(&change.rel).copied().unwrap_or(false) {
            return Ok(());
        }
        let fix = if self.keyed {
            format!(
                "ALTER TABLE {} REPLICA IDENTITY DEFAULT;",
                self.source.quoted()
            )
        } else {
            format!(
                "ALTER TABLE {} REPLICA IDENTITY FULL; (or add a primary key)",
                self.source.quoted()
            )
        };
        Err(Error::unrepresentable(format!(
            "table {}: an {} arrived whose old row is identified by the table's replica identity, which does not include its key ({}), so the row it changes cannot be found; run {fix} then `skipprd sync --resnapshot` (the change is already in the stream)",
            self.source,
            if change.op == Op::Update { "UPDATE" } else { "DELETE" },
            if self.keyed {
                self.primary_key().join(", ")
            } else {
                "the whole row".to_string()
            }
        )))
    }

    /// The error for an UPDATE or DELETE whose old row is not in the table.
    fn missing_row(&self, op: Op) -> Error {
        Error::fatal(format!(
            "table {}: an {} names a row that Iceberg table {} does not hold, so the two have diverged (the table was changed by another writer, or changes were missed); run `skipprd sync --resnapshot` to copy it again",
            self.source,
            if op == Op::Update { "UPDATE" } else { "DELETE" },
            self.table.identifier()
        ))
    }

    fn primary_key(&self) -> Vec<String> {
        if self.keyed {
            self.keys
                .columns()
                .iter()
                .map(|i| self.names[*i].clone())
                .collect()
        } else {
            Vec::new()
        }
    }

    /// Re-reads names, types and key encoders after a schema change.
    fn refresh_schema(&mut self) -> Result<()> {
        let key_names = self.primary_key();
        self.arrow = ice_schema::arrow_schema(&self.table)?;
        self.names = self
            .arrow
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        self.pg = self
            .arrow
            .fields()
            .iter()
            .map(|f| PgType::from_arrow(f.data_type()))
            .collect();
        self.keys = RowKeys::new(
            self.source.clone(),
            &self.arrow,
            key_columns(&self.table, &self.names, &key_names)?,
        );
        self.rel_maps.clear();
        self.rel_identity.clear();
        Ok(())
    }

    fn to_row(&self, rel: u32, tuple: &[Datum]) -> Result<Vec<Datum>> {
        let map = self.rel_maps.get(&rel).ok_or_else(|| {
            Error::fatal(format!(
                "a change of {} arrived before its relation description",
                self.source
            ))
        })?;
        Ok(map
            .iter()
            .map(|m| m.and_then(|i| tuple.get(i).cloned()).unwrap_or(Datum::Null))
            .collect())
    }

    /// The committed rows as change application sees them (see [`Committed`]).
    fn split_rows(&mut self) -> (&mut Pending<Loc>, CommittedRows<'_>) {
        (
            &mut self.pending,
            CommittedRows {
                index: &mut self.index,
                extra: &mut self.extra,
                deletes: &mut self.deletes,
                bytes: &mut self.pending_bytes,
            },
        )
    }

    fn index_insert(&mut self, key: Key, loc: Loc) -> Result<()> {
        if self.keyed {
            self.index.insert(&key, loc)?;
        } else if !self.index.insert_new(&key, loc)? {
            self.extra.entry(key).or_default().push(loc);
        }
        Ok(())
    }

    /// Applies one change of a transaction ending at `end_lsn` (to the changelog too, when
    /// the table has one that does not hold it yet).
    pub fn apply(&mut self, change: &Change, end_lsn: Lsn) -> Result<()> {
        let log = self.logs(end_lsn);
        if end_lsn <= self.lsn {
            if log {
                return Err(Error::fatal(format!(
                    "the changelog of {} is behind the table's own commits; run `skipprd sync --resnapshot`",
                    self.source
                )));
            }
            return Ok(());
        }
        if end_lsn >= self.pending_lsn {
            self.pending_lsn = end_lsn;
            self.pending_time = self.txn_time;
        }
        if self.first_pending_lsn.is_none() {
            self.first_pending_lsn = Some(end_lsn);
            self.first_pending_time = self.txn_time;
        }
        self.pending_changes += 1;
        match change.op {
            // Relation changes are handled by the caller before the changes that follow.
            Op::Relation => {}
            Op::Truncate => {
                if log {
                    self.log_truncate()?;
                }
                self.truncated = true;
                self.pending.clear();
                self.deletes.clear();
                self.index.clear();
                self.extra.clear();
                // Rows spilled before the TRUNCATE are gone with it: the commit leaves their
                // files out (they stay as unreferenced files, as after a failed commit).
                self.staged.clear();
                self.staged_deletes.clear();
                self.delete_specs.clear();
                self.pending_bytes = 0;
            }
            Op::Insert => {
                let row = self.to_row(change.rel, change.new.as_deref().unwrap_or_default())?;
                let key = self.keys.key_of(&row)?;
                self.pending_bytes += row_bytes(&key, &row);
                let (pending, mut committed) = self.split_rows();
                let row = pending.insert(&mut committed, key, row)?;
                if log {
                    let values = row.values.clone();
                    self.log_change(ChangeOp::Insert, values, None);
                }
            }
            Op::Delete => {
                self.require_identity(change)?;
                let old = self.to_row(change.rel, change.old.as_deref().unwrap_or_default())?;
                let key = self.keys.key_of(&old)?;
                let (pending, mut committed) = self.split_rows();
                if !pending.delete(&mut committed, &key, &old)? {
                    return Err(self.missing_row(Op::Delete));
                }
                if log {
                    self.log_change(ChangeOp::Delete, old, None);
                }
            }
            Op::Update => {
                self.require_identity(change)?;
                let mut row = self.to_row(change.rel, change.new.as_deref().unwrap_or_default())?;
                let old_row = match &change.old {
                    Some(o) => Some(self.to_row(change.rel, o)?),
                    None => None,
                };
                let (old_key, new_key) = self.keys.update_keys(&mut row, old_row.as_deref())?;
                let keyed = self.keyed;
                let (pending, mut committed) = self.split_rows();
                let moved = old_key != new_key;
                let Some(updated) =
                    pending.update(&mut committed, &old_key, old_row.as_deref(), new_key, row)?
                else {
                    return Err(self.missing_row(Op::Update));
                };
                // Counted as pending: the row with the values filled from the one it replaced.
                let bytes = row_bytes(&updated.key, &updated.values);
                let logged = log.then(|| (updated.values.clone(), updated.previous));
                self.pending_bytes += bytes;
                if let Some((values, previous)) = logged {
                    // A row that changes its key (or a row without a key, which is its
                    // whole content) is a delete and an insert: replayed in order, the
                    // changelog rebuilds the table.
                    match old_row {
                        Some(old) if moved || !keyed => {
                            self.log_change(ChangeOp::Delete, old, None);
                            self.log_change(ChangeOp::Insert, values, previous);
                        }
                        _ => self.log_change(ChangeOp::Update, values, previous),
                    }
                }
            }
        }
        Ok(())
    }

    /// The LSN up to which this table has committed every change (including stretches of
    /// the stream that had none for it).
    pub fn covered(&self) -> Lsn {
        if self.has_pending() {
            self.committed()
        } else {
            self.pending_lsn
        }
    }

    /// Marks `lsn` as covered even without changes to this table (for exactly-once bookkeeping).
    pub fn advance(&mut self, lsn: Lsn) {
        if lsn > self.pending_lsn {
            self.pending_lsn = lsn;
            self.pending_time = self.txn_time;
        }
    }

    /// A source transaction committed at `commit_lsn` and `commit_micros` (Postgres epoch)
    /// starts.
    pub fn begin_txn(&mut self, commit_lsn: Lsn, commit_micros: i64) {
        self.txn_time = Some(commit_micros);
        self.changelog_txn(commit_lsn);
    }

    pub fn has_pending(&self) -> bool {
        self.pending_changes > 0
    }

    pub fn pending_changes(&self) -> u64 {
        self.pending_changes
    }

    pub fn pending_bytes(&self) -> u64 {
        self.pending_bytes + self.changelog_bytes()
    }
}

/// Memory a pending row is counted as. Values are shared with the WAL segment they came
/// from; count them anyway, with the per-row and per-value overhead, so that a commit is
/// forced before memory grows.
fn row_bytes(key: &Key, values: &[Datum]) -> u64 {
    64 + key.len() as u64 + values_bytes(values)
}

/// The number of each data file the key index points into (its place in `files`), by path.
fn file_numbers(files: &[String]) -> HashMap<&str, u32> {
    files
        .iter()
        .enumerate()
        .map(|(i, p)| (p.as_str(), i as u32))
        .collect()
}

/// Memory a row's values are counted as: their bytes, with the per-value overhead.
fn values_bytes(values: &[Datum]) -> u64 {
    values
        .iter()
        .map(|d| {
            32 + if let Datum::Text(b) = d {
                b.len() as u64
            } else {
                0
            }
        })
        .sum()
}

/// The key columns of `table` (indices into its field `names`): those of its primary key
/// `pk`, or, without one, every column the source writes.
fn key_columns(table: &Table, names: &[String], pk: &[String]) -> Result<Vec<usize>> {
    if pk.is_empty() {
        // Replica identity full: the whole row, as the source has it now, is the key.
        return Ok(whole_row_key(table, names));
    }
    pk.iter()
        .map(|k| {
            names.iter().position(|n| n == k).ok_or_else(|| {
                Error::fatal(format!(
                    "primary key column `{k}` is missing from Iceberg table {}",
                    table.identifier()
                ))
            })
        })
        .collect()
}

/// The columns that make up the key of a table without a primary key: every field the
/// source currently writes (dropped columns and columns replaced by a sibling are out).
pub fn whole_row_key(table: &Table, names: &[String]) -> Vec<usize> {
    match evolve::recorded_columns(table) {
        Some(cols) => names
            .iter()
            .enumerate()
            .filter(|(_, n)| cols.iter().any(|c| c.target() == n.as_str()))
            .map(|(i, _)| i)
            .collect(),
        None => (0..names.len()).collect(),
    }
}

/// The sink's committed rows: the key index, and further copies of a key (tables keyed by
/// the whole row). A row removed there becomes a position delete of the next commit.
struct CommittedRows<'a> {
    index: &'a mut KeyIndex,
    extra: &'a mut HashMap<Key, Vec<Loc>>,
    deletes: &'a mut Vec<Loc>,
    bytes: &'a mut u64,
}

impl Committed for CommittedRows<'_> {
    type Place = Loc;

    fn remove(&mut self, key: &Key, _row: &[Datum], _all: bool) -> Result<Option<Loc>> {
        // A key has one entry in the index; equal rows of a table without a key have their
        // further copies in `extra`.
        let loc = match self.extra.get_mut(key).and_then(Vec::pop) {
            Some(l) => Some(l),
            None => self.index.remove(key)?,
        };
        if let Some(loc) = loc {
            self.deletes.push(loc);
            *self.bytes += std::mem::size_of::<Loc>() as u64;
        }
        Ok(loc)
    }
}
