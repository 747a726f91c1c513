//! tess-pd: a parallel real-time audio graph engine that runs Pure Data patches (seed 001,
//! sections 2-3: "Parallelizing audio DSP graphs", "Task-level parallelism within Pd patches").
//!
//! # Glossary
//! - **patch**: a `.pd` file ([`parse`]); **object** one box ([`objects`]); **canvas** a
//!   (sub)patch.
//! - **block**: the samples computed per tick (64 by default); **tick** one pass of Pd's
//!   scheduler: clocks due, then one DSP block ([`engine`]).
//! - **sort**: Pd's order of DSP objects ([`sort`]); **node** a signal object in the
//!   [`graph::DspGraph`]; **task** a chain of nodes run as one unit ([`sched`]).
//! - **hart**: a hardware thread the engine runs on (seed 001 section 4.3).
//!
//! ```no_run
//! use tess_pd::{engine::{Config, Engine}, sched::Executor};
//! let mut e = Engine::open("synth.pd".as_ref(), Config { sample_rate: 48000.0, block: 64 })?;
//! let mut exec = Executor::serial();
//! e.tick(&mut exec);
//! # Ok::<(), tess_pd::engine::EngineError>(())
//! ```
#![warn(missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod atom;
#[cfg(feature = "bench")]
pub mod bench;
pub mod cell;
pub mod device;
pub mod engine;
pub mod graph;
pub mod jack_io;
pub mod load;
pub mod objects;
pub mod osc;
pub mod parse;
pub mod play;
pub mod render;
pub mod sched;
pub mod shared;
pub mod sort;
