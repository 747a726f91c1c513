//! Adaptation: the cell grows or shrinks (seed 004 section 4.4).
//!
//! # Protocol
//!
//! 1. [`begin`] (in a cell: a hart that read tessd's `Adapt` at a checkpoint, `cell.rs`;
//!    standalone: [`crate::PulseHandle::resize`]) marks an adaptation in progress (a second
//!    `resize` meanwhile is refused with `AdaptInProgress`, never queued or hung; a second
//!    `Adapt` waits in the channel), bumps the epoch and kicks every hart with an immediate
//!    tick (`tgkill`), so a hart running a thread enters its scheduler context now instead of
//!    at its next tick.
//! 2. Each old hart reaches a *checkpoint* in its scheduler context: at the kicked tick (it
//!    hands over the preempted thread instead of calling `tick`), at a yield (the yielded
//!    thread), when a scheduler callback restores a thread (that thread), or when it is idle
//!    (nothing). The scheduler callback that was running finishes normally first: on Linux the
//!    hart's kernel thread is not taken away mid-callback, so the paper's *auxiliary
//!    cooperative scheduler*, which completes interrupted scheduler contexts on the remaining
//!    harts, is not needed; an interrupted scheduler simply completes on its own hart.
//! 3. vhart 0 waits until all old harts arrived, starts the kernel threads of new harts (they
//!    wait), calls `adapt(old_n, new_n, ctx[])` once with the threads that were running, then
//!    ends the adaptation. Retired harts (vhart >= new_n) exit; the rest resume with `enter`.
//!    In a cell vhart 0 then waits until the retired harts' kernel threads are gone and
//!    acknowledges tessd's `Adapt` before the adaptation counts as over (`cell.rs`).
//!
//! vhart ids stay stable because a hart's id is fixed for its kernel thread's life and
//! shrinking retires the highest ids.

use crate::clock::now_ns;
use crate::hart::HartState;
use crate::runtime::{PulseError, Shared, MAX_HARTS};
use crate::thread::{PulseCtx, PulseThread};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// The adaptation in progress, if any.
#[derive(Debug)]
pub(crate) struct AdaptState {
    in_progress: AtomicBool,
    epoch: AtomicU64,
    done_epoch: AtomicU64,
    old_n: AtomicUsize,
    new_n: AtomicUsize,
    arrived: AtomicUsize,
    started_ns: AtomicU64,
    running: [AtomicPtr<PulseThread>; MAX_HARTS],
    latencies: Mutex<Vec<u64>>,
}

impl AdaptState {
    pub(crate) fn new() -> AdaptState {
        AdaptState {
            in_progress: AtomicBool::new(false),
            epoch: AtomicU64::new(0),
            done_epoch: AtomicU64::new(0),
            old_n: AtomicUsize::new(0),
            new_n: AtomicUsize::new(0),
            arrived: AtomicUsize::new(0),
            started_ns: AtomicU64::new(0),
            running: std::array::from_fn(|_| AtomicPtr::new(std::ptr::null_mut())),
            latencies: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn in_progress(&self) -> bool {
        self.in_progress.load(Ordering::Acquire)
    }

    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Waits until adaptation `epoch` (if any) has finished, or `give_up()` says the run is
    /// over (every thread finished: vhart 0 may have exited without completing it).
    pub(crate) fn wait_done(&self, epoch: u64, give_up: impl Fn() -> bool, mut pause: Pause) {
        while self.done_epoch.load(Ordering::Acquire) < epoch && !give_up() {
            pause.pause();
        }
    }

    pub(crate) fn latencies(&self) -> Vec<u64> {
        self.latencies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// How a hart waits in the adaptation's loops. Standalone it yields the CPU
/// (`sched_yield`): harts may share a CPU, and the hart waited for may need it. In a reserved
/// cell every hart is a `SCHED_DEADLINE` thread on a CPU of its own, and a deadline thread that
/// yields gives up the rest of its budget until its next period: a shrink of a cell with a
/// 1 ms period then took 1-6 ms, one period per wait. There it spins, and yields only after
/// [`PAUSE_SPIN_NS`] (a hart tessd has not placed yet shares a CPU with the hart that started
/// it).
#[derive(Debug)]
pub(crate) struct Pause {
    spin_until_ns: u64,
}

/// How long a hart of a reserved cell spins in an adaptation's wait before it yields.
const PAUSE_SPIN_NS: u64 = 1_000_000;

impl Pause {
    pub(crate) fn new(shared: &Shared) -> Pause {
        let spins = shared.cell.as_ref().is_some_and(|c| c.reserved());
        Pause {
            spin_until_ns: if spins { now_ns() + PAUSE_SPIN_NS } else { 0 },
        }
    }

    fn pause(&mut self) {
        if self.spin_until_ns != 0 && now_ns() < self.spin_until_ns {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// Starts an adaptation to `new_n` harts (module docs, step 1).
pub(crate) fn begin(shared: &Shared, new_n: usize) -> Result<(), PulseError> {
    if new_n == 0 || new_n > MAX_HARTS {
        return Err(PulseError::Config(format!(
            "a cell needs 1..={MAX_HARTS} harts, not {new_n}"
        )));
    }
    let a = &shared.adapt;
    if a.in_progress
        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return Err(PulseError::AdaptInProgress {
            old: a.old_n.load(Ordering::Relaxed),
            new: a.new_n.load(Ordering::Relaxed),
        });
    }
    let old_n = shared.harts();
    if old_n == new_n {
        a.in_progress.store(false, Ordering::Release);
        return Ok(());
    }
    a.old_n.store(old_n, Ordering::Relaxed);
    a.new_n.store(new_n, Ordering::Relaxed);
    a.arrived.store(0, Ordering::Relaxed);
    a.started_ns.store(now_ns(), Ordering::Relaxed);
    a.epoch.fetch_add(1, Ordering::AcqRel);
    for v in 0..old_n {
        let h = shared.harts[v].load(Ordering::Acquire);
        if !h.is_null() {
            // SAFETY: a registered HartState is live for the runtime's life.
            crate::tick::kick(unsafe { &*h });
        }
    }
    shared.ring();
    Ok(())
}

impl Shared {
    /// A hart's checkpoint (module docs, steps 2 and 3). `running` is the thread this hart
    /// hands over (null for none). Returns on surviving harts once the adaptation is over;
    /// retired harts exit here.
    pub(crate) fn adapt_checkpoint(self: &Shared, h: &HartState, running: *mut PulseThread) {
        let a = &self.adapt;
        let epoch = a.epoch();
        if h.adapt_epoch_seen.swap(epoch, Ordering::AcqRel) == epoch {
            // Started by this adaptation, or already arrived: just wait for it to end.
            if !running.is_null() {
                self.make_runnable(running);
            }
            a.wait_done(epoch, || self.finished(), Pause::new(self));
            return;
        }
        let old_n = a.old_n.load(Ordering::Acquire);
        let new_n = a.new_n.load(Ordering::Acquire);
        a.running[h.vhart].store(running, Ordering::Release);
        a.arrived.fetch_add(1, Ordering::AcqRel);
        if h.vhart != 0 {
            a.wait_done(epoch, || self.finished(), Pause::new(self));
            if self.finished() {
                h.exit_to_base();
            }
            if h.vhart >= new_n {
                h.exit_to_base();
            }
            return;
        }
        let mut pause = Pause::new(self);
        while a.arrived.load(Ordering::Acquire) < old_n {
            if self.finished() {
                // The last thread ended meanwhile: harts exit instead of arriving.
                a.done_epoch.store(epoch, Ordering::Release);
                a.in_progress.store(false, Ordering::Release);
                h.exit_to_base();
            }
            pause.pause();
        }
        let mut spawn_err = None;
        for v in old_n..new_n {
            if let Some(shared) = self.arc_of() {
                if let Err(e) = shared.spawn_hart(v) {
                    spawn_err = Some(e);
                    break;
                }
            }
        }
        let effective_new = if spawn_err.is_some() {
            old_n.max(1)
        } else {
            new_n
        };
        if let Some(e) = spawn_err {
            eprintln!("tess-pulse: adaptation to {new_n} harts failed, keeping {old_n}: {e}");
        }
        let ctx: Vec<PulseCtx> = (0..old_n)
            .map(|v| {
                let t = a.running[v].swap(std::ptr::null_mut(), Ordering::AcqRel);
                // SAFETY: a handed-over thread is live and suspended; its ctx is current.
                let sp = unsafe { t.as_ref() }.map_or(std::ptr::null_mut(), |t| t.ctx.sp);
                PulseCtx { sp, thread: t }
            })
            .collect();
        // In a cell, the harts that retire (they wait for done_epoch, so their ids are still
        // registered): vhart 0 waits for them to be gone before acknowledging.
        let retired: Vec<(usize, i32)> = match self.cell {
            Some(_) => (effective_new..old_n)
                .map(|v| {
                    let r = self.harts[v].load(Ordering::Acquire);
                    // SAFETY: a registered HartState is live for the runtime's life.
                    let tid = unsafe { r.as_ref() }.map_or(0, |r| r.tid.load(Ordering::Acquire));
                    (v, tid)
                })
                .collect(),
            None => Vec::new(),
        };
        self.set_harts(effective_new);
        self.callbacks.adapt(h, old_n, effective_new, ctx);
        let took = now_ns().saturating_sub(a.started_ns.load(Ordering::Relaxed));
        a.latencies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(took);
        a.done_epoch.store(epoch, Ordering::Release);
        if let Some(cell) = &self.cell {
            cell.complete(self, &retired, effective_new);
        }
        a.in_progress.store(false, Ordering::Release);
        self.ring();
    }
}
