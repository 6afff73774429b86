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

use std::collections::HashMap;
use std::hash::Hash;

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
    /// Bits that are spread evenly over the keys, leading in the order.
    fn top(&self) -> u64;
}

impl Slot for u64 {
    fn top(&self) -> u64 {
        *self
    }
}

impl Slot for [u64; 2] {
    fn top(&self) -> u64 {
        self[0]
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

/// The index of one kind of key: a sorted array and the keys added since it was sorted.
struct Sorted<K> {
    /// Sorted by key, each key once; a removed entry keeps its key with location [`GONE`].
    base: Vec<(K, u64)>,
    /// Entries of `base` that are [`GONE`].
    gone: usize,
    /// `base[dir[b]..dir[b + 1]]` holds the keys whose top bits are `b`.
    dir: Vec<usize>,
    /// How far a key's top word is shifted to give its bucket (64: one bucket).
    shift: u32,
    /// Keys not in `base`.
    delta: HashMap<K, u64, Fast>,
    /// Entries of a bulk load, sorted when it ends (see [`KeyIndex::begin_load`]).
    loading: Option<Vec<(K, u64)>>,
}

impl<K> Default for Sorted<K> {
    fn default() -> Self {
        Self {
            base: Vec::new(),
            gone: 0,
            dir: vec![0, 0],
            shift: 64,
            delta: HashMap::default(),
            loading: None,
        }
    }
}

impl<K: Slot> Sorted<K> {
    fn bucket(&self, k: &K) -> usize {
        k.top().checked_shr(self.shift).unwrap_or(0) as usize
    }

    /// The position of `k` in `base`, live or removed.
    fn find(&self, k: &K) -> Option<usize> {
        let b = self.bucket(k);
        let (lo, hi) = (self.dir[b], self.dir[b + 1]);
        self.base[lo..hi]
            .binary_search_by(|e| e.0.cmp(k))
            .ok()
            .map(|i| lo + i)
    }

    /// Builds the directory of a sorted `base`.
    fn index_base(&mut self) {
        let buckets = (self.base.len() / PER_BUCKET).max(1).next_power_of_two();
        self.shift = 64 - buckets.trailing_zeros();
        let mut dir = vec![0usize; buckets + 1];
        for (k, _) in &self.base {
            dir[self.bucket(k) + 1] += 1;
        }
        for b in 1..dir.len() {
            dir[b] += dir[b - 1];
        }
        self.dir = dir;
    }

    /// Ends a bulk load: sorts what it added.
    fn settle(&mut self) {
        if let Some(mut entries) = self.loading.take() {
            if entries.is_empty() {
                // The room of the kind no key had goes back.
                entries = Vec::new();
            }
            // Equal keys: the one added last (the highest location) wins, as with `insert`.
            entries.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
            entries.dedup_by(|later, first| later.0 == first.0);
            *self = Self {
                base: entries,
                ..Self::default()
            };
            self.index_base();
        }
    }

    fn insert(&mut self, k: K, v: u64) {
        if let Some(entries) = self.loading.as_mut() {
            entries.push((k, v));
            return;
        }
        match self.find(&k) {
            Some(i) => {
                if self.base[i].1 == GONE {
                    self.gone -= 1;
                }
                self.base[i].1 = v;
            }
            None => {
                self.delta.insert(k, v);
                self.merge_if_large();
            }
        }
    }

    fn insert_new(&mut self, k: K, v: u64) -> bool {
        self.settle();
        match self.find(&k) {
            Some(i) if self.base[i].1 == GONE => {
                self.base[i].1 = v;
                self.gone -= 1;
                true
            }
            Some(_) => false,
            None => match self.delta.entry(k) {
                std::collections::hash_map::Entry::Occupied(_) => false,
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(v);
                    self.merge_if_large();
                    true
                }
            },
        }
    }

    fn remove(&mut self, k: &K) -> Option<u64> {
        self.settle();
        match self.find(k) {
            Some(i) if self.base[i].1 == GONE => None,
            Some(i) => {
                self.gone += 1;
                Some(std::mem::replace(&mut self.base[i].1, GONE))
            }
            None => self.delta.remove(k),
        }
    }

    /// Merges `delta` into `base` once it holds an eighth as many keys: each merge is one
    /// pass over the array, so adding keys costs amortised constant time.
    fn merge_if_large(&mut self) {
        if self.delta.len() > (self.base.len() / 8).max(1 << 16) {
            self.merge();
        }
    }

    fn merge(&mut self) {
        let mut add: Vec<(K, u64)> = std::mem::take(&mut self.delta).into_iter().collect();
        add.sort_unstable_by_key(|a| a.0);
        if self.gone > 0 {
            self.base.retain(|e| e.1 != GONE);
            self.gone = 0;
        }
        // Merge from the back, in place: `base` grows by `add.len()` and each entry is
        // moved once. The keys of `delta` are never in `base`.
        let old = self.base.len();
        // Room for the next merge too (at an eighth of the array): growing a large
        // allocation may copy it, and that copy is the peak a hash map has while growing.
        if self.base.capacity() < old + add.len() {
            self.base.reserve_exact(add.len() + (old + add.len()) / 8);
        }
        self.base.extend_from_slice(&add);
        let (mut i, mut j, mut w) = (old, add.len(), old + add.len());
        while j > 0 {
            w -= 1;
            if i > 0 && self.base[i - 1].0 > add[j - 1].0 {
                self.base[w] = self.base[i - 1];
                i -= 1;
            } else {
                self.base[w] = add[j - 1];
                j -= 1;
            }
        }
        self.index_base();
    }

    /// Live entries outside a bulk load.
    fn live(&self) -> usize {
        self.base.len() - self.gone + self.delta.len()
    }

    fn len(&self) -> usize {
        self.live() + self.loading.as_ref().map_or(0, Vec::len)
    }

    fn values_mut(&mut self) -> impl Iterator<Item = &mut u64> + '_ {
        self.base
            .iter_mut()
            .map(|e| &mut e.1)
            .filter(|v| **v != GONE)
            .chain(self.delta.values_mut())
    }

    fn values(&self) -> impl Iterator<Item = u64> + '_ {
        self.base
            .iter()
            .map(|e| e.1)
            .filter(|v| *v != GONE)
            .chain(self.delta.values().copied())
    }

    /// The live entries in key order.
    fn sorted(&self) -> impl Iterator<Item = (K, u64)> + '_ {
        let mut add: Vec<(K, u64)> = self.delta.iter().map(|(k, v)| (*k, *v)).collect();
        add.sort_unstable_by_key(|a| a.0);
        let mut base = self.base.iter().copied().filter(|e| e.1 != GONE).peekable();
        let mut add = add.into_iter().peekable();
        std::iter::from_fn(move || match (base.peek(), add.peek()) {
            (Some(b), Some(a)) if a.0 < b.0 => add.next(),
            (Some(_), _) => base.next(),
            (None, _) => add.next(),
        })
    }

    /// Reads entries written in key order (sorted again if they are not).
    fn from_entries(mut entries: Vec<(K, u64)>) -> std::result::Result<Self, &'static str> {
        if !entries.windows(2).all(|w| w[0].0 < w[1].0) {
            entries.sort_unstable_by_key(|a| a.0);
            if entries.windows(2).any(|w| w[0].0 == w[1].0) {
                return Err("a key is listed twice");
            }
        }
        if entries.iter().any(|e| e.1 == GONE) {
            return Err("a location is out of range");
        }
        let mut s = Self {
            base: entries,
            ..Self::default()
        };
        s.index_base();
        Ok(s)
    }

    fn bytes(&self) -> usize {
        let entry = std::mem::size_of::<(K, u64)>();
        self.base.capacity() * entry
            + self.dir.capacity() * std::mem::size_of::<usize>()
            + self.delta.capacity() * (entry + 1)
            + self.loading.as_ref().map_or(0, |l| l.capacity() * entry)
    }
}

/// Primary key (encoded, see `keys.rs`) -> location of the live row.
#[derive(Default)]
pub struct KeyIndex {
    exact: Sorted<u64>,
    hashed: Sorted<[u64; 2]>,
}

impl KeyIndex {
    /// Starts a bulk load of about `expected` keys: the index is
    /// emptied, and what [`KeyIndex::insert`] adds until [`KeyIndex::end_load`] is sorted
    /// once at the end instead of placed key by key; for an equal key the last one wins.
    pub fn begin_load(&mut self, expected: usize) {
        self.clear();
        // A count from a table's summary must not reserve memory it does not have. Both
        // kinds get room (a key's kind shows only when it comes): pages never written to
        // are not resident, and growing a large array may copy it.
        let expected = expected.min(1 << 28);
        self.exact.loading = Some(Vec::with_capacity(expected));
        self.hashed.loading = Some(Vec::with_capacity(expected));
    }

    /// Ends a bulk load (also ended by any call other than `insert`).
    pub fn end_load(&mut self) {
        self.exact.settle();
        self.hashed.settle();
    }

    /// Sets `key`'s location, replacing the one it had.
    pub fn insert(&mut self, key: &[u8], loc: Loc) -> Result<()> {
        let v = loc.pack()?;
        match key_of(key) {
            Key::Exact(k) => self.exact.insert(k, v),
            Key::Hashed(k) => self.hashed.insert(k, v),
        };
        Ok(())
    }

    /// Sets `key`'s location unless it has one; false when it had (and nothing changed).
    pub fn insert_new(&mut self, key: &[u8], loc: Loc) -> Result<bool> {
        let v = loc.pack()?;
        self.end_load();
        Ok(match key_of(key) {
            Key::Exact(k) => self.exact.insert_new(k, v),
            Key::Hashed(k) => self.hashed.insert_new(k, v),
        })
    }

    pub fn remove(&mut self, key: &[u8]) -> Option<Loc> {
        self.end_load();
        match key_of(key) {
            Key::Exact(k) => self.exact.remove(&k),
            Key::Hashed(k) => self.hashed.remove(&k),
        }
        .map(Loc::unpack)
    }

    pub fn len(&self) -> usize {
        self.exact.len() + self.hashed.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn clear(&mut self) {
        // Memory goes back too: a TRUNCATE or a rebuild should not keep the peak.
        self.exact = Sorted::default();
        self.hashed = Sorted::default();
    }

    pub fn locs(&self) -> impl Iterator<Item = Loc> + '_ {
        self.exact
            .values()
            .chain(self.hashed.values())
            .chain(self.exact.loading.iter().flatten().map(|e| e.1))
            .chain(self.hashed.loading.iter().flatten().map(|e| e.1))
            .map(Loc::unpack)
    }

    /// Moves every location through `f` (after a compaction rewrote files).
    pub fn try_remap(&mut self, mut f: impl FnMut(Loc) -> Result<Loc>) -> Result<()> {
        self.end_load();
        for v in self.exact.values_mut().chain(self.hashed.values_mut()) {
            *v = f(Loc::unpack(*v))?.pack()?;
        }
        Ok(())
    }

    /// Writes the entries to `out`: the count and (key, location) pairs of the exact keys,
    /// then of the hashed ones, each in key order, little-endian (read back by
    /// [`KeyIndex::read_from`]).
    pub fn write_to(&self, out: &mut impl std::io::Write) -> std::io::Result<()> {
        out.write_all(&(self.exact.live() as u64).to_le_bytes())?;
        for (k, v) in self.exact.sorted() {
            out.write_all(&k.to_le_bytes())?;
            out.write_all(&v.to_le_bytes())?;
        }
        out.write_all(&(self.hashed.live() as u64).to_le_bytes())?;
        for (k, v) in self.hashed.sorted() {
            out.write_all(&k[0].to_le_bytes())?;
            out.write_all(&k[1].to_le_bytes())?;
            out.write_all(&v.to_le_bytes())?;
        }
        Ok(())
    }

    /// Reads what [`KeyIndex::write_to`] wrote; `files`: how many data files the locations
    /// may name (a location beyond them is an error, as is a short read or a key twice).
    pub fn read_from(input: &mut impl std::io::Read, files: u32) -> std::io::Result<Self> {
        let bad =
            |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
        let mut word = [0u8; 8];
        let mut next = |input: &mut dyn std::io::Read| -> std::io::Result<u64> {
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
        // A count from a damaged file must not reserve memory it does not have.
        let mut exact = Vec::with_capacity(n.min(1 << 28));
        for _ in 0..n {
            let k = next(input)?;
            exact.push((k, loc(next(input)?)?));
        }
        let n = usize::try_from(next(input)?).map_err(|_| bad("entry count"))?;
        let mut hashed = Vec::with_capacity(n.min(1 << 28));
        for _ in 0..n {
            let k = [next(input)?, next(input)?];
            hashed.push((k, loc(next(input)?)?));
        }
        Ok(Self {
            exact: Sorted::from_entries(exact).map_err(bad)?,
            hashed: Sorted::from_entries(hashed).map_err(bad)?,
        })
    }

    /// Bytes the index holds (its arrays and maps at their current capacity).
    pub fn bytes(&self) -> usize {
        self.exact.bytes() + self.hashed.bytes()
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
            assert_eq!(index.remove(k), Some(at(i as u32, i as u64 * 3)));
            assert_eq!(index.remove(k), None);
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
        let mut back = KeyIndex::read_from(&mut bytes.as_slice(), 3).unwrap();
        assert_eq!(back.len(), 2000);
        assert!(back.exact.sorted().eq(index.exact.sorted()));
        assert!(back.hashed.sorted().eq(index.hashed.sorted()));
        assert_eq!(back.remove(b"key 17"), Some(at(2, 34)));
        // Fewer files than the locations name, or a truncated file: refused.
        assert!(KeyIndex::read_from(&mut bytes.as_slice(), 2).is_err());
        assert!(KeyIndex::read_from(&mut &bytes[..bytes.len() - 1], 3).is_err());
    }

    #[test]
    fn insert_new_keeps_the_first_and_insert_replaces() {
        let mut index = KeyIndex::default();
        let k = [1u8, 0, 0, 0, 0, 0, 0, 0, 7];
        assert!(index.insert_new(&k, at(0, 1)).unwrap());
        assert!(!index.insert_new(&k, at(0, 2)).unwrap());
        index.insert(&k, at(3, 4)).unwrap();
        assert_eq!(index.locs().collect::<Vec<_>>(), vec![at(3, 4)]);
    }

    #[test]
    fn locations_pack_and_refuse_what_does_not_fit() {
        let mut index = KeyIndex::default();
        let k = [0u8];
        let last = at(u32::MAX - 1, u64::from(u32::MAX));
        index.insert(&k, last).unwrap();
        assert_eq!(index.remove(&k), Some(last));
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
        let mut files: Vec<u32> = index.locs().map(|l| l.file).collect();
        files.sort_unstable();
        files.dedup();
        assert_eq!(files, vec![11, 12]);
        assert!(index.locs().all(|l| l.pos >= 1));
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
        for text in [false, true] {
            let key = |i: u64| {
                if text {
                    format!("customer-{i}").into_bytes()
                } else {
                    int_key(i)
                }
            };
            let mut rng = Lcg(if text { 7 } else { 11 });
            let mut truth: HashMap<Vec<u8>, Loc> = HashMap::new();
            let mut index = KeyIndex::default();
            // A bulk load with a key added twice: the later location wins.
            index.begin_load(50_000);
            for i in 0..50_000u64 {
                let loc = at((i / 10_000) as u32, i % 10_000);
                index.insert(&key(i % 40_000), loc).unwrap();
                truth.insert(key(i % 40_000), loc);
            }
            index.end_load();
            assert_eq!(index.len(), truth.len());
            // Updates, deletes and new keys, enough new ones for several merges.
            let mut file = 5u32;
            for step in 0..400_000u64 {
                let i = rng.next() % 300_000;
                let k = key(i);
                match rng.next() % 4 {
                    0 => assert_eq!(index.remove(&k), truth.remove(&k), "remove {i}"),
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
            let mut seen: Vec<Loc> = index.locs().collect();
            let mut want: Vec<Loc> = truth.values().copied().collect();
            let order = |l: &Loc| (l.file, l.pos);
            seen.sort_by_key(order);
            want.sort_by_key(order);
            assert_eq!(seen, want);
            // Saved and read back: the same entries, written in key order.
            let mut bytes = Vec::new();
            index.write_to(&mut bytes).unwrap();
            let mut back = KeyIndex::read_from(&mut bytes.as_slice(), file + 1).unwrap();
            assert_eq!(back.len(), truth.len());
            for i in 0..300_000u64 {
                let k = key(i);
                assert_eq!(
                    back.remove(&k),
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
        index.end_load();
        // 16 bytes an entry and a directory of a byte an entry; a hash map needs 17 bytes a
        // slot at a load below 7/8 (2^21 slots here: 34 MiB).
        assert!(index.bytes() < 17 * 1_000_000, "{} bytes", index.bytes());
        assert_eq!(index.remove(&int_key(123_456)), Some(at(0, 123_456)));
        assert_eq!(index.len(), 999_999);
    }
}
