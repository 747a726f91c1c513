//! `tess-idle-spin`: keeps a hart from idling, as a tess dedicated cell's idle spinner does,
//! for the plain-Linux baselines (issue 11: every baseline gets the same machine preparation).
//!
//! On a virtual machine an idle hart halts and its vCPU leaves the host CPU; the next wake-up
//! then pays for the hypervisor to bring it back. A `SCHED_IDLE` thread that spins whenever
//! nothing else wants the hart keeps it running at the cost of the whole hart's idle time,
//! which the music bench reports as the spinner's CPU time.

use anyhow::{Context, Result};
use clap::Parser;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tess_music::rt;
use tess_sched::Policy;

/// Spins at SCHED_IDLE on one hart until SIGINT/SIGTERM or --seconds, then prints the CPU time
/// it burned (JSON with --json).
#[derive(Parser, Debug)]
#[command(version)]
struct Cli {
    /// The hart to keep busy.
    #[arg(long)]
    hart: usize,
    /// Stop by itself after this many seconds.
    #[arg(long, default_value_t = 3600.0)]
    seconds: f64,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    rt::install_signal_handlers().context("installing signal handlers")?;
    rt::place_current_thread(Some(cli.hart), Some(Policy::Idle))?;
    let start = Instant::now();
    let until = start + Duration::from_secs_f64(cli.seconds);
    while !rt::STOP.load(Ordering::Relaxed) && Instant::now() < until {
        std::hint::spin_loop();
    }
    let wall = start.elapsed().as_secs_f64();
    let cpu = tess_sched::clock::thread_cpu_ns() as f64 / 1e9;
    if cli.json {
        println!(
            "{}",
            serde_json::json!({ "hart": cli.hart, "wall_s": wall, "cpu_s": cpu, "cpu_fraction": cpu / wall })
        );
    } else {
        println!(
            "tess-idle-spin: hart {}: {cpu:.2} s of CPU in {wall:.2} s ({:.1}%)",
            cli.hart,
            100.0 * cpu / wall
        );
    }
    Ok(())
}
