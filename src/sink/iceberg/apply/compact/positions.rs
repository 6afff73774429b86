//! Sink, table maintenance: the live rows of a data file that compaction rewrites, as a
//! bitmap of their positions (one bit a row of the file, not eight bytes a live row: 1.25 MiB
//! for a 10M-row file), with the count of those before each 64 once sealed, so that the rank
//! of a position (its place among the live rows, which is its place in the rewritten output)
//! is one word read.

/// Live positions of one data file.
#[derive(Debug, Default)]
pub(super) struct LivePositions {
    words: Vec<u64>,
    /// Live positions before each word; filled by [`LivePositions::seal`].
    before: Vec<u64>,
    len: u64,
}

impl LivePositions {
    /// Marks `pos` live.
    pub(super) fn insert(&mut self, pos: u64) {
        let Ok(i) = usize::try_from(pos / 64) else {
            return;
        };
        if i >= self.words.len() {
            self.words.resize(i + 1, 0);
        }
        let bit = 1u64 << (pos % 64);
        if self.words[i] & bit == 0 {
            self.words[i] |= bit;
            self.len += 1;
        }
        self.before.clear();
    }

    /// How many positions are live.
    pub(super) fn len(&self) -> u64 {
        self.len
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `pos` is live.
    pub(super) fn contains(&self, pos: u64) -> bool {
        usize::try_from(pos / 64)
            .ok()
            .and_then(|i| self.words.get(i))
            .is_some_and(|w| w & (1u64 << (pos % 64)) != 0)
    }

    /// Counts the live positions before each word, for [`LivePositions::rank`].
    pub(super) fn seal(&mut self) {
        self.before.clear();
        self.before.reserve(self.words.len());
        let mut count = 0u64;
        for w in &self.words {
            self.before.push(count);
            count += u64::from(w.count_ones());
        }
    }

    /// The place of `pos` among the live positions; `None` when it is not live (or the
    /// positions were not sealed since the last insert).
    pub(super) fn rank(&self, pos: u64) -> Option<u64> {
        let i = usize::try_from(pos / 64).ok()?;
        let word = *self.words.get(i)?;
        let bit = 1u64 << (pos % 64);
        if word & bit == 0 {
            return None;
        }
        Some(self.before.get(i)? + u64::from((word & (bit - 1)).count_ones()))
    }
}

#[cfg(test)]
mod tests {
    use super::LivePositions;

    #[test]
    fn ranks_are_places_among_the_live_positions() {
        let live = [0u64, 3, 63, 64, 65, 200, 1_000];
        let mut p = LivePositions::default();
        // In any order, and twice: a position is live once.
        for pos in live.iter().rev().chain(live.iter()) {
            p.insert(*pos);
        }
        assert_eq!(p.len(), live.len() as u64);
        // Not sealed: no ranks yet, rather than wrong ones.
        assert_eq!(p.rank(3), None);
        p.seal();
        for (k, pos) in live.iter().enumerate() {
            assert!(p.contains(*pos));
            assert_eq!(p.rank(*pos), Some(k as u64), "{pos}");
        }
        for gone in [1u64, 62, 66, 199, 999, 1_001, 50_000] {
            assert!(!p.contains(gone));
            assert_eq!(p.rank(gone), None, "{gone}");
        }
        let mut empty = LivePositions::default();
        empty.seal();
        assert!(empty.is_empty() && empty.rank(0).is_none());
    }
}
