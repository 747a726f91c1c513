//! Oscillators after Pd 0.53's d_osc.c: `osc~`, `phasor~`, `cos~`, `vcf~`, `noise~`.
//!
//! Pd's phase arithmetic uses the "tabfudge" trick (R. Hoeldrich, ICMC 1995): adding
//! `UNITBIT32 = 3 * 2^19` to a double puts the integer part of the phase in the high 32-bit
//! word and the fraction, to 2^-32, in the low word. We do the same bit operations on `f64`
//! so the phase rounds exactly as Pd's does, and interpolate the same 513-point `f32` cosine
//! table built with Pd's `f32` phase accumulation (`cos_maketable`).

use super::{farg, Cx, DspEnv, PdObject, Port};
use crate::atom::{Atom, Msg};
use std::sync::OnceLock;

/// Cosine table size (m_pd.h `COSTABSIZE`, 512 in Pd 0.53).
pub const COSTABSIZE: usize = 512;
/// 3 * 2^19: in a double, bit 32 then has place value 1.
pub const UNITBIT32: f64 = 1572864.0;

/// Pd's cosine table (`cos_maketable`): `COSTABSIZE + 1` points, phase accumulated in `f32`
/// with Pd's increment of `2 * 3.14159 / COSTABSIZE`.
///
/// A fixed-size array, so that an index masked to `COSTABSIZE - 1` (and the point after it)
/// needs no bounds check in the per-sample loops.
pub fn cos_table() -> &'static [f32; COSTABSIZE + 1] {
    static TABLE: OnceLock<[f32; COSTABSIZE + 1]> = OnceLock::new();
    TABLE.get_or_init(|| {
        let phsinc = ((2.0f64 * super::PD_PI) / COSTABSIZE as f64) as f32;
        let mut phase = 0f32;
        std::array::from_fn(|_| {
            let v = (phase as f64).cos() as f32;
            phase += phsinc;
            v
        })
    })
}

/// The high word of a double (`tf_i[HIOFFSET]`).
#[inline]
pub fn hi(d: f64) -> u32 {
    (d.to_bits() >> 32) as u32
}

/// Replaces the high word of `d` with `h`.
#[inline]
pub fn with_hi(d: f64, h: u32) -> f64 {
    f64::from_bits(((h as u64) << 32) | (d.to_bits() & 0xffff_ffff))
}

/// Interpolated lookup of `dphase` (already offset by UNITBIT32) into a table of `mask + 1`
/// points plus guard, as osc~/cos~ do: index from the high word, fraction from the low.
#[inline]
fn lookup(tab: &[f32; COSTABSIZE + 1], dphase: f64, normhi: u32) -> f32 {
    let idx = (hi(dphase) & (COSTABSIZE as u32 - 1)) as usize;
    let frac = (with_hi(dphase, normhi) - UNITBIT32) as f32;
    let f1 = tab[idx];
    let f2 = tab[idx + 1];
    f1 + frac * (f2 - f1)
}

/// Keeps `phase` (in table units) modulo `size`, rounding as Pd does at block end.
#[inline]
fn wrap_phase(dphase: f64, size: f64) -> f64 {
    let normhi = hi(UNITBIT32 * size);
    let t = with_hi(dphase + (UNITBIT32 * size - UNITBIT32), normhi);
    t - UNITBIT32 * size
}

/// `osc~`: cosine oscillator; left inlet frequency (signal or float), right inlet resets
/// the phase (0..1).
#[derive(Debug)]
pub struct Osc {
    phase: f64,
    conv: f32,
    freq: f32,
}

impl PdObject for Osc {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Signal, Port::Control], vec![Port::Signal])
    }
    fn message(&mut self, inlet: usize, msg: &Msg, _cx: &mut Cx<'_>) {
        match (inlet, msg.selector.as_str()) {
            (0, "float") => self.freq = msg.f(0),
            (1, "float") => self.phase = COSTABSIZE as f64 * msg.f(0) as f64,
            _ => {}
        }
    }
    fn is_dsp(&self) -> bool {
        true
    }
    fn signal_scalar(&self, _inlet: usize) -> f32 {
        self.freq
    }
    fn prepare(&mut self, env: &DspEnv<'_>) {
        self.conv = COSTABSIZE as f32 / env.sample_rate;
    }
    fn perform(&mut self, ins: &[&[f32]], outs: &mut [&mut [f32]]) {
        let tab = cos_table();
        let normhi = hi(UNITBIT32);
        let mut dphase = self.phase + UNITBIT32;
        let conv = self.conv;
        // One add at a time, in Pd's order: the phase's rounding drifts with the grouping of
        // the adds, and over seconds a different grouping is audible as a different pitch.
        for (o, &i) in outs[0].iter_mut().zip(ins[0].iter()) {
            let cur = dphase;
            dphase += (i * conv) as f64;
            *o = lookup(tab, cur, normhi);
        }
        self.phase = wrap_phase(dphase, COSTABSIZE as f64);
    }
    fn cost_hint_ns(&self) -> u32 {
        250
    }
}

/// `phasor~`: sawtooth 0..1.
#[derive(Debug)]
pub struct Phasor {
    phase: f64,
    conv: f32,
    freq: f32,
}

impl PdObject for Phasor {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Signal, Port::Control], vec![Port::Signal])
    }
    fn message(&mut self, inlet: usize, msg: &Msg, _cx: &mut Cx<'_>) {
        match (inlet, msg.selector.as_str()) {
            (0, "float") => self.freq = msg.f(0),
            (1, "float") => self.phase = msg.f(0) as f64,
            _ => {}
        }
    }
    fn is_dsp(&self) -> bool {
        true
    }
    fn signal_scalar(&self, _inlet: usize) -> f32 {
        self.freq
    }
    fn prepare(&mut self, env: &DspEnv<'_>) {
        self.conv = (1.0f64 / env.sample_rate as f64) as f32;
    }
    fn perform(&mut self, ins: &[&[f32]], outs: &mut [&mut [f32]]) {
        let normhi = hi(UNITBIT32);
        let mut dphase = self.phase + UNITBIT32;
        let mut tf = dphase;
        for (o, &i) in outs[0].iter_mut().zip(ins[0].iter()) {
            tf = with_hi(tf, normhi);
            dphase += (i * self.conv) as f64;
            *o = (tf - UNITBIT32) as f32;
            tf = dphase;
        }
        tf = with_hi(tf, normhi);
        self.phase = tf - UNITBIT32;
    }
}

/// `cos~`: cosine of 2 pi times the input, from the table.
#[derive(Debug)]
pub struct Cos {
    scalar: f32,
}

impl PdObject for Cos {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Signal], vec![Port::Signal])
    }
    fn message(&mut self, _inlet: usize, msg: &Msg, _cx: &mut Cx<'_>) {
        if msg.selector == "float" {
            self.scalar = msg.f(0);
        }
    }
    fn is_dsp(&self) -> bool {
        true
    }
    fn signal_scalar(&self, _inlet: usize) -> f32 {
        self.scalar
    }
    fn perform(&mut self, ins: &[&[f32]], outs: &mut [&mut [f32]]) {
        let tab = cos_table();
        let normhi = hi(UNITBIT32);
        for (o, &i) in outs[0].iter_mut().zip(ins[0].iter()) {
            let dphase = (i * COSTABSIZE as f32) as f64 + UNITBIT32;
            *o = lookup(tab, dphase, normhi);
        }
    }
}

/// `noise~`: Pd's linear congruential generator, seeded per instance from a process-wide
/// counter (307 * 1319^k).
#[derive(Debug)]
pub struct Noise {
    val: i32,
}

impl PdObject for Noise {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Control], vec![Port::Signal])
    }
    fn message(&mut self, _inlet: usize, msg: &Msg, _cx: &mut Cx<'_>) {
        if msg.selector == "seed" || msg.selector == "float" {
            self.val = msg.f(0) as i32;
        }
    }
    fn is_dsp(&self) -> bool {
        true
    }
    fn perform(&mut self, _ins: &[&[f32]], outs: &mut [&mut [f32]]) {
        let mut val = self.val;
        for o in outs[0].iter_mut() {
            *o = ((val & 0x7fff_ffff) - 0x4000_0000) as f32 * (1.0f64 / 1073741824.0) as f32;
            val = val.wrapping_mul(435898247).wrapping_add(382842987);
        }
        self.val = val;
    }
}

/// `vcf~`: resonant band/low-pass with a signal centre frequency (d_osc.c `sigvcf`).
#[derive(Debug)]
pub struct Vcf {
    re: f32,
    im: f32,
    q: f32,
    isr: f32,
    scalar: f32,
}

/// Pd's `PD_BIGORSMALL` for `f32`: true for anything outside about 1e-19..1e19 in magnitude.
#[inline]
pub fn big_or_small(f: f32) -> bool {
    let b = f.to_bits() & 0x6000_0000;
    b == 0 || b == 0x6000_0000
}

/// What `vcf~`'s loop needs besides its state: per block constants.
struct VcfCoefs {
    isr: f32,
    qinv: f32,
    ampcorrect: f32,
}

/// One sample's filter step `z' = c z + drive`, with `c = coefr + i coefi` (`vcf~`'s pole).
#[derive(Clone, Copy)]
struct VcfStep {
    coefr: f32,
    coefi: f32,
    drive: f32,
}

/// Where the table index and fraction can be taken in `f32` (below this `cfindx + UNITBIT32`
/// stays in the binade Pd's trick assumes); beyond it, and for NaN, Pd's `f64` path is used.
const VCF_F32_INDEX_LIMIT: f32 = 524288.0;

/// The centre frequency in radians per sample, as Pd clamps it (`if (cf < 0) cf = 0`).
#[inline(always)]
fn vcf_centre(k: &VcfCoefs, cf_in: f32) -> f32 {
    let cf = cf_in * k.isr;
    if cf < 0.0 {
        0.0
    } else {
        cf
    }
}

/// Radians per sample to cosine-table units.
const VCF_TO_INDEX: f32 = COSTABSIZE as f32 / super::PD_TWO_PI_F32;

/// Pd's per-sample coefficients (d_osc.c `sigvcf_perform`) for input `x` at centre `cf_in`.
#[inline(always)]
fn vcf_step(k: &VcfCoefs, tab: &[f32; COSTABSIZE + 1], x: f32, cf_in: f32) -> VcfStep {
    const MASK: u32 = COSTABSIZE as u32 - 1;
    let cf = vcf_centre(k, cf_in);
    let cfindx = cf * VCF_TO_INDEX;
    let mut r = if k.qinv > 0.0 { 1.0 - cf * k.qinv } else { 0.0 };
    if r < 0.0 {
        r = 0.0;
    }
    let oneminusr = 1.0f32 - r;
    // Pd adds UNITBIT32 in `f64` and reads the integer part from the high word and the
    // fraction from the low. For 0 <= cfindx < 2^19 that is `floor(cfindx)` and
    // `cfindx - floor(cfindx)`, both exact in `f32` (the subtraction is exact by Sterbenz's
    // lemma), which costs a third of the instructions. (Below 2^-9, Pd's `f64` sum rounds the
    // fraction to a multiple of 2^-32: a difference of under 2^-32 in a coefficient.)
    let (tabindex, frac) = if cfindx < VCF_F32_INDEX_LIMIT {
        // SAFETY: 0 <= cfindx < 2^19 (cf was clamped to >= 0, NaN fails the test), so the
        // truncation is in range for i32.
        let whole: i32 = unsafe { cfindx.to_int_unchecked() };
        (whole as u32 & MASK, cfindx - whole as f32)
    } else {
        let dphase = cfindx as f64 + UNITBIT32;
        let normhi = hi(UNITBIT32);
        (
            hi(dphase) & MASK,
            (with_hi(dphase, normhi) - UNITBIT32) as f32,
        )
    };
    let (f1, f2) = (tab[tabindex as usize], tab[tabindex as usize + 1]);
    let coefr = r * (f1 + frac * (f2 - f1));
    // The sine: a quarter of the table back, the same fraction.
    let idx2 = (tabindex.wrapping_sub(COSTABSIZE as u32 / 4)) & MASK;
    let (f1, f2) = (tab[idx2 as usize], tab[idx2 as usize + 1]);
    let coefi = r * (f1 + frac * (f2 - f1));
    VcfStep {
        coefr,
        coefi,
        drive: k.ampcorrect * oneminusr * x,
    }
}

/// `z' = c z + drive` for state `z = (re, im)`.
#[inline(always)]
fn vcf_apply<const FMA: bool>(s: VcfStep, (re, im): (f32, f32)) -> (f32, f32) {
    if FMA {
        (
            s.coefr.mul_add(re, (-s.coefi).mul_add(im, s.drive)),
            s.coefi.mul_add(re, s.coefr * im),
        )
    } else {
        (
            (s.drive - s.coefi * im) + s.coefr * re,
            s.coefi * re + s.coefr * im,
        )
    }
}

/// Two samples from state `z`: the first step as Pd takes it, and the state after the second
/// through the two folded into one, `z'' = c1 (c0 z + d0) + d1 = (c1 c0) z + (c1 d0 + d1)`.
///
/// The folded step's coefficients do not depend on the state, so the chain carried from
/// sample to sample (two dependent multiply-adds, about 8 cycles with FMA) advances two
/// samples at a time, and the first sample's output comes off the chain.
#[inline(always)]
fn vcf_two<const FMA: bool>(s0: VcfStep, s1: VcfStep, z: (f32, f32)) -> ((f32, f32), (f32, f32)) {
    let first = vcf_apply::<FMA>(s0, z);
    let (re, im) = z;
    let second = if FMA {
        let cr = s1.coefr.mul_add(s0.coefr, -(s1.coefi * s0.coefi));
        let ci = s1.coefr.mul_add(s0.coefi, s1.coefi * s0.coefr);
        let dr = s1.coefr.mul_add(s0.drive, s1.drive);
        let di = s1.coefi * s0.drive;
        (
            cr.mul_add(re, (-ci).mul_add(im, dr)),
            ci.mul_add(re, cr.mul_add(im, di)),
        )
    } else {
        let cr = s1.coefr * s0.coefr - s1.coefi * s0.coefi;
        let ci = s1.coefr * s0.coefi + s1.coefi * s0.coefr;
        let dr = s1.coefr * s0.drive + s1.drive;
        let di = s1.coefi * s0.drive;
        ((dr - ci * im) + cr * re, (di + cr * im) + ci * re)
    };
    (first, second)
}

/// `vcf~` over one block from state `(re, im)`; returns the new state.
///
/// The filter is a recursion, so its speed is the latency of the chain carried from sample to
/// sample; [`vcf_two`] halves it. The rounding differs from Pd's by an ulp or so per sample,
/// and the filter is stable (r < 1), so the differences do not grow: COMPAT.md shows the
/// result against Pd.
#[inline(always)]
fn vcf_block<const FMA: bool>(
    k: &VcfCoefs,
    (mut re, mut im): (f32, f32),
    sig: &[f32],
    cfs: &[f32],
    o1: &mut [f32],
    o2: &mut [f32],
) -> (f32, f32) {
    let tab = cos_table();
    let n = sig.len().min(cfs.len()).min(o1.len()).min(o2.len());
    let (sig, cfs, o1, o2) = (&sig[..n], &cfs[..n], &mut o1[..n], &mut o2[..n]);
    for i in (0..n / 2).map(|p| 2 * p) {
        let s0 = vcf_step(k, tab, sig[i], cfs[i]);
        let s1 = vcf_step(k, tab, sig[i + 1], cfs[i + 1]);
        let (first, second) = vcf_two::<FMA>(s0, s1, (re, im));
        (o1[i], o2[i]) = first;
        (o1[i + 1], o2[i + 1]) = second;
        (re, im) = second;
    }
    if n % 2 == 1 {
        let s = vcf_step(k, tab, sig[n - 1], cfs[n - 1]);
        (re, im) = vcf_apply::<FMA>(s, (re, im));
        o1[n - 1] = re;
        o2[n - 1] = im;
    }
    (re, im)
}

/// Samples whose coefficients [`vcf_block_avx2`] computes in one vectorised pass.
#[cfg(target_arch = "x86_64")]
const VCF_CHUNK: usize = 64;

/// [`vcf_block`] in two passes per chunk: all coefficients first, eight samples at a time
/// (the table reads become gathers), then the recursion alone. On the 64-voice bench patch
/// this takes a fifth off the whole render on one hart (the single pass leaves the vector
/// units idle while the recursion waits).
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn vcf_block_avx2(
    k: &VcfCoefs,
    (mut re, mut im): (f32, f32),
    sig: &[f32],
    cfs: &[f32],
    o1: &mut [f32],
    o2: &mut [f32],
) -> (f32, f32) {
    let tab = cos_table();
    let n = sig.len().min(cfs.len()).min(o1.len()).min(o2.len());
    let mut coefr = [0f32; VCF_CHUNK];
    let mut coefi = [0f32; VCF_CHUNK];
    let mut drive = [0f32; VCF_CHUNK];
    let mut at = 0;
    while at < n {
        let m = (n - at).min(VCF_CHUNK);
        let (sig, cfs) = (&sig[at..at + m], &cfs[at..at + m]);
        let (o1c, o2c) = (&mut o1[at..at + m], &mut o2[at..at + m]);
        let in_range =
            |ok: bool, &c: &f32| ok & (vcf_centre(k, c) * VCF_TO_INDEX < VCF_F32_INDEX_LIMIT);
        if !cfs.iter().fold(true, in_range) {
            // A centre frequency beyond the fast index range (or NaN): Pd's f64 path.
            (re, im) = vcf_block::<true>(k, (re, im), sig, cfs, o1c, o2c);
            at += m;
            continue;
        }
        // SAFETY: AVX2 is enabled for this function (its caller checked the CPU). (The check
        // just above is for Pd's results: the fast index is exact only below 2^19.)
        unsafe { vcf_coefs_avx2(k, tab, sig, cfs, &mut coefr, &mut coefi, &mut drive) };
        let step = |j: usize| VcfStep {
            coefr: coefr[j],
            coefi: coefi[j],
            drive: drive[j],
        };
        for j in (0..m / 2).map(|p| 2 * p) {
            let (first, second) = vcf_two::<true>(step(j), step(j + 1), (re, im));
            (o1c[j], o2c[j]) = first;
            (o1c[j + 1], o2c[j + 1]) = second;
            (re, im) = second;
        }
        if m % 2 == 1 {
            (re, im) = vcf_apply::<true>(step(m - 1), (re, im));
            (o1c[m - 1], o2c[m - 1]) = (re, im);
        }
        at += m;
    }
    (re, im)
}

/// The chunk's coefficients, eight samples at a time: what [`vcf_step`]'s fast path computes,
/// operation for operation, with the four table reads as gathers.
///
/// # Safety
/// The CPU must support AVX2. (Every `cfs[j]` must also give `cfindx < 2^19`, or the result is
/// not Pd's; the masked indices keep the gathers inside the table whatever the input.)
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn vcf_coefs_avx2(
    k: &VcfCoefs,
    tab: &[f32; COSTABSIZE + 1],
    sig: &[f32],
    cfs: &[f32],
    coefr: &mut [f32; VCF_CHUNK],
    coefi: &mut [f32; VCF_CHUNK],
    drive: &mut [f32; VCF_CHUNK],
) {
    use std::arch::x86_64::*;
    let m = sig.len().min(cfs.len()).min(VCF_CHUNK);
    let lanes = m - m % 8;
    let isr = _mm256_set1_ps(k.isr);
    let zero = _mm256_setzero_ps();
    let one = _mm256_set1_ps(1.0);
    let to_index = _mm256_set1_ps(VCF_TO_INDEX);
    let qinv = _mm256_set1_ps(k.qinv);
    let ampcorrect = _mm256_set1_ps(k.ampcorrect);
    let mask = _mm256_set1_epi32(COSTABSIZE as i32 - 1);
    let quarter = _mm256_set1_epi32(COSTABSIZE as i32 / 4);
    let base = tab.as_ptr();
    let mut j = 0;
    while j < lanes {
        // SAFETY: j + 8 <= m <= cfs.len(), so the eight floats are inside `cfs`.
        let centres = unsafe { _mm256_loadu_ps(cfs.as_ptr().add(j)) };
        // SAFETY: j + 8 <= m <= sig.len().
        let input = unsafe { _mm256_loadu_ps(sig.as_ptr().add(j)) };
        // max(0, x), in this order: it returns x when x is NaN or -0, as Pd's `if (x < 0) x = 0`
        let cf = _mm256_max_ps(zero, _mm256_mul_ps(centres, isr));
        let x = _mm256_mul_ps(cf, to_index);
        let r = if k.qinv > 0.0 {
            _mm256_max_ps(zero, _mm256_sub_ps(one, _mm256_mul_ps(cf, qinv)))
        } else {
            zero
        };
        let whole = _mm256_cvttps_epi32(x);
        let frac = _mm256_sub_ps(x, _mm256_cvtepi32_ps(whole));
        let i1 = _mm256_and_si256(whole, mask);
        let i2 = _mm256_and_si256(_mm256_sub_epi32(whole, quarter), mask);
        let lerp = |i: __m256i| {
            // SAFETY: i is in 0..COSTABSIZE in every lane, so it and the point after it are
            // inside the COSTABSIZE + 1 table.
            let (f1, f2) = unsafe {
                (
                    _mm256_i32gather_ps::<4>(base, i),
                    _mm256_i32gather_ps::<4>(base.add(1), i),
                )
            };
            _mm256_add_ps(f1, _mm256_mul_ps(frac, _mm256_sub_ps(f2, f1)))
        };
        let (cr, ci) = (_mm256_mul_ps(r, lerp(i1)), _mm256_mul_ps(r, lerp(i2)));
        let d = _mm256_mul_ps(_mm256_mul_ps(ampcorrect, _mm256_sub_ps(one, r)), input);
        // SAFETY: j + 8 <= m <= VCF_CHUNK, the outputs' length.
        unsafe {
            _mm256_storeu_ps(coefr.as_mut_ptr().add(j), cr);
            _mm256_storeu_ps(coefi.as_mut_ptr().add(j), ci);
            _mm256_storeu_ps(drive.as_mut_ptr().add(j), d);
        }
        j += 8;
    }
    for j in lanes..m {
        let s = vcf_step(k, tab, sig[j], cfs[j]);
        coefr[j] = s.coefr;
        coefi[j] = s.coefi;
        drive[j] = s.drive;
    }
}

/// [`vcf_block`] compiled with fused multiply-adds.
///
/// # Safety
/// The CPU must support FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn vcf_block_fma(
    k: &VcfCoefs,
    state: (f32, f32),
    sig: &[f32],
    cfs: &[f32],
    o1: &mut [f32],
    o2: &mut [f32],
) -> (f32, f32) {
    vcf_block::<true>(k, state, sig, cfs, o1, o2)
}

impl PdObject for Vcf {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (
            vec![Port::Signal, Port::Signal, Port::Control],
            vec![Port::Signal, Port::Signal],
        )
    }
    fn message(&mut self, inlet: usize, msg: &Msg, _cx: &mut Cx<'_>) {
        match (inlet, msg.selector.as_str()) {
            (0, "float") => self.scalar = msg.f(0),
            (2, "float") => self.q = msg.f(0).clamp(0.0, 1e19),
            (_, "clear") => {
                self.re = 0.0;
                self.im = 0.0
            }
            _ => {}
        }
    }
    fn is_dsp(&self) -> bool {
        true
    }
    fn signal_scalar(&self, inlet: usize) -> f32 {
        if inlet == 0 {
            self.scalar
        } else {
            0.0
        }
    }
    fn prepare(&mut self, env: &DspEnv<'_>) {
        self.isr = super::PD_TWO_PI_F32 / env.sample_rate;
    }
    fn perform(&mut self, ins: &[&[f32]], outs: &mut [&mut [f32]]) {
        let q = self.q;
        let k = VcfCoefs {
            isr: self.isr,
            qinv: if q > 0.0 { 1.0f32 / q } else { 0.0 },
            ampcorrect: (2.0f64 - 2.0f64 / (q as f64 + 2.0)) as f32,
        };
        let (o1, o2) = outs.split_at_mut(1);
        // Slices of one length, so the loop indexes nothing out of bounds and needs no checks.
        let n = ins[0].len();
        let (sig, cfs) = (&ins[0][..n], &ins[1][..n]);
        let (o1, o2) = (&mut o1[0][..n], &mut o2[0][..n]);
        let state = (self.re, self.im);
        #[cfg(target_arch = "x86_64")]
        let (mut re, mut im) = if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU has AVX2 and FMA (checked just above).
            unsafe { vcf_block_avx2(&k, state, sig, cfs, o1, o2) }
        } else if std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has FMA (checked just above), the only feature the function adds.
            unsafe { vcf_block_fma(&k, state, sig, cfs, o1, o2) }
        } else {
            vcf_block::<false>(&k, state, sig, cfs, o1, o2)
        };
        #[cfg(not(target_arch = "x86_64"))]
        let (mut re, mut im) = vcf_block::<false>(&k, state, sig, cfs, o1, o2);
        if big_or_small(re) {
            re = 0.0;
        }
        if big_or_small(im) {
            im = 0.0;
        }
        self.re = re;
        self.im = im;
    }
    fn cost_hint_ns(&self) -> u32 {
        600
    }
}

/// Creates the d_osc.c objects.
pub fn create(class: &str, args: &[Atom], noise_seed: &mut i32) -> Option<Box<dyn PdObject>> {
    Some(match class {
        "osc~" => Box::new(Osc {
            phase: 0.0,
            conv: 0.0,
            freq: farg(args, 0, 0.0),
        }),
        "phasor~" => Box::new(Phasor {
            phase: 0.0,
            conv: 0.0,
            freq: farg(args, 0, 0.0),
        }),
        "cos~" => Box::new(Cos {
            scalar: farg(args, 0, 0.0),
        }),
        "noise~" => {
            *noise_seed = noise_seed.wrapping_mul(1319);
            Box::new(Noise { val: *noise_seed })
        }
        "vcf~" => Box::new(Vcf {
            re: 0.0,
            im: 0.0,
            q: farg(args, 0, 0.0),
            isr: 0.0,
            scalar: 0.0,
        }),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_starts_at_one_and_wraps() {
        let t = cos_table();
        assert_eq!(t.len(), COSTABSIZE + 1);
        assert_eq!(t[0], 1.0);
        assert!((t[COSTABSIZE / 2] + 1.0).abs() < 1e-4);
    }

    #[test]
    fn tabfudge_splits_integer_and_fraction() {
        let d = 5.25 + UNITBIT32;
        assert_eq!(hi(d) & 511, 5);
        assert_eq!(with_hi(d, hi(UNITBIT32)) - UNITBIT32, 0.25);
        assert_eq!(wrap_phase(515.5 + UNITBIT32, 512.0), 3.5);
    }

    /// Pd's `sigvcf_perform`, one sample at a time, the `f64` index every time.
    fn pd_vcf(q: f32, sr: f32, state: &mut (f32, f32), sig: &[f32], cfs: &[f32]) -> Vec<f32> {
        let tab = cos_table();
        let isr = crate::objects::PD_TWO_PI_F32 / sr;
        let qinv = if q > 0.0 { 1.0 / q } else { 0.0 };
        let ampcorrect = (2.0f64 - 2.0f64 / (q as f64 + 2.0)) as f32;
        let (mut re, mut im) = *state;
        let mut out = Vec::new();
        for (&x, &c) in sig.iter().zip(cfs) {
            let mut cf = c * isr;
            if cf < 0.0 {
                cf = 0.0;
            }
            let cfindx = cf * VCF_TO_INDEX;
            let mut r = if qinv > 0.0 { 1.0 - cf * qinv } else { 0.0 };
            if r < 0.0 {
                r = 0.0;
            }
            let dphase = cfindx as f64 + UNITBIT32;
            let i = (hi(dphase) & (COSTABSIZE as u32 - 1)) as usize;
            let frac = (with_hi(dphase, hi(UNITBIT32)) - UNITBIT32) as f32;
            let coefr = r * (tab[i] + frac * (tab[i + 1] - tab[i]));
            let i2 = (i + COSTABSIZE - COSTABSIZE / 4) % COSTABSIZE;
            let coefi = r * (tab[i2] + frac * (tab[i2 + 1] - tab[i2]));
            let re2 = re;
            re = ampcorrect * (1.0 - r) * x + coefr * re2 - coefi * im;
            im = coefi * re2 + coefr * im;
            out.push(re);
        }
        *state = (re, im);
        out
    }

    #[test]
    fn vcf_matches_pds_loop_on_every_path() {
        let sr = 44100.0;
        let shared = crate::shared::Shared::default();
        let env = DspEnv {
            sample_rate: sr,
            block: 64,
            shared: &shared,
        };
        let mut vcf = create("vcf~", &[Atom::Float(7.0)], &mut 0).expect("vcf~");
        vcf.prepare(&env);
        let mut reference = (0.0, 0.0);
        let mut worst = 0f32;
        // blocks of 64 (the vector pass), 63 and 5 (odd tails); centre frequencies sweeping
        // through negative (clamped), ordinary, and beyond the f32 index range (Pd's f64 path)
        for (b, len) in [64usize, 64, 63, 5, 64, 64, 33, 64].into_iter().enumerate() {
            let sig: Vec<f32> = (0..len)
                .map(|i| ((b * 64 + i) as f32 * 0.37).sin())
                .collect();
            let cfs: Vec<f32> = (0..len)
                .map(|i| match b {
                    2 => -300.0,
                    5 => 4e9,
                    _ => 200.0 + 3000.0 * ((b * 64 + i) as f32 * 0.01).cos().abs(),
                })
                .collect();
            let (mut o1, mut o2) = (vec![0.0; len], vec![0.0; len]);
            vcf.perform(&[&sig, &cfs], &mut [&mut o1, &mut o2]);
            let want = pd_vcf(7.0, sr, &mut reference, &sig, &cfs);
            for (a, w) in o1.iter().zip(&want) {
                worst = worst.max((a - w).abs());
            }
        }
        assert!(worst < 1e-5, "vcf~ differs from Pd's loop by {worst}");
    }

    #[test]
    fn vcf_keeps_pds_nan_when_q_is_tiny() {
        // q = 1e-39: 1/q is infinite, so at a centre of 0 Pd's r = 1 - 0 * inf is NaN, which its
        // `if (r < 0) r = 0` keeps; the vector clamp must keep it too
        let shared = crate::shared::Shared::default();
        let env = DspEnv {
            sample_rate: 44100.0,
            block: 64,
            shared: &shared,
        };
        let mut vcf = create("vcf~", &[], &mut 0).expect("vcf~");
        vcf.prepare(&env);
        let mut cx = Cx {
            actions: Vec::new(),
            now_ms: 0.0,
            shared: &shared,
        };
        vcf.message(2, &Msg::float(1e-39), &mut cx);
        let (sig, cfs) = (vec![0.5f32; 64], vec![0.0f32; 64]);
        let (mut o1, mut o2) = (vec![0.0; 64], vec![0.0; 64]);
        vcf.perform(&[&sig, &cfs], &mut [&mut o1, &mut o2]);
        let want = pd_vcf(1e-39, 44100.0, &mut (0.0, 0.0), &sig, &cfs);
        for (a, w) in o1.iter().zip(&want) {
            assert_eq!(a.is_nan(), w.is_nan(), "{a} vs Pd's {w}");
        }
        assert!(want[0].is_nan(), "the case is Pd's NaN");
    }
}
