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

use super::support::{collect, pick_hart, spawn_work, stop, Session};
use super::Common;
use std::time::Duration;
use tess_bench::{Report, Table};
use tess_core::spec::{CellSpec, HartRequest, Policy};
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

fn cell(name: &str, policy: Policy, hart: usize) -> CellSpec {
    CellSpec {
        name: name.into(),
        policy,
        harts: HartRequest::Ids(HartSet::single(hart)),
        memory_max: None,
        pids_max: None,
        pinned: false,
        idle: None,
    }
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
    let ms = Duration::from_millis;
    s.apply(vec![
        cell(
            ET,
            Policy::EventTriggered {
                period: ms(10),
                budget: ms(2),
            },
            hart,
        ),
        cell(
            TT,
            Policy::TimeTriggered {
                period: ms(10),
                active: Duration::from_micros(2500),
                offset: None,
            },
            hart,
        ),
        cell(BE1, Policy::BestEffort { weight: 100 }, hart),
        cell(BE2, Policy::BestEffort { weight: 100 }, hart),
        cell(FILL, Policy::BestEffort { weight: 1 }, hart),
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
    stop(filler);
    s.delete(&[ET, TT, BE1, BE2, FILL]);
    if let Some(e) = failure {
        return Err(e);
    }
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
