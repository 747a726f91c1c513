//! How an admitted cluster maps onto Linux (see `docs/architecture.md`).
//!
//! | concept                   | Linux mechanism                                                  |
//! |---------------------------|------------------------------------------------------------------|
//! | dedicated hart            | cpuset holding only that cell, load balancing off, removed from   |
//! |                           | every other cpuset and from the system cpuset; IRQs steered away  |
//! | per-hart muxer (EDF+CBS)  | a per-hart root domain (a load-balanced cpuset of that one hart), |
//! |                           | so `SCHED_DEADLINE` threads can be pinned to it (partitioned EDF) |
//! | time-triggered window     | `SCHED_DEADLINE (A, A, P)` released on the window grid           |
//! | event-triggered CBS       | `SCHED_DEADLINE (B, P, P)` split between the threads, or (cgroup |
//! |                           | v1) one RT group server: the cell's cpu cgroup gets             |
//! |                           | `cpu.rt_runtime_us = B`, `cpu.rt_period_us = P` per hart and its |
//! |                           | threads run `SCHED_RR` ([`CellLayout::group_server`])             |
//! | best-effort               | CFS with `cpu.weight`; its 5 ms / 100 ms minimum is admitted      |
//! | memory / pids limits      | memory and pids controllers                                      |
//!
//! The kernel only lets a `SCHED_DEADLINE` thread's affinity be narrower than its root domain
//! when... never: the affinity must span the whole root domain. So every hart that carries a
//! reservation becomes its own root domain ([`DomainMode::PerHart`], cgroup v1). On cgroup v2 a
//! root domain is a cpuset partition, and a cgroup belongs to one partition, so harts are grouped
//! into partitions by the reserved cells that span them ([`DomainMode::PerComponent`]): a
//! reservation is then global EDF over its component (exactly per-hart when cells span one hart).

use crate::spec::Policy;
use crate::state::Cluster;
use std::collections::BTreeMap;
use std::time::Duration;
use tess_sched::HartSet;

/// How scheduling (root) domains are formed around reserved harts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DomainMode {
    /// Every reserved hart is its own root domain (cgroup v1 cpusets).
    PerHart,
    /// Reserved harts are grouped by the cells spanning them (cgroup v2 partitions).
    PerComponent,
}

/// What kind of harts a cell sits on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CellClass {
    /// Owns its harts.
    Dedicated,
    /// Holds `SCHED_DEADLINE` reservations.
    Reserved,
    /// Best-effort, time-shared by CFS.
    Shared,
}

/// A `SCHED_DEADLINE` reservation per hart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Reservation {
    /// Budget per period on each hart.
    #[serde(with = "crate::units::serde_ns")]
    pub runtime: Duration,
    /// Relative deadline.
    #[serde(with = "crate::units::serde_ns")]
    pub deadline: Duration,
    /// Period.
    #[serde(with = "crate::units::serde_ns")]
    pub period: Duration,
    /// Window offset on the `CLOCK_MONOTONIC` grid (time-triggered cells).
    #[serde(with = "crate::units::serde_opt_ns")]
    pub offset: Option<Duration>,
}

/// Smallest share of a budget one thread receives; threads beyond `runtime / MIN_THREAD_SLICE`
/// on one hart stay under CFS (bounded by the cell's CFS limit).
pub const MIN_THREAD_SLICE: Duration = Duration::from_micros(20);

impl Reservation {
    /// Parameters for each of `n` threads sharing this reservation on one hart: the budget is
    /// split evenly, the deadline and period stay (so time-triggered threads share one window).
    /// `None` if `n` is 0 or the slice would fall below [`MIN_THREAD_SLICE`].
    pub fn per_thread(&self, n: usize) -> Option<Reservation> {
        if n == 0 {
            return None;
        }
        let runtime = self.runtime / n as u32;
        if runtime < MIN_THREAD_SLICE {
            return None;
        }
        Some(Reservation { runtime, ..*self })
    }

    /// Fraction of a hart.
    pub fn utilization(&self) -> f64 {
        self.runtime.as_secs_f64() / self.period.as_secs_f64()
    }

    /// How many threads may share this reservation on one hart.
    pub fn max_threads(&self) -> usize {
        (self.runtime.as_nanos() / MIN_THREAD_SLICE.as_nanos()).max(1) as usize
    }
}

/// How one cell is realised.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CellLayout {
    /// Kind of harts.
    pub class: CellClass,
    /// The cell's cpuset.
    pub cpus: HartSet,
    /// `SCHED_DEADLINE` parameters per hart, for reserved cells.
    pub reservation: Option<Reservation>,
    /// For reserved cells, the affinity sets a thread is pinned to (one per hart in
    /// [`DomainMode::PerHart`], the component in [`DomainMode::PerComponent`]).
    pub thread_slots: Vec<HartSet>,
    /// CFS weight (best-effort cells).
    pub cpu_weight: Option<u32>,
    /// CFS bandwidth cap `(quota, period)`: for reserved cells, bounds what threads not (yet)
    /// under `SCHED_DEADLINE` can take.
    pub cfs_limit: Option<(Duration, Duration)>,
    /// Memory limit.
    pub memory_max: Option<u64>,
    /// Task limit.
    pub pids_max: Option<u64>,
    /// Keep the cell's harts busy when idle ([`crate::spec::IdleMode::Spin`]).
    pub idle_spin: bool,
    /// The reservation is one server for all the cell's threads (RT group bandwidth of the
    /// cell's cpu cgroup, its threads under `SCHED_RR`), not split between them
    /// ([`Reservation::per_thread`]). Event-triggered cells where the backend offers it.
    pub group_server: bool,
}

/// The whole plan.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Layout {
    /// Every online hart, managed by tess or not.
    pub all: HartSet,
    /// Harts tess manages.
    pub managed: HartSet,
    /// Dedicated harts.
    pub dedicated: HartSet,
    /// Harts with reservations.
    pub reserved: HartSet,
    /// Shared harts with no reservation.
    pub pool: HartSet,
    /// Where tasks outside cells run: unmanaged harts plus the pool, or plus every shared hart
    /// when the pool is empty.
    pub system: HartSet,
    /// Scheduling domains (each its own root domain), disjoint, covering the shared and the
    /// unmanaged harts; the last one is the pool with the unmanaged harts, if any.
    pub domains: Vec<HartSet>,
    /// Per-cell plans.
    pub cells: BTreeMap<String, CellLayout>,
}

/// The smallest CFS quota the kernel accepts (`cpu.cfs_quota_us` >= 1000).
const MIN_CFS_QUOTA: Duration = Duration::from_millis(1);
/// The largest CFS period (`cpu.cfs_period_us` <= 1 s).
const MAX_CFS_PERIOD: Duration = Duration::from_secs(1);

/// Scales `(quota, period)` up until the quota reaches the kernel's minimum, keeping the ratio.
pub fn cfs_limit(quota: Duration, period: Duration) -> (Duration, Duration) {
    if quota >= MIN_CFS_QUOTA || quota.is_zero() {
        return (quota, period);
    }
    let k = MIN_CFS_QUOTA.as_nanos().div_ceil(quota.as_nanos());
    let k = k
        .min(MAX_CFS_PERIOD.as_nanos() / period.as_nanos().max(1))
        .max(1) as u32;
    (quota * k, period * k)
}

/// Computes the layout of `cluster` over `managed` harts out of `all` online harts, every
/// reservation split between threads.
pub fn plan(cluster: &Cluster, all: &HartSet, managed: &HartSet, mode: DomainMode) -> Layout {
    plan_with(cluster, all, managed, mode, false)
}

/// [`plan`], with event-triggered cells served by one group server each when `group_servers`
/// (cgroup v1 with RT group scheduling).
pub fn plan_with(
    cluster: &Cluster,
    all: &HartSet,
    managed: &HartSet,
    mode: DomainMode,
    group_servers: bool,
) -> Layout {
    let dedicated = cluster.dedicated_harts();
    let reserved = cluster.reserved_harts();
    let shared = managed.difference(&dedicated);
    let pool = shared.difference(&reserved);
    let unmanaged = all.difference(managed);
    let system = if pool.is_empty() {
        shared.clone()
    } else {
        pool.clone()
    }
    .union(&unmanaged);
    let components = match mode {
        DomainMode::PerHart => reserved.iter().map(HartSet::single).collect::<Vec<_>>(),
        DomainMode::PerComponent => reserved_components(cluster),
    };
    let mut domains = components.clone();
    let balanced = pool.union(&unmanaged);
    if !balanced.is_empty() {
        domains.push(balanced);
    }
    let mut cells = BTreeMap::new();
    for cell in cluster.cells.values() {
        let policy = cell.policy();
        let class = match policy {
            Policy::Dedicated => CellClass::Dedicated,
            Policy::TimeTriggered { .. } | Policy::EventTriggered { .. } => CellClass::Reserved,
            Policy::BestEffort { .. } => CellClass::Shared,
        };
        let mut cl = CellLayout {
            class,
            cpus: cell.harts.clone(),
            reservation: None,
            thread_slots: Vec::new(),
            cpu_weight: None,
            cfs_limit: None,
            memory_max: cell.spec.memory_max,
            pids_max: cell.spec.pids_max,
            idle_spin: cell.spec.idle_mode() == crate::spec::IdleMode::Spin,
            group_server: group_servers && policy.is_event_triggered(),
        };
        match *policy {
            Policy::TimeTriggered { period, active, .. } => {
                cl.reservation = Some(Reservation {
                    runtime: active,
                    deadline: active,
                    period,
                    offset: cell.window().map(|w| w.0),
                });
            }
            Policy::EventTriggered { period, budget } => {
                cl.reservation = Some(Reservation {
                    runtime: budget,
                    deadline: period,
                    period,
                    offset: None,
                });
            }
            Policy::BestEffort { weight } => cl.cpu_weight = Some(weight),
            Policy::Dedicated => {}
        }
        if let Some(r) = cl.reservation {
            let n = cell.harts.len() as u32;
            cl.cfs_limit = Some(cfs_limit(r.runtime * n, r.period));
            cl.thread_slots = match mode {
                DomainMode::PerHart => cell.harts.iter().map(HartSet::single).collect(),
                DomainMode::PerComponent => {
                    let comp = components
                        .iter()
                        .find(|c| cell.harts.is_subset(c))
                        .cloned()
                        .unwrap_or_else(|| cell.harts.clone());
                    cl.cpus = comp.clone();
                    vec![comp; cell.harts.len()]
                }
            };
        }
        cells.insert(cell.name().to_string(), cl);
    }
    Layout {
        all: all.clone(),
        managed: managed.clone(),
        dedicated,
        reserved,
        pool,
        system,
        domains,
        cells,
    }
}

/// Connected components of reserved harts, two harts being connected when one reserved cell
/// spans both.
fn reserved_components(cluster: &Cluster) -> Vec<HartSet> {
    let mut comps: Vec<HartSet> = Vec::new();
    for cell in cluster
        .cells
        .values()
        .filter(|c| c.policy().is_reservation())
    {
        let mut merged = cell.harts.clone();
        comps.retain(|c| {
            if c.intersects(&merged) {
                merged = merged.union(c);
                false
            } else {
                true
            }
        });
        comps.push(merged);
    }
    comps.sort_by_key(|c| c.first());
    comps
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{CellSpec, HartRequest};
    use crate::state::Cell;

    fn ms(x: u64) -> Duration {
        Duration::from_millis(x)
    }

    fn cluster(cells: &[(&str, Policy, &str)]) -> Cluster {
        let mut c = Cluster::default();
        for (name, policy, harts) in cells {
            let harts: HartSet = harts.parse().unwrap();
            c.cells.insert(
                name.to_string(),
                Cell {
                    spec: CellSpec {
                        name: name.to_string(),
                        policy: policy.clone(),
                        harts: HartRequest::Ids(harts.clone()),
                        memory_max: None,
                        pids_max: None,
                        pinned: false,
                        idle: None,
                        broker: Default::default(),
                    },
                    harts,
                    window_offset: None,
                    owner: 0,
                    ephemeral_pid: None,
                    created_ms: 0,
                },
            );
        }
        c
    }

    #[test]
    fn music_layout_on_two_harts() {
        let et = Policy::EventTriggered {
            period: ms(33),
            budget: ms(5),
        };
        let tt = Policy::TimeTriggered {
            period: ms(33),
            active: ms(5),
            offset: Some(ms(10)),
        };
        let c = cluster(&[
            ("synth", Policy::Dedicated, "1"),
            ("v1", tt, "0"),
            ("v2", et, "0"),
        ]);
        let l = plan(
            &c,
            &HartSet::first_n(2),
            &HartSet::first_n(2),
            DomainMode::PerHart,
        );
        assert_eq!(l.dedicated.to_string(), "1");
        assert_eq!(l.reserved.to_string(), "0");
        assert!(l.pool.is_empty());
        assert_eq!(l.system.to_string(), "0");
        assert_eq!(l.domains, vec![HartSet::single(0)]);
        let v1 = &l.cells["v1"];
        assert_eq!(v1.class, CellClass::Reserved);
        assert_eq!(v1.reservation.unwrap().deadline, ms(5));
        assert_eq!(v1.reservation.unwrap().offset, Some(ms(10)));
        assert_eq!(l.cells["v2"].reservation.unwrap().deadline, ms(33));
        assert_eq!(l.cells["synth"].class, CellClass::Dedicated);
    }

    #[test]
    fn per_hart_and_per_component_domains() {
        let et = Policy::EventTriggered {
            period: ms(10),
            budget: ms(1),
        };
        let be = Policy::BestEffort { weight: 100 };
        let c = cluster(&[("a", et.clone(), "1-2"), ("b", et, "4"), ("c", be, "5-7")]);
        let managed = HartSet::first_n(8);
        let l = plan(&c, &managed, &managed, DomainMode::PerHart);
        let doms: Vec<String> = l.domains.iter().map(|d| d.to_string()).collect();
        assert_eq!(doms, vec!["1", "2", "4", "0,3,5-7"]);
        assert_eq!(l.system.to_string(), "0,3,5-7");
        assert_eq!(
            l.cells["a"].thread_slots,
            vec![HartSet::single(1), HartSet::single(2)]
        );
        let l = plan(&c, &managed, &managed, DomainMode::PerComponent);
        let doms: Vec<String> = l.domains.iter().map(|d| d.to_string()).collect();
        assert_eq!(doms, vec!["1-2", "4", "0,3,5-7"]);
        assert_eq!(l.cells["a"].thread_slots, vec!["1-2".parse().unwrap(); 2]);
    }

    #[test]
    fn unmanaged_harts_stay_with_the_system() {
        let et = Policy::EventTriggered {
            period: ms(10),
            budget: ms(1),
        };
        let c = cluster(&[("a", et, "2"), ("d", Policy::Dedicated, "3")]);
        let l = plan(
            &c,
            &HartSet::first_n(4),
            &"2-3".parse().unwrap(),
            DomainMode::PerHart,
        );
        assert_eq!(l.system.to_string(), "0-2");
        let doms: Vec<String> = l.domains.iter().map(|d| d.to_string()).collect();
        assert_eq!(doms, vec!["2", "0-1"]);
    }

    #[test]
    fn budgets_split_between_threads() {
        let r = Reservation {
            runtime: ms(2),
            deadline: ms(2),
            period: ms(10),
            offset: None,
        };
        assert_eq!(r.per_thread(4).unwrap().runtime, Duration::from_micros(500));
        assert_eq!(r.per_thread(4).unwrap().deadline, ms(2));
        assert!(r.per_thread(0).is_none());
        assert_eq!(r.max_threads(), 100);
        assert!(r.per_thread(101).is_none());
    }

    #[test]
    fn cfs_limits_respect_kernel_minimum() {
        assert_eq!(cfs_limit(ms(2), ms(10)), (ms(2), ms(10)));
        assert_eq!(cfs_limit(Duration::from_micros(250), ms(1)), (ms(1), ms(4)));
    }
}
