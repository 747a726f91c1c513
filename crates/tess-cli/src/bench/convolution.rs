//! `tess bench convolution`: long-running tasks in partitioned convolution (issue 15, seed 001
//! section 3.3). The measuring code lives in `tess_conv::bench` (instances per hart) and
//! `tess_pd::bench::conv_in_engine` (one `tess~conv` in the graph engine, long levels
//! synchronous and preemptive).

use super::Common;
use clap::Args;
use tess_bench::Report;

/// `tess bench convolution`.
#[derive(Args, Debug, Clone)]
pub struct ConvolutionArgs {
    #[command(flatten)]
    pub common: Common,
    /// Impulse response length in samples (524,288: 11.9 s at 44.1 kHz).
    #[arg(long, default_value_t = 524_288)]
    pub ir_len: usize,
    /// Audio block in samples.
    #[arg(long, default_value_t = 32)]
    pub block: usize,
    /// Length of the run that confirms the most instances found, seconds.
    #[arg(long, default_value_t = 60.0)]
    pub seconds: f64,
    /// Length of each run of the search, seconds.
    #[arg(long, default_value_t = 3.0)]
    pub search_seconds: f64,
    /// SCHED_FIFO priority of the audio thread (the long levels run below it).
    #[arg(long, default_value_t = 80)]
    pub rt_priority: i32,
    /// Never try more instances than this.
    #[arg(long, default_value_t = 400)]
    pub max_instances: usize,
    /// The variants to measure (comma-separated): instances per hart of the library's
    /// preemptive and time-distributed modes and of zita-convolver, and `engine`: tess-pd
    /// playing one `tess~conv` with its long levels synchronous, preemptive, then in the
    /// background.
    #[arg(long, value_delimiter = ',', default_value = "preemptive,time-distributed,zita,engine",
          value_parser = ["preemptive", "time-distributed", "zita", "engine"])]
    pub variants: Vec<String>,
    /// Seconds the engine plays in each mode (`engine`).
    #[arg(long, default_value_t = 20.0)]
    pub engine_seconds: f64,
}

/// Runs it.
pub fn run(a: &ConvolutionArgs) -> anyhow::Result<Report> {
    let last_hart = tess_sched::online_harts()?.iter().last().unwrap_or(0);
    let quick = a.common.quick;
    let o = tess_conv::bench::ConvBenchOptions {
        hart: a.common.hart.unwrap_or(last_hart),
        rt_priority: a.rt_priority,
        ir_len: a.ir_len,
        block: a.block,
        seconds: if quick { 2.0 } else { a.seconds },
        search_seconds: if quick { 0.5 } else { a.search_seconds },
        max_instances: if quick { 16 } else { a.max_instances },
        variants: a
            .variants
            .iter()
            .filter(|v| *v != "engine")
            .cloned()
            .collect(),
    };
    let mut r = tess_conv::bench::run(&o)?;
    if a.variants.iter().any(|v| v == "engine") {
        tess_pd::bench::conv_in_engine(
            &tess_pd::bench::ConvEngineOptions {
                cpu: o.hart,
                rt_priority: a.rt_priority,
                ir_len: a.ir_len,
                block: a.block,
                seconds: if quick { 2.0 } else { a.engine_seconds },
            },
            &mut r,
        )?;
    }
    Ok(r)
}
