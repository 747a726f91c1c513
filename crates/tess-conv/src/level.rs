//! One level of the convolution: uniformly partitioned overlap-save with a frequency-domain
//! delay line (UPOLS; Wefers 2015 section 4.3). Every `N` input samples the level transforms
//! the last `2 N` of them, multiplies the spectra of the last `P` input blocks with the `P`
//! partition spectra of its segment of the response, and transforms the sum back; the second
//! half of the result is the level's `N` output samples.
//!
//! The work of one step is split into the pieces a scheduler can place separately: the forward
//! FFT, the multiply-accumulate of any range of partitions, and the inverse FFT.

use crate::plan::Level;
use realfft::num_complex::Complex32;
use realfft::{ComplexToReal, RealFftPlanner, RealToComplex};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// A real FFT pair of `2 size` points with its scratch space.
pub(crate) struct Fft {
    r2c: Arc<dyn RealToComplex<f32>>,
    c2r: Arc<dyn ComplexToReal<f32>>,
    bins: Vec<Complex32>,
    scratch: Vec<Complex32>,
}

impl Fft {
    pub(crate) fn new(size: usize) -> Fft {
        let mut planner = RealFftPlanner::<f32>::new();
        let r2c = planner.plan_fft_forward(2 * size);
        let c2r = planner.plan_fft_inverse(2 * size);
        let scratch_len = r2c.get_scratch_len().max(c2r.get_scratch_len());
        Fft {
            r2c,
            c2r,
            bins: vec![Complex32::default(); size + 1],
            scratch: vec![Complex32::default(); scratch_len],
        }
    }

    /// Transforms `time` (2 size samples; used as scratch) into slot `slot` of `into`.
    pub(crate) fn forward_into(&mut self, time: &mut [f32], into: &mut Spectra, slot: usize) {
        self.r2c
            .process_with_scratch(time, &mut self.bins, &mut self.scratch)
            .expect("buffer lengths fixed at construction");
        let (re, im) = into.get_mut(slot);
        for ((r, i), c) in re.iter_mut().zip(im.iter_mut()).zip(&self.bins) {
            *r = c.re;
            *i = c.im;
        }
    }

    /// Transforms `spectrum` back into `time` (2 size samples), unscaled.
    pub(crate) fn inverse(&mut self, spectrum: &SplitSpectrum, time: &mut [f32]) {
        for ((c, r), i) in self.bins.iter_mut().zip(&spectrum.re).zip(&spectrum.im) {
            *c = Complex32::new(*r, *i);
        }
        // A real signal's DC and Nyquist bins are real; rounding must not make them otherwise.
        let last = self.bins.len() - 1;
        self.bins[0].im = 0.0;
        self.bins[last].im = 0.0;
        self.c2r
            .process_with_scratch(&mut self.bins, time, &mut self.scratch)
            .expect("buffer lengths fixed at construction");
    }
}

/// `count` spectra of `size + 1` bins, real and imaginary parts in separate arrays so that the
/// multiply-accumulate loop vectorises.
pub(crate) struct Spectra {
    bins: usize,
    re: Vec<f32>,
    im: Vec<f32>,
}

impl Spectra {
    pub(crate) fn zeroed(size: usize, count: usize) -> Spectra {
        let bins = size + 1;
        Spectra {
            bins,
            re: vec![0.0; bins * count],
            im: vec![0.0; bins * count],
        }
    }

    pub(crate) fn get(&self, slot: usize) -> (&[f32], &[f32]) {
        let r = slot * self.bins..(slot + 1) * self.bins;
        (&self.re[r.clone()], &self.im[r])
    }

    fn clear(&mut self, slot: usize) {
        let (re, im) = self.get_mut(slot);
        re.fill(0.0);
        im.fill(0.0);
    }

    fn get_mut(&mut self, slot: usize) -> (&mut [f32], &mut [f32]) {
        let r = slot * self.bins..(slot + 1) * self.bins;
        (&mut self.re[r.clone()], &mut self.im[r])
    }
}

/// One spectrum being accumulated.
pub(crate) struct SplitSpectrum {
    re: Vec<f32>,
    im: Vec<f32>,
}

impl SplitSpectrum {
    pub(crate) fn zeroed(bins: usize) -> SplitSpectrum {
        SplitSpectrum {
            re: vec![0.0; bins],
            im: vec![0.0; bins],
        }
    }

    fn clear(&mut self) {
        self.re.fill(0.0);
        self.im.fill(0.0);
    }

    /// `self += x * h`, bin by bin.
    pub(crate) fn mac(&mut self, x: &(&[f32], &[f32]), h: &(&[f32], &[f32])) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU has AVX2 and FMA (checked just above), the only features the
            // function adds.
            unsafe { mac_avx2(&mut self.re, &mut self.im, x, h) };
            return;
        }
        mac_portable(&mut self.re, &mut self.im, x, h);
    }
}

#[inline(always)]
fn mac_portable(
    acc_re: &mut [f32],
    acc_im: &mut [f32],
    (xr, xi): &(&[f32], &[f32]),
    (hr, hi): &(&[f32], &[f32]),
) {
    let n = acc_re.len();
    let (xr, xi, hr, hi, acc_im) = (&xr[..n], &xi[..n], &hr[..n], &hi[..n], &mut acc_im[..n]);
    for i in 0..n {
        acc_re[i] += xr[i] * hr[i] - xi[i] * hi[i];
        acc_im[i] += xr[i] * hi[i] + xi[i] * hr[i];
    }
}

/// The same loop compiled for AVX2 with FMA (8 bins per instruction).
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn mac_avx2(
    acc_re: &mut [f32],
    acc_im: &mut [f32],
    x: &(&[f32], &[f32]),
    h: &(&[f32], &[f32]),
) {
    mac_portable(acc_re, acc_im, x, h)
}

/// Where time-distributed work of level `k` goes within the `slots` callbacks of its period:
/// the forward FFT in `forward_slot`, the partitions spread evenly from there to the last slot,
/// the inverse FFT in the last. Deeper levels start their FFT a few slots later than shallower
/// ones, so that the FFTs of levels whose periods begin together do not pile into one callback.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Schedule {
    pub(crate) forward_slot: usize,
    slots: usize,
    partitions: usize,
}

impl Schedule {
    pub(crate) fn new(k: usize, slots: usize, partitions: usize) -> Schedule {
        let forward_slot = (k.saturating_sub(1) * 2).min(slots / 4).min(slots - 1);
        Schedule {
            forward_slot,
            slots,
            partitions,
        }
    }

    /// The partitions `[p0, p1)` whose multiply-accumulate runs in `slot`.
    pub(crate) fn partitions_in(&self, slot: usize) -> (usize, usize) {
        if slot < self.forward_slot {
            return (0, 0);
        }
        let m = self.slots - self.forward_slot;
        let i = slot - self.forward_slot;
        (i * self.partitions / m, (i + 1) * self.partitions / m)
    }

    pub(crate) fn is_last(&self, slot: usize) -> bool {
        slot + 1 == self.slots
    }
}

/// A long level's input, in three halves of `size` samples: input period `p` fills half
/// `p % 3`, and the step started at its end transforms halves `(p - 1) % 3` and `p % 3`. While
/// that step runs (one whole period) the audio thread fills the third half, so a worker never
/// reads what the audio thread writes, and the audio thread never copies a whole window.
///
/// The samples are atomics (their bits, stored and loaded relaxed: plain moves) because a step
/// that overruns its period may still be reading a half when the audio thread starts refilling
/// it. `writing` (the period being filled, a seqlock-style counter) tells the step afterwards:
/// a window read after its older half began to be refilled is replaced by silence, so a late
/// step never feeds the delay line a mix of two periods' input.
pub(crate) struct InputHalves {
    halves: [Box<[AtomicU32]>; 3],
    writing: AtomicU64,
}

impl InputHalves {
    pub(crate) fn new(size: usize) -> InputHalves {
        let half = || {
            (0..size)
                .map(|_| AtomicU32::new(0))
                .collect::<Box<[AtomicU32]>>()
        };
        InputHalves {
            halves: [half(), half(), half()],
            writing: AtomicU64::new(0),
        }
    }

    /// The audio thread starts filling `period`'s half (before its first write there).
    pub(crate) fn begin_period(&self, period: u64) {
        self.writing.store(period, Ordering::Relaxed);
        // Orders the store before this period's sample stores (seqlock writer side).
        fence(Ordering::Release);
    }

    /// Stores `block` at `offset` of input period `period`'s half.
    pub(crate) fn write(&self, period: u64, offset: usize, block: &[f32]) {
        let half = &self.halves[(period % 3) as usize][offset..offset + block.len()];
        for (slot, x) in half.iter().zip(block) {
            slot.store(x.to_bits(), Ordering::Relaxed);
        }
    }

    /// Copies the window of the step that follows input period `period` into `window`
    /// (2 size samples: the older half, then the newer).
    fn gather(&self, period: u64, window: &mut [f32]) {
        let n = window.len() / 2;
        let older = &self.halves[((period + 2) % 3) as usize];
        let newer = &self.halves[(period % 3) as usize];
        for (w, x) in window[..n].iter_mut().zip(older.iter()) {
            *w = f32::from_bits(x.load(Ordering::Relaxed));
        }
        for (w, x) in window[n..].iter_mut().zip(newer.iter()) {
            *w = f32::from_bits(x.load(Ordering::Relaxed));
        }
        // Seqlock reader side: if the loads above saw any store of period + 2 (which refills
        // the older half), this load sees `writing` >= period + 2.
        fence(Ordering::Acquire);
        if self.writing.load(Ordering::Relaxed) > period + 1 {
            window.fill(0.0);
        }
    }
}

/// The work of one level: partition spectra, delay line, and the buffers of one step.
pub(crate) struct LevelJob {
    pub(crate) level: Level,
    fft: Fft,
    /// The response's partitions, transformed and scaled by 1 / (2 size).
    h: Spectra,
    /// The last `partitions` input spectra; `head` is the newest.
    fdl: Spectra,
    head: usize,
    /// The `2 size` input samples of the step being computed (destroyed by the FFT).
    pub(crate) input: Vec<f32>,
    /// For a long level: the input period whose end started the step.
    pub(crate) period: u64,
    /// The period of the last window transformed into the delay line.
    forwarded: Option<u64>,
    acc: SplitSpectrum,
    time: Vec<f32>,
    /// The step's `size` output samples.
    pub(crate) out: Vec<f32>,
}

impl LevelJob {
    /// Prepares the level for `ir` (the whole response; the level takes its segment).
    pub(crate) fn new(level: Level, ir: &[f32]) -> LevelJob {
        let n = level.size;
        let mut fft = Fft::new(n);
        let mut h = Spectra::zeroed(n, level.partitions);
        let scale = 1.0 / (2 * n) as f32;
        let mut time = vec![0.0f32; 2 * n];
        for p in 0..level.partitions {
            time.fill(0.0);
            let start = (level.offset + p * n).min(ir.len());
            let end = (start + n).min(ir.len());
            for (t, x) in time.iter_mut().zip(&ir[start..end]) {
                *t = x * scale;
            }
            fft.forward_into(&mut time, &mut h, p);
        }
        LevelJob {
            level,
            fft,
            h,
            fdl: Spectra::zeroed(n, level.partitions),
            head: 0,
            input: vec![0.0; 2 * n],
            period: 0,
            forwarded: None,
            acc: SplitSpectrum::zeroed(n + 1),
            time,
            out: vec![0.0; n],
        }
    }

    /// Fills `input` with the step's window from `halves` (long levels, before [`Self::forward`]).
    pub(crate) fn gather(&mut self, halves: &InputHalves) {
        halves.gather(self.period, &mut self.input);
    }

    /// Step part 1: transform `input` into the delay line's new head; clears the sum.
    ///
    /// For a long level, windows skipped since the last forward (a step that overran its
    /// period, see [`crate::WhenLate::Drop`]) enter the delay line as silence first, so every
    /// partition keeps multiplying the spectrum of its own period: the skipped input is missing
    /// from the tail, never misplaced in it.
    pub(crate) fn forward(&mut self) {
        let parts = self.level.partitions;
        if let Some(last) = self.forwarded {
            let skipped = self.period.saturating_sub(last + 1).min(parts as u64) as usize;
            for _ in 0..skipped {
                self.head = (self.head + 1) % parts;
                self.fdl.clear(self.head);
            }
        }
        self.forwarded = Some(self.period);
        self.head = (self.head + 1) % parts;
        self.fft
            .forward_into(&mut self.input, &mut self.fdl, self.head);
        self.acc.clear();
    }

    /// Step part 2: multiply-accumulate partitions `p0..p1`.
    pub(crate) fn mac(&mut self, p0: usize, p1: usize) {
        let parts = self.level.partitions;
        for p in p0..p1 {
            let x = self.fdl.get((self.head + parts - p) % parts);
            self.acc.mac(&x, &self.h.get(p));
        }
    }

    /// Step part 3: transform the sum back; the second half is the output.
    pub(crate) fn inverse(&mut self) {
        self.fft.inverse(&self.acc, &mut self.time);
        let n = self.level.size;
        self.out.copy_from_slice(&self.time[n..]);
    }

    /// The whole step.
    pub(crate) fn run(&mut self) {
        self.forward();
        self.mac(0, self.level.partitions);
        self.inverse();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schedule_covers_every_partition_once_and_in_order() {
        for (k, slots, parts) in [
            (1, 8, 14),
            (2, 64, 14),
            (3, 512, 30),
            (1, 2, 3),
            (5, 4, 100),
        ] {
            let s = Schedule::new(k, slots, parts);
            let mut next = 0;
            for slot in 0..slots {
                let (p0, p1) = s.partitions_in(slot);
                if slot < s.forward_slot {
                    assert_eq!((p0, p1), (0, 0), "no work before the forward FFT");
                } else {
                    assert_eq!(p0, next, "slot {slot} continues where the last stopped");
                    next = p1;
                }
            }
            assert_eq!(next, parts);
            assert!(s.forward_slot < slots);
        }
    }
}
