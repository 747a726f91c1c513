//! `tess bench channel`: channel round trips and throughput between two processes on two
//! harts, side by side with baselines measured in the same run.
//!
//! Layout: this process runs the measuring side on a thread pinned to
//! [`BenchOptions::parent_hart`]; for each phase it forks a peer pinned to
//! [`BenchOptions::child_hart`]. Phases: bare flag ping-pong (the hardware floor), raw futex
//! ping-pong, Unix socket pair and pipe at 512 bytes, channel busy-poll round trips at every
//! size, channel blocking round trips at 512 bytes (futex only, and adaptive), one-way channel
//! throughput at every size, and single-core memcpy bandwidth.
//!
//! Figures (issue 3): `rtt_busy_median_ns_SIZE`, `rtt_busy_p999_ns_SIZE`,
//! `rtt_block_median_ns_512`, `flag_rtt_median_ns`, `futex_rtt_median_ns`,
//! `uds_rtt_median_ns_512`, `pipe_rtt_median_ns_512`, `tput_msgs_per_s_8`,
//! `tput_bytes_per_s_4096`, `memcpy_bytes_per_s`, and a few more of the same kinds.

mod baselines;
mod channel;
mod proc;

use crate::Wait;
use anyhow::Context;
use std::time::Duration;
use tess_bench::{Report, Summary, Table};
use tess_sched::{affinity, HartSet};

/// The message sizes of the seed tables.
pub const SIZES: [usize; 8] = [8, 64, 512, 1024, 1280, 2048, 4096, 4480];

/// Parameters of [`run`].
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Hart of the measuring process.
    pub parent_hart: usize,
    /// Hart of the forked peer.
    pub child_hart: usize,
    /// Message sizes.
    pub sizes: Vec<usize>,
    /// Busy-poll round trips per size (the issue asks for at least 100,000).
    pub rtt_samples: usize,
    /// Round trips of the blocking and baseline measurements.
    pub block_samples: usize,
    /// Unmeasured round trips before each measurement.
    pub warmup: usize,
    /// How long each throughput measurement runs.
    pub tput_duration: Duration,
    /// Ring capacity of the round-trip channel, bytes per direction.
    pub capacity: usize,
    /// Ring capacity of the throughput channel, bytes per direction.
    pub tput_capacity: usize,
    /// Wake-up probes for the noise floor (SCHED_FIFO 99, 1 ms apart); 0 skips it.
    pub noise_samples: usize,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            parent_hart: 0,
            child_hart: 1,
            sizes: SIZES.to_vec(),
            rtt_samples: 100_000,
            block_samples: 20_000,
            warmup: 2_000,
            tput_duration: Duration::from_millis(200),
            capacity: 64 * 1024,
            tput_capacity: 256 * 1024,
            noise_samples: 200,
        }
    }
}

impl BenchOptions {
    /// Few samples: the whole bench in a few seconds (smoke tests, `--quick`).
    pub fn quick() -> Self {
        BenchOptions {
            rtt_samples: 2_000,
            block_samples: 500,
            warmup: 200,
            tput_duration: Duration::from_millis(20),
            noise_samples: 20,
            ..Default::default()
        }
    }
}

/// Runs the benchmark (see the module docs) and returns its report.
pub fn run(opts: BenchOptions) -> anyhow::Result<Report> {
    anyhow::ensure!(
        opts.parent_hart != opts.child_hart,
        "the two sides must run on different harts (both on {})",
        opts.parent_hart
    );
    anyhow::ensure!(
        opts.sizes.iter().all(|&s| s > 0 && s <= channel::MAX_SIZE),
        "message sizes must be in 1..={}",
        channel::MAX_SIZE
    );
    let allowed = affinity::get_affinity(0).context("reading this thread's affinity")?;
    for h in [opts.parent_hart, opts.child_hart] {
        anyhow::ensure!(
            allowed.contains(h),
            "hart {h} is not available to this process (allowed: {allowed})"
        );
    }
    // Measure from a thread pinned to the parent hart, leaving the caller's affinity alone.
    std::thread::Builder::new()
        .name("bench-channel".into())
        .spawn(move || {
            affinity::set_affinity(0, &HartSet::single(opts.parent_hart))
                .with_context(|| format!("pinning the bench to hart {}", opts.parent_hart))?;
            measure(&opts)
        })
        .context("spawning the bench thread")?
        .join()
        .map_err(|_| anyhow::anyhow!("the bench thread panicked"))?
}

fn ns(v: f64) -> String {
    format!("{v:.0}")
}

fn measure(o: &BenchOptions) -> anyhow::Result<Report> {
    let mut r = Report::new("channel");
    r.note(format!(
        "measuring process on hart {}, forked peer pinned to hart {}; both SCHED_OTHER",
        o.parent_hart, o.child_hart
    ));
    r.note(format!(
        "busy-poll: {} round trips per size after {} warm-up; blocking and baselines: {}",
        o.rtt_samples, o.warmup, o.block_samples
    ));

    // Baselines.
    let flag = Summary::of_ns(&baselines::flag_rtt(o, o.rtt_samples)?);
    let futex = Summary::of_ns(&baselines::futex_rtt(o, o.block_samples)?);
    let uds = Summary::of_ns(&baselines::uds_rtt(o, o.block_samples, 512)?);
    let pipe = Summary::of_ns(&baselines::pipe_rtt(o, o.block_samples, 512)?);

    // Channel round trips.
    let busy = channel::rtt(o, &o.sizes, o.rtt_samples, Wait::BusyPoll)?;
    let block = Summary::of_ns(&channel::rtt(o, &[512], o.block_samples, Wait::Sleep)?[0]);
    let adaptive = Summary::of_ns(&channel::rtt(o, &[512], o.block_samples, Wait::Adaptive)?[0]);

    let mut t = Table::new(
        "round trip, busy-poll (ns)",
        &["size", "median", "p99", "p99.9", "max", "median / flag"],
    );
    let mut busy_by_size = Vec::new();
    for (&size, samples) in o.sizes.iter().zip(&busy) {
        let s = Summary::of_ns(samples);
        r.figure(format!("rtt_busy_median_ns_{size}"), s.median);
        r.figure(format!("rtt_busy_p99_ns_{size}"), s.p99);
        r.figure(format!("rtt_busy_p999_ns_{size}"), s.p999);
        r.figure(format!("rtt_busy_max_ns_{size}"), s.max);
        t.row(&[
            size.to_string(),
            ns(s.median),
            ns(s.p99),
            ns(s.p999),
            ns(s.max),
            format!("{:.2}", s.median / flag.median),
        ]);
        busy_by_size.push((size, s));
    }
    r.table(t);

    let mut t = Table::new(
        "round trip, blocking and baselines (ns)",
        &["what", "median", "p99", "p99.9", "max"],
    );
    for (name, s) in [
        ("flag ping-pong (floor)", flag),
        ("futex ping-pong", futex),
        ("channel 512 B, futex wait", block),
        ("channel 512 B, adaptive", adaptive),
        ("unix socket 512 B", uds),
        ("pipe 512 B", pipe),
    ] {
        t.row(&[
            name.to_string(),
            ns(s.median),
            ns(s.p99),
            ns(s.p999),
            ns(s.max),
        ]);
    }
    r.table(t);
    r.figure("flag_rtt_median_ns", flag.median)
        .figure("flag_rtt_p999_ns", flag.p999)
        .figure("futex_rtt_median_ns", futex.median)
        .figure("rtt_block_median_ns_512", block.median)
        .figure("rtt_block_p999_ns_512", block.p999)
        .figure("rtt_adaptive_median_ns_512", adaptive.median)
        .figure("uds_rtt_median_ns_512", uds.median)
        .figure("pipe_rtt_median_ns_512", pipe.median);

    // Throughput.
    let dur = tess_sched::clock::ns(o.tput_duration);
    let memcpy = baselines::memcpy_bandwidth(4096, o.tput_capacity, dur);
    r.figure("memcpy_bytes_per_s", memcpy);
    let memcpy_big = baselines::memcpy_bandwidth(4096, 64 << 20, dur.max(50_000_000));
    r.figure("memcpy_64mib_bytes_per_s", memcpy_big);
    let mut t = Table::new(
        "one-way throughput (batches published with one store)",
        &["size", "batch", "msgs/s", "bytes/s", "GB/s"],
    );
    let mut tput = Vec::new();
    for &size in &o.sizes {
        let batch = (4096 / size).clamp(4, 64);
        let (msgs, bytes) = channel::throughput(o, size, batch, dur)?;
        r.figure(format!("tput_msgs_per_s_{size}"), msgs.round());
        r.figure(format!("tput_bytes_per_s_{size}"), bytes.round());
        t.row(&[
            size.to_string(),
            batch.to_string(),
            format!("{msgs:.3e}"),
            format!("{bytes:.3e}"),
            format!("{:.2}", bytes / 1e9),
        ]);
        tput.push((size, msgs, bytes));
    }
    t.row(&[
        format!("memcpy, {} KiB", o.tput_capacity / 1024),
        "-".into(),
        "-".into(),
        format!("{memcpy:.3e}"),
        format!("{:.2}", memcpy / 1e9),
    ]);
    t.row(&[
        "memcpy, 64 MiB".to_string(),
        "-".into(),
        "-".into(),
        format!("{memcpy_big:.3e}"),
        format!("{:.2}", memcpy_big / 1e9),
    ]);
    r.table(t);
    r.note(format!(
        "memcpy_bytes_per_s: 4096-byte copies from a hot buffer into a {} KiB region (the \
         throughput ring's size, cache-resident), one core; the 4096-byte target is checked \
         against it (the strict reading). memcpy_64mib_bytes_per_s: the same into 64 MiB",
        o.tput_capacity / 1024
    ));
    r.note(
        "flag baseline: each side owns a flag on its own 128-byte slot and spins on the \
         other's; futex baseline: always FUTEX_WAKE, FUTEX_WAIT until the counter moves; \
         rtt_block_* is the channel with Wait::Sleep (no spinning), rtt_adaptive_* with \
         Wait::Adaptive",
    );

    // Targets (issue 3).
    for &(size, s) in busy_by_size.iter().filter(|(size, _)| *size <= 512) {
        r.target(
            format!("rtt_busy_median_ns_{size} <= 1.5 x flag_rtt_median_ns"),
            s.median <= 1.5 * flag.median,
            format!(
                "{:.0} vs {:.0} (x{:.2})",
                s.median,
                flag.median,
                s.median / flag.median
            ),
        );
        r.target(
            format!("rtt_busy_median_ns_{size} < 500"),
            s.median < 500.0,
            format!("{:.0}", s.median),
        );
    }
    if let Some((_, s)) = busy_by_size.iter().find(|(size, _)| *size == 4480) {
        r.target(
            "rtt_busy_median_ns_4480 < 1500",
            s.median < 1500.0,
            format!("{:.0}", s.median),
        );
    }
    r.target(
        "rtt_block_median_ns_512 <= 1.3 x futex_rtt_median_ns",
        block.median <= 1.3 * futex.median,
        format!(
            "{:.0} vs {:.0} (x{:.2})",
            block.median,
            futex.median,
            block.median / futex.median
        ),
    );
    if let Some(&(_, msgs, _)) = tput.iter().find(|(size, ..)| *size == 8) {
        r.target(
            "tput_msgs_per_s_8 >= 50e6",
            msgs >= 50e6,
            format!("{msgs:.3e}"),
        );
    }
    if let Some(&(_, _, bytes)) = tput.iter().find(|(size, ..)| *size == 4096) {
        r.target(
            "tput_bytes_per_s_4096 >= 0.5 x memcpy_bytes_per_s",
            bytes >= 0.5 * memcpy,
            format!("{bytes:.3e} vs {memcpy:.3e} (x{:.2})", bytes / memcpy),
        );
    }

    // Noise floor of the machine, for reading the tails.
    if o.noise_samples > 0 {
        match tess_bench::probe::noise_floor(o.parent_hart, o.noise_samples) {
            Ok(p) => {
                r.note(format!(
                    "noise floor on hart {} (SCHED_FIFO 99 wake-up lateness, {} samples): \
                     median {:.1} us, p99 {:.1} us, max {:.1} us",
                    p.hart,
                    p.summary_us.count,
                    p.summary_us.median,
                    p.summary_us.p99,
                    p.summary_us.max
                ));
                r.detail("noise_floor_us", p.summary_us);
            }
            Err(e) => {
                r.note(format!("noise floor not measured: {e}"));
            }
        }
    }
    r.detail(
        "options",
        serde_json::json!({
            "parent_hart": o.parent_hart, "child_hart": o.child_hart,
            "rtt_samples": o.rtt_samples, "block_samples": o.block_samples,
            "warmup": o.warmup, "tput_duration_ms": o.tput_duration.as_millis() as u64,
            "capacity": o.capacity, "tput_capacity": o.tput_capacity,
        }),
    );
    Ok(r)
}
