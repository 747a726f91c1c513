//! Filters after Pd 0.53's d_filter.c: `lop~`, `hip~`, `bp~`, `biquad~`, `rpole~`, `rzero~`,
//! `cpole~`. Coefficients are computed with Pd's constants (3.14159) and in the same float
//! widths, so the recursions match sample for sample.

use super::osc::big_or_small;
use super::{farg, Cx, DspEnv, PdObject, Port};
use crate::atom::{Atom, Msg};

/// `lop~`: one-pole low-pass; coefficient `hz * 2 * 3.14159 / sr` clipped to 0..1.
#[derive(Debug)]
pub struct Lop {
    sr: f32,
    hz: f32,
    coef: f32,
    last: f32,
    scalar: f32,
}

impl Lop {
    fn set(&mut self, f: f32) {
        let f = f.max(0.0);
        self.hz = f;
        self.coef = ((f as f64 * (2.0 * super::PD_PI)) / self.sr as f64) as f32;
        self.coef = self.coef.clamp(0.0, 1.0);
    }
}

impl PdObject for Lop {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Signal, Port::Control], vec![Port::Signal])
    }
    fn message(&mut self, inlet: usize, msg: &Msg, _cx: &mut Cx<'_>) {
        match (inlet, msg.selector.as_str()) {
            (0, "float") => self.scalar = msg.f(0),
            (1, "float") => self.set(msg.f(0)),
            (0, "clear") => self.last = 0.0,
            _ => {}
        }
    }
    fn is_dsp(&self) -> bool {
        true
    }
    fn signal_scalar(&self, _: usize) -> f32 {
        self.scalar
    }
    fn prepare(&mut self, env: &DspEnv<'_>) {
        self.sr = env.sample_rate;
        self.set(self.hz);
    }
    fn perform(&mut self, ins: &[&[f32]], outs: &mut [&mut [f32]]) {
        let mut last = self.last;
        let coef = self.coef;
        let feedback = 1.0 - coef;
        for (o, &i) in outs[0].iter_mut().zip(ins[0].iter()) {
            last = coef * i + feedback * last;
            *o = last;
        }
        if big_or_small(last) {
            last = 0.0;
        }
        self.last = last;
    }
}

/// `hip~`: one-pole one-zero high-pass, with Pd 0.44+'s gain normalisation.
#[derive(Debug)]
pub struct Hip {
    sr: f32,
    hz: f32,
    coef: f32,
    last: f32,
    scalar: f32,
}

impl Hip {
    fn set(&mut self, f: f32) {
        let f = f.max(0.0);
        self.hz = f;
        self.coef = (1.0 - f as f64 * (2.0 * super::PD_PI) / self.sr as f64) as f32;
        self.coef = self.coef.clamp(0.0, 1.0);
    }
}

impl PdObject for Hip {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Signal, Port::Control], vec![Port::Signal])
    }
    fn message(&mut self, inlet: usize, msg: &Msg, _cx: &mut Cx<'_>) {
        match (inlet, msg.selector.as_str()) {
            (0, "float") => self.scalar = msg.f(0),
            (1, "float") => self.set(msg.f(0)),
            (0, "clear") => self.last = 0.0,
            _ => {}
        }
    }
    fn is_dsp(&self) -> bool {
        true
    }
    fn signal_scalar(&self, _: usize) -> f32 {
        self.scalar
    }
    fn prepare(&mut self, env: &DspEnv<'_>) {
        self.sr = env.sample_rate;
        self.set(self.hz);
    }
    fn perform(&mut self, ins: &[&[f32]], outs: &mut [&mut [f32]]) {
        let coef = self.coef;
        if coef < 1.0 {
            let normal = (0.5f64 * (1.0 + coef as f64)) as f32;
            let mut last = self.last;
            for (o, &i) in outs[0].iter_mut().zip(ins[0].iter()) {
                let new = i + coef * last;
                *o = normal * (new - last);
                last = new;
            }
            if big_or_small(last) {
                last = 0.0;
            }
            self.last = last;
        } else {
            outs[0].copy_from_slice(ins[0]);
            self.last = 0.0;
        }
    }
}

/// `bp~`: two-pole band-pass (centre frequency, Q).
#[derive(Debug)]
pub struct Bp {
    sr: f32,
    freq: f32,
    q: f32,
    x1: f32,
    x2: f32,
    coef1: f32,
    coef2: f32,
    gain: f32,
    scalar: f32,
}

fn bp_qcos(f: f32) -> f32 {
    if (-(0.5f32 * super::PD_PI_F32)..=0.5f32 * super::PD_PI_F32).contains(&f) {
        let g = f * f;
        (((g * g * g * (-1.0f32 / 720.0f32) + g * g * (1.0f32 / 24.0f32)) as f64 - g as f64 * 0.5)
            + 1.0) as f32
    } else {
        0.0
    }
}

impl Bp {
    fn docoef(&mut self, f: f32, q: f32) {
        let f = if (f as f64) < 0.001 { 10.0 } else { f };
        let q = q.max(0.0);
        self.freq = f;
        self.q = q;
        let omega = f * (2.0f32 * super::PD_PI_F32) / self.sr;
        let mut oneminusr = if (q as f64) < 0.001 {
            1.0f32
        } else {
            omega / q
        };
        if oneminusr > 1.0 {
            oneminusr = 1.0;
        }
        let r = 1.0f32 - oneminusr;
        self.coef1 = 2.0f32 * bp_qcos(omega) * r;
        self.coef2 = -r * r;
        self.gain = 2.0 * oneminusr * (oneminusr + r * omega);
    }
}

impl PdObject for Bp {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (
            vec![Port::Signal, Port::Control, Port::Control],
            vec![Port::Signal],
        )
    }
    fn message(&mut self, inlet: usize, msg: &Msg, _cx: &mut Cx<'_>) {
        match (inlet, msg.selector.as_str()) {
            (0, "float") => self.scalar = msg.f(0),
            (1, "float") => self.docoef(msg.f(0), self.q),
            (2, "float") => self.docoef(self.freq, msg.f(0)),
            (0, "clear") => {
                self.x1 = 0.0;
                self.x2 = 0.0
            }
            _ => {}
        }
    }
    fn is_dsp(&self) -> bool {
        true
    }
    fn signal_scalar(&self, _: usize) -> f32 {
        self.scalar
    }
    fn prepare(&mut self, env: &DspEnv<'_>) {
        self.sr = env.sample_rate;
        self.docoef(self.freq, self.q);
    }
    fn perform(&mut self, ins: &[&[f32]], outs: &mut [&mut [f32]]) {
        let (mut last, mut prev) = (self.x1, self.x2);
        for (o, &i) in outs[0].iter_mut().zip(ins[0].iter()) {
            let output = i + self.coef1 * last + self.coef2 * prev;
            *o = self.gain * output;
            prev = last;
            last = output;
        }
        if big_or_small(last) {
            last = 0.0;
        }
        if big_or_small(prev) {
            prev = 0.0;
        }
        self.x1 = last;
        self.x2 = prev;
    }
}

/// `biquad~ fb1 fb2 ff1 ff2 ff3`; unstable feedback is set to zero as Pd does.
#[derive(Debug, Default)]
pub struct Biquad {
    x1: f32,
    x2: f32,
    c: [f32; 5],
    scalar: f32,
}

impl Biquad {
    fn set_list(&mut self, a: &[Atom]) {
        let g = |i| farg(a, i, 0.0);
        let (fb1, fb2) = (g(0), g(1));
        let disc = fb1 * fb1 + 4.0 * fb2;
        let stable = if disc < 0.0 {
            fb2 >= -1.0
        } else {
            (-2.0..=2.0).contains(&fb1) && 1.0 - fb1 - fb2 >= 0.0 && 1.0 + fb1 - fb2 >= 0.0
        };
        self.c = if stable {
            [fb1, fb2, g(2), g(3), g(4)]
        } else {
            [0.0; 5]
        };
    }
}

impl PdObject for Biquad {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Signal], vec![Port::Signal])
    }
    fn distributes_lists(&self) -> bool {
        false
    }
    fn message(&mut self, _inlet: usize, msg: &Msg, _cx: &mut Cx<'_>) {
        match msg.selector.as_str() {
            "float" => self.scalar = msg.f(0),
            "list" => self.set_list(&msg.args),
            "set" => {
                self.x1 = msg.f(0);
                self.x2 = msg.f(1);
            }
            "clear" => {
                self.x1 = 0.0;
                self.x2 = 0.0;
            }
            _ => {}
        }
    }
    fn is_dsp(&self) -> bool {
        true
    }
    fn signal_scalar(&self, _: usize) -> f32 {
        self.scalar
    }
    fn perform(&mut self, ins: &[&[f32]], outs: &mut [&mut [f32]]) {
        let [fb1, fb2, ff1, ff2, ff3] = self.c;
        let (mut last, mut prev) = (self.x1, self.x2);
        for (o, &i) in outs[0].iter_mut().zip(ins[0].iter()) {
            let mut output = i + fb1 * last + fb2 * prev;
            if big_or_small(output) {
                output = 0.0;
            }
            *o = ff1 * output + ff2 * last + ff3 * prev;
            prev = last;
            last = output;
        }
        self.x1 = last;
        self.x2 = prev;
    }
}

/// `rpole~` (`y = x + c*y[-1]`) and `rzero~` (`y = x - c*x[-1]`): raw one-pole/one-zero with a
/// signal coefficient (the argument sets the right inlet's scalar).
#[derive(Debug)]
pub struct RawReal {
    pole: bool,
    last: f32,
    scalars: [f32; 2],
}

impl PdObject for RawReal {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Signal, Port::Signal], vec![Port::Signal])
    }
    fn message(&mut self, inlet: usize, msg: &Msg, _cx: &mut Cx<'_>) {
        match msg.selector.as_str() {
            "float" if inlet < 2 => self.scalars[inlet] = msg.f(0),
            "clear" => self.last = 0.0,
            "set" => self.last = msg.f(0),
            _ => {}
        }
    }
    fn is_dsp(&self) -> bool {
        true
    }
    fn signal_scalar(&self, inlet: usize) -> f32 {
        self.scalars[inlet.min(1)]
    }
    fn perform(&mut self, ins: &[&[f32]], outs: &mut [&mut [f32]]) {
        let mut last = self.last;
        if self.pole {
            for ((o, &x), &c) in outs[0].iter_mut().zip(ins[0]).zip(ins[1]) {
                last = c * last + x;
                *o = last;
            }
            if big_or_small(last) {
                last = 0.0;
            }
        } else {
            for ((o, &x), &c) in outs[0].iter_mut().zip(ins[0]).zip(ins[1]) {
                *o = x - c * last;
                last = x;
            }
        }
        self.last = last;
    }
}

/// `cpole~`: complex one-pole; inlets re, im, coef re, coef im; outlets re, im.
#[derive(Debug)]
pub struct Cpole {
    lastre: f32,
    lastim: f32,
    scalars: [f32; 4],
}

impl PdObject for Cpole {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Signal; 4], vec![Port::Signal; 2])
    }
    fn message(&mut self, inlet: usize, msg: &Msg, _cx: &mut Cx<'_>) {
        match msg.selector.as_str() {
            "float" if inlet < 4 => self.scalars[inlet] = msg.f(0),
            "clear" => {
                self.lastre = 0.0;
                self.lastim = 0.0
            }
            "set" => {
                self.lastre = msg.f(0);
                self.lastim = msg.f(1);
            }
            _ => {}
        }
    }
    fn is_dsp(&self) -> bool {
        true
    }
    fn signal_scalar(&self, inlet: usize) -> f32 {
        self.scalars[inlet.min(3)]
    }
    fn perform(&mut self, ins: &[&[f32]], outs: &mut [&mut [f32]]) {
        let (mut lastre, mut lastim) = (self.lastre, self.lastim);
        let (ore, oim) = outs.split_at_mut(1);
        for i in 0..ins[0].len() {
            let (nre, nim, cre, cim) = (ins[0][i], ins[1][i], ins[2][i], ins[3][i]);
            let tempre = nre + lastre * cre - lastim * cim;
            lastim = nim + lastre * cim + lastim * cre;
            ore[0][i] = tempre;
            oim[0][i] = lastim;
            lastre = tempre;
        }
        if big_or_small(lastre) {
            lastre = 0.0;
        }
        if big_or_small(lastim) {
            lastim = 0.0;
        }
        self.lastre = lastre;
        self.lastim = lastim;
    }
}

/// Creates the d_filter.c objects.
pub fn create(class: &str, args: &[Atom]) -> Option<Box<dyn PdObject>> {
    Some(match class {
        "lop~" => {
            let mut o = Lop {
                sr: 44100.0,
                hz: 0.0,
                coef: 0.0,
                last: 0.0,
                scalar: 0.0,
            };
            o.set(farg(args, 0, 0.0));
            Box::new(o)
        }
        "hip~" => {
            let mut o = Hip {
                sr: 44100.0,
                hz: 0.0,
                coef: 0.0,
                last: 0.0,
                scalar: 0.0,
            };
            o.set(farg(args, 0, 0.0));
            Box::new(o)
        }
        "bp~" => {
            let mut o = Bp {
                sr: 44100.0,
                freq: 0.0,
                q: 0.0,
                x1: 0.0,
                x2: 0.0,
                coef1: 0.0,
                coef2: 0.0,
                gain: 0.0,
                scalar: 0.0,
            };
            o.docoef(farg(args, 0, 0.0), farg(args, 1, 0.0));
            Box::new(o)
        }
        "biquad~" => {
            let mut o = Biquad::default();
            o.set_list(args);
            Box::new(o)
        }
        "rpole~" | "rzero~" => Box::new(RawReal {
            pole: class == "rpole~",
            last: 0.0,
            scalars: [0.0, farg(args, 0, 0.0)],
        }),
        "cpole~" => Box::new(Cpole {
            lastre: 0.0,
            lastim: 0.0,
            scalars: [0.0, 0.0, farg(args, 0, 0.0), farg(args, 1, 0.0)],
        }),
        _ => return None,
    })
}
