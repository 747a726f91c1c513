//! Delay lines after Pd 0.53's d_delay.c: `delwrite~ NAME MS`, `delread~ NAME MS`,
//! `delread4~`/`vd~ NAME` (4-point interpolation, signal delay time).
//!
//! A reader sorted before its writer in Pd's DSP order reads one block later (`x_zerodel`);
//! the scheduler keeps Pd's order between them (see `sched::graph`).

use super::{farg, sarg, Cx, DspEnv, PdObject, Port};
use crate::atom::{Atom, Msg};
use crate::objects::osc::big_or_small;
use crate::shared::{lock, DelayLine, Shared, XTRASAMPS};
use std::sync::{Arc, Mutex};

/// `delwrite~`.
#[derive(Debug)]
pub struct DelWrite {
    name: String,
    line: Arc<Mutex<DelayLine>>,
    scalar: f32,
}

impl PdObject for DelWrite {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Signal], vec![])
    }
    fn message(&mut self, _inlet: usize, msg: &Msg, _cx: &mut Cx<'_>) {
        match msg.selector.as_str() {
            "float" => self.scalar = msg.f(0),
            "clear" => lock(&self.line).vec.fill(0.0),
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
        lock(&env.shared.delwrites_sorted).insert(self.name.clone());
        let mut l = lock(&self.line);
        l.vecsize = env.block;
        l.update_sr(env.sample_rate);
    }
    fn perform(&mut self, ins: &[&[f32]], _outs: &mut [&mut [f32]]) {
        let mut l = lock(&self.line);
        let nsamps = l.n;
        let end = nsamps + XTRASAMPS;
        let mut phase = l.phase;
        let mut bp = phase;
        phase += ins[0].len();
        for &f in ins[0] {
            let f = if big_or_small(f) { 0.0 } else { f };
            l.vec[bp] = f;
            bp += 1;
            if bp == end {
                for k in 0..4 {
                    l.vec[k] = l.vec[end - 4 + k];
                }
                bp = XTRASAMPS;
                phase -= nsamps;
            }
        }
        l.phase = phase;
    }
}

/// `delread~`.
#[derive(Debug)]
pub struct DelRead {
    name: String,
    line: Option<Arc<Mutex<DelayLine>>>,
    deltime: f32,
    sr_per_ms: f32,
    n: i32,
    zerodel: i32,
    delsamps: i32,
}

impl DelRead {
    fn set_delay(&mut self, f: f32) {
        self.deltime = f;
        if let Some(line) = &self.line {
            let c_n = lock(line).n as i32;
            self.delsamps =
                (0.5 + (self.sr_per_ms * self.deltime) as f64) as i32 + self.n - self.zerodel;
            if self.delsamps < self.n {
                self.delsamps = self.n;
            } else if self.delsamps > c_n {
                self.delsamps = c_n;
            }
        }
    }
}

impl PdObject for DelRead {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Control], vec![Port::Signal])
    }
    fn message(&mut self, _inlet: usize, msg: &Msg, _cx: &mut Cx<'_>) {
        if msg.selector == "float" {
            self.set_delay(msg.f(0));
        }
    }
    fn is_dsp(&self) -> bool {
        true
    }
    fn prepare(&mut self, env: &DspEnv<'_>) {
        self.sr_per_ms = (env.sample_rate as f64 * 0.001) as f32;
        self.n = env.block as i32;
        self.line = env.shared.delays.get(&self.name).cloned();
        if let Some(line) = &self.line {
            let mut l = lock(line);
            l.update_sr(env.sample_rate);
            let sorted = lock(&env.shared.delwrites_sorted).contains(&self.name);
            self.zerodel = if sorted { 0 } else { env.block as i32 };
            drop(l);
            self.set_delay(self.deltime);
        }
    }
    fn perform(&mut self, _ins: &[&[f32]], outs: &mut [&mut [f32]]) {
        let Some(line) = &self.line else {
            outs[0].fill(0.0);
            return;
        };
        let l = lock(line);
        let nsamps = l.n as i32;
        let end = l.n + XTRASAMPS;
        let mut phase = l.phase as i32 - self.delsamps;
        if phase < 0 {
            phase += nsamps;
        }
        let mut bp = phase as usize;
        for o in outs[0].iter_mut() {
            *o = l.vec[bp];
            bp += 1;
            if bp == end {
                bp -= l.n;
            }
        }
    }
}

/// `delread4~` / `vd~`.
#[derive(Debug)]
pub struct Vd {
    name: String,
    line: Option<Arc<Mutex<DelayLine>>>,
    sr_per_ms: f32,
    zerodel: f32,
    scalar: f32,
}

impl PdObject for Vd {
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
    fn signal_scalar(&self, _: usize) -> f32 {
        self.scalar
    }
    fn prepare(&mut self, env: &DspEnv<'_>) {
        self.sr_per_ms = (env.sample_rate as f64 * 0.001) as f32;
        self.line = env.shared.delays.get(&self.name).cloned();
        let sorted = lock(&env.shared.delwrites_sorted).contains(&self.name);
        self.zerodel = if sorted { 0.0 } else { env.block as f32 };
    }
    fn perform(&mut self, ins: &[&[f32]], outs: &mut [&mut [f32]]) {
        let Some(line) = &self.line else {
            outs[0].fill(0.0);
            return;
        };
        let l = lock(line);
        let n = outs[0].len();
        let nsamps = l.n as i32;
        let limit = (nsamps - n as i32) as f32;
        if limit < 0.0 {
            outs[0].fill(0.0);
            return;
        }
        let mut fn_ = (n - 1) as f32;
        let wp = l.phase as i32;
        for (o, &d) in outs[0].iter_mut().zip(ins[0]) {
            let mut delsamps = self.sr_per_ms * d - self.zerodel;
            // also catches NaN, as Pd's `!(delsamps >= 1.00001f)` does
            if delsamps.is_nan() || delsamps < 1.00001f32 {
                delsamps = 1.00001f32;
            }
            if delsamps > limit {
                delsamps = limit;
            }
            delsamps += fn_;
            fn_ -= 1.0;
            let idelsamps = delsamps as i32;
            let frac = delsamps - idelsamps as f32;
            let mut bp = wp - idelsamps;
            if bp < XTRASAMPS as i32 {
                bp += nsamps;
            }
            let bp = bp as usize;
            let (d, c, b, a) = (l.vec[bp - 3], l.vec[bp - 2], l.vec[bp - 1], l.vec[bp]);
            let cminusb = c - b;
            *o = b + frac
                * (cminusb
                    - (0.1666667f32 as f64
                        * (1.0 - frac as f64)
                        * ((d - a - 3.0f32 * cminusb) * frac + (d + 2.0f32 * a - 3.0f32 * b))
                            as f64) as f32);
        }
    }
}

/// Creates the d_delay.c objects; `delwrite~` registers its line by name.
pub fn create(class: &str, args: &[Atom], shared: &mut Shared) -> Option<Box<dyn PdObject>> {
    Some(match class {
        "delwrite~" => {
            let mut name = sarg(args, 0);
            if name.is_empty() {
                name = "delwrite~".into();
            }
            let line = Arc::new(Mutex::new(DelayLine {
                deltime_ms: farg(args, 1, 0.0),
                vec: vec![0.0; XTRASAMPS],
                ..DelayLine::default()
            }));
            shared.delays.insert(name.clone(), line.clone());
            Box::new(DelWrite {
                name,
                line,
                scalar: 0.0,
            })
        }
        "delread~" => Box::new(DelRead {
            name: sarg(args, 0),
            line: None,
            deltime: farg(args, 1, 0.0),
            sr_per_ms: 44.1,
            n: 1,
            zerodel: 0,
            delsamps: 0,
        }),
        "delread4~" | "vd~" => Box::new(Vd {
            name: sarg(args, 0),
            line: None,
            sr_per_ms: 44.1,
            zerodel: 0.0,
            scalar: 0.0,
        }),
        _ => return None,
    })
}

/// The named state a delay object touches (the scheduler keeps Pd's order among them).
pub fn resource(class: &str, args: &[Atom]) -> Option<String> {
    match class {
        "delwrite~" | "delread~" | "delread4~" | "vd~" => {
            let n = sarg(args, 0);
            Some(format!(
                "delay:{}",
                if n.is_empty() { "delwrite~".into() } else { n }
            ))
        }
        _ => None,
    }
}
