//! Global earliest deadline first (EDF) with priority inheritance on Pulse locks.
//!
//! # Policy
//!
//! Every thread has a period `T` and a relative deadline `D` (set at creation with
//! [`crate::ThreadOptions::timing`], changeable with [`set_timing`]). Its current job was
//! released at `r` and is due at `d = r + D`. A thread ends a job with [`wait_next_period`]:
//! it sleeps until `r' = r + T` and its next deadline is `r' + D`. Threads without timing have
//! `d = infinity` and run only when no timed thread is runnable (FIFO among themselves).
//!
//! On every hart, at every scheduling point (tick, yield, done, wake), the runnable thread
//! with the earliest *effective* deadline runs:
//!
//! ```text
//!     effective(t) = min(d(t), inherited(t))
//!     inherited(t) = min { effective(w) : w waits for a Pulse lock t holds }
//! ```
//!
//! Ties go to the thread queued first. A tick does not preempt the running thread unless a
//! queued one has a strictly earlier effective deadline (no needless switches). Waking a thread
//! whose deadline is earlier than the waker's asks the waker to yield.
//!
//! Worked example (one hart): A (T = D = 10 ms) and B (T = D = 40 ms), both released at 0:
//! A runs first (d = 10 < 40); when A calls `wait_next_period` at 3 ms, B runs; at 10 ms A is
//! released with d = 20 < 40, and the next tick (<= 1 ms later) preempts B for A.
//!
//! Queue: a vector scanned for the minimum, O(n) per decision: inheritance changes deadlines
//! of queued threads behind the queue's back, and a scan sees them without re-sorting. With
//! tens of threads a scan is cheaper than a heap's bookkeeping.

use crate::clock::now_ns;
use crate::lock::SpinLock;
use crate::sched::{Hart, Scheduler};
use crate::thread::{PulseThread, Thread};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Something with an effective deadline (a thread, or a test's stand-in).
pub trait Deadline {
    /// The deadline EDF orders by (ns; `u64::MAX` = none).
    fn effective_deadline(&self) -> u64;
}

impl Deadline for Thread {
    fn effective_deadline(&self) -> u64 {
        self.info().effective_deadline_ns()
    }
}

/// A run queue ordered by effective deadline at the time of each pick.
#[derive(Debug)]
pub struct DeadlineQueue<T> {
    items: Vec<T>,
}

impl<T: Deadline> DeadlineQueue<T> {
    /// An empty queue with room for `n`.
    pub fn with_capacity(n: usize) -> Self {
        DeadlineQueue {
            items: Vec::with_capacity(n),
        }
    }

    /// Adds an item at the back.
    pub fn push(&mut self, t: T) {
        self.items.push(t);
    }

    /// Items queued.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The earliest effective deadline queued (`u64::MAX` if none).
    pub fn earliest(&self) -> u64 {
        self.items
            .iter()
            .map(|t| t.effective_deadline())
            .min()
            .unwrap_or(u64::MAX)
    }

    /// Removes the item with the earliest effective deadline, the first queued among equals.
    pub fn pop(&mut self) -> Option<T> {
        let mut best: Option<(usize, u64)> = None;
        for (i, t) in self.items.iter().enumerate() {
            let d = t.effective_deadline();
            if best.is_none_or(|(_, b)| d < b) {
                best = Some((i, d));
            }
        }
        // `remove`, not `swap_remove`: the order among equal deadlines is the queue order.
        best.map(|(i, _)| self.items.remove(i))
    }
}

/// The EDF scheduler.
#[derive(Debug)]
pub struct Edf {
    queue: SpinLock<DeadlineQueue<Thread>>,
}

impl Edf {
    /// An EDF scheduler with room for `max_threads` before its queue grows.
    pub fn new(max_threads: usize) -> Edf {
        Edf {
            queue: SpinLock::new(DeadlineQueue::with_capacity(max_threads)),
        }
    }
}

impl Default for Edf {
    fn default() -> Edf {
        Edf::new(1024)
    }
}

impl Scheduler for Edf {
    fn enter(&self, _: &Hart<'_>) -> Option<Thread> {
        self.queue.lock().pop()
    }

    fn tick(&self, _: &Hart<'_>, current: Thread) -> Option<Thread> {
        let mut q = self.queue.lock();
        if q.earliest() < current.effective_deadline() {
            q.push(current);
            q.pop()
        } else {
            Some(current)
        }
    }

    fn r#yield(&self, _: &Hart<'_>, current: Thread) -> Option<Thread> {
        let mut q = self.queue.lock();
        q.push(current);
        q.pop()
    }

    fn adapt(&self, _: usize, _: usize, running: Vec<Thread>) {
        let mut q = self.queue.lock();
        for t in running {
            q.push(t);
        }
    }

    fn wake(&self, thread: Thread) -> bool {
        let d = thread.effective_deadline();
        self.queue.lock().push(thread);
        let me = crate::hart::current_thread();
        // SAFETY: the caller runs with ticks off, so the current thread cannot change under us.
        !me.is_null() && d < unsafe { (*me).effective_deadline_ns() }
    }
}

fn with_current<R>(f: impl FnOnce(&PulseThread) -> R) -> Option<R> {
    // SAFETY: only touches this kernel thread's hart.
    let h = unsafe { crate::arch::pulse_ticks_off().as_ref() };
    let r = h.and_then(|h| {
        let t = h.current.load(Ordering::Relaxed);
        // SAFETY: the running thread is live; ticks are off so it stays ours.
        unsafe { t.as_ref() }.map(f)
    });
    crate::hart::ticks_on();
    r
}

/// Changes the calling thread's period and relative deadline (takes effect for the current
/// job's deadline now).
pub fn set_timing(period: Duration, deadline: Duration) {
    with_current(|t| t.set_timing(period, deadline));
}

/// The process's `pulse-edf` page (crate `tess-stats`): every job's response time (release
/// to `wait_next_period`) and whether it missed its deadline, for `tess top` and Prometheus.
/// Made at the first job's end, so programs without EDF threads publish nothing.
static PUBLISHED: std::sync::OnceLock<Option<tess_stats::Publisher>> = std::sync::OnceLock::new();

fn publish_job(release_ns: u64, deadline_ns: u64, done_ns: u64) {
    let p = PUBLISHED.get_or_init(|| tess_stats::Publisher::try_create("pulse-edf", None));
    if let Some(p) = p {
        p.record_judged(done_ns.saturating_sub(release_ns), done_ns > deadline_ns);
    }
}

/// Starts the calling thread's jobs on a given time base: the current job (set-up work, such
/// as a player's pre-roll) ends unjudged, and the thread sleeps until its next job is released
/// at `at_ns` (`CLOCK_MONOTONIC`), due `at_ns` + D; later jobs follow every period from there
/// (`wait_next_period`). Threads that serve one clock (the streams of a presentation) release
/// together this way instead of each from its own creation. Returns `at_ns`, or `None` outside
/// an EDF thread.
pub fn release_at(at_ns: u64) -> Option<u64> {
    with_current(|t| {
        if t.period_ns.load(Ordering::Acquire) == 0 {
            return None;
        }
        let d = t.rel_deadline_ns.load(Ordering::Acquire);
        t.release_ns.store(at_ns, Ordering::Release);
        t.abs_deadline_ns
            .store(at_ns.saturating_add(d), Ordering::Release);
        Some(())
    })
    .flatten()?;
    crate::runtime::sleep_until_ns(at_ns);
    Some(at_ns)
}

/// Ends the calling thread's job: sleeps until its next release, whose deadline is then
/// release + D. Returns the new release time (ns), or `None` outside an EDF thread.
pub fn wait_next_period() -> Option<u64> {
    let (release, job) = with_current(|t| {
        let period = t.period_ns.load(Ordering::Acquire);
        if period == 0 {
            return None;
        }
        let d = t.rel_deadline_ns.load(Ordering::Acquire);
        let released = t.release_ns.load(Ordering::Acquire);
        let due = t.abs_deadline_ns.load(Ordering::Acquire);
        let mut r = released + period;
        let now = now_ns();
        if r + d < now {
            // Overran a whole job: skip to the release that can still be met.
            r += (now - r) / period * period;
        }
        t.release_ns.store(r, Ordering::Release);
        t.abs_deadline_ns.store(r + d, Ordering::Release);
        Some((r, (released, due, now)))
    })
    .flatten()?;
    // Outside `with_current`: the first job's end makes the page, with ticks on.
    publish_job(job.0, job.1, job.2);
    crate::runtime::sleep_until_ns(release);
    Some(release)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug)]
    struct Item {
        id: usize,
        own: u64,
        inherited: u64,
    }

    impl Deadline for Item {
        fn effective_deadline(&self) -> u64 {
            self.own.min(self.inherited)
        }
    }

    proptest! {
        /// Popping everything yields non-decreasing effective deadlines, FIFO among equals,
        /// and loses nothing.
        #[test]
        fn pops_in_deadline_order_fifo_among_equals(
            ds in proptest::collection::vec((0u64..20, proptest::option::of(0u64..20)), 0..40)
        ) {
            let mut q = DeadlineQueue::with_capacity(4);
            for (id, (own, inh)) in ds.iter().enumerate() {
                q.push(Item { id, own: *own, inherited: inh.unwrap_or(u64::MAX) });
            }
            let mut out = Vec::new();
            while let Some(t) = q.pop() {
                out.push(t);
            }
            prop_assert_eq!(out.len(), ds.len());
            for w in out.windows(2) {
                let (a, b) = (w[0].effective_deadline(), w[1].effective_deadline());
                prop_assert!(a <= b);
                if a == b {
                    prop_assert!(w[0].id < w[1].id);
                }
            }
        }

        /// Inheritance moves a holder ahead of exactly the threads whose deadline lies
        /// between the waiter's and its own.
        #[test]
        fn inheritance_reorders_the_holder(
            own in proptest::collection::vec(1u64..100, 2..20),
            holder in 0usize..20,
            waiter_deadline in 0u64..100,
        ) {
            let holder = holder % own.len();
            let mut q = DeadlineQueue::with_capacity(own.len());
            for (id, d) in own.iter().enumerate() {
                let inherited = if id == holder { waiter_deadline } else { u64::MAX };
                q.push(Item { id, own: *d, inherited });
            }
            let eff = own[holder].min(waiter_deadline);
            let mut pos = 0;
            let mut i = 0;
            while let Some(t) = q.pop() {
                if t.id == holder { pos = i; }
                i += 1;
            }
            let ahead = own.iter().enumerate()
                .filter(|&(id, d)| id != holder && (*d < eff || (*d == eff && id < holder)))
                .count();
            prop_assert_eq!(pos, ahead);
        }
    }
}
