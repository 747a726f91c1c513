//! Application heartbeats for the tess Resource Allocation Broker (seed 004 section 5.1).
//!
//! A cell declares a performance target (a time per unit of work, e.g. 33.3 ms per frame, or a
//! rate) and beats once per unit of work, optionally with a measured value; the broker
//! (`tess-broker`) reads the beats and moves resources so that the target holds with as little
//! reserved as possible. A beat is a write to shared memory: no system call, no lock.
//!
//! ```no_run
//! use tess_heartbeat::{Heartbeat, Target};
//! let hb = Heartbeat::register("encoder", Some(Target::Rate(30.0)))?;
//! for _frame in 0..100 {
//!     // ... encode a frame ...
//!     hb.beat();
//! }
//! # Ok::<(), tess_heartbeat::HeartbeatError>(())
//! ```
//!
//! The layout and the seqlock are in [`layout`], the cell's side in [`writer`], the broker's in
//! [`reader`], the hand-over in [`register`]; C programs use `tess_heartbeat.h` ([`ffi`]).
#![deny(unsafe_op_in_unsafe_fn)]

pub mod layout;
mod sync;

#[cfg(not(loom))]
pub mod clock;
#[cfg(not(loom))]
mod error;
#[cfg(not(loom))]
pub mod ffi;
#[cfg(not(loom))]
pub mod reader;
#[cfg(not(loom))]
mod region;
#[cfg(not(loom))]
pub mod register;
#[cfg(not(loom))]
pub mod writer;

#[cfg(loom)]
mod loom_tests;
#[cfg(all(test, not(loom)))]
mod tests;

#[cfg(not(loom))]
pub use error::HeartbeatError;
pub use layout::Beat;
#[cfg(not(loom))]
pub use reader::{HeartbeatReader, Reading};
#[cfg(not(loom))]
pub use writer::{Heartbeat, Target};
