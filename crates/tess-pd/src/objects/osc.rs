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

/// `vcf~` over one block from state `(re, im)`; returns the new state.
///
/// The filter is a recursion, so its speed is the latency of the chain carried from sample to
/// sample: Pd computes `drive + coefr * re - coefi * im`, three dependent operations after the
/// multiply (12 cycles a sample). Adding the input term first takes one add off the chain
/// (10); with fused multiply-adds (`FMA`, where the CPU has them) the chain is two FMAs (about
/// 6). Either way the rounding differs from Pd's by an ulp or so per sample, and the filter is
/// stable (r < 1), so the differences do not grow: COMPAT.md shows the result against Pd.
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
    let normhi = hi(UNITBIT32);
    const MASK: u32 = COSTABSIZE as u32 - 1;
    let n = sig.len().min(cfs.len()).min(o1.len()).min(o2.len());
    for i in 0..n {
        let mut cf = cfs[i] * k.isr;
        if cf < 0.0 {
            cf = 0.0;
        }
        let cfindx = cf * (COSTABSIZE as f32 / super::PD_TWO_PI_F32);
        let mut r = if k.qinv > 0.0 { 1.0 - cf * k.qinv } else { 0.0 };
        if r < 0.0 {
            r = 0.0;
        }
        let oneminusr = 1.0f32 - r;
        let dphase = cfindx as f64 + UNITBIT32;
        let tabindex = hi(dphase) & MASK;
        let frac = (with_hi(dphase, normhi) - UNITBIT32) as f32;
        let (f1, f2) = (tab[tabindex as usize], tab[tabindex as usize + 1]);
        let coefr = r * (f1 + frac * (f2 - f1));
        // The sine: a quarter of the table back, the same fraction. (Written out rather than a
        // second `lookup` of `dphase - 128`: the same result, but 10% slower on the wide patch.)
        let idx2 = (tabindex.wrapping_sub(COSTABSIZE as u32 / 4)) & MASK;
        let (f1, f2) = (tab[idx2 as usize], tab[idx2 as usize + 1]);
        let coefi = r * (f1 + frac * (f2 - f1));
        let drive = k.ampcorrect * oneminusr * sig[i];
        let re2 = re;
        if FMA {
            re = coefr.mul_add(re2, (-coefi).mul_add(im, drive));
            im = coefi.mul_add(re2, coefr * im);
        } else {
            re = (drive - coefi * im) + coefr * re2;
            im = coefi * re2 + coefr * im;
        }
        o1[i] = re;
        o2[i] = im;
    }
    (re, im)
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
        let (mut re, mut im) = if std::arch::is_x86_feature_detected!("fma") {
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
}
