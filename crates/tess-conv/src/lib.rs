//! Non-uniform partitioned convolution for real-time audio (seed 001 sections 3.1 and 3.3):
//! a long impulse response (a concert hall's 12 s) convolved with no latency, block by block.
//!
//! - [`Plan`] cuts the response into levels of rising partition sizes (Gardner's layout, sizes
//!   chosen by Wefers's search under a measured [`CostModel`]).
//! - [`Convolver`] runs level 0 in the audio callback and the long levels in one of five
//!   [`Mode`]s: synchronously (offline), time-distributed over the callbacks of their period
//!   (in the callback, or as [`LevelTask`]s a host's scheduler runs in parallel), in the
//!   background (pieces a host runs in its idle time, each step due a period later), or
//!   preemptively on a [`Pool`] of lower-priority workers on the same hart.
//!
//! ```
//! use tess_conv::{Convolver, Mode, Plan, WhenLate};
//! let ir: Vec<f32> = (0..4000).map(|i| (-(i as f32) / 800.0).exp()).collect();
//! let plan = Plan::with_sizes(32, ir.len(), &[128, 512]).unwrap();
//! let mut c = Convolver::new(&ir, &plan, Mode::TimeDistributed, WhenLate::Drop).unwrap();
//! let mut out = [0.0f32; 32];
//! c.process(&[1.0; 32], &mut out);
//! ```

#[cfg(feature = "bench")]
pub mod bench;
mod convolver;
mod level;
mod plan;
mod pool;

pub use convolver::{ConvError, Convolver, LevelTask, Mode, WhenLate};
pub use plan::{CostModel, Level, Objective, Plan, PlanError};
pub use pool::{Pool, PoolError, PoolOptions};
