//! Which threads of a reserved cell need its budget now ("the budget follows the work").
//!
//! Linux reservations belong to threads, but a cell's budget belongs to the cell (issue 11
//! part 7; seed 002's `qres_wrap` serves every thread of a program from one server). An even
//! split gives an idle `timeout` wrapper or a sleeping helper thread as much as the thread that
//! works, so the working thread is throttled at a fraction of what the cell reserved.
//!
//! tessd therefore samples each thread every few tens of milliseconds: its CPU time
//! (`/proc/TID/schedstat`) and whether it is runnable (`/proc/TID/stat`). A thread that ran since
//! the last sample (more than [`NEGLIGIBLE_CPU_NS`]) or is runnable now is *active*; one that has
//! done neither for
//! [`QUIET_SAMPLES`] samples in a row is *idle*. Runnable counts because a busy thread can be
//! throttled through a whole sample: without `HRTICK_DL` the kernel notices an exhausted budget
//! only at the next tick, so a thread holding a small standby slice overruns it by up to a tick
//! and then waits many periods to repay the overrun, running not at all in between. On each hart the active threads share the budget
//! evenly and every idle thread keeps a small standby slice ([`standby_slice`]), so that it runs
//! at once when it wakes (with its own deadline) until the next sample gives it an active share.
//! The slices always sum to the budget, so admission stays exact: the cell never holds more than
//! it reserved, whichever of its threads use it.
//!
//! Cost: a wake-up of an idle thread that then keeps running is served by its standby slice
//! until the next sample (one sampling interval) and the change of shares that follows; the
//! sampling itself is one small `/proc` read per thread per interval.

use std::collections::HashMap;
use std::time::Duration;
use tess_core::layout::{Reservation, MIN_THREAD_SLICE};

/// Samples without CPU time after which a thread counts as idle. Several samples, so that a
/// thread that works in bursts (a frame every 40 ms) keeps its share between bursts.
pub const QUIET_SAMPLES: u32 = 5;
/// CPU time since the last sample that still counts as none: a housekeeping thread that wakes
/// every 100 ms to look at a flag (a heartbeat's registration thread, a timer) runs a few
/// microseconds each time and would otherwise never turn idle, holding an active share its
/// standby slice covers many times over. (Found in `tess bench conference`: the indexer's one
/// working thread got half its cell's budget, the registration thread the other half.)
pub const NEGLIGIBLE_CPU_NS: u64 = 50_000;

#[derive(Debug, Clone, Copy)]
struct Seen {
    cpu_ns: u64,
    quiet: u32,
}

impl Seen {
    fn active(&self) -> bool {
        self.quiet < QUIET_SAMPLES
    }
}

/// One sample of a thread: its CPU time in nanoseconds and whether it is runnable now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// CPU time so far.
    pub cpu_ns: u64,
    /// Runnable now (running, waiting for a hart, or throttled).
    pub runnable: bool,
}

/// Reads a thread's [`Sample`] from `/proc`; `None` if it is gone.
pub fn sample(tid: i32) -> Option<Sample> {
    Some(Sample {
        cpu_ns: tess_sched::proc::task_cpu_ns(tid)?,
        runnable: tess_sched::proc::task_runnable(tid)?,
    })
}

/// CPU-time samples of the threads of every reserved cell.
#[derive(Debug, Default)]
pub struct DemandTracker {
    cells: HashMap<String, HashMap<i32, Seen>>,
}

impl DemandTracker {
    /// Records one sample of `cell`'s threads (`read` samples a thread; `None` for a thread that
    /// is gone). Returns whether a thread changed between active and idle, or
    /// appeared or left: the cell's shares must then be recomputed.
    pub fn observe(
        &mut self,
        cell: &str,
        tids: &[i32],
        read: impl Fn(i32) -> Option<Sample>,
    ) -> bool {
        let seen = self.cells.entry(cell.to_string()).or_default();
        let mut changed = seen.len() != tids.len() || tids.iter().any(|t| !seen.contains_key(t));
        seen.retain(|t, _| tids.contains(t));
        for &tid in tids {
            let Some(Sample {
                cpu_ns: now,
                runnable,
            }) = read(tid)
            else {
                continue;
            };
            match seen.get_mut(&tid) {
                Some(s) => {
                    let was = s.active();
                    s.quiet = if now > s.cpu_ns + NEGLIGIBLE_CPU_NS || runnable {
                        0
                    } else {
                        s.quiet.saturating_add(1)
                    };
                    s.cpu_ns = now;
                    changed |= was != s.active();
                }
                None => {
                    // A thread seen for the first time counts as active: it was just created or
                    // just joined, and most likely runs.
                    seen.insert(
                        tid,
                        Seen {
                            cpu_ns: now,
                            quiet: 0,
                        },
                    );
                }
            }
        }
        changed
    }

    /// Whether `tid` of `cell` needs an active share. Threads never sampled count as active, so
    /// without sampling every thread gets an even share.
    pub fn is_active(&self, cell: &str, tid: i32) -> bool {
        self.cells
            .get(cell)
            .and_then(|c| c.get(&tid))
            .is_none_or(Seen::active)
    }

    /// Forgets a cell (deleted, or no longer reserved).
    pub fn forget(&mut self, cell: &str) {
        self.cells.remove(cell);
    }
}

/// The slice an idle thread keeps: 1/64 of the budget, at least [`MIN_THREAD_SLICE`].
pub fn standby_slice(budget: Duration) -> Duration {
    (budget / 64).max(MIN_THREAD_SLICE)
}

/// How one hart's budget is divided between `active` and `idle` threads: the reservation of an
/// active thread and of an idle one. Falls back to an even split when no thread is active, when
/// all are, or when the idle threads' standby slices would take more than a quarter of the
/// budget (many sleeping threads: then nobody's share would be worth following).
pub fn split(res: &Reservation, active: usize, idle: usize) -> Option<(Reservation, Reservation)> {
    let n = active + idle;
    let even = res.per_thread(n)?;
    if active == 0 || idle == 0 {
        return Some((even, even));
    }
    let standby = standby_slice(res.runtime);
    let reserved_for_idle = standby * idle as u32;
    if reserved_for_idle * 4 > res.runtime {
        return Some((even, even));
    }
    let per_active = (res.runtime - reserved_for_idle) / active as u32;
    if per_active < MIN_THREAD_SLICE {
        return Some((even, even));
    }
    Some((
        Reservation {
            runtime: per_active,
            ..*res
        },
        Reservation {
            runtime: standby,
            ..*res
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    fn res(runtime_us: u64) -> Reservation {
        Reservation {
            runtime: Duration::from_micros(runtime_us),
            deadline: Duration::from_millis(10),
            period: Duration::from_millis(10),
            offset: None,
        }
    }

    #[test]
    fn shares_always_sum_to_the_budget() {
        for budget in [100u64, 2000, 9000] {
            for active in 0..6usize {
                for idle in 0..6usize {
                    let r = res(budget);
                    let Some((a, i)) = split(&r, active, idle) else {
                        assert!(r.per_thread(active + idle).is_none());
                        continue;
                    };
                    let total = a.runtime * active as u32 + i.runtime * idle as u32;
                    assert!(total <= r.runtime, "{budget} {active} {idle}: {total:?}");
                    // Integer division loses at most a nanosecond per thread.
                    let lost = r.runtime - total;
                    assert!(lost.as_nanos() <= (active + idle) as u128, "{lost:?}");
                    assert!(a.runtime >= MIN_THREAD_SLICE && i.runtime >= MIN_THREAD_SLICE);
                }
            }
        }
    }

    #[test]
    fn one_busy_thread_among_sleepers_gets_nearly_all() {
        let (a, i) = split(&res(2000), 1, 3).unwrap();
        assert_eq!(i.runtime, Duration::from_nanos(31_250));
        assert_eq!(a.runtime, Duration::from_micros(2000) - i.runtime * 3);
        assert!(a.utilization() > 0.19);
    }

    #[test]
    fn many_sleepers_fall_back_to_an_even_split() {
        let r = res(2000);
        let (a, i) = split(&r, 1, 20).unwrap();
        assert_eq!(a, i);
        assert_eq!(a, r.per_thread(21).unwrap());
    }

    #[test]
    fn a_thread_turns_idle_only_after_quiet_samples_and_active_at_once() {
        let cpu = RefCell::new(HashMap::from([(1, 100u64), (2, 100u64)]));
        let runnable = RefCell::new(false);
        let read = |t: i32| {
            cpu.borrow().get(&t).map(|&cpu_ns| Sample {
                cpu_ns,
                runnable: t == 2 && *runnable.borrow(),
            })
        };
        let mut d = DemandTracker::default();
        assert!(d.observe("c", &[1, 2], read), "new threads change the cell");
        assert!(d.is_active("c", 1) && d.is_active("c", 2));
        for k in 0..QUIET_SAMPLES {
            *cpu.borrow_mut().get_mut(&1).unwrap() += NEGLIGIBLE_CPU_NS + 1;
            // Thread 2 wakes for a moment every sample: still quiet.
            *cpu.borrow_mut().get_mut(&2).unwrap() += NEGLIGIBLE_CPU_NS;
            let changed = d.observe("c", &[1, 2], read);
            assert_eq!(changed, k + 1 == QUIET_SAMPLES, "sample {k}");
        }
        assert!(d.is_active("c", 1));
        assert!(!d.is_active("c", 2));
        *cpu.borrow_mut().get_mut(&2).unwrap() += NEGLIGIBLE_CPU_NS + 1;
        assert!(
            d.observe("c", &[1, 2], read),
            "a waking thread is active at once"
        );
        assert!(d.is_active("c", 2));
        for _ in 0..QUIET_SAMPLES {
            d.observe("c", &[1, 2], read);
        }
        assert!(!d.is_active("c", 2));
        *runnable.borrow_mut() = true;
        assert!(
            d.observe("c", &[1, 2], read),
            "a throttled thread (runnable, no CPU time) is active"
        );
        assert!(d.is_active("c", 2));
        assert!(
            d.observe("c", &[1], read),
            "a thread that left changes the cell"
        );
        assert!(!d.observe("c", &[1], read));
        assert!(d.is_active("other", 7), "never sampled: active");
        d.forget("c");
        assert!(d.is_active("c", 2));
    }
}
