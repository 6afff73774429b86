//! The seam between the source and Skippr's WAL: where a source delivers committed
//! transactions as they stream. The source knows only this trait; the WAL implements it.

use super::{Change, Lsn, Relation, Txn};
use crate::error::Result;

/// Receives a stream's committed transactions, change by change, and makes them durable.
///
/// Contract:
/// - A transaction is assembled between [`TxnAppender::begin`] and [`TxnAppender::commit`]
///   in bounded memory (a large one is kept on disk while it streams); a transaction without
///   changes is dropped at its commit.
/// - Nothing is durable before [`TxnAppender::flush`] returns; then every committed
///   transaction handed over so far is, and the LSN returned may be acknowledged to the
///   source. A transaction begun but not committed is never part of a flush.
pub trait TxnAppender: Send {
    /// A relation description that arrived outside any transaction.
    fn relation(&mut self, r: Relation);
    /// Starts a transaction (`header.changes` empty).
    fn begin(&mut self, header: Txn);
    /// The changes of the transaction begun so far; `None` outside a transaction.
    fn open_changes(&self) -> Option<u64>;
    /// Adds a change (a description inside the transaction included) to the transaction
    /// begun. Outside a transaction it is an error.
    fn change(&mut self, c: Change) -> Result<()>;
    /// Ends the transaction begun, at its commit.
    fn commit(&mut self, commit_lsn: Lsn, end_lsn: Lsn) -> Result<()>;
    /// Whether no committed transaction waits for a flush.
    fn is_empty(&self) -> bool;
    /// Whether what waits should be flushed now rather than at the next interval.
    fn flush_due(&self) -> bool;
    /// Makes every committed transaction handed over durable; the last end LSN made durable
    /// and the bytes written (`None` when nothing waited).
    fn flush(&mut self) -> Result<Option<(Lsn, u64)>>;
    /// Records that the stream is complete through `lsn` although no transaction up to it
    /// had to be kept (so the source may be acknowledged there).
    fn note_acknowledged(&mut self, lsn: Lsn) -> Result<()>;
}
