//! `tess bench mux`: multiplexing accuracy (seed 004 section 3.2).
//!
//! A CPU-bound kernel runs in cells that share one hart: an event-triggered 20% cell
//! (2 ms / 10 ms), a time-triggered 25% cell (2.5 ms window every 10 ms) and two best-effort
//! cells. Each reserved cell's throughput beside others is compared with its throughput alone;
//! two best-effort cells sharing the hart should each get half of what one gets alone. All cells
//! exist throughout (an idle cell costs nothing); a scenario decides which ones run work.
//!
//! Throughput per CPU-second on a virtual machine depends on whether the vCPU went idle (the
//! hypervisor deschedules it) and on the other vCPU's load. So a SCHED_IDLE filler in a
//! weight-1 cell keeps the measured hart busy with time nobody else wants, the scenarios run in
//! several interleaved rounds, and each figure is the median over rounds. The CPU time each
//! workload received is reported beside its throughput.
//!
//! Requested versus delivered share: each cell's reservation (event-triggered 20%,
//! time-triggered 25%; a best-effort cell asks for an equal split of what is left: all of the
//! hart alone, 80% beside the 20% cell, 50% of a pair) against the CPU time its workload
//! actually received over the measurement window (`mux_et_requested`, `mux_et_delivered`, ...).
//! The paper states its results as throughput relative to the same cell alone; both are shown.
//! A dedicated cell is left out: it owns its hart, so its share is 100% by construction
//! (`tess bench isolation` measures what it delivers).
//!
//! Time-multiplexing latency per policy (seed 004 Table 2: 2.12 us average, 8.69 us max; the
//! paper does not say for which policy): how long after an event a cell's thread runs. A probe
//! in the event-triggered cell and one in a best-effort cell sleep to absolute times 1 ms apart
//! (a timer is the event) while a CPU-bound workload runs in the other best-effort cell on the
//! same hart; each wake-up's lateness is the latency. The plain-Linux baselines run before the
//! cells exist (a cell's hart is then not available to other processes): a `SCHED_FIFO` 99
//! thread, and a plain `SCHED_OTHER` one, pinned to the same hart beside the same CPU-bound
//! workload pinned there. The time-triggered policy's latency (window start to running) is in
//! `tess bench gang`.

use super::support::{cell_on_hart, collect, pick_hart, spawn_work, stop, Session};
use super::Common;
use std::time::Duration;
use tess_bench::Summary;
use tess_bench::{Report, Table};
use tess_core::spec::Policy;
use tess_sched::{clock, HartSet};

const ET: &str = "mux-et20";
const TT: &str = "mux-tt25";
const BE1: &str = "mux-be1";
const BE2: &str = "mux-be2";
const FILL: &str = "mux-filler";

#[derive(serde::Deserialize, Clone, Copy)]
struct SpinResult {
    rate: f64,
    cpu_ns: u64,
    seconds: f64,
}

/// Runs the given cells' workers over one common measurement window.
fn scenario(cells: &[&str], window: Duration) -> anyhow::Result<Vec<SpinResult>> {
    let start = clock::now_ns() + 1_200_000_000;
    let args: Vec<String> = vec![
        "spin".into(),
        "--start-ns".into(),
        start.to_string(),
        "--window-ms".into(),
        window.as_millis().to_string(),
    ];
    let children: Vec<_> = cells
        .iter()
        .map(|c| spawn_work(Some(c), &args))
        .collect::<Result<_, _>>()?;
    let mut out = Vec::new();
    for (child, name) in children.into_iter().zip(cells) {
        out.push(collect(child, &format!("the workload in cell {name}"))?);
    }
    Ok(out)
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
    xs[xs.len() / 2]
}

/// Scenarios: name, cells running work.
const SCENARIOS: [(&str, &[&str]); 7] = [
    ("et_alone", &[ET]),
    ("et_with_be", &[ET, BE1]),
    ("et_with_tt", &[ET, TT]),
    ("tt_alone", &[TT]),
    ("tt_with_et_be", &[TT, ET, BE1]),
    ("be_alone", &[BE1]),
    ("be_pair", &[BE1, BE2]),
];

/// Runs the benchmark.
pub fn run(c: &Common) -> anyhow::Result<Report> {
    let mut s = Session::connect()?;
    let status = s.status()?;
    let hart = pick_hart(c.hart, &status)?;
    let (window, rounds) = if c.quick {
        (Duration::from_millis(800), 1)
    } else {
        (Duration::from_secs(3), 3)
    };
    let probes = if c.quick { 500 } else { 3000 };
    let linux = linux_latency(hart, probes)?;
    let ms = Duration::from_millis;
    s.apply(vec![
        cell_on_hart(
            ET,
            Policy::EventTriggered {
                period: ms(10),
                budget: ms(2),
            },
            hart,
        ),
        cell_on_hart(
            TT,
            Policy::TimeTriggered {
                period: ms(10),
                active: Duration::from_micros(2500),
                offset: None,
            },
            hart,
        ),
        cell_on_hart(BE1, Policy::BestEffort { weight: 100 }, hart),
        cell_on_hart(BE2, Policy::BestEffort { weight: 100 }, hart),
        cell_on_hart(FILL, Policy::BestEffort { weight: 1 }, hart),
    ])?;
    let filler = spawn_work(Some(FILL), &["filler".into()])?;
    // results[scenario][cell index] = samples over rounds
    let mut results: Vec<Vec<Vec<SpinResult>>> = SCENARIOS
        .iter()
        .map(|(_, cs)| vec![Vec::new(); cs.len()])
        .collect();
    let mut failure = None;
    'rounds: for _ in 0..rounds {
        for (i, (_, cells)) in SCENARIOS.iter().enumerate() {
            match scenario(cells, window) {
                Ok(rs) => {
                    for (j, r) in rs.into_iter().enumerate() {
                        results[i][j].push(r);
                    }
                }
                Err(e) => {
                    failure = Some(e);
                    break 'rounds;
                }
            }
        }
    }
    let latency = if failure.is_none() {
        match cell_latency(linux, probes) {
            Ok(l) => Some(l),
            Err(e) => {
                failure = Some(e);
                None
            }
        }
    } else {
        None
    };
    stop(filler);
    s.delete(&[ET, TT, BE1, BE2, FILL]);
    if let Some(e) = failure {
        return Err(e);
    }
    let latency = latency.expect("measured when nothing failed");
    let rate = |i: usize, j: usize| median(results[i][j].iter().map(|r| r.rate).collect());
    let cpu = |i: usize, j: usize| {
        median(
            results[i][j]
                .iter()
                .map(|r| r.cpu_ns as f64 / 1e9 / r.seconds)
                .collect(),
        )
    };
    let (et_alone, tt_alone, be_alone) = (rate(0, 0), rate(3, 0), rate(5, 0));

    let mut r = Report::new("mux");
    let mut t = Table::new(
        format!("throughput of a CPU-bound kernel on hart {hart} (work units/s, median of {rounds} round(s)), relative to the same cell alone"),
        &["cell", "running beside", "rate", "ratio to alone", "cpu time share"],
    );
    let rows: [(&str, &str, usize, usize, f64); 9] = [
        ("event-triggered 20%", "nothing", 0, 0, et_alone),
        ("event-triggered 20%", "best-effort", 1, 0, et_alone),
        ("event-triggered 20%", "time-triggered 25%", 2, 0, et_alone),
        ("time-triggered 25%", "nothing", 3, 0, tt_alone),
        (
            "time-triggered 25%",
            "event-triggered 20% + best-effort",
            4,
            0,
            tt_alone,
        ),
        ("best-effort", "nothing", 5, 0, be_alone),
        ("best-effort #1", "best-effort #2", 6, 0, be_alone),
        ("best-effort #2", "best-effort #1", 6, 1, be_alone),
        ("best-effort", "event-triggered 20%", 1, 1, be_alone),
    ];
    for (cell, beside, i, j, alone) in rows {
        let x = rate(i, j);
        t.row(&[
            cell.to_string(),
            beside.into(),
            format!("{x:.0}"),
            format!("{:.3}", x / alone),
            format!("{:.1}%", cpu(i, j) * 100.0),
        ]);
    }
    r.table(t);
    let reserved = [
        rate(1, 0) / et_alone,
        rate(2, 0) / et_alone,
        rate(4, 0) / tt_alone,
    ];
    let worst = reserved.iter().copied().fold(f64::INFINITY, f64::min);
    let worst_dev = reserved.iter().map(|x| (x - 1.0).abs()).fold(0.0, f64::max);
    let shares = [rate(6, 0) / be_alone, rate(6, 1) / be_alone];
    let be_min = shares[0].min(shares[1]);
    let be_max = shares[0].max(shares[1]);
    r.figure("mux_reserved_worst_ratio", worst);
    r.figure("mux_be_share_min", be_min);
    r.figure("mux_be_share_max", be_max);
    share_table(
        &mut r,
        hart,
        &cpu,
        rate(1, 0) / et_alone,
        rate(4, 0) / tt_alone,
        shares,
    );
    latency_table(&mut r, hart, &latency);
    r.target(
        "reserved cells within 3% of alone",
        worst_dev <= 0.03,
        format!("largest deviation {:.2}%", worst_dev * 100.0),
    );
    r.target(
        "two best-effort cells each 50% +- 5%",
        be_min >= 0.45 && be_max <= 0.55,
        format!("{:.1}% and {:.1}%", be_min * 100.0, be_max * 100.0),
    );
    r.note(format!(
        "hart {hart} holds every cell (event-triggered 2ms/10ms, time-triggered 2.5ms/10ms, two best-effort, a weight-1 SCHED_IDLE filler); the system's tasks run on {}; the benchmark itself sleeps while measuring",
        status.managed.difference(&HartSet::single(hart))
    ));
    r.note(format!("{rounds} round(s) of 7 scenarios, {} ms measurement window each, workloads started 1.2 s before it", window.as_millis()));
    r.note("seed 004: a 25% time-triggered cell and a 20% event-triggered cell run the same alone or with others; two best-effort cells get 50% each");
    let detail: Vec<serde_json::Value> = SCENARIOS
        .iter()
        .enumerate()
        .map(|(i, (name, cells))| {
            serde_json::json!({
                "scenario": name,
                "cells": cells,
                "rates": (0..cells.len()).map(|j| results[i][j].iter().map(|r| r.rate).collect::<Vec<_>>()).collect::<Vec<_>>(),
                "cpu_share": (0..cells.len()).map(|j| cpu(i, j)).collect::<Vec<_>>(),
            })
        })
        .collect();
    r.detail("scenarios", detail);
    Ok(r)
}

/// Requested versus delivered CPU share per cell and scenario, as a table and figures.
fn share_table(
    r: &mut Report,
    hart: usize,
    cpu: &dyn Fn(usize, usize) -> f64,
    et_ratio: f64,
    tt_ratio: f64,
    be_ratios: [f64; 2],
) {
    // (policy key, cell, beside, scenario, cell index, requested share)
    let rows: [(&str, &str, &str, usize, usize, f64); 9] = [
        (
            "et_alone",
            "event-triggered 2ms/10ms",
            "nothing",
            0,
            0,
            0.20,
        ),
        ("et", "event-triggered 2ms/10ms", "best-effort", 1, 0, 0.20),
        (
            "et_with_tt",
            "event-triggered 2ms/10ms",
            "time-triggered",
            2,
            0,
            0.20,
        ),
        (
            "tt_alone",
            "time-triggered 2.5ms/10ms",
            "nothing",
            3,
            0,
            0.25,
        ),
        (
            "tt",
            "time-triggered 2.5ms/10ms",
            "event-triggered + best-effort",
            4,
            0,
            0.25,
        ),
        ("be_alone", "best-effort", "nothing", 5, 0, 1.0),
        (
            "be_beside_et",
            "best-effort",
            "event-triggered 20%",
            1,
            1,
            0.80,
        ),
        ("be1", "best-effort #1", "best-effort #2", 6, 0, 0.50),
        ("be2", "best-effort #2", "best-effort #1", 6, 1, 0.50),
    ];
    let mut t = Table::new(
        format!("requested vs delivered CPU share on hart {hart} (median over rounds)"),
        &[
            "cell",
            "beside",
            "hart",
            "requested",
            "delivered",
            "delivered / requested",
        ],
    );
    for (key, cell, beside, i, j, requested) in rows {
        let delivered = cpu(i, j);
        t.row(&[
            cell.to_string(),
            beside.into(),
            hart.to_string(),
            format!("{:.1}%", requested * 100.0),
            format!("{:.1}%", delivered * 100.0),
            format!("{:.3}", delivered / requested),
        ]);
        r.figure(format!("mux_{key}_requested"), requested);
        r.figure(format!("mux_{key}_delivered"), delivered);
    }
    r.table(t);
    r.figure("mux_et_ratio_to_alone", et_ratio)
        .figure("mux_tt_ratio_to_alone", tt_ratio)
        .figure("mux_be1_ratio_to_alone", be_ratios[0])
        .figure("mux_be2_ratio_to_alone", be_ratios[1]);
    r.compare(
        "event-triggered 20% beside best-effort: throughput / alone",
        Some("seed 004 section 3.2: runs the same (1.0)"),
        "mux_et_ratio_to_alone",
        None,
    )
    .compare(
        "event-triggered 20% beside best-effort: delivered CPU share",
        Some("seed 004 section 3.2: 20% reserved"),
        "mux_et_delivered",
        None,
    )
    .compare(
        "time-triggered 25% beside event-triggered + best-effort: throughput / alone",
        Some("seed 004 section 3.2: near identical (1.0)"),
        "mux_tt_ratio_to_alone",
        None,
    )
    .compare(
        "time-triggered 25% beside event-triggered + best-effort: delivered CPU share",
        Some("seed 004 section 3.2: 25% reserved"),
        "mux_tt_delivered",
        None,
    )
    .compare(
        "best-effort pair: each one's throughput / alone (lower of the two)",
        Some("seed 004 section 3.2: 50% each"),
        "mux_be_share_min",
        None,
    )
    .compare(
        "best-effort pair: delivered CPU share of #1",
        Some("seed 004 section 3.2: 50% each"),
        "mux_be1_delivered",
        None,
    );
}

/// Wake-up lateness per policy (see the module docs).
struct PolicyLatency {
    et: Summary,
    be: Summary,
    fifo: Summary,
    other: Summary,
}

/// A CPU-bound workload for `ms` milliseconds, in `cell` or (`None`) pinned to `hart`.
fn load(cell: Option<&str>, hart: usize, ms: u64) -> anyhow::Result<std::process::Child> {
    let child = spawn_work(
        cell,
        &[
            "spin".into(),
            "--start-ns".into(),
            clock::now_ns().to_string(),
            "--window-ms".into(),
            ms.to_string(),
        ],
    )?;
    if cell.is_none() {
        if let Err(e) =
            tess_sched::affinity::set_affinity(child.id() as i32, &HartSet::single(hart))
        {
            stop(child);
            anyhow::bail!("pinning the baseline's load to hart {hart}: {e}");
        }
    }
    Ok(child)
}

/// The plain-Linux probes on `hart` beside a pinned CPU-bound load, before any cell exists
/// (the `et` and `be` fields are filled by [`cell_latency`]).
fn linux_latency(hart: usize, count: usize) -> anyhow::Result<PolicyLatency> {
    let busy = load(None, hart, 2 * count as u64 + 2000)?;
    let probe = |policy| {
        tess_bench::probe::wakeup_latency(hart, policy, Duration::from_millis(1), count)
            .map(|p| p.summary_us)
    };
    let measured = (|| -> anyhow::Result<PolicyLatency> {
        Ok(PolicyLatency {
            fifo: probe(tess_sched::Policy::Fifo { priority: 99 })?,
            other: probe(tess_sched::Policy::OTHER)?,
            et: Summary::default(),
            be: Summary::default(),
        })
    })();
    stop(busy);
    measured
}

/// Probes the event-triggered and a best-effort cell while a CPU-bound workload runs in the
/// other best-effort cell on the same hart.
fn cell_latency(linux: PolicyLatency, count: usize) -> anyhow::Result<PolicyLatency> {
    let probe_args: Vec<String> = vec![
        "probe".into(),
        "--period-us".into(),
        "1000".into(),
        "--count".into(),
        count.to_string(),
        "--policy".into(),
        "keep".into(),
    ];
    // The load outlasts the two probes (1 ms each wake-up) with a margin.
    let busy = load(Some(BE2), 0, 2 * count as u64 + 3000)?;
    let measured = (|| -> anyhow::Result<PolicyLatency> {
        let et: Summary = collect(
            spawn_work(Some(ET), &probe_args)?,
            "the probe in the event-triggered cell",
        )?;
        let be: Summary = collect(
            spawn_work(Some(BE1), &probe_args)?,
            "the probe in the best-effort cell",
        )?;
        Ok(PolicyLatency { et, be, ..linux })
    })();
    stop(busy);
    measured
}

/// Time-multiplexing latency per policy, as a table, figures and side-by-side rows.
fn latency_table(r: &mut Report, hart: usize, l: &PolicyLatency) {
    let mut t = Table::new(
        format!("time-multiplexing latency on hart {hart}: timer event to the thread running, beside a CPU-bound best-effort cell (us)"),
        &["policy", "median", "mean", "p99", "max", "stdev"],
    );
    for (name, key, s) in [
        ("event-triggered cell (2ms/10ms)", "et", &l.et),
        ("best-effort cell", "be", &l.be),
        ("plain Linux: SCHED_FIFO 99 pinned", "fifo", &l.fifo),
        ("plain Linux: SCHED_OTHER pinned", "other", &l.other),
    ] {
        t.row(&[
            name.to_string(),
            format!("{:.2}", s.median),
            format!("{:.2}", s.mean),
            format!("{:.2}", s.p99),
            format!("{:.2}", s.max),
            format!("{:.2}", s.stdev),
        ]);
        r.figure(format!("mux_latency_{key}_median_us"), s.median)
            .figure(format!("mux_latency_{key}_mean_us"), s.mean)
            .figure(format!("mux_latency_{key}_p99_us"), s.p99)
            .figure(format!("mux_latency_{key}_max_us"), s.max);
    }
    r.table(t);
    let fifo = "SCHED_FIFO 99 thread pinned to the hart, same load pinned there";
    for (key, policy) in [("et", "event-triggered"), ("be", "best-effort")] {
        r.compare(
            format!("time-multiplexing latency, {policy}: event to running, mean (us)"),
            Some("seed 004 Table 2: average 2.122 (policy not stated)"),
            format!("mux_latency_{key}_mean_us"),
            Some(("mux_latency_fifo_mean_us", fifo)),
        )
        .compare(
            format!("time-multiplexing latency, {policy}: event to running, max (us)"),
            Some("seed 004 Table 2: max 8.685"),
            format!("mux_latency_{key}_max_us"),
            Some(("mux_latency_fifo_max_us", fifo)),
        );
    }
    r.note("time-multiplexing latency, time-triggered: see tess bench gang (gang_release_*)");
}
