//! The scheduler interface: the paper's five callbacks (seed 004 section 4.2) as a safe Rust
//! trait, and the dispatch that serves both it and the C table (`ffi.rs`).
//!
//! | Pulse (paper, C)          | Rust [`Scheduler`]            | called when                        |
//! |---------------------------|-------------------------------|------------------------------------|
//! | `enter()`                 | `enter(hart)`                 | a hart has nothing to run          |
//! | `tick(ctx)`               | `tick(hart, current)`         | the hart's timer preempted `current` |
//! | `yield(ctx)`              | `yield(hart, current)`        | `current` called [`crate::yield_now`] |
//! | `done()`                  | `done(hart)`                  | the running thread returned        |
//! | `adapt(old_n, new_n, ctx[])` | `adapt(old_n, new_n, running)` | the cell changed size (once)  |
//! | (Pulse extension) `wake(ctx)` | `wake(thread)`            | a thread became runnable: spawned, |
//! |                           |                               | lock handed over, sleep over       |
//!
//! A callback returns the thread the hart runs next (C: calls
//! `pulse_ctx_restore_enable_ticks`, which does not return), or nothing: the hart then waits
//! briefly (`pulse_sched_ctx_done`) and calls `enter` again.
//!
//! Callbacks run in the hart's scheduler context with ticks off, concurrently on different
//! harts. They must not block in the kernel for long (the hart runs nothing meanwhile); locks
//! shared between harts should be Pulse locks or short spin locks ([`crate::SpinLock`]).

use crate::fault;
use crate::hart::HartState;
use crate::thread::{PulseCtx, PulseThread, Thread};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;

/// What a scheduler callback sees of its hart.
#[derive(Debug, Clone, Copy)]
pub struct Hart<'a> {
    state: &'a HartState,
}

impl Hart<'_> {
    /// The virtual hart id: `0..harts()`, stable across adaptations (`vhart_id()`).
    pub fn vhart_id(&self) -> usize {
        self.state.vhart
    }

    /// Harts the cell has now.
    pub fn harts(&self) -> usize {
        self.state.shared().harts()
    }

    /// The physical CPU this hart is pinned to (standalone), or runs on now (in a cell, where
    /// tessd places the harts).
    pub fn cpu(&self) -> usize {
        if self.state.cpu != crate::hart::UNPINNED {
            return self.state.cpu;
        }
        // SAFETY: sched_getcpu has no preconditions.
        let c = unsafe { libc::sched_getcpu() };
        usize::try_from(c).unwrap_or(0)
    }

    /// The tick period, ns.
    pub fn tick_ns(&self) -> u64 {
        self.state.period_ns
    }
}

/// An application scheduler (module docs).
pub trait Scheduler: Send + Sync + 'static {
    /// A hart has nothing to run: return the next thread, or `None` to idle briefly.
    fn enter(&self, hart: &Hart<'_>) -> Option<Thread>;

    /// The timer preempted `current`: return the thread to run (possibly `current`).
    fn tick(&self, hart: &Hart<'_>, current: Thread) -> Option<Thread>;

    /// `current` yielded: return the next thread.
    fn r#yield(&self, hart: &Hart<'_>, current: Thread) -> Option<Thread>;

    /// The running thread finished (Pulse has freed it): return the next thread.
    fn done(&self, hart: &Hart<'_>) -> Option<Thread> {
        self.enter(hart)
    }

    /// The cell went from `old_n` to `new_n` harts; `running` holds the threads that were
    /// running on the old harts (at most `old_n`). Called once, on vhart 0, before any hart
    /// runs an application thread again.
    fn adapt(&self, old_n: usize, new_n: usize, running: Vec<Thread>);

    /// `thread` became runnable (new, given a lock, or done sleeping). Called from any
    /// context with ticks off. Return true if the caller should yield so that `thread` can run
    /// now (EDF: it has an earlier deadline than the caller).
    fn wake(&self, thread: Thread) -> bool;
}

/// The C callback table (`pulse_sched_t`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PulseSchedC {
    /// `enter()`.
    pub enter: Option<extern "C" fn()>,
    /// `tick(ctx)`: ctx is the preempted thread's context.
    pub tick: Option<extern "C" fn(ctx: *mut PulseCtx)>,
    /// `yield(ctx)`.
    pub yield_: Option<extern "C" fn(ctx: *mut PulseCtx)>,
    /// `done()`.
    pub done: Option<extern "C" fn()>,
    /// `adapt(old_n, new_n, ctx[])`: `ctx` has `old_n` entries; an entry whose `thread` is NULL
    /// means that hart ran nothing.
    pub adapt: Option<extern "C" fn(old_n: usize, new_n: usize, ctx: *mut PulseCtx)>,
    /// Optional `wake(ctx)`: a blocked or new thread became runnable. Without it, Pulse locks
    /// and sleeps wait by yielding.
    pub wake: Option<extern "C" fn(ctx: *mut PulseCtx)>,
}

pub(crate) enum Callbacks {
    Rust(Box<dyn Scheduler>),
    C(PulseSchedC),
}

impl std::fmt::Debug for Callbacks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Callbacks::Rust(_) => "Callbacks::Rust",
            Callbacks::C(_) => "Callbacks::C",
        })
    }
}

/// Runs a Rust callback; a panic is reported with the callback's name and the hart, then the
/// process aborts (a scheduler in an unknown state cannot be resumed safely).
fn guarded<R>(name: &str, h: &HartState, f: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => fault::scheduler_panicked(name, h.vhart, &p),
    }
}

fn run(h: &HartState, next: Option<Thread>) {
    if let Some(t) = next {
        let p = t.into_raw();
        // SAFETY: the scheduler gave up ownership of a runnable thread; its ctx is current.
        unsafe { h.restore((*p).ctx) }
    }
}

impl Callbacks {
    pub(crate) fn enter(&self, h: &HartState) {
        match self {
            Callbacks::Rust(s) => {
                let next = guarded("enter", h, || s.enter(&Hart { state: h }));
                run(h, next);
            }
            Callbacks::C(c) => {
                if let Some(f) = c.enter {
                    f()
                }
            }
        }
    }

    pub(crate) fn tick(&self, h: &HartState, cur: *mut PulseThread) {
        match self {
            Callbacks::Rust(s) => {
                // SAFETY: cur was running on this hart and was just suspended; Pulse owned it.
                let t = unsafe { Thread::from_raw(cur) };
                let next = guarded("tick", h, || s.tick(&Hart { state: h }, t));
                run(h, next);
            }
            Callbacks::C(c) => match c.tick {
                // SAFETY: cur is live; its ctx is where Pulse saved it.
                Some(f) => f(unsafe { std::ptr::addr_of_mut!((*cur).ctx) }),
                // Without a tick callback the preempted thread simply continues.
                // SAFETY: cur is live and suspended.
                None => unsafe { h.restore((*cur).ctx) },
            },
        }
    }

    pub(crate) fn r#yield(&self, h: &HartState, cur: *mut PulseThread) {
        match self {
            Callbacks::Rust(s) => {
                // SAFETY: as in tick.
                let t = unsafe { Thread::from_raw(cur) };
                let next = guarded("yield", h, || s.r#yield(&Hart { state: h }, t));
                run(h, next);
            }
            Callbacks::C(c) => match c.yield_ {
                // SAFETY: cur is live.
                Some(f) => f(unsafe { std::ptr::addr_of_mut!((*cur).ctx) }),
                // SAFETY: cur is live and suspended.
                None => unsafe { h.restore((*cur).ctx) },
            },
        }
    }

    pub(crate) fn done(&self, h: &HartState) {
        match self {
            Callbacks::Rust(s) => {
                let fin = h.finished.swap(std::ptr::null_mut(), Ordering::Relaxed);
                if !fin.is_null() {
                    // SAFETY: a finished thread is referenced from nowhere else.
                    unsafe { PulseThread::free(fin) };
                }
                let next = guarded("done", h, || s.done(&Hart { state: h }));
                run(h, next);
            }
            Callbacks::C(c) => match c.done {
                Some(f) => f(),
                None => self.enter(h),
            },
        }
    }

    pub(crate) fn adapt(&self, h: &HartState, old_n: usize, new_n: usize, ctx: Vec<PulseCtx>) {
        match self {
            Callbacks::Rust(s) => {
                let running = ctx
                    .into_iter()
                    .filter(|c| !c.thread.is_null())
                    // SAFETY: each context's thread was suspended by the adaptation and is
                    // owned by nobody else.
                    .map(|c| unsafe { Thread::from_raw(c.thread) })
                    .collect();
                guarded("adapt", h, || s.adapt(old_n, new_n, running));
            }
            Callbacks::C(c) => {
                let mut ctx = ctx;
                if let Some(f) = c.adapt {
                    f(old_n, new_n, ctx.as_mut_ptr());
                }
            }
        }
    }

    /// Whether blocked threads can be handed back (`wake`); else locks and sleeps spin by
    /// yielding.
    pub(crate) fn wakes(&self) -> bool {
        match self {
            Callbacks::Rust(_) => true,
            Callbacks::C(c) => c.wake.is_some(),
        }
    }

    /// Gives a runnable thread to the scheduler. Ticks must be off.
    pub(crate) fn wake(&self, t: *mut PulseThread) -> bool {
        match self {
            Callbacks::Rust(s) => {
                // SAFETY: the caller hands over a runnable thread nobody else owns.
                let t = unsafe { Thread::from_raw(t) };
                match catch_unwind(AssertUnwindSafe(|| s.wake(t))) {
                    Ok(b) => b,
                    Err(p) => fault::scheduler_panicked(
                        "wake",
                        crate::hart::vhart_id().unwrap_or(usize::MAX),
                        &p,
                    ),
                }
            }
            Callbacks::C(c) => {
                if let Some(f) = c.wake {
                    // SAFETY: t is live.
                    f(unsafe { std::ptr::addr_of_mut!((*t).ctx) });
                }
                false
            }
        }
    }
}
