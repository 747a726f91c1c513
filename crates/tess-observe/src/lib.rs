//! Observability for tess: watch each cell keep (or miss) its guarantee while it happens.
//!
//! - [`kernel`]: the counters the kernel already keeps (thread CPU time, involuntary switches,
//!   CFS throttling, memory, per-hart busy and steal time), read from procfs and cgroupfs.
//! - [`snapshot`]: one look at the machine: tessd's grants (`status`, `list-cells`) beside the
//!   kernel's counters; [`rates`] turns two snapshots into shares of a hart.
//! - [`prom`]: the Prometheus (OpenMetrics) exposition served by `tessd --metrics-listen`.
//! - [`trace`]: `sched_switch` from tracefs as a Chrome / Perfetto trace, by cell.
//!
//! Nothing here runs on a real-time path: a snapshot costs two API calls and a few small file
//! reads per thread, taken only when someone looks.
#![warn(missing_docs)]

pub mod kernel;
pub mod prom;
pub mod rates;
pub mod snapshot;
pub mod trace;

pub use snapshot::{CellSample, HartSample, Snapshot};
