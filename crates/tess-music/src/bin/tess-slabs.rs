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
    /// Pacing: `spin` (busy-wait), `sleep` (absolute sleeps, jittery), `hybrid:US` (sleep
    /// until US microseconds before each packet, then spin), or `link` / `link:PACKAGES`: the
    /// link paces (a token-bucket queue on the cable releases a packet every 45.35 us; set one
    /// up with `tc qdisc replace dev IF root tbf rate 18389700bps burst 2502 limit 524288`) and
    /// the emulator keeps PACKAGES (default 12) queued ahead, waking twice a package.
    #[arg(long, default_value = "spin")]
    pace: Pace,
    /// With `--pace link`: read each package's departure times from a tap on the cable,
    /// interface IFACE in network namespace NETNS (root), instead of the kernel's transmit
    /// stamps of the emulator's own socket (taken before the cable's queue).
    #[arg(long, value_name = "NETNS:IFACE")]
    tap: Option<String>,
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
    #[arg(long, value_name = "PRIO", value_parser = clap::value_parser!(u32).range(1..=99), conflicts_with = "deadline")]
    fifo: Option<u32>,
    /// Run as SCHED_DEADLINE with RUNTIME/DEADLINE/PERIOD in microseconds, e.g. `650/725/725`:
    /// above every SCHED_FIFO thread, for runs where something real-time (a SCHED_FIFO 99
    /// rogue) shares the emulator's hart. The emulator sends a packet every 45 us and needs
    /// most of a hart on a virtual machine: size the runtime for that. With --hart on a hart
    /// that shares its scheduling domain (no tessd), the emulator starts on that hart with the
    /// domain's affinity, as the kernel requires of deadline tasks.
    #[arg(long, value_name = "R/D/P", value_parser = parse_deadline)]
    deadline: Option<Policy>,
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

/// Parses `RUNTIME/DEADLINE/PERIOD` (microseconds) into a `SCHED_DEADLINE` policy.
fn parse_deadline(s: &str) -> Result<Policy, String> {
    let bad = || format!("{s:?} is not RUNTIME/DEADLINE/PERIOD in microseconds");
    let us: Vec<u64> = s
        .split('/')
        .map(|p| p.trim().parse::<u64>())
        .collect::<Result<_, _>>()
        .map_err(|_| bad())?;
    let [runtime, deadline, period] = us[..] else {
        return Err(bad());
    };
    if !(runtime > 0 && runtime <= deadline && deadline <= period) {
        return Err(format!(
            "{s:?}: SCHED_DEADLINE needs 0 < runtime <= deadline <= period"
        ));
    }
    Ok(Policy::Deadline {
        runtime: Duration::from_micros(runtime),
        deadline: Duration::from_micros(deadline),
        period: Duration::from_micros(period),
    })
}

const DEFAULT_GESTURE: &str = include_str!("../../gestures/default.toml");

fn main() -> Result<()> {
    let cli = Cli::parse();
    // The tap lives in the wire's namespace: open it there, before moving to the device's.
    let tap = match &cli.tap {
        Some(spec) => {
            let (ns, iface) = spec
                .split_once(':')
                .with_context(|| format!("--tap {spec:?} is not NETNS:IFACE"))?;
            netns::enter(ns)?;
            Some(
                tess_music::net::WireTap::open(iface)
                    .with_context(|| format!("opening a tap on {iface} in netns {ns}"))?,
            )
        }
        None => None,
    };
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
    let policy = cli
        .deadline
        .or(cli.fifo.map(|priority| Policy::Fifo { priority }));
    match rt::place_current_thread(cli.hart, policy) {
        Ok(()) => {}
        // The kernel admits a deadline task only with an affinity that spans its scheduling
        // domain: start on --hart, then take the domain's affinity. A wake-up stays on the
        // hart the thread slept on unless a deadline task with an earlier deadline runs there.
        Err(rt::PlacementError::Policy { .. }) if cli.deadline.is_some() && cli.hart.is_some() => {
            let all = tess_sched::online_harts().context("reading the online harts")?;
            tess_sched::affinity::set_affinity(0, &all)
                .context("widening the affinity for SCHED_DEADLINE")?;
            rt::place_current_thread(None, policy)?;
            eprintln!(
                "tess-slabs: hart {} shares a scheduling domain: SCHED_DEADLINE with affinity {all}, started on hart {}",
                cli.hart.unwrap_or(0),
                cli.hart.unwrap_or(0)
            );
        }
        Err(e) => return Err(e.into()),
    }
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
    let run = emulator::run_tapped(&cfg, &rt::STOP, tap.as_ref())?;
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
