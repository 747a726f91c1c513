//! The synchronisation primitives the ring is written against, swapped for loom's under
//! `--cfg loom` (the crossbeam `primitive` pattern).
//!
//! Everything the ring algorithm does to shared memory goes through this module: atomics, fences,
//! spin hints and the futex. Under loom the futex is modelled with a mutex and a condition
//! variable so that a lost wake-up shows up as a deadlock in the model checker; a wait with a
//! timeout is modelled as "the timeout may expire at any moment" (a yield).

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

/// A 32-bit word in shared memory that a thread of either process can sleep on.
///
/// Not private to a process (`FUTEX_PRIVATE_FLAG` is not used): the kernel keys the wait queue on
/// the memfd page and offset, so the two processes mapping the channel meet on the same queue.
#[cfg(not(loom))]
#[repr(transparent)]
#[derive(Debug, Default)]
pub(crate) struct FutexWord(AtomicU32);

#[cfg(not(loom))]
impl FutexWord {
    #[inline(always)]
    pub(crate) fn word(&self) -> &AtomicU32 {
        &self.0
    }

    /// Sleeps while the word holds `expected`, for at most `timeout_ns` (`None`: no limit).
    /// Returns on a wake-up, a timeout, a signal or a value mismatch; callers re-check.
    pub(crate) fn wait(&self, expected: u32, timeout_ns: Option<u64>) {
        let ts = timeout_ns.map(|ns| libc::timespec {
            tv_sec: (ns / 1_000_000_000) as libc::time_t,
            tv_nsec: (ns % 1_000_000_000) as libc::c_long,
        });
        let ts_ptr = ts
            .as_ref()
            .map_or(std::ptr::null(), |t| t as *const libc::timespec);
        // SAFETY: the word is a valid, aligned u32 inside a live mapping for the duration of the
        // call; `ts_ptr` is null or points to a timespec on our stack. FUTEX_WAIT only reads it.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.0.as_ptr(),
                libc::FUTEX_WAIT,
                expected,
                ts_ptr,
                std::ptr::null::<u32>(),
                0u32,
            );
        }
    }

    /// Wakes the (single) thread sleeping on the word, if any.
    pub(crate) fn wake(&self) {
        // SAFETY: the word is a valid, aligned u32 inside a live mapping; FUTEX_WAKE does not
        // dereference the other arguments.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.0.as_ptr(),
                libc::FUTEX_WAKE,
                i32::MAX,
                std::ptr::null::<libc::timespec>(),
                std::ptr::null::<u32>(),
                0u32,
            );
        }
    }
}

/// Loom model of a futex word: the value check and the enqueue happen under one lock, as the
/// kernel does them under the hash-bucket lock.
#[cfg(loom)]
#[derive(Debug, Default)]
pub(crate) struct FutexWord {
    word: AtomicU32,
    lock: loom::sync::Mutex<()>,
    cv: loom::sync::Condvar,
}

#[cfg(loom)]
impl FutexWord {
    pub(crate) fn word(&self) -> &AtomicU32 {
        &self.word
    }

    pub(crate) fn wait(&self, expected: u32, timeout_ns: Option<u64>) {
        if timeout_ns.is_some() {
            // A bounded wait may time out at any moment; the caller re-checks everything.
            loom::thread::yield_now();
            return;
        }
        let guard = self.lock.lock().unwrap();
        if self.word.load(Ordering::SeqCst) == expected {
            drop(self.cv.wait(guard).unwrap());
        }
    }

    pub(crate) fn wake(&self) {
        let _guard = self.lock.lock().unwrap();
        self.cv.notify_all();
    }
}
