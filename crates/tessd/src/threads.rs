//! Keeping every thread of a reserved cell under its `SCHED_DEADLINE` reservation.
//!
//! Linux reservations belong to threads, while a cell's budget belongs to the cell: on each hart
//! the cell's budget `C` is divided between the threads placed there, the working ones sharing it
//! evenly and idle ones keeping a standby slice ([`demand`]: the budget follows the work), each
//! getting `(share, D, P)` (the deadline stays, so the threads of a time-triggered cell share one
//! window).
//! A thread is placed on the least-populated of the cell's thread slots (one per hart) and
//! pinned there. Deadline threads carry `SCHED_FLAG_RESET_ON_FORK`, without which the kernel
//! refuses to let them fork; new threads therefore start under CFS and are promoted by the next
//! [`ThreadManager::sync`] (run on fork events and periodically). Until then the cell's CFS
//! bandwidth limit bounds what they can take.
//!
//! Order matters because the kernel does its own admission per root domain: budgets shrink and
//! threads leave `SCHED_DEADLINE` before others grow or join, and a thread changes hart only
//! while it is not a deadline thread (its affinity must always span its root domain).
//!
//! Leaving `SCHED_DEADLINE` is done in two steps, shrink then demote. On Linux 6.18 a thread
//! that leaves `SCHED_DEADLINE` while blocked never returns its bandwidth to the root domain's
//! admission pool (measured: eight demote/promote cycles of a sleeping 10% thread left 10% of a
//! hart admissible; only a root-domain rebuild recovers it). Parameter changes of a deadline
//! thread, by contrast, are accounted at once. So a thread is first shrunk in place to
//! [`VANISHING`] (2 us per second) and only then demoted: whatever leaks is negligible.
//!
//! Event-triggered cells on cgroup v1 are not split: one RT group server serves all their
//! threads ([`group`]). Time-triggered cells keep per-thread windows, which gang-aligned windows
//! need.
//!
//! Time-triggered threads join `SCHED_DEADLINE` at a window start on the `CLOCK_MONOTONIC` grid
//! `k * P + offset`: a thread that stays runnable then runs exactly in its window every period
//! (the replenishment timer fires at each period boundary); one that blocks keeps the phase as
//! long as it wakes within the next period (the kernel's revised wake-up rule for constrained
//! deadlines). The cell runtime keeps the phase for programs that sleep longer.

mod demand;
mod group;

pub use demand::DemandTracker;
pub use group::group_policy;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;
use tess_cgroup::Backend;
use tess_core::layout::{CellLayout, Reservation};
use tess_sched::attr::{self, FLAG_RESET_ON_FORK};
use tess_sched::{affinity, clock, HartSet, Policy, SchedError};

/// How far in the future a time-triggered promotion is scheduled, so that the daemon is awake
/// and spinning before the window starts.
const ALIGN_MARGIN: Duration = Duration::from_micros(300);
/// The last stretch before a window start is spun rather than slept (wake-ups are tens of
/// microseconds late on a virtual machine).
const ALIGN_SPIN: Duration = Duration::from_micros(100);

/// The reservation a thread is shrunk to before it leaves `SCHED_DEADLINE` (module docs):
/// 2 us every second, 2 parts per million of a hart.
const VANISHING: Policy = Policy::Deadline {
    runtime: Duration::from_micros(2),
    deadline: Duration::from_secs(1),
    period: Duration::from_secs(1),
};

/// Takes a thread out of `SCHED_DEADLINE` without leaking its bandwidth (module docs).
fn demote(tid: i32) -> Result<(), SchedError> {
    ok_or_gone(attr::set_policy(tid, VANISHING, FLAG_RESET_ON_FORK))?;
    ok_or_gone(attr::set_policy(tid, Policy::OTHER, 0))
}

/// Where a thread sits: its cell and the harts of its slot.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Placement {
    cell: String,
    harts: HartSet,
}

/// What [`ThreadManager::sync`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SyncReport {
    /// Threads now under the reservation.
    pub reserved: usize,
    /// Threads left under CFS (more threads than the budget can be split between).
    pub overflow: usize,
    /// `sched_setattr` calls made.
    pub changes: usize,
    /// Time-triggered threads whose window changed in place: their phase is re-aligned by
    /// [`ThreadManager::rephase`] at the next window start.
    pub rephase: bool,
    /// Threads pinned to their hart but still asleep on another one: the kernel lets a thread
    /// become a deadline thread only from a runqueue inside its root domain, and a sleeping
    /// thread moves only when it wakes. They are promoted by a later sync.
    pub pending: usize,
}

/// Tracks which thread of which cell sits in which slot.
#[derive(Debug, Default)]
pub struct ThreadManager {
    placed: HashMap<i32, Placement>,
    /// Cells with threads waiting to be promoted (see [`SyncReport::pending`]).
    pending: std::collections::BTreeSet<String>,
    /// Which threads work and which sleep, so the budget follows the work ([`demand`]).
    demand: DemandTracker,
}

/// Error from thread management.
#[derive(Debug, thiserror::Error)]
pub enum ThreadError {
    /// The cgroup could not be read.
    #[error(transparent)]
    Cgroup(#[from] tess_cgroup::CgroupError),
    /// A scheduling call failed.
    #[error("cell '{cell}': {source}")]
    Sched {
        /// Cell.
        cell: String,
        /// Cause.
        #[source]
        source: SchedError,
    },
    /// Pinning failed.
    #[error("cell '{cell}': cannot pin thread {tid} to harts {harts}: {source}")]
    Affinity {
        /// Cell.
        cell: String,
        /// Thread.
        tid: i32,
        /// Target.
        harts: HartSet,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// Gives every thread of `tids` without a slot the least populated slot (lowest on ties);
/// `count[s]` is how many threads slot `s` holds.
fn place_remaining(tids: &[i32], slot_of: &mut BTreeMap<i32, usize>, count: &mut [usize]) {
    for &tid in tids {
        if slot_of.contains_key(&tid) {
            continue;
        }
        let s = (0..count.len()).min_by_key(|&s| (count[s], s)).unwrap_or(0);
        if let Some(c) = count.get_mut(s) {
            *c += 1;
        }
        slot_of.insert(tid, s);
    }
}

fn deadline(r: &Reservation) -> Policy {
    Policy::Deadline {
        runtime: r.runtime,
        deadline: r.deadline,
        period: r.period,
    }
}

impl ThreadManager {
    /// Cells with threads waiting to be promoted: housekeeping retries them every few
    /// milliseconds until they are done.
    pub fn pending_cells(&self) -> Vec<String> {
        self.pending.iter().cloned().collect()
    }

    /// The cell a tracked thread belongs to.
    pub fn cell_of(&self, tid: i32) -> Option<&str> {
        self.placed.get(&tid).map(|p| p.cell.as_str())
    }

    /// Samples the CPU time of `cell`'s threads; `true` if the cell's shares must be recomputed
    /// (a thread started or stopped working, or came or went): the caller then runs
    /// [`ThreadManager::sync`].
    pub fn observe_demand(
        &mut self,
        backend: &dyn Backend,
        cell: &str,
        layout: &CellLayout,
    ) -> Result<bool, ThreadError> {
        if layout.reservation.is_none() || layout.group_server {
            return Ok(false);
        }
        let tids = backend.threads(cell)?;
        Ok(self.demand.observe(cell, &tids, demand::sample))
    }

    /// Takes every thread of `cell` out of `SCHED_DEADLINE` and lets it run on `cpus`; used
    /// before a cell is deleted, stops being reserved, or changes harts.
    pub fn release(
        &mut self,
        backend: &dyn Backend,
        cell: &str,
        cpus: &HartSet,
    ) -> Result<usize, ThreadError> {
        self.placed.retain(|_, p| p.cell != cell);
        self.demand.forget(cell);
        let mut n = 0;
        for tid in backend.threads(cell)? {
            let Ok((policy, _)) = attr::get_policy(tid) else {
                continue;
            };
            if policy.is_deadline() {
                demote(tid).map_err(|source| ThreadError::Sched {
                    cell: cell.into(),
                    source,
                })?;
                n += 1;
            } else if group::is_group_served(policy)
                || (matches!(policy, Policy::Fifo { .. } | Policy::RoundRobin { .. })
                    && backend.in_cpu_group(cell, tid))
            {
                // Out of real time before the cell's RT bandwidth goes: tess's own SCHED_RR,
                // and any thread that raised itself inside a group server (outside the group
                // nothing would throttle it). Dedicated cells live in the cpu root: untouched.
                ok_or_gone(attr::set_policy(tid, Policy::OTHER, 0)).map_err(|source| {
                    ThreadError::Sched {
                        cell: cell.into(),
                        source,
                    }
                })?;
                n += 1;
            }
            if !cpus.is_empty() {
                let _ = affinity::set_affinity(tid, cpus);
            }
        }
        Ok(n)
    }

    /// Takes the deadline threads of `cell` that sit outside `keep` out of `SCHED_DEADLINE` and
    /// lets them run on `keep` (before the cell's cpuset shrinks to `keep`: a deadline thread
    /// cannot be moved out of its root domain). The next sync places them again.
    pub fn evict(
        &mut self,
        backend: &dyn Backend,
        cell: &str,
        keep: &HartSet,
    ) -> Result<usize, ThreadError> {
        let mut n = 0;
        for tid in backend.threads(cell)? {
            let aff = match self.placed.get(&tid).filter(|p| p.cell == cell) {
                Some(p) => p.harts.clone(),
                None => affinity::get_affinity(tid).unwrap_or_default(),
            };
            if aff.is_subset(keep) {
                continue;
            }
            if matches!(attr::get_policy(tid), Ok((Policy::Deadline { .. }, _))) {
                demote(tid).map_err(|source| ThreadError::Sched {
                    cell: cell.into(),
                    source,
                })?;
                n += 1;
            }
            let _ = affinity::set_affinity(tid, keep);
            self.placed.remove(&tid);
        }
        Ok(n)
    }

    /// Brings every thread of reserved cell `cell` under its reservation.
    pub fn sync(
        &mut self,
        backend: &dyn Backend,
        cell: &str,
        layout: &CellLayout,
    ) -> Result<SyncReport, ThreadError> {
        let Some(res) = layout.reservation else {
            return Ok(SyncReport::default());
        };
        if layout.group_server {
            return self.sync_group(backend, cell, layout);
        }
        let slots = &layout.thread_slots;
        let mut tids = backend.threads(cell)?;
        tids.sort_unstable();
        let present: std::collections::HashSet<i32> = tids.iter().copied().collect();
        self.placed
            .retain(|tid, p| p.cell != cell || present.contains(tid));
        // Slot assignment: keep, else least populated.
        let mut count = vec![0usize; slots.len()];
        let mut slot_of: BTreeMap<i32, usize> = BTreeMap::new();
        // A thread stays where it is when its affinity is one of the slots: a resize never moves
        // a thread that can stay, and a thread that pinned itself to a free hart before it was
        // promoted keeps that hart. Threads tess placed before come first; a newcomer keeps its
        // hart only if nobody else holds it.
        // Where each thread is: the harts tess placed it on, else its affinity (a cpuset that
        // grows widens its tasks' affinity, so tess's own record comes first).
        let affinity_of: BTreeMap<i32, HartSet> = tids
            .iter()
            .map(|&t| {
                let placed = self
                    .placed
                    .get(&t)
                    .filter(|p| p.cell == cell)
                    .map(|p| p.harts.clone());
                (
                    t,
                    placed.unwrap_or_else(|| affinity::get_affinity(t).unwrap_or_default()),
                )
            })
            .collect();
        let tracked = |tid: &i32| self.placed.get(tid).is_some_and(|p| p.cell == cell);
        let (known, newcomers): (Vec<i32>, Vec<i32>) = tids.iter().copied().partition(tracked);
        for (tid, is_known) in known
            .iter()
            .map(|t| (*t, true))
            .chain(newcomers.iter().map(|t| (*t, false)))
        {
            let aff = &affinity_of[&tid];
            let keep = (0..slots.len())
                .filter(|&s| slots[s] == *aff && (is_known || count[s] == 0))
                .min_by_key(|&s| (count[s], s));
            if let Some(s) = keep {
                count[s] += 1;
                slot_of.insert(tid, s);
            }
        }
        place_remaining(&tids, &mut slot_of, &mut count);
        // Desired policy per thread: the first `max_threads` of each slot share the budget, the
        // active ones evenly, the idle ones a standby slice each ([`demand`]).
        let max = res.max_threads();
        let mut rank = vec![0usize; slots.len()];
        let mut members: Vec<Vec<i32>> = vec![Vec::new(); slots.len()];
        let mut plan: Vec<(i32, usize, Option<Reservation>)> = Vec::new();
        for (&tid, &s) in &slot_of {
            if rank[s] < max {
                members[s].push(tid);
            } else {
                plan.push((tid, s, None));
            }
            rank[s] += 1;
        }
        for (s, tids) in members.iter().enumerate() {
            let (active, idle): (Vec<i32>, Vec<i32>) =
                tids.iter().partition(|&&t| self.demand.is_active(cell, t));
            let shares = demand::split(&res, active.len(), idle.len());
            // The active threads' part of the budget, divided by demand (an even split when no
            // demand is known yet); none at all when the budget cannot be split.
            let active_shares: Vec<Option<Reservation>> = match shares {
                Some((a, _)) => {
                    let demands: Vec<demand::Demand> = active
                        .iter()
                        .map(|&t| self.demand.demand(cell, t))
                        .collect();
                    let budget = a.runtime * active.len() as u32;
                    demand::active_runtimes(budget, res.period, &demands)
                        .into_iter()
                        .map(|runtime| Some(Reservation { runtime, ..a }))
                        .collect()
                }
                None => vec![None; active.len()],
            };
            for (&tid, share) in active.iter().zip(active_shares) {
                self.demand
                    .record_share(cell, tid, share.map(|r| r.utilization()));
                plan.push((tid, s, share));
            }
            for &tid in &idle {
                self.demand.record_share(cell, tid, None);
                plan.push((tid, s, shares.map(|(_, i)| i)));
            }
        }
        let mut report = SyncReport::default();
        let sched_err = |source| ThreadError::Sched {
            cell: cell.into(),
            source,
        };
        // Phase 1: shrink and release. Deadline threads on the right hart change in place
        // (accounted at once by the kernel); others leave SCHED_DEADLINE before moving.
        // (thread, slot, share, whether it is new to SCHED_DEADLINE)
        let mut grow: Vec<(i32, usize, Reservation, bool)> = Vec::new();
        for (tid, s, share) in &plan {
            let (cur, _) = match attr::get_policy(*tid) {
                Ok(p) => p,
                Err(_) => continue,
            };
            let aff = affinity::get_affinity(*tid).unwrap_or_default();
            let on_slot = aff == slots[*s];
            match (cur, share) {
                (
                    Policy::Deadline {
                        runtime,
                        deadline: d,
                        period,
                    },
                    Some(r),
                ) if on_slot => {
                    let same = runtime == r.runtime && d == r.deadline && period == r.period;
                    if same {
                        continue;
                    }
                    if r.offset.is_some() && (d != r.deadline || period != r.period) {
                        report.rephase = true;
                    }
                    let old_bw = runtime.as_secs_f64() / period.as_secs_f64();
                    if r.utilization() <= old_bw {
                        ok_or_gone(attr::set_policy(*tid, deadline(r), FLAG_RESET_ON_FORK))
                            .map_err(sched_err)?;
                        report.changes += 1;
                    } else {
                        grow.push((*tid, *s, *r, false));
                    }
                }
                (cur, share) => {
                    if cur.is_deadline() {
                        demote(*tid).map_err(sched_err)?;
                        report.changes += 1;
                    }
                    if !on_slot {
                        if let Err(source) = affinity::set_affinity(*tid, &slots[*s]) {
                            if tess_sched::proc::exists(*tid) {
                                return Err(ThreadError::Affinity {
                                    cell: cell.into(),
                                    tid: *tid,
                                    harts: slots[*s].clone(),
                                    source,
                                });
                            }
                            continue;
                        }
                    }
                    if let Some(r) = share {
                        grow.push((*tid, *s, *r, true));
                    }
                }
            }
        }
        // Phase 2: grow in place, then promote newcomers (time-triggered ones at a window start,
        // so a thread that stays runnable runs exactly in its window).
        grow.sort_by_key(|g| g.3);
        let (old, new): (Vec<_>, Vec<_>) = grow.into_iter().partition(|g| !g.3);
        for (tid, s, r, _) in &old {
            if promote(*tid, r, &slots[*s]).map_err(sched_err)? {
                report.changes += 1;
            }
        }
        // Newcomers: a thread just created or just re-pinned may still sit on another hart's
        // runqueue for a moment (the kernel migrates it at once, but asynchronously); retry for
        // a few milliseconds before leaving it to a later sync.
        let mut pending = new;
        // Time-triggered promotions happen at window starts, so each attempt waits for one.
        let attempts = if res.offset.is_some() { 3 } else { 10 };
        for attempt in 0..attempts {
            if pending.is_empty() {
                break;
            }
            if attempt > 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
            let _window = res
                .offset
                .map(|offset| WindowStart::wait(res.period, offset));
            let mut still = Vec::new();
            for g in pending {
                if promote(g.0, &g.2, &slots[g.1]).map_err(sched_err)? {
                    report.changes += 1;
                } else {
                    still.push(g);
                }
            }
            pending = still;
        }
        report.pending += pending.len();
        if report.pending > 0 {
            self.pending.insert(cell.to_string());
        } else {
            self.pending.remove(cell);
        }
        for (tid, s, share) in &plan {
            self.placed.insert(
                *tid,
                Placement {
                    cell: cell.into(),
                    harts: slots[*s].clone(),
                },
            );
            if share.is_some() {
                report.reserved += 1;
            } else {
                report.overflow += 1;
            }
        }
        Ok(report)
    }
}

/// Being at a window start: the calling thread runs as `SCHED_FIFO` 99 from just before the
/// start until dropped, so that it wakes on time and is not preempted between the start and the
/// promotions it makes there.
struct WindowStart {
    previous: Option<Policy>,
}

/// How late after a window start a promotion still counts as "at the start".
const ALIGN_TOLERANCE: Duration = Duration::from_micros(30);

impl WindowStart {
    /// Waits for the next window start of `(period, offset)` at least [`ALIGN_MARGIN`] away:
    /// sleeps to just before it, spins the rest, and if the sleep overshot, takes the next one.
    fn wait(period: Duration, offset: Duration) -> WindowStart {
        let previous = attr::get_policy(0).ok().map(|p| p.0);
        let raised = attr::set_policy(0, Policy::Fifo { priority: 99 }, 0).is_ok();
        let (p, o) = (clock::ns(period), clock::ns(offset));
        let mut start = clock::next_grid_point(clock::now_ns() + clock::ns(ALIGN_MARGIN), p, o);
        loop {
            clock::sleep_until_ns(start.saturating_sub(clock::ns(ALIGN_SPIN)));
            let now = clock::spin_until_ns(start);
            if now <= start + clock::ns(ALIGN_TOLERANCE) {
                break;
            }
            start = clock::next_grid_point(now + clock::ns(ALIGN_MARGIN), p, o);
        }
        WindowStart {
            previous: previous.filter(|_| raised),
        }
    }
}

impl Drop for WindowStart {
    fn drop(&mut self) {
        if let Some(p) = self.previous {
            let _ = attr::set_policy(0, p, 0);
        }
    }
}

impl ThreadManager {
    /// Re-aligns the window of a time-triggered cell's deadline threads to the grid: at the next
    /// window start each is shrunk, demoted and promoted again, which restarts its period there.
    /// Used after a window change made in place (threads that block re-align on their own when
    /// they wake in their window).
    pub fn rephase(
        &mut self,
        backend: &dyn Backend,
        cell: &str,
        layout: &CellLayout,
    ) -> Result<usize, ThreadError> {
        let (Some(res), true) = (
            layout.reservation,
            layout.reservation.is_some_and(|r| r.offset.is_some()),
        ) else {
            return Ok(0);
        };
        let tids: Vec<i32> = backend
            .threads(cell)?
            .into_iter()
            .filter(|t| matches!(attr::get_policy(*t), Ok((Policy::Deadline { .. }, _))))
            .collect();
        if tids.is_empty() {
            return Ok(0);
        }
        let params: Vec<(i32, Policy)> = tids
            .iter()
            .filter_map(|t| Some((*t, attr::get_policy(*t).ok()?.0)))
            .collect();
        let _start = WindowStart::wait(res.period, res.offset.expect("time-triggered"));
        let sched_err = |source| ThreadError::Sched {
            cell: cell.into(),
            source,
        };
        for (tid, p) in &params {
            demote(*tid).map_err(sched_err)?;
            ok_or_gone(attr::set_policy(*tid, *p, FLAG_RESET_ON_FORK)).map_err(sched_err)?;
        }
        Ok(params.len())
    }
}

fn ok_or_gone(r: Result<(), SchedError>) -> Result<(), SchedError> {
    match r {
        Err(e) if e.is_gone() => Ok(()),
        other => other,
    }
}

/// Puts a thread under `SCHED_DEADLINE`; `Ok(false)` if it must wait until it wakes on its
/// hart (see [`SyncReport::pending`]). Bandwidth released by threads that just left
/// `SCHED_DEADLINE` returns to the kernel only at their 0-lag time (at most about one period
/// later), so a bandwidth refusal is retried for up to two periods before it is reported.
fn promote(tid: i32, r: &Reservation, slot: &HartSet) -> Result<bool, SchedError> {
    let give_up = clock::now_ns() + 2 * clock::ns(r.period).max(1_000_000);
    loop {
        match attr::set_policy(tid, deadline(r), FLAG_RESET_ON_FORK) {
            Err(SchedError::DeadlineBandwidth { .. }) if clock::now_ns() < give_up => {
                std::thread::sleep(Duration::from_micros(500));
            }
            // tessd runs as root, so EPERM means the thread is not (yet) on a runqueue of its
            // root domain (asleep on another hart, or just created there), or it is exiting:
            // either way, a later sync settles it.
            Err(SchedError::NotPermitted { .. }) => {
                let _ = slot;
                return Ok(false);
            }
            other => return ok_or_gone(other).map(|_| true),
        }
    }
}

/// Describes a thread's scheduling for `tess cell show`.
pub fn describe(tid: i32) -> (HartSet, String) {
    let aff = affinity::get_affinity(tid).unwrap_or_default();
    let sched = match attr::get_policy(tid) {
        Ok((
            Policy::Deadline {
                runtime,
                deadline,
                period,
            },
            _,
        )) => format!(
            "SCHED_DEADLINE {}/{}/{}",
            tess_core::units::format_duration(runtime),
            tess_core::units::format_duration(deadline),
            tess_core::units::format_duration(period)
        ),
        Ok((Policy::Fifo { priority }, _)) => format!("SCHED_FIFO {priority}"),
        Ok((Policy::RoundRobin { priority }, _)) => format!("SCHED_RR {priority}"),
        Ok((Policy::Other { nice }, _)) => format!("SCHED_OTHER nice {nice}"),
        Ok((p, _)) => p.name().to_string(),
        Err(_) => "gone".to_string(),
    };
    (aff, sched)
}
