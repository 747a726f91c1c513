//! The engine: Pd's scheduler loop (m_sched.c `sched_tick`) over a loaded patch.
//!
//! Each tick: run every clock due before the end of the block (setting logical time to each
//! clock's time), set logical time to the block's end, compute the DSP graph, then arm the
//! clocks that DSP objects asked for (`env~`), which fire at the next tick. Control messages
//! are delivered depth first in Pd's order: fan-out in connection order, `trigger` and
//! `unpack` right to left, receivers newest first.

use crate::atom::{Atom, Msg};
use crate::graph::DspGraph;
use crate::load::{self, Program};
use crate::objects::control::TIME_UNITS_PER_MS;
use crate::objects::{Action, Cx, DspEnv, PdObject, Port};
use crate::sched::Executor;
use crate::shared::lock;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::Ordering;

/// Engine settings.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// Sample rate in Hz.
    pub sample_rate: f32,
    /// Samples per block (power of two, 16..=1024).
    pub block: usize,
}

/// What else an engine may be given besides its [`Config`].
#[derive(Debug, Clone, Default)]
pub struct EngineOptions {
    /// Where `tess~conv`'s long levels run (default: synchronously).
    pub long_levels: crate::shared::LongLevels,
}

/// Long convolution levels a pool serves: enough for any plan `tess~conv` makes (partitions
/// from the smallest block, 16 samples, up to its largest, 65,536: twelve doublings).
pub const CONV_LEVELS: usize = 12;

/// Starts the workers for [`LongLevels::Preemptive`](crate::shared::LongLevels) in real time: SCHED_FIFO from
/// `engine_priority - 1` down (one step per level, the shortest level highest), so that every
/// block of the engine preempts them; unpinned, so they run on whichever of the calling
/// thread's CPUs the engine leaves idle. Needs `engine_priority` of at least
/// [`CONV_LEVELS`] + 1.
pub fn conv_workers(engine_priority: i32) -> Result<crate::shared::ConvWorkers, EngineError> {
    if engine_priority <= CONV_LEVELS as i32 {
        return Err(EngineError::Config(format!(
            "preemptive convolution needs the engine at SCHED_FIFO {} or above (its {CONV_LEVELS} \
             workers run one priority step each below it), not {engine_priority}",
            CONV_LEVELS + 1
        )));
    }
    let pool = tess_conv::Pool::new(tess_conv::PoolOptions {
        hart: None,
        top_priority: Some(engine_priority - 1),
        levels: CONV_LEVELS,
    })
    .map_err(|e| EngineError::Config(e.to_string()))?;
    Ok(crate::shared::ConvWorkers {
        pool: std::sync::Arc::new(pool),
        when_late: tess_conv::WhenLate::Drop,
    })
}

/// Why the engine could not start.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// Loading failed.
    #[error(transparent)]
    Load(#[from] load::LoadError),
    /// The DSP graph has a loop.
    #[error(transparent)]
    Loop(#[from] crate::sort::DspLoop),
    /// Bad settings.
    #[error("{0}")]
    Config(String),
}

/// A placeholder left where a signal object moved into the DSP graph.
#[derive(Debug)]
struct Moved;
impl PdObject for Moved {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![], vec![])
    }
}

/// A running patch.
#[derive(Debug)]
pub struct Engine {
    prog: Program,
    graph: DspGraph,
    receivers: HashMap<String, Vec<usize>>,
    clocks: BTreeMap<(u64, u64), (usize, u32)>,
    clock_keys: HashMap<(usize, u32), (u64, u64)>,
    clock_seq: u64,
    systime: f64,
    tick_units: f64,
    config: Config,
    depth: usize,
    midi: crate::objects::midi::MidiParser,
}

impl Engine {
    /// Loads a patch, sends loadbangs, and starts DSP.
    pub fn open(path: &Path, config: Config) -> Result<Engine, EngineError> {
        Engine::open_with(path, config, &EngineOptions::default())
    }

    /// [`Engine::open`] with options.
    pub fn open_with(
        path: &Path,
        config: Config,
        options: &EngineOptions,
    ) -> Result<Engine, EngineError> {
        if !config.block.is_power_of_two() || !(16..=1024).contains(&config.block) {
            return Err(EngineError::Config(format!(
                "block size {} is not a power of two from 16 to 1024",
                config.block
            )));
        }
        if config.sample_rate.is_nan() || config.sample_rate < 1000.0 {
            return Err(EngineError::Config(format!(
                "sample rate {} Hz is too low",
                config.sample_rate
            )));
        }
        let mut prog = load::load(path)?;
        prog.shared.sample_rate = config.sample_rate;
        prog.shared.long_levels = options.long_levels.clone();
        let order = crate::sort::sort(&prog.sort, &prog.signal_edges)?;
        let max_ch = prog.shared.dac.len().max(1);
        prog.shared.ensure_channels(max_ch - 1, config.block);
        for b in prog.shared.dac.iter().chain(&prog.shared.adc) {
            lock(b).resize(config.block, 0.0);
        }
        let mut receivers: HashMap<String, Vec<usize>> = HashMap::new();
        for (id, e) in prog.objects.iter().enumerate() {
            if let Some(r) = &e.receives {
                receivers.entry(r.clone()).or_default().insert(0, id);
            }
        }
        let mut e = Engine {
            graph: DspGraph::default(),
            prog,
            receivers,
            clocks: BTreeMap::new(),
            clock_keys: HashMap::new(),
            clock_seq: 0,
            systime: 0.0,
            tick_units: TIME_UNITS_PER_MS * 1000.0 * config.block as f64
                / config.sample_rate as f64,
            config,
            depth: 0,
            midi: Default::default(),
        };
        for id in e.prog.loadbang_order.clone() {
            e.call(id, |o, cx| o.loadbang(cx));
        }
        // DSP starts: objects learn the rate and block size in Pd's sort order.
        lock(&e.prog.shared.delwrites_sorted).clear();
        for w in &e.prog.shared.dac_writers {
            w.store(0, Ordering::Relaxed);
        }
        for &id in &order {
            let env = DspEnv {
                sample_rate: config.sample_rate,
                block: config.block,
                shared: &e.prog.shared,
            };
            e.prog.objects[id].obj.prepare(&env);
        }
        e.graph = DspGraph::build(&mut e.prog, &order, config.block, || Box::new(Moved));
        Ok(e)
    }

    /// The DSP graph (for the scheduler and benches).
    pub fn graph(&self) -> &DspGraph {
        &self.graph
    }

    /// Runs the patch's background work (`tess~conv`'s long levels with
    /// [`crate::shared::LongLevels::Background`]) on the calling thread until `deadline_ns`
    /// (on `tess_sched::clock`), when the host owes its next block: a piece is started only
    /// if it is expected to end by then ([`crate::graph::Background::run_piece_before`]).
    /// Returns early when there is no work that fits. A host calls it between blocks (the
    /// executor's worker harts run pieces on their own while they wait for a block).
    pub fn run_background_until(&self, deadline_ns: u64) {
        self.graph.background.run_until(deadline_ns);
    }

    /// Background pieces, on any of the engine's harts, that ended after the block they were
    /// started before was due ([`crate::graph::Background::overran`]).
    pub fn background_overruns(&self) -> u64 {
        self.graph.background.overran()
    }

    /// Runs all the patch's background work there is now, on the calling thread (waiting for
    /// any piece another hart is running): what an offline host does between blocks, so that
    /// no long step is late.
    pub fn run_background(&self) {
        self.graph.background.run_all();
    }

    /// Output channels.
    pub fn channels(&self) -> usize {
        self.prog.shared.dac.len()
    }

    /// Settings.
    pub fn config(&self) -> Config {
        self.config
    }

    /// Logical time in ms.
    pub fn now_ms(&self) -> f64 {
        self.systime / TIME_UNITS_PER_MS
    }

    fn obj_mut(&mut self, id: usize) -> &mut Box<dyn PdObject> {
        match self.graph.node_of.get(id).copied().flatten() {
            Some(n) => self.graph.obj_mut(n),
            None => &mut self.prog.objects[id].obj,
        }
    }

    /// Calls into object `id` and carries out what it asks.
    fn call(&mut self, id: usize, f: impl FnOnce(&mut Box<dyn PdObject>, &mut Cx<'_>)) {
        let now = self.now_ms();
        // Take the object's actions, then run them (depth first).
        let shared = std::mem::take(&mut self.prog.shared);
        let mut cx = Cx {
            actions: Vec::new(),
            now_ms: now,
            shared: &shared,
        };
        f(self.obj_mut(id), &mut cx);
        let actions = std::mem::take(&mut cx.actions);
        drop(cx);
        self.prog.shared = shared;
        for a in actions {
            self.act(id, a);
        }
    }

    fn act(&mut self, id: usize, a: Action) {
        match a {
            Action::Out(outlet, m) => {
                let targets = self.prog.control_out[id]
                    .get(outlet)
                    .cloned()
                    .unwrap_or_default();
                for (t, inlet) in targets {
                    self.deliver(t, inlet, &m);
                }
            }
            Action::Send(name, m) => self.send(&name, &m),
            Action::SetClock(tag, ms) => {
                self.unset_clock(id, tag);
                let t = (self.systime + ms.max(0.0) * TIME_UNITS_PER_MS).max(self.systime);
                self.clock_seq += 1;
                let key = (t.to_bits(), self.clock_seq);
                self.clocks.insert(key, (id, tag));
                self.clock_keys.insert((id, tag), key);
            }
            Action::UnsetClock(tag) => self.unset_clock(id, tag),
            Action::Resume(tag) => self.call(id, |o, cx| o.resume(tag, cx)),
        }
    }

    fn unset_clock(&mut self, id: usize, tag: u32) {
        if let Some(k) = self.clock_keys.remove(&(id, tag)) {
            self.clocks.remove(&k);
        }
    }

    /// Delivers a message to an object's inlet (spreading lists over inlets as Pd does).
    pub fn deliver(&mut self, id: usize, inlet: usize, m: &Msg) {
        self.depth += 1;
        if self.depth > 1000 {
            eprintln!("tess-pd: stack overflow (message loop?) at object {id}; message dropped");
            self.depth -= 1;
            return;
        }
        let spread = inlet == 0
            && m.selector == "list"
            && m.args.len() > 1
            && self.obj_mut(id).distributes_lists();
        if spread {
            let n_in = self.prog.objects[id].ins.len();
            for (i, a) in m.args.iter().enumerate().skip(1).rev() {
                if i < n_in {
                    let mm = match a {
                        Atom::Float(f) => Msg::float(*f),
                        Atom::Symbol(s) => Msg::symbol(s),
                    };
                    self.call(id, |o, cx| o.message(i, &mm, cx));
                }
            }
            let first = match &m.args[0] {
                Atom::Float(f) => Msg::float(*f),
                Atom::Symbol(s) => Msg::symbol(s),
            };
            self.call(id, |o, cx| o.message(0, &first, cx));
        } else {
            let m = m.clone();
            self.call(id, |o, cx| o.message(inlet, &m, cx));
        }
        self.depth -= 1;
    }

    /// Sends to every receiver of `name` (and handles `pd` and array messages).
    pub fn send(&mut self, name: &str, m: &Msg) {
        if let Some(rs) = self.receivers.get(name).cloned() {
            for r in rs {
                self.deliver(r, 0, m);
            }
            return;
        }
        if name == "pd" {
            return; // `pd dsp 1` etc.: DSP always runs here
        }
        if let Some(arr) = self.prog.shared.array(name) {
            let mut a = arr.write().unwrap_or_else(|e| e.into_inner());
            match m.selector.as_str() {
                "const" => a.fill(m.f(0)),
                "resize" => {
                    let n = m.f(0).max(1.0) as usize;
                    a.resize(n, 0.0)
                }
                "list" | "float" => {
                    let onset = m.f(0).max(0.0) as usize;
                    for (i, v) in m.args.iter().skip(1).enumerate() {
                        if let Some(x) = a.get_mut(onset + i) {
                            *x = v.float();
                        }
                    }
                }
                _ => {}
            }
        }
    }

    /// Runs one tick: clocks, then one DSP block with `exec`. Output is in the dac buses.
    pub fn tick(&mut self, exec: &mut Executor) {
        let next = self.systime + self.tick_units;
        while let Some((&key, &(id, tag))) = self.clocks.iter().next() {
            let t = f64::from_bits(key.0);
            if t >= next {
                break;
            }
            self.clocks.remove(&key);
            self.clock_keys.remove(&(id, tag));
            self.systime = t;
            self.call(id, |o, cx| o.clock(tag, cx));
        }
        self.systime = next;
        self.prog
            .shared
            .block_time_ms
            .store(self.now_ms().to_bits(), Ordering::Relaxed);
        let shared = &self.prog.shared;
        for (b, writers) in shared.dac.iter().zip(&shared.dac_writers) {
            // a channel's only writer overwrites it
            if writers.load(Ordering::Relaxed) != 1 {
                lock(b).fill(0.0);
            }
        }
        exec.run_block(&mut self.graph);
        // In node order, as Pd's clocks set during the block would fire.
        for i in 0..self.graph.reporters().len() {
            let n = self.graph.reporters()[i];
            if self.graph.take_fired(n) {
                let id = self.graph.nodes[n].obj_id;
                self.act(id, Action::SetClock(0, 0.0));
            }
        }
    }

    /// MIDI bytes from a device or the network (port 0), delivered now to the `notein` and
    /// `ctlin` objects; call between blocks, as Pd polls its MIDI queue before each tick. A
    /// message split across calls is completed by the next.
    pub fn midi_in(&mut self, bytes: &[u8]) {
        // the parser is taken out for the call, so that its events can go straight to `send`
        let mut parser = std::mem::take(&mut self.midi);
        parser.feed(bytes, |e| {
            let list = e.list.iter().map(|&f| Atom::Float(f)).collect();
            self.send(e.to, &Msg::from_atoms(list));
        });
        self.midi = parser;
    }

    /// Input channels (`adc~`; at least as many as output channels).
    pub fn input_channels(&self) -> usize {
        self.prog.shared.adc.len()
    }

    /// Long convolution steps (`tess~conv`: preemptive, in the background, or a skipped
    /// time-distributed share) that missed their deadline so far; each silenced its level for
    /// a period or two.
    pub fn conv_late(&self) -> u64 {
        self.prog.shared.conv_late.load(Ordering::Relaxed)
    }

    /// Input channels some `adc~` of the patch reads (0 for a patch without `adc~`): the
    /// inputs worth opening when a host opens them on demand.
    pub fn input_channels_read(&self) -> usize {
        self.prog.shared.adc_read
    }

    /// Sets input channel `ch` (0-based, `adc~ ch+1`) for the next block; `samples` is one
    /// block long. Channels the patch has no bus for are ignored.
    pub fn write_input(&mut self, ch: usize, samples: &[f32]) {
        if let Some(bus) = self.prog.shared.adc.get(ch) {
            lock(bus).copy_from_slice(samples);
        }
    }

    /// Copies output channel `ch` of the last block into `out`.
    pub fn read_output(&self, ch: usize, out: &mut [f32]) {
        out.copy_from_slice(&lock(&self.prog.shared.dac[ch]));
    }
}
