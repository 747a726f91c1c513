//! `tess bench isolation`: interactivity under load (seed 003).
//!
//! Seed 003 measured a text editor's event latency with 128 CPU-bound background threads
//! running: 30.60 us mean (16.67 median) with stock Qt on Linux, 0.26 us mean (0.15 median) with
//! the editor and its services in dedicated cpusets. Here a periodic task (1 ms period,
//! absolute-time sleeps; `tess work probe`) plays the editor and measures how late it wakes.
//!
//! Hart layout (measured hart `H`: `--hart`, default the highest hart tessd manages). One load
//! process of 128 CPU-bound `SCHED_OTHER` threads (`tess work load`) runs for the whole bench,
//! started as any user program would be and never pinned by the bench: it may use every hart
//! plain Linux lets it use. Its affinity is reset to all harts before each plain-Linux scenario
//! and the bench records where it may run.
//!
//! - noise floor: `SCHED_FIFO` 99 on `H` on the idle machine, before the load starts.
//! - (a) nothing: the probe as `SCHED_OTHER`, unpinned, no preparation; the load on all harts.
//! - (c) the best plain-Linux configuration: the probe pinned to `H` (`taskset`) at
//!   `SCHED_FIFO` 99, the load still floating over all harts (it is CFS, FIFO beats it), with the
//!   cell's preparation: memory locked, the same warm-up, and a `SCHED_IDLE` spinner pinned to
//!   `H` (`tess work filler`) when the cell's hart spins, as a dedicated cell's does by default.
//! - (b) the dedicated cell: tessd gives `H` to a dedicated cell (so the load, in the system
//!   group, loses `H`: the load runs on every hart the cell does not own), and the probe runs in
//!   it as plain `SCHED_OTHER` with the same memory locking and warm-up; tessd's idle spinner
//!   (`tessd __spin-idle H`) keeps the hart busy when the probe sleeps.
//!
//! The CPU time each spinner burns while its probe runs is measured from the kernel's
//! per-thread accounting and shown as a fraction of a hart.

use super::support::{collect, pick_hart, spawn_work, stop, us, Session};
use super::Common;
use tess_bench::{probe, Report, Summary, Table};
use tess_core::spec::{CellSpec, HartRequest, IdleMode, Policy};
use tess_sched::HartSet;

const CELL: &str = "iso-probe";
/// Wake-ups each probe does before it measures (all scenarios).
const WARMUP: usize = 200;
/// CPU-bound background threads (seed 003).
const LOAD_THREADS: usize = 128;

fn probe_args(count: usize, policy: &str, hart: Option<usize>, prepared: bool) -> Vec<String> {
    let mut a = vec![
        "probe".into(),
        "--count".into(),
        count.to_string(),
        "--policy".into(),
        policy.into(),
    ];
    if let Some(h) = hart {
        a.extend(["--hart".into(), h.to_string()]);
    }
    if prepared {
        a.extend(["--mlock".into(), "--warmup".into(), WARMUP.to_string()]);
    }
    a
}

/// A spinner's CPU time over a probe run.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
struct SpinCost {
    cpu_ms: f64,
    wall_ms: f64,
}

impl SpinCost {
    fn fraction(&self) -> f64 {
        if self.wall_ms > 0.0 {
            self.cpu_ms / self.wall_ms
        } else {
            0.0
        }
    }
}

/// Runs `f` while measuring the CPU time of process `spinner` (single-threaded).
fn measured<T>(
    spinner: Option<i32>,
    f: impl FnOnce() -> anyhow::Result<T>,
) -> anyhow::Result<(T, Option<SpinCost>)> {
    let cpu = |pid: i32| tess_sched::proc::thread_cpu_ns(pid, pid);
    let c0 = spinner.and_then(cpu);
    let t0 = std::time::Instant::now();
    let out = f()?;
    let wall_ms = t0.elapsed().as_secs_f64() * 1e3;
    let cost = match (spinner, c0) {
        (Some(p), Some(c0)) => cpu(p).map(|c1| SpinCost {
            cpu_ms: c1.saturating_sub(c0) as f64 / 1e6,
            wall_ms,
        }),
        _ => None,
    };
    Ok((out, cost))
}

/// tessd's idle spinner on `hart` (`tessd __spin-idle HART`), found by its command line.
fn tessd_spinner(hart: usize) -> Option<i32> {
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
        if args.len() >= 3 && args[1] == b"__spin-idle" && args[2] == hart.to_string().as_bytes() {
            return Some(pid);
        }
    }
    None
}

/// Lets every thread of `pid` run on `harts` (the cpuset still decides what they get).
fn float(pid: u32, harts: &HartSet) {
    for tid in tess_sched::proc::threads_of(pid as i32) {
        let _ = tess_sched::affinity::set_affinity(tid, harts);
    }
}

/// Where the threads of `pid` may run (the union of their affinities).
fn allowed(pid: u32) -> HartSet {
    let mut all = HartSet::default();
    for tid in tess_sched::proc::threads_of(pid as i32) {
        if let Ok(a) = tess_sched::affinity::get_affinity(tid) {
            all = all.union(&a);
        }
    }
    all
}

struct Outcome {
    plain: Summary,
    fifo: Summary,
    cell: Summary,
    fifo_spin: Option<SpinCost>,
    cell_spin: Option<SpinCost>,
    load_plain: HartSet,
    load_cell: HartSet,
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
    let spec = CellSpec {
        name: CELL.into(),
        policy: Policy::Dedicated,
        harts: HartRequest::Ids(HartSet::single(hart)),
        memory_max: None,
        pids_max: None,
        pinned: false,
        idle: None,
    };
    let cell_spins = spec.idle_mode() == IdleMode::Spin;

    let floor = probe::noise_floor(hart, count)?;
    let load = spawn_work(
        None,
        &["load".into(), "--threads".into(), LOAD_THREADS.to_string()],
    )?;
    let mut run = || -> anyhow::Result<Outcome> {
        std::thread::sleep(std::time::Duration::from_millis(500));
        float(load.id(), &status.harts);
        let load_plain = allowed(load.id());
        let plain: Summary = collect(
            spawn_work(None, &probe_args(count, "other", None, false))?,
            "the SCHED_OTHER probe",
        )?;

        // (c): the careful user's setup, with the cell's preparation.
        float(load.id(), &status.harts);
        let filler = if cell_spins {
            let f = spawn_work(None, &["filler".into()])?;
            tess_sched::affinity::set_affinity(f.id() as i32, &HartSet::single(hart))?;
            Some(f)
        } else {
            None
        };
        let res = measured(filler.as_ref().map(|f| f.id() as i32), || {
            collect(
                spawn_work(None, &probe_args(count, "fifo99", Some(hart), true))?,
                "the SCHED_FIFO probe",
            )
        });
        if let Some(f) = filler {
            stop(f);
        }
        let (fifo, fifo_spin): (Summary, _) = res?;

        // (b): the dedicated cell; tessd takes the hart from the system group (and the load).
        s.apply(vec![spec.clone()])?;
        std::thread::sleep(std::time::Duration::from_millis(300));
        let load_cell = allowed(load.id());
        let spinner = if cell_spins {
            tessd_spinner(hart)
        } else {
            None
        };
        let (cell, cell_spin): (Summary, _) = measured(spinner, || {
            collect(
                spawn_work(Some(CELL), &probe_args(count, "other", None, true))?,
                "the probe in the dedicated cell",
            )
        })?;
        s.delete(&[CELL]);
        Ok(Outcome {
            plain,
            fifo,
            cell,
            fifo_spin,
            cell_spin,
            load_plain,
            load_cell,
        })
    };
    let res = run();
    stop(load);
    let o = res?;

    let mut r = Report::new("isolation");
    let mut t = Table::new(
        format!("wake-up latency of a 1 ms periodic task with {LOAD_THREADS} CPU-bound threads running (us)"),
        &[
            "scenario", "samples", "mean", "median", "p99", "p99.9", "max", "spinner CPU",
        ],
    );
    let spin = |x: &Option<SpinCost>| match x {
        Some(c) => format!("{:.0}% of a hart", 100.0 * c.fraction()),
        None => "-".into(),
    };
    let row = |t: &mut Table, name: &str, x: &Summary, sp: String| {
        t.row(&[
            name.to_string(),
            x.count.to_string(),
            us(x.mean),
            us(x.median),
            us(x.p99),
            us(x.p999),
            us(x.max),
            sp,
        ]);
    };
    row(
        &mut t,
        "noise floor: SCHED_FIFO 99, idle machine",
        &floor.summary_us,
        "-".into(),
    );
    row(
        &mut t,
        "(a) SCHED_OTHER, plain Linux, nothing prepared",
        &o.plain,
        "-".into(),
    );
    row(
        &mut t,
        "(b) SCHED_OTHER, dedicated cell",
        &o.cell,
        spin(&o.cell_spin),
    );
    row(
        &mut t,
        "(c) SCHED_FIFO 99 pinned, plain Linux, cell's preparation",
        &o.fifo,
        spin(&o.fifo_spin),
    );
    r.table(t);
    r.figure("iso_plain_mean_us", o.plain.mean);
    r.figure("iso_plain_median_us", o.plain.median);
    r.figure("iso_plain_p99_us", o.plain.p99);
    r.figure("iso_cell_mean_us", o.cell.mean);
    r.figure("iso_cell_median_us", o.cell.median);
    r.figure("iso_cell_p99_us", o.cell.p99);
    r.figure("iso_cell_max_us", o.cell.max);
    r.figure("iso_fifo_mean_us", o.fifo.mean);
    r.figure("iso_fifo_median_us", o.fifo.median);
    r.figure("iso_fifo_p99_us", o.fifo.p99);
    r.figure("iso_fifo_max_us", o.fifo.max);
    r.figure("noise_floor_max_us", floor.summary_us.max);
    if let Some(c) = o.cell_spin {
        r.figure("iso_cell_spinner_hart_fraction", c.fraction());
    }
    if let Some(c) = o.fifo_spin {
        r.figure("iso_fifo_spinner_hart_fraction", c.fraction());
    }
    let best =
        "SCHED_FIFO 99 pinned by taskset, mlock, same warm-up and spinner, load on all harts";
    r.compare(
        "mean wake-up latency under 128 CPU-bound threads (us)",
        Some("seed 003 Table (textedit, loaded): 0.26 in cpusets; stock Linux 30.60"),
        "iso_cell_mean_us",
        Some(("iso_fifo_mean_us", best)),
    );
    r.compare(
        "median wake-up latency under 128 CPU-bound threads (us)",
        Some("seed 003 Table (textedit, loaded): 0.15 in cpusets; stock Linux 16.67"),
        "iso_cell_median_us",
        Some(("iso_fifo_median_us", best)),
    );
    r.compare(
        "p99 wake-up latency under 128 CPU-bound threads (us)",
        None,
        "iso_cell_p99_us",
        Some(("iso_fifo_p99_us", best)),
    );
    r.compare(
        "mean wake-up latency vs an unprepared Linux program (us)",
        Some("seed 003 Table (textedit, loaded): 0.26 (cpusets) vs 30.60 (stock)"),
        "iso_cell_mean_us",
        Some((
            "iso_plain_mean_us",
            "SCHED_OTHER, unpinned, nothing prepared",
        )),
    );
    r.target(
        "(b) median within 2x of (c)",
        o.cell.median <= 2.0 * o.fifo.median,
        format!("{:.1} vs {:.1} us", o.cell.median, o.fifo.median),
    );
    r.target(
        "(b) p99 at least 20x better than (a)",
        o.cell.p99 * 20.0 <= o.plain.p99,
        format!(
            "{:.1} vs {:.1} us ({:.0}x)",
            o.cell.p99,
            o.plain.p99,
            o.plain.p99 / o.cell.p99.max(1e-9)
        ),
    );
    r.note(format!(
        "measured hart {hart}; load: {LOAD_THREADS} SCHED_OTHER threads in one process outside cells, allowed on harts {} in (a) and (c), on {} while hart {hart} is dedicated in (b); (a) probe unpinned; (c) probe pinned to {hart}; noise floor on hart {hart} before the load starts",
        o.load_plain, o.load_cell
    ));
    r.note(format!(
        "preparation of (b) and (c): mlockall, {WARMUP} discarded warm-up wake-ups, {}; (a) has none",
        if cell_spins {
            "a SCHED_IDLE spinner on the hart (tessd's in (b), `tess work filler` in (c)); its CPU time while the probe ran is in the last column"
        } else {
            "no spinner (the cell lets its hart idle)"
        }
    ));
    r.note("seed 003 (Linux 2.6.35, quad-core i7, 128 CPU-bound background threads): the text editor's event latency, in the table's unit (us): 30.60 mean / 16.67 median on stock Qt, 0.26 mean / 0.15 median with its services in dedicated cpusets; it measured event delivery through a channel, we measure a timer wake-up");
    r.detail("noise_floor_us", floor.summary_us);
    r.detail("plain_us", o.plain);
    r.detail("cell_us", o.cell);
    r.detail("fifo_us", o.fifo);
    r.detail("cell_spinner", o.cell_spin);
    r.detail("fifo_spinner", o.fifo_spin);
    Ok(r)
}
