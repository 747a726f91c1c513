//! The live-music proof of tess (issue 5; seed 000, sections 3 and 4): a SLABS emulator, the
//! Migrator Synthesizer, the response-time measurement of Fig. 6, and the plain-Linux baselines
//! of the isolation experiment.
//!
//! # The numbers everything follows from
//! ```text
//! fs = 44,100 Hz;  1 input packet  = 2 frames  -> 2 / fs  = 45.351 us
//!                  1 package       = 16 packets -> 32 / fs = 725.624 us
//!                  deadline (t0 -> tf)          = 62 / fs  = 1405.896 us
//! full Migrator    = 32 voices x 100 oscillators x 32 frames = 102,400 oscillator-samples
//!                    per package = 141 M oscillator-samples per second
//! ```
//!
//! # Map
//! - [`slabs`]: the protocol and its wire format (byte diagram there).
//! - [`gesture`]: TOML gesture scripts; `gestures/default.toml` (24 pads) and
//!   `gestures/all-pads.toml` (32 pads) ship with the crate.
//! - [`emulator`]: the device (`tess-slabs`): real-rate pacing, `tf - t0`, missed deadlines.
//! - [`synth`]: the Migrator (oscillators, tables, voices, mixer); [`pool`]: the spinning worker
//!   runtime; [`host`]: the communication loop and `t2 - t1` (`tess-migrator`).
//! - [`net`]: UDP with kernel receive timestamps; [`netns`]: the emulator's own namespace on a
//!   veth pair; [`netsvc`]: the synthesizer's socket in the tess network service instead.
//! - [`measure`]: `migrator_hart_fraction`, `max_oscillators_per_hart`.
//! - [`scenario`]: processes, placements, interference ([`ep`], video), baselines C and D,
//!   histograms, the table and the figures.
//! - [`record`]: preallocated sample logs and WAV output; [`rt`]: pinning, policies, signals.
//!
//! # Glossary
//! **hart**: hardware thread. **package**: 16 input packets answered by one output packet.
//! **t0/tf**: device-side send of a package's first packet / arrival of its answer.
//! **t1/t2**: host-side kernel receive timestamp of the first packet / return of the answer's
//! `sendto`. **miss**: a response over the deadline, or no answer at all.
//!
//! # Worked example
//! A package whose first packet leaves the device at t0 = 0 is complete at the host after
//! 15 x 45.35 = 680.3 us (plus network); if the 24 pressed voices take 14 us and the answer
//! needs 15 us to reach the device, tf - t0 = 709 us, 697 us inside the deadline.
#![warn(missing_docs)]

pub mod emulator;
pub mod ep;
pub mod gesture;
// host, netsvc and scenario reach the network service through tessd's protocol, whose channel
// API loom builds strip; loom checks only the lock-free parts (pool).
#[cfg(not(loom))]
pub mod host;
pub mod measure;
pub mod net;
pub mod netns;
#[cfg(not(loom))]
pub mod netsvc;
pub mod pool;
pub mod record;
/// Real-time setup of the binaries' threads (moved to `tess_sched::rt`, where the network
/// service takes it from too).
pub use tess_sched::rt;
#[cfg(not(loom))]
pub mod scenario;
pub mod slabs;
pub mod synth;
