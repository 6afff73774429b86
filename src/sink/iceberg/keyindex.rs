//! Sink, the key index of one table: for the primary key of each live committed row, the data
//! file and the position it is at, so that an UPDATE or DELETE from the stream becomes a
//! position delete without reading the table.
//!
//! Compact, because it holds every row of the table: a key whose encoding is a tag and eight
//! bytes (any single integer, date or timestamp key, and short text keys) is held exactly
//! (as a bijective mix of its `i64`, so that keys spread evenly); any other key as the
//! 128-bit XXH3 hash of its encoding (a collision among ten billion keys has a probability
//! near 10^-19). A location packs the file number and the row position into 64 bits.
//!
//! The entries live in one array sorted by key (16 bytes a row for an exact key, 24 for a
//! hashed one, no empty slots), found through a directory of the key's top bits and a short
//! binary search. An update or delete changes its entry in place (a removed row is marked,
//! not moved); only keys new to the table go to a small hash map, merged into the array when
//! it reaches an eighth of it. A hash map of the same rows needs 17-25 bytes a slot at a load
//! of 44-88%, and twice that while it grows.
//!
//! Beyond a memory budget (`key_index_memory_budget_mb`) the sorted array moves to a file on
//! local disk (`keyindex/disk.rs`): the directory stays in memory (half a byte a row), a
//! lookup reads one bucket of about 32 entries, an update writes its entry in place, and the
//! keys new to the table are merged into a new file once they take a quarter of the budget.
//! A bulk load beyond the budget is sorted in runs of the budget's size and merged.

mod disk;
mod sorted;

use std::hash::Hash;
use std::path::PathBuf;
use std::sync::Arc;

use self::sorted::Sorted;
use crate::error::{Error, Result};

/// Where a live row is: data file (its number in the sink's list) and row position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loc {
    pub file: u32,
    pub pos: u64,
}

/// The packed location of a removed entry (file number `u32::MAX` is never used).
const GONE: u64 = u64::MAX;

impl Loc {
    fn pack(self) -> Result<u64> {
        let pos = u32::try_from(self.pos).map_err(|_| {
            Error::fatal(format!(
                "a data file holds more than {} rows, more than the key index can address; write smaller files (target_file_size)",
                u32::MAX
            ))
        })?;
        if self.file == u32::MAX {
            return Err(Error::fatal(format!(
                "a table has {} data files, more than the key index can number; let table maintenance compact it",
                u32::MAX
            )));
        }
        Ok((u64::from(self.file) << 32) | u64::from(pos))
    }

    fn unpack(v: u64) -> Self {
        Self {
            file: (v >> 32) as u32,
            pos: v & u64::from(u32::MAX),
        }
    }
}

/// A key as the index holds it.
trait Slot: Copy + Ord + Hash + std::fmt::Debug {
    /// Bytes of its fixed-width encoding on disk.
    const BYTES: usize;
    /// Bits that are spread evenly over the keys, leading in the order.
    fn top(&self) -> u64;
    /// Writes the key to `out` (`BYTES` long), little-endian.
    fn put(&self, out: &mut [u8]);
    /// Reads what `put` wrote.
    fn get(b: &[u8]) -> Self;
}

fn word(b: &[u8]) -> u64 {
    u64::from_le_bytes(b[..8].try_into().unwrap_or_default())
}

impl Slot for u64 {
    const BYTES: usize = 8;

    fn top(&self) -> u64 {
        *self
    }

    fn put(&self, out: &mut [u8]) {
        out.copy_from_slice(&self.to_le_bytes());
    }

    fn get(b: &[u8]) -> Self {
        word(b)
    }
}

impl Slot for [u64; 2] {
    const BYTES: usize = 16;

    fn top(&self) -> u64 {
        self[0]
    }

    fn put(&self, out: &mut [u8]) {
        out[..8].copy_from_slice(&self[0].to_le_bytes());
        out[8..].copy_from_slice(&self[1].to_le_bytes());
    }

    fn get(b: &[u8]) -> Self {
        [word(b), word(&b[8..])]
    }
}

enum Key {
    Exact(u64),
    Hashed([u64; 2]),
}

/// A bijection of the 64-bit integers (SplitMix64's finalizer): distinct keys stay distinct,
/// and serial or clustered keys spread evenly over the directory.
fn mix(k: i64) -> u64 {
    let mut x = k as u64;
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn key_of(key: &[u8]) -> Key {
    if let [1, rest @ ..] = key {
        if let Ok(b) = <[u8; 8]>::try_from(rest) {
            return Key::Exact(mix(i64::from_be_bytes(b)));
        }
    }
    let h = twox_hash::XxHash3_128::oneshot(key);
    Key::Hashed([h as u64, (h >> 64) as u64])
}

/// Where a key index goes beyond its memory budget, and that budget.
#[derive(Debug, Clone)]
pub struct Spill {
    /// A local folder (the files in it have no names: see `keyindex/disk.rs`).
    pub dir: PathBuf,
    /// Bytes the sorted entries of one kind of key may take in memory; beyond it they live
    /// in a file under `dir`, and what is added since is merged into it in pieces of about
    /// a quarter of this.
    pub budget: usize,
}

/// Primary key (encoded, see `keys.rs`) -> location of the live row.
pub struct KeyIndex {
    exact: Sorted<u64>,
    hashed: Sorted<[u64; 2]>,
    spill: Option<Arc<Spill>>,
}

impl Default for KeyIndex {
    fn default() -> Self {
        Self::new(None)
    }
}

impl KeyIndex {
    /// An empty index that moves to disk beyond `spill`'s budget (`None`: never).
    pub fn new(spill: Option<Arc<Spill>>) -> Self {
        Self {
            exact: Sorted::new(spill.clone()),
            hashed: Sorted::new(spill.clone()),
            spill,
        }
    }

    /// Starts a bulk load of about `expected` keys: the index is
    /// emptied, and what [`KeyIndex::insert`] adds until [`KeyIndex::end_load`] is sorted
    /// once at the end instead of placed key by key; for an equal key the last one wins.
    /// Beyond the budget, the load is sorted in parts on disk and merged at the end.
    pub fn begin_load(&mut self, expected: usize) {
        self.clear();
        // A count from a table's summary must not reserve memory it does not have. Both
        // kinds get room (a key's kind shows only when it comes): pages never written to
        // are not resident, and growing a large array may copy it.
        let mut expected = expected.min(1 << 28);
        if let Some(s) = &self.spill {
            expected = expected.min(s.budget / Sorted::<u64>::SIZE + 1);
        }
        self.exact.loading = Some(Vec::with_capacity(expected));
        self.hashed.loading = Some(Vec::with_capacity(expected));
    }

    /// Ends a bulk load (also ended by any call other than `insert`).
    pub fn end_load(&mut self) -> Result<()> {
        self.exact.settle()?;
        self.hashed.settle()
    }

    /// Sets `key`'s location, replacing the one it had.
    pub fn insert(&mut self, key: &[u8], loc: Loc) -> Result<()> {
        let v = loc.pack()?;
        match key_of(key) {
            Key::Exact(k) => self.exact.insert(k, v),
            Key::Hashed(k) => self.hashed.insert(k, v),
        }
    }

    /// Sets `key`'s location unless it has one; false when it had (and nothing changed).
    pub fn insert_new(&mut self, key: &[u8], loc: Loc) -> Result<bool> {
        let v = loc.pack()?;
        self.end_load()?;
        match key_of(key) {
            Key::Exact(k) => self.exact.insert_new(k, v),
            Key::Hashed(k) => self.hashed.insert_new(k, v),
        }
    }

    pub fn remove(&mut self, key: &[u8]) -> Result<Option<Loc>> {
        self.end_load()?;
        Ok(match key_of(key) {
            Key::Exact(k) => self.exact.remove(&k)?,
            Key::Hashed(k) => self.hashed.remove(&k)?,
        }
        .map(Loc::unpack))
    }

    pub fn len(&self) -> usize {
        self.exact.len() + self.hashed.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn clear(&mut self) {
        // Memory and disk go back too: a TRUNCATE or a rebuild should not keep the peak.
        self.exact = Sorted::new(self.spill.clone());
        self.hashed = Sorted::new(self.spill.clone());
    }

    /// Calls `f` with every location.
    pub fn for_each_loc(&self, mut f: impl FnMut(Loc)) -> Result<()> {
        self.exact.for_each_value(|v| f(Loc::unpack(v)))?;
        self.hashed.for_each_value(|v| f(Loc::unpack(v)))
    }

    /// Moves every location through `f` (after a compaction rewrote files).
    pub fn try_remap(&mut self, mut f: impl FnMut(Loc) -> Result<Loc>) -> Result<()> {
        self.end_load()?;
        self.exact.remap(|v| f(Loc::unpack(v))?.pack())?;
        self.hashed.remap(|v| f(Loc::unpack(v))?.pack())
    }

    /// Writes the entries to `out`: the count and (key, location) pairs of the exact keys,
    /// then of the hashed ones, each in key order, little-endian (read back by
    /// [`KeyIndex::read_from`]).
    pub fn write_to(&self, out: &mut impl std::io::Write) -> std::io::Result<()> {
        let mut e = [0u8; 24];
        out.write_all(&(self.exact.live() as u64).to_le_bytes())?;
        self.exact.for_each_sorted(|k, v| {
            k.put(&mut e[..8]);
            e[8..16].copy_from_slice(&v.to_le_bytes());
            out.write_all(&e[..16])
        })?;
        out.write_all(&(self.hashed.live() as u64).to_le_bytes())?;
        self.hashed.for_each_sorted(|k, v| {
            k.put(&mut e[..16]);
            e[16..].copy_from_slice(&v.to_le_bytes());
            out.write_all(&e)
        })
    }

    /// Reads what [`KeyIndex::write_to`] wrote; `files`: how many data files the locations
    /// may name (a location beyond them is an error, as is a short read or a key twice).
    /// Beyond `spill`'s budget the entries go to disk.
    pub fn read_from(
        input: &mut impl std::io::Read,
        files: u32,
        spill: Option<Arc<Spill>>,
    ) -> std::io::Result<Self> {
        let bad =
            |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
        let next = |input: &mut dyn std::io::Read| -> std::io::Result<u64> {
            let mut word = [0u8; 8];
            input.read_exact(&mut word)?;
            Ok(u64::from_le_bytes(word))
        };
        let loc = |v: u64| {
            if Loc::unpack(v).file < files {
                Ok(v)
            } else {
                Err(bad("a location names a data file the index does not list"))
            }
        };
        let n = usize::try_from(next(input)?).map_err(|_| bad("entry count"))?;
        let exact = Sorted::read_entries(n, spill.clone(), || {
            let k = next(input)?;
            Ok((k, loc(next(input)?)?))
        })?;
        let n = usize::try_from(next(input)?).map_err(|_| bad("entry count"))?;
        let hashed = Sorted::read_entries(n, spill.clone(), || {
            let k = [next(input)?, next(input)?];
            Ok((k, loc(next(input)?)?))
        })?;
        Ok(Self {
            exact,
            hashed,
            spill,
        })
    }

    /// Where the index goes beyond its budget.
    pub fn spill(&self) -> Option<Arc<Spill>> {
        self.spill.clone()
    }

    /// Bytes the index holds in memory (its arrays and maps at their current capacity).
    pub fn bytes(&self) -> usize {
        self.exact.bytes() + self.hashed.bytes()
    }

    /// Bytes the index keeps on local disk, beyond its memory budget.
    pub fn disk_bytes(&self) -> u64 {
        self.exact.disk_bytes() + self.hashed.disk_bytes()
    }
}

#[cfg(test)]
mod tests;
