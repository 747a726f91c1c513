//! `tess bench graph`: tess-pd's parallel audio graph engine (issue 15, seed 001 section 2):
//! speedup on 2 harts for a wide patch, a deep chain, global queue vs work stealing, and real-
//! time capacity against Pd 0.53 itself. The measuring code lives in `tess_pd::bench`.

use super::Common;
use clap::Args;
use tess_bench::Report;

/// `tess bench graph`.
#[derive(Args, Debug, Clone)]
pub struct GraphArgs {
    #[command(flatten)]
    pub common: Common,
    /// Voices in the wide patch (osc~ -> vcf~ -> env~ each).
    #[arg(long, default_value_t = 64)]
    pub voices: usize,
    /// SCHED_FIFO priority of the harts and of pd (0: ordinary threads).
    #[arg(long, default_value_t = 50)]
    pub rt_priority: i32,
}

/// Runs it.
pub fn run(a: &GraphArgs) -> anyhow::Result<Report> {
    let o = tess_pd::bench::GraphBenchOptions {
        quick: a.common.quick,
        first_cpu: a.common.hart.unwrap_or(0),
        voices: a.voices,
        rt_priority: (a.rt_priority > 0).then_some(a.rt_priority),
    };
    tess_pd::bench::run(&o)
}
