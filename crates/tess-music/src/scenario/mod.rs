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
    /// Keep the synthesizer's first hart from idling with a `SCHED_IDLE` spinner
    /// (`tess-idle-spin`): the plain-Linux equivalent of a dedicated cell's idle spinner.
    pub idle_spinner: bool,
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
    /// Processes of the rogue swarm (`tess-rogue`, scenario E); 0: none.
    pub rogue: u32,
}

impl Interference {
    /// No interference (scenario A).
    pub const NONE: Interference = Interference {
        videos: 0,
        ep_processes: 0,
        ep_threads: 0,
        rogue: 0,
    };

    /// Group 2 of the paper scaled to 2 harts: two video players (the time- and the
    /// event-triggered cell) and two single-threaded EP processes.
    pub const GROUP2: Interference = Interference {
        videos: 2,
        ep_processes: 2,
        ep_threads: 1,
        rogue: 0,
    };

    /// Group 2 plus the rogue neighbour (scenario E): `swarm` processes that raise themselves
    /// to `SCHED_FIFO` 99 and spin.
    pub const fn group2_with_rogue(swarm: u32) -> Interference {
        Interference {
            rogue: swarm,
            ..Interference::GROUP2
        }
    }

    /// Whether anything interferes.
    pub fn any(&self) -> bool {
        self.videos > 0 || self.ep_processes > 0 || self.rogue > 0
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
    /// Measure the CPU time of tessd's idle spinner on this hart while the emulator plays (a
    /// spinning cell's: `tessd __spin-idle HART`), reported as the scenario's spinner CPU.
    pub cell_spinner: Option<usize>,
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
            idle_spinner: false,
        },
        emulator: default_emulator(),
        interference: Interference::GROUP2,
        duration,
        warmup: Duration::from_secs(1),
        gesture: None,
        netns: None,
        record: None,
        steer_receive: None,
        cell_spinner: None,
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
            idle_spinner: true,
        },
        emulator: default_emulator(),
        interference: Interference::GROUP2,
        duration,
        warmup: Duration::from_secs(1),
        gesture: None,
        netns: None,
        record: None,
        steer_receive: None,
        cell_spinner: None,
    }
}

/// Baseline D with the rogue neighbour of scenario E: what a `SCHED_FIFO` 99 swarm does to
/// the careful plain-Linux setup.
pub fn baseline_e_linux(duration: Duration, swarm: u32) -> ScenarioSpec {
    ScenarioSpec {
        name: "E_linux".into(),
        title: "plain Linux: as D, plus a rogue SCHED_FIFO 99 swarm".into(),
        interference: Interference::group2_with_rogue(swarm),
        ..baseline_d(duration)
    }
}

/// The test equipment of every scenario: the emulator on hart 0 at SCHED_FIFO 98, the cable
/// pacing its packets (`Pace::Link`: a token-bucket queue in the wire's namespace releases one
/// every 45.35 us from its own timer, as a device's hardware would; with `steer_receive` the
/// wire runs on the synthesizer's harts, where an adapter's interrupt would be steered).
pub fn default_emulator() -> EmulatorPlacement {
    EmulatorPlacement {
        hart: Some(0),
        fifo: Some(98),
        pace: Pace::Link {
            lead: crate::emulator::DEFAULT_LINK_LEAD,
        },
        response: crate::emulator::Response::Actual,
    }
}

/// What the emulator falls back to where the link cannot pace (loopback, no `tbf`): sleep until
/// 20 us before each packet and spin the rest, on its own clock.
pub const SELF_PACED: Pace = Pace::Hybrid {
    margin: Duration::from_micros(20),
};

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
    /// What each hart did while the emulator played (from `/proc/stat`).
    pub harts: Vec<HartLoad>,
    /// CPU time the baseline's idle spinner burned, as a fraction of its hart.
    pub spinner_cpu_fraction: Option<f64>,
    /// Caveats (fallbacks, odd counters).
    pub notes: Vec<String>,
}

pub use tess_bench::cpu::HartLoad;

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
        Some(ns) => match NetnsPair::create_on_free_prefix(ns) {
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
            Ok(_) => notes.push(format!(
                "the wire ({}: forwarding, the cable's queue and timer) runs on harts {harts} (RPS), as an adapter's interrupt steered there would",
                p.wire
            )),
            Err(e) => notes.push(format!(
                "cannot run the wire ({}) on harts {harts}: {e}",
                p.wire
            )),
        }
    }
    // The equipment: the cable paces where it can.
    let pace = match (spec.emulator.pace, &pair) {
        (Pace::Link { .. }, Some(p)) => {
            let (rate, burst) = crate::emulator::link_rate();
            match p.pace_device(rate, burst) {
                Ok(()) => spec.emulator.pace,
                Err(e) => {
                    notes.push(format!(
                        "the link cannot pace ({e}): the emulator paces itself ({SELF_PACED})"
                    ));
                    SELF_PACED
                }
            }
        }
        (Pace::Link { .. }, None) => {
            notes.push(format!(
                "no veth pair to pace: the emulator paces itself ({SELF_PACED})"
            ));
            SELF_PACED
        }
        (other, _) => other,
    };
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
    // The baselines' idle spinner, on the synthesizer's first hart.
    let spinner_out = dir.join("spinner.json");
    let mut spinner = match (&spec.synth.harts, spec.synth.idle_spinner) {
        (Some(h), true) if !h.is_empty() => Some(spawn(
            Role::Spinner,
            CommandSpec {
                program: env.bin_dir.join("tess-idle-spin"),
                args: vec![os("--hart"), os(h[0].to_string()), os("--json")],
                stdout: Some(spinner_out.clone()),
                stderr: Some(dir.join("spinner.log")),
            },
        )?),
        _ => None,
    };

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

    // The rogue swarm starts once the synthesizer listens: started before, it would starve the
    // synthesizer's start-up itself on plain Linux (a CFS process until it makes itself
    // SCHED_FIFO), and the scenario would measure nothing.
    if spec.interference.rogue > 0 {
        background.push(spawn(
            Role::Rogue,
            CommandSpec {
                program: env.bin_dir.join("tess-rogue"),
                args: vec![
                    os("--swarm"),
                    os(spec.interference.rogue.to_string()),
                    // It stops by itself shortly after the run even if nobody can signal it.
                    os("--seconds"),
                    os(format!(
                        "{}",
                        (spec.duration + spec.warmup).as_secs_f64() + 60.0
                    )),
                ],
                stdout: None,
                stderr: Some(dir.join("rogue.log")),
            },
        )?);
        std::thread::sleep(Duration::from_millis(500));
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
        os(pace.to_string()),
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
        if matches!(pace, Pace::Link { .. }) {
            args.extend([os("--tap"), os(format!("{}:{}", p.wire, p.wire_host_if))]);
        }
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
    let ticks_before = tess_bench::cpu::ticks();
    let cell_spinner = spec
        .cell_spinner
        .and_then(tess_bench::spinner::tessd_idle_spinner)
        .and_then(tess_bench::spinner::SpinMeter::start);
    if spec.cell_spinner.is_some() && cell_spinner.is_none() {
        notes.push(format!(
            "no tessd idle spinner found on hart {}: its CPU time is not shown",
            spec.cell_spinner.unwrap_or_default()
        ));
    }
    let limit = spec.duration + spec.warmup + Duration::from_secs(30);
    let dev_status = device.wait_timeout(limit);
    let harts = tess_bench::cpu::loads(&ticks_before, &tess_bench::cpu::ticks());
    let cell_spinner = cell_spinner.and_then(tess_bench::spinner::SpinMeter::stop);

    // 4. Stop the synthesizer (it prints its report), then the interference.
    synth.signal(libc::SIGINT);
    let synth_status = synth.wait_timeout(Duration::from_secs(10));
    for mut g in background.drain(..) {
        if g.exited().is_some() {
            notes.push(format!("{} exited before the end of the run", g.role));
        }
        g.stop(Duration::from_secs(3));
    }
    let spinner_cpu_fraction = spinner
        .as_mut()
        .and_then(|g| {
            g.signal(libc::SIGTERM);
            g.wait_timeout(Duration::from_secs(3));
            let v: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&spinner_out).ok()?).ok()?;
            v["cpu_fraction"].as_f64()
        })
        .or(cell_spinner.map(|c| c.fraction()));
    if spec.interference.rogue > 0 {
        // What the kernel granted the swarm: one line per member.
        let log = std::fs::read_to_string(dir.join("rogue.log")).unwrap_or_default();
        let granted = log.matches("granted").count();
        let refused = log.matches("refused").count();
        notes.push(format!(
            "rogue swarm of {}: SCHED_FIFO 99 granted to {granted}, refused to {refused} (log: {})",
            spec.interference.rogue,
            dir.join("rogue.log").display()
        ));
    }
    drop(pair);

    let fail = |role: Role, what: String, log: PathBuf| ScenarioError::Process {
        scenario: spec.name.clone(),
        role,
        what,
        log,
    };
    if dev_status.is_none() && spec.interference.rogue > 0 {
        // The rogue swarm took the emulator's hart too (plain Linux cannot stop it): the
        // device could not play, so every package of the run counts as missed.
        let packages = clock_packages(spec.duration);
        notes.push(format!(
            "the test equipment was starved by the rogue swarm (it did not finish within {} s): no package was answered on time; all {packages} counted as missed",
            limit.as_secs()
        ));
        let host = if synth_status.is_some_and(|s| s.success()) {
            serde_json::from_str::<serde_json::Value>(
                &std::fs::read_to_string(&synth_out).unwrap_or_default(),
            )
            .ok()
            .and_then(|v| HostReport::deserialize(&v).ok())
            .unwrap_or_else(|| HostReport::missing(packages))
        } else {
            notes.push("the synthesizer did not report either (starved)".into());
            HostReport::missing(packages)
        };
        return Ok(ScenarioResult {
            spec: spec.clone(),
            layout: format!(
                "as D, plus {} rogue processes; {}",
                spec.interference.rogue,
                pair_description(spec)
            ),
            device: EmulatorReport::starved(packages, addr.to_string()),
            host,
            device_us: Vec::new(),
            host_us: Vec::new(),
            harts,
            spinner_cpu_fraction,
            notes,
        });
    }
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
        "synth {} {} wait {}; emulator {} {} pace {pace}; interference {} video + {} EP x {} threads (floating); {link}",
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
        harts,
        spinner_cpu_fraction,
        notes,
    })
}

/// Packages in `duration` at the device's rate.
fn clock_packages(duration: Duration) -> u64 {
    (duration.as_nanos() as u64).div_ceil(slabs::PACKAGE_PERIOD_NS)
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

/// 680.27 us: the due offset of a package's last packet after its first (15 x 45.35 us), the
/// part of `tf - t0` that a perfectly timed device spends sending.
pub const IDEAL_SEND_US: f64 = 15.0 * 2.0 * 1e6 / 44_100.0;

impl ScenarioResult {
    /// The derived "ideal device" p99.9: [`IDEAL_SEND_US`] plus the p99.9 of the time from the
    /// last packet's kernel transmit stamp to the answer.
    pub fn ideal_p999_us(&self) -> f64 {
        IDEAL_SEND_US + self.device.after_last_packet_us.p999
    }

    /// Per-hart busy fraction and steal time, as `0: 45% (steal 10 ms), 1: ...`.
    pub fn hart_summary(&self) -> String {
        self.harts
            .iter()
            .map(|h| {
                format!(
                    "{}: {:.0}% (steal {:.0} ms)",
                    h.hart,
                    h.busy_fraction * 100.0,
                    h.steal_ms
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The side-by-side table of scenarios. The primary figures are what the device sees (`tf -
/// t0`, from the actual send of the first packet to the kernel's receive stamp of the answer);
/// the derived columns say where time went: the ideal device's view (the emulator's own
/// pacing lateness removed), the synthesizer's own `t2 - t1`, the emulator's pacing lateness,
/// and what each hart did (busy share and hypervisor steal time).
pub fn results_table(results: &[ScenarioResult]) -> Table {
    let mut t = Table::new(
        "response time tf - t0 per package as the device sees it (us); misses = late (> 1405.9 us) + lost. \
         Derived: ideal = 680.27 + tf - send of packet 15; t2-t1 = host side; send late = the pacing error (the cable's, or the emulator's own); \
         harts = busy share and hypervisor steal per hart; spinner = CPU of the idle spinner on the synthesizer's hart (a spinning cell's, or the baseline's)",
        &[
            "scenario",
            "packages",
            "misses",
            "median",
            "p99",
            "p99.9",
            "max",
            "ideal p99.9",
            "t2-t1 p99.9",
            "send late p99.9",
            "harts",
            "spinner",
        ],
    );
    for r in results {
        let s = r.summary();
        t.row(&[
            format!("{}: {}", r.spec.name, r.spec.title),
            r.device.packages.to_string(),
            r.misses().to_string(),
            format!("{:.1}", s.median),
            format!("{:.1}", s.p99),
            format!("{:.1}", s.p999),
            format!("{:.1}", s.max),
            format!("{:.1}", r.ideal_p999_us()),
            format!("{:.1}", r.host.response_us.p999),
            format!("{:.1}", r.device.send_lateness_us.p999),
            r.hart_summary(),
            r.spinner_cpu_fraction
                .map_or("-".into(), |f| format!("{:.0}% of a hart", f * 100.0)),
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
        )
        .figure(format!("{n}_median_us"), s.median)
        .figure(format!("{n}_ideal_p999_us"), result.ideal_p999_us())
        .figure(
            format!("{n}_steal_ms"),
            result.harts.iter().map(|h| h.steal_ms).sum::<f64>(),
        );
    if let Some(f) = result.spinner_cpu_fraction {
        report.figure(format!("{n}_spinner_cpu_fraction"), f);
    }
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
