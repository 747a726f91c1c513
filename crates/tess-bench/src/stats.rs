//! Summary statistics of latency samples.

use serde::{Deserialize, Serialize};

/// First-order statistics and tail percentiles of a set of samples (any unit; the caller names
/// the unit in the figure name, e.g. `_us`).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    /// Number of samples.
    pub count: usize,
    /// Arithmetic mean.
    pub mean: f64,
    /// Population standard deviation.
    pub stdev: f64,
    /// Smallest sample.
    pub min: f64,
    /// 50th percentile.
    pub median: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest sample.
    pub max: f64,
}

impl Summary {
    /// Summarises `samples` (need not be sorted). An empty slice gives all zeros and count 0.
    pub fn of(samples: &[f64]) -> Summary {
        if samples.is_empty() {
            return Summary::default();
        }
        let mut sorted: Vec<f64> = samples.iter().copied().filter(|x| !x.is_nan()).collect();
        sorted.sort_by(|a, b| a.partial_cmp(b).expect("NaN filtered out"));
        let n = sorted.len();
        if n == 0 {
            return Summary::default();
        }
        let mean = sorted.iter().sum::<f64>() / n as f64;
        let var = sorted.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n as f64;
        Summary {
            count: n,
            mean,
            stdev: var.sqrt(),
            min: sorted[0],
            median: percentile_sorted(&sorted, 50.0),
            p99: percentile_sorted(&sorted, 99.0),
            p999: percentile_sorted(&sorted, 99.9),
            max: sorted[n - 1],
        }
    }

    /// Summarises integer nanosecond samples, converting to microseconds.
    pub fn of_ns_as_us(samples_ns: &[u64]) -> Summary {
        let us: Vec<f64> = samples_ns.iter().map(|&x| x as f64 / 1000.0).collect();
        Summary::of(&us)
    }

    /// Summarises integer nanosecond samples, keeping nanoseconds.
    pub fn of_ns(samples_ns: &[u64]) -> Summary {
        let ns: Vec<f64> = samples_ns.iter().map(|&x| x as f64).collect();
        Summary::of(&ns)
    }
}

/// Nearest-rank percentile of an ascending slice (`p` in 0..=100).
pub fn percentile_sorted(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    // The epsilon keeps 0.99 * 1000 (= 990.0000000000001 in binary) at rank 990.
    let rank = ((p / 100.0) * sorted.len() as f64 - 1e-9).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank() {
        let xs: Vec<f64> = (1..=1000).map(|x| x as f64).collect();
        let s = Summary::of(&xs);
        assert_eq!(s.count, 1000);
        assert_eq!(s.median, 500.0);
        assert_eq!(s.p99, 990.0);
        assert_eq!(s.p999, 999.0);
        assert_eq!(s.max, 1000.0);
        assert_eq!(s.min, 1.0);
        assert!((s.mean - 500.5).abs() < 1e-9);
    }

    #[test]
    fn order_does_not_matter_and_nan_is_ignored() {
        let a = Summary::of(&[3.0, 1.0, 2.0, f64::NAN]);
        let b = Summary::of(&[1.0, 2.0, 3.0]);
        assert_eq!(a, b);
        assert_eq!(Summary::of(&[]).count, 0);
    }

    #[test]
    fn stdev_of_constant_is_zero() {
        assert_eq!(Summary::of(&[5.0; 10]).stdev, 0.0);
        let s = Summary::of(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert!((s.stdev - 2.0).abs() < 1e-12);
    }
}
