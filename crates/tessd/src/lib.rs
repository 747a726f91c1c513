//! `tessd`, the tess daemon, as a library (the binary is a thin `main`).
//!
//! - [`daemon`]: the concurrency model (one transaction at a time, readers use snapshots).
//! - [`engine`]: requests become transactions (place, admit, plan, apply, commit, publish).
//! - [`fault`]: crash points for the crash tests (only with the `fault-injection` feature).
//! - [`enforcer`]: makes the kernel match a layout; [`threads`]: `SCHED_DEADLINE` per thread.
//! - [`budget_tick`]: ends `SCHED_DEADLINE` budgets on time where `HRTICK_DL` is off.
//! - [`kernel`]: system-wide settings (deadline capacity, IRQ and workqueue steering).
//! - [`store`]: durable state; [`config`]: configuration; [`server`]: the API socket;
//!   [`procmon`]: fork events; [`metrics`]: the Prometheus endpoint.
#![warn(missing_docs)]

pub mod budget_tick;
pub mod config;
pub mod daemon;
pub mod enforcer;
pub mod engine;
pub mod fault;
pub mod idle;
pub mod kernel;
pub mod metrics;
pub mod procmon;
pub mod server;
pub mod store;
pub mod threads;
