//! Applies WAL transactions to one Iceberg table: inserts become a data file, updates and
//! deletes become position deletes found through a primary-key index, TRUNCATE replaces the
//! table, and the commit records the LSN it covers, so a restart neither loses nor repeats
//! a change.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arrow::array::{new_null_array, Array, ArrayRef, RecordBatch, UInt32Array};
use arrow::compute::{cast, concat_batches, interleave, take};
use arrow::datatypes::DataType;
use arrow::datatypes::SchemaRef;
use bytes::Bytes;
use iceberg::spec::{DataContentType, ManifestStatus};
use iceberg::table::Table;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ProjectionMask;
use parquet::arrow::PARQUET_FIELD_ID_META_KEY;

use super::keys::{Key, KeyEncoder};
use super::writer::TableWriter;
use super::{evolve, PROP_COLUMNS};
use super::{
    rowdelta, schema as ice_schema, PROP_PRIMARY_KEY, SUMMARY_LSN, SUMMARY_PHASE, SUMMARY_PIPELINE,
};
use crate::catalog::LocalCatalog;
use crate::change::Lsn;
use crate::change::{Datum, Relation};
use crate::config::TableRef;
use crate::error::{Context, Error, Result};
use crate::source::postgres::types::{ColumnBuilder, PgType};
use crate::telemetry::metrics;
use crate::wal::{Change, Op};

/// Where a live row is: data file (index into `files`) and row position.
#[derive(Debug, Clone, Copy)]
struct Loc {
    file: u32,
    pos: u64,
}

/// A row waiting for the next commit, in the table's column order.
#[derive(Debug, Clone)]
struct PendingRow {
    key: Key,
    values: Vec<Datum>,
    /// For values the change left unchanged (TOAST): where the previous version lives.
    previous: Option<Loc>,
}

/// The sink state of one table.
pub struct TableSink {
    pub source: TableRef,
    pub table: Table,
    arrow: SchemaRef,
    pg: Vec<PgType>,
    names: Vec<String>,
    key_idx: Vec<usize>,
    keyed: bool,
    keys: KeyEncoder,
    /// Source LSN covered by the last commit.
    pub lsn: Lsn,
    index: HashMap<Key, Loc>,
    /// Further copies of a key: only tables keyed by the whole row can have equal rows.
    extra: HashMap<Key, Vec<Loc>>,
    files: Vec<String>,
    // Changes since the last commit.
    rows: Vec<Option<PendingRow>>,
    by_key: HashMap<Key, usize>,
    extra_pending: HashMap<Key, Vec<usize>>,
    deletes: Vec<Loc>,
    truncated: bool,
    pending_lsn: Lsn,
    pending_changes: u64,
    /// Approximate memory held by pending rows, in bytes.
    pending_bytes: u64,
    /// Relation id -> for each table column, the relation column it comes from.
    rel_maps: HashMap<u32, Vec<Option<usize>>>,
}

impl TableSink {
    /// Loads a table's state: its committed LSN and the key index of its live rows.
    pub async fn load(source: TableRef, table: Table) -> Result<Self> {
        let arrow = ice_schema::arrow_schema(&table)?;
        let names: Vec<String> = arrow.fields().iter().map(|f| f.name().clone()).collect();
        let pg: Vec<PgType> = arrow
            .fields()
            .iter()
            .map(|f| PgType::from_arrow(f.data_type()))
            .collect();
        let pk: Vec<String> = table
            .metadata()
            .properties()
            .get(PROP_PRIMARY_KEY)
            .map(|s| {
                s.split(',')
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        let key_idx: Vec<usize> = if pk.is_empty() {
            // Replica identity full: the whole row, as the source has it now, is the key.
            whole_row_key(&table, &names)
        } else {
            pk.iter()
                .map(|k| {
                    names.iter().position(|n| n == k).ok_or_else(|| {
                        Error::fatal(format!(
                            "primary key column `{k}` is missing from Iceberg table {}",
                            table.identifier()
                        ))
                    })
                })
                .collect::<Result<_>>()?
        };
        let keys = KeyEncoder::new(
            key_idx
                .iter()
                .map(|i| arrow.field(*i).data_type().clone())
                .collect(),
        );
        let lsn = super::commit::committed_lsn(&table).unwrap_or_default();
        let mut sink = Self {
            source,
            table,
            arrow,
            pg,
            names,
            keyed: !pk.is_empty(),
            key_idx,
            keys,
            lsn,
            index: HashMap::new(),
            extra: HashMap::new(),
            files: Vec::new(),
            rows: Vec::new(),
            by_key: HashMap::new(),
            extra_pending: HashMap::new(),
            deletes: Vec::new(),
            truncated: false,
            pending_lsn: lsn,
            pending_changes: 0,
            pending_bytes: 0,
            rel_maps: HashMap::new(),
        };
        sink.build_index().await?;
        Ok(sink)
    }

    /// Rebuilds key -> (file, position) from the live data files and their position deletes.
    async fn build_index(&mut self) -> Result<()> {
        self.index.clear();
        self.extra.clear();
        self.files.clear();
        let meta = self.table.metadata();
        let Some(snapshot) = meta.current_snapshot() else {
            return Ok(());
        };
        let file_io = self.table.file_io();
        let list = self
            .table
            .manifest_list_reader(snapshot)
            .load()
            .await
            .context("reading the manifest list")?;
        let mut data_files = Vec::new();
        let mut delete_files = Vec::new();
        for mf in list.entries() {
            let manifest = mf
                .load_manifest(file_io)
                .await
                .context("reading a manifest")?;
            for entry in manifest.entries() {
                if entry.status() == ManifestStatus::Deleted {
                    continue;
                }
                let df = entry.data_file();
                match df.content_type() {
                    DataContentType::Data => data_files.push(df.file_path().to_string()),
                    DataContentType::PositionDeletes => delete_files.push(df.file_path().to_string()),
                    DataContentType::EqualityDeletes => {
                        return Err(Error::unrepresentable(format!(
                            "Iceberg table {} has equality deletes, which skipprd does not write or apply; it must only be written by skipprd",
                            self.table.identifier()
                        )))
                    }
                }
            }
        }
        let mut deleted: HashSet<(String, i64)> = HashSet::new();
        for path in &delete_files {
            let bytes = self.read_file(path).await?;
            let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)?.build()?;
            for batch in reader {
                let batch = batch?;
                let paths = batch
                    .column(0)
                    .as_any()
                    .downcast_ref::<arrow::array::StringArray>();
                let pos = batch
                    .column(1)
                    .as_any()
                    .downcast_ref::<arrow::array::Int64Array>();
                if let (Some(paths), Some(pos)) = (paths, pos) {
                    for i in 0..batch.num_rows() {
                        deleted.insert((paths.value(i).to_string(), pos.value(i)));
                    }
                }
            }
        }
        for path in data_files.into_iter() {
            let path: String = path;
            let file_no = self.files.len() as u32;
            let bytes = self.read_file(&path).await?;
            let builder = ParquetRecordBatchReaderBuilder::try_new(bytes)?;
            // Match key columns by field id, not position: the file may predate columns
            // added, renamed or widened since. Missing columns read NULL; older types are
            // cast to the current one.
            let file_ids: Vec<Option<i32>> = builder
                .schema()
                .fields()
                .iter()
                .map(|f| {
                    f.metadata()
                        .get(PARQUET_FIELD_ID_META_KEY)
                        .and_then(|v| v.parse().ok())
                })
                .collect();
            let wanted: Vec<(Option<usize>, DataType)> = self
                .key_idx
                .iter()
                .map(|k| {
                    let field = self.arrow.field(*k);
                    let id: Option<i32> = field
                        .metadata()
                        .get(PARQUET_FIELD_ID_META_KEY)
                        .and_then(|v| v.parse().ok());
                    (
                        id.and_then(|id| file_ids.iter().position(|f| *f == Some(id))),
                        field.data_type().clone(),
                    )
                })
                .collect();
            let mut roots: Vec<usize> = wanted.iter().filter_map(|(i, _)| *i).collect();
            roots.sort();
            roots.dedup();
            let mask = ProjectionMask::roots(builder.parquet_schema(), roots.iter().copied());
            let reader = builder.with_projection(mask).build()?;
            let mut pos: u64 = 0;
            for batch in reader {
                let batch = batch?;
                let mut cols: Vec<ArrayRef> = Vec::with_capacity(wanted.len());
                for (file_col, dt) in &wanted {
                    let col = match file_col.and_then(|i| roots.iter().position(|r| *r == i)) {
                        Some(j) => {
                            let c = batch.column(j);
                            if c.data_type() == dt {
                                c.clone()
                            } else {
                                cast(c.as_ref(), dt)?
                            }
                        }
                        None => new_null_array(dt, batch.num_rows()),
                    };
                    cols.push(col);
                }
                for row in 0..batch.num_rows() {
                    let p = pos + row as u64;
                    if deleted.contains(&(path.clone(), p as i64)) {
                        continue;
                    }
                    if let Some(key) = self.keys.from_arrays(&cols, row) {
                        self.index_insert(
                            key,
                            Loc {
                                file: file_no,
                                pos: p,
                            },
                        );
                    }
                }
                pos += batch.num_rows() as u64;
            }
            self.files.push(path);
        }
        tracing::info!(table = %self.table.identifier(), rows = self.index.len(), files = self.files.len(), "key index loaded");
        Ok(())
    }

    async fn read_file(&self, path: &str) -> Result<Bytes> {
        self.table
            .file_io()
            .new_input(path)?
            .read()
            .await
            .with_context(|| format!("reading {path}"))
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
        let pk = self.primary_key();
        if let Some(evo) = evolve::plan(&self.source, &self.table, &pk, r)? {
            // Pending rows stay pending: fields are only ever appended, widened, renamed or
            // made optional, so a row of the old shape is a row of the new one with NULLs
            // at the end. The schema commits first, the data after it.
            let _ = pipeline;
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
            let width = self.names.len();
            for row in self.rows.iter_mut().flatten() {
                row.values.resize(width, Datum::Null);
            }
            if !self.keyed {
                self.by_key.clear();
                self.extra_pending.clear();
                for i in 0..self.rows.len() {
                    let Some(row) = &self.rows[i] else { continue };
                    let key = self.key_of(&row.values)?;
                    if self.by_key.contains_key(&key) {
                        self.extra_pending.entry(key.clone()).or_default().push(i);
                    } else {
                        self.by_key.insert(key.clone(), i);
                    }
                    if let Some(row) = self.rows[i].as_mut() {
                        row.key = key;
                    }
                }
            }
        }
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
        self.rel_maps.insert(r.id, map);
        Ok(())
    }

    fn primary_key(&self) -> Vec<String> {
        if self.keyed {
            self.key_idx
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
        self.key_idx = if self.keyed {
            key_names
                .iter()
                .map(|k| {
                    self.names.iter().position(|n| n == k).ok_or_else(|| {
                        Error::fatal(format!(
                            "primary key column `{k}` is missing from Iceberg table {}",
                            self.table.identifier()
                        ))
                    })
                })
                .collect::<Result<_>>()?
        } else {
            whole_row_key(&self.table, &self.names)
        };
        self.keys = KeyEncoder::new(
            self.key_idx
                .iter()
                .map(|i| self.arrow.field(*i).data_type().clone())
                .collect(),
        );
        self.rel_maps.clear();
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

    fn key_of(&self, row: &[Datum]) -> Result<Key> {
        let mut texts = Vec::with_capacity(self.key_idx.len());
        let mut types = Vec::with_capacity(self.key_idx.len());
        for &i in &self.key_idx {
            match &row[i] {
                Datum::Text(b) => texts.push(Some(std::str::from_utf8(b).map_err(|_| {
                    Error::unrepresentable(format!(
                        "table {}, column `{}`: a key value is not UTF-8",
                        self.source, self.names[i]
                    ))
                })?)),
                Datum::Null => texts.push(None),
                Datum::Unchanged => {
                    return Err(Error::fatal(format!(
                        "table {}: the key column `{}` arrived without a value",
                        self.source, self.names[i]
                    )))
                }
            }
            types.push(self.pg[i].clone());
        }
        self.keys.from_text(&types, &texts).map_err(|e| {
            Error::unrepresentable(format!(
                "table {}: a key value cannot be read: {e}",
                self.source
            ))
        })
    }

    /// Removes the live version of `key`, wherever it is.
    fn remove(&mut self, key: &Key) -> Option<PendingOrLoc> {
        if let Some(i) = self.extra_pending.get_mut(key).and_then(Vec::pop) {
            return self.rows[i].take().map(PendingOrLoc::Pending);
        }
        if let Some(i) = self.by_key.remove(key) {
            return self.rows[i].take().map(PendingOrLoc::Pending);
        }
        let loc = match self.extra.get_mut(key).and_then(Vec::pop) {
            Some(l) => Some(l),
            None => self.index.remove(key),
        };
        loc.map(|loc| {
            self.deletes.push(loc);
            PendingOrLoc::Loc(loc)
        })
    }

    fn index_insert(&mut self, key: Key, loc: Loc) {
        if self.keyed {
            self.index.insert(key, loc);
        } else {
            match self.index.entry(key) {
                std::collections::hash_map::Entry::Occupied(e) => {
                    self.extra.entry(e.key().clone()).or_default().push(loc);
                }
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(loc);
                }
            }
        }
    }

    /// Applies one change of a transaction ending at `end_lsn`.
    pub fn apply(&mut self, change: &Change, end_lsn: Lsn) -> Result<()> {
        self.pending_lsn = self.pending_lsn.max(end_lsn);
        self.pending_changes += 1;
        match change.op {
            // Relation changes are handled by the caller before the changes that follow.
            Op::Relation => {}
            Op::Truncate => {
                self.truncated = true;
                self.rows.clear();
                self.by_key.clear();
                self.extra_pending.clear();
                self.deletes.clear();
                self.index.clear();
                self.extra.clear();
            }
            Op::Insert => {
                let row = self.to_row(change.rel, change.new.as_deref().unwrap_or_default())?;
                let key = self.key_of(&row)?;
                // Without a primary key the whole row is the key: equal rows may coexist.
                if self.keyed {
                    self.remove(&key);
                }
                self.push(key, row, None);
            }
            Op::Delete => {
                let old = self.to_row(change.rel, change.old.as_deref().unwrap_or_default())?;
                let key = self.key_of(&old)?;
                self.remove(&key);
            }
            Op::Update => {
                let mut row = self.to_row(change.rel, change.new.as_deref().unwrap_or_default())?;
                let old_row = match &change.old {
                    Some(o) => Some(self.to_row(change.rel, o)?),
                    None => None,
                };
                // A full old row (replica identity full) carries the values a TOASTed column
                // left unchanged; a key-only old row has NULL there and gives nothing.
                if let Some(old) = &old_row {
                    for (d, o) in row.iter_mut().zip(old) {
                        if matches!(d, Datum::Unchanged) && matches!(o, Datum::Text(_)) {
                            *d = o.clone();
                        }
                    }
                }
                let new_key = self.key_of(&row)?;
                let old_key = match &old_row {
                    Some(o) => self.key_of(o)?,
                    None => new_key.clone(),
                };
                let previous = self.remove(&old_key);
                // With a primary key, a row already holding the new key is replaced; rows
                // keyed by their whole content may be equal and all stay.
                if self.keyed && old_key != new_key {
                    self.remove(&new_key);
                }
                let mut previous_loc = None;
                if row.iter().any(|d| matches!(d, Datum::Unchanged)) {
                    match previous {
                        Some(PendingOrLoc::Pending(p)) => {
                            for (i, d) in row.iter_mut().enumerate() {
                                if matches!(d, Datum::Unchanged) {
                                    *d = p.values[i].clone();
                                }
                            }
                            previous_loc = p.previous;
                        }
                        Some(PendingOrLoc::Loc(loc)) => previous_loc = Some(loc),
                        None => {
                            return Err(Error::fatal(format!(
                                "table {}: an update left a large (TOAST) value unchanged, but the previous version of the row is not in Iceberg; run `skipprd sync --resnapshot`",
                                self.source
                            )))
                        }
                    }
                }
                self.push(new_key, row, previous_loc);
            }
        }
        Ok(())
    }

    fn push(&mut self, key: Key, values: Vec<Datum>, previous: Option<Loc>) {
        let i = self.rows.len();
        // Values are shared with the WAL segment they came from; count them anyway, with the
        // per-row and per-value overhead, so that a commit is forced before memory grows.
        self.pending_bytes += 64
            + key.len() as u64
            + values
                .iter()
                .map(|d| {
                    32 + if let Datum::Text(b) = d {
                        b.len() as u64
                    } else {
                        0
                    }
                })
                .sum::<u64>();
        if !self.keyed && self.by_key.contains_key(&key) {
            // An equal row is already pending: keep both (tables keyed by the whole row).
            self.extra_pending.entry(key.clone()).or_default().push(i);
        } else {
            self.by_key.insert(key.clone(), i);
        }
        self.rows.push(Some(PendingRow {
            key,
            values,
            previous,
        }));
    }

    /// The LSN up to which this table has committed every change (including stretches of
    /// the stream that had none for it).
    pub fn covered(&self) -> Lsn {
        if self.has_pending() {
            self.lsn
        } else {
            self.pending_lsn
        }
    }

    /// Marks `lsn` as covered even without changes to this table (for exactly-once bookkeeping).
    pub fn advance(&mut self, lsn: Lsn) {
        self.pending_lsn = self.pending_lsn.max(lsn);
    }

    pub fn has_pending(&self) -> bool {
        self.pending_changes > 0
    }

    pub fn pending_changes(&self) -> u64 {
        self.pending_changes
    }

    pub fn pending_bytes(&self) -> u64 {
        self.pending_bytes
    }

    /// Commits everything applied since the last commit in one Iceberg snapshot.
    pub async fn commit(&mut self, catalog: &LocalCatalog, pipeline: &str) -> Result<()> {
        if !self.has_pending() {
            return Ok(());
        }
        let live: Vec<PendingRow> = std::mem::take(&mut self.rows)
            .into_iter()
            .flatten()
            .collect();
        let batch = self.build_batch(&live).await?;
        let commit_id = uuid::Uuid::now_v7().simple().to_string();
        let mut data_files = Vec::new();
        let mut new_file: Option<String> = None;
        if batch.num_rows() > 0 {
            let mut w =
                TableWriter::new(&self.table, format!("cdc-{commit_id}"), u64::MAX / 4).await?;
            w.write(batch).await?;
            let (files, _) = w.close().await?;
            if files.len() != 1 {
                return Err(Error::fatal(
                    "a change batch was written to more than one file",
                ));
            }
            new_file = Some(files[0].file_path().to_string());
            data_files = files;
        }
        let deletes: Vec<(String, i64)> = self
            .deletes
            .iter()
            .map(|l| (self.files[l.file as usize].clone(), l.pos as i64))
            .collect();
        let mut delete_files = Vec::new();
        if !deletes.is_empty() && !self.truncated {
            delete_files.push(
                rowdelta::write_position_deletes(&self.table, deletes, &format!("cdc-{commit_id}"))
                    .await?,
            );
        }
        let props = HashMap::from([
            (SUMMARY_LSN.to_string(), self.pending_lsn.to_string()),
            (SUMMARY_PHASE.to_string(), "cdc".to_string()),
            (SUMMARY_PIPELINE.to_string(), pipeline.to_string()),
        ]);
        self.table = rowdelta::commit(
            catalog,
            &self.table,
            data_files,
            delete_files,
            self.truncated,
            props,
        )
        .await?;
        // The index follows the commit: truncation dropped every file, new rows are appended.
        if self.truncated {
            self.files.clear();
            self.index.clear();
            self.extra.clear();
        }
        if let Some(path) = new_file {
            let file_no = self.files.len() as u32;
            self.files.push(path);
            for (pos, row) in live.into_iter().enumerate() {
                self.index_insert(
                    row.key,
                    Loc {
                        file: file_no,
                        pos: pos as u64,
                    },
                );
            }
        }
        tracing::info!(table = %self.table.identifier(), changes = self.pending_changes, lsn = %self.pending_lsn, "changes committed");
        let table_name = self.table.identifier().name().to_string();
        let labels = [("pipeline", pipeline), ("table", table_name.as_str())];
        metrics::add(
            "skippr_commits_total",
            "Iceberg commits of changes.",
            &labels,
            1.0,
        );
        metrics::add(
            "skippr_committed_changes_total",
            "Row changes committed to Iceberg.",
            &labels,
            self.pending_changes as f64,
        );
        self.lsn = self.pending_lsn;
        self.by_key.clear();
        self.extra_pending.clear();
        self.deletes.clear();
        self.truncated = false;
        self.pending_changes = 0;
        self.pending_bytes = 0;
        Ok(())
    }

    /// Decodes pending rows into a batch, filling values an update left unchanged from the
    /// previous version of the row in Iceberg.
    async fn build_batch(&self, live: &[PendingRow]) -> Result<RecordBatch> {
        let mut builders: Vec<ColumnBuilder> = self
            .arrow
            .fields()
            .iter()
            .zip(&self.pg)
            .map(|(f, pg)| ColumnBuilder::new(pg, f.data_type(), live.len()))
            .collect();
        for row in live {
            for (i, (b, d)) in builders.iter_mut().zip(&row.values).enumerate() {
                match d {
                    Datum::Null | Datum::Unchanged => b.append_null(),
                    Datum::Text(v) => {
                        let s = std::str::from_utf8(v).map_err(|_| {
                            Error::unrepresentable(format!(
                                "table {}, column `{}`: the value is not UTF-8",
                                self.source, self.names[i]
                            ))
                        })?;
                        b.append_text(s).map_err(|e| {
                            Error::unrepresentable(format!(
                                "table {}, column `{}`: {}",
                                self.source, self.names[i], e.0
                            ))
                        })?;
                    }
                }
            }
        }
        let mut columns: Vec<ArrayRef> = builders.iter_mut().map(|b| b.finish()).collect();

        // Values left unchanged by an update: read the previous versions and interleave them.
        let needs: Vec<(usize, Loc)> = live
            .iter()
            .enumerate()
            .filter(|(_, r)| r.values.iter().any(|d| matches!(d, Datum::Unchanged)))
            .filter_map(|(i, r)| r.previous.map(|l| (i, l)))
            .collect();
        if !needs.is_empty() {
            let previous = self
                .read_rows(&needs.iter().map(|(_, l)| *l).collect::<Vec<_>>())
                .await?;
            for (c, col) in columns.iter_mut().enumerate() {
                let mut indices: Vec<(usize, usize)> = (0..live.len()).map(|r| (0, r)).collect();
                let mut any = false;
                for (k, (r, _)) in needs.iter().enumerate() {
                    if matches!(live[*r].values[c], Datum::Unchanged) {
                        indices[*r] = (1, k);
                        any = true;
                    }
                }
                if any {
                    *col = interleave(&[col.as_ref(), previous.column(c).as_ref()], &indices)?;
                }
            }
        }
        Ok(RecordBatch::try_new(self.arrow.clone(), columns)?)
    }

    /// Reads whole rows at `locs`, in that order.
    async fn read_rows(&self, locs: &[Loc]) -> Result<RecordBatch> {
        let mut by_file: HashMap<u32, Vec<(usize, u64)>> = HashMap::new();
        for (i, l) in locs.iter().enumerate() {
            by_file.entry(l.file).or_default().push((i, l.pos));
        }
        let mut parts: Vec<RecordBatch> = Vec::new();
        let mut order: Vec<usize> = Vec::new();
        for (file, wanted) in by_file {
            let bytes = self.read_file(&self.files[file as usize]).await?;
            let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)?.build()?;
            let batches: Vec<RecordBatch> = reader.collect::<std::result::Result<_, _>>()?;
            let all = concat_batches(&self.arrow_file_schema(&batches), &batches)?;
            let idx = UInt32Array::from_iter_values(wanted.iter().map(|(_, p)| *p as u32));
            let cols = all
                .columns()
                .iter()
                .map(|c| take(c.as_ref(), &idx, None))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            parts.push(RecordBatch::try_new(all.schema(), cols)?);
            order.extend(wanted.iter().map(|(i, _)| *i));
        }
        let schema = parts
            .first()
            .map(|p| p.schema())
            .unwrap_or_else(|| self.arrow.clone());
        let merged = concat_batches(&schema, &parts)?;
        // Put rows back in the order asked for; columns follow the table schema by name.
        let mut inverse = vec![0u32; order.len()];
        for (pos, i) in order.iter().enumerate() {
            inverse[*i] = pos as u32;
        }
        let idx = UInt32Array::from(inverse);
        let cols = self
            .arrow
            .fields()
            .iter()
            .map(|f| match merged.schema().index_of(f.name()) {
                Ok(i) => take(merged.column(i).as_ref(), &idx, None).map_err(Error::from),
                Err(_) => Ok(new_null_array(f.data_type(), locs.len())),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(RecordBatch::try_new(self.arrow.clone(), cols)?)
    }

    fn arrow_file_schema(&self, batches: &[RecordBatch]) -> SchemaRef {
        batches
            .first()
            .map(|b| b.schema())
            .unwrap_or_else(|| Arc::clone(&self.arrow))
    }
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

enum PendingOrLoc {
    Pending(PendingRow),
    Loc(Loc),
}
