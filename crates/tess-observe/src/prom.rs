//! The Prometheus exposition of a [`Snapshot`] and of tessd's transactions.
//!
//! Conventions (<https://prometheus.io/docs/practices/naming/>): every name starts with `tess_`,
//! values are in base units (seconds, bytes; CPU shares in hart-equivalents, i.e. CPU seconds
//! per second), counters end in `_total`, and labels are `cell`, `policy` and `hart`.
//!
//! Kernel counters are read fresh at each scrape into a registry built for that scrape, so a
//! deleted cell disappears from the next scrape instead of lingering at its last value. The
//! transaction metrics ([`Transactions`]) live as long as the daemon and are updated by the API
//! thread after each request, outside the engine.

use crate::snapshot::Snapshot;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::exponential_buckets;
use prometheus_client::registry::{Registry, Unit};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The Content-Type of [`render`]'s output (OpenMetrics text, which Prometheus asks for).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The Content-Type of [`to_text_format`]'s output (the classic text format, for clients that do
/// not ask for OpenMetrics: `curl`, `promtool check metrics`).
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Whether an HTTP `Accept` header asks for OpenMetrics (Prometheus does, by default).
pub fn wants_openmetrics(accept: &str) -> bool {
    accept.contains("application/openmetrics-text")
}

/// Converts [`render`]'s OpenMetrics text to the classic text format 0.0.4: a counter family's
/// `# HELP` and `# TYPE` name its samples' `_total` name, and `# UNIT` and `# EOF` are dropped
/// (the classic format has neither). Samples are unchanged.
pub fn to_text_format(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|tag| {
            let rest = line.strip_prefix(tag)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{tag}{name}_total {tail}"))
        });
        match renamed {
            Some(l) => out.push_str(&l),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CellLabels {
    cell: String,
    policy: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HartLabels {
    hart: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CellHartLabels {
    cell: String,
    policy: String,
    hart: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabels {
    op: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpOnly {
    op: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuntimeLabels {
    cell: String,
    policy: String,
    runtime: String,
}

/// A histogram whose buckets were counted elsewhere (a runtime's `tess-stats` page): set once
/// per scrape, encoded as is.
#[derive(Debug, Default, Clone)]
struct CountedHistogram {
    inner: std::sync::Arc<std::sync::Mutex<Counted>>,
}

/// Sum (seconds), count, and (upper bound, count) per bucket.
type Counted = (f64, u64, Vec<(f64, u64)>);

impl CountedHistogram {
    /// Sets sum (seconds) and per-bucket counts (not cumulative) under `bounds` (seconds; the
    /// last count is the overflow).
    fn set(&self, sum_s: f64, bounds: &[f64], buckets: &[u64]) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.2 = bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::MAX))
            .zip(buckets.iter().copied())
            .collect();
        g.0 = sum_s;
        g.1 = buckets.iter().sum();
    }

    /// Adds a runtime's counts (seconds; per-bucket counts, not cumulative).
    fn add(&self, sum_s: f64, buckets: &[u64]) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if g.2.is_empty() {
            g.2 = tess_stats::BOUNDS_NS
                .iter()
                .map(|b| *b as f64 / 1e9)
                .chain(std::iter::once(f64::MAX))
                .map(|le| (le, 0))
                .collect();
        }
        g.0 += sum_s;
        for (slot, n) in g.2.iter_mut().zip(buckets) {
            slot.1 += n;
        }
        g.1 = g.2.iter().map(|b| b.1).sum();
    }
}

impl prometheus_client::metrics::TypedMetric for CountedHistogram {
    const TYPE: prometheus_client::metrics::MetricType =
        prometheus_client::metrics::MetricType::Histogram;
}

impl prometheus_client::encoding::EncodeMetric for CountedHistogram {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::MetricEncoder<'_>,
    ) -> Result<(), std::fmt::Error> {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        encoder.encode_histogram::<prometheus_client::encoding::NoLabelSet>(g.0, g.1, &g.2, None)
    }

    fn metric_type(&self) -> prometheus_client::metrics::MetricType {
        prometheus_client::metrics::MetricType::Histogram
    }
}

type GaugeF = Gauge<f64, AtomicU64>;
type CounterF = Counter<f64, AtomicU64>;

/// Buckets of the transaction latency histogram: 10 us doubling to 0.33 s (16 buckets), so
/// that a 50 us resize and a 20 ms apply both land in a bucket of their size.
pub fn latency_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(10e-6, 2.0, 16)
}

/// Operations [`Transactions`] keeps apart (tessd has about 20).
const MAX_OPS: usize = 48;
/// Buckets of [`latency_buckets`], plus the overflow.
const TX_BUCKETS: usize = 17;

/// One operation's counts: successes, failures, latency sum and buckets.
#[derive(Debug, Default)]
struct OpCounts {
    op: std::sync::OnceLock<&'static str>,
    ok: AtomicU64,
    err: AtomicU64,
    sum_ns: AtomicU64,
    buckets: [AtomicU64; TX_BUCKETS],
}

/// tessd's requests: counted by operation and outcome, timed from decoded request to reply
/// ready (waiting for the engine included).
///
/// Recording is a handful of relaxed atomic adds: tessd's read loop and its connection threads
/// all record every request they answer, and a lock here (a histogram behind a mutex) would make
/// them take turns.
#[derive(Debug)]
pub struct Transactions {
    ops: [OpCounts; MAX_OPS],
}

impl Default for Transactions {
    fn default() -> Self {
        Transactions {
            ops: std::array::from_fn(|_| OpCounts::default()),
        }
    }
}

impl Transactions {
    /// Records one request `op` (e.g. `create-cell`) that took `took`, successful or not.
    /// Operations beyond the first 48 distinct names are not counted.
    pub fn record(&self, op: &'static str, ok: bool, took: Duration) {
        let Some(c) = self.slot(op) else {
            return;
        };
        if ok { &c.ok } else { &c.err }.fetch_add(1, Ordering::Relaxed);
        let ns = took.as_nanos().min(u64::MAX as u128) as u64;
        c.sum_ns.fetch_add(ns, Ordering::Relaxed);
        // The bounds of [`latency_buckets`], 10 us doubling: the first at or above `ns`.
        let i = (0..TX_BUCKETS - 1)
            .find(|&i| ns <= 10_000u64 << i)
            .unwrap_or(TX_BUCKETS - 1);
        c.buckets[i].fetch_add(1, Ordering::Relaxed);
    }

    fn slot(&self, op: &'static str) -> Option<&OpCounts> {
        for c in &self.ops {
            match c.op.get() {
                Some(o) if *o == op => return Some(c),
                Some(_) => continue,
                None => {
                    // Claim the slot, or find that another thread just claimed it for `op`.
                    let _ = c.op.set(op);
                    if c.op.get() == Some(&op) {
                        return Some(c);
                    }
                }
            }
        }
        None
    }

    fn register(&self, r: &mut Registry) {
        let count = Family::<OpLabels, Counter>::default();
        let latency = Family::<OpOnly, CountedHistogram>::default();
        let bounds: Vec<f64> = latency_buckets().collect();
        for c in &self.ops {
            let Some(op) = c.op.get() else { break };
            for (result, n) in [("ok", &c.ok), ("error", &c.err)] {
                let n = n.load(Ordering::Relaxed);
                if n > 0 {
                    count
                        .get_or_create(&OpLabels {
                            op: op.to_string(),
                            result: result.to_string(),
                        })
                        .inc_by(n);
                }
            }
            let buckets: Vec<u64> = c
                .buckets
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .collect();
            latency.get_or_create(&OpOnly { op: op.to_string() }).set(
                c.sum_ns.load(Ordering::Relaxed) as f64 / 1e9,
                &bounds,
                &buckets,
            );
        }
        r.register(
            "transactions",
            "Requests tessd answered, by operation and result",
            count,
        );
        r.register_with_unit(
            "transaction_duration",
            "Time from a decoded request to its reply, waiting for the engine included",
            Unit::Seconds,
            latency,
        );
    }
}

fn gauge<L>(r: &mut Registry, name: &str, help: &str, unit: Option<Unit>) -> Family<L, GaugeF>
where
    L: Clone + std::hash::Hash + Eq + EncodeLabelSet + std::fmt::Debug + Send + Sync + 'static,
{
    let f = Family::<L, GaugeF>::default();
    match unit {
        Some(u) => r.register_with_unit(name, help, u, f.clone()),
        None => r.register(name, help, f.clone()),
    }
    f
}

fn counter<L>(r: &mut Registry, name: &str, help: &str, unit: Option<Unit>) -> Family<L, CounterF>
where
    L: Clone + std::hash::Hash + Eq + EncodeLabelSet + std::fmt::Debug + Send + Sync + 'static,
{
    let f = Family::<L, CounterF>::default();
    match unit {
        Some(u) => r.register_with_unit(name, help, u, f.clone()),
        None => r.register(name, help, f.clone()),
    }
    f
}

fn plain_gauge(r: &mut Registry, name: &str, help: &str, unit: Option<Unit>, value: f64) {
    let g = GaugeF::default();
    g.set(value);
    match unit {
        Some(u) => r.register_with_unit(name, help, u, g),
        None => r.register(name, help, g),
    }
}

fn harts_unit() -> Option<Unit> {
    Some(Unit::Other("harts".into()))
}

/// What runtimes published (crate `tess-stats`), by cell and runtime name; several processes
/// of one cell publishing the same name are summed.
fn render_runtimes(r: &mut Registry, s: &Snapshot) {
    if s.cells.iter().all(|c| c.runtimes.is_empty()) {
        return;
    }
    let events = counter::<RuntimeLabels>(
        r,
        "runtime_events",
        "Events a runtime handled: the synthesizer's answers, a graph engine's blocks, Pulse's EDF jobs, gang windows entered",
        None,
    );
    let misses = counter::<RuntimeLabels>(
        r,
        "runtime_deadline_misses",
        "Events a runtime finished after their deadline",
        None,
    );
    let deadline = gauge::<RuntimeLabels>(
        r,
        "runtime_deadline",
        "The deadline a runtime's events are judged against (absent when it varies per event)",
        Some(Unit::Seconds),
    );
    let bytes = counter::<RuntimeLabels>(
        r,
        "runtime",
        "Bytes a runtime's events carried: the packets a network service moved for a reservation",
        Some(Unit::Bytes),
    );
    let response = Family::<RuntimeLabels, CountedHistogram>::default();
    r.register_with_unit(
        "runtime_response",
        "Response time of a runtime's events (for gang windows: how late a vhart entered its window); buckets grow by sqrt(2) from 1 us",
        Unit::Seconds,
        response.clone(),
    );
    for c in &s.cells {
        for rt in &c.runtimes {
            let l = RuntimeLabels {
                cell: c.name.clone(),
                policy: c.policy.clone(),
                runtime: rt.name.clone(),
            };
            events.get_or_create(&l).inc_by(rt.events as f64);
            misses.get_or_create(&l).inc_by(rt.misses as f64);
            if rt.bytes > 0 {
                bytes.get_or_create(&l).inc_by(rt.bytes as f64);
            }
            if rt.deadline_ns > 0 {
                deadline.get_or_create(&l).set(rt.deadline_ns as f64 / 1e9);
            }
            response
                .get_or_create(&l)
                .add(rt.sum_ns as f64 / 1e9, &rt.buckets);
        }
    }
}

/// Renders a snapshot (and, in tessd, its transactions) as OpenMetrics text.
pub fn render(s: &Snapshot, tx: Option<&Transactions>) -> String {
    let mut r = Registry::with_prefix("tess");

    let hart_granted = gauge::<HartLabels>(
        &mut r,
        "hart_granted",
        "Fraction of the hart admission has promised to cells (1 when dedicated)",
        Some(Unit::Other("ratio".into())),
    );
    let hart_headroom = gauge::<HartLabels>(
        &mut r,
        "hart_admission_headroom",
        "Fraction of the hart admission could still promise (0 when dedicated or unmanaged)",
        Some(Unit::Other("ratio".into())),
    );
    let hart_busy = counter::<HartLabels>(
        &mut r,
        "hart_busy",
        "CPU time the hart spent running anything (user, system, irq), from /proc/stat",
        Some(Unit::Seconds),
    );
    let hart_steal = counter::<HartLabels>(
        &mut r,
        "hart_steal",
        "CPU time the hypervisor took from the hart, from /proc/stat",
        Some(Unit::Seconds),
    );
    for h in &s.harts {
        let l = HartLabels {
            hart: h.hart.to_string(),
        };
        hart_granted.get_or_create(&l).set(h.granted);
        hart_headroom.get_or_create(&l).set(h.headroom);
        hart_busy.get_or_create(&l).inc_by(h.busy_s);
        hart_steal.get_or_create(&l).inc_by(h.steal_s);
    }

    let granted = gauge::<CellLabels>(
        &mut r,
        "cell_cpu_granted",
        "CPU guaranteed to the cell in hart-equivalents (CPU seconds per second): compare with rate(tess_cell_cpu_used_seconds_total)",
        harts_unit(),
    );
    let on_hart = gauge::<CellHartLabels>(
        &mut r,
        "cell_harts",
        "1 for each hart the cell was given",
        None,
    );
    let used = counter::<CellLabels>(
        &mut r,
        "cell_cpu_used",
        "CPU time the cell's live threads have run (/proc/TID/schedstat); drops when a thread exits",
        Some(Unit::Seconds),
    );
    let wait = counter::<CellLabels>(
        &mut r,
        "cell_runqueue_wait",
        "Time the cell's live threads spent runnable but waiting for a CPU (/proc/TID/schedstat)",
        Some(Unit::Seconds),
    );
    let slices = counter::<CellLabels>(
        &mut r,
        "cell_timeslices",
        "Times the cell's live threads were given a CPU: rate(wait) / rate(timeslices) is the mean wait per activation",
        None,
    );
    let switches = counter::<CellLabels>(
        &mut r,
        "cell_involuntary_switches",
        "Times the cell's threads were switched out while runnable: preemption, and SCHED_DEADLINE throttling at budget exhaustion",
        None,
    );
    let throttled = counter::<CellLabels>(
        &mut r,
        "cell_throttled_periods",
        "CFS bandwidth periods in which the cell ran out of quota (cpu.stat nr_throttled)",
        None,
    );
    let throttled_s = counter::<CellLabels>(
        &mut r,
        "cell_throttled",
        "Time the cell's tasks waited for CFS quota (cpu.stat)",
        Some(Unit::Seconds),
    );
    let mem = gauge::<CellLabels>(
        &mut r,
        "cell_memory_used",
        "Memory charged to the cell's cgroup",
        Some(Unit::Bytes),
    );
    let mem_limit = gauge::<CellLabels>(
        &mut r,
        "cell_memory_limit",
        "The cell's memory limit (absent when unlimited)",
        Some(Unit::Bytes),
    );
    let threads = gauge::<CellLabels>(
        &mut r,
        "cell_threads",
        "Threads in the cell (tessd's idle spinners excluded)",
        None,
    );
    for c in &s.cells {
        let l = CellLabels {
            cell: c.name.clone(),
            policy: c.policy.clone(),
        };
        granted.get_or_create(&l).set(c.granted_harts);
        for h in &c.harts {
            on_hart
                .get_or_create(&CellHartLabels {
                    cell: c.name.clone(),
                    policy: c.policy.clone(),
                    hart: h.to_string(),
                })
                .set(1.0);
        }
        used.get_or_create(&l).inc_by(c.cpu_used_s);
        wait.get_or_create(&l).inc_by(c.runqueue_wait_s);
        slices.get_or_create(&l).inc_by(c.timeslices as f64);
        switches
            .get_or_create(&l)
            .inc_by(c.involuntary_switches as f64);
        if let Some(p) = c.throttled_periods {
            throttled.get_or_create(&l).inc_by(p as f64);
        }
        if let Some(t) = c.throttled_s {
            throttled_s.get_or_create(&l).inc_by(t);
        }
        if let Some(b) = c.memory_bytes {
            mem.get_or_create(&l).set(b as f64);
        }
        if let Some(b) = c.memory_limit_bytes {
            mem_limit.get_or_create(&l).set(b as f64);
        }
        threads.get_or_create(&l).set(c.threads as f64);
    }
    render_runtimes(&mut r, s);

    plain_gauge(
        &mut r,
        "cells",
        "Cells tessd keeps",
        None,
        s.cells.len() as f64,
    );
    plain_gauge(
        &mut r,
        "daemon_uptime",
        "Time since tessd started",
        Some(Unit::Seconds),
        s.daemon_uptime_s,
    );
    plain_gauge(
        &mut r,
        "warnings",
        "Problems tessd cannot fix itself (see tess status)",
        None,
        s.warnings.len() as f64,
    );

    if let Some(tx) = tx {
        tx.register(&mut r);
    }
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &r)
        .expect("writing to a String cannot fail");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{CellSample, HartSample};

    fn snapshot() -> Snapshot {
        Snapshot {
            monotonic_s: 1.0,
            unix_ms: 1,
            daemon_pid: 1,
            daemon_uptime_s: 3.0,
            utilization_limit: 0.95,
            harts: vec![HartSample {
                hart: 1,
                granted: 0.2,
                headroom: 0.75,
                managed: true,
                dedicated_to: None,
                busy_s: 12.5,
                steal_s: 0.5,
            }],
            cells: vec![CellSample {
                name: "synth".into(),
                policy: "event-triggered".into(),
                harts: vec![1],
                granted_harts: 0.2,
                cpu_used_s: 1.25,
                runqueue_wait_s: 0.125,
                timeslices: 40,
                threads: 2,
                processes: 1,
                involuntary_switches: 9,
                throttled_periods: Some(3),
                throttled_s: Some(0.5),
                memory_bytes: Some(4096),
                memory_limit_bytes: Some(1 << 20),
                pinned: false,
                runtimes: vec![],
            }],
            warnings: vec![],
        }
    }

    #[test]
    fn names_follow_the_conventions() {
        let tx = Transactions::default();
        tx.record("create-cell", true, Duration::from_micros(70));
        let text = render(&snapshot(), Some(&tx));
        for want in [
            "tess_hart_admission_headroom_ratio{hart=\"1\"} 0.75",
            "tess_cell_cpu_granted_harts{cell=\"synth\",policy=\"event-triggered\"} 0.2",
            "tess_cell_cpu_used_seconds_total{cell=\"synth\",policy=\"event-triggered\"} 1.25",
            "tess_cell_memory_used_bytes{cell=\"synth\",policy=\"event-triggered\"} 4096",
            "tess_cell_throttled_periods_total{cell=\"synth\",policy=\"event-triggered\"} 3",
            "tess_transactions_total{op=\"create-cell\",result=\"ok\"} 1",
            "tess_transaction_duration_seconds_bucket{le=\"0.00008\",op=\"create-cell\"} 1",
            "tess_transaction_duration_seconds_count{op=\"create-cell\"} 1",
        ] {
            assert!(text.contains(want), "missing {want} in\n{text}");
        }
    }

    #[test]
    fn runtimes_publish_misses_and_a_response_histogram() {
        let mut s = snapshot();
        let mut buckets = vec![0; tess_stats::BUCKETS];
        buckets[tess_stats::bucket_of(700_000)] = 3;
        buckets[tess_stats::BUCKETS - 1] = 1;
        s.cells[0].runtimes = vec![crate::snapshot::RuntimeSample {
            name: "synth".into(),
            pid: 7,
            deadline_ns: 1_405_896,
            events: 4,
            misses: 1,
            sum_ns: 4_000_000_000,
            max_ns: 1_900_000_000,
            bytes: 0,
            buckets,
        }];
        let text = to_text_format(&render(&s, None));
        let l = "cell=\"synth\",policy=\"event-triggered\",runtime=\"synth\"";
        for want in [
            format!("tess_runtime_events_total{{{l}}} 4"),
            format!("tess_runtime_deadline_misses_total{{{l}}} 1"),
            format!("tess_runtime_deadline_seconds{{{l}}} 0.001405896"),
            format!("tess_runtime_response_seconds_count{{{l}}} 4"),
            format!("tess_runtime_response_seconds_sum{{{l}}} 4.0"),
            format!("tess_runtime_response_seconds_bucket{{le=\"0.000741376\",{l}}} 3"),
            format!("tess_runtime_response_seconds_bucket{{le=\"1.073741824\",{l}}} 3"),
            format!("tess_runtime_response_seconds_bucket{{le=\"+Inf\",{l}}} 4"),
            "# TYPE tess_runtime_response_seconds histogram".to_string(),
        ] {
            assert!(text.contains(&want), "missing {want} in\n{text}");
        }
        // Without runtimes there are no runtime families at all.
        assert!(!to_text_format(&render(&snapshot(), None)).contains("tess_runtime_"));
    }

    #[test]
    fn the_text_format_names_counters_by_their_samples() {
        let tx = Transactions::default();
        tx.record("apply", false, Duration::from_millis(3));
        let text = to_text_format(&render(&snapshot(), Some(&tx)));
        assert!(text.contains("# TYPE tess_cell_cpu_used_seconds_total counter\n"));
        assert!(text.contains("# HELP tess_transactions_total Requests"));
        assert!(text.contains("# TYPE tess_cell_memory_used_bytes gauge\n"));
        assert!(text.contains("# TYPE tess_transaction_duration_seconds histogram\n"));
        assert!(!text.contains("# UNIT") && !text.contains("# EOF"));
        assert!(text.contains("tess_transactions_total{op=\"apply\",result=\"error\"} 1"));
    }

    #[test]
    fn openmetrics_is_served_only_when_asked_for() {
        assert!(wants_openmetrics(
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
        ));
        assert!(!wants_openmetrics("*/*"));
    }

    #[test]
    fn buckets_span_microseconds_to_a_third_of_a_second() {
        let b: Vec<f64> = latency_buckets().collect();
        assert_eq!(b.len(), 16);
        assert!((b[0] - 10e-6).abs() < 1e-12);
        assert!(b[15] > 0.3 && b[15] < 0.4);
    }
}
