//! The cell runtime (issue 4): harts, gang-scheduled windows and adaptation, after Pulse
//! (J. A. Colmenares et al., "Tessellation: Refactoring the OS around Explicit Resource
//! Containers with Continuous Adaptation", DAC 2013, seed 004, sections 3.1-3.3 and 4) and
//! Lithe's harts (seed 001 section 4.3).
//!
//! # Glossary
//!
//! - **hart**: a hardware thread the cell owns (or holds a reservation on). Software inside a
//!   cell does not ask the kernel for threads; it is handed harts. The runtime runs exactly one
//!   kernel thread per hart, placed and made a `SCHED_DEADLINE` thread by tessd.
//! - **vhart id**: the hart's virtual id `0..n` ([`vhart_id`], [`Hart::vhart_id`]), stable for
//!   the life of its thread however tessd renumbers or moves the physical harts (Pulse section
//!   4.4). The thread that calls [`Runtime::run`] becomes vhart 0.
//! - **window**: a time-triggered cell is active on all its harts during `[k*P + O, k*P + O + A)`
//!   on the `CLOCK_MONOTONIC` grid; the runtime starts every hart's work at the same instant in
//!   it and gives all harts back together at its end ([`window`]: the design and why).
//! - **scheduler**: Pulse's five callbacks `enter`, `tick`, `yield`, `done`, `adapt`
//!   ([`Scheduler`]); the application's contexts are [`Task`]s run in slices. Built in:
//!   [`PerWindow`] and a global [`WorkQueue`] (round-robin or EDF).
//! - **adaptation**: tessd grows or shrinks the cell (`tess cell resize`); the runtime retires
//!   its highest vharts (their threads exit, their unfinished tasks go to `adapt`) or starts
//!   new ones, and calls `adapt(old_n, new_n, orphans)` exactly once (`roster` for the
//!   handshake, [`control`] for the channel from tessd).
//!
//! # Using it
//!
//! ```no_run
//! use tess_runtime::{PerWindow, Runtime};
//! // Run with `tess run --cell gang -- ./program` in a time-triggered cell.
//! let work = PerWindow::new(|hart| {
//!     let w = hart.window().expect("time-triggered cell");
//!     println!("vhart {} on hart {} entered window {}", hart.vhart_id(), hart.cpu(), w.index);
//! })
//! .on_adapt(|old, new| println!("adapt({old}, {new})"));
//! Runtime::builder().build(work)?.run()?;
//! # Ok::<(), tess_runtime::RuntimeError>(())
//! ```
//!
//! A C program uses the same runtime through `include/tess_runtime.h` ([`ffi`]), linked from
//! libtess, the one C library of tess (docs/c-library.md).
//!
//! # Differences from Pulse on Linux
//!
//! Pulse's kernel delivers timer ticks and adaptation events to user level and hands back the
//! interrupted contexts. Linux does not, so tasks are cooperative: the runtime regains a hart
//! only between task slices ([`Step`]), and the `tick` callback runs at window starts. The
//! kernel still enforces each hart's budget (`SCHED_DEADLINE`), so a task that overruns its
//! window is throttled, not allowed to steal another cell's time.
#![warn(missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks)]
#![cfg_attr(loom, allow(dead_code, unused_imports))]

#[cfg(all(feature = "bench", not(loom)))]
pub mod bench;
#[cfg(not(loom))]
pub mod control;
#[cfg(not(loom))]
pub mod ffi;
#[cfg(not(loom))]
mod hart;
mod roster;
#[cfg(not(loom))]
mod runtime;
#[cfg(not(loom))]
pub mod sched;
mod sync;
#[cfg(not(loom))]
mod task;
#[cfg(not(loom))]
pub mod window;

#[cfg(not(loom))]
pub use control::{current_cell, join_cell, AttachError};
#[cfg(not(loom))]
pub use hart::{vhart_id, Hart};
#[cfg(not(loom))]
pub use runtime::{Builder, Handle, Runtime, RuntimeError, Stats, Timing};
#[cfg(not(loom))]
pub use sched::{PerWindow, QueuePolicy, Scheduler, WorkQueue};
#[cfg(not(loom))]
pub use task::{Step, Task};
#[cfg(not(loom))]
pub use window::{Tuning, WindowInfo, WindowSpec};
