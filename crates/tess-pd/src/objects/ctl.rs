//! Control/signal converters after Pd 0.53's d_ctl.c: `line~`, `vline~`, `snapshot~`, `env~`.

use super::{farg, Cx, DspEnv, PdObject, Port};
use crate::atom::{Atom, Msg};
use crate::objects::osc::big_or_small;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// `line~`: ramps to a target over a time, in whole blocks (d_ctl.c `line_tilde`).
#[derive(Debug, Default)]
pub struct LineTilde {
    target: f32,
    value: f32,
    biginc: f32,
    inc: f32,
    one_over_n: f32,
    dsptick_to_ms: f32,
    inlet_value: f32,
    inlet_was: f32,
    ticks_left: i32,
    retarget: bool,
}

impl PdObject for LineTilde {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Control, Port::Control], vec![Port::Signal])
    }
    fn message(&mut self, inlet: usize, msg: &Msg, _cx: &mut Cx<'_>) {
        match (inlet, msg.selector.as_str()) {
            (1, "float") => self.inlet_value = msg.f(0),
            (0, "float") => {
                let f = msg.f(0);
                if self.inlet_value <= 0.0 {
                    self.target = f;
                    self.value = f;
                    self.ticks_left = 0;
                    self.retarget = false;
                } else {
                    self.target = f;
                    self.retarget = true;
                    self.inlet_was = self.inlet_value;
                    self.inlet_value = 0.0;
                }
            }
            (0, "stop") => {
                self.target = self.value;
                self.ticks_left = 0;
                self.retarget = false;
            }
            _ => {}
        }
    }
    fn is_dsp(&self) -> bool {
        true
    }
    fn prepare(&mut self, env: &DspEnv<'_>) {
        self.one_over_n = (1.0f64 / env.block as f64) as f32;
        self.dsptick_to_ms = env.sample_rate / (1000.0 * env.block as f32);
    }
    fn perform(&mut self, _ins: &[&[f32]], outs: &mut [&mut [f32]]) {
        if big_or_small(self.value) {
            self.value = 0.0;
        }
        if self.retarget {
            let mut nticks = (self.inlet_was * self.dsptick_to_ms) as i32;
            if nticks == 0 {
                nticks = 1;
            }
            self.ticks_left = nticks;
            self.biginc = (self.target - self.value) / nticks as f32;
            self.inc = self.one_over_n * self.biginc;
            self.retarget = false;
        }
        if self.ticks_left > 0 {
            let mut f = self.value;
            for o in outs[0].iter_mut() {
                *o = f;
                f += self.inc;
            }
            self.value += self.biginc;
            self.ticks_left -= 1;
        } else {
            self.value = self.target;
            outs[0].fill(self.target);
        }
    }
}

/// One `vline~` segment.
#[derive(Debug, Clone)]
struct Seg {
    target_time: f64,
    start_time: f64,
    target: f32,
}

/// `vline~`: sample-accurate ramps with delay (d_ctl.c `vline_tilde`).
#[derive(Debug)]
pub struct VlineTilde {
    value: f64,
    inc: f64,
    last_logical: f64,
    next_block_time: f64,
    ms_per_samp: f64,
    target_time: f64,
    target: f32,
    inlet1: f32,
    inlet2: f32,
    list: Vec<Seg>,
    clock: Option<Arc<AtomicU64>>,
}

impl VlineTilde {
    fn stop(&mut self) {
        self.list.clear();
        self.inc = 0.0;
        self.inlet1 = 0.0;
        self.inlet2 = 0.0;
        self.target = self.value as f32;
        self.target_time = 1e20;
    }
    fn float(&mut self, f: f32, now: f64) {
        let inlet1 = if self.inlet1 < 0.0 { 0.0 } else { self.inlet1 };
        let inlet2 = self.inlet2;
        let start = now + inlet2 as f64;
        let f = if big_or_small(f) { 0.0 } else { f };
        if inlet2 < 0.0 {
            self.value = f as f64;
            self.stop();
            return;
        }
        let supplants = |s: &Seg| {
            s.start_time > start
                || (s.start_time == start && (s.target_time > s.start_time || inlet1 <= 0.0))
        };
        let pos = self
            .list
            .iter()
            .position(supplants)
            .unwrap_or(self.list.len());
        self.list.truncate(pos);
        self.list.push(Seg {
            target: f,
            start_time: start,
            target_time: start + inlet1 as f64,
        });
        self.inlet1 = 0.0;
        self.inlet2 = 0.0;
    }
}

impl PdObject for VlineTilde {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Control; 3], vec![Port::Signal])
    }
    fn message(&mut self, inlet: usize, msg: &Msg, cx: &mut Cx<'_>) {
        match (inlet, msg.selector.as_str()) {
            (1, "float") => self.inlet1 = msg.f(0),
            (2, "float") => self.inlet2 = msg.f(0),
            (0, "float") => self.float(msg.f(0), cx.now_ms),
            (0, "stop") => self.stop(),
            _ => {}
        }
    }
    fn is_dsp(&self) -> bool {
        true
    }
    fn prepare(&mut self, env: &DspEnv<'_>) {
        self.ms_per_samp = 1000.0 / env.sample_rate as f64;
        self.clock = Some(env.shared.block_time_ms.clone());
    }
    fn perform(&mut self, _ins: &[&[f32]], outs: &mut [&mut [f32]]) {
        let n = outs[0].len();
        let mut f = self.value;
        let mut inc = self.inc;
        let msps = self.ms_per_samp;
        let now = self
            .clock
            .as_ref()
            .map(|c| f64::from_bits(c.load(Ordering::Relaxed)))
            .unwrap_or(0.0);
        if now != self.last_logical {
            let samps = n.max(64) as f64;
            self.last_logical = now;
            self.next_block_time = now - samps * msps;
        }
        let mut timenow = self.next_block_time;
        self.next_block_time = timenow + n as f64 * msps;
        let mut head = 0usize;
        for o in outs[0].iter_mut() {
            let timenext = timenow + msps;
            while let Some(s) = self.list.get(head) {
                if s.start_time >= timenext {
                    break;
                }
                if self.target_time <= timenext {
                    f = self.target as f64;
                }
                if s.target_time <= s.start_time {
                    f = s.target as f64;
                    inc = 0.0;
                } else {
                    let per_ms = (s.target as f64 - f) / (s.target_time - s.start_time);
                    f += per_ms * (timenext - s.start_time);
                    inc = per_ms * msps;
                }
                self.inc = inc;
                self.target = s.target;
                self.target_time = s.target_time;
                head += 1;
            }
            if self.target_time <= timenext {
                f = self.target as f64;
                inc = 0.0;
                self.inc = 0.0;
                self.target_time = 1e20;
            }
            *o = f as f32;
            f += inc;
            timenow = timenext;
        }
        self.list.drain(..head);
        self.value = f;
    }
}

/// `snapshot~`: the last sample of the previous block, on bang.
#[derive(Debug, Default)]
pub struct Snapshot {
    value: f32,
    scalar: f32,
}

impl PdObject for Snapshot {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Signal], vec![Port::Control])
    }
    fn message(&mut self, _inlet: usize, msg: &Msg, cx: &mut Cx<'_>) {
        match msg.selector.as_str() {
            "bang" => cx.out(0, Msg::float(self.value)),
            "set" => self.value = msg.f(0),
            "float" => self.scalar = msg.f(0),
            _ => {}
        }
    }
    fn is_dsp(&self) -> bool {
        true
    }
    fn signal_scalar(&self, _: usize) -> f32 {
        self.scalar
    }
    fn perform(&mut self, ins: &[&[f32]], _outs: &mut [&mut [f32]]) {
        if let Some(&v) = ins[0].last() {
            self.value = v;
        }
    }
}

/// `env~ npoints period`: RMS in dB (100 = 1.0) over a Hann window, every `period` samples.
#[derive(Debug)]
pub struct Env {
    buf: Vec<f32>,
    npoints: usize,
    phase: i32,
    period: usize,
    real_period: usize,
    sumbuf: [f32; 32],
    result: f32,
    ready: bool,
    scalar: f32,
    /// The block's input squared, last sample first (the order the window is applied in).
    squares: Vec<f32>,
}

/// `a . b` with eight partial sums: the compiler vectorises it, where one running sum is a
/// chain of dependent adds. The rounding differs from Pd's single sum by a few ulps, far
/// inside the 1e-5 that compatibility allows.
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut sum = acc.iter().sum::<f32>();
    for (x, y) in ar.iter().zip(br) {
        sum += x * y;
    }
    sum
}

/// Pd's `powtodb`.
pub fn powtodb(f: f32) -> f32 {
    if f <= 0.0 {
        0.0
    } else {
        let val = (100.0 + 10.0 / std::f64::consts::LN_10 * (f as f64).ln()) as f32;
        if val < 0.0 {
            0.0
        } else {
            val
        }
    }
}

impl Env {
    fn new(args: &[Atom]) -> Env {
        let mut npoints = farg(args, 0, 0.0) as i32;
        let mut period = farg(args, 1, 0.0) as i32;
        if npoints < 1 {
            npoints = 1024;
        }
        if period < 1 {
            period = npoints / 2;
        }
        if period < npoints / 32 + 1 {
            period = npoints / 32 + 1;
        }
        let n = npoints as usize;
        let mut buf: Vec<f32> = (0..n)
            .map(|i| {
                ((1.0 - ((2.0 * super::PD_PI * i as f64) / npoints as f64).cos()) / npoints as f64)
                    as f32
            })
            .collect();
        buf.resize(n + 64, 0.0);
        Env {
            buf,
            npoints: n,
            phase: 0,
            period: period as usize,
            real_period: period as usize,
            sumbuf: [0.0; 32],
            result: 0.0,
            ready: false,
            scalar: 0.0,
            squares: Vec::new(),
        }
    }
}

/// `samphold~` (d_ctl.c `sigsamphold`): samples the left signal whenever the right one
/// decreases (a `phasor~` wrapping), and holds it. `set F` sets the held value, `reset [F]` the
/// last control value (1e20 without an argument, so the next sample triggers).
#[derive(Debug, Default)]
pub struct Samphold {
    last_in: f32,
    last_out: f32,
    scalar: f32,
}

impl PdObject for Samphold {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Signal, Port::Signal], vec![Port::Signal])
    }
    fn message(&mut self, _inlet: usize, msg: &Msg, _cx: &mut Cx<'_>) {
        match msg.selector.as_str() {
            "float" => self.scalar = msg.f(0),
            "set" => self.last_out = msg.f(0),
            "reset" => {
                self.last_in = match msg.args.first() {
                    Some(Atom::Float(f)) => *f,
                    _ => 1e20,
                }
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
    fn perform(&mut self, ins: &[&[f32]], outs: &mut [&mut [f32]]) {
        let (mut last_in, mut last_out) = (self.last_in, self.last_out);
        for ((o, &x), &ctl) in outs[0].iter_mut().zip(ins[0]).zip(ins[1]) {
            if ctl < last_in {
                last_out = x;
            }
            *o = last_out;
            last_in = ctl;
        }
        (self.last_in, self.last_out) = (last_in, last_out);
    }
}

impl PdObject for Env {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Signal], vec![Port::Control])
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
        let n = env.block;
        self.real_period = if !self.period.is_multiple_of(n) {
            self.period + n - self.period % n
        } else {
            self.period
        };
        if self.buf.len() < self.npoints + n {
            self.buf.resize(self.npoints + n, 0.0);
        }
        self.squares.resize(n, 0.0);
    }
    fn perform(&mut self, ins: &[&[f32]], _outs: &mut [&mut [f32]]) {
        let input = ins[0];
        let n = input.len();
        let mut count = self.phase as usize;
        let mut k = 0usize;
        // Pd's loop walks the input backwards against the window: square it once in that order
        // (into the buffer `prepare` sized for the block).
        debug_assert_eq!(self.squares.len(), n, "env~ ran before prepare");
        for (s, x) in self.squares.iter_mut().zip(input.iter().rev()) {
            *s = x * x;
        }
        while count < self.npoints {
            self.sumbuf[k] += dot(&self.buf[count..count + n], &self.squares);
            count += self.real_period;
            k += 1;
        }
        if k < 32 {
            self.sumbuf[k] = 0.0;
        }
        self.phase -= n as i32;
        if self.phase < 0 {
            self.result = self.sumbuf[0];
            let mut count = self.real_period;
            let mut k = 0usize;
            while count < self.npoints {
                self.sumbuf[k] = self.sumbuf[k + 1];
                count += self.real_period;
                k += 1;
            }
            self.sumbuf[k] = 0.0;
            self.phase = self.real_period as i32 - n as i32;
            self.ready = true;
        }
    }
    fn wants_clock_after_block(&mut self) -> bool {
        std::mem::take(&mut self.ready)
    }
    fn reports_after_block(&self) -> bool {
        true
    }
    fn clock(&mut self, _tag: u32, cx: &mut Cx<'_>) {
        cx.out(0, Msg::float(powtodb(self.result)));
    }
    fn cost_hint_ns(&self) -> u32 {
        (self.npoints / self.real_period.max(1)) as u32 * 60 + 50
    }
}

/// Creates the d_ctl.c objects.
pub fn create(class: &str, args: &[Atom]) -> Option<Box<dyn PdObject>> {
    Some(match class {
        "samphold~" => Box::new(Samphold::default()),
        "line~" => Box::new(LineTilde::default()),
        "vline~" => Box::new(VlineTilde {
            value: 0.0,
            inc: 0.0,
            last_logical: 0.0,
            next_block_time: 0.0,
            ms_per_samp: 0.0,
            target_time: 1e20,
            target: 0.0,
            inlet1: 0.0,
            inlet2: 0.0,
            list: Vec::new(),
            clock: None,
        }),
        "snapshot~" => Box::new(Snapshot::default()),
        "env~" => Box::new(Env::new(args)),
        _ => return None,
    })
}
