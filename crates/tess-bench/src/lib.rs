//! Benchmark harness shared by every `tess bench NAME` command.
//!
//! A benchmark produces a [`Report`]: human-readable tables, and a `figures` map from each
//! figure's name (as the issue that asks for it spells it) to a number. `--json` prints the report
//! as one JSON object. Baselines are measured in the same invocation, and every report that
//! measures latency carries the machine's noise floor ([`probe::noise_floor`]).
//!
//! Timing assertions never live in unit tests; benchmarks are commands.
#![warn(missing_docs)]

pub mod cpu;
pub mod histogram;
pub mod probe;
mod report;
pub mod spinner;
mod stats;

pub use report::{format_value, Comparison, Report, Table};
pub use stats::Summary;
