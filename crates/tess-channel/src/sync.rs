//! The synchronisation primitives the ring is written against, swapped for loom's under
//! `--cfg loom` (the crossbeam `primitive` pattern). The memory the ring lives in is shimmed
//! the same way, in [`region`](crate::region).

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

/// Tells the processor (or loom's scheduler) that we are spinning.
#[inline(always)]
pub(crate) fn spin_hint() {
    #[cfg(not(loom))]
    std::hint::spin_loop();
    #[cfg(loom)]
    loom::thread::yield_now();
}
