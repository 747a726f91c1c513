//! `tess bench isolation`: interactivity under load (seed 003).
//!
//! A periodic task (1 ms period, absolute-time sleeps) measures how late it wakes while 128
//! CPU-bound threads run: (a) as SCHED_OTHER on plain Linux, (b) as SCHED_OTHER inside a
//! dedicated cell, (c) as SCHED_FIFO 99 on plain Linux (the best Linux can do). The noise floor
//! (FIFO 99 on the idle machine) is measured first, in the same run.

use super::support::{collect, pick_hart, spawn_work, stop, us, Session};
use super::Common;
use tess_bench::{probe, Report, Summary, Table};
use tess_core::spec::{CellSpec, HartRequest, Policy};
use tess_sched::HartSet;

const CELL: &str = "iso-probe";

fn probe_args(count: usize, policy: &str) -> Vec<String> {
    vec![
        "probe".into(),
        "--count".into(),
        count.to_string(),
        "--policy".into(),
        policy.into(),
    ]
}

/// Runs the benchmark.
pub fn run(c: &Common) -> anyhow::Result<Report> {
    let mut s = Session::connect()?;
    let status = s.status()?;
    let hart = pick_hart(c.hart, &status)?;
    let count = if c.quick { 1500 } else { 10_000 };
    anyhow::ensure!(
        status.dedicated.is_empty() || !status.dedicated.contains(hart),
        "hart {hart} is already dedicated to a cell; pick another with --hart"
    );

    let floor = probe::noise_floor(hart, count)?;
    let load = spawn_work(None, &["load".into(), "--threads".into(), "128".into()])?;
    std::thread::sleep(std::time::Duration::from_millis(500));
    let mut run = || -> anyhow::Result<(Summary, Summary, Summary)> {
        let plain: Summary = collect(
            spawn_work(None, &probe_args(count, "other"))?,
            "the SCHED_OTHER probe",
        )?;
        let fifo: Summary = collect(
            spawn_work(None, &probe_args(count, "fifo99"))?,
            "the SCHED_FIFO probe",
        )?;
        s.apply(vec![CellSpec {
            name: CELL.into(),
            policy: Policy::Dedicated,
            harts: HartRequest::Ids(HartSet::single(hart)),
            memory_max: None,
            pids_max: None,
            pinned: false,
            idle: None,
        }])?;
        let cell: Summary = collect(
            spawn_work(Some(CELL), &probe_args(count, "other"))?,
            "the probe in the dedicated cell",
        )?;
        s.delete(&[CELL]);
        Ok((plain, cell, fifo))
    };
    let res = run();
    stop(load);
    let (plain, cell, fifo) = res?;

    let mut r = Report::new("isolation");
    let mut t = Table::new(
        "wake-up latency of a 1 ms periodic task with 128 CPU-bound threads running (us)",
        &["scenario", "samples", "median", "p99", "p99.9", "max"],
    );
    let row = |t: &mut Table, name: &str, x: &Summary| {
        t.row(&[
            name.to_string(),
            x.count.to_string(),
            us(x.median),
            us(x.p99),
            us(x.p999),
            us(x.max),
        ]);
    };
    row(
        &mut t,
        "noise floor: SCHED_FIFO 99, idle machine",
        &floor.summary_us,
    );
    row(&mut t, "(a) SCHED_OTHER, plain Linux", &plain);
    row(&mut t, "(b) SCHED_OTHER, dedicated cell", &cell);
    row(&mut t, "(c) SCHED_FIFO 99, plain Linux", &fifo);
    r.table(t);
    r.figure("iso_plain_p99_us", plain.p99);
    r.figure("iso_cell_median_us", cell.median);
    r.figure("iso_cell_p99_us", cell.p99);
    r.figure("iso_fifo_median_us", fifo.median);
    r.figure("iso_fifo_p99_us", fifo.p99);
    r.figure("noise_floor_max_us", floor.summary_us.max);
    r.target(
        "(b) median within 2x of (c)",
        cell.median <= 2.0 * fifo.median,
        format!("{:.1} vs {:.1} us", cell.median, fifo.median),
    );
    r.target(
        "(b) p99 at least 20x better than (a)",
        cell.p99 * 20.0 <= plain.p99,
        format!(
            "{:.1} vs {:.1} us ({:.0}x)",
            cell.p99,
            plain.p99,
            plain.p99 / cell.p99.max(1e-9)
        ),
    );
    r.note(format!(
        "load: 128 SCHED_OTHER threads in one process outside cells (on harts {} in (a) and (c), on {} once hart {hart} is dedicated in (b)); probes unpinned in (a) and (c); noise floor on hart {hart} before the load starts",
        status.system,
        status.system.difference(&HartSet::single(hart))
    ));
    r.note("seed 003 (Linux 2.6.35, 128 CPU-bound background threads): a text editor's event latency was 30.6 us mean (37.2 us stdev) under load on stock Linux, 0.26 us (0.42 us stdev) with its services on dedicated cpusets");
    r.detail("noise_floor_us", floor.summary_us);
    r.detail("plain_us", plain);
    r.detail("cell_us", cell);
    r.detail("fifo_us", fifo);
    Ok(r)
}
