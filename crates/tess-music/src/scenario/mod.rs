//! Scenarios of the isolation experiment (seed 000, section 4.1; issue 5): the synthesizer and
//! the emulator as child processes with given placements, optionally with interference, and the
//! per-package statistics from both ends.
//!
//! # Scenarios
//! ```text
//! A  synth in its tess cell, alone                       (lead: tess cells via a Launcher)
//! B  A + video cells (time- and event-triggered) + EP     (lead: tess cells via a Launcher)
//! C  synth on plain Linux: CFS, unpinned, + interference  baseline_c()
//! D  synth SCHED_FIFO 99 pinned to hart 1 + interference  baseline_d()
//! ```
//! Each scenario reports the device-side response time `tf - t0` (the figures: misses include
//! lost answers) and the host-side `t2 - t1` of the paper (see `emulator` and `host`).
//!
//! # The run
//! ```text
//! 1. interference starts (videos, EP), settles 0.5 s
//! 2. tess-migrator starts, --ready-file tells when it listens
//! 3. tess-slabs plays warm-up + duration, then exits with its JSON report
//! 4. tess-migrator gets SIGINT and prints its JSON report; interference gets SIGTERM
//! ```
//! Processes are started through a [`Launcher`]; [`PlainLauncher`] starts them as they are.
//! Scenarios A and B need a launcher that starts each [`Role`] inside its cell.
//!
//! # Hart layout on a 2-hart machine (defaults of C and D)
//! The emulator is pinned to hart 0 at SCHED_FIFO 98 and paced `hybrid:20` (sleep until 20 us
//! before each packet, then spin), so it is precise yet leaves most of hart 0 to others: a
//! FIFO thread spinning 100 % of hart 0 would be throttled by the kernel's fair server
//! (50 ms of every second go to waiting normal tasks) and stall the device. Interference floats
//! over both harts.
//!
//! # Glossary
//! - **role**: what a process is for (synth, emulator, video, best-effort EP); a **launcher**
//!   starts a role's command, plainly or in the role's cell.
//! - **placement**: pinning, scheduling policy and wait mode given on the command line.
//! - **device side** / **host side**: `tf - t0` measured by the emulator / `t2 - t1` measured by
//!   the synthesizer.
//!
//! # Worked example
//! `baseline_d(Duration::from_secs(30))` runs `tess-migrator --harts 1 --fifo 99 --wait block`
//! against `tess-slabs --hart 0 --fifo 98 --pace hybrid:20 --duration 30 --warmup 1`, with two
//! `ffmpeg -re` players and two `tess-ep` processes, and yields about 41,300 measured packages.

pub mod interference;
pub mod launch;

use crate::emulator::{EmulatorReport, Pace};
use crate::host::HostReport;
use crate::net::Wait;
use crate::netns::NetnsPair;
use crate::slabs;
use launch::{CommandSpec, Guard};
pub use launch::{Launcher, PlainLauncher, Role};
use serde::{Deserialize, Serialize};
use std::ffi::OsString;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tess_bench::histogram::{self, HistogramOptions};
use tess_bench::{Report, Summary, Table};

/// Where and how the synthesizer runs.
#[derive(Debug, Clone, Serialize)]
pub struct SynthPlacement {
    /// `--harts`: communication hart first, then workers; `None`: unpinned.
    pub harts: Option<Vec<usize>>,
    /// `--fifo PRIO`.
    pub fifo: Option<u32>,
    /// `--wait`: `spin` (busy-poll) or `block`.
    #[serde(serialize_with = "ser_wait")]
    pub wait: Wait,
    /// `--oscillators` per voice.
    pub oscillators: usize,
}

fn ser_wait<S: serde::Serializer>(w: &Wait, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(match w {
        Wait::Poll => "spin",
        Wait::Block => "block",
    })
}

/// Where and how the emulator runs.
#[derive(Debug, Clone, Serialize)]
pub struct EmulatorPlacement {
    /// `--hart`.
    pub hart: Option<usize>,
    /// `--fifo PRIO`.
    pub fifo: Option<u32>,
    /// `--pace`.
    #[serde(serialize_with = "ser_display")]
    pub pace: Pace,
    /// `--response`.
    pub response: crate::emulator::Response,
}

fn ser_display<T: std::fmt::Display, S: serde::Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&v.to_string())
}

/// The interfering programs.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Interference {
    /// Video players (`ffmpeg -re` at 30 frames/s).
    pub videos: usize,
    /// Best-effort EP processes.
    pub ep_processes: usize,
    /// Threads per EP process.
    pub ep_threads: usize,
}

impl Interference {
    /// No interference (scenario A).
    pub const NONE: Interference = Interference {
        videos: 0,
        ep_processes: 0,
        ep_threads: 0,
    };

    /// Group 2 of the paper scaled to 2 harts: two video players (the time- and the
    /// event-triggered cell) and two single-threaded EP processes.
    pub const GROUP2: Interference = Interference {
        videos: 2,
        ep_processes: 2,
        ep_threads: 1,
    };

    /// Whether anything interferes.
    pub fn any(&self) -> bool {
        self.videos > 0 || self.ep_processes > 0
    }
}

/// One scenario.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioSpec {
    /// Short name (`C`), used in figure names.
    pub name: String,
    /// One-line description.
    pub title: String,
    /// Synthesizer placement.
    pub synth: SynthPlacement,
    /// Emulator placement.
    pub emulator: EmulatorPlacement,
    /// Interference.
    pub interference: Interference,
    /// Measured time.
    pub duration: Duration,
    /// Warm-up (answered, not measured).
    pub warmup: Duration,
    /// Gesture file; `None`: the emulator's built-in default (24 pads).
    pub gesture: Option<PathBuf>,
    /// Run the emulator in this network namespace across a veth pair (falls back to loopback
    /// with a note when it cannot be created); `None`: loopback.
    pub netns: Option<String>,
    /// Record the synthesizer's 8 output channels to this WAV file (`--record`).
    pub record: Option<PathBuf>,
    /// With a veth pair: process the packets the synthesizer receives on these harts (RPS,
    /// [`NetnsPair::steer_receive`]); `None`: where the kernel does by default (the sender's).
    pub steer_receive: Option<tess_sched::HartSet>,
}

/// Baseline C: the synthesizer on plain Linux (CFS, unpinned, blocking receive) with the
/// interference of Group 2.
pub fn baseline_c(duration: Duration) -> ScenarioSpec {
    ScenarioSpec {
        name: "C".into(),
        title: "plain Linux: synthesizer CFS, unpinned, with interference".into(),
        synth: SynthPlacement {
            harts: None,
            fifo: None,
            wait: Wait::Block,
            oscillators: 100,
        },
        emulator: default_emulator(),
        interference: Interference::GROUP2,
        duration,
        warmup: Duration::from_secs(1),
        gesture: None,
        netns: None,
        record: None,
        steer_receive: None,
    }
}

/// Baseline D: the synthesizer as SCHED_FIFO 99 pinned to hart 1 (blocking receive, so it
/// sleeps between packets as a careful Linux user's program does), with the interference of
/// Group 2.
pub fn baseline_d(duration: Duration) -> ScenarioSpec {
    ScenarioSpec {
        name: "D".into(),
        title: "plain Linux: synthesizer SCHED_FIFO 99 pinned to hart 1, with interference".into(),
        synth: SynthPlacement {
            harts: Some(vec![1]),
            fifo: Some(99),
            wait: Wait::Block,
            oscillators: 100,
        },
        emulator: default_emulator(),
        interference: Interference::GROUP2,
        duration,
        warmup: Duration::from_secs(1),
        gesture: None,
        netns: None,
        record: None,
        steer_receive: None,
    }
}

/// The emulator placement of the baselines: hart 0, SCHED_FIFO 98, `hybrid:20` pacing.
pub fn default_emulator() -> EmulatorPlacement {
    EmulatorPlacement {
        hart: Some(0),
        fifo: Some(98),
        pace: Pace::Hybrid {
            margin: Duration::from_micros(20),
        },
        response: crate::emulator::Response::Actual,
    }
}

/// Where the runner finds programs and puts files.
#[derive(Debug, Clone)]
pub struct RunEnv {
    /// Directory holding `tess-migrator`, `tess-slabs` and `tess-ep`.
    pub bin_dir: PathBuf,
    /// Cache for the video clip.
    pub cache_dir: PathBuf,
    /// Per-scenario outputs (reports, samples, logs) go to `work_dir/scenario-NAME/`.
    pub work_dir: PathBuf,
}

impl RunEnv {
    /// Binaries next to the running executable (as `cargo build` lays them out), the default
    /// cache, and `work_dir`.
    pub fn beside_current_exe(work_dir: &Path) -> std::io::Result<RunEnv> {
        let exe = std::env::current_exe()?;
        let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
        // Test executables live in target/<profile>/deps, examples in .../examples.
        if (dir.ends_with("deps") || dir.ends_with("examples"))
            && !dir.join("tess-migrator").exists()
        {
            dir.pop();
        }
        Ok(RunEnv {
            bin_dir: dir,
            cache_dir: interference::default_cache_dir(),
            work_dir: work_dir.to_path_buf(),
        })
    }
}

/// Error running a scenario.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// A process could not be started.
    #[error("scenario {scenario}: cannot start {role} ({command}): {source}")]
    Spawn {
        /// Scenario name.
        scenario: String,
        /// Its role.
        role: Role,
        /// Command line.
        command: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A process failed or did not report.
    #[error("scenario {scenario}: {role} {what}; its stderr is in {log}")]
    Process {
        /// Scenario name.
        scenario: String,
        /// Its role.
        role: Role,
        /// What went wrong.
        what: String,
        /// Its stderr file.
        log: PathBuf,
    },
    /// Preparing the interference failed.
    #[error("scenario {scenario}: {source}")]
    Interference {
        /// Scenario name.
        scenario: String,
        /// Cause.
        #[source]
        source: interference::InterferenceError,
    },
    /// Files could not be written or read.
    #[error("scenario {scenario}: {path}: {source}")]
    Io {
        /// Scenario name.
        scenario: String,
        /// The file or directory.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// The outcome of one scenario.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioResult {
    /// The scenario.
    pub spec: ScenarioSpec,
    /// Hart layout and link, in words.
    pub layout: String,
    /// The emulator's report (device side, `tf - t0`).
    pub device: EmulatorReport,
    /// The synthesizer's report (host side, `t2 - t1`).
    pub host: HostReport,
    /// Device-side response times, microseconds.
    #[serde(skip)]
    pub device_us: Vec<f64>,
    /// Host-side response times, microseconds.
    #[serde(skip)]
    pub host_us: Vec<f64>,
    /// Caveats (fallbacks, odd counters).
    pub notes: Vec<String>,
}

impl ScenarioResult {
    /// Device-side summary (the figures).
    pub fn summary(&self) -> Summary {
        self.device.response_us
    }

    /// Missed deadlines seen by the device (late + lost).
    pub fn misses(&self) -> u64 {
        self.device.misses
    }
}

fn os(s: impl Into<OsString>) -> OsString {
    s.into()
}

fn free_udp_port(ip: IpAddr) -> u16 {
    std::net::UdpSocket::bind((ip, 0))
        .and_then(|s| s.local_addr())
        .map(|a| a.port())
        .unwrap_or(9701)
}

/// Runs one scenario: starts interference, synthesizer and emulator through `launcher`, waits
/// for the emulator to finish, stops everything and collects both reports.
pub fn run_scenario(
    spec: &ScenarioSpec,
    env: &RunEnv,
    launcher: &dyn Launcher,
) -> Result<ScenarioResult, ScenarioError> {
    let name = spec.name.clone();
    let dir = env.work_dir.join(format!("scenario-{}", spec.name));
    let io_err = |path: &Path| {
        let (scenario, path) = (name.clone(), path.to_path_buf());
        move |source| ScenarioError::Io {
            scenario,
            path,
            source,
        }
    };
    std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
    let mut notes = Vec::new();

    // The link: veth pair in a namespace, or loopback.
    let pair = match &spec.netns {
        Some(ns) => match NetnsPair::create(ns, crate::netns::DEFAULT_PREFIX) {
            Ok(p) => Some(p),
            Err(e) => {
                notes.push(format!("no veth pair ({e}); using loopback"));
                None
            }
        },
        None => None,
    };
    if let (Some(p), Some(harts)) = (&pair, &spec.steer_receive) {
        match p.steer_receive(harts) {
            Ok(n) => notes.push(format!(
                "receive processing of {} ({n} queue(s)) steered to harts {harts} (RPS)",
                p.host_if
            )),
            Err(e) => notes.push(format!(
                "cannot steer receive processing of {} to harts {harts}: {e}",
                p.host_if
            )),
        }
    }
    let host_ip = pair
        .as_ref()
        .map_or(IpAddr::V4(Ipv4Addr::LOCALHOST), |p| IpAddr::V4(p.host_addr));
    let addr = SocketAddr::new(host_ip, free_udp_port(host_ip));

    let spawn = |role: Role, cmd: CommandSpec| -> Result<Guard, ScenarioError> {
        launcher
            .spawn(&role, &cmd)
            .map(|c| Guard::new(role.clone(), c))
            .map_err(|source| ScenarioError::Spawn {
                scenario: name.clone(),
                role,
                command: cmd.display(),
                source,
            })
    };

    // 1. Interference.
    let mut background: Vec<Guard> = Vec::new();
    if spec.interference.videos > 0 {
        let clip = interference::ensure_clip(&env.cache_dir).map_err(|source| {
            ScenarioError::Interference {
                scenario: name.clone(),
                source,
            }
        })?;
        for index in 0..spec.interference.videos {
            background.push(spawn(
                Role::Video { index },
                interference::video_player(&clip),
            )?);
        }
    }
    for index in 0..spec.interference.ep_processes {
        background.push(spawn(
            Role::BestEffort { index },
            interference::ep_process(&env.bin_dir, spec.interference.ep_threads.max(1)),
        )?);
    }
    if spec.interference.any() {
        std::thread::sleep(Duration::from_millis(500));
    }

    // 2. Synthesizer.
    let ready = dir.join("synth.ready");
    let _ = std::fs::remove_file(&ready);
    let synth_out = dir.join("synth.json");
    let synth_err = dir.join("synth.log");
    let host_samples = dir.join("host-us.txt");
    let mut args = vec![
        os("--bind"),
        os(addr.to_string()),
        os("--json"),
        os("--warmup"),
        os(format!("{}", spec.warmup.as_secs_f64())),
        os("--stats-file"),
        host_samples.clone().into(),
        os("--ready-file"),
        ready.clone().into(),
        os("--wait"),
        os(match spec.synth.wait {
            Wait::Poll => "spin",
            Wait::Block => "block",
        }),
        os("--oscillators"),
        os(spec.synth.oscillators.to_string()),
    ];
    if let Some(h) = &spec.synth.harts {
        let list: Vec<String> = h.iter().map(usize::to_string).collect();
        args.extend([os("--harts"), os(list.join(","))]);
    }
    if let Some(p) = spec.synth.fifo {
        args.extend([os("--fifo"), os(p.to_string())]);
    }
    if let Some(w) = &spec.record {
        args.extend([os("--record"), w.clone().into()]);
    }
    let mut synth = spawn(
        Role::Synth,
        CommandSpec {
            program: env.bin_dir.join("tess-migrator"),
            args,
            stdout: Some(synth_out.clone()),
            stderr: Some(synth_err.clone()),
        },
    )?;
    let t0 = Instant::now();
    while !ready.exists() {
        if synth.exited().is_some() || t0.elapsed() > Duration::from_secs(20) {
            return Err(ScenarioError::Process {
                scenario: name,
                role: Role::Synth,
                what: "did not start listening".into(),
                log: synth_err,
            });
        }
        std::thread::sleep(Duration::from_millis(10));
    }

    // 3. Emulator.
    let dev_out = dir.join("emulator.json");
    let dev_err = dir.join("emulator.log");
    let dev_samples = dir.join("device-us.txt");
    let mut args = vec![
        os("--to"),
        os(addr.to_string()),
        os("--json"),
        os("--duration"),
        os(format!("{}", spec.duration.as_secs_f64())),
        os("--warmup"),
        os(format!("{}", spec.warmup.as_secs_f64())),
        os("--samples-file"),
        dev_samples.clone().into(),
        os("--pace"),
        os(spec.emulator.pace.to_string()),
        os("--response"),
        os(match spec.emulator.response {
            crate::emulator::Response::Actual => "actual",
            crate::emulator::Response::Ideal => "ideal",
        }),
    ];
    if let Some(h) = spec.emulator.hart {
        args.extend([os("--hart"), os(h.to_string())]);
    }
    if let Some(p) = spec.emulator.fifo {
        args.extend([os("--fifo"), os(p.to_string())]);
    }
    if let Some(p) = &pair {
        args.extend([os("--netns"), os(&p.name)]);
    }
    if let Some(g) = &spec.gesture {
        args.extend([os("--gesture"), g.clone().into()]);
    }
    let mut device = spawn(
        Role::Emulator,
        CommandSpec {
            program: env.bin_dir.join("tess-slabs"),
            args,
            stdout: Some(dev_out.clone()),
            stderr: Some(dev_err.clone()),
        },
    )?;
    let limit = spec.duration + spec.warmup + Duration::from_secs(30);
    let dev_status = device.wait_timeout(limit);

    // 4. Stop the synthesizer (it prints its report), then the interference.
    synth.signal(libc::SIGINT);
    let synth_status = synth.wait_timeout(Duration::from_secs(10));
    for mut g in background.drain(..) {
        if g.exited().is_some() {
            notes.push(format!("{} exited before the end of the run", g.role));
        }
        g.stop(Duration::from_secs(1));
    }
    drop(pair);

    let fail = |role: Role, what: String, log: PathBuf| ScenarioError::Process {
        scenario: spec.name.clone(),
        role,
        what,
        log,
    };
    if !dev_status.is_some_and(|s| s.success()) {
        return Err(fail(
            Role::Emulator,
            format!("ended with {dev_status:?}"),
            dev_err,
        ));
    }
    if !synth_status.is_some_and(|s| s.success()) {
        return Err(fail(
            Role::Synth,
            format!("ended with {synth_status:?}"),
            synth_err,
        ));
    }
    let read = |p: &Path| std::fs::read_to_string(p).map_err(io_err(p));
    let report_of =
        |path: &Path, role: Role, log: &Path| -> Result<serde_json::Value, ScenarioError> {
            serde_json::from_str(&read(path)?)
                .map_err(|e| fail(role, format!("printed no report ({e})"), log.to_path_buf()))
        };
    let dev_json = report_of(&dev_out, Role::Emulator, &dev_err)?;
    let host_json = report_of(&synth_out, Role::Synth, &synth_err)?;
    let mut device_report = EmulatorReport::deserialize(&dev_json).map_err(|e| {
        fail(
            Role::Emulator,
            format!("printed a bad report ({e})"),
            dev_err.clone(),
        )
    })?;
    let mut host_report = HostReport::deserialize(&host_json).map_err(|e| {
        fail(
            Role::Synth,
            format!("printed a bad report ({e})"),
            synth_err.clone(),
        )
    })?;
    let device_us = parse_samples(&read(&dev_samples)?);
    let host_us = parse_samples(&read(&host_samples)?);
    // Response-time summaries are recomputed from the raw samples; the others are read back.
    device_report.response_us = Summary::of(&device_us);
    device_report.send_lateness_us = summary_in(&dev_json, "send_lateness_us");
    device_report.host_compute_us = summary_in(&dev_json, "host_compute_us");
    device_report.after_last_packet_us = summary_in(&dev_json, "after_last_packet_us");
    host_report.response_us = Summary::of(&host_us);
    host_report.compute_us = summary_in(&host_json, "compute_us");
    if device_report.lost > 0 {
        notes.push(format!(
            "{} packages were never answered (counted as missed)",
            device_report.lost
        ));
    }
    let link = pair_description(spec);
    let layout = format!(
        "synth {} {} wait {}; emulator {} {} pace {}; interference {} video + {} EP x {} threads (floating); {link}",
        spec.synth
            .harts
            .as_ref()
            .map_or("unpinned".to_string(), |h| format!("on harts {h:?}")),
        spec.synth
            .fifo
            .map_or("CFS".to_string(), |p| format!("SCHED_FIFO {p}")),
        match spec.synth.wait {
            Wait::Poll => "spin",
            Wait::Block => "block",
        },
        spec.emulator
            .hart
            .map_or("unpinned".to_string(), |h| format!("on hart {h}")),
        spec.emulator
            .fifo
            .map_or("CFS".to_string(), |p| format!("SCHED_FIFO {p}")),
        spec.emulator.pace,
        spec.interference.videos,
        spec.interference.ep_processes,
        spec.interference.ep_threads.max(1),
    );
    Ok(ScenarioResult {
        spec: spec.clone(),
        layout,
        device: device_report,
        host: host_report,
        device_us,
        host_us,
        notes,
    })
}

fn pair_description(spec: &ScenarioSpec) -> String {
    match &spec.netns {
        Some(ns) => format!("emulator in netns {ns} over a veth pair (unless noted)"),
        None => "loopback".into(),
    }
}

/// The `Summary` printed under `key` of a report (zeros where absent).
fn summary_in(report: &serde_json::Value, key: &str) -> Summary {
    let s = &report[key];
    let f = |k: &str| s[k].as_f64().unwrap_or(0.0);
    Summary {
        count: s["count"].as_u64().unwrap_or(0) as usize,
        mean: f("mean"),
        stdev: f("stdev"),
        min: f("min"),
        median: f("median"),
        p99: f("p99"),
        p999: f("p999"),
        max: f("max"),
    }
}

fn parse_samples(text: &str) -> Vec<f64> {
    text.lines().filter_map(|l| l.trim().parse().ok()).collect()
}

/// Runs baselines C and D in turn with [`PlainLauncher`].
pub fn run_baselines(
    duration: Duration,
    env: &RunEnv,
) -> Result<Vec<ScenarioResult>, ScenarioError> {
    [baseline_c(duration), baseline_d(duration)]
        .iter()
        .map(|s| run_scenario(s, env, &PlainLauncher))
        .collect()
}

/// The histogram of a scenario's device-side response times, like Fig. 7, with the deadline.
pub fn histogram_svg(result: &ScenarioResult) -> String {
    let deadline_us = slabs::DEADLINE_NS as f64 / 1000.0;
    let opts = HistogramOptions {
        title: format!(
            "{}: {} ({} missed deadlines)",
            result.spec.name,
            result.spec.title,
            result.misses()
        ),
        x_label: "response time tf - t0 (us)".into(),
        marker: Some((deadline_us, "deadline 1405.9 us".into())),
        ..HistogramOptions::default()
    };
    histogram::svg(&result.device_us, &opts)
}

/// Writes [`histogram_svg`] to `dir/music-NAME.svg` and returns the path.
pub fn write_histogram(result: &ScenarioResult, dir: &Path) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!("music-{}.svg", result.spec.name));
    std::fs::write(&path, histogram_svg(result))?;
    Ok(path)
}

/// The side-by-side table of scenarios (device side, plus the host's `t2 - t1` mean and max).
pub fn results_table(results: &[ScenarioResult]) -> Table {
    let mut t = Table::new(
        "response time tf - t0 per package (us); misses = late (> 1405.9 us) + lost; \
         t2-t1 = host side; after last = tf - send of packet 15; device late = worst emulator \
         pacing lateness",
        &[
            "scenario",
            "packages",
            "misses",
            "mean",
            "stdev",
            "p99",
            "p99.9",
            "max",
            "t2-t1 mean",
            "t2-t1 max",
            "after last max",
            "device late max",
        ],
    );
    for r in results {
        let s = r.summary();
        let h = r.host.response_us;
        t.row(&[
            format!("{}: {}", r.spec.name, r.spec.title),
            r.device.packages.to_string(),
            r.misses().to_string(),
            format!("{:.1}", s.mean),
            format!("{:.1}", s.stdev),
            format!("{:.1}", s.p99),
            format!("{:.1}", s.p999),
            format!("{:.1}", s.max),
            format!("{:.1}", h.mean),
            format!("{:.1}", h.max),
            format!("{:.1}", r.device.after_last_packet_us.max),
            format!("{:.1}", r.device.send_lateness_us.max),
        ]);
    }
    t
}

/// Adds the issue's figures for a scenario: `S_packages`, `S_misses`, `S_mean_us`, `S_p999_us`,
/// `S_max_us` (device side), plus `S_host_mean_us`, `S_host_max_us`, `S_host_misses` (the
/// synthesizer's `t2 - t1`), `S_after_last_max_us` (the response after the device's last packet,
/// free of the emulator's own pacing delays) and `S_device_late_max_us` (the emulator's worst
/// pacing lateness: large values mean the device, not the host, caused misses).
pub fn add_figures(report: &mut Report, result: &ScenarioResult) {
    let n = &result.spec.name;
    let s = result.summary();
    report
        .figure(format!("{n}_packages"), result.device.packages as f64)
        .figure(format!("{n}_misses"), result.misses() as f64)
        .figure(format!("{n}_mean_us"), s.mean)
        .figure(format!("{n}_p999_us"), s.p999)
        .figure(format!("{n}_max_us"), s.max)
        .figure(format!("{n}_host_mean_us"), result.host.response_us.mean)
        .figure(format!("{n}_host_max_us"), result.host.response_us.max)
        .figure(format!("{n}_host_misses"), result.host.misses as f64)
        .figure(
            format!("{n}_after_last_max_us"),
            result.device.after_last_packet_us.max,
        )
        .figure(
            format!("{n}_device_late_max_us"),
            result.device.send_lateness_us.max,
        );
    report.note(format!("{n}: {}", result.layout));
    for note in &result.notes {
        report.note(format!("{n}: {note}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn baselines_match_the_issue() {
        let c = baseline_c(Duration::from_secs(30));
        assert_eq!(c.synth.harts, None);
        assert_eq!(c.synth.fifo, None);
        assert!(c.interference.any());
        let d = baseline_d(Duration::from_secs(30));
        assert_eq!(d.synth.harts, Some(vec![1]));
        assert_eq!(d.synth.fifo, Some(99));
        assert_eq!(d.interference.videos, 2);
    }

    #[test]
    fn video_player_command_paces_at_native_rate() {
        let cmd = interference::video_player(Path::new("/tmp/clip.mp4"));
        let line = cmd.display();
        assert!(line.starts_with("ffmpeg "), "{line}");
        assert!(line.contains(" -re ") && line.contains("-stream_loop -1"));
        assert!(line.ends_with("-i /tmp/clip.mp4 -f null -"), "{line}");
    }

    #[test]
    fn summaries_are_read_back_from_reports() {
        let s = Summary::of(&[1.0, 2.0, 3.0]);
        let v = serde_json::json!({ "x": s });
        assert_eq!(summary_in(&v, "x"), s);
        assert_eq!(summary_in(&v, "missing").count, 0);
    }

    #[test]
    fn samples_parse_skipping_junk() {
        assert_eq!(parse_samples("1.5\n\nx\n2\n"), vec![1.5, 2.0]);
    }
}
