//! The atomics the heartbeat ring is written against, swapped for loom's under `--cfg loom`
//! (the crossbeam `primitive` pattern, as in tess-channel).

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU64, Ordering};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU64, Ordering};
