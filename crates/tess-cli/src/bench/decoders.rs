//! `tess bench decoders`: choosing the right user-level scheduler (seed 004 section 4.1, Fig. 5;
//! issue 13).
//!
//! Two real H.264 decodes share one hart, one thread each, through libavcodec (FFmpeg's
//! library, loaded at run time: `decoders/avcodec.rs`): a 640x360 clip played at 60 fps and a
//! 750x430 clip at 30 fps. Each stream releases one frame per period (1/60 s, 1/30 s) from a
//! common start; its thread decodes the frames in order, and a frame's latency is the time from
//! its release to its decode finishing (a frame released while the previous one is still being
//! decoded waits: it is late, not dropped). A frame misses when its latency exceeds its period.
//!
//! The same two streams (same clips, pre-split into access units outside the timed region, same
//! release schedule, same hart, same capacity) run under four schedulers:
//!
//! | variant | how |
//! |---|---|
//! | `edf` | Pulse, 1 hart, global EDF; each thread has period = deadline = its frame period (`wait_next_period`) |
//! | `grr` | Pulse, 1 hart, global round robin with the 1 ms tick (Listing 2); threads sleep with `tess_pulse::sleep_until_ns` |
//! | `cfs` | two plain Linux threads (CFS/EEVDF) |
//! | `dl` | two plain Linux threads, each its own `SCHED_DEADLINE` reservation (runtime = its mean decode cost / load, period = deadline = its frame period) |
//!
//! **Capacity.** The paper sizes the experiment so that decoding needs about 85% of the machine.
//! Decoding these clips needs a fraction of a modern hart, so the bench sizes the capacity instead,
//! from the demand: each stream's mean CPU time per frame `c60`, `c30` *as played* (`played_cost`:
//! both streams on their release schedule for the same frames as a scheduler's slice, as plain
//! threads on the hart with no limit, each frame's cost its thread's CPU time in the decode);
//! demand `D = 60 c60 + 30 c30` (a fraction of one hart); capacity `C = D / load` (`--load`,
//! default 0.85). Decoding as played costs more than decoding a clip alone back to back (between
//! frames the hart idles and the caches cool, and the two decoders take turns in them): 8% to 19%
//! more in four runs here. Sized from the alone cost, as the bench did until 2026-11-29, the
//! capacity fell short of the demand on bad days and every scheduler missed most frames. The alone
//! cost is still measured, for the spread of per-frame costs.
//!
//! **Rounds.** This guest's speed changes by more than the 15% of slack within seconds, and from
//! one run to the next, so the bench measures in `--rounds` rounds (default 4, one per variant):
//! each round measures the demand as played, sizes the capacity from it, and runs every scheduler
//! for `--secs / rounds` seconds on it, in an order that changes from round to round
//! (`variant_order`, a Williams design: with the default four rounds each variant runs first,
//! second, third and last once, and right after each other variant once). A slowdown then lands
//! on all schedulers alike rather than on whichever ran at the time.
//! The figures pool every round's frames; a table gives each round's demand, capacity, and each
//! scheduler's misses and the CPU it received as a share of the capacity (near 100%: the slice
//! needed all of it, the host ran slower than when the demand was measured). `demand`, `capacity`
//! and the played costs are those of the round with the median demand; `<variant>_used` is the mean
//! over the rounds of the CPU received as a share of the round's capacity. Every variant gets `C`
//! of the same hart, in the form its scheduler takes, with the period `P` = 1/60 s:
//!
//! - `edf`, `grr`: the Pulse hart (one kernel thread) is a `SCHED_DEADLINE` reservation of
//!   `C x P` every `P`, the cell's reservation;
//! - `cfs`: the two threads in a cgroup of their own with a CFS bandwidth limit of `C x P` per
//!   `P` (`cpu.cfs_quota_us` in the v1 `cpu` hierarchy, `cpu.max` in v2);
//! - `dl`: each thread its own reservation, runtime `c / load` per frame period (the two sum to
//!   `C`); a `SCHED_DEADLINE` reservation is a hard limit.
//!
//! **Where.** Against a tessd (`scripts/with-tessd`), the measurement runs in a child process in
//! a best-effort cell on one hart (`--hart`, default the highest managed hart) beside a tiny
//! event-triggered anchor cell that keeps that hart a root domain of its own, which pinning
//! `SCHED_DEADLINE` threads needs (the recipe of `tess bench reserve`). Pulse runs standalone
//! (one hart, pinned), not attached to the cell. Without tessd the bench runs in-process pinned
//! to the highest CPU beside whatever else runs there: a `SCHED_FIFO` 99 thread spinning
//! `(1 - C)` of every `P` leaves `C` to `edf`, `grr` and `cfs`, and the `dl` threads cannot be
//! pinned (the kernel refuses `SCHED_DEADLINE` for a thread whose affinity is narrower than its
//! root domain); a note says so, and those figures are not the measurement.
//!
//! **Clips.** Generated once with ffmpeg (testsrc2 with temporal noise, raw YUV) piped into
//! x264 (`--aud --bframes 0`: one access unit per frame, each starting with an access unit
//! delimiter, decode order = display order; `--keyint infinite --no-scenecut`: one IDR, at the
//! start, and no other I frame), 30 s long, kept in the cache dir (`--cache`, default
//! `$XDG_CACHE_HOME/tess/decoders`), never in git. An I frame costs about 1.6 times a P frame
//! here: at 85% load no scheduler fits one in the 30 fps frame's window, so the clips have
//! none past the first, and each thread pre-rolls (decodes the IDR untimed, as a player does
//! before its clock starts). A run longer than the clip loops back to the IDR, a spike that is
//! measured like any frame. The figures `cost_<s>_p50_ms`, `_p99_ms`, `_max_ms` give the
//! spread of per-frame decode cost alone over the played frames, `cost_<s>_idr_ms` the IDR's.
//!
//! **Schedule.** Both streams release frame `k` at `T + k * period` from one instant `T` under
//! every scheduler (Pulse EDF threads join that time base with `tess_pulse::edf::release_at`). In
//! every slice the first second of each stream is played on that schedule but not scored: caches,
//! predictors and the reservations' phases settle in it. `<variant>_steal_ms` is the hart's steal
//! time during the variant's slices (/proc/stat, 10 ms resolution): time the hypervisor ran
//! something else there.
//!
//! Figures: `edf_miss_60`, `edf_miss_30`, `grr_miss_60`, `grr_miss_30`, `cfs_miss_60`,
//! `cfs_miss_30`, `dl_miss_60`, `dl_miss_30` (percent of frames over their period), per-variant
//! `*_p50_60_ms`, `*_p99_60_ms` (and `_30`), `demand` (D), `capacity` (C), `cost_60_ms`,
//! `cost_30_ms` (as played; the round of the median demand), `<variant>_used`, `demand_alone`,
//! `cost_60_alone_ms`, `cost_30_alone_ms` (decoding alone), `rounds`. Targets:
//! `edf_miss_60 <= 0.4`, `edf_miss_30 == 0`, EDF no worse than `SCHED_DEADLINE` on either
//! stream. The CDF of frame latency per scheduler (the paper's Fig. 5, both streams) is written
//! as SVG (`--svg`, default `<cache>/decoders-cdf.svg`).

pub(super) mod avcodec;

use super::support::{cell_on_hart, pick_hart, tess_exe, Session};
use super::Common;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;
use tess_bench::{Report, Table};
use tess_core::spec::Policy;
use tess_sched::{attr, clock, HartSet};

/// `tess bench decoders`.
#[derive(clap::Args, Debug)]
pub struct DecodersArgs {
    #[command(flatten)]
    pub common: Common,
    /// Measured seconds per scheduler, over all rounds (default 25; 5 with --quick).
    #[arg(long, value_name = "S")]
    pub secs: Option<f64>,
    /// Rounds (default 4, one per variant; 1 with --quick). Each round measures the decoding
    /// demand as played, sizes the capacity from it and runs every scheduler for --secs / rounds
    /// on it, in a balanced order (each scheduler once in every place and once after each
    /// other), so a change in the host's speed lands on every scheduler alike.
    #[arg(long, value_name = "N")]
    pub rounds: Option<usize>,
    /// Decoding demand as a fraction of the capacity (the paper: about 0.85).
    #[arg(long, default_value_t = 0.85)]
    pub load: f64,
    /// Period of the capacity, ms: the Pulse hart's reservation and the CFS threads' bandwidth
    /// hand out `capacity x period` every period (default: the faster stream's frame period,
    /// 1/60 s). The `dl` baseline keeps one reservation per thread at its frame period. Keep
    /// it several scheduler ticks long: the kernel charges both budgets at the tick (4 ms at
    /// HZ=250), so a shorter period is overrun and paid back by throttling (2 ms missed a third
    /// of the frames or more here; docs/bench-narrative/decoders.md).
    #[arg(long, value_name = "MS")]
    pub cap_period_ms: Option<f64>,
    /// Clip cache (default $XDG_CACHE_HOME/tess/decoders, else ~/.cache/tess/decoders).
    #[arg(long, value_name = "DIR")]
    pub cache: Option<PathBuf>,
    /// Write the latency CDFs (SVG, the paper's Fig. 5) here (default <cache>/decoders-cdf.svg).
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// Also write the raw measurement (every scored frame's latency, per scheduler and stream,
    /// the rounds' slices in turn; the per-round demand and capacity) here as JSON.
    #[arg(long, value_name = "FILE")]
    pub raw_out: Option<PathBuf>,
    /// Internal: measure in this process and print the raw results as JSON (the bench starts
    /// itself this way inside its cell).
    #[arg(long, hide = true)]
    pub worker: bool,
}

const CELL: &str = "decoders";
const ANCHOR: &str = "decoders-anchor";
/// Default period of the capacity (the Pulse hart's reservation, the CFS bandwidth, the
/// thief; `--cap-period-ms`): the faster stream's frame period, 1/60 s. (1/30 s, the
/// hyperperiod, was tried: the 60 fps stream then misses when its second frame of a period
/// finds the budget spent.)
const CAP_PERIOD_NS: u64 = 16_666_666;

/// The capacity period `--cap-period-ms` asks for, in ns (0.5 ms to 1/30 s).
fn cap_period_ns(a: &DecodersArgs) -> anyhow::Result<u64> {
    match a.cap_period_ms {
        None => Ok(CAP_PERIOD_NS),
        Some(ms) => {
            anyhow::ensure!(
                (0.5..=1000.0 / 30.0).contains(&ms),
                "--cap-period-ms must lie between 0.5 and 33.3 (the slower stream's frame period)"
            );
            Ok((ms * 1e6) as u64)
        }
    }
}
/// Seconds of each generated clip: longer than the default run, so a stream does not loop
/// back to the clip's IDR frame while it is measured.
const CLIP_SECS: u32 = 30;
/// Seconds each stream plays before its frames are scored.
const WARMUP_SECS: usize = 1;
/// From the start of a run to the first release: time for both threads to pre-roll (decode
/// the clip's IDR frame) within the capacity.
const LEAD_NS: u64 = 200_000_000;

/// One stream of the experiment.
#[derive(Clone, Copy, Debug)]
struct Stream {
    name: &'static str,
    size: &'static str,
    fps: u32,
}

const STREAMS: [Stream; 2] = [
    Stream {
        name: "60",
        size: "640x360",
        fps: 60,
    },
    Stream {
        name: "30",
        size: "750x430",
        fps: 30,
    },
];

impl Stream {
    fn period_ns(&self) -> u64 {
        1_000_000_000 / u64::from(self.fps)
    }
    fn file(&self) -> String {
        format!(
            "clip-{}-{}fps-{CLIP_SECS}s-one-idr.264",
            self.size, self.fps
        )
    }
}

const VARIANTS: [(&str, &str); 4] = [
    ("edf", "Pulse EDF"),
    ("grr", "Pulse GRR"),
    ("cfs", "Linux CFS threads"),
    ("dl", "Linux SCHED_DEADLINE per thread"),
];

/// What the worker measured.
#[derive(serde::Serialize, serde::Deserialize, Debug, Default)]
struct Raw {
    hart: usize,
    in_cell: bool,
    dl_pinned: bool,
    /// Mean decode cost per frame of each clip decoded alone, back to back, ns, per stream.
    cost_alone_ns: Vec<f64>,
    /// Per stream: (p50, p99, max) of the per-frame decode cost alone over the frames that
    /// are played (all but the IDR, which is pre-rolled), and the IDR's cost, ns.
    cost_spread_ns: Vec<[f64; 4]>,
    /// The played decode cost per frame, ns, per stream, of the round of the median demand.
    cost_ns: Vec<f64>,
    /// The demand and the capacity of that round (fractions of the hart).
    demand: f64,
    capacity: f64,
    /// Period of the capacity, ns.
    cap_period_ns: u64,
    /// Per variant (VARIANTS order), per stream (STREAMS order): latencies in ns, every
    /// round's slice in turn.
    latency_ns: Vec<Vec<Vec<u64>>>,
    /// Per variant: time the hypervisor ran something else on the hart during its slices
    /// (`steal` in /proc/stat), ms; `None` where the kernel does not report it.
    steal_ms: Vec<Option<f64>>,
    rounds: Vec<Round>,
    notes: Vec<String>,
}

/// One round: the demand measured as played, the capacity sized from it, and every
/// variant's slice on that capacity.
#[derive(serde::Serialize, serde::Deserialize, Debug, Default)]
struct Round {
    /// Played decode cost per frame, ns, per stream (`played_cost`).
    cost_ns: Vec<f64>,
    demand: f64,
    capacity: f64,
    /// Per variant (VARIANTS order): percent of each stream's frames that missed.
    miss: Vec<Vec<f64>>,
    /// Per variant: CPU time the decoding threads (or the Pulse hart) used, as a fraction of
    /// the hart over the variant's slice in this round (first release to last frame done).
    received: Vec<f64>,
}

fn cache_dir(a: &DecodersArgs) -> PathBuf {
    super::support::cache_dir("decoders", a.cache.as_deref())
}

/// Generates the clip for `s` in `dir` unless it is already there.
fn ensure_clip(dir: &Path, s: &Stream) -> anyhow::Result<PathBuf> {
    let path = dir.join(s.file());
    if !path.exists() {
        encode_clip(&path, s.size, s.fps, CLIP_SECS, &["--crf", "20"])?;
    }
    Ok(path)
}

/// Generates a clip at `path` (through `path.tmp`, renamed when complete): testsrc2 with
/// temporal noise, `secs` long, encoded by x264 with `rate` (e.g. `--crf 20` or `--bitrate
/// 200`), one access unit per frame (`--aud --bframes 0`), one IDR at the start and no
/// scene-cut I frames (an I frame costs about 1.6 times a P frame here).
pub(super) fn encode_clip(
    path: &Path,
    size: &str,
    fps: u32,
    secs: u32,
    rate: &[&str],
) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("tmp");
    let frames = secs * fps;
    let mut src = Command::new("ffmpeg")
        .args(["-loglevel", "error", "-f", "lavfi", "-i"])
        .arg(format!(
            "testsrc2=s={size}:r={fps}:d={secs},noise=alls=10:allf=t"
        ))
        .args(["-f", "rawvideo", "-pix_fmt", "yuv420p", "-"])
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| anyhow::anyhow!("running ffmpeg (scripts/setup installs it): {e}"))?;
    let yuv = src.stdout.take().expect("piped");
    let enc = Command::new("x264")
        .args(["--quiet", "--no-progress", "--demuxer", "raw"])
        .args(["--input-res", size])
        .args(["--fps", &fps.to_string(), "--frames", &frames.to_string()])
        .args(["--preset", "medium", "--bframes", "0"])
        .args(rate)
        .args([
            "--keyint",
            "infinite",
            "--no-scenecut",
            "--aud",
            "--threads",
            "2",
        ])
        .arg("-o")
        .arg(&tmp)
        .arg("-")
        .stdin(yuv)
        .status()
        .map_err(|e| anyhow::anyhow!("running x264 (scripts/setup installs it): {e}"))?;
    let fs = src.wait()?;
    anyhow::ensure!(fs.success(), "ffmpeg failed generating {}", path.display());
    anyhow::ensure!(enc.success(), "x264 failed generating {}", path.display());
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// Splits an Annex B H.264 byte stream into access units: each starts at an access unit
/// delimiter (NAL type 9, x264 `--aud`) and runs to the next one. Bytes before the first
/// delimiter belong to the first unit.
fn split_access_units(data: &[u8]) -> Vec<&[u8]> {
    // Start of every AUD start code (the 00 00 01 or 00 00 00 01 prefix).
    let mut starts = Vec::new();
    let mut i = 0;
    while i + 3 < data.len() {
        if data[i] == 0 && data[i + 1] == 0 && data[i + 2] == 1 {
            if data[i + 3] & 0x1f == 9 {
                let s = if i > 0 && data[i - 1] == 0 { i - 1 } else { i };
                starts.push(s);
            }
            i += 3;
        } else {
            i += 1;
        }
    }
    if starts.is_empty() {
        return if data.is_empty() { vec![] } else { vec![data] };
    }
    starts[0] = 0;
    let mut out = Vec::with_capacity(starts.len());
    for (k, &s) in starts.iter().enumerate() {
        let e = starts.get(k + 1).copied().unwrap_or(data.len());
        out.push(&data[s..e]);
    }
    out
}

/// Percent of latencies above `period_ns`.
fn miss_percent(lat: &[u64], period_ns: u64) -> f64 {
    if lat.is_empty() {
        return 0.0;
    }
    100.0 * lat.iter().filter(|&&l| l > period_ns).count() as f64 / lat.len() as f64
}

/// The empirical CDF of `lat` (ns) as points `(latency_ms, fraction <= it)`, at most `max`
/// points (evenly spaced ranks, always including the largest).
fn cdf_points(lat: &[u64], max: usize) -> Vec<(f64, f64)> {
    let mut s = lat.to_vec();
    s.sort_unstable();
    let n = s.len();
    if n == 0 || max == 0 {
        return vec![];
    }
    let step = n.div_ceil(max).max(1);
    let mut out: Vec<(f64, f64)> = (0..n)
        .step_by(step)
        .map(|i| (s[i] as f64 / 1e6, (i + 1) as f64 / n as f64))
        .collect();
    if out.last().is_some_and(|p| p.1 < 1.0) {
        out.push((s[n - 1] as f64 / 1e6, 1.0));
    }
    out
}

/// Median and 99th percentile of `lat` (ns), in ms.
fn p50_p99_ms(lat: &[u64]) -> (f64, f64) {
    let ms: Vec<f64> = lat.iter().map(|&l| l as f64 / 1e6).collect();
    let s = tess_bench::Summary::of(&ms);
    (s.median, s.p99)
}

// ---------------------------------------------------------------------------------------------
// The worker: calibration and the four variants.

static LIB: OnceLock<avcodec::Lib> = OnceLock::new();

pub(super) fn avcodec_lib() -> anyhow::Result<&'static avcodec::Lib> {
    if let Some(l) = LIB.get() {
        return Ok(l);
    }
    let l = avcodec::Lib::load()?;
    Ok(LIB.get_or_init(|| l))
}

/// A stream's access units, shared by every variant.
pub(super) type Units = std::sync::Arc<Vec<Vec<u8>>>;

pub(super) fn load_units(path: &Path) -> anyhow::Result<Units> {
    let data =
        std::fs::read(path).map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
    let units: Vec<Vec<u8>> = split_access_units(&data)
        .into_iter()
        .map(<[u8]>::to_vec)
        .collect();
    anyhow::ensure!(units.len() > 1, "{} has no access units", path.display());
    Ok(std::sync::Arc::new(units))
}

/// CPU time of the calling kernel thread (for a Pulse thread: its hart's, every Pulse thread
/// on that hart included).
pub(super) use tess_sched::clock::thread_cpu_ns;

/// CPU time of each frame of decoding `units` alone, in ns (two passes; the second is measured).
fn calibrate(units: &Units) -> anyhow::Result<Vec<u64>> {
    let mut d = avcodec_lib()?.decoder()?;
    for u in units.iter() {
        d.decode(u)?;
    }
    let mut d = avcodec_lib()?.decoder()?;
    let mut costs = Vec::with_capacity(units.len());
    for u in units.iter() {
        let t0 = thread_cpu_ns();
        d.decode(u)?;
        costs.push(thread_cpu_ns() - t0);
    }
    Ok(costs)
}

/// The spread of per-frame costs, ns: p50, p99 and max of the played frames (all but the
/// first, the IDR), and the first's.
fn cost_spread(costs: &[u64]) -> [f64; 4] {
    let mut v = costs[1..].to_vec();
    v.sort_unstable();
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize] as f64;
    [at(0.5), at(0.99), at(1.0), costs[0] as f64]
}

/// How a decode thread waits for its next release.
#[derive(Clone, Copy)]
enum Wait {
    Linux,
    PulseSleep,
    PulseEdf,
}

/// What one stream's thread did: its frames' latencies, and the CPU time of the kernel thread
/// it ran on and the time when it finished (for the share of the hart each scheduler got).
struct Played {
    latency: Vec<u64>,
    /// Per scored frame: the CPU time its kernel thread spent in the frame's decode. For a
    /// plain thread that is the decode's own cost; for a Pulse thread it is the hart's, which
    /// includes the other stream when it preempted this one mid-frame.
    cost: Vec<u64>,
    /// The kernel thread's CPU time when the stream started and when it finished.
    cpu_ns: (u64, u64),
    end_ns: u64,
}

/// One scheduler's run: latencies per stream, and the share of the hart it received.
struct Run {
    latency: Vec<Vec<u64>>,
    /// Per stream: the per-frame decode costs of the scored frames (`Played::cost`).
    cost: Vec<Vec<u64>>,
    received: f64,
}

/// Pre-rolls (decodes the clip's first access unit, its IDR frame, untimed, as a player does
/// before its clock starts), then decodes `warmup + frames` frames of `units` from the second
/// on, frame `k` released at `first + k * period` (under EDF too: `release_at` puts the
/// thread's jobs on that time base), and returns the latencies of the last `frames`: the first
/// `warmup` frames are played on the same schedule but not scored (caches, predictors and the
/// reservations' phases settle in them). A stream that plays past the clip's end loops to its
/// IDR frame, a cost spike that is measured like any frame.
fn play(
    mut dec: avcodec::Decoder,
    units: &Units,
    first: u64,
    period: u64,
    (warmup, frames): (usize, usize),
    wait: Wait,
) -> Played {
    let total = warmup + frames;
    let mut lat = Vec::with_capacity(total);
    let mut cost = Vec::with_capacity(total);
    let _ = dec.decode(&units[0]);
    let cpu_start = thread_cpu_ns();
    let mut release = first;
    if let Wait::PulseEdf = wait {
        release = tess_pulse::edf::release_at(first).unwrap_or(first);
    } else {
        sleep_until(wait, release);
    }
    for k in 0..total {
        if lat.len() >= total {
            break;
        }
        let cpu = thread_cpu_ns();
        if dec.decode(&units[(k + 1) % units.len()]).is_err() {
            break;
        }
        let done = clock::now_ns();
        if lat.len() >= warmup {
            cost.push(thread_cpu_ns() - cpu);
        }
        lat.push(done.saturating_sub(release));
        let mut next = release + period;
        match wait {
            // Ends the job; the next job's deadline is next + period. A thread more than a whole
            // job behind has its lost jobs skipped by EDF (`wait_next_period`): those frames
            // are never decoded and count as misses, latency = their age at the skip.
            Wait::PulseEdf => {
                let now = clock::now_ns();
                if let Some(r) = tess_pulse::edf::wait_next_period() {
                    while next < r && lat.len() < total {
                        lat.push(now.saturating_sub(next).max(period + 1));
                        next += period;
                    }
                }
            }
            w => sleep_until(w, next),
        }
        release = next;
        if lat.len() >= total {
            break;
        }
    }
    lat.drain(..warmup.min(lat.len()));
    Played {
        latency: lat,
        cost,
        cpu_ns: (cpu_start, thread_cpu_ns()),
        end_ns: clock::now_ns(),
    }
}

fn sleep_until(wait: Wait, at: u64) {
    match wait {
        Wait::Linux => clock::sleep_until_ns(at),
        Wait::PulseSleep | Wait::PulseEdf => tess_pulse::sleep_until_ns(at),
    }
}

/// The capacity thief: `SCHED_FIFO` 99 on the hart, spinning the first `(1 - capacity)` of
/// every `period` ns until `stop`.
struct Thief {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    handle: Option<std::thread::JoinHandle<anyhow::Result<()>>>,
}

impl Thief {
    /// Starts the thief: with `deadline`, a spinning `SCHED_DEADLINE` thread with runtime
    /// `(1 - capacity) * period` every `period` ns (needs the hart to be a root domain of its
    /// own); else `SCHED_FIFO` 99 spinning the first `(1 - capacity)` of every period.
    fn start(capacity: f64, period: u64, deadline: bool) -> Thief {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let busy = ((1.0 - capacity).clamp(0.0, 1.0) * period as f64) as u64;
        let handle = std::thread::spawn(move || {
            if deadline {
                let p = Duration::from_nanos(period);
                attr::set_policy(
                    0,
                    attr::Policy::Deadline {
                        runtime: Duration::from_nanos(busy),
                        deadline: p,
                        period: p,
                    },
                    0,
                )?;
                while !s.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
                return Ok(());
            }
            attr::set_policy(0, attr::Policy::Fifo { priority: 99 }, 0)?;
            let mut t = clock::now_ns().div_ceil(period) * period;
            while !s.load(Ordering::Relaxed) {
                clock::sleep_until_ns(t);
                while clock::now_ns() < t + busy {
                    std::hint::spin_loop();
                }
                t += period;
                let now = clock::now_ns();
                if t < now {
                    t = now.div_ceil(period) * period;
                }
            }
            Ok(())
        });
        Thief {
            stop,
            handle: Some(handle),
        }
    }

    fn finish(mut self) -> anyhow::Result<()> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        match self.handle.take().map(|h| h.join()) {
            Some(Ok(r)) => r,
            Some(Err(_)) => anyhow::bail!("the capacity thread panicked"),
            None => Ok(()),
        }
    }
}

impl Drop for Thief {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// A CFS bandwidth limit of its own for the CFS decode threads: a cgroup (v1 `cpu` hierarchy,
/// or v2) with quota = capacity x `period` ns per `period`; each thread moves itself in
/// (`tasks` in v1, per thread). Removed afterwards.
struct CfsLimit {
    dir: PathBuf,
    tasks: PathBuf,
}

impl CfsLimit {
    fn create(capacity: f64, period: u64) -> anyhow::Result<CfsLimit> {
        let period_us = period / 1000;
        let quota_us = (capacity * period_us as f64).round() as u64;
        let name = format!("tess-bench-decoders-{}", std::process::id());
        let v1 = Path::new("/sys/fs/cgroup/cpu/cpu.cfs_period_us").exists();
        let dir = if v1 {
            Path::new("/sys/fs/cgroup/cpu").join(&name)
        } else {
            Path::new("/sys/fs/cgroup").join(&name)
        };
        std::fs::create_dir_all(&dir)
            .map_err(|e| anyhow::anyhow!("creating {}: {e}", dir.display()))?;
        let limit = CfsLimit {
            tasks: dir.join(if v1 { "tasks" } else { "cgroup.threads" }),
            dir,
        };
        let w = |f: &str, v: String| {
            std::fs::write(limit.dir.join(f), v)
                .map_err(|e| anyhow::anyhow!("writing {f} of {}: {e}", limit.dir.display()))
        };
        if v1 {
            w("cpu.cfs_period_us", period_us.to_string())?;
            w("cpu.cfs_quota_us", quota_us.to_string())?;
        } else {
            w("cgroup.type", "threaded".into())?;
            w("cpu.max", format!("{quota_us} {period_us}"))?;
        }
        Ok(limit)
    }
}

impl Drop for CfsLimit {
    fn drop(&mut self) {
        // The threads that were in it have exited; retry briefly while the kernel reaps them.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

struct Setup {
    hart: usize,
    units: Vec<Units>,
    frames: Vec<usize>,
    cost_ns: Vec<f64>,
    capacity: f64,
    load: f64,
    /// Period of the capacity, ns.
    cap_period_ns: u64,
}

fn run_pulse(s: &Setup, edf: bool, reserve: bool) -> anyhow::Result<Run> {
    let config = tess_pulse::Config {
        cell: tess_pulse::CellMode::Standalone,
        harts: 1,
        cpus: vec![s.hart],
        ..Default::default()
    };
    let mut pulse = if edf {
        tess_pulse::Pulse::new(config, tess_pulse::Edf::default())
    } else {
        tess_pulse::Pulse::new(config, tess_pulse::Grr::default())
    }
    .map_err(|e| anyhow::anyhow!("starting Pulse: {e}"))?;
    let first = clock::now_ns() + LEAD_NS;
    let (tx, rx) = std::sync::mpsc::channel();
    // The hart's reservation, set by the first thread that runs (on the hart's kernel thread).
    let reserved = std::sync::Arc::new(std::sync::Once::new());
    let failed = std::sync::Arc::new(std::sync::Mutex::new(None::<String>));
    let runtime = (s.capacity * s.cap_period_ns as f64) as u64;
    let cap_period = s.cap_period_ns;
    for (i, st) in STREAMS.iter().enumerate() {
        let dec = avcodec_lib()?.decoder()?;
        let units = s.units[i].clone();
        let (warmup, frames) = (st.fps as usize * WARMUP_SECS, s.frames[i]);
        let period = st.period_ns();
        let tx = tx.clone();
        let (reserved, failed) = (reserved.clone(), failed.clone());
        let mut opts = tess_pulse::ThreadOptions::named(format!("video-{}", st.name));
        if edf {
            let p = Duration::from_nanos(period);
            opts = opts.timing(p, p);
        }
        let wait = if edf {
            Wait::PulseEdf
        } else {
            Wait::PulseSleep
        };
        pulse
            .spawn_with(opts, move || {
                if reserve {
                    // Ticks off: the Once's lock and the error Mutex must not be held by a
                    // preempted thread (one hart).
                    tess_pulse::without_ticks(|| {
                        reserved.call_once(|| {
                            let p = Duration::from_nanos(cap_period);
                            let pol = attr::Policy::Deadline {
                                runtime: Duration::from_nanos(runtime),
                                deadline: p,
                                period: p,
                            };
                            if let Err(e) = attr::set_policy(0, pol, 0) {
                                *failed.lock().unwrap_or_else(|e| e.into_inner()) =
                                    Some(e.to_string());
                            }
                        })
                    });
                }
                let lat = play(dec, &units, first, period, (warmup, frames), wait);
                // An mpsc send takes no lock another Pulse thread could hold while preempted
                // for long; do it with ticks off anyway.
                tess_pulse::without_ticks(|| {
                    let _ = tx.send((i, lat));
                });
            })
            .map_err(|e| anyhow::anyhow!("spawning a Pulse thread: {e}"))?;
    }
    drop(tx);
    pulse
        .run()
        .map_err(|e| anyhow::anyhow!("running Pulse: {e}"))?;
    if let Some(e) = failed.lock().unwrap_or_else(|e| e.into_inner()).take() {
        anyhow::bail!("SCHED_DEADLINE reservation for the Pulse hart: {e}");
    }
    collect_streams(rx, first, true)
}

/// Gathers the streams of a run started at `first`. `one_thread`: the streams ran on one
/// kernel thread (the Pulse hart), whose CPU time counts once; else each had its own.
fn collect_streams(
    rx: std::sync::mpsc::Receiver<(usize, Played)>,
    first: u64,
    one_thread: bool,
) -> anyhow::Result<Run> {
    let mut played: Vec<Option<Played>> = (0..STREAMS.len()).map(|_| None).collect();
    for (i, p) in rx {
        played[i] = Some(p);
    }
    let played: Vec<Played> = played
        .into_iter()
        .map(|p| p.ok_or_else(|| anyhow::anyhow!("a stream reported nothing")))
        .collect::<anyhow::Result<_>>()?;
    let end = played.iter().map(|p| p.end_ns).max().unwrap_or(first);
    let cpu = if one_thread {
        let start = played.iter().map(|p| p.cpu_ns.0).min().unwrap_or(0);
        let stop = played.iter().map(|p| p.cpu_ns.1).max().unwrap_or(0);
        stop.saturating_sub(start)
    } else {
        played
            .iter()
            .map(|p| p.cpu_ns.1.saturating_sub(p.cpu_ns.0))
            .sum()
    };
    let (latency, cost) = played.into_iter().map(|p| (p.latency, p.cost)).unzip();
    Ok(Run {
        received: cpu as f64 / end.saturating_sub(first).max(1) as f64,
        latency,
        cost,
    })
}

fn run_linux(
    s: &Setup,
    cgroup_tasks: Option<&Path>,
    deadline: bool,
    dl_pinned: bool,
) -> anyhow::Result<Run> {
    let first = clock::now_ns() + LEAD_NS;
    let (tx, rx) = std::sync::mpsc::channel();
    let mut handles = Vec::new();
    for (i, st) in STREAMS.iter().enumerate() {
        let dec = avcodec_lib()?.decoder()?;
        let units = s.units[i].clone();
        let (warmup, frames) = (st.fps as usize * WARMUP_SECS, s.frames[i]);
        let period = st.period_ns();
        let runtime = (s.cost_ns[i] / s.load) as u64;
        let tx = tx.clone();
        let tasks = cgroup_tasks.map(Path::to_path_buf);
        handles.push(std::thread::spawn(move || -> anyhow::Result<()> {
            if let Some(t) = tasks {
                // SAFETY: gettid has no preconditions.
                let tid = unsafe { libc::gettid() };
                std::fs::write(&t, tid.to_string())
                    .map_err(|e| anyhow::anyhow!("moving a thread into {}: {e}", t.display()))?;
            }
            if deadline {
                if !dl_pinned {
                    // The kernel refuses SCHED_DEADLINE below a root domain's full span.
                    let all: HartSet = (0..num_cpus()).collect();
                    tess_sched::affinity::set_affinity(0, &all)?;
                }
                let p = Duration::from_nanos(period);
                attr::set_policy(
                    0,
                    attr::Policy::Deadline {
                        runtime: Duration::from_nanos(runtime.max(100_000)),
                        deadline: p,
                        period: p,
                    },
                    0,
                )
                .map_err(|e| anyhow::anyhow!("SCHED_DEADLINE for stream {}: {e}", i))?;
            }
            let lat = play(dec, &units, first, period, (warmup, frames), Wait::Linux);
            let _ = tx.send((i, lat));
            Ok(())
        }));
    }
    drop(tx);
    for h in handles {
        h.join()
            .map_err(|_| anyhow::anyhow!("a decode thread panicked"))??;
    }
    collect_streams(rx, first, false)
}

/// The hart's steal time so far, ms (`tess_observe::kernel::hart_times`, from /proc/stat):
/// time its virtual CPU was runnable but the hypervisor ran something else.
fn steal_ms(hart: usize) -> Option<f64> {
    tess_observe::kernel::hart_times()
        .into_iter()
        .find(|t| t.hart == hart)
        .map(|t| t.steal_s * 1e3)
}

fn num_cpus() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .max(
            // SAFETY: sysconf has no preconditions.
            unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize,
        )
}

/// Runs the whole measurement in this process on `hart`: the alone calibration, then
/// `rounds` rounds, each measuring the played demand, sizing the capacity from it and giving
/// every variant a slice on it, the variants' order rotating from round to round.
fn worker(a: &DecodersArgs, hart: usize, in_cell: bool) -> anyhow::Result<Raw> {
    let dir = cache_dir(a);
    let secs = a.secs.unwrap_or(if a.common.quick { 5.0 } else { 25.0 });
    let rounds = a
        .rounds
        .unwrap_or(if a.common.quick { 1 } else { VARIANTS.len() });
    anyhow::ensure!(a.load > 0.0 && a.load < 1.0, "--load must lie in (0, 1)");
    anyhow::ensure!(rounds >= 1, "--rounds must be at least 1");
    anyhow::ensure!(secs > 0.0, "--secs must be positive");
    avcodec_lib()?;
    tess_sched::affinity::set_affinity(0, &HartSet::single(hart))
        .map_err(|e| anyhow::anyhow!("pinning to hart {hart}: {e}"))?;
    let mut units = Vec::new();
    for s in &STREAMS {
        units.push(load_units(&ensure_clip(&dir, s)?)?);
    }
    let mut raw = Raw {
        hart,
        in_cell,
        dl_pinned: in_cell,
        cap_period_ns: cap_period_ns(a)?,
        ..Default::default()
    };
    // The cost of each clip alone (for its spread and the IDR's cost), SCHED_FIFO on the hart
    // if allowed.
    let fifo = attr::set_policy(0, attr::Policy::Fifo { priority: 50 }, 0).is_ok();
    for u in &units {
        let costs = calibrate(u)?;
        raw.cost_alone_ns
            .push(costs.iter().sum::<u64>() as f64 / costs.len() as f64);
        raw.cost_spread_ns.push(cost_spread(&costs));
    }
    if fifo {
        let _ = attr::set_policy(0, attr::Policy::Other { nice: 0 }, 0);
    }
    let slice_frames: Vec<usize> = STREAMS
        .iter()
        .map(|s| ((secs / rounds as f64 * f64::from(s.fps)).round() as usize).max(1))
        .collect();
    // In the cell (the hart a root domain of its own) the Pulse hart is a SCHED_DEADLINE
    // reservation of the capacity, and the CFS threads get it as a CFS bandwidth limit of
    // their own cgroup; without a cell, a SCHED_FIFO 99 thief leaves it to Pulse and CFS alike.
    let reserve = in_cell;
    raw.latency_ns = vec![vec![Vec::new(); STREAMS.len()]; VARIANTS.len()];
    raw.steal_ms = vec![Some(0.0); VARIANTS.len()];
    for r in 0..rounds {
        let cost_ns = played_cost(hart, &units, &slice_frames)?;
        let demand = demand_of(&cost_ns);
        let mut capacity = demand / a.load;
        if capacity > 0.95 {
            raw.notes.push(format!(
                "round {}: decoding needs {:.0}% of the hart: capacity capped at 95%, load above {}",
                r + 1,
                demand * 100.0,
                a.load
            ));
            capacity = 0.95;
        }
        let setup = Setup {
            hart,
            units: units.clone(),
            frames: slice_frames.clone(),
            cost_ns: cost_ns.clone(),
            capacity,
            load: demand / capacity,
            cap_period_ns: raw.cap_period_ns,
        };
        let mut round = Round {
            cost_ns,
            demand,
            capacity,
            miss: vec![Vec::new(); VARIANTS.len()],
            received: vec![0.0; VARIANTS.len()],
        };
        for v in variant_order(r) {
            let steal_before = steal_ms(hart);
            let run = run_variant(VARIANTS[v].0, &setup, reserve, raw.dl_pinned)?;
            let stolen = steal_ms(hart).zip(steal_before).map(|(a, b)| a - b);
            raw.steal_ms[v] = raw.steal_ms[v].zip(stolen).map(|(sum, s)| sum + s);
            for (i, st) in STREAMS.iter().enumerate() {
                round.miss[v].push(miss_percent(&run.latency[i], st.period_ns()));
            }
            for (all, slice) in raw.latency_ns[v].iter_mut().zip(run.latency) {
                all.extend(slice);
            }
            round.received[v] = run.received;
        }
        raw.rounds.push(round);
    }
    // The round of the median demand (the lower middle one of an even count) gives the
    // demand, the capacity and the costs, so that they agree with each other.
    let mut by_demand: Vec<&Round> = raw.rounds.iter().collect();
    by_demand.sort_by(|a, b| a.demand.total_cmp(&b.demand));
    let mid = by_demand[(by_demand.len() - 1) / 2];
    (raw.demand, raw.capacity, raw.cost_ns) = (mid.demand, mid.capacity, mid.cost_ns.clone());
    Ok(raw)
}

/// The order of the variants' slices in round `r` (from 0), a Williams design: round 0 runs
/// 0, 1, n-1, 2, n-2, ... and each later round adds one to every variant (mod n). Over
/// `VARIANTS.len()` rounds every variant runs once in every place, right after the demand
/// measurement or long after it, and (n being even) right after every other variant exactly
/// once, so whatever a slice leaves behind on the hart (warm caches, a host slowdown it started
/// in) lands on each variant's successor alike. A plain rotation would always run the same
/// variant after a given one.
fn variant_order(r: usize) -> impl Iterator<Item = usize> {
    let n = VARIANTS.len();
    (0..n).map(move |k| {
        let first = match k {
            0 => 0,
            k if k % 2 == 1 => k.div_ceil(2),
            k => n - k / 2,
        };
        (first + r) % n
    })
}

/// Decoding demand as a fraction of one hart: frames per second times cost per frame, summed
/// over the streams.
fn demand_of(cost_ns: &[f64]) -> f64 {
    STREAMS
        .iter()
        .zip(cost_ns)
        .map(|(s, c)| c * f64::from(s.fps) / 1e9)
        .sum()
}

/// The mean decode cost per frame of each stream as played: both streams on their release
/// schedule, as plain threads on the hart with no limit, the same frames as a slice
/// (`frames` scored after the usual warm-up), each frame's cost its thread's CPU time in the
/// decode. This is what the capacity must carry. It is higher than decoding a clip
/// alone back to back (`calibrate`): between frames the threads sleep and the hart idles, so a
/// frame starts with colder caches, and the two decoders' working sets take turns in them
/// (8% to 19% higher in four runs here).
fn played_cost(hart: usize, units: &[Units], frames: &[usize]) -> anyhow::Result<Vec<f64>> {
    let setup = Setup {
        hart,
        units: units.to_vec(),
        frames: frames.to_vec(),
        cost_ns: vec![0.0; STREAMS.len()],
        capacity: 1.0,
        load: 1.0,
        cap_period_ns: CAP_PERIOD_NS,
    };
    let run = run_linux(&setup, None, false, true)?;
    run.cost
        .iter()
        .zip(&STREAMS)
        .map(|(c, s)| {
            anyhow::ensure!(!c.is_empty(), "stream {} decoded no frame", s.name);
            Ok(c.iter().sum::<u64>() as f64 / c.len() as f64)
        })
        .collect()
}

/// One variant's slice on `setup`'s capacity.
fn run_variant(name: &str, setup: &Setup, reserve: bool, dl_pinned: bool) -> anyhow::Result<Run> {
    Ok(match name {
        "dl" => run_linux(setup, None, true, dl_pinned)?,
        "edf" | "grr" if reserve => run_pulse(setup, name == "edf", true)?,
        "cfs" if reserve => {
            let limit = CfsLimit::create(setup.capacity, setup.cap_period_ns)?;
            run_linux(setup, Some(&limit.tasks), false, true)?
        }
        _ => {
            let thief = Thief::start(setup.capacity, setup.cap_period_ns, false);
            let r = match name {
                "edf" => run_pulse(setup, true, false),
                "grr" => run_pulse(setup, false, false),
                _ => run_linux(setup, None, false, dl_pinned),
            };
            thief.finish()?;
            r?
        }
    })
}

/// Runs the worker in a best-effort cell on the hart, beside the anchor cell.
fn in_cell(a: &DecodersArgs) -> anyhow::Result<Raw> {
    let mut s = Session::connect()?;
    let status = s.status()?;
    let hart = pick_hart(a.common.hart, &status)?;
    s.apply(vec![
        cell_on_hart(CELL, Policy::BestEffort { weight: 100 }, hart),
        cell_on_hart(
            ANCHOR,
            Policy::EventTriggered {
                period: Duration::from_millis(10),
                budget: Duration::from_micros(100),
            },
            hart,
        ),
    ])?;
    let mut cmd = Command::new(tess_exe());
    cmd.args(["run", "--cell", CELL, "--"])
        .arg(tess_exe())
        .args(["bench", "decoders", "--worker"])
        .arg(format!("--hart={hart}"))
        .arg(format!("--load={}", a.load))
        .arg(format!(
            "--cap-period-ms={}",
            cap_period_ns(a)? as f64 / 1e6
        ))
        .arg("--cache")
        .arg(cache_dir(a));
    if let Some(secs) = a.secs {
        cmd.arg(format!("--secs={secs}"));
    }
    if let Some(rounds) = a.rounds {
        cmd.arg(format!("--rounds={rounds}"));
    }
    if a.common.quick {
        cmd.arg("--quick");
    }
    let out = cmd.stderr(Stdio::inherit()).output();
    s.delete(&[CELL, ANCHOR]);
    let out = out?;
    anyhow::ensure!(
        out.status.success(),
        "the measurement in cell {CELL} failed ({})",
        out.status
    );
    let mut raw: Raw = serde_json::from_slice(&out.stdout)
        .map_err(|e| anyhow::anyhow!("the worker printed something unexpected: {e}"))?;
    raw.in_cell = true;
    Ok(raw)
}

/// `tess bench decoders --worker`: prints the raw results.
fn run_worker(a: &DecodersArgs) -> anyhow::Result<Report> {
    let hart = a.common.hart.unwrap_or(num_cpus() - 1);
    let raw = worker(a, hart, true)?;
    println!("{}", serde_json::to_string(&raw)?);
    std::process::exit(0);
}

/// Runs the benchmark.
pub fn run(a: &DecodersArgs) -> anyhow::Result<Report> {
    if a.worker {
        return run_worker(a);
    }
    // Clips first, outside any cell (x264 may use both harts).
    let dir = cache_dir(a);
    avcodec_lib()?;
    for s in &STREAMS {
        ensure_clip(&dir, s)?;
    }
    let mut notes = Vec::new();
    let raw = match in_cell(a) {
        Ok(r) => r,
        Err(e) => {
            notes.push(format!(
                "no cell ({e:#}): ran in-process pinned to the highest CPU; the SCHED_DEADLINE \
                 threads could not be pinned (no root domain of their own) and ran on any CPU"
            ));
            let hart = a.common.hart.unwrap_or(num_cpus() - 1);
            let mut r = worker(a, hart, false)?;
            r.dl_pinned = false;
            r
        }
    };
    if let Some(path) = &a.raw_out {
        std::fs::write(path, serde_json::to_vec(&raw)?)
            .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
    }
    let svg_path = a
        .svg
        .clone()
        .unwrap_or_else(|| dir.join("decoders-cdf.svg"));
    report(&raw, &svg_path, notes)
}

fn report(raw: &Raw, svg_path: &Path, mut notes: Vec<String>) -> anyhow::Result<Report> {
    let mut r = Report::new("decoders");
    let mut t = Table::new(
        "Two H.264 decodes on one hart, frame latency = release to decode done",
        &[
            "scheduler",
            "miss 60 fps %",
            "miss 30 fps %",
            "p50 60 ms",
            "p99 60 ms",
            "p50 30 ms",
            "p99 30 ms",
            "frames",
            "steal ms",
            "CPU received",
        ],
    );
    let mut miss = std::collections::BTreeMap::new();
    for (v, (name, what)) in VARIANTS.iter().enumerate() {
        let lat = &raw.latency_ns[v];
        let mut row = vec![what.to_string()];
        let mut ms = Vec::new();
        for (i, s) in STREAMS.iter().enumerate() {
            let m = miss_percent(&lat[i], s.period_ns());
            miss.insert((*name, s.name), m);
            r.figure(format!("{name}_miss_{}", s.name), m);
            let (p50, p99) = p50_p99_ms(&lat[i]);
            r.figure(format!("{name}_p50_{}_ms", s.name), p50);
            r.figure(format!("{name}_p99_{}_ms", s.name), p99);
            row.push(format!("{m:.1}"));
            ms.push((p50, p99));
        }
        for (p50, p99) in ms {
            row.push(format!("{p50:.2}"));
            row.push(format!("{p99:.2}"));
        }
        row.push(format!("{} + {}", lat[0].len(), lat[1].len()));
        match raw.steal_ms.get(v).copied().flatten() {
            Some(ms) => {
                r.figure(format!("{name}_steal_ms"), ms);
                row.push(format!("{ms:.0}"));
            }
            None => row.push("-".into()),
        }
        if let Some(used) = mean_over_rounds(raw, |round| round.received[v] / round.capacity) {
            r.figure(format!("{name}_used"), used);
        }
        match mean_over_rounds(raw, |round| round.received[v]) {
            Some(got) => {
                r.figure(format!("{name}_received"), got);
                row.push(format!("{:.1}%", got * 100.0));
            }
            None => row.push("-".into()),
        }
        t.row(&row);
    }
    r.table(t);
    r.table(rounds_table(raw));
    r.figure("cost_60_ms", raw.cost_ns[0] / 1e6);
    r.figure("cost_30_ms", raw.cost_ns[1] / 1e6);
    r.figure("cost_60_alone_ms", raw.cost_alone_ns[0] / 1e6);
    r.figure("cost_30_alone_ms", raw.cost_alone_ns[1] / 1e6);
    for (s, spread) in STREAMS.iter().zip(&raw.cost_spread_ns) {
        r.figure(format!("cost_{}_p50_ms", s.name), spread[0] / 1e6);
        r.figure(format!("cost_{}_p99_ms", s.name), spread[1] / 1e6);
        r.figure(format!("cost_{}_max_ms", s.name), spread[2] / 1e6);
        r.figure(format!("cost_{}_idr_ms", s.name), spread[3] / 1e6);
    }
    r.figure("demand_alone", demand_of(&raw.cost_alone_ns));
    r.figure("rounds", raw.rounds.len() as f64);
    r.figure("demand", raw.demand);
    r.figure("capacity", raw.capacity);
    r.figure("cap_period_ms", raw.cap_period_ns as f64 / 1e6);
    r.figure("load", raw.demand / raw.capacity);
    r.figure("hart", raw.hart as f64);
    let (e60, e30) = (miss[&("edf", "60")], miss[&("edf", "30")]);
    let (d60, d30) = (miss[&("dl", "60")], miss[&("dl", "30")]);
    r.target("edf_miss_60 <= 0.4", e60 <= 0.4, format!("{e60:.2}"));
    r.target("edf_miss_30 == 0", e30 == 0.0, format!("{e30:.2}"));
    r.target(
        "EDF no worse than SCHED_DEADLINE",
        e60 <= d60 && e30 <= d30,
        format!("edf {e60:.2} / {e30:.2}, dl {d60:.2} / {d30:.2}"),
    );
    r.compare(
        "EDF miss % at 60 fps",
        Some("0.4"),
        "edf_miss_60",
        Some(("dl_miss_60", "SCHED_DEADLINE per thread")),
    );
    r.compare(
        "EDF miss % at 30 fps",
        Some("0"),
        "edf_miss_30",
        Some(("dl_miss_30", "SCHED_DEADLINE per thread")),
    );
    r.compare(
        "GRR miss % at 60 fps",
        Some("36.3"),
        "grr_miss_60",
        Some(("cfs_miss_60", "CFS threads")),
    );
    r.compare(
        "GRR miss % at 30 fps",
        Some("7.3"),
        "grr_miss_30",
        Some(("cfs_miss_30", "CFS threads")),
    );
    notes.push(format!(
        "hart {}: decoding as played (both streams on their schedule, plain threads, no limit) \
         costs {:.2} ms/frame at 640x360 and {:.2} ms/frame at 750x430, demand {:.1}% of the \
         hart; capacity {:.1}% of it (load {:.2}; the round of the median demand of {}). Each \
         clip decoded alone, back to back: {:.2} and {:.2} ms/frame, demand {:.1}%",
        raw.hart,
        raw.cost_ns[0] / 1e6,
        raw.cost_ns[1] / 1e6,
        raw.demand * 100.0,
        raw.capacity * 100.0,
        raw.demand / raw.capacity,
        raw.rounds.len(),
        raw.cost_alone_ns[0] / 1e6,
        raw.cost_alone_ns[1] / 1e6,
        demand_of(&raw.cost_alone_ns) * 100.0,
    ));
    notes.push(
        "CPU received: CPU time of the decoding threads (for Pulse, of its hart's kernel thread) \
         from the first release to the last frame done, as a share of the hart; a scheduler that \
         received more than the capacity was not held to it"
            .to_string(),
    );
    notes.push(if raw.in_cell {
        format!(
            "capacity: edf/grr: the Pulse hart is one SCHED_DEADLINE reservation (capacity x \
             {p:.2} ms every {p:.2} ms); cfs: the two threads in a cgroup of their own with CFS \
             bandwidth capacity x {p:.2} ms per {p:.2} ms; dl: runtime = mean cost / load per \
             frame period for each thread (the sum is the capacity)",
            p = raw.cap_period_ns as f64 / 1e6
        )
    } else {
        format!(
            "capacity: a SCHED_FIFO 99 thread on the hart spins (1 - capacity) of every {:.2} \
             ms under edf/grr/cfs; dl: runtime = mean cost / load per frame period for each \
             thread",
            raw.cap_period_ns as f64 / 1e6
        )
    });
    notes.push(if raw.in_cell {
        "ran in a best-effort cell on the hart (plus an event-triggered anchor cell so the hart is \
         a root domain: the SCHED_DEADLINE threads are pinned there); Pulse standalone, 1 hart"
            .to_string()
    } else {
        "ran without tessd".to_string()
    });
    notes.extend(raw.notes.iter().cloned());
    match std::fs::write(svg_path, svg(raw)) {
        Ok(()) => notes.push(format!("latency CDFs (Fig. 5): {}", svg_path.display())),
        Err(e) => notes.push(format!("could not write {}: {e}", svg_path.display())),
    }
    for n in notes {
        r.note(n);
    }
    Ok(r)
}

/// The mean of `f` over the rounds, `None` without any.
fn mean_over_rounds(raw: &Raw, f: impl Fn(&Round) -> f64) -> Option<f64> {
    let n = raw.rounds.len();
    (n > 0).then(|| raw.rounds.iter().map(f).sum::<f64>() / n as f64)
}

/// Per round: the demand as played, the capacity, and each scheduler's misses.
fn rounds_table(raw: &Raw) -> Table {
    let mut cols = vec!["round".to_string(), "demand".into(), "capacity".into()];
    cols.extend(
        VARIANTS
            .iter()
            .map(|(name, _)| format!("{name} miss 60 / 30 % (used)")),
    );
    let cols: Vec<&str> = cols.iter().map(String::as_str).collect();
    let mut t = Table::new(
        "Per round: demand as played, the capacity sized from it, and each scheduler's slice \
         (the order rotates): misses, and the CPU it received as a share of the capacity (near \
         100%: the slice needed all of it, the host ran slower than when the demand was measured)",
        &cols,
    );
    for (k, round) in raw.rounds.iter().enumerate() {
        let mut row = vec![
            (k + 1).to_string(),
            format!("{:.1}%", round.demand * 100.0),
            format!("{:.1}%", round.capacity * 100.0),
        ];
        row.extend(round.miss.iter().zip(&round.received).map(|(m, got)| {
            format!(
                "{:.1} / {:.1} ({:.0}%)",
                m[0],
                m[1],
                100.0 * got / round.capacity
            )
        }));
        t.row(&row);
    }
    t
}

/// Two panels (60 fps, 30 fps): the CDF of frame latency per scheduler, the period marked.
fn svg(raw: &Raw) -> String {
    let (pw, ph, ml, mt, gap) = (420.0, 300.0, 50.0, 30.0, 70.0);
    let colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];
    let w = ml + 2.0 * pw + gap + 20.0;
    let h = mt + ph + 90.0;
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    for (i, s) in STREAMS.iter().enumerate() {
        let x0 = ml + i as f64 * (pw + gap);
        let period_ms = s.period_ns() as f64 / 1e6;
        let xmax = (period_ms * 2.0).ceil();
        let sx = |ms: f64| x0 + ms.min(xmax) / xmax * pw;
        let sy = |f: f64| mt + ph - f * ph;
        out += &format!(
            "<text x=\"{}\" y=\"18\" text-anchor=\"middle\">{} at {} fps: CDF of frame latency</text>\n",
            x0 + pw / 2.0,
            s.size,
            s.fps
        );
        out += &format!(
            "<rect x=\"{x0}\" y=\"{mt}\" width=\"{pw}\" height=\"{ph}\" fill=\"none\" stroke=\"#444\"/>\n"
        );
        for k in 0..=4 {
            let f = k as f64 / 4.0;
            out += &format!(
                "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{f:.2}</text>\n",
                x0 - 4.0,
                sy(f) + 4.0
            );
            let ms = xmax * f;
            out += &format!(
                "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{ms:.0}</text>\n",
                sx(ms),
                mt + ph + 16.0
            );
        }
        out += &format!(
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">latency (ms)</text>\n",
            x0 + pw / 2.0,
            mt + ph + 32.0
        );
        out += &format!(
            "<line x1=\"{0}\" y1=\"{mt}\" x2=\"{0}\" y2=\"{1}\" stroke=\"#888\" stroke-dasharray=\"4 3\"/>\n\
             <text x=\"{2}\" y=\"{3}\" fill=\"#888\">deadline {period_ms:.1} ms</text>\n",
            sx(period_ms),
            mt + ph,
            sx(period_ms) + 4.0,
            mt + 14.0
        );
        for (v, (_, what)) in VARIANTS.iter().enumerate() {
            let pts = cdf_points(&raw.latency_ns[v][i], 400);
            let mut d = String::new();
            let mut prev = 0.0;
            for (k, (x, f)) in pts.iter().enumerate() {
                if k == 0 {
                    d += &format!("M{:.1},{:.1}", sx(*x), sy(0.0));
                }
                d += &format!(
                    " L{:.1},{:.1} L{:.1},{:.1}",
                    sx(*x),
                    sy(prev),
                    sx(*x),
                    sy(*f)
                );
                prev = *f;
            }
            out += &format!(
                "<path d=\"{d}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\"/>\n",
                colors[v]
            );
            if i == 0 {
                let ly = mt + ph + 50.0 + (v / 2) as f64 * 16.0;
                let lx = ml + (v % 2) as f64 * 260.0;
                out += &format!(
                    "<line x1=\"{lx}\" y1=\"{0}\" x2=\"{1}\" y2=\"{0}\" stroke=\"{2}\" stroke-width=\"3\"/>\
                     <text x=\"{3}\" y=\"{4}\">{what}</text>\n",
                    ly - 4.0,
                    lx + 20.0,
                    colors[v],
                    lx + 26.0,
                    ly
                );
            }
        }
    }
    out += "</svg>\n";
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_at_access_unit_delimiters() {
        // AUD (4-byte start code), SPS, PPS, slice; AUD (3-byte), slice; AUD, slice.
        let data = [
            0, 0, 0, 1, 0x09, 0xf0, 0, 0, 0, 1, 0x67, 1, 2, 0, 0, 1, 0x68, 3, 0, 0, 1, 0x65, 4, 5,
            0, 0, 1, 0x09, 0xf0, 0, 0, 1, 0x41, 6, 0, 0, 0, 1, 0x09, 0xf0, 0, 0, 1, 0x41, 7,
        ];
        let units = split_access_units(&data);
        assert_eq!(units.len(), 3);
        assert_eq!(units[0].len(), 24);
        assert_eq!(units[1], &[0, 0, 1, 0x09, 0xf0, 0, 0, 1, 0x41, 6]);
        assert_eq!(units[2], &[0, 0, 0, 1, 0x09, 0xf0, 0, 0, 1, 0x41, 7]);
        let total: usize = units.iter().map(|u| u.len()).sum();
        assert_eq!(total, data.len());
    }

    #[test]
    fn without_delimiters_the_stream_is_one_unit() {
        assert_eq!(split_access_units(&[0, 0, 1, 0x65, 1]).len(), 1);
        assert!(split_access_units(&[]).is_empty());
    }

    #[test]
    fn leading_bytes_join_the_first_unit() {
        let data = [7, 7, 0, 0, 1, 0x09, 0x10, 0, 0, 1, 0x09, 0x10];
        let units = split_access_units(&data);
        assert_eq!(units.len(), 2);
        assert_eq!(units[0], &[7, 7, 0, 0, 1, 0x09, 0x10]);
    }

    #[test]
    fn misses_are_latencies_strictly_over_the_period() {
        let p = 16_666_666;
        assert_eq!(miss_percent(&[], p), 0.0);
        assert_eq!(miss_percent(&[p, p - 1, 1], p), 0.0);
        assert_eq!(miss_percent(&[p + 1, 1, 2, 3], p), 25.0);
    }

    #[test]
    fn demand_is_frames_per_second_times_cost() {
        // 4 ms at 60 fps and 8 ms at 30 fps: 0.24 + 0.24 of a hart.
        assert!((demand_of(&[4e6, 8e6]) - 0.48).abs() < 1e-12);
        assert_eq!(demand_of(&[0.0, 0.0]), 0.0);
    }

    #[test]
    fn every_variant_takes_every_place_and_follows_every_other_once() {
        let n = VARIANTS.len();
        for r in 0..2 * n {
            let order: Vec<usize> = variant_order(r).collect();
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "round {r}: {order:?}");
        }
        for place in 0..n {
            let mut at_place: Vec<usize> = (0..n)
                .map(|r| variant_order(r).nth(place).unwrap())
                .collect();
            at_place.sort_unstable();
            assert_eq!(at_place, (0..n).collect::<Vec<_>>(), "place {place}");
        }
        // every variant follows every other exactly once over n rounds
        let mut pairs: Vec<(usize, usize)> = (0..n)
            .flat_map(|r| {
                let order: Vec<usize> = variant_order(r).collect();
                order.windows(2).map(|w| (w[0], w[1])).collect::<Vec<_>>()
            })
            .collect();
        pairs.sort_unstable();
        let all: Vec<(usize, usize)> = (0..n)
            .flat_map(|a| (0..n).filter(move |&b| b != a).map(move |b| (a, b)))
            .collect();
        assert_eq!(pairs, all);
    }

    #[test]
    fn the_rounds_table_has_a_row_per_round_and_a_column_per_variant() {
        let round = |demand: f64| Round {
            cost_ns: vec![4e6, 8e6],
            demand,
            capacity: demand / 0.85,
            miss: vec![vec![0.0, 1.5]; VARIANTS.len()],
            received: vec![0.4; VARIANTS.len()],
        };
        let raw = Raw {
            rounds: vec![round(0.40), round(0.44)],
            ..Default::default()
        };
        let t = rounds_table(&raw);
        let text = t.render();
        // 0.4 of the hart received against capacities of 0.471 and 0.518.
        for used in ["(85%)", "(77%)"] {
            let cell = format!("0.0 / 1.5 {used}");
            assert_eq!(text.matches(&cell).count(), VARIANTS.len(), "{text}");
        }
        assert!(text.contains("44.0%") && text.contains("51.8%"), "{text}");
        for (name, _) in VARIANTS {
            assert!(
                text.contains(&format!("{name} miss 60 / 30 % (used)")),
                "{text}"
            );
        }
    }

    #[test]
    fn cdf_is_monotone_and_ends_at_one() {
        let lat: Vec<u64> = (0..1000u64).rev().map(|x| x * 1000).collect();
        let pts = cdf_points(&lat, 100);
        assert!(pts.len() <= 101);
        assert_eq!(pts.last().unwrap().1, 1.0);
        assert!((pts.last().unwrap().0 - 0.999).abs() < 1e-9);
        for w in pts.windows(2) {
            assert!(w[0].0 <= w[1].0 && w[0].1 < w[1].1);
        }
        assert!(cdf_points(&[], 10).is_empty());
        assert_eq!(cdf_points(&[5_000_000], 10), vec![(5.0, 1.0)]);
    }
}
