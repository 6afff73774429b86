//! A source transaction being assembled before it enters the WAL: held in memory up to the
//! pipeline's memory budget, then encoded change by change to a spill file in the WAL's
//! folder, so that a transaction of any size costs bounded memory while it streams and while
//! it is written into a segment.

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use bytes::BytesMut;

use super::codec::encode_change;
use crate::change::{Change, Datum, Lsn, Op, Relation, Txn};
use crate::error::{Context, Error, ErrorKind, Result};

/// The folder, inside a pipeline's WAL folder, that holds spill files.
pub const SPILL_DIR: &str = "spill";

/// Approximate memory a change holds: its values plus per-value and per-change overhead.
pub fn change_bytes(c: &Change) -> u64 {
    let tuple = |t: &Option<Vec<Datum>>| -> u64 {
        t.iter()
            .flatten()
            .map(|d| {
                32 + match d {
                    Datum::Text(b) => b.len() as u64,
                    _ => 0,
                }
            })
            .sum()
    };
    let relation = c
        .relation
        .as_ref()
        .map_or(0, |r| 64 * r.columns.len() as u64);
    96 + tuple(&c.old) + tuple(&c.new) + relation
}

/// Which relation descriptions a transaction's changes are read with: the relations whose
/// first change in it is not a new description (their description in effect before the
/// transaction must precede it in the segment), and the descriptions it carries inline.
#[derive(Debug, Default)]
pub struct Uses {
    pub needs: Vec<u32>,
    seen: HashSet<u32>,
    pub inline: Vec<Relation>,
}

impl Uses {
    pub fn note(&mut self, c: &Change) {
        if self.seen.insert(c.rel) && c.op != Op::Relation {
            self.needs.push(c.rel);
        }
        if let (Op::Relation, Some(r)) = (c.op, &c.relation) {
            self.inline.push(r.clone());
        }
    }

    pub fn of(txn: &Txn) -> Self {
        let mut uses = Self::default();
        for c in &txn.changes {
            uses.note(c);
        }
        uses
    }
}

/// The changes of one transaction, encoded to a file as they arrive. The file holds exactly
/// the change part of the transaction's WAL record body; its checksum is kept as it grows.
pub struct SpillFile {
    path: PathBuf,
    file: Option<BufWriter<File>>,
    crc: crc32fast::Hasher,
    bytes: u64,
    changes: u64,
    scratch: BytesMut,
}

fn io_error(path: &Path, e: std::io::Error) -> Error {
    let hint = if e.raw_os_error() == Some(28) {
        "; the disk is full: free space or move skipprd_el_storage_path, then restart (nothing was acknowledged, nothing is lost)"
    } else {
        ""
    };
    Error::new(
        ErrorKind::Fatal,
        format!(
            "cannot write the spill file {} of a large transaction: {e}{hint}",
            path.display()
        ),
    )
}

impl SpillFile {
    fn create(dir: &Path, xid: u32) -> Result<Self> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating the spill folder {}", dir.display()))?;
        let path = dir.join(format!("txn-{xid}-{}.spill", uuid::Uuid::new_v4().simple()));
        let file = File::create(&path).map_err(|e| io_error(&path, e))?;
        Ok(Self {
            path,
            file: Some(BufWriter::with_capacity(1 << 20, file)),
            crc: crc32fast::Hasher::new(),
            bytes: 0,
            changes: 0,
            scratch: BytesMut::new(),
        })
    }

    fn push(&mut self, c: &Change) -> Result<()> {
        self.scratch.clear();
        encode_change(c, &mut self.scratch);
        self.crc.update(&self.scratch);
        if let Some(f) = self.file.as_mut() {
            f.write_all(&self.scratch)
                .map_err(|e| io_error(&self.path, e))?;
        }
        self.bytes += self.scratch.len() as u64;
        self.changes += 1;
        Ok(())
    }

    /// Flushes what is buffered: the file then holds every change pushed.
    fn finish(&mut self) -> Result<()> {
        if let Some(mut f) = self.file.take() {
            f.flush().map_err(|e| io_error(&self.path, e))?;
        }
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes of encoded changes in the file.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn changes(&self) -> u64 {
        self.changes
    }

    /// The CRC32 state over the file's bytes.
    pub fn crc(&self) -> &crc32fast::Hasher {
        &self.crc
    }
}

impl Drop for SpillFile {
    fn drop(&mut self) {
        // The file only ever holds a copy of changes on their way into a segment (or of a
        // transaction that was never acknowledged): it is never needed after this.
        self.file.take();
        if let Err(e) = std::fs::remove_file(&self.path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(file = %self.path.display(), error = %e, "could not remove a spill file");
            }
        }
    }
}

/// A transaction being received: in memory while it fits the budget, spilled after.
pub struct TxnBuffer {
    txn: Txn,
    bytes: u64,
    budget: u64,
    dir: PathBuf,
    spill: Option<SpillFile>,
    uses: Uses,
}

/// A whole transaction, ready for a segment.
pub enum Finished {
    /// Held in memory: `txn.changes` is complete.
    Memory(Txn, Uses),
    /// Spilled: `txn` carries the header only; the changes are in the file.
    Spilled(Txn, SpillFile, Uses),
}

impl TxnBuffer {
    /// Starts a transaction (`header.changes` empty); above `budget` bytes its changes go
    /// to a file in `dir`.
    pub fn begin(header: Txn, budget: u64, dir: &Path) -> Self {
        Self {
            txn: header,
            bytes: 0,
            budget,
            dir: dir.to_path_buf(),
            spill: None,
            uses: Uses::default(),
        }
    }

    pub fn push(&mut self, c: Change) -> Result<()> {
        self.uses.note(&c);
        if let Some(spill) = self.spill.as_mut() {
            return spill.push(&c);
        }
        self.bytes += change_bytes(&c);
        self.txn.changes.push(c);
        if self.bytes > self.budget {
            let mut spill = SpillFile::create(&self.dir, self.txn.xid)?;
            for c in self.txn.changes.drain(..) {
                spill.push(&c)?;
            }
            self.txn.changes.shrink_to_fit();
            tracing::info!(xid = self.txn.xid, budget_bytes = self.budget, file = %spill.path().display(), "transaction larger than the memory budget: spilling its changes to disk");
            self.spill = Some(spill);
        }
        Ok(())
    }

    /// Changes received so far.
    pub fn changes(&self) -> u64 {
        match &self.spill {
            Some(s) => s.changes(),
            None => self.txn.changes.len() as u64,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.changes() == 0
    }

    /// Completes the transaction at its commit.
    pub fn finish(mut self, commit_lsn: Lsn, end_lsn: Lsn) -> Result<Finished> {
        let mut txn = std::mem::replace(
            &mut self.txn,
            Txn {
                xid: 0,
                commit_lsn,
                end_lsn,
                commit_time_micros: 0,
                changes: Vec::new(),
            },
        );
        txn.commit_lsn = commit_lsn;
        txn.end_lsn = end_lsn;
        let uses = std::mem::take(&mut self.uses);
        match self.spill.take() {
            None => Ok(Finished::Memory(txn, uses)),
            Some(mut spill) => {
                spill.finish()?;
                txn.changes.clear();
                Ok(Finished::Spilled(txn, spill, uses))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Txn {
        Txn {
            xid: 5,
            commit_lsn: Lsn(0),
            end_lsn: Lsn(0),
            commit_time_micros: 0,
            changes: Vec::new(),
        }
    }

    fn insert(v: &str) -> Change {
        Change {
            op: Op::Insert,
            rel: 1,
            old: None,
            new: Some(vec![Datum::Text(v.to_string().into())]),
            relation: None,
        }
    }

    #[test]
    fn stays_in_memory_within_the_budget_and_spills_beyond_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut small = TxnBuffer::begin(header(), 1 << 20, dir.path());
        small.push(insert("a")).unwrap();
        assert!(
            matches!(small.finish(Lsn(1), Lsn(2)).unwrap(), Finished::Memory(t, _) if t.changes.len() == 1)
        );

        let mut big = TxnBuffer::begin(header(), 1000, dir.path());
        for i in 0..100 {
            big.push(insert(&format!("value {i}"))).unwrap();
        }
        assert_eq!(big.changes(), 100);
        let Finished::Spilled(t, spill, uses) = big.finish(Lsn(1), Lsn(2)).unwrap() else {
            panic!("not spilled")
        };
        assert!(t.changes.is_empty());
        assert_eq!(uses.needs, vec![1]);
        let on_disk = std::fs::read(spill.path()).unwrap();
        assert_eq!(on_disk.len() as u64, spill.bytes());
        let mut expected = BytesMut::new();
        for i in 0..100 {
            encode_change(&insert(&format!("value {i}")), &mut expected);
        }
        assert_eq!(on_disk, expected.to_vec());
        assert_eq!(spill.crc().clone().finalize(), crc32fast::hash(&expected));
        let path = spill.path().to_path_buf();
        drop(spill);
        assert!(!path.exists(), "the spill file goes with its transaction");
    }
}
