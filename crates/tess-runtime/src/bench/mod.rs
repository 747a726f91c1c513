//! `tess bench gang`: gang-scheduling skew, window-entry latency and adaptation latency of the
//! runtime in a 2-hart time-triggered cell, beside the machine's noise floor (seed 004 Table 1:
//! skew 0.80 us average, 1.47 us max; Table 2: entry 2.12 us average; section 3.3: a
//! redistribution takes under 2 ms).
//!
//! 1. The noise floor: `SCHED_FIFO` 99 absolute-time wake-ups on the highest managed hart,
//!    before the cell exists; and the plain-Linux gang ([`baseline`]): one `SCHED_FIFO` 99
//!    thread per hart sleeping to the same absolute grid points, as many windows as the cell.
//! 2. A 2-hart time-triggered cell (1 ms period, 400 us window by default) and a worker process
//!    in it ([`worker`]) that records when each hart entered each window.
//! 3. Skew over at least 10,000 windows, two ways. The primary figure is the kernel's: per
//!    window, each hart's release-to-running time (its thread runs again after the kernel's
//!    period release; `gang_skew_kernel_*` is the largest minus the smallest across the harts).
//!    The runtime then spins each hart to a common scheduled start (grid point + lead-in);
//!    the skew of those entries (`gang_skew_spin_*`, the old `skew_*`) is what the application
//!    sees, bought with CPU time reported as `gang_spin_cpu_pct` (spin per window as a share of
//!    a hart). Seed 004 Table 1 measured at the cell entry point with no such spin: its 0.80 us
//!    average compares with the kernel column.
//!
//!    Seed 004 Table 2 (time-multiplexing latency, 2.12 us average) is the time from the instant
//!    a muxer should activate the cell to the cell running; for a time-triggered cell here that
//!    is the grid point to each hart's thread running (`gang_release_*`), against the same
//!    quantity of the FIFO-99 gang. The event-triggered and best-effort policies' latency is
//!    in `tess bench mux`.
//! 4. 100 resizes alternating 2 -> 1 -> 2 harts (`UpdateCell`, what `tess cell resize` sends),
//!    each timed from just before the request to the worker's report that the adaptation took
//!    effect (shrink: `adapt` returned; grow: the new hart ran application code after `adapt`).
//!
//! Both processes read the same `CLOCK_MONOTONIC`, so the worker's timestamps and the
//! benchmark's are comparable.

pub mod baseline;
pub mod worker;

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tess_bench::{probe, Report, Summary, Table};
use tess_core::spec::{CellSpec, HartRequest, Policy};
use tess_proto::{Body, CellSession, CellUpdate, Request};
use tess_sched::clock;
use worker::WorkerResult;

/// The benchmark's cell.
pub const CELL: &str = "gang-bench";

/// Options of [`run`].
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// A smoke run: fewer windows and resizes.
    pub quick: bool,
    /// Hart for the noise floor (default: the highest hart tessd manages).
    pub hart: Option<usize>,
    /// The worker command (argv); [`worker::worker_main`] must run behind it with the
    /// arguments `--cell NAME --windows N` appended.
    pub worker: Vec<OsString>,
    /// Window period.
    pub period: Duration,
    /// Window length.
    pub active: Duration,
    /// Windows to measure skew over.
    pub windows: usize,
    /// Resizes (alternately to 1 and 2 harts).
    pub resizes: usize,
}

impl BenchOptions {
    /// The defaults: 10,000 windows and 100 resizes (`quick`: 1,000 and 10), the worker
    /// `tess-gang-worker` next to the running executable (or one directory up).
    pub fn new(quick: bool) -> BenchOptions {
        BenchOptions {
            quick,
            hart: None,
            worker: vec![default_worker().into_os_string()],
            period: Duration::from_millis(1),
            active: Duration::from_micros(400),
            windows: if quick { 1_000 } else { 10_000 },
            resizes: if quick { 10 } else { 100 },
        }
    }
}

fn default_worker() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    for _ in 0..2 {
        let p = dir.join("tess-gang-worker");
        if p.exists() {
            return p;
        }
        dir = dir.parent().map(PathBuf::from).unwrap_or_default();
    }
    PathBuf::from("tess-gang-worker")
}

/// The worker process and its event lines.
struct Worker {
    child: Child,
    lines: mpsc::Receiver<serde_json::Value>,
}

impl Worker {
    fn start(opts: &BenchOptions) -> anyhow::Result<Worker> {
        let (prog, rest) = opts
            .worker
            .split_first()
            .ok_or_else(|| anyhow::anyhow!("no worker command"))?;
        let mut child = Command::new(prog)
            .args(rest)
            .args(["--cell", CELL, "--windows", &opts.windows.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| anyhow::anyhow!("starting the worker {prog:?}: {e}"))?;
        let out = child.stdout.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
                    if tx.send(v).is_err() {
                        break;
                    }
                }
            }
        });
        Ok(Worker { child, lines })
    }

    /// The next event named `name` within `timeout`.
    fn expect(&mut self, name: &str, timeout: Duration) -> anyhow::Result<serde_json::Value> {
        let until = Instant::now() + timeout;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(v) if v["event"] == name => return Ok(v),
                Ok(_) => continue,
                Err(_) => {
                    anyhow::bail!("the gang worker did not report {name:?} within {timeout:?}")
                }
            }
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spec(opts: &BenchOptions, harts: usize) -> CellSpec {
    CellSpec {
        name: CELL.into(),
        policy: Policy::TimeTriggered {
            period: opts.period,
            active: opts.active,
            offset: None,
        },
        harts: HartRequest::Count(harts),
        memory_max: None,
        pids_max: None,
        pinned: false,
        // Spinning harts start windows with the least skew (a halted vCPU wakes late by a
        // different amount on each hart): the gang bench asks for it explicitly.
        idle: Some(tess_core::spec::IdleMode::Spin),
        broker: Default::default(),
    }
}

/// Runs the benchmark against the tessd at `$TESS_SOCKET` (or the default socket).
pub fn run(opts: &BenchOptions) -> anyhow::Result<Report> {
    // Owns the bench cell: deleted when this returns, even on error.
    let mut session = CellSession::connect()?;
    let status = session.status()?;
    let hart = match opts.hart {
        Some(h) => h,
        None => status
            .managed
            .iter()
            .last()
            .ok_or_else(|| anyhow::anyhow!("tessd manages no harts"))?,
    };
    let floor = probe::noise_floor(hart, if opts.quick { 1000 } else { 5000 })?;
    // The plain-Linux gang on the harts the cell will most likely get (the highest managed).
    let managed: Vec<usize> = status.managed.iter().collect();
    let gang_harts = &managed[managed.len().saturating_sub(2)..];
    let fifo = baseline::fifo_gang(gang_harts, opts.period, opts.windows)?;
    session.apply(vec![spec(opts, 2)])?;
    let mut w = Worker::start(opts)?;
    w.expect("ready", Duration::from_secs(10))?;
    let layout = match session
        .client
        .call(&Request::ShowCell { name: CELL.into() })?
    {
        Body::Cell(c) => *c,
        other => anyhow::bail!("unexpected reply {other:?}"),
    };
    let skew_time = opts.period * (opts.windows as u32 + 2000);
    let measured = w.expect("measured", skew_time.max(Duration::from_secs(10)))?;
    let result: WorkerResult = serde_json::from_value(measured["result"].clone())?;
    // Adaptation latency.
    let mut adapt_us = Vec::with_capacity(opts.resizes);
    let (mut shrink_us, mut grow_us, mut tessd_us) = (Vec::new(), Vec::new(), Vec::new());
    let mut lost = None;
    for i in 0..opts.resizes {
        let target = if i % 2 == 0 { 1 } else { 2 };
        let t0 = clock::now_ns();
        session.client.call(&Request::UpdateCell {
            name: CELL.into(),
            update: CellUpdate {
                harts: Some(HartRequest::Count(target)),
                ..Default::default()
            },
        })?;
        tessd_us.push((clock::now_ns() - t0) as f64 / 1000.0);
        let ev = loop {
            match w.expect("adapted", Duration::from_secs(5)) {
                Ok(ev) if ev["new"] == target => break Some(ev),
                Ok(_) => continue,
                Err(_) => break None,
            }
        };
        let Some(ev) = ev else {
            lost = Some(i);
            break;
        };
        let t = ev["t_ns"].as_u64().unwrap_or(t0);
        let us = t.saturating_sub(t0) as f64 / 1000.0;
        adapt_us.push(us);
        if target == 1 {
            &mut shrink_us
        } else {
            &mut grow_us
        }
        .push(us);
        // Let the new hart settle into its windows before the next change.
        std::thread::sleep(Duration::from_millis(20));
    }
    // Deleting the cell makes tessd send Shutdown: the worker stops (or is killed on drop).
    drop(session);
    let stopped = w.expect("stopped", Duration::from_secs(5)).is_ok();
    Ok(report(
        opts,
        (hart, &floor.summary_us),
        &fifo,
        &result,
        &adapt_us,
        &shrink_us,
        &grow_us,
        &tessd_us,
        &layout,
    )
    .note_if(!stopped, "the worker did not stop within 5 s of the cell's deletion and was killed")
    .note_if(
        lost.is_some(),
        &format!(
            "resize {} was not reported done within 5 s; the adaptation figures cover the {} before it",
            lost.unwrap_or(0) + 1,
            lost.unwrap_or(0)
        ),
    ))
}

trait NoteIf {
    fn note_if(self, cond: bool, text: &str) -> Self;
}

impl NoteIf for Report {
    fn note_if(mut self, cond: bool, text: &str) -> Self {
        if cond {
            self.note(text);
        }
        self
    }
}

#[allow(clippy::too_many_arguments)] // one call site; the pieces of one report
fn report(
    opts: &BenchOptions,
    (floor_hart, floor): (usize, &Summary),
    fifo: &baseline::GangBaseline,
    res: &WorkerResult,
    adapt_us: &[f64],
    shrink_us: &[f64],
    grow_us: &[f64],
    tessd_us: &[f64],
    layout: &tess_proto::CellInfo,
) -> Report {
    let adapt = Summary::of(adapt_us);
    let harts = res.cpus.len().max(2) as f64;
    let spin_per_window = res.spin_us.mean * harts;
    let period_us = opts.period.as_secs_f64() * 1e6;
    // Share of each hart's time spent spinning to the scheduled start.
    let spin_cpu_pct = res.spin_us.mean / period_us * 100.0;
    let mut r = Report::new("gang");
    let f = |x: f64| format!("{x:.2}");
    let mut t = Table::new(
        format!(
            "2-hart time-triggered cell, {} / {} windows, {} windows measured (us)",
            tess_core::units::format_duration(opts.active),
            tess_core::units::format_duration(opts.period),
            res.matched_windows
        ),
        &["measure", "median", "p99", "max", "mean", "stdev"],
    );
    let row = |t: &mut Table, name: &str, s: &Summary| {
        t.row(&[
            name.to_string(),
            f(s.median),
            f(s.p99),
            f(s.max),
            f(s.mean),
            f(s.stdev),
        ]);
    };
    row(
        &mut t,
        "gang skew as the kernel delivers it (release-to-running, max - min per window)",
        &res.kernel_skew_us,
    );
    row(
        &mut t,
        "multiplexing latency: grid point to the thread running, per hart",
        &res.release_us,
    );
    row(
        &mut t,
        "gang skew after the runtime's alignment spin (entries, max - min)",
        &res.skew_us,
    );
    row(
        &mut t,
        "window entry after the spin (entry - scheduled start)",
        &res.entry_us,
    );
    row(
        &mut t,
        "spin to the start, per hart and window",
        &res.spin_us,
    );
    row(
        &mut t,
        "plain Linux: FIFO-99 gang skew (max - min wake-up per grid point)",
        &fifo.skew_us,
    );
    row(
        &mut t,
        "plain Linux: FIFO-99 gang, grid point to running, per hart",
        &fifo.release_us,
    );
    row(&mut t, "noise floor (FIFO-99 wake-up, one hart)", floor);
    r.table(t);
    let mut t = Table::new(
        format!(
            "{} resizes 2 <-> 1 harts, request to adaptation done (us)",
            adapt_us.len()
        ),
        &["measure", "median", "p99", "max", "mean"],
    );
    row(&mut t, "all resizes", &adapt);
    row(
        &mut t,
        "shrink 2 -> 1 (adapt returned)",
        &Summary::of(shrink_us),
    );
    row(
        &mut t,
        "grow 1 -> 2 (new hart ran, adapt returned)",
        &Summary::of(grow_us),
    );
    row(
        &mut t,
        "tessd round trip of the change",
        &Summary::of(tessd_us),
    );
    r.table(t);
    // Kernel-delivered skew and latency (the primary figures), the skew after the spin and its
    // cost, and the plain-Linux gang of the same run.
    let k = &res.kernel_skew_us;
    r.figure("gang_skew_kernel_median_us", k.median)
        .figure("gang_skew_kernel_mean_us", k.mean)
        .figure("gang_skew_kernel_p99_us", k.p99)
        .figure("gang_skew_kernel_max_us", k.max)
        .figure("gang_skew_spin_median_us", res.skew_us.median)
        .figure("gang_skew_spin_mean_us", res.skew_us.mean)
        .figure("gang_skew_spin_max_us", res.skew_us.max)
        .figure("gang_spin_us_per_window", spin_per_window)
        .figure("gang_spin_cpu_pct", spin_cpu_pct)
        .figure("gang_release_median_us", res.release_us.median)
        .figure("gang_release_mean_us", res.release_us.mean)
        .figure("gang_release_max_us", res.release_us.max)
        .figure("gang_fifo_skew_median_us", fifo.skew_us.median)
        .figure("gang_fifo_skew_mean_us", fifo.skew_us.mean)
        .figure("gang_fifo_skew_p99_us", fifo.skew_us.p99)
        .figure("gang_fifo_skew_max_us", fifo.skew_us.max)
        .figure("gang_fifo_release_mean_us", fifo.release_us.mean)
        .figure("gang_fifo_release_max_us", fifo.release_us.max)
        .figure("gang_fifo_idle_spin_cpu_pct", fifo.idle_spin_cpu_pct)
        .figure("noise_floor_mean_us", floor.mean);
    let fifo_is = "FIFO-99 thread per hart sleeping to the same grid, SCHED_IDLE spinners, no spin";
    r.compare(
        "gang skew, kernel release-to-running, mean (us)",
        Some("seed 004 Table 1: average 0.802 (3 cores, 10,000 wake-ups)"),
        "gang_skew_kernel_mean_us",
        Some(("gang_fifo_skew_mean_us", fifo_is)),
    )
    .compare(
        "gang skew, kernel release-to-running, max (us)",
        Some("seed 004 Table 1: max 1.468"),
        "gang_skew_kernel_max_us",
        Some(("gang_fifo_skew_max_us", fifo_is)),
    )
    .compare(
        "gang skew after the runtime's alignment spin, mean (us)",
        Some("seed 004 Table 1: average 0.802 (no spin there)"),
        "gang_skew_spin_mean_us",
        Some(("gang_fifo_skew_mean_us", fifo_is)),
    )
    .compare(
        "CPU time of the alignment spin (% of each hart)",
        None,
        "gang_spin_cpu_pct",
        None,
    )
    .compare(
        "time-multiplexing latency, time-triggered: grid point to running, mean (us)",
        Some("seed 004 Table 2: average 2.122"),
        "gang_release_mean_us",
        Some(("gang_fifo_release_mean_us", fifo_is)),
    )
    .compare(
        "time-multiplexing latency, time-triggered: grid point to running, max (us)",
        Some("seed 004 Table 2: max 8.685"),
        "gang_release_max_us",
        Some(("gang_fifo_release_max_us", fifo_is)),
    );
    r.figure("skew_median_us", res.skew_us.median);
    r.figure("skew_p99_us", res.skew_us.p99);
    r.figure("skew_max_us", res.skew_us.max);
    r.figure("entry_median_us", res.entry_us.median);
    r.figure("noise_floor_median_us", floor.median);
    r.figure("adapt_median_us", adapt.median);
    r.figure("adapt_max_us", adapt.max);
    r.figure("spin_us_per_window", spin_per_window);
    r.target(
        "skew_median_us < 5 (after the spin)",
        res.skew_us.median < 5.0,
        format!("{:.2} us", res.skew_us.median),
    );
    r.target(
        "skew_p99_us < 50 (after the spin)",
        res.skew_us.p99 < 50.0,
        format!("{:.2} us", res.skew_us.p99),
    );
    r.target(
        "entry_median_us < 10",
        res.entry_us.median < 10.0,
        format!("{:.2} us", res.entry_us.median),
    );
    r.target(
        "adapt_median_us < 2000",
        adapt.median < 2000.0,
        format!("{:.0} us", adapt.median),
    );
    let threads: Vec<String> = layout
        .threads
        .iter()
        .map(|t| format!("tid {} on {} ({})", t.tid, t.affinity, t.sched))
        .collect();
    r.note(format!(
        "hart layout: cell {CELL} on harts {} (window offset {}), {}; vharts ran on physical harts {:?}; noise floor on hart {}",
        layout.harts,
        layout
            .window_offset
            .map(tess_core::units::format_duration)
            .unwrap_or_else(|| "-".into()),
        threads.join(", "),
        res.cpus.iter().take(2).collect::<Vec<_>>(),
        floor_hart,
    ));
    r.note(format!(
        "design: each hart is released by its SCHED_DEADLINE period, spins on the shared clock to the scheduled start (grid point + {} lead-in), runs, and sched_yields {} before the window ends; between windows tessd's SCHED_IDLE spinners keep the harts from halting (a halted vCPU wakes tens of us later, differently on each hart); entry is measured against that scheduled start, the kernel's release against the grid point",
        tess_core::units::format_duration(crate::Tuning::default().lead_in),
        tess_core::units::format_duration(crate::Tuning::default().guard),
    ));
    r.note(format!(
        "runtime counters: {} windows, {} entered late, {} re-anchors of a kernel period, {} adaptations",
        res.windows, res.late_windows, res.reanchors, res.adaptations
    ));
    r.note(format!(
        "skew_* and gang_skew_spin_* are measured after the runtime's alignment spin, which costs gang_spin_us_per_window (both harts together) = {:.1}% of each hart ({:.1}% of each window's {} active time); gang_skew_kernel_* and gang_release_* are what the kernel delivers before it",
        spin_cpu_pct,
        res.spin_us.mean / (opts.active.as_secs_f64() * 1e6) * 100.0,
        tess_core::units::format_duration(opts.active),
    ));
    r.note(format!(
        "plain-Linux gang: {} windows on harts {:?} before the cell existed, its SCHED_IDLE spinners burnt {:.0}% of each hart (gang_fifo_idle_spin_cpu_pct; tessd's spinners burn the time the cell's windows leave, in the same way); the grid point of a time-triggered cell is where its SCHED_DEADLINE period should begin, so gang_release_* also holds any phase error of the kernel period against the grid (the runtime re-anchors when it persists)",
        fifo.windows, fifo.harts, fifo.idle_spin_cpu_pct
    ));
    r.note("seed 004: skew 0.80 us average, 1.47 us max at the cell entry point (Table 1); time-multiplexing latency 2.12 us average, 8.69 us max (Table 2); a redistribution under 2 ms (section 3.3)");
    r.detail("skew_us", res.skew_us);
    r.detail("kernel_skew_us", res.kernel_skew_us);
    r.detail("fifo_gang", fifo);
    r.detail("entry_us", res.entry_us);
    r.detail("release_us", res.release_us);
    r.detail("spin_us", res.spin_us);
    r.detail("noise_floor_us", floor);
    r.detail("adapt_us", adapt);
    r.detail("shrink_us", Summary::of(shrink_us));
    r.detail("grow_us", Summary::of(grow_us));
    r.detail("tessd_us", Summary::of(tessd_us));
    r
}
