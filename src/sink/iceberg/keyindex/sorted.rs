//! Sink, the key index of one table, one kind of key (exact or hashed): the array sorted by
//! key with its directory, the keys new since it was sorted, bulk loads, and the move to a
//! file on local disk beyond the memory budget (`disk.rs`).

use std::collections::HashMap;
use std::sync::Arc;

use super::disk::{self, OnDisk};
use super::{Slot, Spill, GONE};
use crate::error::{Error, Result};

type Fast = foldhash::fast::FixedState;

/// Entries per directory bucket, on average.
const PER_BUCKET: usize = 32;

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
pub(super) struct Sorted<K> {
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
    /// Entries of a bulk load, sorted when it ends (see
    /// [`KeyIndex::begin_load`](super::KeyIndex::begin_load)).
    pub(super) loading: Option<Vec<(K, u64)>>,
    /// The parts of a bulk load larger than the budget, each sorted, on disk.
    runs: Vec<OnDisk<K>>,
    spill: Option<Arc<Spill>>,
}

impl<K> Sorted<K> {
    pub(super) fn new(spill: Option<Arc<Spill>>) -> Self {
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
    pub(super) const SIZE: usize = K::BYTES + 8;

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
    pub(super) fn settle(&mut self) -> Result<()> {
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

    pub(super) fn insert(&mut self, k: K, v: u64) -> Result<()> {
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

    pub(super) fn insert_new(&mut self, k: K, v: u64) -> Result<bool> {
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

    pub(super) fn remove(&mut self, k: &K) -> Result<Option<u64>> {
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
    pub(super) fn live(&self) -> usize {
        self.base.len() - self.gone + self.delta.len()
    }

    pub(super) fn len(&self) -> usize {
        self.live()
            + self.loading.as_ref().map_or(0, Vec::len)
            + self.runs.iter().map(OnDisk::len).sum::<usize>()
    }

    /// Passes every live location through `f`.
    pub(super) fn remap(&mut self, mut f: impl FnMut(u64) -> Result<u64>) -> Result<()> {
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
    pub(super) fn for_each_value(&self, mut f: impl FnMut(u64)) -> Result<()> {
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
    pub(super) fn for_each_sorted(
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
    pub(super) fn read_entries(
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

    pub(super) fn bytes(&self) -> usize {
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

    pub(super) fn disk_bytes(&self) -> u64 {
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
