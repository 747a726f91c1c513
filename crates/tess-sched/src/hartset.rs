//! A set of hart ids in the kernel's list format.

use std::fmt;
use std::str::FromStr;

/// A set of hardware-thread (hart) ids, e.g. `0-3,8`.
///
/// Stored as a bitmap so that set operations on machines with hundreds of harts stay cheap.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct HartSet {
    words: Vec<u64>,
}

/// Error parsing a hart list such as `0-3,8`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid hart list {input:?}: {reason}")]
pub struct ParseHartSetError {
    input: String,
    reason: &'static str,
}

/// Largest hart id accepted when parsing; far above any machine tess targets, small enough that a
/// typo like `1-99999999` cannot allocate gigabytes.
pub const MAX_HART_ID: usize = 65_535;

impl HartSet {
    /// The empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// The set `{0, 1, ..., n-1}`.
    pub fn first_n(n: usize) -> Self {
        (0..n).collect()
    }

    /// A set with one hart.
    pub fn single(hart: usize) -> Self {
        let mut s = Self::new();
        s.insert(hart);
        s
    }

    /// Adds `hart`; returns whether it was absent.
    pub fn insert(&mut self, hart: usize) -> bool {
        let (w, b) = (hart / 64, hart % 64);
        if self.words.len() <= w {
            self.words.resize(w + 1, 0);
        }
        let was = self.words[w] & (1 << b) != 0;
        self.words[w] |= 1 << b;
        !was
    }

    /// Removes `hart`; returns whether it was present.
    pub fn remove(&mut self, hart: usize) -> bool {
        let (w, b) = (hart / 64, hart % 64);
        match self.words.get_mut(w) {
            Some(word) if *word & (1 << b) != 0 => {
                *word &= !(1 << b);
                self.trim();
                true
            }
            _ => false,
        }
    }

    /// Whether `hart` is in the set.
    pub fn contains(&self, hart: usize) -> bool {
        self.words
            .get(hart / 64)
            .is_some_and(|w| w & (1 << (hart % 64)) != 0)
    }

    /// Number of harts in the set.
    pub fn len(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|w| *w == 0)
    }

    /// Harts in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.words.iter().enumerate().flat_map(|(i, &w)| {
            (0..64)
                .filter(move |b| w & (1u64 << b) != 0)
                .map(move |b| i * 64 + b)
        })
    }

    /// Lowest hart id, if any.
    pub fn first(&self) -> Option<usize> {
        self.iter().next()
    }

    /// Union.
    pub fn union(&self, other: &HartSet) -> HartSet {
        let n = self.words.len().max(other.words.len());
        let mut words = vec![0; n];
        for (i, w) in words.iter_mut().enumerate() {
            *w = self.words.get(i).copied().unwrap_or(0) | other.words.get(i).copied().unwrap_or(0);
        }
        let mut s = HartSet { words };
        s.trim();
        s
    }

    /// Intersection.
    pub fn intersection(&self, other: &HartSet) -> HartSet {
        let mut words: Vec<u64> = self
            .words
            .iter()
            .zip(other.words.iter())
            .map(|(a, b)| a & b)
            .collect();
        words.truncate(self.words.len().min(other.words.len()));
        let mut s = HartSet { words };
        s.trim();
        s
    }

    /// Harts in `self` but not in `other`.
    pub fn difference(&self, other: &HartSet) -> HartSet {
        let mut words = self.words.clone();
        for (i, w) in words.iter_mut().enumerate() {
            *w &= !other.words.get(i).copied().unwrap_or(0);
        }
        let mut s = HartSet { words };
        s.trim();
        s
    }

    /// Whether every hart of `self` is in `other`.
    pub fn is_subset(&self, other: &HartSet) -> bool {
        self.difference(other).is_empty()
    }

    /// Whether the two sets share a hart.
    pub fn intersects(&self, other: &HartSet) -> bool {
        !self.intersection(other).is_empty()
    }

    /// The set as a hexadecimal mask in the format of `/proc/irq/*/smp_affinity`
    /// (32-bit groups, most significant first, separated by commas).
    pub fn to_hex_mask(&self) -> String {
        let mut groups: Vec<u32> = Vec::new();
        for w in &self.words {
            groups.push(*w as u32);
            groups.push((*w >> 32) as u32);
        }
        while groups.len() > 1 && *groups.last().unwrap() == 0 {
            groups.pop();
        }
        if groups.is_empty() {
            groups.push(0);
        }
        groups
            .iter()
            .rev()
            .map(|g| format!("{g:08x}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Parses a hexadecimal mask as in `/proc/irq/*/smp_affinity` or
    /// `/sys/devices/virtual/workqueue/cpumask` (32-bit groups separated by commas).
    pub fn from_hex_mask(text: &str) -> Result<HartSet, ParseHartSetError> {
        let err = |reason| ParseHartSetError {
            input: text.to_string(),
            reason,
        };
        let digits: String = text.trim().chars().filter(|c| *c != ',').collect();
        if digits.is_empty() {
            return Err(err("empty mask"));
        }
        let mut set = HartSet::new();
        for (i, c) in digits.chars().rev().enumerate() {
            let v = c
                .to_digit(16)
                .ok_or_else(|| err("not a hexadecimal digit"))?;
            for b in 0..4 {
                if v & (1 << b) != 0 {
                    let h = i * 4 + b;
                    if h > MAX_HART_ID {
                        return Err(err("hart id too large"));
                    }
                    set.insert(h);
                }
            }
        }
        Ok(set)
    }

    fn trim(&mut self) {
        while self.words.last() == Some(&0) {
            self.words.pop();
        }
    }
}

impl FromIterator<usize> for HartSet {
    fn from_iter<I: IntoIterator<Item = usize>>(iter: I) -> Self {
        let mut s = HartSet::new();
        for h in iter {
            s.insert(h);
        }
        s
    }
}

impl FromStr for HartSet {
    type Err = ParseHartSetError;

    /// Parses the kernel list format: comma-separated ids and inclusive ranges, e.g. `0-3,8`.
    /// The empty string (or only whitespace) is the empty set, as the kernel prints it.
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let err = |reason| ParseHartSetError {
            input: input.to_string(),
            reason,
        };
        let mut set = HartSet::new();
        let trimmed = input.trim();
        if trimmed.is_empty() {
            return Ok(set);
        }
        for part in trimmed.split(',') {
            let part = part.trim();
            if part.is_empty() {
                return Err(err("empty element"));
            }
            let (lo, hi) = match part.split_once('-') {
                Some((a, b)) => (a.trim(), b.trim()),
                None => (part, part),
            };
            let lo: usize = lo.parse().map_err(|_| err("not a hart id"))?;
            let hi: usize = hi.parse().map_err(|_| err("not a hart id"))?;
            if lo > hi {
                return Err(err("range runs backwards"));
            }
            if hi > MAX_HART_ID {
                return Err(err("hart id too large"));
            }
            for h in lo..=hi {
                set.insert(h);
            }
        }
        Ok(set)
    }
}

impl fmt::Display for HartSet {
    /// Prints the kernel list format with ranges collapsed: `0-3,8`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut iter = self.iter().peekable();
        while let Some(start) = iter.next() {
            let mut end = start;
            while iter.peek() == Some(&(end + 1)) {
                end = iter.next().unwrap();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if start == end {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for HartSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HartSet({self})")
    }
}

impl serde::Serialize for HartSet {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

impl<'de> serde::Deserialize<'de> for HartSet {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let ids: Vec<usize> = Vec::deserialize(d)?;
        if let Some(bad) = ids.iter().find(|h| **h > MAX_HART_ID) {
            return Err(serde::de::Error::custom(format!("hart id {bad} too large")));
        }
        Ok(ids.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_kernel_lists() {
        let s: HartSet = "0-3,8, 10".parse().unwrap();
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![0, 1, 2, 3, 8, 10]);
        assert_eq!(s.to_string(), "0-3,8,10");
        assert!("".parse::<HartSet>().unwrap().is_empty());
        assert!("\n".parse::<HartSet>().unwrap().is_empty());
    }

    #[test]
    fn rejects_malformed_lists() {
        for bad in ["3-1", "a", "1,,2", "-1", "1-", "99999999"] {
            assert!(bad.parse::<HartSet>().is_err(), "{bad} should not parse");
        }
    }

    #[test]
    fn hex_mask_matches_kernel_format() {
        assert_eq!("0-1".parse::<HartSet>().unwrap().to_hex_mask(), "00000003");
        assert_eq!(
            "32".parse::<HartSet>().unwrap().to_hex_mask(),
            "00000001,00000000"
        );
        assert_eq!(HartSet::new().to_hex_mask(), "00000000");
        assert_eq!(HartSet::from_hex_mask("3").unwrap().to_string(), "0-1");
        assert_eq!(
            HartSet::from_hex_mask("00000001,00000000")
                .unwrap()
                .to_string(),
            "32"
        );
        let s: HartSet = "0,5,33,40-41".parse().unwrap();
        assert_eq!(HartSet::from_hex_mask(&s.to_hex_mask()).unwrap(), s);
        assert!(HartSet::from_hex_mask("xyz").is_err());
    }

    #[test]
    fn set_algebra() {
        let a: HartSet = "0-5".parse().unwrap();
        let b: HartSet = "4-9".parse().unwrap();
        assert_eq!(a.intersection(&b).to_string(), "4-5");
        assert_eq!(a.difference(&b).to_string(), "0-3");
        assert_eq!(a.union(&b).to_string(), "0-9");
        assert!(a.intersects(&b));
        assert!("1-2".parse::<HartSet>().unwrap().is_subset(&a));
        assert!(!b.is_subset(&a));
    }

    proptest! {
        #[test]
        fn display_round_trips(ids in proptest::collection::btree_set(0usize..300, 0..40)) {
            let s: HartSet = ids.iter().copied().collect();
            let back: HartSet = s.to_string().parse().unwrap();
            prop_assert_eq!(&back, &s);
            prop_assert_eq!(s.len(), ids.len());
            prop_assert_eq!(s.iter().collect::<Vec<_>>(), ids.into_iter().collect::<Vec<_>>());
        }
    }
}
