//! Unit tests of the key index: exact and hashed keys, saving and reading back, packing,
//! remapping, and random changes checked against a plain map through loads, merges and saves.

use super::*;
use crate::sink::iceberg::keys::KeyEncoder;
use arrow::array::{ArrayRef, Int32Array, Int64Array, StringArray};
use arrow::datatypes::DataType;
use std::collections::HashMap;
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
        let mut back = KeyIndex::read_from(&mut bytes.as_slice(), file + 1, spill.clone()).unwrap();
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
