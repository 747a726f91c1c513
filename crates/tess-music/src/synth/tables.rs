//! Microtonal pitch probability tables and the distribution the Migrator draws from.
//!
//! # The distribution (seed 000, section 3.2)
//! "New frequency values are sampled from a distribution that is computed by convolving a chosen
//! microtonal pitch probability table with a gaussian function of specified standard deviation."
//! In pitch (cents above the pad's root `r`), a table is a set of pitches `c_k` with
//! probabilities `w_k` (summing to 1), and the distribution is
//!
//! ```text
//! p(c) = sum_k w_k * N(c; c_k, sigma^2)          (table (*) gaussian)
//! f    = r * 2^(c / 1200)                        (cents to Hz)
//! ```
//!
//! Sampling this mixture needs no convolution at run time: pick `k` with probability `w_k`
//! (binary search in the cumulative weights), then add `sigma * z` with `z ~ N(0, 1)`. The
//! result has exactly the density `p(c)` above; [`Tables::density`] computes the convolution
//! explicitly so that a test can check the two agree.
//!
//! Controls: pad `y` picks table `floor(4 y)` (clamped to 0..=3); pad `x` sets
//! `sigma = x * 100 cents` (0 = exactly the table's pitches, 1 = a semitone of spread).
//!
//! # The four tables (shared by every pad; each pad transposes them to its root)
//! 0. **harmonic**: partials 1..=16 of the root, `w ~ 1/n`.
//! 1. **7-limit just intonation** over two octaves (1/1 8/7 7/6 5/4 4/3 7/5 3/2 8/5 5/3 7/4 15/8,
//!    then x2, and 4/1), `w ~ 1 / (1 + log2(n d))` (inverse Tenney height: simple ratios likelier).
//! 2. **19-EDO** over two octaves (steps of 63.16 cents), the steps nearest 5-limit consonances
//!    (0, 5, 6, 8, 11, 19 of each octave) five times likelier than the others.
//! 3. **Bohlen-Pierce**: 13 equal divisions of the tritave 3:1 (146.30 cents), degrees of the
//!    Lambda mode (0 2 3 4 6 7 9 10 12 13) three times likelier.
//!
//! Pad roots: `r(pad) = 55 Hz * 2^(pad / 8)`: four octaves from A1 across the 32 pads, each
//! column of 8 pads a further 150 cents up.
//!
//! # Glossary
//! - **cent**: 1/1200 octave; **root**: a pad's reference frequency; **table**: pitches with
//!   probabilities; **width** `sigma`: the gaussian's standard deviation in cents.
//! - **EDO**: equal division of the octave; **tritave**: the ratio 3:1 (1901.96 cents).
//!
//! # Worked example
//! Pad 8 (root 110 Hz), `y = 0.3` (table 1, just intonation), `x = 0`: every draw is one of the
//! table's 23 pitches, e.g. 3/2 -> 165 Hz with weight `1/(1 + log2 6) = 0.279` before
//! normalisation. With `x = 0.5` (sigma = 50 cents), 68 % of draws meant for 165 Hz fall within
//! `165 * 2^(+-50/1200)` = 160.3..169.8 Hz.

use super::rng::Rng;
use crate::slabs::PADS;

/// Pitch tables per pad (selected by `y`).
pub const TABLES_PER_PAD: usize = 4;
/// Gaussian standard deviation at `x = 1`, in cents.
pub const MAX_SIGMA_CENTS: f64 = 100.0;
/// Lowest frequency a draw may produce, in Hz.
pub const MIN_HZ: f64 = 20.0;
/// Highest frequency a draw may produce, in Hz (well below Nyquist, 22,050 Hz).
pub const MAX_HZ: f64 = 16_000.0;

/// One pitch probability table, in cents above a root.
#[derive(Debug, Clone)]
pub struct PitchTable {
    /// Name for reports.
    pub name: &'static str,
    /// Pitches in cents above the root.
    pub cents: Vec<f64>,
    /// Probabilities (sum 1), parallel to `cents`.
    pub weights: Vec<f64>,
    /// Cumulative probabilities; the last is 1.
    cdf: Vec<f64>,
}

impl PitchTable {
    fn new(name: &'static str, entries: Vec<(f64, f64)>) -> PitchTable {
        let total: f64 = entries.iter().map(|e| e.1).sum();
        let cents: Vec<f64> = entries.iter().map(|e| e.0).collect();
        let weights: Vec<f64> = entries.iter().map(|e| e.1 / total).collect();
        let mut acc = 0.0;
        let mut cdf: Vec<f64> = weights
            .iter()
            .map(|w| {
                acc += w;
                acc
            })
            .collect();
        if let Some(last) = cdf.last_mut() {
            *last = 1.0;
        }
        PitchTable {
            name,
            cents,
            weights,
            cdf,
        }
    }

    /// Index of the entry chosen by a uniform `u` in `[0, 1)`.
    #[inline]
    pub fn pick(&self, u: f64) -> usize {
        self.cdf
            .partition_point(|&c| c <= u)
            .min(self.cdf.len() - 1)
    }
}

fn cents_of(ratio: f64) -> f64 {
    1200.0 * ratio.log2()
}

fn harmonic() -> PitchTable {
    PitchTable::new(
        "harmonic",
        (1..=16)
            .map(|n| (cents_of(n as f64), 1.0 / n as f64))
            .collect(),
    )
}

fn just_7_limit() -> PitchTable {
    const RATIOS: [(u32, u32); 11] = [
        (1, 1),
        (8, 7),
        (7, 6),
        (5, 4),
        (4, 3),
        (7, 5),
        (3, 2),
        (8, 5),
        (5, 3),
        (7, 4),
        (15, 8),
    ];
    let mut entries = Vec::new();
    for octave in 0..2u32 {
        for &(n, d) in &RATIOS {
            let (n, d) = (n << octave, d);
            let w = 1.0 / (1.0 + ((n * d) as f64).log2());
            entries.push((cents_of(n as f64 / d as f64), w));
        }
    }
    entries.push((2400.0, 1.0 / 3.0));
    PitchTable::new("7-limit just", entries)
}

fn edo_19() -> PitchTable {
    const CONSONANT: [u32; 6] = [0, 5, 6, 8, 11, 19];
    let entries = (0..=38u32)
        .map(|k| {
            let w = if CONSONANT.contains(&(k % 19)) {
                5.0
            } else {
                1.0
            };
            (k as f64 * 1200.0 / 19.0, w)
        })
        .collect();
    PitchTable::new("19-EDO", entries)
}

fn bohlen_pierce() -> PitchTable {
    const LAMBDA: [u32; 10] = [0, 2, 3, 4, 6, 7, 9, 10, 12, 13];
    let step = cents_of(3.0) / 13.0;
    let entries = (0..=13u32)
        .map(|k| (k as f64 * step, if LAMBDA.contains(&k) { 3.0 } else { 1.0 }))
        .collect();
    PitchTable::new("Bohlen-Pierce", entries)
}

/// The four tables and the pad roots.
#[derive(Debug, Clone)]
pub struct Tables {
    tables: [PitchTable; TABLES_PER_PAD],
    roots_hz: [f64; PADS],
}

impl Default for Tables {
    fn default() -> Self {
        Self::new()
    }
}

impl Tables {
    /// The tables described in the module docs.
    pub fn new() -> Tables {
        let mut roots_hz = [0.0; PADS];
        for (p, r) in roots_hz.iter_mut().enumerate() {
            *r = 55.0 * (p as f64 / 8.0).exp2();
        }
        Tables {
            tables: [harmonic(), just_7_limit(), edo_19(), bohlen_pierce()],
            roots_hz,
        }
    }

    /// Table `i` (0..=3).
    pub fn table(&self, i: usize) -> &PitchTable {
        &self.tables[i.min(TABLES_PER_PAD - 1)]
    }

    /// Root frequency of `pad` in Hz.
    pub fn root_hz(&self, pad: usize) -> f64 {
        self.roots_hz[pad]
    }

    /// The table a pad's `y` selects: `floor(4 y)` clamped to 0..=3.
    #[inline]
    pub fn table_for_y(y: f32) -> usize {
        ((y.clamp(0.0, 1.0) * TABLES_PER_PAD as f32) as usize).min(TABLES_PER_PAD - 1)
    }

    /// The gaussian width a pad's `x` sets, in cents.
    #[inline]
    pub fn sigma_for_x(x: f32) -> f64 {
        f64::from(x.clamp(0.0, 1.0)) * MAX_SIGMA_CENTS
    }

    /// The exact pitches of `table` on `pad`, in Hz (what a draw with `sigma = 0` returns).
    pub fn frequencies_hz(&self, pad: usize, table: usize) -> Vec<f64> {
        let r = self.roots_hz[pad];
        self.table(table)
            .cents
            .iter()
            .map(|c| (r * (c / 1200.0).exp2()).clamp(MIN_HZ, MAX_HZ))
            .collect()
    }

    /// Draws a frequency in Hz from table `table` of `pad` convolved with a gaussian of
    /// `sigma_cents`. Allocation-free.
    #[inline]
    pub fn draw_hz(&self, pad: usize, table: usize, sigma_cents: f64, rng: &mut Rng) -> f64 {
        let t = self.table(table);
        let mut cents = t.cents[t.pick(rng.uniform())];
        if sigma_cents > 0.0 {
            cents += sigma_cents * rng.gaussian();
        }
        (self.roots_hz[pad] * (cents / 1200.0).exp2()).clamp(MIN_HZ, MAX_HZ)
    }

    /// The convolved density `p(c)` (per cent) of `table` with a gaussian of `sigma_cents > 0`,
    /// evaluated at `grid_cents`: the distribution the draws follow, computed the long way.
    pub fn density(&self, table: usize, sigma_cents: f64, grid_cents: &[f64]) -> Vec<f64> {
        let t = self.table(table);
        let norm = 1.0 / (sigma_cents * (2.0 * std::f64::consts::PI).sqrt());
        grid_cents
            .iter()
            .map(|&c| {
                t.cents
                    .iter()
                    .zip(&t.weights)
                    .map(|(ck, wk)| {
                        let z = (c - ck) / sigma_cents;
                        wk * norm * (-0.5 * z * z).exp()
                    })
                    .sum()
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_normalised_and_controls_map_as_documented() {
        let t = Tables::new();
        for i in 0..TABLES_PER_PAD {
            let s: f64 = t.table(i).weights.iter().sum();
            assert!((s - 1.0).abs() < 1e-12, "{}", t.table(i).name);
        }
        assert_eq!(Tables::table_for_y(0.0), 0);
        assert_eq!(Tables::table_for_y(0.3), 1);
        assert_eq!(Tables::table_for_y(0.74), 2);
        assert_eq!(Tables::table_for_y(1.0), 3);
        assert_eq!(Tables::sigma_for_x(0.5), 50.0);
        assert_eq!(t.root_hz(8), 110.0);
        // The worked example: 3/2 on pad 8 is 165 Hz with weight 1 / (1 + log2 6).
        let just = t.table(1);
        let i = just
            .cents
            .iter()
            .position(|c| (c - cents_of(1.5)).abs() < 1e-9);
        let i = i.unwrap();
        let raw_total: f64 = just.weights.iter().sum::<f64>();
        assert!((raw_total - 1.0).abs() < 1e-12);
        assert_eq!(just.cents.len(), 23);
        let f = t.frequencies_hz(8, 1)[i];
        assert!((f - 165.0).abs() < 1e-9);
    }

    #[test]
    fn zero_width_draws_land_on_table_pitches() {
        let t = Tables::new();
        let mut rng = Rng::new(3);
        for table in 0..TABLES_PER_PAD {
            let allowed = t.frequencies_hz(5, table);
            for _ in 0..500 {
                let f = t.draw_hz(5, table, 0.0, &mut rng);
                assert!(allowed.iter().any(|a| (a - f).abs() < 1e-9), "{f} Hz");
            }
        }
    }

    #[test]
    fn draws_follow_the_convolved_density() {
        // Histogram of many draws (in cents) against the explicit convolution.
        let t = Tables::new();
        let mut rng = Rng::new(11);
        let (table, sigma, pad) = (2, 30.0, 0);
        let root = t.root_hz(pad);
        let n = 200_000;
        let bin = 25.0;
        let bins = 120; // -500 .. 2500 cents
        let lo = -500.0;
        let mut hist = vec![0.0; bins];
        for _ in 0..n {
            let f = t.draw_hz(pad, table, sigma, &mut rng);
            let c = 1200.0 * (f / root).log2();
            let i = ((c - lo) / bin).floor();
            if i >= 0.0 && (i as usize) < bins {
                hist[i as usize] += 1.0 / (n as f64 * bin);
            }
        }
        let grid: Vec<f64> = (0..bins).map(|i| lo + (i as f64 + 0.5) * bin).collect();
        let dens = t.density(table, sigma, &grid);
        let l1: f64 = hist
            .iter()
            .zip(&dens)
            .map(|(h, d)| (h - d).abs() * bin)
            .sum();
        // Total variation distance (with binning error) stays small.
        assert!(l1 < 0.05, "L1 distance {l1}");
    }
}
