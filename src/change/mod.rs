//! The neutral change model every stage speaks: positions (`Lsn`), relation descriptions,
//! values, row changes and committed transactions. The source produces these, the WAL stores
//! them, the sink applies them and the query layer reads them; this module depends on nothing
//! else in the crate but `error`. It also holds what those stages share about the source's
//! tables (`table`, `types`, `schema`) and the seam the source streams into (`TxnAppender`).

mod appender;
mod lsn;
pub mod schema;
pub mod table;
pub mod types;

pub use appender::TxnAppender;
pub use lsn::Lsn;
pub use table::TableRef;

use bytes::Bytes;

/// How a column's values are stored: its type resolved through domains, and for arrays the
/// element type. What `pg_type` said about the column's declared type when the relation
/// message arrived, so that replay never needs the source's catalog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeInfo {
    pub oid: u32,
    pub typmod: i32,
    /// `pg_type.typtype`: b(ase), e(num), d(omain), r(ange), c(omposite), m(ultirange), p(seudo).
    pub typtype: char,
    /// For arrays, the element type.
    pub element: Option<Box<TypeInfo>>,
}

/// A column of a relation: what the stream said (name, declared type, key flag) and what
/// the source's catalog said about it when the relation message arrived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelColumn {
    pub is_key: bool,
    pub name: String,
    /// The declared type (a domain, not its base) and modifier, as the stream reports them.
    pub type_oid: u32,
    pub typmod: i32,
    /// `pg_type.typname` of the declared type (names sibling columns, `<column>__<typname>`).
    pub type_name: String,
    /// The type the values are stored as.
    pub storage: TypeInfo,
    /// The column's number (`attnum`): a renamed column keeps it. `None` when the catalog
    /// could not say for certain which column this was (see `source::postgres::relation`).
    pub attnum: Option<i16>,
    /// Whether rows that existed before the column was added show a value in Postgres (a
    /// DEFAULT, or a value stored when the column was added). `None`: unknown.
    pub has_default: Option<bool>,
    /// Whether the column was NOT NULL when the catalog was read. `None`: unknown. Later DDL
    /// may already show here, so only ever relax a schema with it, never tighten it.
    pub not_null: Option<bool>,
}

impl RelColumn {
    /// A column described by the stream alone, with the storage type of a built-in base
    /// type; for tests and for sources that have nothing more to say.
    pub fn plain(is_key: bool, name: &str, type_oid: u32, typmod: i32, type_name: &str) -> Self {
        Self {
            is_key,
            name: name.to_string(),
            type_oid,
            typmod,
            type_name: type_name.to_string(),
            storage: TypeInfo {
                oid: type_oid,
                typmod,
                typtype: 'b',
                element: None,
            },
            attnum: None,
            has_default: None,
            not_null: None,
        }
    }
}

/// A relation (table) description: precedes the first change of a table in a session, and
/// the first change after its schema changed. Self-describing: every change in the WAL is
/// read with the description in effect when Postgres wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    pub id: u32,
    pub namespace: String,
    pub name: String,
    pub replica_identity: u8,
    pub columns: Vec<RelColumn>,
}

impl Relation {
    /// `schema.table`, for messages.
    pub fn qualified(&self) -> String {
        format!("{}.{}", self.namespace, self.name)
    }

    /// The error for a tuple whose width does not match this description: a change is
    /// never padded or cut to fit.
    pub fn width_mismatch(&self, got: usize) -> String {
        format!(
            "table {}: a change carries {got} columns but the table's description in effect has {}; skipprd stops rather than guess which value belongs to which column",
            self.qualified(),
            self.columns.len()
        )
    }
}

/// One value of a tuple.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Datum {
    Null,
    /// An out-of-line TOAST value the change did not touch: keep the previous value.
    Unchanged,
    Text(Bytes),
}

/// What a change does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Insert,
    Update,
    Delete,
    Truncate,
    /// A relation's description changed inside the transaction (DDL between changes).
    Relation,
}

/// One row change (or a truncate) of one relation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub op: Op,
    pub rel: u32,
    /// The old key (or old row) for updates that change the key, and for deletes.
    pub old: Option<Vec<Datum>>,
    /// The new row for inserts and updates.
    pub new: Option<Vec<Datum>>,
    /// The new description, for `Op::Relation`.
    pub relation: Option<Relation>,
}

/// A committed source transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Txn {
    pub xid: u32,
    pub commit_lsn: Lsn,
    /// The LSN just past the commit record: what Postgres is acknowledged with, and what
    /// Iceberg commits record.
    pub end_lsn: Lsn,
    pub commit_time_micros: i64,
    pub changes: Vec<Change>,
}

#[cfg(test)]
impl Txn {
    /// A test transaction of `changes` whose commit ends at `end` (its id; committed at
    /// `end - 1`, at time 0).
    pub fn ending_at(end: u64, changes: Vec<Change>) -> Self {
        Self {
            xid: end as u32,
            commit_lsn: Lsn(end - 1),
            end_lsn: Lsn(end),
            commit_time_micros: 0,
            changes,
        }
    }
}
