//! Signals across the patch after Pd 0.53's d_global.c and d_dac.c: `send~`/`receive~`,
//! `throw~`/`catch~`, `dac~`/`adc~`, and the subpatch ports `inlet~`/`outlet~`.

use super::{farg, sarg, Cx, DspEnv, PdObject, Port};
use crate::atom::{Atom, Msg};
use crate::objects::osc::big_or_small;
use crate::shared::{lock, Bus, Shared};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// `send~ NAME`: copies its input into the named buffer.
#[derive(Debug)]
pub struct SendTilde {
    bus: Bus,
    scalar: f32,
}

impl PdObject for SendTilde {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Signal], vec![])
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
        lock(&self.bus).resize(env.block, 0.0);
    }
    fn perform(&mut self, ins: &[&[f32]], _outs: &mut [&mut [f32]]) {
        let mut b = lock(&self.bus);
        for (o, &i) in b.iter_mut().zip(ins[0]) {
            *o = if big_or_small(i) { 0.0 } else { i };
        }
    }
}

/// `receive~ NAME`: reads the named `send~` buffer.
#[derive(Debug)]
pub struct ReceiveTilde {
    name: String,
    bus: Option<Bus>,
}

impl PdObject for ReceiveTilde {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Control], vec![Port::Signal])
    }
    fn message(&mut self, _inlet: usize, msg: &Msg, _cx: &mut Cx<'_>) {
        if msg.selector == "set" {
            self.name = msg.args.first().map(|a| a.to_string()).unwrap_or_default();
        }
    }
    fn is_dsp(&self) -> bool {
        true
    }
    fn prepare(&mut self, env: &DspEnv<'_>) {
        self.bus = env.shared.sends.get(&self.name).cloned();
    }
    fn perform(&mut self, _ins: &[&[f32]], outs: &mut [&mut [f32]]) {
        match &self.bus {
            Some(b) => outs[0].copy_from_slice(&lock(b)),
            None => outs[0].fill(0.0),
        }
    }
}

/// `catch~ NAME`: outputs what `throw~`s added, then clears it.
#[derive(Debug)]
pub struct Catch {
    bus: Bus,
}

impl PdObject for Catch {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Control], vec![Port::Signal])
    }
    fn is_dsp(&self) -> bool {
        true
    }
    fn prepare(&mut self, env: &DspEnv<'_>) {
        lock(&self.bus).resize(env.block, 0.0);
    }
    fn perform(&mut self, _ins: &[&[f32]], outs: &mut [&mut [f32]]) {
        let mut b = lock(&self.bus);
        outs[0].copy_from_slice(&b);
        b.fill(0.0);
    }
}

/// `throw~ NAME`: adds its input into the named `catch~`.
#[derive(Debug)]
pub struct Throw {
    name: String,
    bus: Option<Bus>,
    scalar: f32,
}

impl PdObject for Throw {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Signal], vec![])
    }
    fn message(&mut self, _inlet: usize, msg: &Msg, _cx: &mut Cx<'_>) {
        match msg.selector.as_str() {
            "float" => self.scalar = msg.f(0),
            "set" => self.name = msg.args.first().map(|a| a.to_string()).unwrap_or_default(),
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
        self.bus = env.shared.catches.get(&self.name).cloned();
    }
    fn perform(&mut self, ins: &[&[f32]], _outs: &mut [&mut [f32]]) {
        if let Some(b) = &self.bus {
            let mut b = lock(b);
            for (o, &i) in b.iter_mut().zip(ins[0]) {
                *o += if big_or_small(i) { 0.0 } else { i };
            }
        }
    }
}

/// `dac~ 1 2 ...`: adds each inlet into an output channel.
#[derive(Debug)]
pub struct Dac {
    channels: Vec<usize>,
    buses: Vec<Bus>,
    /// Per inlet: its channel's writer count ([`Shared::dac_writers`]).
    writers: Vec<Arc<AtomicUsize>>,
    scalars: Vec<f32>,
}

impl PdObject for Dac {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Signal; self.channels.len()], vec![])
    }
    fn message(&mut self, inlet: usize, msg: &Msg, _cx: &mut Cx<'_>) {
        if msg.selector == "float" && inlet < self.scalars.len() {
            self.scalars[inlet] = msg.f(0);
        }
    }
    fn is_dsp(&self) -> bool {
        true
    }
    fn signal_scalar(&self, inlet: usize) -> f32 {
        self.scalars.get(inlet).copied().unwrap_or(0.0)
    }
    fn prepare(&mut self, env: &DspEnv<'_>) {
        self.buses = self
            .channels
            .iter()
            .map(|&c| env.shared.dac[c].clone())
            .collect();
        self.writers = self
            .channels
            .iter()
            .map(|&c| env.shared.dac_writers[c].clone())
            .collect();
        for w in &self.writers {
            w.fetch_add(1, Ordering::Relaxed);
        }
    }
    fn perform(&mut self, ins: &[&[f32]], _outs: &mut [&mut [f32]]) {
        for ((bus, input), writers) in self.buses.iter().zip(ins).zip(&self.writers) {
            let mut b = lock(bus);
            if writers.load(Ordering::Relaxed) == 1 {
                // the channel's only writer: the bus was not cleared (`0.0 + i`, as the sum
                // into a cleared bus would give, turns -0 into +0)
                for (o, &i) in b.iter_mut().zip(input.iter()) {
                    *o = 0.0 + i;
                }
            } else {
                for (o, &i) in b.iter_mut().zip(input.iter()) {
                    *o += i;
                }
            }
        }
    }
}

/// `adc~ 1 2 ...`: input channels.
#[derive(Debug)]
pub struct Adc {
    channels: Vec<usize>,
    buses: Vec<Bus>,
}

impl PdObject for Adc {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Control], vec![Port::Signal; self.channels.len()])
    }
    fn is_dsp(&self) -> bool {
        true
    }
    fn prepare(&mut self, env: &DspEnv<'_>) {
        self.buses = self
            .channels
            .iter()
            .map(|&c| env.shared.adc[c].clone())
            .collect();
    }
    fn perform(&mut self, _ins: &[&[f32]], outs: &mut [&mut [f32]]) {
        for (bus, out) in self.buses.iter().zip(outs.iter_mut()) {
            out.copy_from_slice(&lock(bus));
        }
    }
}

/// `inlet~` / `outlet~` inside a subpatch: passes the signal through (Pd borrows the vector;
/// a copy costs one block of memory traffic and keeps every node's buffers its own).
#[derive(Debug, Default)]
pub struct SignalPort {
    scalar: f32,
}

impl PdObject for SignalPort {
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
    fn perform(&mut self, ins: &[&[f32]], outs: &mut [&mut [f32]]) {
        outs[0].copy_from_slice(ins[0]);
    }
    fn cost_hint_ns(&self) -> u32 {
        10
    }
}

/// The `dac~`/`adc~` channel list (default 1 2), 0-based.
pub fn channels(args: &[Atom]) -> Vec<usize> {
    if args.is_empty() {
        vec![0, 1]
    } else {
        args.iter()
            .map(|a| (a.float() as i64 - 1).max(0) as usize)
            .collect()
    }
}

/// Creates the d_global.c / d_dac.c objects.
pub fn create(class: &str, args: &[Atom], shared: &mut Shared) -> Option<Box<dyn PdObject>> {
    Some(match class {
        "send~" | "s~" => {
            let bus: Bus = Arc::new(Mutex::new(Vec::new()));
            shared.sends.insert(sarg(args, 0), bus.clone());
            Box::new(SendTilde { bus, scalar: 0.0 })
        }
        "receive~" | "r~" => Box::new(ReceiveTilde {
            name: sarg(args, 0),
            bus: None,
        }),
        "catch~" => {
            let bus: Bus = Arc::new(Mutex::new(Vec::new()));
            shared.catches.insert(sarg(args, 0), bus.clone());
            Box::new(Catch { bus })
        }
        "throw~" => Box::new(Throw {
            name: sarg(args, 0),
            bus: None,
            scalar: 0.0,
        }),
        "dac~" => {
            let ch = channels(args);
            let max = ch.iter().copied().max().unwrap_or(0);
            shared.ensure_channels(max, 64);
            Box::new(Dac {
                scalars: vec![0.0; ch.len()],
                channels: ch,
                buses: vec![],
                writers: vec![],
            })
        }
        "adc~" => {
            let ch = channels(args);
            let max = ch.iter().copied().max().unwrap_or(0);
            shared.ensure_channels(max, 64);
            shared.adc_read = shared.adc_read.max(max + 1);
            Box::new(Adc {
                channels: ch,
                buses: vec![],
            })
        }
        "inlet~" | "outlet~" => Box::new(SignalPort {
            scalar: farg(args, 0, 0.0),
        }),
        _ => return None,
    })
}

/// The named state these objects touch.
pub fn resource(class: &str, args: &[Atom]) -> Option<String> {
    match class {
        "send~" | "s~" | "receive~" | "r~" => Some(format!("send:{}", sarg(args, 0))),
        "catch~" | "throw~" => Some(format!("catch:{}", sarg(args, 0))),
        "dac~" => Some("dac".into()),
        _ => None,
    }
}
