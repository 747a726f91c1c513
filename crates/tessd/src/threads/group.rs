//! One server for all the threads of a cell: RT group bandwidth (cgroup v1).
//!
//! A `SCHED_DEADLINE` reservation belongs to one thread, so a budget split evenly between a
//! cell's threads is lost to whichever of them sleeps: `tess run --reserve 2ms/10ms` of a busy
//! shell behind `timeout` got 10% of a hart, not 20%. AQuoSA's `qres_wrap` serves every thread
//! of a program from one server, and so does this: the cell's cpu cgroup gets RT bandwidth
//! `cpu.rt_runtime_us = B`, `cpu.rt_period_us = P` (enforced on each hart by the kernel's RT
//! throttling), and every thread of the cell runs `SCHED_RR` at its rate-monotonic priority ([`group_policy`]) inside it.
//! Any runnable thread may draw on the budget, RT beats every CFS task, and the group is
//! throttled at `B` per `P` on each hart. `SCHED_DEADLINE` threads (time-triggered cells, other
//! hosts' reservations) preempt it, which admission accounts for (rule 6 of
//! `tess_core::admission`).
//!
//! `SCHED_RR` rather than `SCHED_FIFO`: with equal priorities, a busy FIFO thread keeps the hart
//! across throttling, and a helper that wakes beside it never runs (measured: `timeout 3`
//! around a busy `sh` under FIFO overran by minutes). Round-robin rotates them every
//! `sched_rr_timeslice_ms` of run time.
//!
//! New threads and forks inherit `SCHED_RR` (no reset-on-fork is needed, unlike
//! `SCHED_DEADLINE`), and they stay in the cgroup, so they are served at once. A thread is
//! raised only once it sits in the cell's cpu group: outside it nothing would throttle it.

use super::place_remaining;
use super::{demote, ok_or_gone, Placement, SyncReport, ThreadError, ThreadManager};
use std::collections::BTreeMap;
use tess_cgroup::Backend;
use tess_core::layout::CellLayout;
use tess_sched::{affinity, attr, Policy};

/// The policy of the threads of a group server with period `period`: `SCHED_RR` at the
/// rate-monotonic priority admission assumed ([`tess_core::admission::group_priority`], 1-49),
/// below every `SCHED_FIFO` 50-99 program (a dedicated cell's synthesizer) and interrupt
/// thread.
pub fn group_policy(period: std::time::Duration) -> Policy {
    Policy::RoundRobin {
        priority: tess_core::admission::group_priority(period),
    }
}

impl ThreadManager {
    /// Brings every thread of group-served cell `cell` under its cell's RT bandwidth: pinned to
    /// the least-populated hart of the cell (the budget is per hart), `SCHED_RR`.
    pub(super) fn sync_group(
        &mut self,
        backend: &dyn Backend,
        cell: &str,
        layout: &CellLayout,
    ) -> Result<SyncReport, ThreadError> {
        let slots = &layout.thread_slots;
        let policy = group_policy(
            layout
                .reservation
                .map_or(std::time::Duration::from_secs(1), |r| r.period),
        );
        let mut tids = backend.threads(cell)?;
        tids.sort_unstable();
        let present: std::collections::HashSet<i32> = tids.iter().copied().collect();
        self.placed
            .retain(|tid, p| p.cell != cell || present.contains(tid));
        // A thread keeps the slot tess gave it, else the one its affinity names, else takes the
        // least populated.
        let mut count = vec![0usize; slots.len()];
        let mut slot_of: BTreeMap<i32, usize> = BTreeMap::new();
        for &tid in &tids {
            let at = self
                .placed
                .get(&tid)
                .filter(|p| p.cell == cell)
                .map(|p| p.harts.clone())
                .unwrap_or_else(|| affinity::get_affinity(tid).unwrap_or_default());
            if let Some(s) = slots.iter().position(|h| *h == at) {
                count[s] += 1;
                slot_of.insert(tid, s);
            }
        }
        place_remaining(&tids, &mut slot_of, &mut count);
        let mut report = SyncReport::default();
        let sched_err = |source| ThreadError::Sched {
            cell: cell.into(),
            source,
        };
        let mut outside = Vec::new();
        for (&tid, &s) in &slot_of {
            let Ok((cur, _)) = attr::get_policy(tid) else {
                continue;
            };
            // Left over from a per-thread split (the daemon restarted with another mechanism).
            if cur.is_deadline() {
                demote(tid).map_err(sched_err)?;
                report.changes += 1;
            }
            if affinity::get_affinity(tid).ok().as_ref() != Some(&slots[s]) {
                if let Err(source) = affinity::set_affinity(tid, &slots[s]) {
                    if tess_sched::proc::exists(tid) {
                        return Err(ThreadError::Affinity {
                            cell: cell.into(),
                            tid,
                            harts: slots[s].clone(),
                            source,
                        });
                    }
                    continue;
                }
            }
            self.placed.insert(
                tid,
                Placement {
                    cell: cell.into(),
                    harts: slots[s].clone(),
                },
            );
            if !backend.in_cpu_group(cell, tid) {
                outside.push(tid);
            }
        }
        if !outside.is_empty() {
            // Threads now pinned to the cell's harts can join its cpu group.
            backend.complete_attach(cell, &layout.cpus)?;
        }
        for &tid in slot_of.keys() {
            let Ok((cur, _)) = attr::get_policy(tid) else {
                continue;
            };
            if !backend.in_cpu_group(cell, tid) {
                report.pending += 1;
                continue;
            }
            match cur {
                // Already real-time inside the group (raised before, or by the program itself
                // within the group's bandwidth): served by the group as it is.
                Policy::Fifo { .. } | Policy::RoundRobin { .. } => report.reserved += 1,
                // Asked to run only when nothing else wants the hart: left so.
                Policy::Idle => report.overflow += 1,
                _ => {
                    ok_or_gone(attr::set_policy(tid, policy, 0)).map_err(sched_err)?;
                    report.changes += 1;
                    report.reserved += 1;
                }
            }
        }
        if report.pending > 0 {
            self.pending.insert(cell.to_string());
        } else {
            self.pending.remove(cell);
        }
        Ok(report)
    }
}

/// Whether a thread runs as tess made group-served threads run (so that releasing a cell, even
/// after a daemon restart, takes exactly those out of real-time).
pub fn is_group_served(policy: Policy) -> bool {
    matches!(policy, Policy::RoundRobin { priority } if (1..=tess_core::admission::GROUP_PRIORITY_MAX).contains(&priority))
}
