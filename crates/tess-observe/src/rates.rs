//! Rates between two snapshots: what `tess top` and the dashboard show.
//!
//! The kernel's counters only grow, except a cell's CPU time, which sums its *live* threads and
//! drops when one exits; a negative difference is shown as 0 rather than as a negative share.

use crate::snapshot::{RuntimeSample, Snapshot};
use serde::{Deserialize, Serialize};

/// One cell over an interval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellRate {
    /// Cell name.
    pub name: String,
    /// Policy name.
    pub policy: String,
    /// Harts it was given.
    pub harts: Vec<usize>,
    /// CPU guaranteed, hart-equivalents.
    pub granted_harts: f64,
    /// CPU used over the interval, hart-equivalents.
    pub used_harts: f64,
    /// Mean time a thread waited for a CPU each time it was given one, over the interval, in
    /// microseconds (`None` if it never ran).
    pub wait_per_slice_us: Option<f64>,
    /// Involuntary switches per second.
    pub involuntary_switches_per_s: f64,
    /// CFS throttled periods in the interval (`None`: the cell has no CFS bandwidth group).
    pub throttled_periods: Option<u64>,
    /// Throttled periods since the counters started.
    pub throttled_periods_total: Option<u64>,
    /// Memory charged, bytes.
    pub memory_bytes: Option<u64>,
    /// Memory limit, bytes.
    pub memory_limit_bytes: Option<u64>,
    /// Threads.
    pub threads: usize,
    /// What its runtimes report over the interval (empty when none publishes).
    #[serde(default)]
    pub runtimes: Vec<RuntimeRate>,
}

/// One runtime of a cell over an interval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RuntimeRate {
    /// The runtime's name.
    pub name: String,
    /// Its process.
    pub pid: i32,
    /// Events per second.
    pub events_per_s: f64,
    /// Events past their deadline in the interval.
    pub misses: u64,
    /// Bytes its events carried per second (network services).
    #[serde(default)]
    pub bytes_per_s: f64,
    /// Events past their deadline since it started.
    pub misses_total: u64,
    /// The 99th percentile of its response times in the interval, us (a bucket bound: within
    /// 41% above the truth); `None` without events in the interval.
    pub p99_us: Option<f64>,
    /// Its deadline, us (`None`: none, or one per event).
    pub deadline_us: Option<f64>,
    /// Events in the interval per response-time bucket (`tess_stats::BOUNDS_NS`, then the
    /// overflow), for live histograms.
    #[serde(default)]
    pub buckets: Vec<u64>,
}

impl CellRate {
    /// Misses of all its runtimes in the interval (`None` when no runtime publishes).
    pub fn misses(&self) -> Option<u64> {
        (!self.runtimes.is_empty()).then(|| self.runtimes.iter().map(|r| r.misses).sum())
    }

    /// The worst p99 among its runtimes in the interval.
    pub fn p99_us(&self) -> Option<f64> {
        self.runtimes
            .iter()
            .filter_map(|r| r.p99_us)
            .max_by(f64::total_cmp)
    }
}

/// A runtime over an interval; `before` is its sample at the start (`None`: new).
fn runtime_rate(now: &RuntimeSample, before: Option<&RuntimeSample>, dt: f64) -> RuntimeRate {
    // A restarted runtime (same name and pid cannot restart; a new pid is a new runtime) only
    // counts up, but guard against a page replaced under the same pid.
    let before = before.filter(|b| b.events <= now.events);
    let delta: Vec<u64> = now
        .buckets
        .iter()
        .enumerate()
        .map(|(i, n)| n.saturating_sub(before.and_then(|b| b.buckets.get(i)).copied().unwrap_or(0)))
        .collect();
    RuntimeRate {
        name: now.name.clone(),
        pid: now.pid,
        events_per_s: per_s(now.events as f64, before.map_or(0, |b| b.events) as f64, dt),
        misses: now.misses - before.map_or(0, |b| b.misses.min(now.misses)),
        bytes_per_s: per_s(now.bytes as f64, before.map_or(0, |b| b.bytes) as f64, dt),
        misses_total: now.misses,
        p99_us: tess_stats::quantile(&delta, 0.99, now.max_ns).map(|ns| ns as f64 / 1e3),
        deadline_us: (now.deadline_ns > 0).then(|| now.deadline_ns as f64 / 1e3),
        buckets: delta,
    }
}

/// One hart over an interval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HartRate {
    /// Hart number.
    pub hart: usize,
    /// Fraction promised by admission.
    pub granted: f64,
    /// Fraction admission could still promise.
    pub headroom: f64,
    /// Fraction of the interval it was busy.
    pub busy: f64,
    /// Fraction of the interval the hypervisor took.
    pub steal: f64,
    /// Whether tess manages it.
    pub managed: bool,
    /// Dedicated owner.
    pub dedicated_to: Option<String>,
}

/// Everything over one interval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct View {
    /// Length of the interval, seconds.
    pub interval_s: f64,
    /// When it ended, ms since the epoch.
    pub unix_ms: u64,
    /// Utilization limit per hart.
    pub utilization_limit: f64,
    /// Harts.
    pub harts: Vec<HartRate>,
    /// Cells (in tessd's order, by name).
    pub cells: Vec<CellRate>,
    /// tessd's warnings.
    pub warnings: Vec<String>,
}

fn per_s(now: f64, before: f64, dt: f64) -> f64 {
    if dt <= 0.0 {
        0.0
    } else {
        ((now - before) / dt).max(0.0)
    }
}

/// The view from `before` to `now` (cells and harts matched by name and number; a cell new in
/// `now` counts from zero, as its counters started with it).
pub fn between(before: &Snapshot, now: &Snapshot) -> View {
    let dt = now.monotonic_s - before.monotonic_s;
    let harts = now
        .harts
        .iter()
        .map(|h| {
            let b = before.harts.iter().find(|x| x.hart == h.hart);
            HartRate {
                hart: h.hart,
                granted: h.granted,
                headroom: h.headroom,
                busy: per_s(h.busy_s, b.map_or(h.busy_s, |b| b.busy_s), dt).min(1.0),
                steal: per_s(h.steal_s, b.map_or(h.steal_s, |b| b.steal_s), dt).min(1.0),
                managed: h.managed,
                dedicated_to: h.dedicated_to.clone(),
            }
        })
        .collect();
    let cells = now
        .cells
        .iter()
        .map(|c| {
            let b = before.cells.iter().find(|x| x.name == c.name);
            CellRate {
                name: c.name.clone(),
                policy: c.policy.clone(),
                harts: c.harts.clone(),
                granted_harts: c.granted_harts,
                used_harts: per_s(c.cpu_used_s, b.map_or(0.0, |b| b.cpu_used_s), dt),
                wait_per_slice_us: {
                    let slices = c
                        .timeslices
                        .saturating_sub(b.map_or(0, |b| b.timeslices.min(c.timeslices)));
                    let wait = c.runqueue_wait_s - b.map_or(0.0, |b| b.runqueue_wait_s);
                    (slices > 0 && wait >= 0.0).then(|| wait / slices as f64 * 1e6)
                },
                involuntary_switches_per_s: per_s(
                    c.involuntary_switches as f64,
                    b.map_or(0, |b| b.involuntary_switches) as f64,
                    dt,
                ),
                throttled_periods: c
                    .throttled_periods
                    .map(|n| n.saturating_sub(b.and_then(|b| b.throttled_periods).unwrap_or(0))),
                throttled_periods_total: c.throttled_periods,
                memory_bytes: c.memory_bytes,
                memory_limit_bytes: c.memory_limit_bytes,
                threads: c.threads,
                runtimes: c
                    .runtimes
                    .iter()
                    .map(|r| {
                        let was = b.and_then(|b| {
                            b.runtimes
                                .iter()
                                .find(|x| x.name == r.name && x.pid == r.pid)
                        });
                        runtime_rate(r, was, dt)
                    })
                    .collect(),
            }
        })
        .collect();
    View {
        interval_s: dt,
        unix_ms: now.unix_ms,
        utilization_limit: now.utilization_limit,
        harts,
        cells,
        warnings: now.warnings.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{CellSample, HartSample};

    fn snap(t: f64, busy: f64, used: f64, throttled: u64) -> Snapshot {
        Snapshot {
            monotonic_s: t,
            unix_ms: 0,
            daemon_pid: 1,
            daemon_uptime_s: t,
            utilization_limit: 0.95,
            harts: vec![HartSample {
                hart: 0,
                granted: 0.5,
                headroom: 0.45,
                managed: true,
                dedicated_to: None,
                busy_s: busy,
                steal_s: 0.0,
            }],
            cells: vec![CellSample {
                name: "a".into(),
                policy: "event-triggered".into(),
                harts: vec![0],
                granted_harts: 0.5,
                cpu_used_s: used,
                runqueue_wait_s: used / 10.0,
                timeslices: (used * 100.0) as u64,
                threads: 1,
                processes: 1,
                involuntary_switches: 0,
                throttled_periods: Some(throttled),
                throttled_s: Some(0.0),
                memory_bytes: None,
                memory_limit_bytes: None,
                pinned: false,
                runtimes: vec![],
            }],
            warnings: vec![],
        }
    }

    #[test]
    fn shares_are_differences_over_the_interval() {
        let v = between(&snap(10.0, 5.0, 1.0, 2), &snap(12.0, 6.0, 1.8, 5));
        assert!((v.interval_s - 2.0).abs() < 1e-12);
        assert!((v.harts[0].busy - 0.5).abs() < 1e-12);
        assert!((v.cells[0].used_harts - 0.4).abs() < 1e-12);
        assert_eq!(v.cells[0].throttled_periods, Some(3));
        // 0.08 s of waiting over 80 timeslices: 1 ms each.
        assert!((v.cells[0].wait_per_slice_us.unwrap() - 1000.0).abs() < 1e-6);
    }

    fn synth(events: u64, misses: u64, at: &[(u64, u64)]) -> RuntimeSample {
        let mut buckets = vec![0; tess_stats::BUCKETS];
        for (ns, n) in at {
            buckets[tess_stats::bucket_of(*ns)] += n;
        }
        RuntimeSample {
            name: "synth".into(),
            pid: 42,
            deadline_ns: 1_405_896,
            events,
            misses,
            sum_ns: 0,
            max_ns: 3_000_000,
            bytes: 0,
            buckets,
        }
    }

    #[test]
    fn runtime_tails_come_from_the_intervals_events_only() {
        let mut a = snap(10.0, 5.0, 1.0, 0);
        let mut b = snap(12.0, 6.0, 1.8, 0);
        // Before: 1000 slow answers. In the interval: 2000 fast ones and 10 late.
        a.cells[0].runtimes = vec![synth(1000, 1000, &[(3_000_000, 1000)])];
        b.cells[0].runtimes = vec![synth(3010, 1010, &[(3_000_000, 1010), (700_000, 2000)])];
        let v = between(&a, &b);
        let r = &v.cells[0].runtimes[0];
        assert_eq!((r.misses, r.misses_total), (10, 1010));
        assert!((r.events_per_s - 1005.0).abs() < 1e-9);
        // 10 of 2010 are slow: under 1%, so the p99 is the fast answers' bucket (741.376 us).
        assert_eq!(r.p99_us, Some(741.376));
        assert_eq!(v.cells[0].misses(), Some(10));
        assert_eq!(r.deadline_us, Some(1405.896));
        // With no earlier sample everything counts; with no runtime there is no miss column.
        let fresh = between(&snap(10.0, 5.0, 1.0, 0), &b);
        assert_eq!(fresh.cells[0].runtimes[0].misses, 1010);
        assert_eq!(
            between(&a, &snap(12.0, 6.0, 1.8, 0)).cells[0].misses(),
            None
        );
    }

    #[test]
    fn an_exited_thread_does_not_make_use_negative() {
        let v = between(&snap(10.0, 5.0, 3.0, 0), &snap(11.0, 5.5, 1.0, 0));
        assert_eq!(v.cells[0].used_harts, 0.0);
    }
}
