//! The WAL side of the source seam (`change::TxnAppender`): transactions assembled in
//! bounded memory (see `spill`), collected into a segment, and written durably on flush.

use super::spill::TxnBuffer;
use super::store::{SegmentBuilder, WalStore};
use crate::change::{Change, Lsn, Relation, Txn, TxnAppender};
use crate::error::{Error, Result};

/// A segment is written at this size even if the flush interval has not passed.
const SEGMENT_MAX_BYTES: usize = 8 * 1024 * 1024;

/// Appends a stream's transactions to one pipeline's WAL.
pub struct WalAppender {
    store: WalStore,
    builder: SegmentBuilder,
    current: Option<TxnBuffer>,
    /// Bytes a transaction may hold in memory before it spills.
    budget: u64,
}

impl WalAppender {
    pub fn new(store: &WalStore, budget: u64) -> Self {
        Self {
            store: store.clone(),
            builder: SegmentBuilder::default(),
            current: None,
            budget,
        }
    }
}

impl TxnAppender for WalAppender {
    fn relation(&mut self, r: Relation) {
        self.builder.relation(r);
    }

    fn begin(&mut self, header: Txn) {
        self.current = Some(TxnBuffer::begin(
            header,
            self.budget,
            &self.store.spill_dir(),
        ));
    }

    fn open_changes(&self) -> Option<u64> {
        self.current.as_ref().map(TxnBuffer::changes)
    }

    fn change(&mut self, c: Change) -> Result<()> {
        match self.current.as_mut() {
            Some(t) => t.push(c),
            None => Err(Error::fatal(
                "the replication stream sent a change outside a transaction",
            )),
        }
    }

    fn commit(&mut self, commit_lsn: Lsn, end_lsn: Lsn) -> Result<()> {
        if let Some(t) = self.current.take() {
            if !t.is_empty() {
                self.builder.push_finished(t.finish(commit_lsn, end_lsn)?);
            }
        }
        Ok(())
    }

    fn is_empty(&self) -> bool {
        self.builder.is_empty()
    }

    fn flush_due(&self) -> bool {
        self.builder.len_bytes() >= SEGMENT_MAX_BYTES || self.builder.must_flush()
    }

    fn flush(&mut self) -> Result<Option<(Lsn, u64)>> {
        let bytes = self.builder.len_bytes() as u64;
        Ok(self.builder.flush(&self.store)?.map(|lsn| (lsn, bytes)))
    }

    fn note_acknowledged(&mut self, lsn: Lsn) -> Result<()> {
        self.store.note_acknowledged(lsn)
    }
}
