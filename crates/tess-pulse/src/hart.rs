//! A hart: one pinned kernel thread, its scheduler context, and the way in and out of it.
//!
//! # Contexts on a hart
//!
//! - the **base** context: the kernel thread's own stack, running [`hart_thread`]; left once at
//!   start and resumed when the hart exits;
//! - the **scheduler** context: a fresh activation at the top of the hart's scheduler stack for
//!   every scheduler entry (tick, yield, done, block, enter). Entering it never resumes an old
//!   one: `pulse_ctx_restore_enable_ticks` abandons the scheduler frame, exactly as in the paper
//!   (section 4.2), so a callback that restores a thread has nothing left to return to;
//! - **application** contexts: user-level threads, each on its own stack.
//!
//! TICKS_ENABLED (the first word of [`HartState`]) is set only by the switch into an
//! application context and cleared by the tick handler or by any Pulse call made from an
//! application thread, so scheduler code never runs with ticks on (Pulse does not support
//! re-entrant schedulers, section 4.3).

use crate::arch::{self, pulse_current_hart, pulse_resume, pulse_switch, pulse_ticks_off};
use crate::clock::now_ns;
use crate::runtime::Shared;
use crate::stack::{Stack, StackError};
use crate::thread::{PulseCtx, PulseThread, ThreadState};
use std::cell::UnsafeCell;
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, Ordering,
};

/// Why the scheduler context was entered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Reason {
    Enter = 0,
    Tick = 1,
    Yield = 2,
    Done = 3,
    Block = 4,
}

/// Tick-latency samples of one hart (written only by that hart).
pub(crate) const SAMPLES: usize = 1 << 14;

/// Per-hart state. `#[repr(C)]` because `arch.rs` addresses the first two words.
#[repr(C)]
pub(crate) struct HartState {
    /// TICKS_ENABLED (offset 0).
    pub(crate) ticks_enabled: AtomicU32,
    /// A tick arrived while ticks were off (offset 4).
    pub(crate) tick_pending: AtomicU32,
    /// The application thread running on this hart, or null.
    pub(crate) current: AtomicPtr<PulseThread>,
    pub(crate) vhart: usize,
    pub(crate) shared: *const Shared,
    sched_stack: Stack,
    base_sp: UnsafeCell<*mut u8>,
    discard_sp: UnsafeCell<*mut u8>,
    reason: AtomicU8,
    /// A spin word to release once the switch into the scheduler has saved the caller
    /// (blocking on a lock or sleeping: the waker must not resume an unsaved context).
    after_switch: AtomicPtr<AtomicU32>,
    /// The thread that just finished (freed by `pulse_thread_free` in `done`).
    pub(crate) finished: AtomicPtr<PulseThread>,
    /// The hart's tick count (+1) when the current scheduler activation started, 0 when none:
    /// the watchdog's clock (a tick count, not a clock read, to keep switches cheap).
    pub(crate) sched_since_tick: AtomicU64,
    pub(crate) watchdog_reported: AtomicBool,
    pub(crate) tid: AtomicI32,
    pub(crate) cpu: usize,
    pub(crate) timer: AtomicPtr<libc::c_void>,
    pub(crate) timer_armed: AtomicBool,
    /// The runtime's doorbell as it was before the scheduler last looked for work: an idle
    /// wait sleeps only if nothing rang since (a ring between the look and the wait would
    /// otherwise be lost, for up to a whole idle wait).
    pub(crate) doorbell_seen: std::sync::atomic::AtomicU32,
    pub(crate) period_ns: u64,
    pub(crate) next_expiry_ns: AtomicU64,
    /// The preempting tick in flight: its expiry, handler entry, trampoline entry (0 = none).
    pub(crate) tick_expiry_ns: AtomicU64,
    pub(crate) tick_handler_ns: AtomicU64,
    pub(crate) tick_tramp_ns: AtomicU64,
    pub(crate) stats: HartStats,
    /// Samples: (expiry -> handler, handler -> trampoline, trampoline -> application).
    pub(crate) samples: Box<[[AtomicU64; 3]]>,
    pub(crate) sample_count: AtomicU64,
    pub(crate) adapt_epoch_seen: AtomicU64,
    /// `stats.fired` when this hart last polled its cell's control channel (`cell.rs`).
    pub(crate) polled_at_tick: AtomicU64,
}

/// Tick counters of one hart.
#[derive(Debug, Default)]
pub(crate) struct HartStats {
    pub(crate) fired: AtomicU64,
    pub(crate) preempted: AtomicU64,
    pub(crate) masked: AtomicU64,
    pub(crate) deferred: AtomicU64,
    pub(crate) switches: AtomicU64,
}

// SAFETY: the UnsafeCell fields (saved stack pointers) are written only by the hart's own kernel
// thread while it switches; everything else is atomic or immutable after creation.
unsafe impl Sync for HartState {}
// SAFETY: as above; the raw pointers refer to Shared (kept alive by the runtime until every hart
// exited) and to threads owned by the protocol in thread.rs.
unsafe impl Send for HartState {}

impl std::fmt::Debug for HartState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HartState")
            .field("vhart", &self.vhart)
            .field("cpu", &self.cpu)
            .finish_non_exhaustive()
    }
}

/// [`HartState::cpu`] of a hart that is not pinned (in a cell, where tessd places harts).
pub(crate) const UNPINNED: usize = usize::MAX;

/// Scheduler stacks are small and fixed: callbacks should not recurse deeply.
const SCHED_STACK: usize = 256 * 1024;

impl HartState {
    pub(crate) fn new(
        shared: *const Shared,
        vhart: usize,
        cpu: usize,
        period_ns: u64,
    ) -> Result<Box<HartState>, StackError> {
        let samples = (0..SAMPLES)
            .map(|_| [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)])
            .collect();
        Ok(Box::new(HartState {
            ticks_enabled: AtomicU32::new(0),
            tick_pending: AtomicU32::new(0),
            current: AtomicPtr::new(std::ptr::null_mut()),
            vhart,
            shared,
            sched_stack: Stack::map(SCHED_STACK)?,
            base_sp: UnsafeCell::new(std::ptr::null_mut()),
            discard_sp: UnsafeCell::new(std::ptr::null_mut()),
            reason: AtomicU8::new(Reason::Enter as u8),
            after_switch: AtomicPtr::new(std::ptr::null_mut()),
            finished: AtomicPtr::new(std::ptr::null_mut()),
            sched_since_tick: AtomicU64::new(0),
            watchdog_reported: AtomicBool::new(false),
            tid: AtomicI32::new(0),
            cpu,
            timer: AtomicPtr::new(std::ptr::null_mut()),
            timer_armed: AtomicBool::new(false),
            doorbell_seen: std::sync::atomic::AtomicU32::new(0),
            period_ns,
            next_expiry_ns: AtomicU64::new(u64::MAX),
            tick_expiry_ns: AtomicU64::new(0),
            tick_handler_ns: AtomicU64::new(0),
            tick_tramp_ns: AtomicU64::new(0),
            stats: HartStats::default(),
            samples,
            sample_count: AtomicU64::new(0),
            adapt_epoch_seen: AtomicU64::new(0),
            polled_at_tick: AtomicU64::new(0),
        }))
    }

    pub(crate) fn shared(&self) -> &Shared {
        // SAFETY: Shared outlives every hart (runtime.rs joins the harts before dropping it).
        unsafe { &*self.shared }
    }

    fn reason(&self) -> Reason {
        match self.reason.load(Ordering::Relaxed) {
            1 => Reason::Tick,
            2 => Reason::Yield,
            3 => Reason::Done,
            4 => Reason::Block,
            _ => Reason::Enter,
        }
    }

    /// Starts the watchdog's count for a scheduler activation.
    fn mark_sched_start(&self) {
        self.sched_since_tick.store(
            self.stats.fired.load(Ordering::Relaxed) + 1,
            Ordering::Relaxed,
        );
    }

    /// The scheduler stack's guard page (for the overflow report).
    pub(crate) fn sched_guard(&self) -> std::ops::Range<usize> {
        self.sched_stack.guard_range()
    }

    /// Switches from the calling context into a fresh scheduler activation; the caller's state
    /// is saved in `*save`. Ticks must be off.
    ///
    /// # Safety
    /// Called on this hart's kernel thread with ticks off; `save` is where the caller's context
    /// may be resumed from (or a discard slot if it never will be).
    pub(crate) unsafe fn enter_scheduler(&self, reason: Reason, save: *mut *mut u8) {
        self.reason.store(reason as u8, Ordering::Relaxed);
        // SAFETY: the scheduler stack is this hart's and no activation on it is live: the
        // caller is an application or base context, never the scheduler itself (a scheduler
        // that needs to wait calls pulse_sched_ctx_done, which does not re-enter).
        let sp = unsafe {
            arch::make_context(
                self.sched_stack.top(),
                sched_main,
                self as *const _ as usize,
                0,
            )
        };
        // SAFETY: `save` is valid per the caller; `sp` is a fresh context; the flag is ours.
        unsafe { pulse_switch(save, sp, self.ticks_enabled.as_ptr(), 0) };
    }

    /// Resumes `ctx` with ticks on; the scheduler activation is abandoned.
    ///
    /// # Safety
    /// Called from this hart's scheduler context; `ctx` is a suspended context of a live
    /// thread that nobody else will resume.
    pub(crate) unsafe fn restore(&self, ctx: PulseCtx) -> ! {
        let shared = self.shared();
        if shared.adapt.in_progress()
            && self.adapt_epoch_seen.load(Ordering::Acquire) != shared.adapt.epoch()
        {
            // An adaptation is waiting for this hart: hand the thread over instead of running it.
            // SAFETY: ctx.thread is live and ours (caller's contract).
            unsafe { (*ctx.thread).ctx.sp = ctx.sp };
            shared.adapt_checkpoint(self, ctx.thread);
            // SAFETY: we are in this hart's scheduler context.
            unsafe { idle_loop(self) }
        }
        let t = ctx.thread;
        // SAFETY: t is live (caller's contract).
        unsafe {
            (*t).state
                .store(ThreadState::Runnable as u8, Ordering::Relaxed)
        };
        self.current.store(t, Ordering::Relaxed);
        self.tick_pending.store(0, Ordering::Relaxed);
        self.sched_since_tick.store(0, Ordering::Relaxed);
        // Only this hart writes its counters: a load and a store, no locked instruction.
        let n = self.stats.switches.load(Ordering::Relaxed);
        self.stats.switches.store(n + 1, Ordering::Relaxed);
        let handler = self.tick_handler_ns.load(Ordering::Relaxed);
        if handler != 0 {
            self.tick_handler_ns.store(0, Ordering::Relaxed);
            self.record_tick(handler);
        }
        // SAFETY: ctx.sp is a suspended context (caller's contract); this scheduler
        // activation is abandoned (the next scheduler entry makes a fresh one).
        unsafe { pulse_resume(ctx.sp, self.ticks_enabled.as_ptr(), 1) }
    }

    fn record_tick(&self, handler: u64) {
        let now = now_ns();
        let expiry = self.tick_expiry_ns.load(Ordering::Relaxed);
        let tramp = self.tick_tramp_ns.load(Ordering::Relaxed);
        if expiry == 0 || tramp < handler || now < tramp || handler < expiry {
            return;
        }
        let i = self.sample_count.fetch_add(1, Ordering::Relaxed) as usize % SAMPLES;
        self.samples[i][0].store(handler - expiry, Ordering::Relaxed);
        self.samples[i][1].store(tramp - handler, Ordering::Relaxed);
        self.samples[i][2].store(now - tramp, Ordering::Relaxed);
    }

    /// Leaves the scheduler context for the base context: the hart exits.
    pub(crate) fn exit_to_base(&self) -> ! {
        // SAFETY: base_sp was saved when the hart entered its first scheduler activation and
        // is resumed exactly once, here.
        unsafe { pulse_resume(*self.base_sp.get(), self.ticks_enabled.as_ptr(), 0) }
    }

    /// Releases `word` (a spin lock) once the next scheduler activation has started.
    pub(crate) fn release_after_switch(&self, word: &AtomicU32) {
        self.after_switch
            .store(word as *const _ as *mut _, Ordering::Relaxed);
    }

    /// Runs the base context's part: enters the scheduler; returns when the hart exits.
    pub(crate) fn run_from_base(&self) {
        // SAFETY: called on this hart's kernel thread (hart_thread) with ticks off.
        unsafe { self.enter_scheduler(Reason::Enter, self.base_sp.get()) };
    }
}

/// The hart of the calling kernel thread, if it is one.
pub(crate) fn current() -> Option<&'static HartState> {
    // SAFETY: the pointer is either null or a HartState that outlives its kernel thread's use
    // of it (runtime.rs keeps every HartState until all harts exited).
    unsafe { pulse_current_hart().as_ref() }
}

#[repr(C)]
pub(crate) struct SpPair(usize, usize);

/// Called by the preemption trampoline (ticks are off, registers saved): where to save the
/// preempted context, and a fresh scheduler activation to switch to.
pub(crate) extern "C" fn pulse_preempt_prepare() -> SpPair {
    // SAFETY: the trampoline runs only on a hart (the handler checked), ticks off.
    let h = unsafe { &*pulse_current_hart() };
    h.tick_tramp_ns.store(
        if h.tick_handler_ns.load(Ordering::Relaxed) != 0 {
            now_ns()
        } else {
            0
        },
        Ordering::Relaxed,
    );
    h.reason.store(Reason::Tick as u8, Ordering::Relaxed);
    let cur = h.current.load(Ordering::Relaxed);
    let save = if cur.is_null() {
        h.discard_sp.get() as usize
    } else {
        // SAFETY: cur is the running thread on this hart.
        unsafe { std::ptr::addr_of_mut!((*cur).ctx.sp) as usize }
    };
    // SAFETY: no scheduler activation is live on this hart (ticks were on, so the hart was in
    // an application context).
    let sp =
        unsafe { arch::make_context(h.sched_stack.top(), sched_main, h as *const _ as usize, 0) };
    SpPair(save, sp as usize)
}

/// First code of every scheduler activation.
unsafe extern "C" fn sched_main(hart: usize, _: usize) -> ! {
    // SAFETY: enter_scheduler passes its own HartState.
    let h = unsafe { &*(hart as *const HartState) };
    let word = h.after_switch.load(Ordering::Relaxed);
    if !word.is_null() {
        h.after_switch
            .store(std::ptr::null_mut(), Ordering::Relaxed);
        // SAFETY: release_after_switch stored a spin word that lives in a lock or list that
        // outlives the blocked thread.
        unsafe { (*word).store(0, Ordering::Release) };
    }
    h.mark_sched_start();
    let shared = h.shared();
    shared.note_doorbell(h);
    let reason = h.reason();
    let cur = h.current.load(Ordering::Relaxed);
    h.current.store(std::ptr::null_mut(), Ordering::Relaxed);
    if let Some(cell) = &shared.cell {
        if shared.abandoned() {
            h.exit_to_base();
        }
        // A checkpoint: the first scheduler entry after the hart's timer fired (the tick
        // itself, or the yield a tick that came with ticks off turned into); without ticks,
        // every entry (cell.rs rate-limits).
        let fired = h.stats.fired.load(Ordering::Relaxed);
        if fired != h.polled_at_tick.load(Ordering::Relaxed) || h.period_ns == 0 {
            h.polled_at_tick.store(fired, Ordering::Relaxed);
            cell.poll(shared);
        }
    }
    if shared.has_sleepers() {
        shared.release_sleepers(Some(h));
    }
    if shared.adapt.in_progress() {
        let ctx = match reason {
            Reason::Tick | Reason::Yield => cur,
            _ => std::ptr::null_mut(),
        };
        shared.adapt_checkpoint(h, ctx);
    } else {
        let cb = &shared.callbacks;
        match reason {
            Reason::Enter | Reason::Block => cb.enter(h),
            Reason::Tick if !cur.is_null() => cb.tick(h, cur),
            Reason::Yield if !cur.is_null() => cb.r#yield(h, cur),
            Reason::Done => cb.done(h),
            _ => cb.enter(h),
        }
    }
    // SAFETY: we are in h's scheduler context.
    unsafe { idle_loop(h) }
}

/// The scheduler returned without a thread to run: wait for work and ask again.
///
/// # Safety
/// Runs in `h`'s scheduler context.
unsafe fn idle_loop(h: &HartState) -> ! {
    loop {
        sched_ctx_done(h);
        h.shared().note_doorbell(h);
        h.shared().callbacks.enter(h);
    }
}

/// `pulse_sched_ctx_done`: the scheduler has nothing to run now. Pulse exits the hart if all
/// threads finished or the hart retires, takes part in a pending adaptation, releases sleepers
/// whose time came, and waits briefly for work. Returns to let the scheduler look again.
pub(crate) fn sched_ctx_done(h: &HartState) {
    let shared = h.shared();
    h.sched_since_tick.store(0, Ordering::Relaxed);
    if shared.finished() {
        h.exit_to_base();
    }
    if let Some(cell) = &shared.cell {
        cell.poll(shared);
    }
    if shared.adapt.in_progress() {
        shared.adapt_checkpoint(h, std::ptr::null_mut());
    }
    if shared.release_sleepers(Some(h)) == 0 {
        shared.idle_wait(h);
        shared.release_sleepers(Some(h));
    }
    h.mark_sched_start();
}

/// Ends the running thread (its function returned).
pub(crate) fn exit_current() -> ! {
    // SAFETY: called on a hart by the running thread.
    let h = unsafe { &*pulse_ticks_off() };
    let cur = h.current.swap(std::ptr::null_mut(), Ordering::Relaxed);
    if !cur.is_null() {
        // SAFETY: cur is this thread, still live.
        unsafe {
            (*cur)
                .state
                .store(ThreadState::Done as u8, Ordering::Release)
        };
        h.finished.store(cur, Ordering::Relaxed);
    }
    h.shared().thread_finished();
    // SAFETY: ticks are off; the finished thread is never resumed, so its context is
    // discarded.
    unsafe { h.enter_scheduler(Reason::Done, h.discard_sp.get()) };
    unreachable!("a finished thread is never resumed")
}

/// Suspends the running thread and enters the scheduler with `reason`. Returns when the
/// thread is resumed (ticks on). With `release`, that spin word is released after the switch.
///
/// # Safety
/// Called by an application thread on a hart with ticks already off (`pulse_ticks_off`).
pub(crate) unsafe fn suspend_current(h: &HartState, reason: Reason, release: Option<&AtomicU32>) {
    let cur = h.current.load(Ordering::Relaxed);
    if let Some(w) = release {
        h.release_after_switch(w);
    }
    if cur.is_null() {
        return;
    }
    // SAFETY: cur is the running thread; its ctx slot is where it resumes from.
    unsafe { h.enter_scheduler(reason, std::ptr::addr_of_mut!((*cur).ctx.sp)) };
}

/// The running thread gives up its hart (`yield`). Outside a Pulse thread it does nothing.
pub fn yield_now() {
    // SAFETY: pulse_ticks_off only touches the calling kernel thread's hart.
    let h = unsafe { pulse_ticks_off() };
    // SAFETY: non-null means we are a Pulse thread on that hart, with ticks now off.
    if let Some(h) = unsafe { h.as_ref() } {
        // SAFETY: ticks are off, we are the running thread.
        unsafe { suspend_current(h, Reason::Yield, None) };
    }
}

/// Turns ticks back on after a Pulse call from a thread, delivering a tick that came
/// meanwhile as a yield.
pub(crate) fn ticks_on() {
    // SAFETY: only touches the calling kernel thread's hart.
    if unsafe { arch::pulse_ticks_on() } != 0 {
        yield_now();
    }
}

/// The virtual hart id of the caller (stable across adaptations), or `None` off a hart.
pub fn vhart_id() -> Option<usize> {
    current().map(|h| h.vhart)
}

/// The thread running on the caller's hart, if the caller is a Pulse thread.
pub(crate) fn current_thread() -> *mut PulseThread {
    current().map_or(std::ptr::null_mut(), |h| h.current.load(Ordering::Relaxed))
}
