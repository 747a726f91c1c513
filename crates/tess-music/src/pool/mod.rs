//! The synthesizer's user-level runtime: voices handed to spinning worker harts, without locks.
//!
//! # Design (seed 000, section 3.2: "the runtime dedicates one hardware thread to continuously
//! handle communication ... and dynamically assigns the rest of the hardware threads for the
//! Migrator Synthesizer objects")
//! The communication thread publishes a *job* per package: the list of voices to compute and
//! their controls. Worker threads never sleep: they spin on one atomic word, the *ticket*,
//! and claim voices with compare-and-swap on it (the private `dispatch` module holds the
//! protocol, its ownership rules and its loom model). Each claimed voice is computed by exactly one thread, which then
//! increments `done`. Once `done == n` the communication thread mixes the voices. Voices are
//! processed to completion (non-preemptive: no thread gives up its hart between packages), and
//! the scheme is lock-free: a stalled worker delays only the voice it claimed.
//!
//! # Glossary
//! - **epoch**: the number of the package being computed; **job**: its voices and controls.
//! - **claim**: taking the next voice of the job (CAS on the ticket); **done**: voices finished.
//! - **inline**: computing on the communication thread (the one-hart case, `workers = 0`).
//!
//! # Worked example
//! 20 pads pressed, 1 worker: the worker claims voices 0..19 one after another; at about
//! 0.6 us per 100-oscillator voice (the full 32-voice Migrator measured 19 us per package on the
//! development VM) `done` reaches 20 after some 12 us, then the comm thread mixes and answers.
//! With 3 workers the claims interleave and the package finishes in about a third of that.

mod dispatch;
mod sync;

use crate::slabs::{PadSample, PADS};
use crate::synth::{AudioBlock, Mixer, Tables, Voice};
use dispatch::{Comm, Job};
use std::sync::Arc;
use std::thread::JoinHandle;

/// What the workers compute for one package.
#[derive(Debug, Clone, Copy)]
struct VoiceJob {
    pads: [u8; PADS],
    controls: [PadSample; PADS],
    tables: *const Tables,
}

// SAFETY: `tables` points into the `Pool`'s boxed `Tables`, which is immutable and outlives every
// worker (the pool joins its workers before dropping it); the rest is plain data.
unsafe impl Send for VoiceJob {}
// SAFETY: as above: shared reads of immutable tables.
unsafe impl Sync for VoiceJob {}

impl Job for VoiceJob {
    fn item(&self, claim: u32) -> usize {
        usize::from(self.pads[claim as usize])
    }
}

impl VoiceJob {
    fn compute(&self, pad: usize, voice: &mut Voice) {
        // SAFETY: see `unsafe impl Send for VoiceJob`: the tables outlive the job.
        let tables = unsafe { &*self.tables };
        voice.process(&self.controls[pad], tables);
    }
}

/// Called at the start of every worker thread, with the worker's number, before it spins:
/// pinning, scheduling policy, or marking the thread for a test's allocation counter.
pub type ThreadSetup = Arc<dyn Fn(usize) + Send + Sync>;

/// The voices and the workers that compute them.
pub struct Pool {
    comm: Comm<Voice, VoiceJob>,
    workers: Vec<JoinHandle<()>>,
    n: u32,
    // Boxed so that its address, shared with the workers through the job, never moves. Dropped
    // after the workers are joined (see `Drop`).
    _tables: Box<Tables>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("workers", &self.workers.len())
            .field("in_flight", &self.comm.in_flight())
            .finish()
    }
}

impl Pool {
    /// Takes the 32 voices and starts `workers` spinning threads (0: the caller computes every
    /// voice itself in [`Pool::run_inline`]). `setup` runs first on each worker.
    pub fn new(
        tables: Tables,
        voices: Vec<Voice>,
        workers: usize,
        setup: Option<ThreadSetup>,
    ) -> std::io::Result<Pool> {
        assert_eq!(
            voices.len(),
            PADS,
            "the pool takes exactly one voice per pad"
        );
        let tables = Box::new(tables);
        let job = VoiceJob {
            pads: [0; PADS],
            controls: [PadSample::default(); PADS],
            tables: &*tables,
        };
        let comm = dispatch::new(voices, job);
        let mut pool = Pool {
            comm,
            workers: Vec::with_capacity(workers),
            n: 0,
            _tables: tables,
        };
        for w in 0..workers {
            let mut worker = pool.comm.worker();
            let setup = setup.clone();
            let h = std::thread::Builder::new()
                .name(format!("migrator-w{w}"))
                .spawn(move || {
                    if let Some(s) = setup {
                        s(w);
                    }
                    worker.run(|job, pad, voice| job.compute(pad, voice));
                });
            match h {
                Ok(h) => pool.workers.push(h),
                // Dropping the pool stops and joins the workers already started.
                Err(e) => return Err(e),
            }
        }
        Ok(pool)
    }

    /// Number of worker threads.
    pub fn workers(&self) -> usize {
        self.workers.len()
    }

    /// Whether a package is being computed.
    pub fn in_flight(&self) -> bool {
        self.comm.in_flight()
    }

    /// Publishes a package: every voice whose pad is pressed (or still fading) will be computed
    /// with `controls`. Returns the number of voices. Must not be called while one is in flight.
    pub fn publish(&mut self, controls: &[PadSample; PADS]) -> u32 {
        let n = self.comm.prepare(|job, voices| {
            let mut n = 0;
            for (pad, ctl) in controls.iter().enumerate() {
                if voices.with(pad, |v| v.needs_processing(ctl)) {
                    job.pads[n] = pad as u8;
                    n += 1;
                }
            }
            job.controls = *controls;
            n as u32
        });
        self.comm.publish(n);
        self.n = n;
        n
    }

    /// Computes voices of the published package on the calling thread (claiming them like a
    /// worker): the whole package when there are no workers, or a share of it otherwise.
    pub fn run_inline(&self) -> u32 {
        self.comm.help(|job, pad, voice| job.compute(pad, voice))
    }

    /// Whether every voice of the published package is done.
    #[inline]
    pub fn is_done(&self) -> bool {
        self.comm.is_done()
    }

    /// Mixes the finished package into `out` and ends it. Call only once [`Pool::is_done`].
    pub fn finish(&mut self, out: &mut AudioBlock) {
        let n = self.n as usize;
        self.comm.finish(|job, voices| {
            Mixer::clear(out);
            for &pad in &job.pads[..n] {
                let pad = usize::from(pad);
                voices.with(pad, |v| Mixer::add(out, pad, v.output()));
            }
        });
    }

    /// Convenience for one thread: publish, compute inline, wait, mix.
    pub fn process(&mut self, controls: &[PadSample; PADS], out: &mut AudioBlock) -> u32 {
        let n = self.publish(controls);
        self.run_inline();
        while !self.is_done() {
            std::hint::spin_loop();
        }
        self.finish(out);
        n
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.comm.stop();
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slabs::{FRAMES_PER_PACKAGE, OUTPUT_CHANNELS};
    use crate::synth::{Engine, SynthParams};

    fn controls(pressed: usize) -> [PadSample; PADS] {
        let mut c = [PadSample::default(); PADS];
        for (p, s) in c.iter_mut().enumerate().take(pressed) {
            *s = PadSample {
                x: 0.2,
                y: (p % 4) as f32 / 4.0,
                pressure: 0.9,
            };
        }
        c
    }

    #[test]
    fn workers_produce_the_same_audio_as_one_thread() {
        let params = SynthParams::default();
        let mut single = Engine::new(&params);
        let (tables, voices) = Engine::new(&params).into_parts();
        let mut pool = Pool::new(tables, voices, 2, None).unwrap();
        let mut a = [[0.0; OUTPUT_CHANNELS]; FRAMES_PER_PACKAGE];
        let mut b = a;
        for k in 0..300 {
            let ctl = controls(if k < 150 { 20 } else { 7 });
            single.process(&ctl, &mut a);
            let n = pool.publish(&ctl);
            while !pool.is_done() {
                std::hint::spin_loop();
            }
            pool.finish(&mut b);
            assert!(n >= 7);
            assert_eq!(a, b, "package {k}");
        }
    }

    #[test]
    fn ticket_packs_and_stale_epochs_cannot_claim() {
        assert_eq!(dispatch::unpack(dispatch::ticket(7, 20, 3)), (7, 20, 3));
        let (tables, voices) = Engine::new(&SynthParams::default()).into_parts();
        let mut pool = Pool::new(tables, voices, 0, None).unwrap();
        let mut out = [[0.0; OUTPUT_CHANNELS]; FRAMES_PER_PACKAGE];
        assert_eq!(pool.process(&controls(5), &mut out), 5);
        let old = pool.comm.epoch();
        pool.publish(&controls(5));
        assert_eq!(pool.comm.claim_as(old), None);
        assert_eq!(pool.run_inline(), 5);
        assert!(pool.is_done());
        pool.finish(&mut out);
    }
}
