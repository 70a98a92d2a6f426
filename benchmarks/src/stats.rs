//! Medians and spreads.

use serde::{Deserialize, Serialize};

/// Summary of a sample.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Number of values.
    pub n: usize,
    /// Median.
    pub median: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
    /// 99th percentile (nearest rank).
    pub p99: f64,
}

/// Summarises `v` (None when empty).
pub fn summary(v: &[f64]) -> Option<Summary> {
    if v.is_empty() {
        return None;
    }
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return None;
    }
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    let median = if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    };
    let rank = ((0.99 * n as f64).ceil() as usize).clamp(1, n);
    Some(Summary {
        n,
        median,
        min: s[0],
        max: s[n - 1],
        p99: s[rank - 1],
    })
}

/// Whether two summaries' min..max spreads overlap (a difference inside the spread is
/// not a difference).
pub fn spreads_overlap(a: &Summary, b: &Summary) -> bool {
    a.min <= b.max && b.min <= a.max
}

/// Whether `fast` is faster than `slow` beyond the spread: Some(true), Some(false) when the
/// spreads overlap or the order is reversed, None when not measured.
pub fn faster(fast: Option<Summary>, slow: Option<Summary>) -> Option<bool> {
    let (f, s) = (fast?, slow?);
    Some(f.median < s.median && !spreads_overlap(&f, &s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_ranks() {
        let s = summary(&[5.0, 1.0, 3.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.p99), (3.0, 1.0, 5.0, 5.0));
        let s = summary(&[4.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!(s.median, 2.5);
        let v: Vec<f64> = (1..=200).map(f64::from).collect();
        assert_eq!(summary(&v).unwrap().p99, 198.0);
        assert_eq!(summary(&[]), None);
        assert_eq!(summary(&[f64::NAN]), None);
        let a = summary(&[1.0, 2.0]).unwrap();
        let b = summary(&[2.0, 3.0]).unwrap();
        let c = summary(&[2.5, 3.0]).unwrap();
        assert!(spreads_overlap(&a, &b));
        assert!(!spreads_overlap(&a, &c));
    }
}
