//! The object set: one trait every Pd object implements, and the registry that creates an
//! object from its box text. Control objects live in [`control`]; signal objects by the Pd
//! source file they follow (`osc` = d_osc.c, `filter` = d_filter.c, `ctl` = d_ctl.c,
//! `math` = d_math.c and d_arithmetic.c, `delay` = d_delay.c, `global` = d_global.c,
//! `array` = d_array.c, `expr` = x_vexp*.c, `soundfiler` = d_soundfile.c).

pub mod array;
pub mod control;
pub mod conv;
pub mod ctl;
pub mod delay;
pub mod expr;
pub mod filter;
pub mod global;
pub mod math;
pub mod midi;
pub mod osc;
pub mod soundfiler;

use crate::atom::{Atom, Msg};
use crate::shared::Shared;

/// Pd's value of pi: d_filter.c and d_ctl.c write 3.14159, and the real pi would not match Pd.
#[allow(clippy::approx_constant)] // deliberately Pd's truncated constant
pub const PD_PI: f64 = 3.14159;
/// [`PD_PI`] as `f32` (where Pd writes `3.14159f`).
#[allow(clippy::approx_constant)] // deliberately Pd's truncated constant
pub const PD_PI_F32: f32 = 3.14159;
/// Pd's 2 pi in `vcf~` (d_osc.c writes 6.28318f).
#[allow(clippy::approx_constant)] // deliberately Pd's truncated constant
pub const PD_TWO_PI_F32: f32 = 6.28318;

/// What flows through a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Port {
    /// Messages.
    Control,
    /// Audio; a signal inlet left unconnected holds a float (the "scalar").
    Signal,
}

/// Something an object asks the engine to do, in order (Pd runs these depth first; the engine
/// runs them in the order given, which is the same for every object here).
#[derive(Debug, Clone)]
pub enum Action {
    /// Send a message out of an outlet.
    Out(usize, Msg),
    /// Send a message to every receiver of a name (`s`, `;` in a message box).
    Send(String, Msg),
    /// Arm the object's clock `tag` to fire after so many milliseconds (replacing it).
    SetClock(u32, f64),
    /// Disarm clock `tag`.
    UnsetClock(u32),
    /// Call [`PdObject::resume`] with this tag once the actions before it are done (for
    /// objects that look at their state after an output, like `metro`).
    Resume(u32),
}

/// The context of a control call: the actions, the logical time.
#[derive(Debug)]
pub struct Cx<'a> {
    /// Actions produced, in order.
    pub actions: Vec<Action>,
    /// Logical time in milliseconds since start.
    pub now_ms: f64,
    /// Named arrays, delay lines and buses.
    pub shared: &'a Shared,
}

impl Cx<'_> {
    /// Sends `m` out of `outlet`.
    pub fn out(&mut self, outlet: usize, m: Msg) {
        self.actions.push(Action::Out(outlet, m));
    }
}

/// What an object gets when DSP starts (`dsp` method in Pd).
#[derive(Debug)]
pub struct DspEnv<'a> {
    /// Sample rate in Hz.
    pub sample_rate: f32,
    /// Samples per block.
    pub block: usize,
    /// Named arrays, delay lines and buses.
    pub shared: &'a Shared,
}

/// A Pd object.
pub trait PdObject: Send + std::fmt::Debug {
    /// Inlets and outlets, left to right.
    fn ports(&self) -> (Vec<Port>, Vec<Port>);
    /// A message arrives at `inlet`.
    fn message(&mut self, inlet: usize, msg: &Msg, cx: &mut Cx<'_>) {
        let _ = (inlet, msg, cx);
    }
    /// Clock `tag` fired.
    fn clock(&mut self, tag: u32, cx: &mut Cx<'_>) {
        let _ = (tag, cx);
    }
    /// See [`Action::Resume`].
    fn resume(&mut self, tag: u32, cx: &mut Cx<'_>) {
        let _ = (tag, cx);
    }
    /// `loadbang`.
    fn loadbang(&mut self, cx: &mut Cx<'_>) {
        let _ = cx;
    }
    /// Whether a `list` at the left inlet is spread over the inlets (Pd's default).
    fn distributes_lists(&self) -> bool {
        true
    }
    /// Whether it takes part in DSP.
    fn is_dsp(&self) -> bool {
        false
    }
    /// The value an unconnected signal inlet holds.
    fn signal_scalar(&self, inlet: usize) -> f32 {
        let _ = inlet;
        0.0
    }
    /// DSP starts (called in Pd's sort order).
    fn prepare(&mut self, env: &DspEnv<'_>) {
        let _ = env;
    }
    /// Computes one block. `ins[k]` is signal inlet k's input (summed; with one source, that
    /// source's own output buffer, read in place), `outs[k]` signal outlet k's buffer; both
    /// are `block` long.
    fn perform(&mut self, ins: &[&[f32]], outs: &mut [&mut [f32]]) {
        let _ = (ins, outs);
    }
    /// Right after each `perform`, on the same hart, for objects that report to control (Pd's
    /// `clock_delay(c, 0)` from a perform routine): return true to get [`PdObject::clock`]
    /// tag 0 after the block, in node order.
    fn wants_clock_after_block(&mut self) -> bool {
        false
    }
    /// Whether [`PdObject::wants_clock_after_block`] can ever return true (asked once, when DSP
    /// starts, so that the engine asks only these objects after each block).
    fn reports_after_block(&self) -> bool {
        false
    }
    /// Rough cost of one block in nanoseconds, for clustering (see `sched::tasks`).
    fn cost_hint_ns(&self) -> u32 {
        100
    }
    /// The sub-tasks this object splits its work into (a parallel plug-in, seed 001 section
    /// 2.2), asked once, after [`PdObject::prepare`]. Each becomes a node of the graph of its
    /// own with no signal ports, run once per block on whichever hart the scheduler picks,
    /// before this object's `perform` in the same block (never concurrently with it); the
    /// parts run concurrently with each other and with the rest of the graph. The object
    /// and its parts share state only through what the parts were built with.
    fn parallel_parts(&mut self) -> Vec<Box<dyn PdObject>> {
        Vec::new()
    }
    /// Long-running work this object does outside the blocks (seed 001 section 3.3, approach
    /// 1), asked once, after [`PdObject::prepare`]: the engine's harts run its pieces when
    /// they have no block work, lower in priority than any block, and set it aside at the next
    /// piece boundary when a block arrives ([`crate::graph::Background`]).
    fn background_tasks(&mut self) -> Vec<Box<dyn BackgroundTask>> {
        Vec::new()
    }
}

/// Work an object does in the harts' idle time ([`PdObject::background_tasks`]).
pub trait BackgroundTask: Send + std::fmt::Debug {
    /// Runs one short piece of work, if there is any; returns whether it ran something. A
    /// piece should take no longer than the object can afford to delay a block.
    fn run_piece(&mut self) -> bool;
    /// How urgent the task's work is: the time (ns) it has from being given work to being
    /// due. Shorter runs first (rate-monotonic).
    fn due_within_ns(&self) -> u64;
    /// A first guess at how long a piece takes (ns), until the engine has timed some: a
    /// host with a block due soon starts a piece only if it is expected to end before the
    /// block ([`crate::graph::Background::run_piece_before`]). The default, 0, lets the first
    /// piece run anywhere and be timed.
    fn piece_ns_hint(&self) -> u64 {
        0
    }
    /// A check any idle hart may make, without claiming the task, before it claims it:
    /// `false` only when [`BackgroundTask::run_piece`] would run nothing. Asked once, when
    /// the graph is built. The default always says there may be work (a hart claims the task
    /// to find out).
    fn probe(&self) -> WorkProbe {
        Box::new(|| true)
    }
}

/// Whether a background task may have work ([`BackgroundTask::probe`]).
pub type WorkProbe = Box<dyn Fn() -> bool + Send + Sync>;

/// Why an object could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    /// No such class.
    #[error("unknown object '{0}'")]
    Unknown(String),
    /// Bad arguments.
    #[error("{class}: {what}")]
    BadArgs {
        /// The class.
        class: String,
        /// What is wrong.
        what: String,
    },
}

/// Signal objects with a float argument (`+~ 3`) take a control right inlet; without one,
/// a signal right inlet (d_arithmetic.c).
pub fn has_float_arg(args: &[Atom]) -> bool {
    !args.is_empty()
}

/// The float argument `i`, or `default`.
pub fn farg(args: &[Atom], i: usize, default: f32) -> f32 {
    args.get(i).map(Atom::float).unwrap_or(default)
}

/// The symbol argument `i`, or "".
pub fn sarg(args: &[Atom], i: usize) -> String {
    args.get(i)
        .map(|a| match a {
            Atom::Symbol(s) => s.clone(),
            Atom::Float(f) => f.to_string(),
        })
        .unwrap_or_default()
}

/// Creates an object from its class name and arguments. `noise_seed` is Pd's per-process
/// seed counter for `noise~` (each instance multiplies it by 1319).
/// `dir` is the folder of the patch file the box is in (where `soundfiler` finds files).
pub fn create(
    class: &str,
    args: &[Atom],
    shared: &mut Shared,
    noise_seed: &mut i32,
    dir: &std::path::Path,
) -> Result<Box<dyn PdObject>, CreateError> {
    if class == "soundfiler" {
        return Ok(Box::new(soundfiler::Soundfiler::new(dir)));
    }
    if let Some(o) = control::create(class, args)? {
        return Ok(o);
    }
    if let Some(o) = osc::create(class, args, noise_seed) {
        return Ok(o);
    }
    if let Some(o) = filter::create(class, args) {
        return Ok(o);
    }
    if let Some(o) = math::create(class, args) {
        return Ok(o);
    }
    if let Some(o) = ctl::create(class, args) {
        return Ok(o);
    }
    if let Some(o) = delay::create(class, args, shared) {
        return Ok(o);
    }
    if let Some(o) = global::create(class, args, shared) {
        return Ok(o);
    }
    if let Some(o) = array::create(class, args, shared)? {
        return Ok(o);
    }
    if let Some(o) = conv::create(class, args) {
        return Ok(o);
    }
    if let Some(o) = midi::create(class, args) {
        return Ok(o);
    }
    if let Some(o) = expr::create(class, args)? {
        return Ok(o);
    }
    Err(CreateError::Unknown(class.to_string()))
}

/// Every class name [`create`] knows (for `tess-pd objects` and the README).
pub const CLASSES: &[&str] = &[
    "soundfiler",
    "tabread~",
    "tabwrite~",
    "tabplay~",
    "samphold~",
    "loadbang",
    "metro",
    "delay",
    "del",
    "line",
    "f",
    "float",
    "i",
    "int",
    "+",
    "-",
    "*",
    "/",
    "s",
    "send",
    "r",
    "receive",
    "t",
    "trigger",
    "pack",
    "unpack",
    "route",
    "sel",
    "select",
    "mtof",
    "print",
    "bang",
    "b",
    "inlet",
    "outlet",
    "osc~",
    "phasor~",
    "cos~",
    "noise~",
    "vcf~",
    "lop~",
    "hip~",
    "bp~",
    "biquad~",
    "rpole~",
    "rzero~",
    "cpole~",
    "sig~",
    "+~",
    "-~",
    "*~",
    "/~",
    "max~",
    "min~",
    "clip~",
    "wrap~",
    "abs~",
    "sqrt~",
    "mtof~",
    "line~",
    "vline~",
    "snapshot~",
    "env~",
    "dac~",
    "adc~",
    "inlet~",
    "outlet~",
    "delwrite~",
    "delread~",
    "delread4~",
    "vd~",
    "send~",
    "s~",
    "receive~",
    "r~",
    "throw~",
    "catch~",
    "tabosc4~",
    "tabread4~",
    "table",
    "array",
    "tess~conv",
    "notein",
    "ctlin",
    "expr",
    "expr~",
];
