//! `tess bench NAME`: benchmarks that print a table, or with `--json` one JSON object whose
//! `figures` map each figure (named as in the issue that asks for it) to a number. Baselines
//! run in the same invocation; every latency benchmark also measures the noise floor.
//!
//! Two subcommands are not benchmarks: `tess bench list` prints the benchmarks' names (every
//! other subcommand of [`Which`], so a new bench is listed, and run by `scripts/bench-all`, as
//! soon as it is registered here), and `tess bench record` writes the benchmark record from
//! one run set (see [`record`]).

mod audio_device;
mod conference;
mod convolution;
mod daemon;
mod decoders;
mod graph;
mod heartbeat;
mod isolation;
mod music;
mod mux;
mod net;
mod observe;
mod pacora;
mod pota;
mod pulse;
mod record;
mod reserve;
mod rtapp;
mod support;
mod update;
pub mod work;

use clap::{Args, Subcommand};
use tess_bench::Report;

/// `tess bench`: run a benchmark, list them, or write the benchmark record.
///
/// `scripts/bench-all` runs every benchmark that `tess bench list` names, 3 times each, against
/// a private tessd, and writes docs/benchmarks.md with `tess bench record`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    which: Which,
}

/// Options every benchmark takes.
#[derive(Args, Debug, Clone)]
pub struct Common {
    /// Print one JSON object instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    /// Fewer samples: a smoke run in seconds, not a measurement.
    #[arg(long, global = true)]
    pub quick: bool,
    /// Hart to measure on (default: the highest hart tessd manages).
    #[arg(long, global = true, value_name = "HART")]
    pub hart: Option<usize>,
    /// Exit with status 1 if a target is missed.
    #[arg(long, global = true)]
    pub check: bool,
    /// Also write the JSON report to this file (the tables still go to stdout).
    #[arg(long, global = true, value_name = "FILE")]
    pub json_out: Option<std::path::PathBuf>,
}

#[derive(Subcommand, Debug)]
enum Which {
    /// Multiplexing accuracy (seed 004 section 3.2): reserved cells keep their throughput
    /// beside others; two best-effort cells split a hart evenly; requested vs delivered share
    /// per policy; time-multiplexing latency per policy (seed 004 Table 2).
    Mux(Common),
    /// Interactivity under 128 CPU-bound threads (seed 003): a periodic task's wake-up latency
    /// on plain Linux, in a dedicated cell, and as SCHED_FIFO 99.
    Isolation(Common),
    /// Latency of a 3-cell change, request to enforced (seed 004 section 3.3).
    Update(Common),
    /// Gang-scheduled windows of a 2-hart time-triggered cell: skew between harts as the kernel
    /// delivers it and after the runtime's alignment spin, the time-triggered multiplexing
    /// latency, and adaptation latency of resizes, beside a FIFO-99 plain-Linux gang (seed 004
    /// Tables 1-2, issue 4).
    Gang(Common),
    /// The live-music proof (seed 000): SLABS emulator and Migrator synthesizer in cells, alone
    /// and with interference cells, against plain Linux and SCHED_FIFO 99 baselines.
    Music(music::MusicArgs),
    /// Channel round trips and throughput between two processes on two harts at the seed
    /// tables' sizes, against a bare shared-memory flag, a futex, and a Unix socket and a pipe
    /// both blocking and spinning (seed 003, seed 001 Table 1).
    Channel(ChannelArgs),
    /// The network service's guarantees (seed 000 section 4.2, Fig. 8): the music pair through
    /// the service beside an abusive streaming client, without and with reservations.
    Net(net::NetArgs),
    /// A reservation belongs to the program (issue 11 part 7, seed 002 `qres_wrap`): the CPU
    /// share of `tess run --reserve 2ms/10ms` for a busy thread beside idle ones, four busy
    /// threads and a wrapped busy loop, beside 16 CFS hogs, against plain CFS and the
    /// per-thread SCHED_DEADLINE split.
    Reserve(Common),
    /// Activation jitter of periodic rt-app tasks beside CPU hogs (seed 002, AQuoSA's RTApp):
    /// each task under `tess run --reserve`, against plain CFS and `chrt -f`.
    Rtapp(rtapp::RtappArgs),
    /// tessd under load (issue 12): 200 clients ask for `status` in a loop while another
    /// applies 20 transactions a second; status latency beside the same readers alone, apply
    /// latency, lost transactions and errors.
    Daemon(daemon::DaemonArgs),
    /// Pulse, user-level scheduling inside a cell (seed 004 section 4.5, Table 3, issue 13):
    /// user-level switch vs a futex ping-pong, tick latency (expiry to the next thread, split
    /// into kernel delivery, sigreturn and user level) vs a SCHED_FIFO preemption, thread
    /// creation vs pthread_create, adaptation 2 <-> 1 harts by hand and driven by tessd (a
    /// Pulse program in a 2-hart cell resized like `tess cell resize`).
    Pulse(Common),
    /// Choosing the right user-level scheduler (seed 004 section 4.1, Fig. 5, issue 13): two
    /// real H.264 decodes through libavcodec in one cell on one hart, 640x360 released at
    /// 60 fps and 750x430 at 30 fps, one thread each; the hart's capacity is sized so decoding
    /// needs 85% of it. The same clips and release times run under Pulse EDF (period =
    /// deadline = the frame period), Pulse GRR (1 ms round robin), plain CFS threads and one
    /// SCHED_DEADLINE reservation per thread; a frame misses when release to decode done
    /// exceeds its period. Writes the latency CDFs as SVG (Fig. 5).
    Decoders(decoders::DecodersArgs),
    /// The parallel Pd graph engine (issue 15, seed 001 section 2): a 64-voice patch on 2 harts
    /// vs 1 (global queue and work stealing), a deep chain, per-block scheduling overhead, and
    /// real-time voices on one hart against Pd 0.53 itself (`pd -batch`).
    Graph(graph::GraphArgs),
    /// Partitioned convolution with long-running tasks (issue 15, seed 001 section 3.3): the
    /// most drop-free instances of a 524,288-sample reverb one hart runs at 32-sample blocks,
    /// long levels preemptive vs time-distributed, beside zita-convolver.
    Convolution(convolution::ConvolutionArgs),
    /// What a heartbeat costs the program that beats (issue 14, seed 004 section 5.1): a beat
    /// into shared memory beside a vDSO clock read and the cheapest system call.
    Heartbeat(Common),
    /// PACORA (seed 004 section 5.3): time to fit a response-time model and to solve the
    /// allocation of 12 cells x 3 resources exactly (Clarabel SOCP), and the optimality gap.
    Pacora(Common),
    /// POTA keeps x264 at 30 fps with less CPU than a static allocation (seed 004 section 6.1,
    /// Fig. 6): mean share vs static, windows on target, rate and share over time (--svg).
    Pota(pota::PotaArgs),
    /// PACORA runs the video conference (seed 004 section 6.2, Fig. 7): nine H.264 streams over
    /// TCP decoded in a video cell, a file indexer and a bandwidth hog; the broker divides the
    /// CPU and the link. Against a static split and plain Linux in the same run.
    Conference(conference::ConferenceArgs),
    /// The graph engine as the host of seed 001's Ethernet audio device (section 5.3, Table
    /// 2): response times alone and beside a synthetic application in another cell, 5 minutes
    /// each, against plain Linux and `chrt -f 99` in the same run.
    AudioDevice(audio_device::AudioDeviceArgs),
    /// What watching costs (issue 16): a Prometheus scrape and a `tess top` refresh with 100
    /// cells, and a compute step's CPU time with and without 10 Hz scraping.
    Observe(Common),
    /// Print the name of every benchmark, one a line (for scripts/bench-all).
    List,
    /// Write the benchmark record (markdown, on stdout) from one run set of scripts/bench-all:
    /// the commit, date and machine, and per bench its narrative, the side-by-side rows, every
    /// figure's median (min–max) over the repetitions, targets met and failed runs.
    Record(record::RecordArgs),
}

/// Subcommands of [`Which`] that are not benchmarks.
const NOT_BENCHES: &[&str] = &["list", "record", "help"];

/// The benchmarks' names, from the subcommands registered in [`Which`].
pub fn names() -> Vec<String> {
    use clap::Subcommand as _;
    Which::augment_subcommands(clap::Command::new("bench"))
        .get_subcommands()
        .map(|c| c.get_name().to_string())
        .filter(|n| !NOT_BENCHES.contains(&n.as_str()))
        .collect()
}

/// `tess bench channel`.
#[derive(Args, Debug, Clone)]
pub struct ChannelArgs {
    #[command(flatten)]
    common: Common,
    /// Harts of the two processes, MEASURING,PEER (default 0,1).
    #[arg(long, value_name = "P,C", default_value = "0,1")]
    harts: String,
}

fn channel(a: &ChannelArgs) -> anyhow::Result<Report> {
    let (p, c) = a
        .harts
        .split_once(',')
        .and_then(|(p, c)| Some((p.trim().parse().ok()?, c.trim().parse().ok()?)))
        .ok_or_else(|| anyhow::anyhow!("--harts takes two hart ids, e.g. 0,1"))?;
    let mut opts = if a.common.quick {
        tess_channel::bench::BenchOptions::quick()
    } else {
        Default::default()
    };
    opts.parent_hart = p;
    opts.child_hart = c;
    tess_channel::bench::run(opts)
}

/// Runs a benchmark.
pub fn run(a: BenchArgs) -> anyhow::Result<i32> {
    let (common, report): (Common, Report) = match a.which {
        Which::List => {
            for n in names() {
                println!("{n}");
            }
            return Ok(0);
        }
        Which::Record(r) => {
            record::run(&r)?;
            return Ok(0);
        }
        Which::Mux(c) => (c.clone(), mux::run(&c)?),
        Which::Isolation(c) => (c.clone(), isolation::run(&c)?),
        Which::Update(c) => (c.clone(), update::run(&c)?),
        Which::Channel(a) => (a.common.clone(), channel(&a)?),
        Which::Music(a) => (a.common.clone(), music::run(&a)?),
        Which::Gang(c) => {
            let mut o = tess_runtime::bench::BenchOptions::new(c.quick);
            o.hart = c.hart;
            (c.clone(), tess_runtime::bench::run(&o)?)
        }
        Which::Net(a) => (a.common.clone(), net::run(&a)?),
        Which::Reserve(c) => (c.clone(), reserve::run(&c)?),
        Which::Rtapp(a) => (a.common.clone(), rtapp::run(&a)?),
        Which::Daemon(a) => (a.common.clone(), daemon::run(&a)?),
        Which::Pulse(c) => (c.clone(), pulse::run(&c)?),
        Which::Decoders(a) => (a.common.clone(), decoders::run(&a)?),
        Which::Graph(a) => (a.common.clone(), graph::run(&a)?),
        Which::Convolution(a) => (a.common.clone(), convolution::run(&a)?),
        Which::Heartbeat(c) => (c.clone(), heartbeat::run(&c)?),
        Which::Pacora(c) => (c.clone(), pacora::run(&c)?),
        Which::Pota(a) => (a.common.clone(), pota::run(&a)?),
        Which::Conference(a) => (a.common.clone(), conference::run(&a)?),
        Which::Observe(c) => (c.clone(), observe::run(&c)?),
        Which::AudioDevice(a) => (a.common.clone(), audio_device::run(&a)?),
    };
    if let Some(path) = &common.json_out {
        std::fs::write(path, report.render_json())
            .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
    }
    if common.json {
        println!("{}", report.render_json());
    } else {
        print!("{}", report.render_text());
    }
    Ok(if common.check && !report.all_targets_met() {
        1
    } else {
        0
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn list_names_the_benches_and_nothing_else() {
        let names = super::names();
        for b in ["mux", "channel", "music", "update"] {
            assert!(names.iter().any(|n| n == b), "{b} missing from {names:?}");
        }
        for not in super::NOT_BENCHES {
            assert!(!names.iter().any(|n| n == not), "{not} listed: {names:?}");
        }
    }
}
