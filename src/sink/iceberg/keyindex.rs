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

use std::collections::HashMap;
use std::hash::Hash;
use std::path::PathBuf;
use std::sync::Arc;

use self::disk::OnDisk;
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

type Fast = foldhash::fast::FixedState;

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

/// Entries per directory bucket, on average.
const PER_BUCKET: usize = 32;

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

/// The sorted entries: in memory, or in a file on local disk beyond the budget.
enum Base<K> {
    Mem(Vec<(K, u64)>),
    Disk(OnDisk<K>),
}

impl<K: Slot> Base<K> {
    fn len(&self) -> usize {
        match self {
            Base::Mem(v) => v.len(),
            Base::Disk(d) => d.len(),
        }
    }
}

/// The index of one kind of key: a sorted array and the keys added since it was sorted.
struct Sorted<K> {
    /// Sorted by key, each key once; a removed entry keeps its key with location [`GONE`].
    base: Base<K>,
    /// Entries of `base` that are [`GONE`].
    gone: usize,
    /// `base[dir[b]..dir[b + 1]]` holds the keys whose top bits are `b`.
    dir: Vec<usize>,
    /// How far a key's top word is shifted to give its bucket (64: one bucket).
    shift: u32,
    /// Keys not in `base`.
    delta: HashMap<K, u64, Fast>,
    /// Locations changed in a `base` on disk and not written to it yet, by entry.
    changed: HashMap<usize, u64, Fast>,
    /// Entries of a bulk load, sorted when it ends (see [`KeyIndex::begin_load`]).
    loading: Option<Vec<(K, u64)>>,
    /// The parts of a bulk load larger than the budget, each sorted, on disk.
    runs: Vec<OnDisk<K>>,
    spill: Option<Arc<Spill>>,
}

impl<K> Sorted<K> {
    fn new(spill: Option<Arc<Spill>>) -> Self {
        Self {
            base: Base::Mem(Vec::new()),
            gone: 0,
            dir: vec![0, 0],
            shift: 64,
            delta: HashMap::default(),
            changed: HashMap::default(),
            loading: None,
            runs: Vec::new(),
            spill,
        }
    }
}

/// What a failed read or write of a spilled index says.
fn disk_error(spill: Option<&Arc<Spill>>, e: std::io::Error) -> Error {
    let dir = spill.map_or_else(|| "?".into(), |s| s.dir.display().to_string());
    let hint = if crate::error::is_storage_full_io(&e) {
        "; the disk is full: free space there or raise key_index_memory_budget_mb"
    } else {
        ""
    };
    Error::new(
        crate::error::io_kind(&e),
        format!("the key index beyond its memory budget, kept in {dir}: {e}{hint}"),
    )
    .with_source(e)
}

impl<K: Slot> Sorted<K> {
    const SIZE: usize = K::BYTES + 8;

    fn io(&self, e: std::io::Error) -> Error {
        disk_error(self.spill.as_ref(), e)
    }

    fn bucket(&self, k: &K) -> usize {
        k.top().checked_shr(self.shift).unwrap_or(0) as usize
    }

    /// The position of `k` in `base`, live or removed, and its location.
    fn find(&self, k: &K) -> Result<Option<(usize, u64)>> {
        let b = self.bucket(k);
        let (lo, hi) = (self.dir[b], self.dir[b + 1]);
        match &self.base {
            Base::Mem(base) => Ok(base[lo..hi]
                .binary_search_by(|e| e.0.cmp(k))
                .ok()
                .map(|i| (lo + i, base[lo + i].1))),
            Base::Disk(d) => {
                let mut stack = [0u8; 4096];
                let mut heap = Vec::new();
                let need = (hi - lo) * Self::SIZE;
                let buf: &mut [u8] = if need <= stack.len() {
                    &mut stack[..need]
                } else {
                    heap.resize(need, 0);
                    &mut heap
                };
                d.read(lo, hi, buf).map_err(|e| self.io(e))?;
                let (mut a, mut z) = (0, hi - lo);
                while a < z {
                    let m = (a + z) / 2;
                    let (mk, mv) = disk::entry::<K>(buf, m);
                    match mk.cmp(k) {
                        std::cmp::Ordering::Less => a = m + 1,
                        std::cmp::Ordering::Greater => z = m,
                        std::cmp::Ordering::Equal => {
                            let v = self.changed.get(&(lo + m)).copied().unwrap_or(mv);
                            return Ok(Some((lo + m, v)));
                        }
                    }
                }
                Ok(None)
            }
        }
    }

    /// Sets the location of entry `i` of `base`.
    fn set(&mut self, i: usize, v: u64) -> Result<()> {
        match &mut self.base {
            Base::Mem(base) => {
                base[i].1 = v;
                Ok(())
            }
            Base::Disk(_) => {
                self.changed.insert(i, v);
                let full = self
                    .budget()
                    .is_some_and(|b| self.changed.len() * 17 > (b / 4).max(1 << 12));
                if full {
                    self.write_changed()?;
                }
                Ok(())
            }
        }
    }

    /// Writes the changed locations into the file on disk.
    fn write_changed(&mut self) -> Result<()> {
        if let Base::Disk(d) = &self.base {
            if !self.changed.is_empty() {
                let mut changes: Vec<(usize, u64)> = self.changed.drain().collect();
                changes.sort_unstable_by_key(|c| c.0);
                d.apply(&changes)
                    .map_err(|e| disk_error(self.spill.as_ref(), e))?;
            }
        }
        self.changed = HashMap::default();
        Ok(())
    }

    /// Builds the directory of `len` sorted keys.
    fn index_keys(
        &mut self,
        len: usize,
        keys: impl Iterator<Item = std::io::Result<K>>,
    ) -> Result<()> {
        let buckets = (len / PER_BUCKET).max(1).next_power_of_two();
        self.shift = 64 - buckets.trailing_zeros();
        let mut dir = vec![0usize; buckets + 1];
        for k in keys {
            let k = k.map_err(|e| self.io(e))?;
            dir[self.bucket(&k) + 1] += 1;
        }
        for b in 1..dir.len() {
            dir[b] += dir[b - 1];
        }
        self.dir = dir;
        Ok(())
    }

    /// Builds the directory of `base`.
    fn index_base(&mut self) -> Result<()> {
        let len = self.base.len();
        match std::mem::replace(&mut self.base, Base::Mem(Vec::new())) {
            Base::Mem(v) => {
                let indexed = self.index_keys(len, v.iter().map(|e| Ok(e.0)));
                self.base = Base::Mem(v);
                indexed
            }
            Base::Disk(d) => {
                let mut r = d.reader(disk::CHUNK);
                let keys =
                    std::iter::from_fn(|| r.next_entry().transpose()).map(|e| e.map(|e| e.0));
                let indexed = self.index_keys(len, keys);
                drop(r);
                self.base = Base::Disk(d);
                indexed
            }
        }
    }

    /// The budget, when the index may spill.
    fn budget(&self) -> Option<usize> {
        self.spill.as_ref().map(|s| s.budget)
    }

    /// Moves an in-memory `base` larger than the budget to disk.
    fn spill_if_over(&mut self) -> Result<()> {
        let (Some(spill), Base::Mem(base)) = (self.spill.clone(), &self.base) else {
            return Ok(());
        };
        if base.capacity() * Self::SIZE <= spill.budget {
            return Ok(());
        }
        let started = std::time::Instant::now();
        let mut out = disk::Writer::create(&spill.dir).map_err(|e| self.io(e))?;
        for (k, v) in base.iter().filter(|e| e.1 != GONE) {
            out.push(*k, *v).map_err(|e| self.io(e))?;
        }
        let d = out.finish().map_err(|e| self.io(e))?;
        tracing::info!(
            entries = d.len(),
            file_mib = d.file_bytes() >> 20,
            budget_mib = spill.budget >> 20,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "key index moved to local disk: it is larger than its memory budget"
        );
        self.base = Base::Disk(d);
        self.gone = 0;
        self.index_base()
    }

    /// Ends a bulk load: sorts what it added.
    fn settle(&mut self) -> Result<()> {
        let Some(mut entries) = self.loading.take() else {
            return Ok(());
        };
        if entries.is_empty() {
            // The room of the kind no key had goes back.
            entries = Vec::new();
        }
        sort_load(&mut entries);
        let runs = std::mem::take(&mut self.runs);
        let base = if runs.is_empty() {
            Base::Mem(entries)
        } else {
            let spill = self
                .spill
                .clone()
                .ok_or_else(|| Error::fatal("key index runs without a folder"))?;
            let mut runs = runs;
            let started = std::time::Instant::now();
            runs.push(write_run(&spill.dir, &entries).map_err(|e| self.io(e))?);
            drop(entries);
            // Every run is read at once: the budget is shared by their read buffers.
            let chunk = (spill.budget / 2 / runs.len()).clamp(4096, disk::CHUNK);
            let d = disk::merge_runs(&runs, &spill.dir, chunk).map_err(|e| self.io(e))?;
            tracing::info!(
                entries = d.len(),
                runs = runs.len(),
                file_mib = d.file_bytes() >> 20,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "key index loaded to local disk: it is larger than its memory budget"
            );
            Base::Disk(d)
        };
        let spill = self.spill.take();
        *self = Self::new(spill);
        self.base = base;
        self.index_base()?;
        self.spill_if_over()
    }

    fn insert(&mut self, k: K, v: u64) -> Result<()> {
        if let Some(entries) = self.loading.as_mut() {
            entries.push((k, v));
            if let Some(spill) = &self.spill {
                if entries.len() * Self::SIZE >= spill.budget.max(Self::SIZE) {
                    sort_load(entries);
                    let run =
                        write_run(&spill.dir, entries).map_err(|e| disk_error(Some(spill), e))?;
                    entries.clear();
                    self.runs.push(run);
                }
            }
            return Ok(());
        }
        match self.find(&k)? {
            Some((i, old)) => {
                if old == GONE {
                    self.gone -= 1;
                }
                self.set(i, v)
            }
            None => {
                self.delta.insert(k, v);
                self.merge_if_large()
            }
        }
    }

    fn insert_new(&mut self, k: K, v: u64) -> Result<bool> {
        self.settle()?;
        match self.find(&k)? {
            Some((i, GONE)) => {
                self.set(i, v)?;
                self.gone -= 1;
                Ok(true)
            }
            Some(_) => Ok(false),
            None => match self.delta.entry(k) {
                std::collections::hash_map::Entry::Occupied(_) => Ok(false),
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(v);
                    self.merge_if_large()?;
                    Ok(true)
                }
            },
        }
    }

    fn remove(&mut self, k: &K) -> Result<Option<u64>> {
        self.settle()?;
        match self.find(k)? {
            Some((_, GONE)) => Ok(None),
            Some((i, old)) => {
                self.set(i, GONE)?;
                self.gone += 1;
                Ok(Some(old))
            }
            None => Ok(self.delta.remove(k)),
        }
    }

    /// Merges `delta` into `base` once it holds an eighth as many keys (each merge is one
    /// pass over the array, so adding keys costs amortised constant time), or a quarter of
    /// the memory budget.
    fn merge_if_large(&mut self) -> Result<()> {
        let by_share = self.delta.len() > (self.base.len() / 8).max(1 << 16);
        let by_budget = self
            .budget()
            .is_some_and(|b| self.delta.len() * (Self::SIZE + 1) > (b / 4).max(1 << 12));
        if by_share || by_budget {
            self.merge()?;
        }
        Ok(())
    }

    fn merge(&mut self) -> Result<()> {
        let mut add: Vec<(K, u64)> = std::mem::take(&mut self.delta).into_iter().collect();
        add.sort_unstable_by_key(|a| a.0);
        match &mut self.base {
            Base::Mem(base) => {
                if self.gone > 0 {
                    base.retain(|e| e.1 != GONE);
                    self.gone = 0;
                }
                // Merge from the back, in place: `base` grows by `add.len()` and each entry
                // is moved once. The keys of `delta` are never in `base`.
                let old = base.len();
                // Room for the next merge too (at an eighth of the array): growing a large
                // allocation may copy it, and that copy is the peak a hash map has while
                // growing.
                if base.capacity() < old + add.len() {
                    base.reserve_exact(add.len() + (old + add.len()) / 8);
                }
                base.extend_from_slice(&add);
                let (mut i, mut j, mut w) = (old, add.len(), old + add.len());
                while j > 0 {
                    w -= 1;
                    if i > 0 && base[i - 1].0 > add[j - 1].0 {
                        base[w] = base[i - 1];
                        i -= 1;
                    } else {
                        base[w] = add[j - 1];
                        j -= 1;
                    }
                }
                self.index_base()?;
                self.spill_if_over()
            }
            Base::Disk(d) => {
                let spill = self
                    .spill
                    .clone()
                    .ok_or_else(|| Error::fatal("a key index on disk without a folder"))?;
                let io = |e| disk_error(Some(&spill), e);
                let mut out = disk::Writer::create(&spill.dir).map_err(io)?;
                let mut old = d.reader(disk::CHUNK);
                let changed = std::mem::take(&mut self.changed);
                let mut read_old = || -> Result<Option<(K, u64)>> {
                    Ok(old
                        .next_indexed()
                        .map_err(io)?
                        .map(|(i, k, v)| (k, changed.get(&i).copied().unwrap_or(v))))
                };
                let mut add = add.into_iter().peekable();
                let mut next_old = read_old()?;
                loop {
                    let take_old = match (&next_old, add.peek()) {
                        (Some(o), Some(a)) => o.0 < a.0,
                        (Some(_), None) => true,
                        (None, Some(_)) => false,
                        (None, None) => break,
                    };
                    if take_old {
                        if let Some((k, v)) = next_old {
                            if v != GONE {
                                out.push(k, v).map_err(io)?;
                            }
                        }
                        next_old = read_old()?;
                    } else if let Some((k, v)) = add.next() {
                        out.push(k, v).map_err(io)?;
                    }
                }
                self.base = Base::Disk(out.finish().map_err(io)?);
                self.gone = 0;
                self.index_base()
            }
        }
    }

    /// Live entries outside a bulk load.
    fn live(&self) -> usize {
        self.base.len() - self.gone + self.delta.len()
    }

    fn len(&self) -> usize {
        self.live()
            + self.loading.as_ref().map_or(0, Vec::len)
            + self.runs.iter().map(OnDisk::len).sum::<usize>()
    }

    /// Passes every live location through `f`.
    fn remap(&mut self, mut f: impl FnMut(u64) -> Result<u64>) -> Result<()> {
        self.settle()?;
        self.write_changed()?;
        match &mut self.base {
            Base::Mem(base) => {
                for e in base.iter_mut().filter(|e| e.1 != GONE) {
                    e.1 = f(e.1)?;
                }
            }
            Base::Disk(d) => d.update_values(|v| if v == GONE { Ok(v) } else { f(v) })?,
        }
        for v in self.delta.values_mut() {
            *v = f(*v)?;
        }
        Ok(())
    }

    /// Calls `f` with every location, those of a bulk load too.
    fn for_each_value(&self, mut f: impl FnMut(u64)) -> Result<()> {
        let io = |e| disk_error(self.spill.as_ref(), e);
        match &self.base {
            Base::Mem(base) => base.iter().filter(|e| e.1 != GONE).for_each(|e| f(e.1)),
            Base::Disk(d) => {
                let mut r = d.reader(disk::CHUNK);
                while let Some((i, _, v)) = r.next_indexed().map_err(io)? {
                    let v = self.changed.get(&i).copied().unwrap_or(v);
                    if v != GONE {
                        f(v);
                    }
                }
            }
        }
        self.delta.values().for_each(|v| f(*v));
        self.loading.iter().flatten().for_each(|e| f(e.1));
        for run in &self.runs {
            let mut r = run.reader(disk::CHUNK);
            while let Some((_, v)) = r.next_entry().map_err(io)? {
                f(v);
            }
        }
        Ok(())
    }

    /// Calls `f` with the live entries outside a bulk load in key order.
    fn for_each_sorted(
        &self,
        mut f: impl FnMut(K, u64) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        let mut add: Vec<(K, u64)> = self.delta.iter().map(|(k, v)| (*k, *v)).collect();
        add.sort_unstable_by_key(|a| a.0);
        let mut add = add.into_iter().peekable();
        let mut emit = |k: K,
                        v: u64,
                        f: &mut dyn FnMut(K, u64) -> std::io::Result<()>|
         -> std::io::Result<()> {
            while let Some(a) = add.next_if(|a| a.0 < k) {
                f(a.0, a.1)?;
            }
            if v != GONE {
                f(k, v)?;
            }
            Ok(())
        };
        match &self.base {
            Base::Mem(base) => {
                for e in base {
                    emit(e.0, e.1, &mut f)?;
                }
            }
            Base::Disk(d) => {
                let mut r = d.reader(disk::CHUNK);
                while let Some((i, k, v)) = r.next_indexed()? {
                    let v = self.changed.get(&i).copied().unwrap_or(v);
                    emit(k, v, &mut f)?;
                }
            }
        }
        for (k, v) in add {
            f(k, v)?;
        }
        Ok(())
    }

    /// Reads `n` entries, written in key order by [`Sorted::for_each_sorted`], with `next`;
    /// to disk when they are more than the budget. Entries out of order in memory are sorted.
    fn read_entries(
        n: usize,
        spill: Option<Arc<Spill>>,
        mut next: impl FnMut() -> std::io::Result<(K, u64)>,
    ) -> std::io::Result<Self> {
        let bad =
            |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
        let mut s = Self::new(spill.clone());
        match spill.filter(|sp| n.saturating_mul(Self::SIZE) > sp.budget) {
            Some(sp) => {
                let mut out = disk::Writer::create(&sp.dir)?;
                for _ in 0..n {
                    let (k, v) = next()?;
                    if v == GONE {
                        return Err(bad("a location is out of range"));
                    }
                    out.push(k, v)?;
                }
                s.base = Base::Disk(out.finish()?);
            }
            None => {
                // A count from a damaged file must not reserve memory it does not have.
                let mut entries = Vec::with_capacity(n.min(1 << 28));
                for _ in 0..n {
                    entries.push(next()?);
                }
                if !entries.windows(2).all(|w| w[0].0 < w[1].0) {
                    entries.sort_unstable_by_key(|a| a.0);
                    if entries.windows(2).any(|w| w[0].0 == w[1].0) {
                        return Err(bad("a key is listed twice"));
                    }
                }
                if entries.iter().any(|e| e.1 == GONE) {
                    return Err(bad("a location is out of range"));
                }
                s.base = Base::Mem(entries);
            }
        }
        s.index_base()
            .map_err(|e| std::io::Error::other(e.report()))?;
        Ok(s)
    }

    fn bytes(&self) -> usize {
        let entry = std::mem::size_of::<(K, u64)>();
        let base = match &self.base {
            Base::Mem(v) => v.capacity() * entry,
            Base::Disk(_) => 0,
        };
        base + self.dir.capacity() * std::mem::size_of::<usize>()
            + self.delta.capacity() * (entry + 1)
            + self.changed.capacity() * 17
            + self.loading.as_ref().map_or(0, |l| l.capacity() * entry)
    }

    fn disk_bytes(&self) -> u64 {
        let base = match &self.base {
            Base::Mem(_) => 0,
            Base::Disk(d) => d.file_bytes(),
        };
        base + self.runs.iter().map(OnDisk::file_bytes).sum::<u64>()
    }
}

/// Sorts a bulk load's entries by key; of equal keys the one added last (the highest
/// location) is kept, as with `insert`.
fn sort_load<K: Slot>(entries: &mut Vec<(K, u64)>) {
    entries.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    entries.dedup_by(|later, first| later.0 == first.0);
}

fn write_run<K: Slot>(dir: &std::path::Path, entries: &[(K, u64)]) -> std::io::Result<OnDisk<K>> {
    let mut out = disk::Writer::create(dir)?;
    for (k, v) in entries {
        out.push(*k, *v)?;
    }
    out.finish()
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
mod tests {
    use super::*;
    use crate::sink::iceberg::keys::KeyEncoder;
    use arrow::array::{ArrayRef, Int32Array, Int64Array, StringArray};
    use arrow::datatypes::DataType;
    use std::sync::Arc;

    fn at(file: u32, pos: u64) -> Loc {
        Loc { file, pos }
    }

    fn sorted<K: Slot>(s: &Sorted<K>) -> Vec<(K, u64)> {
        let mut all = Vec::new();
        s.for_each_sorted(|k, v| {
            all.push((k, v));
            Ok(())
        })
        .unwrap();
        all
    }

    fn locs(index: &KeyIndex) -> Vec<Loc> {
        let mut all = Vec::new();
        index.for_each_loc(|l| all.push(l)).unwrap();
        all
    }

    #[test]
    fn integer_and_other_keys_are_told_apart_exactly() {
        let ints = KeyEncoder::new(vec![DataType::Int64]);
        let texts = KeyEncoder::new(vec![DataType::Utf8]);
        let pairs = KeyEncoder::new(vec![DataType::Int32, DataType::Utf8]);
        let mut index = KeyIndex::default();
        let mut keys = Vec::new();
        let n: ArrayRef = Arc::new(Int64Array::from(vec![i64::MIN, -1, 0, 1, i64::MAX]));
        for row in 0..5 {
            keys.push(ints.from_arrays(std::slice::from_ref(&n), row).unwrap());
        }
        // Four-byte texts encode to nine bytes, the shape of an integer key.
        let t: ArrayRef = Arc::new(StringArray::from(vec!["abcd", "abce", "", "a longer key"]));
        for row in 0..4 {
            keys.push(texts.from_arrays(std::slice::from_ref(&t), row).unwrap());
        }
        let a: ArrayRef = Arc::new(Int32Array::from(vec![1, 1, 2]));
        let b: ArrayRef = Arc::new(StringArray::from(vec!["x", "y", "x"]));
        for row in 0..3 {
            keys.push(pairs.from_arrays(&[a.clone(), b.clone()], row).unwrap());
        }
        for (i, k) in keys.iter().enumerate() {
            index.insert(k, at(i as u32, i as u64 * 3)).unwrap();
        }
        assert_eq!(index.len(), keys.len());
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(index.remove(k).unwrap(), Some(at(i as u32, i as u64 * 3)));
            assert_eq!(index.remove(k).unwrap(), None);
        }
        assert!(index.is_empty());
    }

    #[test]
    fn an_index_written_out_reads_back_the_same_and_damage_is_refused() {
        let mut index = KeyIndex::default();
        for i in 0..1000u64 {
            let mut k = vec![1u8];
            k.extend_from_slice(&(i as i64 * 7 - 300).to_be_bytes());
            index.insert(&k, at((i % 3) as u32, i)).unwrap();
            index
                .insert(format!("key {i}").as_bytes(), at(2, i * 2))
                .unwrap();
        }
        let mut bytes = Vec::new();
        index.write_to(&mut bytes).unwrap();
        let mut back = KeyIndex::read_from(&mut bytes.as_slice(), 3, None).unwrap();
        assert_eq!(back.len(), 2000);
        assert_eq!(sorted(&back.exact), sorted(&index.exact));
        assert_eq!(sorted(&back.hashed), sorted(&index.hashed));
        assert_eq!(back.remove(b"key 17").unwrap(), Some(at(2, 34)));
        // Fewer files than the locations name, or a truncated file: refused.
        assert!(KeyIndex::read_from(&mut bytes.as_slice(), 2, None).is_err());
        assert!(KeyIndex::read_from(&mut &bytes[..bytes.len() - 1], 3, None).is_err());
    }

    #[test]
    fn insert_new_keeps_the_first_and_insert_replaces() {
        let mut index = KeyIndex::default();
        let k = [1u8, 0, 0, 0, 0, 0, 0, 0, 7];
        assert!(index.insert_new(&k, at(0, 1)).unwrap());
        assert!(!index.insert_new(&k, at(0, 2)).unwrap());
        index.insert(&k, at(3, 4)).unwrap();
        assert_eq!(locs(&index), vec![at(3, 4)]);
    }

    #[test]
    fn locations_pack_and_refuse_what_does_not_fit() {
        let mut index = KeyIndex::default();
        let k = [0u8];
        let last = at(u32::MAX - 1, u64::from(u32::MAX));
        index.insert(&k, last).unwrap();
        assert_eq!(index.remove(&k).unwrap(), Some(last));
        assert!(index.insert(&k, at(0, u64::from(u32::MAX) + 1)).is_err());
        // File number u32::MAX marks removed entries.
        assert!(index.insert(&k, at(u32::MAX, 0)).is_err());
    }

    #[test]
    fn remap_moves_every_location() {
        let mut index = KeyIndex::default();
        for i in 0..100u64 {
            let mut k = vec![1u8];
            k.extend_from_slice(&(i as i64).to_be_bytes());
            index.insert(&k, at(1, i)).unwrap();
        }
        index.insert(b"\x01\x00\x00\x00\x02ab", at(2, 0)).unwrap();
        index.try_remap(|l| Ok(at(l.file + 10, l.pos + 1))).unwrap();
        let mut files: Vec<u32> = locs(&index).iter().map(|l| l.file).collect();
        files.sort_unstable();
        files.dedup();
        assert_eq!(files, vec![11, 12]);
        assert!(locs(&index).iter().all(|l| l.pos >= 1));
    }

    /// A small deterministic generator, so that a failure repeats.
    struct Lcg(u64);

    impl Lcg {
        fn next(&mut self) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            self.0 >> 11
        }
    }

    fn int_key(i: u64) -> Vec<u8> {
        let mut k = vec![1u8];
        k.extend_from_slice(&(i as i64).to_be_bytes());
        k
    }

    #[test]
    fn random_changes_agree_with_a_plain_map_through_loads_merges_and_saves() {
        let dir = tempfile::tempdir().unwrap();
        // In memory, and beyond a budget of 64 KiB: loaded in runs and kept on disk.
        let small = Arc::new(Spill {
            dir: dir.path().to_path_buf(),
            budget: 64 << 10,
        });
        for (text, spill) in [
            (false, None),
            (true, None),
            (false, Some(small.clone())),
            (true, Some(small.clone())),
        ] {
            let key = |i: u64| {
                if text {
                    format!("customer-{i}").into_bytes()
                } else {
                    int_key(i)
                }
            };
            let mut rng = Lcg(if text { 7 } else { 11 });
            let mut truth: HashMap<Vec<u8>, Loc> = HashMap::new();
            let mut index = KeyIndex::new(spill.clone());
            // A bulk load with a key added twice: the later location wins.
            index.begin_load(50_000);
            for i in 0..50_000u64 {
                let loc = at((i / 10_000) as u32, i % 10_000);
                index.insert(&key(i % 40_000), loc).unwrap();
                truth.insert(key(i % 40_000), loc);
            }
            index.end_load().unwrap();
            assert_eq!(index.len(), truth.len());
            if spill.is_some() {
                assert!(index.disk_bytes() > 0);
            }
            // Updates, deletes and new keys, enough new ones for several merges.
            let mut file = 5u32;
            for step in 0..400_000u64 {
                let i = rng.next() % 300_000;
                let k = key(i);
                match rng.next() % 4 {
                    0 => assert_eq!(index.remove(&k).unwrap(), truth.remove(&k), "remove {i}"),
                    1 => {
                        let loc = at(file, step);
                        let fresh = !truth.contains_key(&k);
                        assert_eq!(index.insert_new(&k, loc).unwrap(), fresh, "insert_new {i}");
                        if fresh {
                            truth.insert(k, loc);
                        }
                    }
                    _ => {
                        let loc = at(file, step);
                        index.insert(&k, loc).unwrap();
                        truth.insert(k, loc);
                    }
                }
                if step % 50_000 == 0 {
                    file += 1;
                }
            }
            assert_eq!(index.len(), truth.len());
            let mut seen: Vec<Loc> = locs(&index);
            let mut want: Vec<Loc> = truth.values().copied().collect();
            let order = |l: &Loc| (l.file, l.pos);
            seen.sort_by_key(order);
            want.sort_by_key(order);
            assert_eq!(seen, want);
            if let Some(spill) = &spill {
                // Only the directory, the keys added since the last merge and a read
                // buffer stay in memory.
                assert!(index.disk_bytes() > 0);
                assert!(
                    index.bytes() < spill.budget + (300_000 / 32 + 1) * 8 * 2,
                    "{}",
                    index.bytes()
                );
            }
            // Moved by a compaction.
            index.try_remap(|l| Ok(at(l.file + 1, l.pos))).unwrap();
            for l in truth.values_mut() {
                l.file += 1;
            }
            file += 1;
            // Saved and read back: the same entries, written in key order.
            let mut bytes = Vec::new();
            index.write_to(&mut bytes).unwrap();
            let mut back =
                KeyIndex::read_from(&mut bytes.as_slice(), file + 1, spill.clone()).unwrap();
            if spill.is_some() {
                assert!(back.disk_bytes() > 0);
            }
            assert_eq!(back.len(), truth.len());
            for i in 0..300_000u64 {
                let k = key(i);
                assert_eq!(
                    back.remove(&k).unwrap(),
                    truth.get(&k).copied(),
                    "after reading, {i}"
                );
            }
            assert!(back.is_empty());
        }
    }

    #[test]
    fn the_sorted_array_is_smaller_than_a_hash_map() {
        let mut index = KeyIndex::default();
        index.begin_load(1_000_000);
        for i in 0..1_000_000u64 {
            index.insert(&int_key(i), at(0, i)).unwrap();
        }
        index.end_load().unwrap();
        // 16 bytes an entry and a directory of a byte an entry; a hash map needs 17 bytes a
        // slot at a load below 7/8 (2^21 slots here: 34 MiB).
        assert!(index.bytes() < 17 * 1_000_000, "{} bytes", index.bytes());
        assert_eq!(
            index.remove(&int_key(123_456)).unwrap(),
            Some(at(0, 123_456))
        );
        assert_eq!(index.len(), 999_999);
    }
}
