//! `tess-migrator`: the Migrator Synthesizer answering a SLABS over UDP (seed 000, section 3.2).

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tess_music::host::{Host, HostConfig, HostReport};
use tess_music::measure;
use tess_music::net::Wait;
use tess_music::pool::ThreadSetup;
use tess_music::record::SampleLog;
use tess_music::rt;
use tess_music::slabs;
use tess_music::synth::{SynthParams, VoiceParams};
use tess_sched::Policy;

/// The Migrator Synthesizer: 32 voices of sinusoidal oscillators migrating between microtonal
/// pitches, played by a SLABS (or `tess-slabs`) over UDP.
///
/// Every 16 input packets (one package, 32 frames, 725.6 us) it computes the voices of the
/// pressed pads and answers with one packet of 32 frames x 8 channels. It measures, per package,
/// t2 - t1: from the kernel's receive timestamp of the package's first packet to the return of
/// the answer's sendto (deadline 62/44100 s = 1405.9 us). Statistics are printed at exit
/// (SIGINT/SIGTERM or --duration) and on SIGUSR1.
///
/// Threads: with --harts 1,2,3 the communication thread is pinned to hart 1 and one worker
/// thread to each of harts 2 and 3; workers spin (never sleep) waiting for voices to compute.
/// With one hart, the communication thread computes the voices itself.
#[derive(Parser, Debug)]
#[command(version, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Measure the hart fraction of the full Migrator and the oscillators one hart sustains,
    /// without a network (pin with --hart).
    Measure(MeasureArgs),
}

#[derive(Args, Debug)]
struct ServeArgs {
    /// Address and UDP port to listen on.
    #[arg(long, default_value = "127.0.0.1:9701", value_name = "ADDR:PORT")]
    bind: SocketAddr,
    /// Harts to pin to: the first runs communication, each further one a worker
    /// (e.g. `1` or `1,2,3`). Without it, threads float.
    #[arg(long, value_name = "LIST")]
    harts: Option<String>,
    /// Worker threads when --harts is not given (0: the communication thread computes).
    #[arg(long, default_value_t = 0)]
    workers: usize,
    /// Run communication and workers as SCHED_FIFO at this priority (1-99).
    #[arg(long, value_name = "PRIO", value_parser = clap::value_parser!(u32).range(1..=99))]
    fifo: Option<u32>,
    /// How the communication thread waits for packets: `spin` (busy-poll, the paper's
    /// dedicated hart) or `block` (sleep in recvmsg).
    #[arg(long, default_value = "spin", value_parser = ["spin", "block"])]
    wait: String,
    /// Oscillators per voice (the paper: 100; 32 voices).
    #[arg(long, default_value_t = 100)]
    oscillators: usize,
    /// Mean seconds between two migrations of one oscillator.
    #[arg(long, default_value_t = 4.0)]
    migrate_seconds: f64,
    /// Seconds a migration glides (0: jump).
    #[arg(long, default_value_t = 0.2)]
    glide_seconds: f64,
    /// Seed of the random streams.
    #[arg(long, default_value_t = 0x5EED_0000)]
    seed: u64,
    /// Stop after this many seconds (default: run until SIGINT/SIGTERM).
    #[arg(long, value_name = "SECONDS")]
    duration: Option<f64>,
    /// Answer but do not measure packages in the first SECONDS after the first one.
    #[arg(long, default_value_t = 1.0, value_name = "SECONDS")]
    warmup: f64,
    /// Write the 8 output channels to this WAV file (32-bit float, 44.1 kHz) at exit.
    #[arg(long, value_name = "PATH")]
    record: Option<PathBuf>,
    /// Seconds of audio to keep for --record (default: --duration, else 60).
    #[arg(long, value_name = "SECONDS")]
    record_seconds: Option<f64>,
    /// Print the final report as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// Write every measured t2 - t1, in microseconds, one per line, to this file at exit.
    #[arg(long, value_name = "PATH")]
    stats_file: Option<PathBuf>,
    /// Create this file (containing the bound address) once the socket is listening.
    #[arg(long, value_name = "PATH")]
    ready_file: Option<PathBuf>,
    /// Do not lock memory (mlockall).
    #[arg(long)]
    no_mlock: bool,
    /// Bind and answer through the tess network service of this name (its socket; t1 and t2
    /// taken by the service next to the socket) instead of a socket of our own.
    #[arg(long, value_name = "NAME")]
    net_service: Option<String>,
}

#[derive(Args, Debug)]
struct MeasureArgs {
    /// Seconds of the hart-fraction run (full 32 x 100 Migrator).
    #[arg(long, default_value_t = 5.0)]
    fraction_seconds: f64,
    /// Seconds the oscillator capacity must hold with zero misses (the issue: 60).
    #[arg(long, default_value_t = 10.0)]
    capacity_seconds: f64,
    /// Hart to pin the measuring thread to.
    #[arg(long)]
    hart: Option<usize>,
    /// Run the measuring thread as SCHED_FIFO at this priority.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=99))]
    fifo: Option<u32>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Measure(m)) => run_measure(&m),
        None => serve(&cli.serve),
    }
}

fn run_measure(m: &MeasureArgs) -> Result<()> {
    rt::place_current_thread(m.hart, m.fifo.map(|priority| Policy::Fifo { priority }))?;
    let fraction = measure::migrator_hart_fraction(Duration::from_secs_f64(m.fraction_seconds));
    let capacity = measure::max_oscillators_per_hart(Duration::from_secs_f64(m.capacity_seconds));
    if m.json {
        let v = serde_json::json!({
            "migrator_hart_fraction": fraction.fraction_mean,
            "max_oscillators_per_hart": capacity.oscillators,
            "fraction": fraction,
            "capacity": capacity,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!(
            "migrator_hart_fraction: {:.4} (busy per package mean {:.1} us, p99 {:.1} us, max {:.1} us of {:.1} us; {} packages)",
            fraction.fraction_mean,
            fraction.busy_us.mean,
            fraction.busy_us.p99,
            fraction.busy_us.max,
            slabs::PACKAGE_PERIOD_NS as f64 / 1000.0,
            fraction.packages
        );
        match &capacity.confirmed {
            Some(c) => println!(
                "max_oscillators_per_hart: {} (32 x {}; {} of {} packages late, {} of them from stalls of the hart, allowed {:.0}%; busy p99 {:.1} us, mean {:.1} us)",
                capacity.oscillators, capacity.per_voice, c.late, c.packages, c.stalls, measure::TOLERANCE * 100.0, c.busy_us.p99, c.busy_us.mean
            ),
            None => println!(
                "max_oscillators_per_hart: 0 (no count had at most {:.0}% of its packages late)",
                measure::TOLERANCE * 100.0
            ),
        }
    }
    Ok(())
}

fn serve(a: &ServeArgs) -> Result<()> {
    let harts = a
        .harts
        .as_deref()
        .map(rt::parse_harts)
        .transpose()
        .context("bad --harts")?;
    if harts.as_ref().is_some_and(|h| h.is_empty()) {
        bail!("--harts lists no hart");
    }
    let policy = a.fifo.map(|priority| Policy::Fifo { priority });
    let workers = harts.as_ref().map_or(a.workers, |h| h.len() - 1);
    let worker_harts: Vec<Option<usize>> = (0..workers)
        .map(|w| harts.as_ref().map(|h| h[w + 1]))
        .collect();
    let setup: ThreadSetup = Arc::new(move |w: usize| {
        if let Err(e) = rt::place_current_thread(worker_harts[w], policy) {
            eprintln!("tess-migrator: worker {w}: {e}");
        }
    });
    let duration = a.duration.map(Duration::from_secs_f64);
    let record_seconds = match (&a.record, a.record_seconds, a.duration) {
        (None, _, _) => 0.0,
        (Some(_), Some(s), _) => s,
        (Some(_), None, Some(d)) => d + a.warmup + 1.0,
        (Some(_), None, None) => 60.0,
    };
    let cfg = HostConfig {
        bind: a.bind,
        synth: SynthParams {
            voice: VoiceParams {
                oscillators: a.oscillators.max(1),
                migrate_s: a.migrate_seconds,
                glide_s: a.glide_seconds,
                ..VoiceParams::default()
            },
            seed: a.seed,
        },
        wait: if a.wait == "block" {
            Wait::Block
        } else {
            Wait::Poll
        },
        workers,
        worker_setup: Some(setup),
        duration,
        max_packages: None,
        warmup: Duration::from_secs_f64(a.warmup),
        log_capacity: duration.map_or(10 * 60 * 1379, |d| {
            (d.as_secs_f64() * 1379.0) as usize + 1379
        }),
        record_seconds,
        net_service: a.net_service.clone(),
    };
    rt::install_signal_handlers().context("installing signal handlers")?;
    if !a.no_mlock {
        if let Err(e) = tess_sched::lock_memory() {
            eprintln!("tess-migrator: mlockall failed ({e}); continuing without locked memory");
        }
    }
    rt::place_current_thread(harts.as_ref().map(|h| h[0]), policy)
        .context("placing the communication thread")?;
    let mut host = Host::new(cfg.clone()).context("starting the synthesizer host")?;
    eprintln!(
        "tess-migrator: listening on {}{} ({} x {} oscillators, {} workers, wait {}{}{})",
        host.local_addr(),
        a.net_service
            .as_ref()
            .map_or(String::new(), |n| format!(" through network service {n:?}")),
        slabs::PADS,
        a.oscillators,
        workers,
        a.wait,
        harts
            .as_ref()
            .map_or(String::new(), |h| format!(", harts {h:?}")),
        a.fifo
            .map_or(String::new(), |p| format!(", SCHED_FIFO {p}")),
    );
    if let Some(p) = &a.ready_file {
        std::fs::write(p, host.local_addr().to_string())
            .with_context(|| format!("writing ready file {}", p.display()))?;
    }
    spawn_reporter(host.response_log(), host.compute_log());
    host.run(&rt::STOP).context("serving the device")?;

    let report = host.report();
    if let Some(path) = &a.stats_file {
        write_samples(path, &host.response_log())?;
    }
    if let (Some(path), Some(rec)) = (&a.record, host.recorder()) {
        rec.write_wav(path)
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!(
            "tess-migrator: wrote {:.2} s of audio to {}",
            rec.samples().len() as f64 / 8.0 / 44_100.0,
            path.display()
        );
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&report));
    }
    Ok(())
}

fn write_samples(path: &PathBuf, log: &SampleLog) -> Result<()> {
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
    );
    for us in log.snapshot_us() {
        writeln!(f, "{us:.3}")?;
    }
    f.flush()?;
    Ok(())
}

/// Prints statistics so far on SIGUSR1, from a thread off the audio path.
fn spawn_reporter(response: Arc<SampleLog>, compute: Arc<SampleLog>) {
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_millis(100));
        if rt::REPORT.swap(false, Ordering::Relaxed) {
            let r = tess_bench::Summary::of(&response.snapshot_us());
            let c = tess_bench::Summary::of(&compute.snapshot_us());
            let late = response
                .snapshot_ns()
                .iter()
                .filter(|&&ns| u64::from(ns) > slabs::DEADLINE_NS)
                .count();
            eprintln!(
                "tess-migrator: so far {} packages, {late} late; t2-t1 mean {:.1} p99.9 {:.1} max {:.1} us; compute mean {:.1} max {:.1} us",
                r.count, r.mean, r.p999, r.max, c.mean, c.max
            );
        }
    });
}

fn render(r: &HostReport) -> String {
    let c = &r.counters;
    format!(
        "tess-migrator: {} packages measured ({} warm-up), {} late (> {:.1} us), {} incomplete, {} overruns, {} malformed, {} send errors\n  \
         t2 - t1 (us): mean {:.1}  stdev {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}\n  \
         compute (us): mean {:.1}  p99 {:.1}  max {:.1}  (hart fraction {:.1} %, {} workers, wait {})\n",
        r.packages,
        c.warmup_packages,
        r.misses,
        r.deadline_us,
        c.incomplete,
        c.overruns,
        c.malformed,
        c.send_errors,
        r.response_us.mean,
        r.response_us.stdev,
        r.response_us.p99,
        r.response_us.p999,
        r.response_us.max,
        r.compute_us.mean,
        r.compute_us.p99,
        r.compute_us.max,
        r.hart_fraction_mean * 100.0,
        r.workers,
        r.wait
    )
}
