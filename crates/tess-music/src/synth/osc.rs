//! A bank of sinusoidal oscillators computed as recursive quadrature oscillators, 8 lanes wide.
//!
//! # The recursion
//! Each oscillator is a complex number `z = a e^{i phi}` rotated once per sample by
//! `w = e^{i theta}` with `theta = 2 pi f / fs`:
//!
//! ```text
//! re' = re * cos(theta) - im * sin(theta)
//! im' = re * sin(theta) + im * cos(theta)          output = re = a cos(phi)
//! ```
//!
//! Four multiplies (two of them fused into adds) per sample instead of a sine evaluation, and
//! changing `f` only changes `w`: the phase stays continuous, so a migrating oscillator never
//! clicks. In `f32` each rotation changes `|z|` by about one ulp; once per block of 32 frames
//! one Newton step towards `|z| = a` puts it back:
//!
//! ```text
//! g  = 1.5 - 0.5 |z|^2 / a^2   (= 1 - eps/2 for |z|^2 = a^2 (1 + eps))   z <- g z
//! ```
//!
//! which leaves a relative error of `eps^2`, about 1e-12 after a block.
//!
//! # Layout and speed
//! Oscillators are stored "array of structs of arrays": chunks of [`LANES`] = 8 oscillators
//! (one AVX register per field), each chunk holding `re, im, cos, sin, 1/a^2`. The kernel keeps
//! [`GROUP`] = 4 chunks (32 oscillators) in registers and runs them through all 32 frames of the
//! block: the rotation of a chunk depends on its previous frame (a multiply then a fused
//! multiply-add, about 8 cycles of latency), so four independent chunks are needed to keep both
//! floating-point pipes busy. Per frame and group: 8 multiplies, 8 FMAs and 4 adds into the
//! frame's 8-lane accumulator, i.e. 20 vector operations for 32 oscillator-samples, about
//! 0.3 cycles per oscillator-sample. At 3 GHz a 725.6 us package (32 frames) then holds some
//! 200,000 oscillators in theory; see `measure::max_oscillators_per_hart` for what a hart does.
//!
//! The kernel is plain Rust over fixed-size arrays, which LLVM vectorises. On x86-64 it is
//! compiled twice: once for the baseline target (SSE2) and once with AVX2 + FMA enabled, chosen
//! at run time (`is_x86_feature_detected!`, which caches its answer in an atomic).
//!
//! # Glossary
//! - **rotation** `w`: `(cos theta, sin theta)`, the per-sample phase step; **lane**: one
//!   oscillator's slot in an 8-wide chunk; **chunk**: 8 oscillators; **group**: 4 chunks
//!   rendered together; **oscillator-sample**: one oscillator advanced by one frame.
//!
//! # Worked example
//! 440 Hz at 44.1 kHz: `theta = 2 pi 440 / 44100 = 0.062689 rad`, `w = 0.998036 + 0.062648 i`.
//! After 32 frames (one package) the phase has advanced `32 theta = 2.00606 rad`.

use crate::slabs::{FRAMES_PER_PACKAGE, SAMPLE_RATE_HZ};

/// Oscillators per chunk (one 256-bit register of `f32`).
pub const LANES: usize = 8;
/// Chunks processed together to hide the rotation's latency.
pub const GROUP: usize = 4;
const FRAMES: usize = FRAMES_PER_PACKAGE;

/// Eight oscillators, field by field.
#[derive(Debug, Clone, Copy, Default)]
#[repr(C, align(32))]
pub struct Chunk {
    re: [f32; LANES],
    im: [f32; LANES],
    cos: [f32; LANES],
    sin: [f32; LANES],
    /// `1 / a^2`, or 0 for silent (padding) lanes.
    inv_amp2: [f32; LANES],
}

/// Per-frame, per-lane partial sums of a block: `acc[frame][lane]`.
pub type Accumulator = [[f32; LANES]; FRAMES];

/// A bank of oscillators.
#[derive(Debug, Clone)]
pub struct OscBank {
    chunks: Box<[Chunk]>,
    len: usize,
}

/// Rotation `(cos theta, sin theta)` for `hz`.
#[inline]
pub fn rotation(hz: f64) -> (f32, f32) {
    let theta = std::f64::consts::TAU * hz / f64::from(SAMPLE_RATE_HZ);
    let (s, c) = theta.sin_cos();
    (c as f32, s as f32)
}

impl OscBank {
    /// `len` silent oscillators (amplitude 0, 0 Hz).
    pub fn new(len: usize) -> OscBank {
        OscBank {
            chunks: vec![
                Chunk {
                    cos: [1.0; LANES],
                    ..Chunk::default()
                };
                len.div_ceil(LANES)
            ]
            .into_boxed_slice(),
            len,
        }
    }

    /// Number of oscillators.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the bank has no oscillators.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Sets oscillator `i` to `hz` with amplitude `amp` and phase `phase` (radians).
    pub fn set(&mut self, i: usize, hz: f64, amp: f32, phase: f64) {
        let (ch, l) = (&mut self.chunks[i / LANES], i % LANES);
        let (s, c) = phase.sin_cos();
        ch.re[l] = amp * c as f32;
        ch.im[l] = amp * s as f32;
        ch.inv_amp2[l] = if amp > 0.0 { 1.0 / (amp * amp) } else { 0.0 };
        (ch.cos[l], ch.sin[l]) = rotation(hz);
    }

    /// Retunes oscillator `i` to `hz`, keeping its phase and amplitude.
    #[inline]
    pub fn set_frequency(&mut self, i: usize, hz: f64) {
        let (ch, l) = (&mut self.chunks[i / LANES], i % LANES);
        (ch.cos[l], ch.sin[l]) = rotation(hz);
    }

    /// Frequency of oscillator `i` in Hz (from its rotation).
    pub fn frequency(&self, i: usize) -> f64 {
        let (ch, l) = (&self.chunks[i / LANES], i % LANES);
        f64::from(ch.sin[l]).atan2(f64::from(ch.cos[l])) * f64::from(SAMPLE_RATE_HZ)
            / std::f64::consts::TAU
    }

    /// Amplitude `|z|` of oscillator `i`.
    pub fn amplitude(&self, i: usize) -> f32 {
        let (ch, l) = (&self.chunks[i / LANES], i % LANES);
        ch.re[l].hypot(ch.im[l])
    }

    /// Adds the next 32 frames of every oscillator into `acc[frame][lane]` and advances the
    /// bank by one block. Allocation-free.
    pub fn render(&mut self, acc: &mut Accumulator) {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                // SAFETY: the CPU supports AVX2 and FMA, checked just above, which is the only
                // requirement of a `#[target_feature(enable = "avx2,fma")]` function.
                unsafe { render_avx2_fma(&mut self.chunks, acc) };
                return;
            }
        }
        render_chunks::<Separate>(&mut self.chunks, acc);
    }

    /// Renders with the portable kernel only (for comparing the two in tests and benches).
    pub fn render_portable(&mut self, acc: &mut Accumulator) {
        render_chunks::<Separate>(&mut self.chunks, acc);
    }
}

/// Sums the lanes of an accumulator into one sample per frame.
#[inline]
pub fn fold_lanes(acc: &Accumulator, out: &mut [f32; FRAMES]) {
    for (o, a) in out.iter_mut().zip(acc) {
        let s = ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
        *o = s;
    }
}

/// Multiply-add, fused or not (Rust never fuses on its own).
trait MulAdd {
    /// `a * b + c`.
    fn mul_add(a: f32, b: f32, c: f32) -> f32;
}

/// Separate multiply and add: the portable form.
struct Separate;
impl MulAdd for Separate {
    #[inline(always)]
    fn mul_add(a: f32, b: f32, c: f32) -> f32 {
        a * b + c
    }
}

/// Fused multiply-add: only inside functions compiled with the `fma` target feature, where it
/// becomes one `vfmadd` instead of a call to `fmaf`.
#[cfg(target_arch = "x86_64")]
struct Fused;
#[cfg(target_arch = "x86_64")]
impl MulAdd for Fused {
    #[inline(always)]
    fn mul_add(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn render_avx2_fma(chunks: &mut [Chunk], acc: &mut Accumulator) {
    render_chunks::<Fused>(chunks, acc);
}

#[inline(always)]
fn render_chunks<M: MulAdd>(chunks: &mut [Chunk], acc: &mut Accumulator) {
    let mut groups = chunks.chunks_exact_mut(GROUP);
    for g in &mut groups {
        render_group::<M, GROUP>(g, acc);
    }
    for c in groups.into_remainder().chunks_exact_mut(1) {
        render_group::<M, 1>(c, acc);
    }
}

#[inline(always)]
fn render_group<M: MulAdd, const G: usize>(chunks: &mut [Chunk], acc: &mut Accumulator) {
    let mut re = [[0f32; LANES]; G];
    let mut im = [[0f32; LANES]; G];
    let mut cos = [[0f32; LANES]; G];
    let mut sin = [[0f32; LANES]; G];
    for g in 0..G {
        re[g] = chunks[g].re;
        im[g] = chunks[g].im;
        cos[g] = chunks[g].cos;
        sin[g] = chunks[g].sin;
    }
    for frame in acc.iter_mut() {
        let mut sum = *frame;
        for g in 0..G {
            for l in 0..LANES {
                let (r, i) = (re[g][l], im[g][l]);
                sum[l] += r;
                re[g][l] = M::mul_add(r, cos[g][l], -(i * sin[g][l]));
                im[g][l] = M::mul_add(r, sin[g][l], i * cos[g][l]);
            }
        }
        *frame = sum;
    }
    for g in 0..G {
        let inv = chunks[g].inv_amp2;
        for l in 0..LANES {
            let r2 = M::mul_add(re[g][l], re[g][l], im[g][l] * im[g][l]);
            let k = 1.5 - 0.5 * r2 * inv[l];
            re[g][l] *= k;
            im[g][l] *= k;
        }
        chunks[g].re = re[g];
        chunks[g].im = im[g];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(hz: f64, amp: f64, phase: f64, n: usize) -> f64 {
        amp * (phase + std::f64::consts::TAU * hz * n as f64 / 44_100.0).cos()
    }

    #[test]
    fn worked_example_rotation() {
        let (c, s) = rotation(440.0);
        assert!((c - 0.998_036).abs() < 1e-6 && (s - 0.062_648).abs() < 1e-6);
    }

    #[test]
    fn oscillators_follow_the_exact_sinusoid_for_a_second() {
        // 13 oscillators: one full group, and a remainder chunk with padding lanes.
        let n = 13 * LANES - 3;
        let mut bank = OscBank::new(n);
        for i in 0..n {
            bank.set(
                i,
                50.0 + 97.0 * i as f64,
                0.01 * (1 + i % 5) as f32,
                i as f64,
            );
        }
        // Render one oscillator at a time to compare with the reference: silence the others.
        let probe = [0usize, 9, 40, n - 1];
        for &p in &probe {
            let mut b = bank.clone();
            for i in 0..n {
                if i != p {
                    b.set(i, 0.0, 0.0, 0.0);
                }
            }
            let (hz, amp, ph) = (50.0 + 97.0 * p as f64, 0.01 * (1 + p % 5) as f64, p as f64);
            let mut max_err = 0f64;
            for block in 0..1378 {
                let mut acc = [[0f32; LANES]; FRAMES];
                b.render(&mut acc);
                let mut out = [0f32; FRAMES];
                fold_lanes(&acc, &mut out);
                for (f, &v) in out.iter().enumerate() {
                    let want = reference(hz, amp, ph, block * FRAMES + f);
                    max_err = max_err.max((f64::from(v) - want).abs() / amp);
                }
            }
            // One second of rotations: phase error from the f32 rotation stays tiny.
            assert!(max_err < 2e-3, "oscillator {p}: relative error {max_err}");
            assert!((f64::from(b.amplitude(p)) - amp).abs() / amp < 1e-5);
            assert!((b.frequency(p) - hz).abs() < 1e-2);
        }
    }

    #[test]
    fn portable_and_vector_kernels_agree() {
        let n = 100;
        let mut a = OscBank::new(n);
        for i in 0..n {
            a.set(i, 100.0 + 31.0 * i as f64, 0.02, 0.1 * i as f64);
        }
        let mut b = a.clone();
        let mut out_a = [0f32; FRAMES];
        let mut out_b = [0f32; FRAMES];
        for _ in 0..100 {
            let mut acc_a = [[0f32; LANES]; FRAMES];
            let mut acc_b = [[0f32; LANES]; FRAMES];
            a.render(&mut acc_a);
            b.render_portable(&mut acc_b);
            fold_lanes(&acc_a, &mut out_a);
            fold_lanes(&acc_b, &mut out_b);
        }
        for (x, y) in out_a.iter().zip(&out_b) {
            assert!((x - y).abs() < 1e-4, "{x} vs {y}");
        }
    }

    #[test]
    fn retuning_keeps_phase_continuous() {
        let mut bank = OscBank::new(1);
        bank.set(0, 440.0, 1.0, 0.0);
        let mut acc = [[0f32; LANES]; FRAMES];
        bank.render(&mut acc);
        let last = acc[FRAMES - 1][0];
        bank.set_frequency(0, 660.0);
        let mut acc2 = [[0f32; LANES]; FRAMES];
        bank.render(&mut acc2);
        // The first new sample continues from the last old one: a step of at most one rotation.
        assert!((acc2[0][0] - last).abs() < 0.07);
        assert!((bank.frequency(0) - 660.0).abs() < 1e-2);
    }
}
