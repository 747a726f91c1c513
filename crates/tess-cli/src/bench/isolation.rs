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
//!   `H` (`tess work filler`) when the cell's hart spins.
//! - (b) the dedicated cell: tessd gives `H` to a dedicated cell (so the load, in the system
//!   group, loses `H`: the load runs on every hart the cell does not own), and the probe runs in
//!   it as plain `SCHED_OTHER` with the same memory locking and warm-up; tessd's idle spinner
//!   (`tessd __spin-idle H`) keeps the hart busy when the probe sleeps.
//!
//! Because spinning is a per-cell choice (`idle = spin | halt`) with a cost, (b) and (c) each run
//! twice, with a spinner and without, so one run shows the trade-off: the CPU time each spinner
//! burns while its probe runs (the kernel's per-thread accounting, as a fraction of a hart)
//! beside the latency it buys. The figures without a mode in their name are those of a
//! dedicated cell's default mode and the baseline with the same preparation.

use super::support::{collect, pick_hart, spawn_work, stop, us, Session};
use super::Common;
use tess_bench::spinner::{tessd_idle_spinner, SpinCost, SpinMeter};
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

/// Runs `f` while measuring the CPU time of process `spinner` (single-threaded).
fn measured<T>(
    spinner: Option<i32>,
    f: impl FnOnce() -> anyhow::Result<T>,
) -> anyhow::Result<(T, Option<SpinCost>)> {
    let meter = spinner.and_then(SpinMeter::start);
    let out = f()?;
    Ok((out, meter.and_then(SpinMeter::stop)))
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

/// One measured scenario of the prepared pair (cell or FIFO baseline) in one idle mode.
struct Run {
    lat: Summary,
    spin: Option<SpinCost>,
}

struct Outcome {
    plain: Summary,
    /// FIFO baseline with a spinner (`Spin`) and without (`Halt`), in that order.
    fifo: [Run; 2],
    /// Dedicated cell with `idle = spin` and `idle = halt`, in that order.
    cell: [Run; 2],
    load_plain: HartSet,
    load_cell: HartSet,
}

const MODES: [IdleMode; 2] = [IdleMode::Spin, IdleMode::Halt];

fn mode_name(m: IdleMode) -> &'static str {
    match m {
        IdleMode::Spin => "spin",
        IdleMode::Halt => "halt",
    }
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
    let spec = |idle: Option<IdleMode>| CellSpec {
        name: CELL.into(),
        policy: Policy::Dedicated,
        harts: HartRequest::Ids(HartSet::single(hart)),
        memory_max: None,
        pids_max: None,
        pinned: false,
        idle,
        broker: Default::default(),
    };
    // The figures without a mode in their name follow a dedicated cell's default.
    let default_mode = spec(None).idle_mode();
    let di = MODES.iter().position(|m| *m == default_mode).unwrap_or(0);

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

        // (c): the careful user's setup, with the cell's preparation in each idle mode.
        let mut fifo = Vec::new();
        for mode in MODES {
            float(load.id(), &status.harts);
            let filler = if mode == IdleMode::Spin {
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
            let (lat, spin) = res?;
            fifo.push(Run { lat, spin });
        }

        // (b): the dedicated cell; tessd takes the hart from the system group (and the load).
        let mut cell = Vec::new();
        let mut load_cell = HartSet::default();
        for mode in MODES {
            s.apply(vec![spec(Some(mode))])?;
            std::thread::sleep(std::time::Duration::from_millis(300));
            load_cell = allowed(load.id());
            let spinner = if mode == IdleMode::Spin {
                Some(tessd_idle_spinner(hart).ok_or_else(|| {
                    anyhow::anyhow!("no tessd spinner on hart {hart} in a spinning cell")
                })?)
            } else {
                None
            };
            let (lat, spin) = measured(spinner, || {
                collect(
                    spawn_work(Some(CELL), &probe_args(count, "other", None, true))?,
                    "the probe in the dedicated cell",
                )
            })?;
            s.delete(&[CELL]);
            cell.push(Run { lat, spin });
        }
        let two = |v: Vec<Run>| -> [Run; 2] {
            let mut it = v.into_iter();
            let a = it.next().expect("two runs");
            let b = it.next().expect("two runs");
            [a, b]
        };
        Ok(Outcome {
            plain,
            fifo: two(fifo),
            cell: two(cell),
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
    for (i, m) in MODES.iter().enumerate() {
        row(
            &mut t,
            &format!("(b) SCHED_OTHER, dedicated cell, idle = {}", mode_name(*m)),
            &o.cell[i].lat,
            spin(&o.cell[i].spin),
        );
    }
    for (i, m) in MODES.iter().enumerate() {
        row(
            &mut t,
            &format!(
                "(c) SCHED_FIFO 99 pinned, plain Linux, mlock, warm-up, {}",
                if *m == IdleMode::Spin {
                    "spinner"
                } else {
                    "no spinner"
                }
            ),
            &o.fifo[i].lat,
            spin(&o.fifo[i].spin),
        );
    }
    r.table(t);
    let (cell, fifo) = (&o.cell[di].lat, &o.fifo[di].lat);
    r.figure("iso_plain_mean_us", o.plain.mean);
    r.figure("iso_plain_median_us", o.plain.median);
    r.figure("iso_plain_p99_us", o.plain.p99);
    r.figure("iso_cell_mean_us", cell.mean);
    r.figure("iso_cell_median_us", cell.median);
    r.figure("iso_cell_p99_us", cell.p99);
    r.figure("iso_cell_max_us", cell.max);
    r.figure("iso_fifo_mean_us", fifo.mean);
    r.figure("iso_fifo_median_us", fifo.median);
    r.figure("iso_fifo_p99_us", fifo.p99);
    r.figure("iso_fifo_max_us", fifo.max);
    r.figure("noise_floor_max_us", floor.summary_us.max);
    for (i, m) in MODES.iter().enumerate() {
        let (c, f) = (&o.cell[i], &o.fifo[i]);
        let m = mode_name(*m);
        r.figure(format!("iso_cell_{m}_median_us"), c.lat.median);
        r.figure(format!("iso_cell_{m}_p99_us"), c.lat.p99);
        r.figure(format!("iso_fifo_{m}_median_us"), f.lat.median);
        r.figure(format!("iso_fifo_{m}_p99_us"), f.lat.p99);
        if let Some(sp) = c.spin {
            r.figure("iso_cell_spinner_hart_fraction", sp.fraction());
        }
        if let Some(sp) = f.spin {
            r.figure("iso_fifo_spinner_hart_fraction", sp.fraction());
        }
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
        cell.median <= 2.0 * fifo.median,
        format!("{:.1} vs {:.1} us", cell.median, fifo.median),
    );
    r.target(
        "(b) p99 at least 20x better than (a)",
        cell.p99 * 20.0 <= o.plain.p99,
        format!(
            "{:.1} vs {:.1} us ({:.0}x)",
            cell.p99,
            o.plain.p99,
            o.plain.p99 / cell.p99.max(1e-9)
        ),
    );
    r.note(format!(
        "measured hart {hart}; load: {LOAD_THREADS} SCHED_OTHER threads in one process outside cells, allowed on harts {} in (a) and (c), on {} while hart {hart} is dedicated in (b); (a) probe unpinned; (c) probe pinned to {hart}; noise floor on hart {hart} before the load starts",
        o.load_plain, o.load_cell
    ));
    r.note(format!(
        "preparation of (b) and (c): mlockall, {WARMUP} discarded warm-up wake-ups; each measured with a SCHED_IDLE spinner on the hart (tessd's for idle = spin, `tess work filler` for (c)) and without; the spinners' CPU time while the probe ran is in the last column; (a) has none. Figures without a mode in their name (iso_cell_*, iso_fifo_*) are a dedicated cell's default, idle = {}, and the baseline with the same preparation",
        mode_name(default_mode)
    ));
    r.note("seed 003 (Linux 2.6.35, quad-core i7, 128 CPU-bound background threads): the text editor's event latency, in the table's unit (us): 30.60 mean / 16.67 median on stock Qt, 0.26 mean / 0.15 median with its services in dedicated cpusets; it measured event delivery through a channel, we measure a timer wake-up");
    r.detail("noise_floor_us", floor.summary_us);
    r.detail("plain_us", o.plain);
    for (i, m) in MODES.iter().enumerate() {
        let m = mode_name(*m);
        r.detail(&format!("cell_{m}_us"), o.cell[i].lat);
        r.detail(&format!("fifo_{m}_us"), o.fifo[i].lat);
        r.detail(&format!("cell_{m}_spinner"), o.cell[i].spin);
        r.detail(&format!("fifo_{m}_spinner"), o.fifo[i].spin);
    }
    Ok(r)
}
