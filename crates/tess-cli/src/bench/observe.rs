//! `tess bench observe`: what watching costs (issue 16).
//!
//! With 100 cells, each holding a process (so that every cell reports a thread):
//! - `scrape_ms`: one Prometheus scrape as `tessd --metrics-listen` serves it (tessd's `status`
//!   and `list-cells`, the kernel's counters for every cell and hart, the rendering), timed in
//!   this process without the HTTP hop; goal under 10 ms;
//! - `top_refresh_ms`: one `tess top` refresh (snapshot, rates, an 80x24 screen drawn off-screen);
//! - `metrics_overhead_pct`: the CPU time of the synthesizer's step (one package of all 32
//!   voices, `tess_music::synth::Engine::process`) on a managed hart with metrics on (each
//!   step published to a `tess-stats` page, as the host publishes each answer, and tessd
//!   scraped at 10 Hz) against off (neither), in alternating phases of the same run; goal
//!   under 1%. Publishing is a few relaxed atomic adds in the step; scraping touches the
//!   measured thread only through the shared machine.

use super::support::{pick_hart, spawn_work, stop, Session};
use super::Common;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tess_bench::{Report, Summary, Table};
use tess_core::spec::{CellSpec, HartRequest, Policy};
use tess_observe::kernel::Mounts;
use tess_observe::prom;
use tess_observe::snapshot;
use tess_sched::clock::thread_cpu_ns;

const CELLS: usize = 100;

fn cell_name(i: usize) -> String {
    format!("obs-{i:03}")
}

fn specs() -> Vec<CellSpec> {
    (0..CELLS)
        .map(|i| CellSpec {
            name: cell_name(i),
            policy: Policy::EventTriggered {
                period: Duration::from_millis(100),
                budget: Duration::from_micros(200),
            },
            harts: HartRequest::Count(1),
            memory_max: Some(64 << 20),
            pids_max: None,
            pinned: false,
            idle: None,
            broker: Default::default(),
        })
        .collect()
}

/// The synthesizer's step: one package (62 frames) of all 32 voices, every pad pressed, as
/// the music benchmark's host computes it.
struct SynthStep {
    engine: tess_music::synth::Engine,
    controls: [tess_music::slabs::PadSample; tess_music::slabs::PADS],
    out: Box<tess_music::synth::AudioBlock>,
}

impl SynthStep {
    fn new() -> SynthStep {
        let pad = tess_music::slabs::PadSample {
            x: 0.5,
            y: 0.5,
            pressure: 0.8,
        };
        SynthStep {
            engine: tess_music::synth::Engine::new(&tess_music::synth::SynthParams::default()),
            controls: [pad; tess_music::slabs::PADS],
            out: Box::new(
                [[0.0; tess_music::slabs::OUTPUT_CHANNELS]; tess_music::slabs::FRAMES_PER_PACKAGE],
            ),
        }
    }

    fn run(&mut self) -> usize {
        self.engine.process(&self.controls, &mut self.out)
    }
}

/// CPU ns per synthesizer step over `phase`, one sample per step; with `published`, each step
/// also records itself as the host records each answer (metrics on).
fn steps(
    synth: &mut SynthStep,
    phase: Duration,
    published: Option<&tess_stats::Publisher>,
) -> Vec<f64> {
    let mut out: Vec<f64> = Vec::new();
    let t0 = Instant::now();
    while t0.elapsed() < phase {
        let c0 = thread_cpu_ns();
        std::hint::black_box(synth.run());
        if let Some(p) = published {
            // The time it already has (the previous step's), as the host publishes the times
            // it measured anyway: reading a clock here would be a cost of the bench, not of
            // publishing (the thread CPU clock is a system call).
            p.record(out.last().map_or(0, |ns| *ns as u64));
        }
        out.push((thread_cpu_ns() - c0) as f64);
    }
    out
}

/// Runs the benchmark.
pub fn run(c: &Common) -> anyhow::Result<Report> {
    let socket = tess_proto::client::socket_path();
    let mut s = Session::connect()?;
    let status = s.status()?;
    let hart = pick_hart(c.hart, &status)?;
    s.apply(specs())?;
    let holders: Vec<_> = (0..CELLS)
        .map(|i| spawn_work(Some(&cell_name(i)), &["idle".into()]))
        .collect::<Result<_, _>>()?;
    std::thread::sleep(Duration::from_millis(500));
    let mounts = Mounts::detect();
    let reps = if c.quick { 10 } else { 50 };

    // As tessd's endpoint scrapes: one sampler kept from scrape to scrape (it keeps the
    // kernel's files open). The first scrape opens them all: reported apart as the cold scrape.
    let mut kernel = snapshot::Sampler::new(mounts.clone());
    let mut scrape = Vec::new();
    let (mut asking, mut reading, mut rendering) = (Vec::new(), Vec::new(), Vec::new());
    let mut connecting = Vec::new();
    let mut size = 0;
    let mut cold = None;
    for _ in 0..=reps {
        let t0 = Instant::now();
        let mut client = tess_proto::Client::connect(&socket)?;
        let tc = Instant::now();
        let (status, cells) = snapshot::query(&mut client)?;
        let t1 = Instant::now();
        let snap = kernel.sample(&status, &cells);
        let t2 = Instant::now();
        let text = prom::to_text_format(&prom::render(&snap, None));
        let t3 = Instant::now();
        anyhow::ensure!(
            snap.cells.len() >= CELLS,
            "only {} cells seen",
            snap.cells.len()
        );
        size = text.len();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        if cold.is_none() {
            cold = Some(ms(t3 - t0));
            continue;
        }
        scrape.push(ms(t3 - t0));
        asking.push(ms(t1 - t0));
        connecting.push(ms(tc - t0));
        reading.push(ms(t2 - t1));
        rendering.push(ms(t3 - t2));
    }
    let cold = cold.unwrap_or_default();
    let mut sampler = crate::cmd::top::Sampler::connect(&socket)?;
    let mut refresh = Vec::new();
    for _ in 0..reps {
        refresh.push(crate::cmd::top::time_refresh(&mut sampler)?.as_secs_f64() * 1e3);
    }

    // Overhead: alternate phases without and with a 10 Hz scraper, measuring on `hart`.
    let phase = Duration::from_millis(250);
    let rounds = if c.quick { 4 } else { 20 };
    let scraping = Arc::new(AtomicBool::new(false));
    let stop_all = Arc::new(AtomicBool::new(false));
    let scraper = {
        let (scraping, stop_all, socket) = (scraping.clone(), stop_all.clone(), socket.clone());
        let mut kernel = snapshot::Sampler::new(mounts.clone());
        std::thread::spawn(move || {
            while !stop_all.load(Ordering::Relaxed) {
                if scraping.load(Ordering::Relaxed) {
                    if let Ok(snap) = kernel.take(&socket) {
                        std::hint::black_box(prom::render(&snap, None));
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    // Metrics on: the step publishes itself (a private page, so that the scrapes below stay
    // those of the 100 cells) and tessd's endpoint is scraped at 10 Hz. Off: neither.
    let pages = tempfile::tempdir()?;
    let published = tess_stats::Publisher::create_in(
        pages.path(),
        "synth",
        Some(Duration::from_nanos(tess_music::slabs::DEADLINE_NS)),
    )?;
    let measured = std::thread::spawn(move || {
        tess_sched::affinity::set_affinity(0, &tess_sched::HartSet::single(hart))
            .expect("pinning the measured thread to its hart");
        let mut synth = SynthStep::new();
        let (mut off, mut on) = (Vec::new(), Vec::new());
        // Warm up, then alternate: many short phases, so that a slow stretch of the machine
        // (the hypervisor's steal comes in bursts) falls on both sides alike.
        steps(&mut synth, phase, None);
        for _ in 0..rounds {
            scraping.store(false, Ordering::Relaxed);
            off.extend(steps(&mut synth, phase, None));
            scraping.store(true, Ordering::Relaxed);
            on.extend(steps(&mut synth, phase, Some(&published)));
        }
        scraping.store(false, Ordering::Relaxed);
        (off, on, published.read_back().events)
    });
    let (off, on, published_steps) = measured
        .join()
        .map_err(|_| anyhow::anyhow!("the measured thread panicked"))?;
    anyhow::ensure!(
        published_steps as usize == on.len(),
        "published {published_steps} of {} steps",
        on.len()
    );
    stop_all.store(true, Ordering::Relaxed);
    let _ = scraper.join();
    for h in holders {
        stop(h);
    }
    s.delete_all();

    let (so, sn) = (Summary::of(&off), Summary::of(&on));
    let overhead = (sn.median / so.median - 1.0) * 100.0;
    let (sc, rf) = (Summary::of(&scrape), Summary::of(&refresh));
    let mut r = Report::new("observe");
    let mut t = Table::new(
        format!("watching {CELLS} cells, each holding a process ({reps} repetitions)"),
        &["what", "median", "p99", "max"],
    );
    t.row(&[
        "Prometheus scrape (ms)".to_string(),
        format!("{:.2}", sc.median),
        format!("{:.2}", sc.p99),
        format!("{:.2}", sc.max),
    ]);
    for (what, xs) in [
        ("  of which tessd's status + list-cells", &asking),
        ("    of which connecting (hello)", &connecting),
        ("  of which kernel counters, runtime pages", &reading),
        ("  of which rendering the exposition", &rendering),
    ] {
        let x = Summary::of(xs);
        t.row(&[
            what.to_string(),
            format!("{:.2}", x.median),
            format!("{:.2}", x.p99),
            format!("{:.2}", x.max),
        ]);
    }
    t.row(&[
        "the first scrape, opening every file (ms)".to_string(),
        format!("{cold:.2}"),
        "-".into(),
        "-".into(),
    ]);
    t.row(&[
        "tess top refresh, 80x24 (ms)".to_string(),
        format!("{:.2}", rf.median),
        format!("{:.2}", rf.p99),
        format!("{:.2}", rf.max),
    ]);
    r.table(t);
    let mut t = Table::new(
        format!(
            "CPU per synthesizer step (32 voices, one package) on hart {hart}, {rounds} alternating phases of {} ms each (us)",
            phase.as_millis()
        ),
        &["metrics", "steps", "median", "p99"],
    );
    t.row(&[
        "off".to_string(),
        so.count.to_string(),
        format!("{:.1}", so.median / 1e3),
        format!("{:.1}", so.p99 / 1e3),
    ]);
    t.row(&[
        "on: published, scraped at 10 Hz".to_string(),
        sn.count.to_string(),
        format!("{:.1}", sn.median / 1e3),
        format!("{:.1}", sn.p99 / 1e3),
    ]);
    r.table(t);
    r.figure("scrape_ms", sc.median);
    r.figure("top_refresh_ms", rf.median);
    r.figure("metrics_overhead_pct", overhead);
    r.target(
        "scrape of 100 cells under 10 ms",
        sc.median < 10.0,
        format!("{:.2} ms", sc.median),
    );
    r.target(
        "metrics overhead under 1%",
        overhead < 1.0,
        format!("{overhead:.2}%"),
    );
    r.note(format!("the exposition of {CELLS} cells is {size} bytes"));
    r.note("scrape_ms: tessd's status + list-cells, kernel counters, rendering, as tessd's endpoint does it from its second scrape on (the kernel's files kept open); the endpoint adds one HTTP round trip on localhost");
    r.note("metrics_overhead_pct: the synthesizer's own step (32 voices, one package); on = each step published to a tess-stats page (as the host publishes each answer) and tessd scraped at 10 Hz, 150x Prometheus' default 15 s interval; off = neither");
    r.detail("scrape_ms", sc);
    r.detail("cold_scrape_ms", cold);
    r.detail("top_refresh_ms", rf);
    r.detail("step_ns_off", so);
    r.detail("step_ns_on", sn);
    Ok(r)
}
