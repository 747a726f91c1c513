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
//! Active threads do not all need the same: a decoder thread beside a light control thread, a
//! worker beside a logger. An even split throttles the one that needs more while the other
//! leaves part of its share unused (a `SCHED_DEADLINE` thread cannot lend its budget to
//! another), so the active share follows demand too ([`weighted_shares`]): each thread's demand
//! is its peak use over the last [`QUIET_SAMPLES`] samples plus [`HEADROOM`]; a thread that used
//! nearly all of its share ([`SATURATED`]) may need more than it could show, so it counts as
//! wanting as much as it can get. Water-filling (max-min fairness) then gives every thread its
//! demand while the budget lasts and splits what is left equally between the threads that want
//! more; when every demand is met, the surplus is spread evenly on top. Shares are recomputed
//! only when they are out of balance ([`DemandTracker::observe`]): a saturated thread beside one
//! holding clearly more than it needs, or the reverse, so a steady cell is left alone.
//!
//! Cost: a wake-up of an idle thread that then keeps running is served by its standby slice
//! until the next sample (one sampling interval) and the change of shares that follows; a thread
//! whose load rises beyond its share waits one sample for the next split; the sampling itself is
//! one small `/proc` read per thread per interval.

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

/// Margin over a thread's peak use that its share keeps: load varies from one sample to the
/// next, and a share cut to the last sample's use would throttle the next burst.
pub const HEADROOM: f64 = 1.3;
/// A thread that used at least this fraction of its share is saturated: it may want more.
pub const SATURATED: f64 = 0.85;
/// A share is out of balance when it differs from the demand-weighted one by more than this
/// fraction of the hart's budget (hysteresis: a steady cell is not re-split every sample).
pub const REBALANCE: f64 = 0.1;

#[derive(Debug, Clone, Copy)]
struct Seen {
    cpu_ns: u64,
    quiet: u32,
    /// Fraction of a hart used in each of the last [`QUIET_SAMPLES`] sampling intervals.
    used: [f64; QUIET_SAMPLES as usize],
    /// Next slot of `used`.
    next: usize,
    /// The share (fraction of a hart) it was given by the last split, if any.
    share: Option<f64>,
}

impl Seen {
    fn new(cpu_ns: u64) -> Seen {
        Seen {
            cpu_ns,
            quiet: 0,
            used: [0.0; QUIET_SAMPLES as usize],
            next: 0,
            share: None,
        }
    }

    fn active(&self) -> bool {
        self.quiet < QUIET_SAMPLES
    }

    /// Peak use over the recent samples, as a fraction of a hart.
    fn peak(&self) -> f64 {
        self.used.iter().copied().fold(0.0, f64::max)
    }

    /// Its demand: peak use plus headroom; `None` when saturated or without a share to judge.
    fn demand(&self) -> Demand {
        (self.share.is_some() && !self.saturated()).then(|| self.peak() * HEADROOM)
    }

    fn saturated(&self) -> bool {
        self.share.is_some_and(|s| {
            self.used[(self.next + QUIET_SAMPLES as usize - 1) % QUIET_SAMPLES as usize]
                >= SATURATED * s
        })
    }
}

/// A thread's demand for [`weighted_shares`]: a fraction of a hart, or `None` for "as much as it
/// can get" (saturated).
pub type Demand = Option<f64>;

/// Divides `budget` (a fraction of a hart) between threads with `demands` by water-filling:
/// the smallest demands are met first, the threads whose demand the level does not reach (and
/// the saturated ones) share what is left equally; if every demand is met, the surplus is
/// spread evenly on top. Every share is at least `floor`; the shares sum to `budget` (when
/// `floor * n <= budget`).
pub fn weighted_shares(budget: f64, floor: f64, demands: &[Demand]) -> Vec<f64> {
    let n = demands.len();
    if n == 0 {
        return Vec::new();
    }
    let want: Vec<f64> = demands
        .iter()
        .map(|d| d.map_or(f64::INFINITY, |x| x.max(floor)))
        .collect();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| want[a].total_cmp(&want[b]));
    let mut shares = vec![0.0; n];
    let mut left = budget;
    for (k, &i) in order.iter().enumerate() {
        let level = left / (n - k) as f64;
        if want[i] <= level {
            shares[i] = want[i];
            left -= want[i];
        } else {
            // from here on every demand is above the level: they split what is left
            for &j in &order[k..] {
                shares[j] = level;
            }
            return shares;
        }
    }
    // every demand met: the surplus on top, evenly
    let extra = left / n as f64;
    shares.iter_mut().for_each(|s| *s += extra);
    shares
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
    /// When each cell was last sampled (`CLOCK_MONOTONIC` ns).
    sampled_at: HashMap<String, u64>,
}

impl DemandTracker {
    /// Records one sample of `cell`'s threads (`read` samples a thread; `None` for a thread that
    /// is gone). Returns whether the cell's shares must be recomputed: a thread changed between
    /// active and idle, appeared or left, or the active shares are out of balance with the
    /// threads' demands.
    pub fn observe(
        &mut self,
        cell: &str,
        tids: &[i32],
        read: impl Fn(i32) -> Option<Sample>,
    ) -> bool {
        self.observe_at(cell, tids, read, tess_sched::clock::now_ns())
    }

    /// [`observe`](Self::observe) at `now_ns` (`CLOCK_MONOTONIC`): the sampling interval a
    /// thread's use is measured over is the time since the cell's last sample.
    pub fn observe_at(
        &mut self,
        cell: &str,
        tids: &[i32],
        read: impl Fn(i32) -> Option<Sample>,
        now_ns: u64,
    ) -> bool {
        let last = self.sampled_at.insert(cell.to_string(), now_ns);
        let interval_ns = last.map_or(0, |l| now_ns.saturating_sub(l));
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
                    if interval_ns > 0 {
                        s.used[s.next] = now.saturating_sub(s.cpu_ns) as f64 / interval_ns as f64;
                        s.next = (s.next + 1) % QUIET_SAMPLES as usize;
                    }
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
                    seen.insert(tid, Seen::new(now));
                }
            }
        }
        changed || self.out_of_balance(cell)
    }

    /// Whether the active threads' shares are out of balance with their demands: some
    /// thread's share differs from what [`weighted_shares`] would give it now by more than
    /// [`REBALANCE`] of their budget (a saturated thread beside one holding clearly more than it
    /// needs; or two saturated threads with unequal shares, neither of which can show that it
    /// wants more). Only threads that run on one budget are compared: the shares of a cell's
    /// harts are judged hart by hart by the caller's split, so this looks at all active threads
    /// together, which is exact for a one-hart cell and conservative (more re-splits) otherwise.
    fn out_of_balance(&self, cell: &str) -> bool {
        let Some(seen) = self.cells.get(cell) else {
            return false;
        };
        let active: Vec<&Seen> = seen.values().filter(|s| s.active()).collect();
        let Some(shares) = active.iter().map(|s| s.share).collect::<Option<Vec<f64>>>() else {
            return false;
        };
        let budget: f64 = shares.iter().sum();
        let demands: Vec<Demand> = active.iter().map(|s| s.demand()).collect();
        let target = weighted_shares(budget, 0.0, &demands);
        shares
            .iter()
            .zip(&target)
            .any(|(s, t)| (s - t).abs() > REBALANCE * budget)
    }

    /// `tid`'s demand for [`weighted_shares`] (`None`: saturated, or not sampled long enough
    /// to know).
    pub fn demand(&self, cell: &str, tid: i32) -> Demand {
        self.cells.get(cell)?.get(&tid)?.demand()
    }

    /// Records the share `tid` of `cell` was given (a fraction of a hart; `None`: no active
    /// share), against which its use is judged.
    pub fn record_share(&mut self, cell: &str, tid: i32, share: Option<f64>) {
        if let Some(s) = self.cells.get_mut(cell).and_then(|c| c.get_mut(&tid)) {
            s.share = share;
        }
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
        self.sampled_at.remove(cell);
    }
}

/// The runtimes per period of active threads with `demands` sharing `budget` per `period`
/// ([`weighted_shares`]), in whole nanoseconds: each at least [`MIN_THREAD_SLICE`] and together
/// never more than `budget` (the caller's split guarantees `budget` holds a minimum slice per
/// thread).
pub fn active_runtimes(budget: Duration, period: Duration, demands: &[Demand]) -> Vec<Duration> {
    let p = period.as_nanos() as f64;
    let shares = weighted_shares(
        budget.as_nanos() as f64 / p,
        MIN_THREAD_SLICE.as_nanos() as f64 / p,
        demands,
    );
    let min = MIN_THREAD_SLICE.as_nanos() as u64;
    let mut ns: Vec<u64> = shares.iter().map(|s| ((s * p) as u64).max(min)).collect();
    // Rounding (or floors) may overshoot by a few ns: take it from the largest shares.
    let total = budget.as_nanos() as u64;
    let mut over = ns.iter().sum::<u64>().saturating_sub(total);
    while over > 0 {
        let Some(big) = (0..ns.len())
            .filter(|&i| ns[i] > min)
            .max_by_key(|&i| ns[i])
        else {
            break;
        };
        let take = over.min(ns[big] - min);
        ns[big] -= take;
        over -= take;
    }
    ns.into_iter().map(Duration::from_nanos).collect()
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
    fn water_filling_meets_small_demands_and_splits_the_rest() {
        // a light thread's demand is met, two saturated ones share the rest
        let s = weighted_shares(0.5, 0.002, &[Some(0.05), None, None]);
        assert!((s[0] - 0.05).abs() < 1e-12);
        assert!((s[1] - 0.225).abs() < 1e-12 && (s[2] - 0.225).abs() < 1e-12);
        // a demand above the level is cut to it
        let s = weighted_shares(0.3, 0.002, &[Some(0.25), None]);
        assert_eq!(s, vec![0.15, 0.15]);
        // every demand met: the surplus spread evenly on top
        let s = weighted_shares(0.6, 0.002, &[Some(0.1), Some(0.2)]);
        assert!((s[0] - 0.25).abs() < 1e-12 && (s[1] - 0.35).abs() < 1e-12);
        // nothing known: an even split
        assert_eq!(weighted_shares(0.4, 0.002, &[None, None]), vec![0.2, 0.2]);
        // floors hold
        let s = weighted_shares(0.4, 0.01, &[Some(0.0), None]);
        assert_eq!(s, vec![0.01, 0.39]);
        assert!(weighted_shares(0.4, 0.01, &[]).is_empty());
    }

    #[test]
    fn active_runtimes_never_exceed_the_budget_and_keep_the_minimum() {
        let period = Duration::from_millis(10);
        for budget_us in [60u64, 333, 2000, 9000] {
            let budget = Duration::from_micros(budget_us);
            for demands in [
                vec![None, None, None],
                vec![Some(0.0), None, Some(0.013)],
                vec![Some(0.5), Some(0.5), Some(0.5)],
                vec![Some(1e-9), Some(0.0333333), None],
            ] {
                let r = active_runtimes(budget, period, &demands);
                let total: Duration = r.iter().sum();
                assert!(total <= budget, "{budget_us} {demands:?}: {r:?}");
                assert!(r.iter().all(|&x| x >= MIN_THREAD_SLICE), "{r:?}");
                assert!(
                    budget - total <= Duration::from_nanos(3),
                    "{budget_us} {demands:?}: {r:?}"
                );
            }
        }
    }

    #[test]
    fn a_saturated_thread_beside_a_light_one_rebalances_then_stays() {
        // two active threads with even shares of 0.2 each; thread 1 uses all of its share,
        // thread 2 a twentieth of a hart
        let cpu = RefCell::new(HashMap::from([(1, 0u64), (2, 0u64)]));
        let read = |t: i32| {
            cpu.borrow().get(&t).map(|&cpu_ns| Sample {
                cpu_ns,
                runnable: false,
            })
        };
        let mut d = DemandTracker::default();
        let now = RefCell::new(1_000_000_000u64);
        d.observe_at("c", &[1, 2], read, *now.borrow());
        assert_eq!(d.demand("c", 1), None, "no share recorded yet: unknown");
        d.record_share("c", 1, Some(0.2));
        d.record_share("c", 2, Some(0.2));
        let step = |d: &mut DemandTracker, u1: f64, u2: f64| {
            // one 20 ms sampling interval in which the threads used u1 and u2 of a hart
            let dt = 20_000_000u64;
            *now.borrow_mut() += dt;
            *cpu.borrow_mut().get_mut(&1).unwrap() += (u1 * dt as f64) as u64;
            *cpu.borrow_mut().get_mut(&2).unwrap() += (u2 * dt as f64) as u64;
            d.observe_at("c", &[1, 2], read, *now.borrow())
        };
        assert!(
            step(&mut d, 0.2, 0.05),
            "saturated beside slack: out of balance"
        );
        assert_eq!(d.demand("c", 1), None, "saturated: wants more");
        let light = d.demand("c", 2).unwrap();
        assert!(light > 0.05 && light < 0.08, "{light}");
        let r = active_runtimes(
            Duration::from_micros(4000),
            Duration::from_millis(10),
            &[d.demand("c", 1), d.demand("c", 2)],
        );
        assert!(r[0] > Duration::from_micros(3100), "{r:?}");
        d.record_share("c", 1, Some(r[0].as_secs_f64() / 0.01));
        d.record_share("c", 2, Some(r[1].as_secs_f64() / 0.01));
        // the heavy thread still uses all of its larger share, the light one its twentieth
        let heavy = r[0].as_secs_f64() / 0.01;
        assert!(!step(&mut d, heavy, 0.05), "balanced now: left alone");
        // The light thread's load rises past its share: both saturated, shares unequal. Neither
        // can show it wants more, so the split must go back to even.
        let light_share = r[1].as_secs_f64() / 0.01;
        assert!(
            step(&mut d, heavy, light_share),
            "two saturated, unequal shares: re-split"
        );
        assert_eq!((d.demand("c", 1), d.demand("c", 2)), (None, None));
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
