//! Sink, the key index kept on local disk between runs: written when a run ends with every
//! change committed, and read at the next start instead of rebuilding the index from every
//! data file, when it describes exactly the table's current snapshot.
//!
//! The file names the table (its Iceberg UUID), the snapshot and schema it describes and
//! the shape of the key; it lists the data files its locations number and ends with a
//! CRC-32 of everything before. Anything that does not match (another snapshot,
//! a damaged or truncated file, another key) is ignored and the index is rebuilt: the file
//! is a cache, never the truth. A crash leaves the file of the last clean end, which names
//! an older snapshot, so the next start rebuilds.

use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use crc32fast::Hasher as Crc32;
use twox_hash::XxHash3_128;

use super::TableSink;
use crate::error::{Context, Result};
use crate::sink::iceberg::keyindex::KeyIndex;

/// Version 2: exact keys are written mixed, in key order (`keyindex.rs`).
const MAGIC: &[u8; 8] = b"SKPKIDX2";

/// Passes bytes through and checksums them.
struct Hashing<T> {
    inner: T,
    hash: Crc32,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}

/// What a saved index must match to be used.
#[derive(Debug, PartialEq, Eq)]
struct Header {
    table_uuid: [u8; 16],
    snapshot_id: i64,
    schema_id: i32,
    key_shape: u64,
}

impl Header {
    fn write(&self, out: &mut impl Write) -> std::io::Result<()> {
        out.write_all(MAGIC)?;
        out.write_all(&self.table_uuid)?;
        out.write_all(&self.snapshot_id.to_le_bytes())?;
        out.write_all(&self.schema_id.to_le_bytes())?;
        out.write_all(&self.key_shape.to_le_bytes())
    }

    fn read(input: &mut impl Read) -> std::io::Result<Option<Self>> {
        let mut magic = [0u8; 8];
        input.read_exact(&mut magic)?;
        if &magic != MAGIC {
            return Ok(None);
        }
        let mut table_uuid = [0u8; 16];
        input.read_exact(&mut table_uuid)?;
        let mut w8 = [0u8; 8];
        let mut w4 = [0u8; 4];
        input.read_exact(&mut w8)?;
        let snapshot_id = i64::from_le_bytes(w8);
        input.read_exact(&mut w4)?;
        let schema_id = i32::from_le_bytes(w4);
        input.read_exact(&mut w8)?;
        Ok(Some(Self {
            table_uuid,
            snapshot_id,
            schema_id,
            key_shape: u64::from_le_bytes(w8),
        }))
    }
}

fn invalid(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string())
}

impl TableSink {
    /// The file of this table's saved index under `dir`.
    fn saved_index_path(&self, dir: &Path) -> PathBuf {
        let id = self.table.identifier();
        dir.join(format!(
            "{}.{}.keyindex",
            id.namespace().join("."),
            id.name()
        ))
    }

    /// What the index of the table as it is now must have been saved for; `None` when there
    /// is nothing to save or match (no snapshot yet).
    fn index_header(&self) -> Option<Header> {
        let meta = self.table.metadata();
        let snapshot = meta.current_snapshot()?;
        let types: Vec<_> = self
            .keys
            .columns()
            .iter()
            .map(|i| self.arrow.field(*i).data_type())
            .collect();
        let shape = XxHash3_128::oneshot(
            format!("{:?}|{types:?}|{}", self.keys.columns(), self.keyed).as_bytes(),
        );
        Some(Header {
            table_uuid: *meta.uuid().as_bytes(),
            snapshot_id: snapshot.snapshot_id(),
            schema_id: meta.current_schema_id(),
            key_shape: shape as u64,
        })
    }

    /// Whether the in-memory index is exactly that of the committed snapshot: nothing
    /// pending, staged or spilled, no second copies of a key.
    fn index_is_committed(&self) -> bool {
        !self.has_pending()
            && self.pending.is_empty()
            && self.deletes.is_empty()
            && self.staged.is_empty()
            && self.staged_deletes.is_empty()
            && !self.truncated
            && self.extra.is_empty()
    }

    /// Saves the index under `dir` when it is exactly the committed snapshot's (a run that
    /// ends with everything committed). A failure is only logged: the next start rebuilds.
    pub fn save_index(&mut self, dir: &Path) {
        // Not loaded in this run: the table did not change, and its saved copy still holds.
        if !self.index_ready {
            return;
        }
        let Some(header) = self.index_header() else {
            return;
        };
        if self.index_saved_for == Some(header.snapshot_id) {
            return;
        }
        if !self.index_is_committed() {
            tracing::debug!(table = %self.table.identifier(), "key index not saved: changes are pending");
            return;
        }
        let path = self.saved_index_path(dir);
        let started = std::time::Instant::now();
        match self.write_index(dir, &path, &header) {
            Ok(bytes) => {
                self.index_saved_for = Some(header.snapshot_id);
                tracing::info!(table = %self.table.identifier(), rows = self.index.len(), file_mib = bytes >> 20, elapsed_ms = started.elapsed().as_millis() as u64, path = %path.display(), "key index saved")
            }
            Err(e) => {
                tracing::warn!(table = %self.table.identifier(), path = %path.display(), error = %e.report(), "could not save the key index; the next start rebuilds it from the data files");
                let _ = std::fs::remove_file(&path);
            }
        }
    }

    fn write_index(&self, dir: &Path, path: &Path, header: &Header) -> Result<u64> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating the key index folder {}", dir.display()))?;
        let tmp = path.with_extension("keyindex.tmp");
        let file =
            std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        let mut out = Hashing {
            inner: BufWriter::with_capacity(1 << 20, file),
            hash: Crc32::new(),
        };
        let written = (|| -> std::io::Result<()> {
            header.write(&mut out)?;
            out.write_all(&(self.files.len() as u64).to_le_bytes())?;
            for f in &self.files {
                out.write_all(&(f.len() as u64).to_le_bytes())?;
                out.write_all(f.as_bytes())?;
            }
            self.index.write_to(&mut out)?;
            let sum = out.hash.clone().finalize();
            out.inner.write_all(&sum.to_le_bytes())?;
            out.inner.flush()
        })();
        written.with_context(|| format!("writing {}", tmp.display()))?;
        let bytes = std::fs::metadata(&tmp).map(|m| m.len()).unwrap_or(0);
        std::fs::rename(&tmp, path)
            .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
        Ok(bytes)
    }

    /// Loads the index saved under `dir` when it describes the current snapshot; false
    /// (nothing changed) when there is none or it does not match, so the caller rebuilds.
    pub(super) fn load_saved_index(&mut self, dir: &Path) -> bool {
        let Some(header) = self.index_header() else {
            return false;
        };
        let path = self.saved_index_path(dir);
        let file = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return false,
            Err(e) => {
                tracing::warn!(table = %self.table.identifier(), path = %path.display(), error = %e, "could not open the saved key index; rebuilding it");
                return false;
            }
        };
        let started = std::time::Instant::now();
        let mut input = Hashing {
            inner: BufReader::with_capacity(1 << 20, file),
            hash: Crc32::new(),
        };
        let read = (|| -> std::io::Result<Option<(Vec<String>, KeyIndex)>> {
            if Header::read(&mut input)?.as_ref() != Some(&header) {
                return Ok(None);
            }
            let mut w8 = [0u8; 8];
            input.read_exact(&mut w8)?;
            let n = u64::from_le_bytes(w8);
            let mut files = Vec::new();
            for _ in 0..n {
                input.read_exact(&mut w8)?;
                let len = usize::try_from(u64::from_le_bytes(w8))
                    .ok()
                    .filter(|l| *l <= 64 * 1024)
                    .ok_or_else(|| invalid("a data file path is too long"))?;
                let mut p = vec![0u8; len];
                input.read_exact(&mut p)?;
                files.push(String::from_utf8(p).map_err(|_| invalid("a path is not UTF-8"))?);
            }
            let count = u32::try_from(files.len()).map_err(|_| invalid("too many files"))?;
            let index = KeyIndex::read_from(&mut input, count, self.index.spill())?;
            let sum = input.hash.clone().finalize();
            let mut w4 = [0u8; 4];
            input.inner.read_exact(&mut w4)?;
            if u32::from_le_bytes(w4) != sum {
                return Err(invalid("the checksum does not match"));
            }
            Ok(Some((files, index)))
        })();
        match read {
            Ok(Some((files, index))) => {
                self.files = files;
                self.index = index;
                self.extra.clear();
                self.index_saved_for = Some(header.snapshot_id);
                tracing::info!(table = %self.table.identifier(), rows = self.index.len(), index_mib = self.index.bytes() >> 20, index_disk_mib = self.index.disk_bytes() >> 20, files = self.files.len(), elapsed_ms = started.elapsed().as_millis() as u64, "key index loaded from its saved copy");
                true
            }
            Ok(None) => {
                tracing::debug!(table = %self.table.identifier(), path = %path.display(), "the saved key index is of another snapshot; rebuilding it");
                false
            }
            Err(e) => {
                tracing::warn!(table = %self.table.identifier(), path = %path.display(), error = %e, "the saved key index is damaged; rebuilding it from the data files");
                false
            }
        }
    }
}
