//! The table layer, change application: what an insert, an update, a delete and a TRUNCATE do
//! to a table's rows, decided once. The sink applies the stream's changes with it before it
//! commits them; the live tail (`query::tail`) applies the WAL's uncommitted changes with it
//! to show them before that commit. Both hold the changes since their committed snapshot as
//! [`Pending`] rows and learn about the committed rows only through [`Committed`]: the sink
//! through its key index (a removed row's file and position), the tail through the set of
//! keys it hides from the committed scan.
//!
//! Rules: with a primary key, a key has one live row (an insert replaces it, an update that
//! moves a row to a key already taken replaces that row); without one the whole row is the
//! key and equal rows are separate copies (a delete or an update removes one copy, the newest
//! pending one first). Values a TOASTed column left unchanged in an update are taken from the
//! row it replaces: from a pending row's values, or, for a committed row, from its
//! [`Committed::Place`], which the pending row keeps until the commit reads them there.

use std::collections::HashMap;

use arrow::datatypes::SchemaRef;

use super::keys::{Key, KeyEncoder};
use crate::change::types::PgType;
use crate::change::{Datum, TableRef};
use crate::error::{Error, Result};

/// The rows committed before the pending changes, as change application needs them.
pub trait Committed {
    /// Where a committed row's values can be read later: a file and position for the sink,
    /// the key itself for the live tail.
    type Place: Clone;

    /// Removes the committed version of `key` (every copy when `all`, else one): where the
    /// removed row lived, or `None` when no committed row has the key. `row` is the change's
    /// row that carries the key.
    fn remove(&mut self, key: &Key, row: &[Datum], all: bool) -> Result<Option<Self::Place>>;
}

/// A row changed since the committed snapshot, in the table's column order.
#[derive(Debug, Clone)]
pub struct PendingRow<P> {
    pub key: Key,
    pub values: Vec<Datum>,
    /// Where the values an update left unchanged (`Datum::Unchanged`) are to be read.
    pub previous: Option<P>,
}

/// What removing a key found: a pending row (taken out), or a committed one.
enum Removed<P> {
    Pending(PendingRow<P>),
    Committed(P),
}

/// The rows changed since the committed snapshot, in the order they were written.
#[derive(Debug, Clone)]
pub struct Pending<P> {
    keyed: bool,
    rows: Vec<Option<PendingRow<P>>>,
    /// The pending row of each key (the oldest copy, for tables keyed by the whole row).
    by_key: HashMap<Key, usize>,
    /// Further copies of a key: only tables keyed by the whole row can have equal rows.
    extra: HashMap<Key, Vec<usize>>,
}

impl<P: Clone> Pending<P> {
    /// No pending rows; `keyed`: the table has a primary key.
    pub fn new(keyed: bool) -> Self {
        Self {
            keyed,
            rows: Vec::new(),
            by_key: HashMap::new(),
            extra: HashMap::new(),
        }
    }

    pub fn keyed(&self) -> bool {
        self.keyed
    }

    /// Forgets every pending row (a TRUNCATE, or a commit that wrote them).
    pub fn clear(&mut self) {
        self.rows.clear();
        self.by_key.clear();
        self.extra.clear();
    }

    /// The live pending rows, oldest first.
    pub fn rows(&self) -> impl Iterator<Item = &PendingRow<P>> {
        self.rows.iter().flatten()
    }

    /// Whether no row was written since the last [`Pending::clear`] or [`Pending::take`].
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The places pending rows read their unchanged values at (to move them when the
    /// committed rows are renumbered).
    pub fn places_mut(&mut self) -> impl Iterator<Item = &mut P> {
        self.rows
            .iter_mut()
            .flatten()
            .filter_map(|r| r.previous.as_mut())
    }

    /// Widens every pending row to `width` columns, NULL in the new ones (columns added).
    pub fn widen(&mut self, width: usize) {
        for row in self.rows.iter_mut().flatten() {
            row.values.resize(width, Datum::Null);
        }
    }

    /// Keys every pending row again with `key_of` (a table keyed by its whole row whose
    /// columns changed).
    pub fn rekey(&mut self, key_of: impl Fn(&[Datum]) -> Result<Key>) -> Result<()> {
        self.by_key.clear();
        self.extra.clear();
        for i in 0..self.rows.len() {
            let Some(row) = self.rows[i].as_mut() else {
                continue;
            };
            row.key = key_of(&row.values)?;
            let key = row.key.clone();
            if !self.keyed && self.by_key.contains_key(&key) {
                self.extra.entry(key).or_default().push(i);
            } else {
                self.by_key.insert(key, i);
            }
        }
        Ok(())
    }

    /// Takes the live pending rows out, oldest first.
    pub fn take(&mut self) -> Vec<PendingRow<P>> {
        self.by_key.clear();
        self.extra.clear();
        std::mem::take(&mut self.rows)
            .into_iter()
            .flatten()
            .collect()
    }

    /// An INSERT of `row` under `key`.
    pub fn insert<C: Committed<Place = P>>(
        &mut self,
        committed: &mut C,
        key: Key,
        row: Vec<Datum>,
    ) -> Result<&PendingRow<P>> {
        if self.keyed {
            self.remove(committed, &key, &row)?;
        }
        Ok(self.push(key, row, None))
    }

    /// A DELETE of the row `old` under `key`: whether a row had the key.
    pub fn delete<C: Committed<Place = P>>(
        &mut self,
        committed: &mut C,
        key: &Key,
        old: &[Datum],
    ) -> Result<bool> {
        Ok(self.remove(committed, key, old)?.is_some())
    }

    /// An UPDATE of the row under `old_key` (carried by `old`, the old row; by `row` when
    /// the change has none) to `row` under `new_key`. `None` when no row had the old
    /// key; else the row as it now is pending, its unchanged values filled where the row it
    /// replaces was pending, and its `previous` naming where the others are.
    pub fn update<C: Committed<Place = P>>(
        &mut self,
        committed: &mut C,
        old_key: &Key,
        old: Option<&[Datum]>,
        new_key: Key,
        mut row: Vec<Datum>,
    ) -> Result<Option<&PendingRow<P>>> {
        let Some(previous) = self.remove(committed, old_key, old.unwrap_or(&row))? else {
            return Ok(None);
        };
        // With a primary key, a row already holding the new key is replaced; rows keyed by
        // their whole content may be equal and all stay.
        if self.keyed && *old_key != new_key {
            self.remove(committed, &new_key, &row)?;
        }
        let mut place = None;
        if row.iter().any(|d| matches!(d, Datum::Unchanged)) {
            match previous {
                Removed::Pending(p) => {
                    for (d, v) in row.iter_mut().zip(p.values) {
                        if matches!(d, Datum::Unchanged) {
                            *d = v;
                        }
                    }
                    place = p.previous;
                }
                Removed::Committed(at) => place = Some(at),
            }
        }
        Ok(Some(self.push(new_key, row, place)))
    }

    /// Removes the live version of `key`: the newest pending copy, else a committed one.
    fn remove<C: Committed<Place = P>>(
        &mut self,
        committed: &mut C,
        key: &Key,
        row: &[Datum],
    ) -> Result<Option<Removed<P>>> {
        if let Some(i) = self.extra.get_mut(key).and_then(Vec::pop) {
            return Ok(self.rows[i].take().map(Removed::Pending));
        }
        if let Some(i) = self.by_key.remove(key) {
            return Ok(self.rows[i].take().map(Removed::Pending));
        }
        Ok(committed
            .remove(key, row, self.keyed)?
            .map(Removed::Committed))
    }

    fn push(&mut self, key: Key, values: Vec<Datum>, previous: Option<P>) -> &PendingRow<P> {
        let i = self.rows.len();
        if !self.keyed && self.by_key.contains_key(&key) {
            // An equal row is already pending: keep both (tables keyed by the whole row).
            self.extra.entry(key.clone()).or_default().push(i);
        } else {
            self.by_key.insert(key.clone(), i);
        }
        self.rows.push(None);
        self.rows[i].insert(PendingRow {
            key,
            values,
            previous,
        })
    }
}

/// Values a TOASTed column left unchanged in `row`, taken from a full old row (replica
/// identity full) where it has them; a key-only old row has NULL there and gives nothing.
pub fn fill_from_old(row: &mut [Datum], old: &[Datum]) {
    for (d, o) in row.iter_mut().zip(old) {
        if matches!(d, Datum::Unchanged) && matches!(o, Datum::Text(_)) {
            *d = o.clone();
        }
    }
}

/// How a table's rows are keyed: the key columns (the primary key, or every column the
/// source writes for a table without one) and the key of a row as the stream gives it.
#[derive(Debug, Clone)]
pub struct RowKeys {
    source: TableRef,
    names: Vec<String>,
    pg: Vec<PgType>,
    columns: Vec<usize>,
    encoder: KeyEncoder,
}

impl RowKeys {
    /// The keys of rows of `schema` (the table's Arrow schema) by the columns `columns`.
    pub fn new(source: TableRef, schema: &SchemaRef, columns: Vec<usize>) -> Self {
        let fields = schema.fields();
        Self {
            source,
            names: fields.iter().map(|f| f.name().clone()).collect(),
            pg: fields
                .iter()
                .map(|f| PgType::from_arrow(f.data_type()))
                .collect(),
            encoder: KeyEncoder::new(
                columns
                    .iter()
                    .map(|i| fields[*i].data_type().clone())
                    .collect(),
            ),
            columns,
        }
    }

    /// Encodes keys of the key columns' types.
    pub fn encoder(&self) -> &KeyEncoder {
        &self.encoder
    }

    /// The key columns, as indices into the schema.
    pub fn columns(&self) -> &[usize] {
        &self.columns
    }

    /// The key of `row` (in the schema's column order).
    pub fn key_of(&self, row: &[Datum]) -> Result<Key> {
        let mut texts = Vec::with_capacity(self.columns.len());
        let mut types = Vec::with_capacity(self.columns.len());
        for &i in &self.columns {
            match row.get(i) {
                Some(Datum::Text(b)) => texts.push(Some(std::str::from_utf8(b).map_err(|_| {
                    Error::unrepresentable(format!(
                        "table {}, column `{}`: a key value is not UTF-8",
                        self.source, self.names[i]
                    ))
                })?)),
                Some(Datum::Unchanged) => {
                    return Err(Error::fatal(format!(
                        "table {}: the key column `{}` arrived without a value",
                        self.source, self.names[i]
                    )))
                }
                Some(Datum::Null) | None => texts.push(None),
            }
            types.push(self.pg[i].clone());
        }
        self.encoder.from_text(&types, &texts).map_err(|e| {
            Error::unrepresentable(format!(
                "table {}: a key value cannot be read: {e}",
                self.source
            ))
        })
    }

    /// An UPDATE's row `row` with the values a TOASTed column left unchanged taken from the
    /// full old row `old` where it has them (see [`fill_from_old`]), and its old and new
    /// keys (the same when the change carries no old row).
    pub fn update_keys(&self, row: &mut [Datum], old: Option<&[Datum]>) -> Result<(Key, Key)> {
        if let Some(old) = old {
            fill_from_old(row, old);
        }
        let new_key = self.key_of(row)?;
        let old_key = match old {
            Some(o) => self.key_of(o)?,
            None => new_key.clone(),
        };
        Ok((old_key, new_key))
    }

    /// The key values of `row` as text, in key order (a value that is not UTF-8 as `None`:
    /// [`RowKeys::key_of`] refuses it anyway).
    pub fn texts(&self, row: &[Datum]) -> Vec<Option<String>> {
        self.columns
            .iter()
            .map(|&i| match row.get(i) {
                Some(Datum::Text(b)) => std::str::from_utf8(b).ok().map(str::to_string),
                _ => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
