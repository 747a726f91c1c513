//! The synchronisation primitives the runtime's lock-free parts are written against, swapped for
//! loom's under `--cfg loom` (the crossbeam `primitive` pattern, as in `tess-channel`).
//!
//! Two things live here: the atomics of the adaptation [`crate::roster`], and the [`Doorbell`]
//! that idle harts sleep on. Under loom the doorbell's futex is modelled with a mutex and a
//! condition variable, so that a lost wake-up shows up as a deadlock in the model checker; a wait
//! with a timeout is modelled as "the timeout may expire at any moment" (a yield).

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// A word idle harts sleep on (`FUTEX_WAIT_BITSET` with an absolute `CLOCK_MONOTONIC` deadline)
/// and that anyone rings: new work, an adaptation step, a stop request.
///
/// A waiter reads the ring count first ([`Doorbell::count`]), re-checks its condition, and then
/// sleeps only while the count is unchanged; a ring in between makes the sleep return at once,
/// so no wake-up is lost.
#[derive(Debug, Default)]
pub(crate) struct Doorbell {
    rings: AtomicU32,
    #[cfg(loom)]
    lock: loom::sync::Mutex<()>,
    #[cfg(loom)]
    cv: loom::sync::Condvar,
}

impl Doorbell {
    /// The number of rings so far (wraps); pass it to [`Doorbell::wait`].
    pub(crate) fn count(&self) -> u32 {
        self.rings.load(Ordering::Acquire)
    }

    /// Wakes every sleeper.
    pub(crate) fn ring(&self) {
        self.rings.fetch_add(1, Ordering::AcqRel);
        self.wake_all();
    }
}

#[cfg(not(loom))]
impl Doorbell {
    /// Sleeps while the ring count is `seen`, until `deadline_ns` of `CLOCK_MONOTONIC` at the
    /// latest. Returns on a ring, the deadline, a signal or a spurious wake-up; callers re-check.
    pub(crate) fn wait(&self, seen: u32, deadline_ns: u64) {
        let ts = libc::timespec {
            tv_sec: (deadline_ns / 1_000_000_000) as libc::time_t,
            tv_nsec: (deadline_ns % 1_000_000_000) as libc::c_long,
        };
        // SAFETY: the word is a valid, aligned u32 that outlives the call; `ts` is a timespec on
        // our stack that the kernel only reads. FUTEX_WAIT_BITSET takes an absolute deadline on
        // CLOCK_MONOTONIC (no FUTEX_CLOCK_REALTIME); the bitset must be non-zero.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.rings.as_ptr(),
                libc::FUTEX_WAIT_BITSET | libc::FUTEX_PRIVATE_FLAG,
                seen,
                &ts as *const libc::timespec,
                std::ptr::null::<u32>(),
                u32::MAX,
            );
        }
    }

    fn wake_all(&self) {
        // SAFETY: the word is a valid, aligned u32; FUTEX_WAKE reads no other argument.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.rings.as_ptr(),
                libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
                i32::MAX,
                std::ptr::null::<libc::timespec>(),
                std::ptr::null::<u32>(),
                0u32,
            );
        }
    }
}

#[cfg(loom)]
impl Doorbell {
    /// Loom model: the value check and the enqueue happen under one lock, as the kernel does
    /// them under the hash-bucket lock. A deadline of `u64::MAX` means "no timeout".
    pub(crate) fn wait(&self, seen: u32, deadline_ns: u64) {
        if deadline_ns != u64::MAX {
            loom::thread::yield_now();
            return;
        }
        let guard = self.lock.lock().unwrap();
        if self.rings.load(Ordering::SeqCst) == seen {
            drop(self.cv.wait(guard).unwrap());
        }
    }

    fn wake_all(&self) {
        let _guard = self.lock.lock().unwrap();
        self.cv.notify_all();
    }
}
