//! The tess resource model, free of I/O so that every rule can be tested exhaustively.
//!
//! Glossary (seed 004, section 2-3; seed 000, section 2.1):
//! - **hart**: a hardware thread, the unit of spatial partitioning.
//! - **cell**: a named, performance-isolated container owning a set of harts under one of four
//!   time-multiplexing policies ([`spec::Policy`]): dedicated (non-multiplexed), time-triggered,
//!   event-triggered, best-effort.
//! - **placement**: which harts a cell gets ([`placement`]); the user may name them or give a
//!   count for the daemon to choose.
//! - **admission**: the decision whether a whole set of cells can be guaranteed at once
//!   ([`admission`]); refused requests say which resource on which hart is short by how much.
//! - **layout**: how an admitted set of cells maps onto Linux mechanisms ([`layout`]).
#![warn(missing_docs)]
// Admission errors carry the cells, harts and windows they name; one is built per refused
// request, never on a hot path, so their size does not matter.
#![allow(clippy::result_large_err)]

pub mod admission;
pub mod layout;
pub mod manifest;
pub mod placement;
pub mod quota;
pub mod spec;
pub mod state;
pub mod units;

pub use admission::{AdmissionError, Capacity};
pub use spec::{CellSpec, HartRequest, Policy};
pub use state::{Cell, Cluster};
