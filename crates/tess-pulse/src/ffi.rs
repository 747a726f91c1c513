//! The C ABI (`include/tess_pulse.h`, generated from this file by cbindgen): the paper's
//! names (seed 004 section 4.2, Listing 2). C programs link it from libtess, the one C library
//! of tess (crates/tess-ffi, docs/c-library.md).
//!
//! A C scheduler fills a `pulse_sched_t` with its callbacks, registers it with
//! `pulse_sched_reg`, creates its threads with `pulse_thread_alloc` + `pulse_ctx_make` and
//! queues them itself, then calls `pulse_run`, which starts the harts and returns when every
//! thread has finished. Callbacks run in the hart's scheduler context with ticks off; they end
//! by `pulse_ctx_restore_enable_ticks(ctx)` (does not return) or by returning (the hart waits
//! briefly and calls `enter` again). `pulse_sched_ctx_done()` is the paper's "give control to
//! Pulse" for a scheduler that loops while it has nothing to run.
//!
//! In a tess cell (`tess run --cell NAME -- ./prog`) `pulse_run` follows the cell: it attaches
//! to tessd, runs one hart per hart of the cell whatever `harts` says, and calls `adapt` when
//! `tess cell resize` changes the cell (`cell.rs`); `pulse_run_cell` names the cell, and
//! `pulse_cell` says which cell a run follows.

use crate::cell::CellMode;
use crate::hart::{self, HartState};
use crate::runtime::{Config, Pulse, PulseError};
use crate::sched::{Callbacks, PulseSchedC};
use crate::thread::{Entry, PulseCtx, PulseThread};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Success.
pub const PULSE_OK: c_int = 0;
/// A bad argument (NULL pointer, zero harts, nothing registered).
pub const PULSE_EINVAL: c_int = -1;
/// Out of memory (a stack could not be mapped).
pub const PULSE_ENOMEM: c_int = -2;
/// A hart, its timer or a signal handler could not be set up.
pub const PULSE_ESYS: c_int = -3;
/// An adaptation is already in progress.
pub const PULSE_EBUSY: c_int = -4;
/// In a cell: tessd could not be reached or refused to attach Pulse to the cell (the process
/// must run in it: `tess run --cell NAME`).
pub const PULSE_ECELL: c_int = -5;

/// A user-level thread. Opaque.
#[derive(Debug)]
pub struct PulseThreadC {
    _private: (),
}

/// A saved thread context. A copy (`pulse_ctx_copy`) may be resumed once in place of the
/// original.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PulseCtxC {
    /// Where the context resumes (opaque).
    pub sp: *mut c_void,
    /// The thread it belongs to.
    pub thread: *mut PulseThreadC,
}

/// A Pulse lock: zero-initialize it (or `pulse_lock_init`). From a thread it parks the
/// waiter with priority inheritance; from a scheduler callback it spins.
#[repr(C)]
#[derive(Debug)]
pub struct PulseLockC {
    /// Storage; do not touch.
    pub opaque: [u64; 4],
}

const _: () = assert!(std::mem::size_of::<PulseLockC>() == std::mem::size_of::<crate::RawLock>());
const _: () = assert!(std::mem::size_of::<PulseCtxC>() == std::mem::size_of::<PulseCtx>());

/// A scheduler's callbacks (`enter`, `tick`, `yield`, `done`, `adapt`, optional `wake`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PulseSchedT {
    /// Called when a hart has nothing to run (first on every hart).
    pub enter: Option<extern "C" fn()>,
    /// Called when the timer preempted the thread whose context is `ctx`.
    pub tick: Option<extern "C" fn(ctx: *mut PulseCtxC)>,
    /// Called when the thread whose context is `ctx` yielded.
    pub yield_: Option<extern "C" fn(ctx: *mut PulseCtxC)>,
    /// Called when the running thread returned; call `pulse_thread_free()` to free it.
    pub done: Option<extern "C" fn()>,
    /// Called once (on vhart 0) when the cell went from `old_n` to `new_n` harts; `ctx` has
    /// `old_n` entries, the threads that ran on the old harts (`thread` NULL: none).
    pub adapt: Option<extern "C" fn(old_n: usize, new_n: usize, ctx: *mut PulseCtxC)>,
    /// Optional: a new or blocked thread became runnable; queue it. Without it Pulse locks and
    /// sleeps wait by yielding.
    pub wake: Option<extern "C" fn(ctx: *mut PulseCtxC)>,
}

static REGISTERED: Mutex<Option<PulseSchedT>> = Mutex::new(None);
static PENDING_THREADS: AtomicUsize = AtomicUsize::new(0);

fn to_rust(s: PulseSchedT) -> PulseSchedC {
    // SAFETY: PulseSchedT and PulseSchedC are both repr(C) tables of six nullable function
    // pointers whose argument types (PulseCtxC, PulseCtx) have the same layout (asserted).
    unsafe { std::mem::transmute::<PulseSchedT, PulseSchedC>(s) }
}

/// Registers the scheduler's callbacks (copied). Returns PULSE_OK or PULSE_EINVAL (NULL).
///
/// # Safety
/// `sched` is NULL or points to a valid `pulse_sched_t`.
#[no_mangle]
pub unsafe extern "C" fn pulse_sched_reg(sched: *const PulseSchedT) -> c_int {
    // SAFETY: the caller passes a valid table or NULL.
    let Some(s) = (unsafe { sched.as_ref() }) else {
        return PULSE_EINVAL;
    };
    *REGISTERED.lock().unwrap_or_else(|p| p.into_inner()) = Some(*s);
    PULSE_OK
}

/// Starts `harts` harts with a tick every `tick_ns` nanoseconds (0: no ticks, a cooperative
/// cell) and runs the registered scheduler until every thread made with `pulse_ctx_make` has
/// finished. In a tess cell (the process runs in one) Pulse follows the cell instead: one hart
/// per hart of the cell (`harts` is ignored), `adapt` on every `tess cell resize`, and the run
/// also ends when the cell is deleted. Returns PULSE_OK, PULSE_EINVAL (nothing registered, bad
/// sizes), PULSE_ECELL (in a cell, tessd unreachable or refusing) or PULSE_ESYS.
#[no_mangle]
pub extern "C" fn pulse_run(harts: usize, tick_ns: u64) -> c_int {
    run_c(CellMode::Auto, harts, tick_ns)
}

/// Like `pulse_run`, in the tess cell `cell` (NULL: the cell the process runs in): as many
/// harts as the cell has, following its resizes. The process must run in the cell. Returns
/// PULSE_OK, PULSE_EINVAL (nothing registered, not in a cell and `cell` NULL), PULSE_ECELL
/// (tessd unreachable or refusing) or PULSE_ESYS.
///
/// # Safety
/// `cell` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn pulse_run_cell(cell: *const c_char, tick_ns: u64) -> c_int {
    let name = if cell.is_null() {
        match tess_proto::runtime::current_cell() {
            Some(n) => n,
            None => {
                eprintln!("tess-pulse: this process is not in a cell: start it with `tess run --cell NAME`");
                return PULSE_EINVAL;
            }
        }
    } else {
        // SAFETY: a NUL-terminated string (caller's contract).
        match unsafe { CStr::from_ptr(cell) }.to_str() {
            Ok(n) => n.to_string(),
            Err(_) => return PULSE_EINVAL,
        }
    };
    run_c(CellMode::Named(name), 1, tick_ns)
}

fn run_c(cell: CellMode, harts: usize, tick_ns: u64) -> c_int {
    let Some(s) = *REGISTERED.lock().unwrap_or_else(|p| p.into_inner()) else {
        return PULSE_EINVAL;
    };
    let config = Config {
        cell,
        harts,
        tick: (tick_ns > 0).then(|| Duration::from_nanos(tick_ns)),
        ..Config::default()
    };
    let mut p = match Pulse::with_callbacks(config, Callbacks::C(to_rust(s))) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("tess-pulse: {e}");
            return match e {
                PulseError::Attach(_) | PulseError::NoHarts { .. } => PULSE_ECELL,
                _ => PULSE_EINVAL,
            };
        }
    };
    for _ in 0..PENDING_THREADS.swap(0, Ordering::AcqRel) {
        p.push_initial_raw(std::ptr::null_mut());
    }
    match p.run() {
        Ok(_) => PULSE_OK,
        Err(e) => {
            eprintln!("tess-pulse: {e}");
            PULSE_ESYS
        }
    }
}

/// The name of the tess cell the running Pulse follows, or NULL (standalone, or outside
/// Pulse). Valid until `pulse_run` returns.
#[no_mangle]
pub extern "C" fn pulse_cell() -> *const c_char {
    hart::current()
        .and_then(|h: &HartState| h.shared().cell.as_ref())
        .map_or(std::ptr::null(), |c| c.c_name().as_ptr())
}

/// Allocates a thread with a stack of `stack_size` bytes (0: 256 KiB; at least 16 KiB), from
/// the stack pool when one is free (no system call). NULL if no memory.
#[no_mangle]
pub extern "C" fn pulse_thread_alloc(stack_size: usize) -> *mut PulseThreadC {
    let size = if stack_size == 0 {
        crate::DEFAULT_STACK
    } else {
        stack_size
    };
    crate::without_ticks(|| match PulseThread::alloc(size) {
        Ok(p) => p.as_ptr().cast(),
        Err(_) => std::ptr::null_mut(),
    })
}

/// Prepares `thread` to run `func(arg)` when first restored; returns its context (inside the
/// thread, valid until it is freed), or NULL if `thread` or `func` is NULL.
///
/// # Safety
/// `thread` is NULL or came from `pulse_thread_alloc` and is not running.
#[no_mangle]
pub unsafe extern "C" fn pulse_ctx_make(
    thread: *mut PulseThreadC,
    func: Option<extern "C" fn(arg: *mut c_void)>,
    arg: *mut c_void,
) -> *mut PulseCtxC {
    let (Some(f), false) = (func, thread.is_null()) else {
        return std::ptr::null_mut();
    };
    let t = thread.cast::<PulseThread>();
    // SAFETY: the caller passes a thread from pulse_thread_alloc that is not running.
    unsafe { (*t).make(Entry::C(f, arg)) };
    crate::without_ticks(|| match hart::current() {
        Some(h) => h.shared().thread_started(),
        None => {
            PENDING_THREADS.fetch_add(1, Ordering::AcqRel);
        }
    });
    // SAFETY: t is live.
    unsafe { std::ptr::addr_of_mut!((*t).ctx).cast() }
}

/// The context of `thread` (where Pulse saves it).
///
/// # Safety
/// `thread` is NULL or a live thread.
#[no_mangle]
pub unsafe extern "C" fn pulse_thread_ctx(thread: *mut PulseThreadC) -> *mut PulseCtxC {
    if thread.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: a live thread.
    unsafe { std::ptr::addr_of_mut!((*thread.cast::<PulseThread>()).ctx).cast() }
}

/// Copies a context.
///
/// # Safety
/// `dst` and `src` are NULL or point to contexts.
#[no_mangle]
pub unsafe extern "C" fn pulse_ctx_copy(dst: *mut PulseCtxC, src: *const PulseCtxC) {
    if !dst.is_null() && !src.is_null() {
        // SAFETY: both point to contexts (caller's contract).
        unsafe { *dst = *src };
    }
}

/// Switches this hart to `ctx` and turns ticks on. Called from a scheduler callback; does not
/// return.
///
/// # Safety
/// `ctx` points to a suspended context the caller owns; called from a scheduler callback.
#[no_mangle]
pub unsafe extern "C" fn pulse_ctx_restore_enable_ticks(ctx: *const PulseCtxC) {
    let Some(h) = hart::current() else {
        eprintln!("tess-pulse: pulse_ctx_restore_enable_ticks called outside a hart");
        std::process::abort();
    };
    // SAFETY: the caller passes a suspended context it owns, from a scheduler callback.
    let c = unsafe { *ctx.cast::<PulseCtx>() };
    if c.thread.is_null() || c.sp.is_null() {
        eprintln!("tess-pulse: pulse_ctx_restore_enable_ticks: empty context");
        std::process::abort();
    }
    // SAFETY: as above; we are in h's scheduler context.
    unsafe { h.restore(c) }
}

/// Gives control to Pulse from a scheduler with nothing to run: waits briefly for work, takes
/// part in an adaptation, releases sleepers; returns so the scheduler can look again (a
/// retired hart, or the end of the run, does not return).
#[no_mangle]
pub extern "C" fn pulse_sched_ctx_done() {
    if let Some(h) = hart::current() {
        hart::sched_ctx_done(h);
    }
}

/// Frees the thread that just finished on this hart (call it in `done`).
#[no_mangle]
pub extern "C" fn pulse_thread_free() {
    if let Some(h) = hart::current() {
        let t = h.finished.swap(std::ptr::null_mut(), Ordering::Relaxed);
        if !t.is_null() {
            // SAFETY: a finished thread is referenced from nowhere else.
            unsafe { PulseThread::free(t) };
        }
    }
}

/// The calling hart's virtual id (stable across adaptations), or -1 outside Pulse.
#[no_mangle]
pub extern "C" fn vhart_id() -> c_int {
    hart::vhart_id().map_or(-1, |v| v as c_int)
}

/// The number of harts now (0 outside Pulse).
#[no_mangle]
pub extern "C" fn pulse_harts() -> usize {
    hart::current().map_or(0, |h: &HartState| h.shared().harts())
}

/// The running thread gives up its hart (the scheduler's `yield` is called).
#[no_mangle]
pub extern "C" fn pulse_yield() {
    hart::yield_now();
}

/// Sleeps the calling thread `ns` nanoseconds without blocking its hart.
#[no_mangle]
pub extern "C" fn pulse_sleep_ns(ns: u64) {
    crate::sleep(Duration::from_nanos(ns));
}

/// Names `thread` for reports (stack overflow, panics); `name` is copied (31 bytes kept).
///
/// # Safety
/// `thread` is NULL or live; `name` is NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn pulse_thread_set_name(thread: *mut PulseThreadC, name: *const c_char) {
    if thread.is_null() || name.is_null() {
        return;
    }
    // SAFETY: a NUL-terminated string and a live thread (caller's contract).
    let n = unsafe { CStr::from_ptr(name) }.to_string_lossy();
    // SAFETY: as above.
    unsafe { (*thread.cast::<PulseThread>()).set_name(&n) };
}

/// Initializes a lock (same as zero-filling it).
///
/// # Safety
/// `lock` is NULL or points to writable memory for a `pulse_lock_t`.
#[no_mangle]
pub unsafe extern "C" fn pulse_lock_init(lock: *mut PulseLockC) {
    if !lock.is_null() {
        // SAFETY: the caller's memory, sized for a RawLock (asserted).
        unsafe { lock.cast::<crate::RawLock>().write(crate::RawLock::new()) };
    }
}

/// Acquires a lock.
///
/// # Safety
/// `lock` is NULL or an initialized lock.
#[no_mangle]
pub unsafe extern "C" fn pulse_lock_acquire(lock: *mut PulseLockC) {
    // SAFETY: an initialized lock (caller's contract).
    if let Some(l) = unsafe { lock.cast::<crate::RawLock>().as_ref() } {
        l.lock();
    }
}

/// Releases a lock held by the caller.
///
/// # Safety
/// `lock` is NULL or an initialized lock held by the caller.
#[no_mangle]
pub unsafe extern "C" fn pulse_lock_release(lock: *mut PulseLockC) {
    // SAFETY: an initialized lock (caller's contract).
    if let Some(l) = unsafe { lock.cast::<crate::RawLock>().as_ref() } {
        l.unlock();
    }
}

/// Names a PULSE_* code.
#[no_mangle]
pub extern "C" fn pulse_strerror(code: c_int) -> *const c_char {
    let s: &'static CStr = match code {
        PULSE_OK => c"ok",
        PULSE_EINVAL => c"invalid argument",
        PULSE_ENOMEM => c"out of memory",
        PULSE_ESYS => c"system error setting up a hart",
        PULSE_EBUSY => c"an adaptation is in progress",
        PULSE_ECELL => c"tessd could not be reached or refused to attach Pulse to the cell",
        _ => c"unknown error",
    };
    s.as_ptr()
}

/// Forgets threads made with `pulse_ctx_make` outside a run that were freed without running
/// (the benchmark's creations).
#[cfg(feature = "bench")]
pub(crate) fn forget_pending() {
    PENDING_THREADS.store(0, Ordering::Release);
}
