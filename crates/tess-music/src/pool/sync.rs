//! The synchronisation primitives of the pool, from `std` normally and from `loom` when the crate
//! is built with `RUSTFLAGS="--cfg loom"`, so the lock-free protocol can be model-checked.
//!
//! `UnsafeCell` follows loom's API (`get` / `get_mut` return guards whose `deref` is unsafe), so
//! that under loom every access to shared data is tracked for the duration of the guard.

#[cfg(loom)]
pub(crate) use loom::cell::UnsafeCell;
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::Arc;

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::Arc;

/// Waits politely inside a spin loop: a CPU hint normally, a scheduling point under loom (which
/// must see every spin iteration to explore the other threads).
#[inline]
pub(crate) fn spin_hint() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::hint::spin_loop();
}

/// `std::cell::UnsafeCell` with loom's guard API.
#[cfg(not(loom))]
#[derive(Debug)]
pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    pub(crate) fn new(v: T) -> Self {
        UnsafeCell(std::cell::UnsafeCell::new(v))
    }

    /// A guard for shared access.
    #[inline]
    pub(crate) fn get(&self) -> ConstPtr<T> {
        ConstPtr(self.0.get())
    }

    /// A guard for exclusive access.
    #[inline]
    pub(crate) fn get_mut(&self) -> MutPtr<T> {
        MutPtr(self.0.get())
    }
}

/// Shared-access guard.
#[cfg(not(loom))]
#[derive(Debug)]
pub(crate) struct ConstPtr<T>(*const T);

#[cfg(not(loom))]
impl<T> ConstPtr<T> {
    /// # Safety
    /// No exclusive reference to the value may exist while the result lives.
    #[inline]
    pub(crate) unsafe fn deref(&self) -> &T {
        // SAFETY: the pointer comes from a live UnsafeCell; the caller rules out exclusive
        // access for the lifetime of the result.
        unsafe { &*self.0 }
    }
}

/// Exclusive-access guard.
#[cfg(not(loom))]
#[derive(Debug)]
pub(crate) struct MutPtr<T>(*mut T);

#[cfg(not(loom))]
impl<T> MutPtr<T> {
    /// # Safety
    /// No other reference to the value may exist while the result lives.
    #[inline]
    #[allow(clippy::mut_from_ref)] // The guard hands out the cell's interior, as loom's does.
    pub(crate) unsafe fn deref(&self) -> &mut T {
        // SAFETY: the pointer comes from a live UnsafeCell; the caller guarantees exclusivity
        // for the lifetime of the result.
        unsafe { &mut *self.0 }
    }
}
