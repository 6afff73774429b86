//! The neutral change model every stage speaks: positions (`Lsn`), relation descriptions,
//! values, row changes and committed transactions. The source produces these, the WAL stores
//! them, the sink applies them and the query layer reads them; this module depends on nothing
//! else in the crate.

mod lsn;

pub use lsn::Lsn;

use bytes::Bytes;

/// A column of a relation as the stream describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelColumn {
    pub is_key: bool,
    pub name: String,
    pub type_oid: u32,
    pub typmod: i32,
}

/// A relation (table) message: precedes the first change of a table in a session, and the
/// first change after its schema changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    pub id: u32,
    pub namespace: String,
    pub name: String,
    pub replica_identity: u8,
    pub columns: Vec<RelColumn>,
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
