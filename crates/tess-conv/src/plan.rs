//! How an impulse response is cut into partitions: the levels of a non-uniform partitioned
//! convolution and the choice of their sizes (Gardner 1995; Wefers 2015, "Partitioned
//! convolution algorithms for real-time auralization", chapter 5).
//!
//! A plan is a rising sequence of partition sizes, each a power of two times the audio block.
//! Level 0 has the block's size and runs in the audio callback with no latency. Every later
//! level `k` of size `N` starts at offset exactly `2 N` into the impulse response: its input
//! block is complete at time `(j+1) N` and its output is first needed at `(j+2) N`, which gives
//! the level one whole period of its own to compute (Gardner's condition). The partitions of
//! each level fill the response up to where the next level starts, so a plan is determined by
//! its sizes alone; the last level covers the rest.

use std::fmt;

/// One level: `partitions` partitions of `size` samples starting at `offset` in the response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Level {
    /// Partition (and FFT hop) size in samples; the FFT is twice this.
    pub size: usize,
    /// First sample of the response that this level convolves with.
    pub offset: usize,
    /// Number of partitions of `size` samples.
    pub partitions: usize,
}

impl Level {
    /// One past the last response sample this level covers.
    pub fn end(&self) -> usize {
        self.offset + self.size * self.partitions
    }
}

/// A partitioning of a response of `ir_len` samples for audio blocks of `block` samples.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Audio block (level 0's size).
    pub block: usize,
    /// Length of the impulse response.
    pub ir_len: usize,
    /// Levels, smallest first.
    pub levels: Vec<Level>,
}

/// Why a plan cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The block is not a power of two of at least 8 samples.
    #[error("block size {0} is not a power of two between 8 and 8192")]
    Block(usize),
    /// A partition size is not a power-of-two multiple of the block, or sizes do not rise.
    #[error("partition sizes {0:?} must rise, each a power of two at least twice the block {1}")]
    Sizes(Vec<usize>, usize),
    /// The response is empty.
    #[error("the impulse response is empty")]
    Empty,
    /// A level would start beyond the end of the response.
    #[error("partition size {size} starts at offset {offset}, beyond the response's {ir_len} samples; use smaller partitions")]
    TooLarge {
        /// The level's size.
        size: usize,
        /// Where it would start.
        offset: usize,
        /// Response length.
        ir_len: usize,
    },
}

impl Plan {
    /// The plan with level 0 of `block` samples followed by `sizes` (rising powers of two,
    /// each at least twice the block). `sizes` may be empty: one uniform level.
    pub fn with_sizes(block: usize, ir_len: usize, sizes: &[usize]) -> Result<Plan, PlanError> {
        if !block.is_power_of_two() || !(8..=8192).contains(&block) {
            return Err(PlanError::Block(block));
        }
        if ir_len == 0 {
            return Err(PlanError::Empty);
        }
        let mut prev = block;
        for &s in sizes {
            if !s.is_power_of_two() || s < 2 * prev {
                return Err(PlanError::Sizes(sizes.to_vec(), block));
            }
            prev = s;
        }
        let mut levels = Vec::with_capacity(sizes.len() + 1);
        let mut all = vec![block];
        all.extend_from_slice(sizes);
        for (i, &size) in all.iter().enumerate() {
            let offset = if i == 0 { 0 } else { 2 * size };
            if offset >= ir_len {
                return Err(PlanError::TooLarge {
                    size,
                    offset,
                    ir_len,
                });
            }
            let end = match all.get(i + 1) {
                Some(&next) => (2 * next).min(ir_len),
                None => ir_len,
            };
            levels.push(Level {
                size,
                offset,
                partitions: (end - offset).div_ceil(size),
            });
        }
        Ok(Plan {
            block,
            ir_len,
            levels,
        })
    }

    /// The cheapest plan under `model` for `objective`, among all rising sequences of sizes
    /// from twice the block up to `max_size` (Wefers's exhaustive search over size sequences;
    /// with power-of-two sizes there are at most 2^11 candidates).
    pub fn optimal(
        block: usize,
        ir_len: usize,
        max_size: usize,
        model: &CostModel,
        objective: Objective,
    ) -> Result<Plan, PlanError> {
        let mut candidates = Vec::new();
        let mut s = 2 * block;
        while s <= max_size && 2 * s < ir_len {
            candidates.push(s);
            s *= 2;
        }
        let mut best = Plan::with_sizes(block, ir_len, &[])?;
        let mut best_cost = best.cost(model, objective);
        for mask in 1u32..(1 << candidates.len()) {
            let sizes: Vec<usize> = (0..candidates.len())
                .filter(|i| mask & (1 << i) != 0)
                .map(|i| candidates[i])
                .collect();
            if let Ok(p) = Plan::with_sizes(block, ir_len, &sizes) {
                let c = p.cost(model, objective);
                if c < best_cost {
                    best = p;
                    best_cost = c;
                }
            }
        }
        Ok(best)
    }

    /// The plan's cost in model nanoseconds per audio block: the mean over a period of the
    /// largest level, or the worst single callback when every level's work is spread over
    /// the callbacks of its period as [`crate::Mode::TimeDistributed`] spreads it.
    pub fn cost(&self, model: &CostModel, objective: Objective) -> f64 {
        match objective {
            Objective::MeanLoad => self
                .levels
                .iter()
                .map(|l| model.level_ns(l) * self.block as f64 / l.size as f64)
                .sum(),
            Objective::WorstCallback => {
                let period = self.levels.last().map_or(1, |l| l.size / self.block);
                (0..period)
                    .map(|t| {
                        self.levels
                            .iter()
                            .enumerate()
                            .map(|(k, l)| model.slot_ns(l, k, self.block, t))
                            .sum::<f64>()
                    })
                    .fold(0.0, f64::max)
            }
        }
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .levels
            .iter()
            .map(|l| format!("{}x{}", l.partitions, l.size))
            .collect();
        write!(f, "{}", parts.join(" + "))
    }
}

/// What a plan is optimised for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Objective {
    /// Least work per block on average: right when long levels run preemptively (or
    /// synchronously, offline), because only the mean load must fit the hart.
    MeanLoad,
    /// Least work in the heaviest callback: right for time-distributed levels, whose largest
    /// indivisible step (an FFT) must fit inside one callback.
    WorstCallback,
}

/// Costs of the two kinds of work, in nanoseconds: an FFT of `n` real samples costs
/// `fft_ns_per_nlogn * n * log2 n`; one complex multiply-add on one frequency bin costs
/// `mac_ns`. [`CostModel::measure`] times this machine.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    /// Nanoseconds per `n log2 n` of a real FFT (forward or inverse) of `n` points.
    pub fft_ns_per_nlogn: f64,
    /// Nanoseconds per complex multiply-accumulate.
    pub mac_ns: f64,
}

impl Default for CostModel {
    /// Figures of a 2020s x86-64 core: good enough to rank plans when not measured.
    fn default() -> Self {
        CostModel {
            fft_ns_per_nlogn: 0.12,
            mac_ns: 0.35,
        }
    }
}

impl CostModel {
    /// Times a 4096-point real FFT pair and a multiply-accumulate pass on this machine.
    pub fn measure() -> CostModel {
        use std::time::Instant;
        let n = 4096;
        let mut level = crate::level::Spectra::zeroed(n / 2, 8);
        let mut fft = crate::level::Fft::new(n / 2);
        let mut buf = vec![0.5f32; n];
        let reps = 200;
        let t = Instant::now();
        for _ in 0..reps {
            fft.forward_into(&mut buf, &mut level, 0);
        }
        let fft_ns = t.elapsed().as_nanos() as f64 / reps as f64;
        let t = Instant::now();
        let mut acc = crate::level::SplitSpectrum::zeroed(n / 2 + 1);
        for _ in 0..reps {
            for p in 0..8 {
                acc.mac(&level.get(p), &level.get((p + 1) % 8));
            }
        }
        let mac_ns = t.elapsed().as_nanos() as f64 / (reps * 8 * (n / 2 + 1)) as f64;
        let nlogn = n as f64 * (n as f64).log2();
        CostModel {
            fft_ns_per_nlogn: fft_ns / nlogn,
            mac_ns,
        }
    }

    /// One forward or inverse FFT of the level (2 `size` real points).
    pub fn fft_ns(&self, l: &Level) -> f64 {
        let n = (2 * l.size) as f64;
        self.fft_ns_per_nlogn * n * n.log2()
    }

    /// Multiply-accumulate of one partition.
    pub fn mac_partition_ns(&self, l: &Level) -> f64 {
        self.mac_ns * (l.size + 1) as f64
    }

    /// All the work of one step of the level: forward FFT, every partition, inverse FFT.
    pub fn level_ns(&self, l: &Level) -> f64 {
        2.0 * self.fft_ns(l) + l.partitions as f64 * self.mac_partition_ns(l)
    }

    /// The work level `k` does in callback `t` of its period when time-distributed
    /// (the same schedule as [`crate::level::Schedule`]).
    fn slot_ns(&self, l: &Level, k: usize, block: usize, t: usize) -> f64 {
        let slots = l.size / block;
        if k == 0 || slots <= 1 {
            return self.level_ns(l);
        }
        let s = crate::level::Schedule::new(k, slots, l.partitions);
        let slot = t % slots;
        let (p0, p1) = s.partitions_in(slot);
        let mut ns = (p1 - p0) as f64 * self.mac_partition_ns(l);
        if slot == s.forward_slot {
            ns += self.fft_ns(l);
        }
        if slot == slots - 1 {
            ns += self.fft_ns(l);
        }
        ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_tile_the_response_without_gaps() {
        let p = Plan::with_sizes(32, 524_288, &[256, 2048, 16384]).unwrap();
        assert_eq!(
            p.levels[0],
            Level {
                size: 32,
                offset: 0,
                partitions: 16
            }
        );
        for w in p.levels.windows(2) {
            assert_eq!(w[0].end(), w[1].offset, "{p}");
            assert_eq!(w[1].offset, 2 * w[1].size);
        }
        assert!(p.levels.last().unwrap().end() >= 524_288);
    }

    #[test]
    fn bad_sizes_are_refused_with_a_reason() {
        assert_eq!(Plan::with_sizes(30, 100, &[]), Err(PlanError::Block(30)));
        assert!(matches!(
            Plan::with_sizes(32, 1000, &[48]),
            Err(PlanError::Sizes(..))
        ));
        assert!(matches!(
            Plan::with_sizes(32, 1000, &[64, 64]),
            Err(PlanError::Sizes(..))
        ));
        assert!(matches!(
            Plan::with_sizes(32, 1000, &[512]),
            Err(PlanError::TooLarge { .. })
        ));
        assert_eq!(Plan::with_sizes(32, 0, &[]), Err(PlanError::Empty));
    }

    #[test]
    fn the_optimum_is_no_worse_than_uniform_or_a_hand_made_plan() {
        let m = CostModel::default();
        for obj in [Objective::MeanLoad, Objective::WorstCallback] {
            let best = Plan::optimal(32, 524_288, 65536, &m, obj).unwrap();
            let uniform = Plan::with_sizes(32, 524_288, &[]).unwrap();
            let hand = Plan::with_sizes(32, 524_288, &[256, 2048, 16384]).unwrap();
            assert!(best.cost(&m, obj) <= uniform.cost(&m, obj));
            assert!(best.cost(&m, obj) <= hand.cost(&m, obj));
            assert!(best.levels.len() > 1, "{best}");
        }
    }

    #[test]
    fn spreading_work_favours_smaller_largest_partitions() {
        let m = CostModel::default();
        let mean = Plan::optimal(32, 524_288, 65536, &m, Objective::MeanLoad).unwrap();
        let worst = Plan::optimal(32, 524_288, 65536, &m, Objective::WorstCallback).unwrap();
        assert!(worst.levels.last().unwrap().size <= mean.levels.last().unwrap().size);
    }
}
