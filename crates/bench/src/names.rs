//! File names generated before any timed phase: one flat buffer of fixed-width names, so
//! the timed loops only slice it (no formatting, no allocation).

use std::ops::Range;

pub struct NameTable {
    bytes: Vec<u8>,
    width: usize,
}

impl NameTable {
    /// Names `f0000000`, `f0000001`, ...: `count` of them, all of one width.
    pub fn new(count: usize) -> NameTable {
        let digits = count.saturating_sub(1).max(1).ilog10() as usize + 1;
        let width = digits + 1;
        let mut bytes = Vec::with_capacity(count * width);
        for i in 0..count {
            bytes.push(b'f');
            bytes.extend_from_slice(format!("{i:0digits$}").as_bytes());
        }
        NameTable { bytes, width }
    }

    /// The same names in a random order (fixed seed: every run gets the same order). A
    /// thread's share then lands on leaves all over a directory, and its neighbours on a
    /// leaf belong to other threads, as hashed names (an object store's) do; in sequence,
    /// names that differ only in their last digit hash next to each other.
    pub fn shuffled(self) -> NameTable {
        use rand::{seq::SliceRandom, SeedableRng};
        let mut order: Vec<usize> = (0..self.len()).collect();
        order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(0x5eed));
        let bytes = order.iter().flat_map(|&i| self.get(i)).copied().collect();
        NameTable { bytes, width: self.width }
    }

    pub fn len(&self) -> usize {
        self.bytes.len() / self.width
    }

    pub fn get(&self, i: usize) -> &[u8] {
        &self.bytes[i * self.width..(i + 1) * self.width]
    }
}

/// `count` names, shuffled if asked (`--shuffle`).
pub fn table(count: usize, shuffle: bool) -> NameTable {
    let t = NameTable::new(count);
    if shuffle {
        t.shuffled()
    } else {
        t
    }
}

/// How a report's header says the names were taken: "" in sequence.
pub fn order_note(shuffled: bool) -> &'static str {
    if shuffled {
        " (names in a random order)"
    } else {
        ""
    }
}

/// Thread `t` of `threads` works on this contiguous share of `count` names.
pub fn share(count: usize, threads: usize, t: usize) -> Range<usize> {
    count * t / threads..count * (t + 1) / threads
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_distinct_and_fixed_width() {
        let t = NameTable::new(1000);
        assert_eq!(t.len(), 1000);
        assert_eq!(t.get(0), b"f000");
        assert_eq!(t.get(999), b"f999");
        assert_eq!(NameTable::new(1).get(0), b"f0");
    }

    #[test]
    fn shuffled_names_are_the_same_names() {
        let (t, sorted) = (NameTable::new(1000).shuffled(), NameTable::new(1000));
        assert!((0..10).any(|i| t.get(i) != sorted.get(i)), "not shuffled");
        let mut got: Vec<&[u8]> = (0..t.len()).map(|i| t.get(i)).collect();
        got.sort();
        assert!(got.iter().enumerate().all(|(i, n)| *n == sorted.get(i)));
    }

    #[test]
    fn shares_cover_everything_once() {
        let ranges: Vec<_> = (0..3).map(|t| share(10, 3, t)).collect();
        assert_eq!(ranges, vec![0..3, 3..6, 6..10]);
    }
}
