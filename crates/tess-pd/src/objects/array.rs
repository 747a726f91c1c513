//! Arrays after Pd 0.53's d_array.c and x_array.c: `table NAME SIZE`, `array define NAME SIZE`,
//! `tabosc4~ NAME`, `tabread4~ NAME` (both with Pd's 4-point interpolation), `tabread~ NAME`,
//! `tabwrite~ NAME` (records a signal into the array) and `tabplay~ NAME` (plays it).
//!
//! An array written by a `tabwrite~` is named state the scheduler orders its users by (see
//! [`resource`]), so readers on other harts see what Pd's order gives them.

use super::osc::{hi, with_hi, UNITBIT32};
use super::{farg, sarg, CreateError, Cx, DspEnv, PdObject, Port};
use crate::atom::{Atom, Msg};
use std::sync::{Arc, RwLock};

type Array = Arc<RwLock<Vec<f32>>>;

fn read(a: &Array) -> std::sync::RwLockReadGuard<'_, Vec<f32>> {
    a.read().unwrap_or_else(|e| e.into_inner())
}

/// Pd's 4-point interpolation (shared by `tabread4~`, `tabosc4~`).
#[inline]
fn interp4(a: f32, b: f32, c: f32, d: f32, frac: f32) -> f32 {
    let cminusb = c - b;
    let inner = 0.1666667f32 as f64
        * (1.0 - frac as f64)
        * ((d - a - 3.0f32 * cminusb) * frac + (d + 2.0f32 * a - 3.0f32 * b)) as f64;
    (b as f64 + frac as f64 * (cminusb as f64 - inner)) as f32
}

/// A `table` or `array define`: holds an array; a bang does nothing (no editor here).
#[derive(Debug)]
pub struct TableHolder;

impl PdObject for TableHolder {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Control], vec![])
    }
}

/// `tabread4~ NAME`: reads the array at a signal index (1 .. size-2), right inlet onset.
#[derive(Debug)]
pub struct Tabread4 {
    name: String,
    array: Option<Array>,
    onset: f32,
    scalar: f32,
}

impl PdObject for Tabread4 {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Signal, Port::Control], vec![Port::Signal])
    }
    fn message(&mut self, inlet: usize, msg: &Msg, _cx: &mut Cx<'_>) {
        match (inlet, msg.selector.as_str()) {
            (0, "float") => self.scalar = msg.f(0),
            (1, "float") => self.onset = msg.f(0),
            (0, "set") => self.name = sarg(&msg.args, 0),
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
        self.array = env.shared.array(&self.name);
    }
    fn perform(&mut self, ins: &[&[f32]], outs: &mut [&mut [f32]]) {
        let Some(arr) = &self.array else {
            outs[0].fill(0.0);
            return;
        };
        let buf = read(arr);
        let maxindex = buf.len() as i32 - 3;
        if maxindex < 0 {
            outs[0].fill(0.0);
            return;
        }
        let onset = self.onset as f64;
        for (o, &i) in outs[0].iter_mut().zip(ins[0]) {
            let findex = i as f64 + onset;
            let mut index = findex as i32;
            let frac: f32;
            if index < 1 {
                index = 1;
                frac = 0.0;
            } else if index > maxindex {
                index = maxindex;
                frac = 1.0;
            } else {
                frac = (findex - index as f64) as f32;
            }
            let k = index as usize;
            *o = interp4(buf[k - 1], buf[k], buf[k + 1], buf[k + 2], frac);
        }
    }
}

/// `tabosc4~ NAME`: wavetable oscillator over an array of 2^k + 3 points.
#[derive(Debug)]
pub struct Tabosc4 {
    name: String,
    array: Option<Array>,
    fnpoints: f32,
    finvnpoints: f32,
    phase: f64,
    conv: f32,
    freq: f32,
}

impl PdObject for Tabosc4 {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Signal, Port::Control], vec![Port::Signal])
    }
    fn message(&mut self, inlet: usize, msg: &Msg, _cx: &mut Cx<'_>) {
        match (inlet, msg.selector.as_str()) {
            (0, "float") => self.freq = msg.f(0),
            (1, "float") => self.phase = msg.f(0) as f64,
            (0, "set") => self.name = sarg(&msg.args, 0),
            _ => {}
        }
    }
    fn is_dsp(&self) -> bool {
        true
    }
    fn signal_scalar(&self, _: usize) -> f32 {
        self.freq
    }
    fn prepare(&mut self, env: &DspEnv<'_>) {
        self.conv = (1.0f64 / env.sample_rate as f64) as f32;
        self.array = None;
        if let Some(a) = env.shared.array(&self.name) {
            let points = read(&a).len();
            if points >= 4 && (points - 3).is_power_of_two() {
                self.fnpoints = (points - 3) as f32;
                self.finvnpoints = (1.0f64 / (points - 3) as f64) as f32;
                self.array = Some(a);
            }
        }
    }
    fn perform(&mut self, ins: &[&[f32]], outs: &mut [&mut [f32]]) {
        let Some(arr) = &self.array else {
            outs[0].fill(0.0);
            return;
        };
        let tab = read(arr);
        let fnpoints = self.fnpoints;
        let mask = fnpoints as u32 - 1;
        let conv = fnpoints * self.conv;
        let normhi = hi(UNITBIT32);
        let mut dphase = fnpoints as f64 * self.phase + UNITBIT32;
        for (o, &i) in outs[0].iter_mut().zip(ins[0]) {
            let cur = dphase;
            dphase += (i * conv) as f64;
            let idx = (hi(cur) & mask) as usize;
            let frac = (with_hi(cur, normhi) - UNITBIT32) as f32;
            *o = interp4(tab[idx], tab[idx + 1], tab[idx + 2], tab[idx + 3], frac);
        }
        let size = fnpoints as f64;
        let nh = hi(UNITBIT32 * size);
        let t = with_hi(dphase + (UNITBIT32 * size - UNITBIT32), nh);
        self.phase = (t - UNITBIT32 * size) * self.finvnpoints as f64;
    }
    fn cost_hint_ns(&self) -> u32 {
        300
    }
}

/// `tabread~ NAME`: the array at the signal index, truncated and clamped to the array.
#[derive(Debug)]
pub struct Tabread {
    name: String,
    array: Option<Array>,
    scalar: f32,
}

impl PdObject for Tabread {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Signal], vec![Port::Signal])
    }
    fn message(&mut self, _inlet: usize, msg: &Msg, _cx: &mut Cx<'_>) {
        match msg.selector.as_str() {
            "float" => self.scalar = msg.f(0),
            "set" => self.name = sarg(&msg.args, 0),
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
        self.array = env.shared.array(&self.name);
    }
    fn perform(&mut self, ins: &[&[f32]], outs: &mut [&mut [f32]]) {
        let Some(arr) = &self.array else {
            outs[0].fill(0.0);
            return;
        };
        let buf = read(arr);
        let Some(maxindex) = buf.len().checked_sub(1) else {
            outs[0].fill(0.0);
            return;
        };
        for (o, &i) in outs[0].iter_mut().zip(ins[0]) {
            // C's float-to-int conversion on x86 (out of range or NaN: INT_MIN), then the clamp
            let index = if (-2_147_483_648.0..2_147_483_648.0).contains(&i) {
                i as i32
            } else {
                i32::MIN
            };
            let index = index.clamp(0, maxindex as i32) as usize;
            *o = buf[index];
        }
    }
}

/// Where a `tabwrite~` or `tabplay~` is not: Pd's `0x7fffffff` phase.
const IDLE: i64 = 0x7fff_ffff;

/// `tabwrite~ NAME`: records its input into the array from a `bang` (or `start N`) until the
/// array is full or `stop`.
#[derive(Debug)]
pub struct Tabwrite {
    name: String,
    array: Option<Array>,
    phase: i64,
    scalar: f32,
}

impl PdObject for Tabwrite {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Signal], vec![])
    }
    fn message(&mut self, _inlet: usize, msg: &Msg, _cx: &mut Cx<'_>) {
        match msg.selector.as_str() {
            "float" => self.scalar = msg.f(0),
            "bang" => self.phase = 0,
            "start" => self.phase = msg.f(0).max(0.0) as i64,
            "stop" => self.phase = IDLE,
            "set" => self.name = sarg(&msg.args, 0),
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
        self.array = env.shared.array(&self.name);
    }
    fn perform(&mut self, ins: &[&[f32]], _outs: &mut [&mut [f32]]) {
        let Some(arr) = &self.array else {
            return;
        };
        let mut buf = arr.write().unwrap_or_else(|e| e.into_inner());
        let end = buf.len() as i64;
        if end <= self.phase {
            self.phase = IDLE;
            return;
        }
        let n = ((end - self.phase) as usize).min(ins[0].len());
        let at = self.phase as usize;
        for (w, &x) in buf[at..at + n].iter_mut().zip(ins[0]) {
            *w = if super::osc::big_or_small(x) { 0.0 } else { x };
        }
        self.phase += n as i64;
        if self.phase >= end {
            self.phase = IDLE;
        }
    }
}

/// `tabplay~ NAME`: plays the array once from a `bang`, `START` or `START LENGTH`, and bangs
/// its right outlet (after the block) when done.
#[derive(Debug)]
pub struct Tabplay {
    name: String,
    array: Option<Array>,
    phase: i64,
    limit: i64,
    finished: bool,
}

impl PdObject for Tabplay {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Control], vec![Port::Signal, Port::Control])
    }
    fn distributes_lists(&self) -> bool {
        false // Pd's tabplay~ has a list method: START LENGTH
    }
    fn message(&mut self, _inlet: usize, msg: &Msg, _cx: &mut Cx<'_>) {
        match msg.selector.as_str() {
            // a bang or a float reaches Pd's list method
            "bang" | "float" | "list" => {
                let start = (msg.f(0) as i64).max(0);
                let length = msg.f(1) as i64;
                self.limit = if length <= 0 { IDLE } else { start + length };
                self.phase = start;
            }
            "stop" => self.phase = IDLE,
            "set" => self.name = sarg(&msg.args, 0),
            _ => {}
        }
    }
    fn is_dsp(&self) -> bool {
        true
    }
    fn prepare(&mut self, env: &DspEnv<'_>) {
        self.array = env.shared.array(&self.name);
    }
    fn perform(&mut self, _ins: &[&[f32]], outs: &mut [&mut [f32]]) {
        let out = &mut *outs[0];
        let Some(arr) = &self.array else {
            out.fill(0.0);
            return;
        };
        let buf = read(arr);
        let end = (buf.len() as i64).min(self.limit);
        if self.phase >= end {
            out.fill(0.0);
            return;
        }
        let n = ((end - self.phase) as usize).min(out.len());
        let at = self.phase as usize;
        out[..n].copy_from_slice(&buf[at..at + n]);
        out[n..].fill(0.0);
        self.phase += n as i64;
        if self.phase >= end {
            self.phase = IDLE;
            self.finished = true;
        }
    }
    fn wants_clock_after_block(&mut self) -> bool {
        std::mem::take(&mut self.finished)
    }
    fn reports_after_block(&self) -> bool {
        true
    }
    fn clock(&mut self, _tag: u32, cx: &mut Cx<'_>) {
        cx.out(1, Msg::bang());
    }
}

/// The array a `tab*~` object reads or writes, as named state for the scheduler (see
/// [`crate::load`], which keeps it only for arrays some `tabwrite~` writes: readers of an
/// array nothing writes in DSP need no order among themselves).
pub fn resource(class: &str, args: &[Atom]) -> Option<String> {
    match class {
        "tabwrite~" | "tabread~" | "tabread4~" | "tabplay~" | "tabosc4~" => {
            Some(format!("array:{}", sarg(args, 0)))
        }
        _ => None,
    }
}

/// Defines an array (from `table`, `array define` or a graph), keeping an existing one.
pub fn define_array(shared: &mut crate::shared::Shared, name: &str, data: Vec<f32>) {
    shared
        .arrays
        .entry(name.to_string())
        .or_insert_with(|| Arc::new(RwLock::new(data)));
}

/// Creates the array objects.
pub fn create(
    class: &str,
    args: &[Atom],
    shared: &mut crate::shared::Shared,
) -> Result<Option<Box<dyn PdObject>>, CreateError> {
    Ok(Some(match class {
        "table" => {
            let size = farg(args, 1, 100.0).max(1.0) as usize;
            define_array(shared, &sarg(args, 0), vec![0.0; size]);
            Box::new(TableHolder)
        }
        "array" => {
            let sub = sarg(args, 0);
            if sub != "define" {
                return Err(CreateError::BadArgs {
                    class: "array".into(),
                    what: format!("only 'array define' is supported, not 'array {sub}'"),
                });
            }
            // `array define [-k] NAME SIZE`
            let rest: Vec<Atom> = args[1..]
                .iter()
                .filter(|a| a.symbol() != Some("-k"))
                .cloned()
                .collect();
            let size = farg(&rest, 1, 100.0).max(1.0) as usize;
            define_array(shared, &sarg(&rest, 0), vec![0.0; size]);
            Box::new(TableHolder)
        }
        "tabread4~" => Box::new(Tabread4 {
            name: sarg(args, 0),
            array: None,
            onset: 0.0,
            scalar: 0.0,
        }),
        "tabread~" => Box::new(Tabread {
            name: sarg(args, 0),
            array: None,
            scalar: 0.0,
        }),
        "tabwrite~" => Box::new(Tabwrite {
            name: sarg(args, 0),
            array: None,
            phase: IDLE,
            scalar: 0.0,
        }),
        "tabplay~" => Box::new(Tabplay {
            name: sarg(args, 0),
            array: None,
            phase: IDLE,
            limit: 0,
            finished: false,
        }),
        "tabosc4~" => Box::new(Tabosc4 {
            name: sarg(args, 0),
            array: None,
            fnpoints: 512.0,
            finvnpoints: 1.0 / 512.0,
            phase: 0.0,
            conv: 0.0,
            freq: 0.0,
        }),
        _ => return Ok(None),
    }))
}
