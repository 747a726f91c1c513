//! `tess bench net`: the network service's guarantees (seed 000 section 4.2, issue 6). The
//! scenarios are in `net/scenarios.rs`, the cells they run in in `net/cells.rs`, the round-trip
//! probe in `net/pingpong.rs`. (They lived in `tess-net` once; a service crate must not depend
//! on the music application its benchmark drives, so they are here, above both.)

pub(super) mod cells;
mod pingpong;
mod scenarios;

use super::Common;
use std::path::PathBuf;
use std::time::Duration;

/// Options of `tess bench net`.
#[derive(clap::Args, Debug, Clone)]
pub struct NetArgs {
    #[command(flatten)]
    pub common: Common,
    /// Measured seconds per scenario (default 20; with --quick 4).
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Latency bound of scenario (d), e.g. `250us`.
    #[arg(long, default_value = "250us")]
    pub latency: String,
    /// Directory for histograms, samples and logs.
    #[arg(long, default_value = "out/net")]
    pub out: PathBuf,
    /// Only these scenarios, comma-separated, of floor,direct,a,b,c,d,max (default all).
    #[arg(long, value_name = "LIST")]
    pub scenarios: Option<String>,
}

/// Runs the benchmark.
pub fn run(a: &NetArgs) -> anyhow::Result<tess_bench::Report> {
    let mut opts = scenarios::BenchOptions::beside_current_exe(&a.out)?;
    opts.quick = a.common.quick;
    opts.seconds = a.seconds;
    opts.service_hart = a.common.hart;
    opts.latency = tess_core::units::parse_duration(&a.latency)
        .map_err(|e| anyhow::anyhow!("--latency: {e}"))?;
    anyhow::ensure!(opts.latency > Duration::ZERO, "--latency must be positive");
    if let Some(list) = &a.scenarios {
        opts.scenarios = list.split(',').map(|s| s.trim().to_string()).collect();
        for s in &opts.scenarios {
            anyhow::ensure!(
                scenarios::ALL.contains(&s.as_str()),
                "unknown scenario {s:?} (known: {})",
                scenarios::ALL.join(",")
            );
        }
    }
    scenarios::run(opts)
}
