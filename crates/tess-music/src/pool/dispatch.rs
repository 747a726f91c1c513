//! The lock-free hand-out of work items (voices) to spinning threads, generic over the item and
//! the job description so that it can be model-checked with loom on small types.
//!
//! # The ticket
//! ```text
//!  63            32 31          16 15           0
//! +----------------+--------------+--------------+
//! |     epoch      |  n (items)   | next (claim) |
//! +----------------+--------------+--------------+
//! ```
//! A claim is a compare-and-swap of the ticket that succeeds only if the epoch is the one the
//! claimer saw and `next < n`; it makes `next` the claimer's. Why epoch and counter share one
//! word: with a separate counter, a thread late from package `k` could increment the counter
//! after it was reset for package `k + 1` and compute an item of the new package against the
//! old job. Folding the epoch into the CAS makes such a claim fail.
//!
//! # Ownership protocol (what the `unsafe` blocks rely on)
//! 1. While no package is in flight (before the first publication, or after `done == n` was
//!    observed with Acquire) only the [`Comm`] handle touches the job and the items.
//! 2. [`Comm::publish`] stores the ticket with Release after the job was written.
//! 3. A successful claim (CAS with Acquire) gives its thread read access to the job and exclusive
//!    use of item `job.item(next)` until it increments `done` with Release.
//! 4. Nobody touches the job or an item outside rules 1 and 3. The [`Comm`] handle is not
//!    `Clone`, so there is one communication thread.
//!
//! The scheme is lock-free: a stalled thread delays only the item it claimed.

use super::sync::{spin_hint, Arc, AtomicBool, AtomicU32, AtomicU64, Ordering, UnsafeCell};

/// Maps claim numbers `0..n` of a job to item indices.
pub(crate) trait Job {
    /// The item handled by claim `claim` (each item at most once per job).
    fn item(&self, claim: u32) -> usize;
}

#[derive(Debug)]
#[repr(align(128))]
struct Slot<T>(UnsafeCell<T>);

#[derive(Debug)]
struct Shared<T, J> {
    ticket: AtomicU64,
    done: AtomicU32,
    stop: AtomicBool,
    job: UnsafeCell<J>,
    items: Box<[Slot<T>]>,
}

// SAFETY: the cells (job and items) are accessed only under the ownership protocol of the module
// docs, which hands each item to one thread at a time and orders every hand-over with
// Release/Acquire atomics; items move between threads, hence `T: Send`, and the job is read by
// several threads at once, hence `J: Sync`.
unsafe impl<T: Send, J: Send + Sync> Sync for Shared<T, J> {}
// SAFETY: as above; the structure owns its items and job.
unsafe impl<T: Send, J: Send> Send for Shared<T, J> {}

pub(crate) fn ticket(epoch: u32, n: u32, next: u32) -> u64 {
    (u64::from(epoch) << 32) | (u64::from(n) << 16) | u64::from(next)
}

pub(crate) fn unpack(t: u64) -> (u32, u32, u32) {
    (
        (t >> 32) as u32,
        ((t >> 16) & 0xFFFF) as u32,
        (t & 0xFFFF) as u32,
    )
}

impl<T, J: Job> Shared<T, J> {
    #[inline]
    fn claim(&self, epoch: u32) -> Option<u32> {
        let mut t = self.ticket.load(Ordering::Acquire);
        loop {
            let (e, n, next) = unpack(t);
            if e != epoch || next >= n {
                return None;
            }
            match self.ticket.compare_exchange_weak(
                t,
                ticket(e, n, next + 1),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(next),
                Err(now) => t = now,
            }
        }
    }

    /// Claims and processes items of `epoch` until none is left; returns how many.
    #[inline]
    fn work(&self, epoch: u32, f: &mut impl FnMut(&J, usize, &mut T)) -> u32 {
        let mut processed = 0;
        while let Some(claim) = self.claim(epoch) {
            {
                let job_ptr = self.job.get();
                // SAFETY: rule 3: the successful claim gives this thread read access to the
                // job...
                let job = unsafe { job_ptr.deref() };
                let i = job.item(claim);
                let item_ptr = self.items[i].0.get_mut();
                // SAFETY: ...and exclusive use of item `job.item(claim)` until `done` is
                // incremented below; a job names each item at most once.
                let item = unsafe { item_ptr.deref() };
                f(job, i, item);
                // Both guards end here, before the item is handed back.
            }
            processed += 1;
            self.done.fetch_add(1, Ordering::Release);
        }
        processed
    }
}

/// Exclusive access to the items between packages (rule 1).
pub(crate) struct Items<'a, T> {
    items: &'a [Slot<T>],
}

impl<T> Items<'_, T> {
    /// Runs `f` on item `i`.
    #[inline]
    pub(crate) fn with<R>(&mut self, i: usize, f: impl FnOnce(&mut T) -> R) -> R {
        let p = self.items[i].0.get_mut();
        // SAFETY: an `Items` exists only inside `Comm::prepare` / `Comm::finish`, i.e. under
        // rule 1, and `&mut self` keeps this the only live reference.
        f(unsafe { p.deref() })
    }
}

/// The communication thread's handle: publishes jobs and collects results.
pub(crate) struct Comm<T, J> {
    shared: Arc<Shared<T, J>>,
    epoch: u32,
    n: u32,
    in_flight: bool,
}

/// A worker thread's handle.
pub(crate) struct Worker<T, J> {
    shared: Arc<Shared<T, J>>,
    seen: u32,
}

/// Creates the dispatcher: the communication handle and a factory for worker handles.
pub(crate) fn new<T, J: Job>(items: Vec<T>, job: J) -> Comm<T, J> {
    Comm {
        shared: Arc::new(Shared {
            ticket: AtomicU64::new(0),
            done: AtomicU32::new(0),
            stop: AtomicBool::new(false),
            job: UnsafeCell::new(job),
            items: items
                .into_iter()
                .map(|t| Slot(UnsafeCell::new(t)))
                .collect(),
        }),
        epoch: 0,
        n: 0,
        in_flight: false,
    }
}

impl<T, J: Job> Comm<T, J> {
    /// A handle for a new worker thread.
    pub(crate) fn worker(&self) -> Worker<T, J> {
        Worker {
            shared: Arc::clone(&self.shared),
            seen: 0,
        }
    }

    /// Whether a job is in flight.
    pub(crate) fn in_flight(&self) -> bool {
        self.in_flight
    }

    /// The current epoch (for tests).
    #[cfg(test)]
    pub(crate) fn epoch(&self) -> u32 {
        self.epoch
    }

    /// Writes the next job with exclusive access to it and to the items (rule 1).
    pub(crate) fn prepare<R>(&mut self, f: impl FnOnce(&mut J, &mut Items<'_, T>) -> R) -> R {
        assert!(!self.in_flight, "prepare while a job is in flight");
        let job_ptr = self.shared.job.get_mut();
        // SAFETY: rule 1: nothing is in flight, so no other thread touches the job.
        let job = unsafe { job_ptr.deref() };
        f(
            job,
            &mut Items {
                items: &self.shared.items,
            },
        )
    }

    /// Publishes the prepared job with `n` claims (rule 2).
    pub(crate) fn publish(&mut self, n: u32) {
        assert!(!self.in_flight, "publish while a job is in flight");
        assert!(n < 1 << 16, "at most 65535 items per job");
        self.epoch = self.epoch.wrapping_add(1);
        self.n = n;
        self.shared.done.store(0, Ordering::Relaxed);
        self.shared
            .ticket
            .store(ticket(self.epoch, n, 0), Ordering::Release);
        self.in_flight = true;
    }

    /// Processes items of the published job on this thread too; returns how many.
    pub(crate) fn help(&self, mut f: impl FnMut(&J, usize, &mut T)) -> u32 {
        self.shared.work(self.epoch, &mut f)
    }

    /// Whether every claim of the published job is done.
    #[inline]
    pub(crate) fn is_done(&self) -> bool {
        self.shared.done.load(Ordering::Acquire) == self.n
    }

    /// Ends the job: once [`Comm::is_done`], reads the job and the items (rule 1 again).
    pub(crate) fn finish<R>(&mut self, f: impl FnOnce(&J, &mut Items<'_, T>) -> R) -> R {
        assert!(
            self.in_flight && self.is_done(),
            "finish before the job is done"
        );
        self.in_flight = false;
        let job_ptr = self.shared.job.get();
        // SAFETY: `done == n` was observed with Acquire: the workers are through (rule 1).
        let job = unsafe { job_ptr.deref() };
        f(
            job,
            &mut Items {
                items: &self.shared.items,
            },
        )
    }

    /// Tells the workers to return.
    pub(crate) fn stop(&self) {
        self.shared.stop.store(true, Ordering::Relaxed);
    }

    /// Claims of the current epoch still possible by a stale epoch number (for tests).
    #[cfg(test)]
    pub(crate) fn claim_as(&self, epoch: u32) -> Option<u32> {
        self.shared.claim(epoch)
    }
}

impl<T, J: Job> Worker<T, J> {
    /// Spins until [`Comm::stop`], processing every published job's items with `f`.
    pub(crate) fn run(&mut self, mut f: impl FnMut(&J, usize, &mut T)) {
        while !self.shared.stop.load(Ordering::Relaxed) {
            if !self.poll(&mut f) {
                spin_hint();
            }
        }
    }

    /// Looks once for a new job and works on it; returns whether there was one.
    pub(crate) fn poll(&mut self, f: &mut impl FnMut(&J, usize, &mut T)) -> bool {
        let (epoch, _, _) = unpack(self.shared.ticket.load(Ordering::Acquire));
        if epoch == self.seen {
            return false;
        }
        self.shared.work(epoch, f);
        self.seen = epoch;
        true
    }

    /// Whether the communication thread asked the workers to return.
    #[cfg(loom)]
    pub(crate) fn stopped(&self) -> bool {
        self.shared.stop.load(Ordering::Relaxed)
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    //! Model-checked with `RUSTFLAGS="--cfg loom" cargo test -p tess-music --lib loom`.
    use super::*;

    struct Identity;
    impl Job for Identity {
        fn item(&self, claim: u32) -> usize {
            claim as usize
        }
    }

    #[test]
    fn loom_every_item_processed_once_per_epoch() {
        // Two epochs (the second one is where a late claim of the first could go wrong), two
        // items, the worker and the communication thread both claiming. Spin loops make the
        // state space unbounded without a preemption bound; 2 is the usual choice.
        let mut model = loom::model::Builder::new();
        model.preemption_bound = Some(2);
        model.check(|| {
            let mut comm = new(vec![0u32; 2], Identity);
            let mut w = comm.worker();
            let t = loom::thread::spawn(move || {
                while !w.stopped() {
                    if !w.poll(&mut |_, _, x: &mut u32| *x += 1) {
                        spin_hint();
                    }
                }
            });
            for epoch in 1..=2u32 {
                comm.prepare(|_, _| ());
                comm.publish(2);
                comm.help(|_, _, x| *x += 1);
                while !comm.is_done() {
                    spin_hint();
                }
                comm.finish(|_, items| {
                    for i in 0..2 {
                        items.with(i, |x| assert_eq!(*x, epoch));
                    }
                });
            }
            comm.stop();
            t.join().unwrap();
        });
    }
}
