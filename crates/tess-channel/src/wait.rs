//! How a blocking operation waits: the caller chooses.
//!
//! - [`Wait::BusyPoll`]: spin on the ring forever (until the deadline); lowest latency, burns the
//!   hart. The right choice for a cell that owns its hart.
//! - [`Wait::Adaptive`]: spin for a budget, then sleep on the futex. The budget adapts: when a
//!   message arrives during the spin after `t` ns, the budget moves towards `2 t`; when the wait
//!   ends in sleep, towards `2 x` the time slept if that was short, else it halves. Bounded by
//!   [`MIN_SPIN_NS`] and [`MAX_SPIN_NS`].
//! - [`Wait::Sleep`]: sleep on the futex at once (after one re-check).
//!
//! Whatever the mode, a waiter never sleeps longer than the liveness interval in one go: between
//! futex waits (and every so often while spinning) it polls the liveness socket, so the death of
//! the peer ends the wait with `Disconnected` within about one interval.

use std::time::Duration;
use tess_sched::clock;

/// Waiting strategy of the blocking operations of one endpoint half.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Wait {
    /// Spin until the operation can proceed.
    BusyPoll,
    /// Spin for an adaptive budget, then sleep on the futex.
    #[default]
    Adaptive,
    /// Sleep on the futex straight away.
    Sleep,
}

/// Shortest spin budget of [`Wait::Adaptive`].
pub const MIN_SPIN_NS: u64 = 500;
/// Longest spin budget of [`Wait::Adaptive`].
pub const MAX_SPIN_NS: u64 = 50_000;
/// Default time between two liveness checks of a waiting endpoint.
pub const DEFAULT_LIVENESS_INTERVAL: Duration = Duration::from_millis(20);

/// Iterations between two clock reads while spinning.
const SPINS_PER_CLOCK: u32 = 64;

/// The waiting state of one endpoint half.
#[derive(Debug, Clone)]
pub(crate) struct Waiter {
    pub(crate) mode: Wait,
    spin_budget_ns: u64,
    pub(crate) liveness_interval_ns: u64,
}

impl Default for Waiter {
    fn default() -> Self {
        Waiter {
            mode: Wait::Adaptive,
            spin_budget_ns: 5_000,
            liveness_interval_ns: clock::ns(DEFAULT_LIVENESS_INTERVAL),
        }
    }
}

/// What one attempt of a blocking operation found.
pub(crate) enum Attempt<T, E> {
    /// Done.
    Ready(T),
    /// Not possible yet; wait.
    NotYet,
    /// The peer hung up.
    Disconnected,
    /// Failed for good.
    Fail(E),
}

/// Why a wait ended without a value.
pub(crate) enum WaitEnd<E> {
    Timeout,
    Disconnected,
    Fail(E),
}

/// The side-specific half of waiting: how to announce, take and cancel a sleep, and whether the
/// peer process is still there.
pub(crate) trait Sleeper {
    fn announce_sleep(&self);
    fn sleep(&self, timeout_ns: Option<u64>);
    fn cancel_sleep(&self);
    fn peer_alive(&self) -> bool;
}

impl Waiter {
    /// After a first attempt that found nothing (made by the caller), runs `attempt` until it
    /// is ready, fails, the deadline (`CLOCK_MONOTONIC` ns) passes, or the peer is gone,
    /// waiting in between as `self.mode` says.
    pub(crate) fn block_on<S: Sleeper, T, E>(
        &mut self,
        s: &mut S,
        deadline_ns: Option<u64>,
        mut attempt: impl FnMut(&mut S) -> Attempt<T, E>,
    ) -> Result<T, WaitEnd<E>> {
        macro_rules! try_once {
            ($s:expr) => {
                match attempt($s) {
                    Attempt::Ready(t) => return Ok(t),
                    Attempt::NotYet => {}
                    Attempt::Disconnected => return Err(WaitEnd::Disconnected),
                    Attempt::Fail(e) => return Err(WaitEnd::Fail(e)),
                }
            };
        }
        // The callers have made the first attempt (inline, on their fast path): waiting starts.
        let start = clock::now_ns();
        let mut last_check = start;
        let interval = self.liveness_interval_ns.max(1);

        // Spin phase.
        let spin_ns = match self.mode {
            Wait::BusyPoll => u64::MAX,
            Wait::Adaptive => self.spin_budget_ns,
            Wait::Sleep => 0,
        };
        let mut now = start;
        while now.saturating_sub(start) < spin_ns {
            for _ in 0..SPINS_PER_CLOCK {
                crate::sync::spin_hint();
                match attempt(s) {
                    Attempt::Ready(t) => {
                        if self.mode == Wait::Adaptive {
                            let took = clock::now_ns().saturating_sub(start);
                            self.adapt((self.spin_budget_ns + 2 * took) / 2);
                        }
                        return Ok(t);
                    }
                    Attempt::NotYet => {}
                    Attempt::Disconnected => return Err(WaitEnd::Disconnected),
                    Attempt::Fail(e) => return Err(WaitEnd::Fail(e)),
                }
            }
            now = clock::now_ns();
            if deadline_ns.is_some_and(|d| now >= d) {
                try_once!(s);
                return Err(WaitEnd::Timeout);
            }
            if now - last_check >= interval {
                last_check = now;
                if !s.peer_alive() {
                    try_once!(s);
                    return Err(WaitEnd::Disconnected);
                }
            }
        }

        // Sleep phase.
        let sleep_start = now;
        loop {
            s.announce_sleep();
            match attempt(s) {
                Attempt::NotYet => {}
                other => {
                    s.cancel_sleep();
                    if let Attempt::Ready(_) = other {
                        self.after_sleep(clock::now_ns().saturating_sub(sleep_start));
                    }
                    match other {
                        Attempt::Ready(t) => return Ok(t),
                        Attempt::Disconnected => return Err(WaitEnd::Disconnected),
                        Attempt::Fail(e) => return Err(WaitEnd::Fail(e)),
                        Attempt::NotYet => unreachable!(),
                    }
                }
            }
            let mut timeout = interval
                .saturating_sub(now.saturating_sub(last_check))
                .max(1);
            if let Some(d) = deadline_ns {
                timeout = timeout.min(d.saturating_sub(now).max(1));
            }
            s.sleep(Some(timeout));
            now = clock::now_ns();
            if deadline_ns.is_some_and(|d| now >= d) {
                try_once!(s);
                return Err(WaitEnd::Timeout);
            }
            if now - last_check >= interval {
                last_check = now;
                if !s.peer_alive() {
                    try_once!(s);
                    return Err(WaitEnd::Disconnected);
                }
            }
        }
    }

    fn adapt(&mut self, budget: u64) {
        self.spin_budget_ns = budget.clamp(MIN_SPIN_NS, MAX_SPIN_NS);
    }

    fn after_sleep(&mut self, slept_ns: u64) {
        if self.mode != Wait::Adaptive {
            return;
        }
        if slept_ns <= MAX_SPIN_NS {
            // Spinning a little longer would have caught it.
            self.adapt(self.spin_budget_ns.max(2 * slept_ns));
        } else {
            self.adapt(self.spin_budget_ns / 2);
        }
    }

    /// The current spin budget of [`Wait::Adaptive`].
    pub(crate) fn spin_budget(&self) -> Duration {
        Duration::from_nanos(self.spin_budget_ns)
    }
}

/// Deadline `timeout` from now, in `CLOCK_MONOTONIC` ns.
pub(crate) fn deadline_after(timeout: Duration) -> u64 {
    clock::now_ns().saturating_add(clock::ns(timeout))
}
