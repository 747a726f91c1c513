//! `tess-ep`: the embarrassingly parallel CPU kernel (NAS EP style) used as best-effort
//! interference by the music scenarios.

use anyhow::Result;
use clap::Parser;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tess_music::ep::{self, EpTally};
use tess_music::rt;

/// Runs the NAS EP kernel (gaussian pairs by Marsaglia's polar method from the NAS linear
/// congruential generator) on N threads until --duration passes or SIGINT/SIGTERM arrives, then
/// prints the tallies and the rate. Each thread keeps one hart busy without touching memory.
#[derive(Parser, Debug)]
#[command(version)]
struct Cli {
    /// Worker threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Seconds to run (default: until SIGINT/SIGTERM).
    #[arg(long)]
    duration: Option<f64>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    rt::install_signal_handlers()?;
    let start = Instant::now();
    let end = cli.duration.map(|d| start + Duration::from_secs_f64(d));
    let handles: Vec<_> = (0..cli.threads.max(1))
        .map(|i| {
            std::thread::spawn(move || {
                let mut total = EpTally::default();
                let mut x = ep::SEED.wrapping_add(2 * i as u64 * 1_000_003) | 1;
                while !rt::STOP.load(Ordering::Relaxed) && end.is_none_or(|e| Instant::now() < e) {
                    let (t, nx) = ep::run_pairs(x, 1 << 16);
                    total.merge(&t);
                    x = nx;
                }
                total
            })
        })
        .collect();
    let mut total = EpTally::default();
    for h in handles {
        total.merge(&h.join().expect("EP thread panicked"));
    }
    let secs = start.elapsed().as_secs_f64();
    if cli.json {
        println!(
            "{}",
            serde_json::json!({ "tally": total, "seconds": secs, "mpairs_per_s": total.pairs as f64 / secs / 1e6 })
        );
    } else {
        println!(
            "tess-ep: {} pairs in {secs:.2} s ({:.1} Mpairs/s), {} accepted, sx = {:.6e}, sy = {:.6e}, counts {:?}",
            total.pairs,
            total.pairs as f64 / secs / 1e6,
            total.accepted(),
            total.sx,
            total.sy,
            total.counts
        );
    }
    Ok(())
}
