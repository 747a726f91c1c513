//! State objects share by name: arrays, delay lines (`delwrite~`), `send~` and `catch~` buses,
//! and the `dac~`/`adc~` channels.
//!
//! Every entry is behind a lock. The locks are never contended by design: the scheduler
//! (`sched::graph`) runs every object that touches the same named state in Pd's sort order,
//! one after the other, so a lock costs one uncontended atomic pair per block.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, RwLock};

/// Extra samples before a delay line's start, for 4-point interpolation (d_delay.c).
pub const XTRASAMPS: usize = 4;
/// Delay line sizes round up to a multiple of this.
const SAMPBLK: i32 = 4;
/// Extra room for one vector (d_delay.c `DEFDELVS`).
const DEFDELVS: i32 = 64;

/// A delay line as `delwrite~` keeps it (d_delay.c `t_delwritectl`).
#[derive(Debug, Default)]
pub struct DelayLine {
    /// Usable length (`c_n`).
    pub n: usize,
    /// Samples, `n + XTRASAMPS` long.
    pub vec: Vec<f32>,
    /// Write position (`c_phase`).
    pub phase: usize,
    /// Requested length in milliseconds.
    pub deltime_ms: f32,
    /// Vector size for readers (`x_vecsize`).
    pub vecsize: usize,
}

impl DelayLine {
    /// Sizes the line for a sample rate (d_delay.c `sigdelwrite_updatesr`).
    pub fn update_sr(&mut self, sr: f32) {
        let mut nsamps = (self.deltime_ms * sr * 0.001f32) as i32;
        if nsamps < 1 {
            nsamps = 1;
        }
        nsamps += (-nsamps) & (SAMPBLK - 1);
        nsamps += DEFDELVS;
        let nsamps = nsamps as usize;
        if self.n != nsamps {
            self.vec.resize(nsamps + XTRASAMPS, 0.0);
            self.n = nsamps;
            self.phase = XTRASAMPS;
        }
    }
}

/// A `send~` or `catch~` buffer.
pub type Bus = Arc<Mutex<Vec<f32>>>;

/// How `tess~conv` runs its long levels: on a pool of lower-priority workers (seed 001
/// section 3.3, approach 1), and what happens to a step that misses its deadline.
#[derive(Debug, Clone)]
pub struct ConvWorkers {
    /// The workers, shared by every `tess~conv` of the engine.
    pub pool: Arc<tess_conv::Pool>,
    /// `Drop` in real time (a late step is silence for its level), `Wait` for exact output.
    pub when_late: tess_conv::WhenLate,
}

/// Where `tess~conv`'s long levels run (seed 001 section 3.3).
#[derive(Debug, Clone, Default)]
pub enum LongLevels {
    /// Whole, in the block that completes their input: exact, and bursty.
    #[default]
    Synchronous,
    /// Each step cut into sub-tasks spread over the blocks of its level's period (approach 2),
    /// with partitions chosen for the heaviest block.
    TimeDistributed,
    /// On workers below the engine's priority that every block preempts (approach 1).
    Preemptive(ConvWorkers),
    /// Approach 1 on the engine's own harts: each step due a period later, run in pieces in
    /// the time the harts have between blocks ([`crate::graph::Background`]), set aside at the
    /// next piece boundary when a block arrives. No threads or priorities of its own, so it
    /// runs on a cell's harts. A step not done when due is late (counted, its level silent for
    /// a period): never waited for, since a hart inside a block runs no pieces. Offline,
    /// `render` runs every piece between blocks, so nothing is late and the output is exact.
    Background,
}

/// All named state of one patch.
#[derive(Debug, Default)]
pub struct Shared {
    /// Arrays (`table`, `array define`, graphs).
    pub arrays: HashMap<String, Arc<RwLock<Vec<f32>>>>,
    /// Delay lines by `delwrite~` name.
    pub delays: HashMap<String, Arc<Mutex<DelayLine>>>,
    /// `send~` buffers.
    pub sends: HashMap<String, Bus>,
    /// `catch~` buffers.
    pub catches: HashMap<String, Bus>,
    /// `dac~` channels (summed into; the engine clears them before each block, except a
    /// channel with one writer, which overwrites it: see [`Shared::dac_writers`]).
    pub dac: Vec<Bus>,
    /// Per `dac~` channel, how many `dac~` inlets write it (counted as they prepare).
    ///
    /// With one, that inlet stores the block instead of adding it to a cleared bus: the bus
    /// then stays in the cache of the hart that runs the `dac~`, instead of moving to the
    /// engine's thread to be cleared and back to be added to, two transfers between caches
    /// in every block of a parallel run.
    pub dac_writers: Vec<Arc<AtomicUsize>>,
    /// `adc~` channels (filled by the host before each block; at least as many as `dac~`
    /// channels, so a host with a fixed channel count can fill them all).
    pub adc: Vec<Bus>,
    /// The engine's sample rate, Hz (what `soundfiler write` writes by default).
    pub sample_rate: f32,
    /// Where `tess~conv`'s long levels run.
    pub long_levels: LongLevels,
    /// Long convolution steps that missed their deadline (preemptive or background long
    /// levels), all objects.
    pub conv_late: Arc<AtomicU64>,
    /// How many of the `adc~` channels some `adc~` object reads (its highest channel): a host
    /// that opens inputs on demand (JACK ports) opens these.
    pub adc_read: usize,
    /// `delwrite~`s already prepared in this DSP build (so a `delread~` sorted after its writer
    /// reads with no extra block of delay, d_delay.c `x_zerodel`).
    pub delwrites_sorted: Mutex<HashSet<String>>,
    /// Pd's logical time (ms, as `f64` bits) while the current block computes: the end of the
    /// block, as `sched_tick` sets it before `dsp_tick` (`vline~` reads it).
    pub block_time_ms: Arc<AtomicU64>,
}

impl Shared {
    /// The array `name`, if defined.
    pub fn array(&self, name: &str) -> Option<Arc<RwLock<Vec<f32>>>> {
        self.arrays.get(name).cloned()
    }

    /// Makes sure `dac~`/`adc~` channel `ch` (0-based) exists.
    pub fn ensure_channels(&mut self, ch: usize, block: usize) {
        while self.dac.len() <= ch {
            self.dac.push(Arc::new(Mutex::new(vec![0.0; block])));
            self.dac_writers.push(Arc::default());
        }
        while self.adc.len() <= ch {
            self.adc.push(Arc::new(Mutex::new(vec![0.0; block])));
        }
    }
}

/// Locks a mutex, ignoring poisoning (a panicking DSP object already aborts the render).
pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
