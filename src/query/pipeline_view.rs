//! Queries, one pipeline as a statement sees it: the data of a read view (the LSN it shows,
//! the WAL as read, each table's pinned Iceberg metadata). `view.rs` makes it, `as_of.rs`
//! moves it back in time; both read it from here, so neither needs the other's module.

use std::collections::HashMap;

use iceberg::table::Table;

use super::wal_read::WalRead;
use crate::change::Lsn;

/// One pipeline as a statement sees it.
pub struct PipelineView {
    pub pipeline: String,
    /// The source commit LSN the view shows: every transaction of the pipeline's tables
    /// ending at or before it, and none after.
    pub lsn: Lsn,
    /// The WAL as read (decoded segments are shared, so holding a view costs no copy).
    pub read: WalRead,
    /// Each table of the pipeline at the Iceberg metadata loaded for this view.
    pub tables: HashMap<String, Table>,
    /// Tables whose state at a time-travel LSN is not known exactly, or whose copy has not
    /// committed yet, with the reason: a statement that reads one fails with it (the other
    /// tables still answer).
    pub refused: HashMap<String, String>,
}
