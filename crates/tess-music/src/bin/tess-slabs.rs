//! `tess-slabs`: the SLABS controller emulator (seed 000, section 3.1).

use anyhow::{Context, Result};
use clap::Parser;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use tess_music::emulator::{self, EmulatorConfig, EmulatorReport, Pace};
use tess_music::gesture::Gesture;
use tess_music::{netns, rt};
use tess_sched::Policy;

/// Emulates the SLABS: 32 pressure pads streamed as x, y, pressure at 44.1 kHz, one UDP packet
/// of 2 frames every 45.35 us, 16 packets per package (725.6 us), played from a gesture script.
///
/// For every package it measures the response time the device sees, tf - t0: from sending the
/// package's first packet to the kernel's receive timestamp of the answer. Answers later than
/// 62/44100 s = 1405.9 us, or lost, are missed deadlines. Pacing busy-waits on absolute time
/// (`--pace spin`, the default), because no sleep is precise to 45 us: the emulator keeps its
/// hart fully busy; pin it with --hart.
#[derive(Parser, Debug)]
#[command(version)]
struct Cli {
    /// Synthesizer address.
    #[arg(long, default_value = "127.0.0.1:9701", value_name = "ADDR:PORT")]
    to: SocketAddr,
    /// Local address to bind (default: any address, any port).
    #[arg(long, value_name = "ADDR:PORT")]
    bind: Option<SocketAddr>,
    /// Gesture script (TOML; see crates/tess-music/gestures/). Default: the shipped default.
    #[arg(long, value_name = "PATH")]
    gesture: Option<PathBuf>,
    /// Measured seconds (after the warm-up).
    #[arg(long, default_value_t = 10.0, value_name = "SECONDS")]
    duration: f64,
    /// Seconds sent and answered first but not measured.
    #[arg(long, default_value_t = 1.0, value_name = "SECONDS")]
    warmup: f64,
    /// Pacing: `spin` (busy-wait), `sleep` (absolute sleeps, jittery) or `hybrid:US` (sleep
    /// until US microseconds before each packet, then spin).
    #[arg(long, default_value = "spin")]
    pace: Pace,
    /// Milliseconds to wait for the last answers.
    #[arg(long, default_value_t = 50)]
    drain_ms: u64,
    /// Measure responses from the actual send of packet 0 (`actual`, the paper's tf - t0) or as a
    /// perfectly timed device would see them (`ideal`: 680.27 us + tf - send of packet 15), which
    /// removes the emulator's own lateness when it shares a busy hart.
    #[arg(long, value_enum, default_value = "actual")]
    response: tess_music::emulator::Response,
    /// Pin to this hart.
    #[arg(long)]
    hart: Option<usize>,
    /// Run as SCHED_FIFO at this priority (1-99).
    #[arg(long, value_name = "PRIO", value_parser = clap::value_parser!(u32).range(1..=99))]
    fifo: Option<u32>,
    /// Enter network namespace NAME (/var/run/netns/NAME) before opening the socket.
    #[arg(long, value_name = "NAME")]
    netns: Option<String>,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// Write every measured response time, in microseconds, one per line, to this file.
    #[arg(long, value_name = "PATH")]
    samples_file: Option<PathBuf>,
}

const DEFAULT_GESTURE: &str = include_str!("../../gestures/default.toml");

fn main() -> Result<()> {
    let cli = Cli::parse();
    if let Some(ns) = &cli.netns {
        netns::enter(ns)?;
    }
    let gesture = match &cli.gesture {
        Some(p) => Gesture::load(p)?,
        None => Gesture::parse(DEFAULT_GESTURE).context("the built-in default gesture")?,
    };
    rt::install_signal_handlers().context("installing signal handlers")?;
    if let Err(e) = tess_sched::lock_memory() {
        eprintln!("tess-slabs: mlockall failed ({e}); continuing");
    }
    rt::place_current_thread(cli.hart, cli.fifo.map(|priority| Policy::Fifo { priority }))?;
    let mut cfg = EmulatorConfig::new(cli.to, gesture);
    if let Some(b) = cli.bind {
        cfg.bind = b;
    }
    cfg.duration = Duration::from_secs_f64(cli.duration);
    cfg.warmup = Duration::from_secs_f64(cli.warmup);
    cfg.pace = cli.pace;
    cfg.response = cli.response;
    cfg.drain = Duration::from_millis(cli.drain_ms);
    eprintln!(
        "tess-slabs: sending {:?} to {} for {} s (+{} s warm-up), pace {}",
        cfg.gesture.name, cfg.target, cli.duration, cli.warmup, cfg.pace
    );
    let run = emulator::run(&cfg, &rt::STOP)?;
    if let Some(path) = &cli.samples_file {
        let mut f = std::io::BufWriter::new(
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
        );
        for ns in &run.response_ns {
            writeln!(f, "{:.3}", f64::from(*ns) / 1000.0)?;
        }
        f.flush()?;
    }
    if cli.json {
        println!("{}", serde_json::to_string_pretty(&run.report)?);
    } else {
        print!("{}", render(&run.report));
    }
    Ok(())
}

fn render(r: &EmulatorReport) -> String {
    let s = &r.response_us;
    format!(
        "tess-slabs: {} packages measured ({} sent), {} missed deadlines ({} late > {:.1} us, {} lost), {} unexpected answers\n  \
         response tf - t0 (us): mean {:.1}  stdev {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}\n  \
         after the last packet (us): mean {:.1}  p99.9 {:.1}  max {:.1}\n  \
         send lateness per package (us): mean {:.2}  p99 {:.1}  max {:.1}    host compute (us): mean {:.1}  max {:.1}\n",
        r.packages,
        r.packages_sent,
        r.misses,
        r.late,
        r.deadline_us,
        r.lost,
        r.unexpected_answers,
        s.mean,
        s.stdev,
        s.p99,
        s.p999,
        s.max,
        r.after_last_packet_us.mean,
        r.after_last_packet_us.p999,
        r.after_last_packet_us.max,
        r.send_lateness_us.mean,
        r.send_lateness_us.p99,
        r.send_lateness_us.max,
        r.host_compute_us.mean,
        r.host_compute_us.max,
    )
}
