//! Skippr's write-ahead log: every change from the source is made durable here before
//! Postgres is acknowledged, and stays here until it is committed to Iceberg; committed
//! segments then move to the WAL's history (see `history`) for time travel between commits.
//!
//! A segment is a file of whole source transactions (and the relation descriptions they
//! use), each record framed with its length and a CRC32. Segments are written to a temporary
//! name, fsynced, then renamed: a segment is either complete or absent. A temporary file left
//! by a crash is deleted on start; a checksum failure in a complete segment stops the
//! pipeline (fail closed) instead of being misread.
//!
//! Segments are self-describing (see `codec`): every change is read with the relation
//! description in effect when Postgres wrote it, as resolved against the source's catalog
//! when the stream received it. A transaction larger than the pipeline's memory budget is
//! spilled to disk while it streams (see `spill`) and copied into its segment from there;
//! the sinks read it back one change at a time (see `items`).

pub mod appender;
pub mod codec;
mod history;
pub mod items;
mod locate;
mod objects;
mod segment;
pub mod spill;
pub mod store;
mod view;

pub use crate::change::{Change, Op, Txn};
pub use codec::Record;
pub use history::{HistoryRead, WalHistory};
pub use items::Item;
pub use locate::WalReader;
pub use store::{SegmentInfo, WalStore};
