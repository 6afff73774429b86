//! Sink, the key index beyond its memory budget: sorted entries in a file on local disk, read
//! a directory bucket at a time and changed in place, and the sorted runs of a bulk load too
//! large to sort in memory. The files are unlinked as soon as they are opened, so a crash
//! leaves nothing behind and the space returns when the index drops them.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::marker::PhantomData;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::Slot;

/// Bytes read or written at once when a file is passed through in order.
pub(super) const CHUNK: usize = 1 << 20;

/// Opens a new file under `dir` that has no name: it lives while it is open.
fn unnamed_file(dir: &Path) -> std::io::Result<File> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!(".keyindex-{}.spill", uuid::Uuid::new_v4().simple()));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)?;
    std::fs::remove_file(&path)?;
    Ok(file)
}

/// Entries `(key, location)` sorted by key in a file, fixed-width and little-endian, the
/// layout of the saved index (`apply/saved.rs`).
pub(super) struct OnDisk<K> {
    file: File,
    len: usize,
    _key: PhantomData<K>,
}

impl<K: Slot> OnDisk<K> {
    pub const SIZE: usize = K::BYTES + 8;

    pub fn len(&self) -> usize {
        self.len
    }

    /// Bytes the file takes.
    pub fn file_bytes(&self) -> u64 {
        (self.len * Self::SIZE) as u64
    }

    /// Reads entries `lo..hi` into `buf` (as bytes, see [`entry`]).
    pub fn read(&self, lo: usize, hi: usize, buf: &mut [u8]) -> std::io::Result<()> {
        debug_assert!(buf.len() == (hi - lo) * Self::SIZE && hi <= self.len);
        self.file.read_exact_at(buf, (lo * Self::SIZE) as u64)
    }

    /// Reads the entries in order, `chunk` bytes at a time.
    pub fn reader(&self, chunk: usize) -> Reader<'_, K> {
        let per = (chunk / Self::SIZE).max(1);
        Reader {
            disk: self,
            next: 0,
            buf: vec![0; per.min(self.len) * Self::SIZE],
            at: 0,
            filled: 0,
        }
    }

    /// Passes every location through `f` (which may leave it as it is), a chunk at a time.
    pub fn update_values(
        &self,
        mut f: impl FnMut(u64) -> crate::error::Result<u64>,
    ) -> crate::error::Result<()> {
        let per = (CHUNK / Self::SIZE).max(1);
        let mut buf = vec![0u8; per.min(self.len) * Self::SIZE];
        let mut lo = 0;
        while lo < self.len {
            let hi = (lo + per).min(self.len);
            let bytes = &mut buf[..(hi - lo) * Self::SIZE];
            self.read(lo, hi, bytes)?;
            for e in bytes.chunks_exact_mut(Self::SIZE) {
                let (_, v) = e.split_at_mut(K::BYTES);
                let old = u64::from_le_bytes(v.try_into().unwrap_or_default());
                let new = f(old)?;
                if new != old {
                    v.copy_from_slice(&new.to_le_bytes());
                }
            }
            self.file.write_all_at(bytes, (lo * Self::SIZE) as u64)?;
            lo = hi;
        }
        Ok(())
    }
}

impl<K: Slot> OnDisk<K> {
    /// Writes new locations, `(entry, location)` sorted by entry: each chunk of the file
    /// that holds one is read, changed and written back whole (a write of eight bytes costs
    /// the file system about as much as one of a page).
    pub fn apply(&self, changes: &[(usize, u64)]) -> std::io::Result<()> {
        let per = (CHUNK / Self::SIZE).max(1);
        let mut buf = Vec::new();
        let mut rest = changes;
        while let Some(&(first, _)) = rest.first() {
            let lo = first / per * per;
            let hi = (lo + per).min(self.len);
            let n = rest.partition_point(|c| c.0 < hi);
            buf.resize((hi - lo) * Self::SIZE, 0);
            self.read(lo, hi, &mut buf)?;
            for &(i, v) in &rest[..n] {
                let at = (i - lo) * Self::SIZE + K::BYTES;
                buf[at..at + 8].copy_from_slice(&v.to_le_bytes());
            }
            self.file.write_all_at(&buf, (lo * Self::SIZE) as u64)?;
            rest = &rest[n..];
        }
        Ok(())
    }
}

/// Decodes entry `i` of bytes read by [`OnDisk::read`].
pub(super) fn entry<K: Slot>(buf: &[u8], i: usize) -> (K, u64) {
    let size = K::BYTES + 8;
    let e = &buf[i * size..(i + 1) * size];
    let (k, v) = e.split_at(K::BYTES);
    (
        K::get(k),
        u64::from_le_bytes(v.try_into().unwrap_or_default()),
    )
}

/// The entries of an [`OnDisk`] in order.
pub(super) struct Reader<'a, K> {
    disk: &'a OnDisk<K>,
    /// The next entry to read from the file.
    next: usize,
    buf: Vec<u8>,
    /// The next entry of `buf` to return, and how many it holds.
    at: usize,
    filled: usize,
}

impl<K: Slot> Reader<'_, K> {
    pub fn next_entry(&mut self) -> std::io::Result<Option<(K, u64)>> {
        Ok(self.next_indexed()?.map(|(_, k, v)| (k, v)))
    }

    /// The next entry and its position in the file.
    pub fn next_indexed(&mut self) -> std::io::Result<Option<(usize, K, u64)>> {
        if self.at == self.filled {
            let per = self.buf.len() / OnDisk::<K>::SIZE;
            let hi = (self.next + per).min(self.disk.len);
            if hi == self.next {
                return Ok(None);
            }
            let n = hi - self.next;
            self.disk
                .read(self.next, hi, &mut self.buf[..n * OnDisk::<K>::SIZE])?;
            self.next = hi;
            self.at = 0;
            self.filled = n;
        }
        let (k, v) = entry(&self.buf, self.at);
        let i = self.next - self.filled + self.at;
        self.at += 1;
        Ok(Some((i, k, v)))
    }
}

/// Writes entries in key order to a new file.
pub(super) struct Writer<K> {
    out: BufWriter<File>,
    len: usize,
    last: Option<K>,
}

impl<K: Slot> Writer<K> {
    pub fn create(dir: &Path) -> std::io::Result<Self> {
        Ok(Self {
            out: BufWriter::with_capacity(CHUNK, unnamed_file(dir)?),
            len: 0,
            last: None,
        })
    }

    /// Adds the next entry; its key must be greater than the last one's.
    pub fn push(&mut self, k: K, v: u64) -> std::io::Result<()> {
        if self.last.is_some_and(|last| last >= k) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "key index entries out of order",
            ));
        }
        let mut e = [0u8; 32];
        k.put(&mut e[..K::BYTES]);
        e[K::BYTES..K::BYTES + 8].copy_from_slice(&v.to_le_bytes());
        self.out.write_all(&e[..K::BYTES + 8])?;
        self.last = Some(k);
        self.len += 1;
        Ok(())
    }

    pub fn finish(self) -> std::io::Result<OnDisk<K>> {
        let file = self.out.into_inner().map_err(|e| e.into_error())?;
        Ok(OnDisk {
            file,
            len: self.len,
            _key: PhantomData,
        })
    }
}

/// Merges sorted runs into one file; among equal keys the highest location wins (the one
/// added last, as in a bulk load held in memory). `chunk`: bytes of read buffer per run.
pub(super) fn merge_runs<K: Slot>(
    runs: &[OnDisk<K>],
    dir: &Path,
    chunk: usize,
) -> std::io::Result<OnDisk<K>> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let mut readers: Vec<Reader<'_, K>> = runs.iter().map(|r| r.reader(chunk)).collect();
    let mut heads = BinaryHeap::new();
    for (i, r) in readers.iter_mut().enumerate() {
        if let Some((k, v)) = r.next_entry()? {
            heads.push(Reverse((k, Reverse(v), i)));
        }
    }
    let mut out = Writer::create(dir)?;
    while let Some(Reverse((k, Reverse(v), i))) = heads.pop() {
        // The first of equal keys popped has the highest location; skip the others.
        if out.last != Some(k) {
            out.push(k, v)?;
        }
        if let Some((k, v)) = readers[i].next_entry()? {
            heads.push(Reverse((k, Reverse(v), i)));
        }
    }
    out.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(dir: &Path, entries: &[(u64, u64)]) -> OnDisk<u64> {
        let mut w = Writer::create(dir).unwrap();
        for (k, v) in entries {
            w.push(*k, *v).unwrap();
        }
        w.finish().unwrap()
    }

    #[test]
    fn runs_merge_in_key_order_and_the_highest_location_of_a_key_wins() {
        let dir = tempfile::tempdir().unwrap();
        let a = run(dir.path(), &[(1, 10), (4, 10), (9, 10)]);
        let b = run(dir.path(), &[(1, 20), (5, 20)]);
        let c = run(dir.path(), &[(4, 5), (9, 30), (12, 30)]);
        // The files have no names.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        let merged = merge_runs(&[a, b, c], dir.path(), 16).unwrap();
        let mut r = merged.reader(40);
        let mut got = Vec::new();
        while let Some(e) = r.next_entry().unwrap() {
            got.push(e);
        }
        assert_eq!(got, vec![(1, 20), (4, 10), (5, 20), (9, 30), (12, 30)]);
        merged.apply(&[(2, 7)]).unwrap();
        merged.update_values(|v| Ok(v + 1)).unwrap();
        let mut buf = vec![0u8; 3 * OnDisk::<u64>::SIZE];
        merged.read(1, 4, &mut buf).unwrap();
        assert_eq!(entry::<u64>(&buf, 1), (5, 8));
        assert_eq!(entry::<u64>(&buf, 2), (9, 31));
    }

    #[test]
    fn entries_out_of_order_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::<[u64; 2]>::create(dir.path()).unwrap();
        w.push([2, 0], 1).unwrap();
        assert!(w.push([1, 9], 1).is_err());
        assert!(w.push([2, 0], 1).is_err());
    }
}
