//! Sink, the key index of one table: for the primary key of each live committed row, the data
//! file and the position it is at, so that an UPDATE or DELETE from the stream becomes a
//! position delete without reading the table.
//!
//! Compact, because it holds every row of the table: a key whose encoding is a tag and eight
//! bytes (any single integer, date or timestamp key, and short text keys) is held exactly as
//! an `i64`; any other key as the 128-bit XXH3 hash of its encoding (a collision among ten
//! billion keys has a probability near 10^-19). A location packs the file number and the
//! row position into 64 bits. That is 17 bytes a slot (16 for an integer key and its place,
//! one control byte) instead of about 50 with boxed keys.

use std::collections::HashMap;

use crate::error::{Error, Result};

/// Where a live row is: data file (its number in the sink's list) and row position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loc {
    pub file: u32,
    pub pos: u64,
}

impl Loc {
    fn pack(self) -> Result<u64> {
        let pos = u32::try_from(self.pos).map_err(|_| {
            Error::fatal(format!(
                "a data file holds more than {} rows, more than the key index can address; write smaller files (target_file_size)",
                u32::MAX
            ))
        })?;
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

/// Primary key (encoded, see `keys.rs`) -> location of the live row.
#[derive(Default)]
pub struct KeyIndex {
    exact: HashMap<i64, u64, Fast>,
    hashed: HashMap<[u64; 2], u64, Fast>,
}

enum Slot {
    Exact(i64),
    Hashed([u64; 2]),
}

fn slot(key: &[u8]) -> Slot {
    if let [1, rest @ ..] = key {
        if let Ok(b) = <[u8; 8]>::try_from(rest) {
            return Slot::Exact(i64::from_be_bytes(b));
        }
    }
    let h = twox_hash::XxHash3_128::oneshot(key);
    Slot::Hashed([h as u64, (h >> 64) as u64])
}

impl KeyIndex {
    /// Sets `key`'s location, replacing the one it had.
    pub fn insert(&mut self, key: &[u8], loc: Loc) -> Result<()> {
        let v = loc.pack()?;
        match slot(key) {
            Slot::Exact(k) => self.exact.insert(k, v),
            Slot::Hashed(k) => self.hashed.insert(k, v),
        };
        Ok(())
    }

    /// Sets `key`'s location unless it has one; false when it had (and nothing changed).
    pub fn insert_new(&mut self, key: &[u8], loc: Loc) -> Result<bool> {
        let v = loc.pack()?;
        Ok(match slot(key) {
            Slot::Exact(k) => insert_new(&mut self.exact, k, v),
            Slot::Hashed(k) => insert_new(&mut self.hashed, k, v),
        })
    }

    pub fn remove(&mut self, key: &[u8]) -> Option<Loc> {
        match slot(key) {
            Slot::Exact(k) => self.exact.remove(&k),
            Slot::Hashed(k) => self.hashed.remove(&k),
        }
        .map(Loc::unpack)
    }

    /// Room for `additional` more keys of the table's kind (exact when `exact`), so that
    /// loading a large table grows the map once instead of doubling it step by step.
    pub fn reserve(&mut self, additional: usize, exact: bool) {
        if exact {
            self.exact.reserve(additional);
        } else {
            self.hashed.reserve(additional);
        }
    }

    pub fn len(&self) -> usize {
        self.exact.len() + self.hashed.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn clear(&mut self) {
        // Memory goes back too: a TRUNCATE or a rebuild should not keep the peak.
        self.exact = HashMap::default();
        self.hashed = HashMap::default();
    }

    pub fn locs(&self) -> impl Iterator<Item = Loc> + '_ {
        self.exact
            .values()
            .chain(self.hashed.values())
            .map(|v| Loc::unpack(*v))
    }

    /// Moves every location through `f` (after a compaction rewrote files).
    pub fn try_remap(&mut self, mut f: impl FnMut(Loc) -> Result<Loc>) -> Result<()> {
        for v in self.exact.values_mut().chain(self.hashed.values_mut()) {
            *v = f(Loc::unpack(*v))?.pack()?;
        }
        Ok(())
    }

    /// Writes the entries to `out`: the count and (key, location) pairs of the exact map,
    /// then of the hashed one, little-endian (read back by [`KeyIndex::read_from`]).
    pub fn write_to(&self, out: &mut impl std::io::Write) -> std::io::Result<()> {
        out.write_all(&(self.exact.len() as u64).to_le_bytes())?;
        for (k, v) in &self.exact {
            out.write_all(&k.to_le_bytes())?;
            out.write_all(&v.to_le_bytes())?;
        }
        out.write_all(&(self.hashed.len() as u64).to_le_bytes())?;
        for (k, v) in &self.hashed {
            out.write_all(&k[0].to_le_bytes())?;
            out.write_all(&k[1].to_le_bytes())?;
            out.write_all(&v.to_le_bytes())?;
        }
        Ok(())
    }

    /// Reads what [`KeyIndex::write_to`] wrote; `files`: how many data files the locations
    /// may name (a location beyond them is an error, as is a short read).
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
        let mut index = Self::default();
        let n = usize::try_from(next(input)?).map_err(|_| bad("entry count"))?;
        // A count from a damaged file must not reserve memory it does not have.
        index.exact.reserve(n.min(1 << 28));
        for _ in 0..n {
            let k = next(input)? as i64;
            let v = loc(next(input)?)?;
            if index.exact.insert(k, v).is_some() {
                return Err(bad("a key is listed twice"));
            }
        }
        let n = usize::try_from(next(input)?).map_err(|_| bad("entry count"))?;
        index.hashed.reserve(n.min(1 << 28));
        for _ in 0..n {
            let k = [next(input)?, next(input)?];
            let v = loc(next(input)?)?;
            if index.hashed.insert(k, v).is_some() {
                return Err(bad("a key is listed twice"));
            }
        }
        Ok(index)
    }

    /// Bytes the index holds (its slots at their current capacity).
    pub fn bytes(&self) -> usize {
        self.exact.capacity() * (std::mem::size_of::<(i64, u64)>() + 1)
            + self.hashed.capacity() * (std::mem::size_of::<([u64; 2], u64)>() + 1)
    }
}

fn insert_new<K: std::hash::Hash + Eq>(map: &mut HashMap<K, u64, Fast>, k: K, v: u64) -> bool {
    match map.entry(k) {
        std::collections::hash_map::Entry::Occupied(_) => false,
        std::collections::hash_map::Entry::Vacant(e) => {
            e.insert(v);
            true
        }
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
        assert!(back.exact == index.exact && back.hashed == index.hashed);
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
        index.insert(&k, at(u32::MAX, u64::from(u32::MAX))).unwrap();
        assert_eq!(index.remove(&k), Some(at(u32::MAX, u64::from(u32::MAX))));
        assert!(index.insert(&k, at(0, u64::from(u32::MAX) + 1)).is_err());
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
}
