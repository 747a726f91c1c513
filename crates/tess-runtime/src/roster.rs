//! Who runs, and the adaptation handshake (seed 004 section 4.4), lock-free.
//!
//! The roster holds the number of virtual harts that should run (`target`) and the state of at
//! most one outstanding adaptation event. Pulse does not support overlapping adaptation events
//! ("an event must terminate before a new one starts"); neither do we: a new `Adapt` from tessd
//! is read only once the previous one has finished.
//!
//! ```text
//!   coordinator              harts                                   any surviving hart
//!   begin(old, new)   ->     shrink: vhart >= new sees target,
//!   (target, expected)       stashes its task, arrive(), exits
//!                            grow: a new thread, once tessd placed
//!                            it, arrive()
//!                                                                   try_claim(): PENDING -> CLAIMED
//!                                                                   when arrived == expected;
//!                                                                   adapt(old, new), ack, finish()
//! ```
//!
//! Exactly one hart claims an adaptation (a compare-and-swap on `state`), and only after every
//! expected arrival: the claimer's acquire load of `arrived` synchronises with each arrival's
//! release, so it sees everything a retiring hart did before it arrived (the task it stashed,
//! and the fact that it runs no more application code). `tests` in `loom_tests` model-check it.

use crate::sync::{AtomicU64, AtomicUsize, Ordering};

const IDLE: u64 = 0;
const PENDING: u64 = 1;
const CLAIMED: u64 = 2;
const PHASE_MASK: u64 = 3;

/// The set of running virtual harts and the adaptation in progress.
#[derive(Debug)]
pub(crate) struct Roster {
    /// Virtual harts that should run; harts with a higher id retire.
    target: AtomicUsize,
    /// `generation << 2 | phase`.
    state: AtomicU64,
    /// Harts that have retired (shrink) or started (grow) for the pending adaptation.
    arrived: AtomicUsize,
    /// Arrivals that complete the pending adaptation.
    expected: AtomicUsize,
}

/// A claimed adaptation, to be finished with [`Roster::finish`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Claim {
    pub(crate) generation: u64,
}

impl Roster {
    pub(crate) fn new(harts: usize) -> Roster {
        Roster {
            target: AtomicUsize::new(harts),
            state: AtomicU64::new(IDLE),
            arrived: AtomicUsize::new(0),
            expected: AtomicUsize::new(0),
        }
    }

    /// Virtual harts that should run now.
    pub(crate) fn target(&self) -> usize {
        self.target.load(Ordering::Acquire)
    }

    /// Whether the hart with this id must retire.
    pub(crate) fn must_retire(&self, vhart: usize) -> bool {
        vhart >= self.target()
    }

    /// Whether an adaptation is in progress (the fast-path check at every checkpoint).
    pub(crate) fn pending(&self) -> bool {
        self.state.load(Ordering::Acquire) & PHASE_MASK != IDLE
    }

    /// Starts an adaptation from `old` to `new` harts. Only one coordinator calls it at a time,
    /// and only when no adaptation is pending. Returns the number of arrivals it waits for.
    pub(crate) fn begin(&self, old: usize, new: usize) -> usize {
        let expected = old.abs_diff(new);
        let generation = self.state.load(Ordering::Acquire) >> 2;
        debug_assert_eq!(self.state.load(Ordering::Acquire) & PHASE_MASK, IDLE);
        self.arrived.store(0, Ordering::Relaxed);
        self.expected.store(expected, Ordering::Relaxed);
        // Publishing the state and the target (release) makes the resets above visible to
        // every hart that sees either.
        self.state
            .store(((generation + 1) << 2) | PENDING, Ordering::Release);
        self.target.store(new, Ordering::Release);
        expected
    }

    /// A hart retired or started for the pending adaptation.
    pub(crate) fn arrive(&self) {
        self.arrived.fetch_add(1, Ordering::AcqRel);
    }

    /// Claims the pending adaptation if every expected hart has arrived; the caller then runs
    /// `adapt` and calls [`Roster::finish`]. At most one caller gets `Some`.
    pub(crate) fn try_claim(&self) -> Option<Claim> {
        let s = self.state.load(Ordering::Acquire);
        if s & PHASE_MASK != PENDING {
            return None;
        }
        if self.arrived.load(Ordering::Acquire) < self.expected.load(Ordering::Acquire) {
            return None;
        }
        let claimed = (s & !PHASE_MASK) | CLAIMED;
        self.state
            .compare_exchange(s, claimed, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|_| Claim { generation: s >> 2 })
    }

    /// Ends a claimed adaptation.
    pub(crate) fn finish(&self, claim: Claim) {
        self.state.store(claim.generation << 2, Ordering::Release);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn shrink_completes_after_every_retirement() {
        let r = Roster::new(3);
        assert_eq!(r.begin(3, 1), 2);
        assert!(r.pending());
        assert!(r.must_retire(2) && r.must_retire(1) && !r.must_retire(0));
        assert_eq!(r.try_claim(), None);
        r.arrive();
        assert_eq!(r.try_claim(), None);
        r.arrive();
        let c = r.try_claim().expect("complete");
        assert_eq!(r.try_claim(), None, "claimed once");
        r.finish(c);
        assert!(!r.pending());
        assert_eq!(r.target(), 1);
    }

    #[test]
    fn same_size_is_claimable_at_once() {
        let r = Roster::new(2);
        assert_eq!(r.begin(2, 2), 0);
        let c = r.try_claim().unwrap();
        r.finish(c);
        assert_eq!(r.begin(2, 4), 2);
        r.arrive();
        r.arrive();
        assert_eq!(r.try_claim().unwrap().generation, 2);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::{Arc, Mutex};
    use loom::thread;

    /// Two harts retire (each stashes its task, then arrives and exits) while the survivor
    /// polls: it claims exactly once, never before both arrived, and sees both stashed tasks.
    #[test]
    fn shrink_is_claimed_once_with_all_orphans() {
        loom::model(|| {
            let roster = Arc::new(Roster::new(3));
            let orphans = Arc::new(Mutex::new(Vec::new()));
            roster.begin(3, 1);
            let mut hs = Vec::new();
            for v in 1..3usize {
                let (r, o) = (roster.clone(), orphans.clone());
                hs.push(thread::spawn(move || {
                    assert!(r.must_retire(v));
                    o.lock().unwrap().push(v);
                    r.arrive();
                }));
            }
            assert!(!roster.must_retire(0));
            let claim = loop {
                if let Some(c) = roster.try_claim() {
                    break c;
                }
                thread::yield_now();
            };
            assert_eq!(orphans.lock().unwrap().len(), 2);
            assert_eq!(roster.try_claim(), None);
            roster.finish(claim);
            for h in hs {
                h.join().unwrap();
            }
            assert!(!roster.pending());
        });
    }

    /// A grow by one: the new hart arrives while an old hart polls; one claim.
    #[test]
    fn grow_is_claimed_once() {
        loom::model(|| {
            let roster = Arc::new(Roster::new(1));
            let claims = Arc::new(AtomicUsize::new(0));
            roster.begin(1, 2);
            let (r, c) = (roster.clone(), claims.clone());
            let new_hart = thread::spawn(move || {
                r.arrive();
                if let Some(claim) = r.try_claim() {
                    c.fetch_add(1, Ordering::SeqCst);
                    r.finish(claim);
                }
            });
            let mut mine = false;
            if let Some(claim) = roster.try_claim() {
                claims.fetch_add(1, Ordering::SeqCst);
                roster.finish(claim);
                mine = true;
            }
            new_hart.join().unwrap();
            if !mine && claims.load(Ordering::SeqCst) == 0 {
                panic!("nobody claimed a complete adaptation");
            }
            assert_eq!(claims.load(Ordering::SeqCst), 1);
        });
    }

    /// An idle hart sleeping on the doorbell is always woken by a ring after new work.
    #[test]
    fn doorbell_loses_no_wakeup() {
        loom::model(|| {
            let bell = Arc::new(crate::sync::Doorbell::default());
            let work = Arc::new(AtomicUsize::new(0));
            let (b, w) = (bell.clone(), work.clone());
            let ringer = thread::spawn(move || {
                w.store(1, Ordering::Release);
                b.ring();
            });
            loop {
                let seen = bell.count();
                if work.load(Ordering::Acquire) == 1 {
                    break;
                }
                bell.wait(seen, u64::MAX);
            }
            ringer.join().unwrap();
        });
    }
}
