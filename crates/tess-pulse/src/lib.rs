//! Pulse: preemptive user-level scheduling inside a cell (seed 004 section 4, issue 13).
//!
//! Tessellation schedules in two levels: the kernel gives a cell harts, and a scheduler inside
//! the cell, written by the application, decides what each hart runs. Pulse is the framework
//! for that second level: an application scheduler is five callbacks (`enter`, `tick`,
//! `yield`, `done`, `adapt`) and Pulse does the rest: user-level threads with their own stacks,
//! the context switch, the timer tick that preempts a thread, adaptation when the cell grows
//! or shrinks, and locks and sleeps that do not block a hart.
//!
//! # Glossary
//!
//! - **hart**: one kernel thread on one CPU of the cell ([`hart`](crate::vhart_id)): pinned
//!   by Pulse standalone, placed by tessd in a cell. Its **vhart id** `0..n` never changes for
//!   its life (section 4.4).
//! - **thread**: a user-level thread ([`Thread`], C `pulse_thread_t`): a stack with a guard
//!   page and a saved context ([`PulseCtx`], C `pulse_ctx_t`).
//! - **scheduler context**: where callbacks run; a fresh activation on the hart's scheduler
//!   stack per entry, with ticks off.
//! - **TICKS_ENABLED**: a per-hart word; the timer preempts only while it is set, and only the
//!   switch into a thread sets it (`pulse_ctx_restore_enable_ticks`).
//! - **tick**: the per-hart timer (`timer_create` + `SIGEV_THREAD_ID`), 1 ms by default.
//!
//! # Modules, concept to mechanism
//!
//! | concept | module | Linux / machine mechanism |
//! |---|---|---|
//! | thread stacks | `stack` | `mmap` + `PROT_NONE` guard page, a pool (no syscall on reuse) |
//! | context switch | `arch` | hand-written x86_64 assembly, callee-saved registers only |
//! | preemption | `tick`, `arch` | POSIX timer per hart, RT signal, `ucontext` redirect, `xsave` |
//! | scheduler callbacks | `sched`, `hart` | a scheduler stack per hart |
//! | adaptation | `adapt` | `tgkill` kicks, new kernel threads, retired ones exit |
//! | following the cell | `cell` | tessd's control channel (`tess_proto::runtime`) polled at checkpoints |
//! | locks, sleep | `lock`, `runtime` | parking in user space, futex doorbell for idle harts |
//! | overflow, hangs | `fault` | `sigaltstack` + SIGSEGV handler, a watchdog in the tick |
//! | schedulers | `grr`, `edf` | — |
//!
//! # Using it
//!
//! ```no_run
//! use tess_pulse::{Config, Grr, Pulse};
//! let mut pulse = Pulse::new(Config { harts: 2, ..Config::default() }, Grr::default())?;
//! for i in 0..4 {
//!     pulse.spawn(move || {
//!         let mut x = 0u64;
//!         for k in 0..100_000_000u64 { x = x.wrapping_add(k ^ i); } // preempted every 1 ms
//!         std::hint::black_box(x);
//!     })?;
//! }
//! let stats = pulse.run()?;
//! println!("{} preemptions", stats.preempted);
//! # Ok::<(), tess_pulse::PulseError>(())
//! ```
//!
//! C programs use `include/tess_pulse.h` (the paper's names; `examples/pulse_rr.c` is
//! Listing 2) and link libtess, the one C library of tess (docs/c-library.md).
//!
//! # In a cell
//!
//! Started in a tess cell (`tess run --cell NAME`), the same program follows the cell
//! ([`Config::cell`], [`CellMode`]): Pulse attaches to tessd, runs one hart per hart of the
//! cell (the calling thread is vhart 0), calls `adapt` when `tess cell resize` changes the cell,
//! and `run` returns when the cell is deleted. `src/bin/pulse-cell.rs` is such a program; the
//! protocol is in `cell.rs`.
//!
//! # Rules for code running in Pulse threads
//!
//! - Thread-local storage belongs to the *hart*, not to the Pulse thread: a thread may resume on
//!   another hart after any tick.
//! - Block on [`PulseMutex`] / `pulse_lock_t`, [`sleep`], [`wait_fd`], not on kernel-blocking
//!   calls: a raw blocking call (a `std::sync::Mutex` held by a preempted thread, `read` on an
//!   empty pipe, `std::thread::sleep`) blocks the whole hart until it returns. It is correct
//!   but wastes the hart; with one hart and a lock held by a preempted thread it deadlocks.
//! - Code in the C library is never preempted (a tick that lands there is retried 20 us
//!   later), so `malloc`, `printf` and friends are safe. Rust's own `println!` lock is not in
//!   the C library: wrap output in [`without_ticks`].
#![warn(missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod adapt;
mod arch;
#[cfg(feature = "bench")]
pub mod bench;
mod cell;
pub mod clock;
pub mod edf;
mod fault;
pub mod ffi;
pub mod grr;
mod hart;
mod io;
mod lock;
mod runtime;
mod sched;
mod stack;
mod thread;
mod thread_api;
mod tick;

pub use cell::CellMode;
pub use edf::Edf;
pub use grr::Grr;
pub use hart::{vhart_id, yield_now};
pub use io::{wait_fd, wait_until};
pub use lock::{PulseMutex, PulseMutexGuard, RawLock, SpinGuard, SpinLock};
pub use runtime::{
    sleep, sleep_until_ns, spawn, Config, Pulse, PulseError, PulseHandle, TickStats, MAX_HARTS,
};
pub use sched::{Hart, PulseSchedC, Scheduler};
pub use stack::{StackError, DEFAULT_STACK, MIN_STACK};
pub use thread::{PulseCtx, PulseThread, Thread, ThreadState, NO_DEADLINE};
pub use thread_api::ThreadOptions;
pub use tick::tick_signal;

/// Runs `f` with ticks off on this hart: the calling Pulse thread is not preempted inside it
/// (keep it short). Outside Pulse it just runs `f`.
pub fn without_ticks<R>(f: impl FnOnce() -> R) -> R {
    // SAFETY: only touches this kernel thread's hart.
    let on_hart = !unsafe { arch::pulse_ticks_off() }.is_null();
    let r = f();
    if on_hart {
        hart::ticks_on();
    }
    r
}
