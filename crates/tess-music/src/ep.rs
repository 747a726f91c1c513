//! An embarrassingly parallel CPU kernel in the manner of NAS EP, the best-effort interference of
//! seed 000's Table 1 (cells G, H, I).
//!
//! # The kernel (Bailey et al., "The NAS Parallel Benchmarks", 1991, kernel EP)
//! Uniform numbers come from the NAS linear congruential generator
//!
//! ```text
//! x_{k+1} = a x_k mod 2^46,   a = 5^13 = 1,220,703,125,   r_k = x_k / 2^46 in (0, 1)
//! ```
//!
//! Pairs `(u, v) = (2 r_{2j} - 1, 2 r_{2j+1} - 1)` are accepted when `t = u^2 + v^2 <= 1`
//! (Marsaglia's polar method); an accepted pair gives two gaussian deviates
//! `X = u sqrt(-2 ln t / t)`, `Y = v sqrt(-2 ln t / t)`. The kernel sums `X` and `Y` and counts
//! the pairs in the square annuli `l <= max(|X|, |Y|) < l + 1`, `l = 0..9`. It needs no memory
//! traffic and no communication, so every hart it runs on is simply busy: interference through
//! the CPU alone (and the shared core's pipelines under hyper-threading).
//!
//! # Glossary
//! - **pair**: two uniforms `(u, v)`; **accepted**: a pair inside the unit circle;
//!   **annulus** `l`: accepted pairs whose larger deviate lies in `[l, l + 1)`.
//!
//! # Worked example
//! From seed 271,828,183 the first uniform is `x_1 / 2^46` with
//! `x_1 = 271828183 * 5^13 mod 2^46 = 32,883,653,486,115` (r = 0.4673). About `pi / 4 = 78.5 %`
//! of pairs are accepted; `sum counts = accepted pairs`.

use std::time::Duration;
use tess_sched::clock;

/// `5^13`, the NAS multiplier.
pub const A: u64 = 1_220_703_125;
/// The NAS seed.
pub const SEED: u64 = 271_828_183;
const MASK46: u64 = (1 << 46) - 1;
const INV_2_46: f64 = 1.0 / (1u64 << 46) as f64;

/// Results of some EP work.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct EpTally {
    /// Pairs generated.
    pub pairs: u64,
    /// Sum of the X deviates.
    pub sx: f64,
    /// Sum of the Y deviates.
    pub sy: f64,
    /// Accepted pairs per annulus `l <= max(|X|,|Y|) < l + 1`.
    pub counts: [u64; 10],
}

impl EpTally {
    /// Accepted pairs.
    pub fn accepted(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Adds another tally.
    pub fn merge(&mut self, o: &EpTally) {
        self.pairs += o.pairs;
        self.sx += o.sx;
        self.sy += o.sy;
        for (a, b) in self.counts.iter_mut().zip(&o.counts) {
            *a += b;
        }
    }
}

/// The NAS generator's next state.
#[inline]
pub fn lcg_next(x: u64) -> u64 {
    // 5^13 < 2^31 and x < 2^46, so the product fits in u128 comfortably; mod 2^46 is a mask.
    ((u128::from(x) * u128::from(A)) as u64) & MASK46
}

/// Runs `pairs` pairs starting from generator state `x`; returns the tally and the new state.
pub fn run_pairs(mut x: u64, pairs: u64) -> (EpTally, u64) {
    let mut t = EpTally {
        pairs,
        ..EpTally::default()
    };
    for _ in 0..pairs {
        x = lcg_next(x);
        let u = 2.0 * (x as f64 * INV_2_46) - 1.0;
        x = lcg_next(x);
        let v = 2.0 * (x as f64 * INV_2_46) - 1.0;
        let s = u * u + v * v;
        if s <= 1.0 && s > 0.0 {
            let m = (-2.0 * s.ln() / s).sqrt();
            let (gx, gy) = (u * m, v * m);
            t.sx += gx;
            t.sy += gy;
            let l = gx.abs().max(gy.abs()) as usize;
            if l < 10 {
                t.counts[l] += 1;
            }
        }
    }
    (t, x)
}

/// Runs the kernel on the calling thread for `duration` (in batches of 2^16 pairs), starting
/// from `x` (use a different seed per thread).
pub fn run_for(x: u64, duration: Duration) -> EpTally {
    let end = clock::now_ns() + clock::ns(duration);
    let mut total = EpTally::default();
    let mut x = x & MASK46 | 1;
    while clock::now_ns() < end {
        let (t, nx) = run_pairs(x, 1 << 16);
        total.merge(&t);
        x = nx;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worked_example_first_uniform() {
        let x1 = lcg_next(SEED);
        assert_eq!(x1, 32_883_653_486_115);
        assert!((x1 as f64 * INV_2_46 - 0.4673).abs() < 1e-4);
    }

    #[test]
    fn acceptance_and_annuli_are_as_expected() {
        let (t, _) = run_pairs(SEED, 200_000);
        let rate = t.accepted() as f64 / t.pairs as f64;
        assert!((rate - std::f64::consts::FRAC_PI_4).abs() < 0.01, "{rate}");
        // Gaussian pairs: most fall in the first annuli, none far out.
        assert!(t.counts[0] > t.counts[1] && t.counts[1] > t.counts[2]);
        assert_eq!(t.counts[7..].iter().sum::<u64>(), 0);
        assert!((t.sx / t.accepted() as f64).abs() < 0.01);
    }
}
