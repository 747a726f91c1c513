//! `tess bench music`: the live-music proof (seed 000 sections 3-4, issues 5 and 11).
//!
//! The SLABS emulator plays a gesture script to the Migrator synthesizer over UDP at the real
//! packet rate; each input package (16 packets, 725.6 us) must be answered within 1405.9 us.
//! Scenarios, in one run, repeated `--runs` times in turn (A B E C D E_linux, A B E ...) so
//! that a noisy phase of the machine hits every scenario alike:
//!
//! ```text
//! A        synthesizer in its dedicated cell, alone (Group 1 of Table 1)
//! B        A + interference cells: a time-triggered and an event-triggered cell each decoding
//!          a video at 30 frames/s, and two best-effort cells running the EP kernel (Group 2)
//! E        B + a rogue neighbour in its own best-effort cell: a swarm that raises itself to
//!          SCHED_FIFO 99 and spins (tess-rogue)
//! C        plain Linux: synthesizer under CFS, unpinned, same interference as plain processes
//! D        plain Linux, the careful user: synthesizer SCHED_FIFO 99 pinned to the
//!          synthesizer's hart, a SCHED_IDLE spinner keeping that hart awake, same interference
//! E_linux  D + the same rogue swarm, as plain processes
//! ```
//!
//! # Hart layout (2 harts; scales by taking the highest hart for the synthesizer)
//!
//! The synthesizer's cell is dedicated to the highest managed hart (D and E_linux pin it
//! there). Everything else shares the other harts: the console service, the interference and
//! the rogue (in cells in A/B/E, floating as plain processes in C/D/E_linux), and the emulator.
//!
//! # The same machine preparation for every scenario
//!
//! - The cable: the emulator's packets cross a wire network namespace between its own and the
//!   host's (`tess_music::netns`), whose forwarding, queue and timer run on the synthesizer's
//!   hart (RPS), as a network adapter's interrupt steered there would, in every scenario
//!   (`--no-steer`: where Linux puts them, the emulator's hart).
//! - The synthesizer runs the same way everywhere it is pinned: `SCHED_FIFO` 99, sleeping in
//!   `recv` between packets, a `SCHED_IDLE` spinner keeping its hart awake (the cell's, `idle =
//!   "spin"`, in A/B/E; `tess-idle-spin` in D and E_linux). So A/B/E and D differ only in what
//!   tess adds: the hart is the cell's alone. `--synth spin` busy-polls instead, as the paper's
//!   runtime did. The table shows the baseline spinner's CPU time and each hart's busy share.
//! - Test equipment: the emulator stands in for the paper's second machine (an FPGA). It runs
//!   the same way in every scenario: on the first shared hart, outside the cells, SCHED_FIFO
//!   98. The cable paces its packets (`--equipment-pace link`, the default): a token-bucket
//!   queue in the wire's namespace releases one every 45.35 us from a kernel timer, and the
//!   emulator only keeps 12 packages (8.7 ms) queued ahead, waking twice a package. So nothing
//!   on the emulator's hart delays the device, as nothing on the host delays a real SLABS:
//!   found with the kernel's trace (issue 11), the earlier self-paced emulator needed about
//!   70% of its hart on this virtual machine and waited behind the video cells' deadline
//!   threads, which ran up to 3.8 ms past their budgets, and behind softirqs deferred to
//!   `ksoftirqd`, so B measured the equipment, not the synthesizer. `--equipment-pace
//!   hybrid:20` brings that back for comparison. The "send late" column is the cable's
//!   pacing error (packet 15's departure against packet 0's plus 680.27 us).
//!
//! # What is measured
//!
//! The primary figure is what a user measures: the device-side response `tf - t0`, from the
//! package's first packet leaving for the host (the kernel's stamp from a tap on the cable,
//! `tess_music::net::WireTap`) to the kernel's receive stamp of the answer at the device.
//! Derived columns say where time went: the ideal device's view (680.27 us plus the time from
//! the last packet's departure to the answer), the synthesizer's own `t2 - t1`,
//! the emulator's pacing lateness, and per hart the busy share and the hypervisor's steal time
//! (`/proc/stat`), the evidence for stalls that no setting inside the machine can prevent.
//!
//! The oscillator capacity (`max_oscillators_per_hart`) is measured in the synthesizer's cell
//! once per run: the largest count at which at most 1% of the packages are late, every stall
//! counted (see `tess_music::measure`).

use super::support::{pick_hart, Session};
use super::Common;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tess_bench::Summary;
use tess_bench::{probe, Report, Table};
use tess_core::spec::{CellSpec, IdleMode};
use tess_music::emulator::Response;
use tess_music::net::Wait;
use tess_music::scenario::{
    self, EmulatorPlacement, Interference, Launcher, PlainLauncher, Role, RunEnv, ScenarioResult,
    ScenarioSpec, SynthPlacement,
};
use tess_sched::HartSet;

/// Options of `tess bench music`.
#[derive(clap::Args, Debug, Clone)]
pub struct MusicArgs {
    #[command(flatten)]
    pub common: Common,
    /// Measured seconds per scenario.
    #[arg(long, default_value_t = 20.0)]
    pub seconds: f64,
    /// Rounds of all scenarios, in turn; figures are medians over the rounds.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=50))]
    pub runs: u32,
    /// Seconds of the oscillator-capacity confirmation run (once per round).
    #[arg(long, default_value_t = 20.0)]
    pub capacity_seconds: f64,
    /// Directory for histograms, samples and logs.
    #[arg(long, default_value = "out/music")]
    pub out: PathBuf,
    /// Also record the synthesizer's 8 channels in scenario B (first round) to this WAV file.
    #[arg(long)]
    pub record: Option<PathBuf>,
    /// Also record a kernel trace of scenario B (first round; 5 s from 3 s in) to this
    /// Perfetto / Chrome trace JSON file, as `tess trace` does (root: tracefs). Tracing every
    /// context switch adds overhead to that round: `scripts/demo` traces a separate, short run.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Only run these scenarios, from A B C D E (E runs the rogue neighbour with tess and on
    /// plain Linux); default all.
    #[arg(long, default_value = "ABCDE")]
    pub scenarios: String,
    /// Processes in scenario E's rogue swarm (default: twice the machine's harts).
    #[arg(long, value_name = "N")]
    pub rogue_swarm: Option<u32>,
    /// Read group1.toml, group2.toml and rogue.toml from this directory instead of the
    /// shipped manifests.
    #[arg(long, value_name = "DIR")]
    pub manifests: Option<PathBuf>,
    /// How the synthesizer runs in its cell (A, B, E): `fifo-block` (the default: as D's
    /// careful user runs it, SCHED_FIFO 99 sleeping in recv, the cell's idle spinner keeping
    /// its hart awake), `spin` (busy-poll, SCHED_OTHER: the paper's one hart continuously
    /// handling communication; the network work for it, a softirq on its hart, can then wait
    /// behind it for a time slice when the kernel defers it to `ksoftirqd`) or `fifo-spin`
    /// (busy-poll under SCHED_FIFO, which the kernel's fair server stalls for 50 ms at a time:
    /// a bad idea shown for completeness).
    #[arg(long, value_enum, default_value = "fifo-block")]
    pub synth: SynthMode,
    /// Network namespace the emulator runs in, reaching the synthesizer over a veth pair (a
    /// second host, as in the paper; falls back to loopback if it cannot be made).
    #[arg(
        long,
        value_name = "NAME",
        default_value = "tess-music",
        conflicts_with = "loopback"
    )]
    pub netns: String,
    /// Emulator and synthesizer talk over loopback instead.
    #[arg(long)]
    pub loopback: bool,
    /// How the test equipment paces its packets, in every scenario: `link` (the default: a
    /// token-bucket queue on the cable, in the wire's network namespace, releases one packet
    /// every 45.35 us from its own timer, as the device's hardware would, and the emulator
    /// keeps 12 packages queued; `link:N` keeps N), or the emulator's own clock: `hybrid:US`
    /// (sleep until US microseconds before each packet, then spin), `spin`, `sleep`.
    /// Self-pacing shares the emulator's hart with whatever runs there, so the interference
    /// then delays the device.
    #[arg(long, value_name = "PACE", default_value = "link")]
    pub equipment_pace: tess_music::emulator::Pace,
    /// Leave the wire (forwarding, the cable's queue and its timer) where Linux puts it, the
    /// emulator's hart, in every scenario, instead of running it on the synthesizer's hart as an
    /// adapter's interrupt steered there would.
    #[arg(long)]
    pub no_steer: bool,
}

/// How the synthesizer runs inside its dedicated cell.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum SynthMode {
    /// SCHED_FIFO 99, blocking receive; the dedicated cell's idle spinner keeps the hart busy.
    FifoBlock,
    /// SCHED_OTHER, busy-polling.
    Spin,
    /// SCHED_FIFO 99, busy-polling.
    FifoSpin,
}

const SYNTH: &str = "music-synth";
const CONSOLE: &str = "music-console";
const VIDEO_TT: &str = "music-video-tt";
const VIDEO_ET: &str = "music-video-et";
const EP: [&str; 2] = ["music-ep-1", "music-ep-2"];
const ROGUE: &str = "music-rogue";
const INTERFERENCE: [&str; 4] = [VIDEO_TT, VIDEO_ET, EP[0], EP[1]];

/// Starts each role inside its cell with `tess run --cell`, which places itself in the cell
/// and then becomes the program (so signals reach the program directly).
struct CellLauncher {
    tess: PathBuf,
    cell_of: fn(&Role) -> Option<&'static str>,
}

impl Launcher for CellLauncher {
    fn spawn(&self, role: &Role, cmd: &scenario::launch::CommandSpec) -> std::io::Result<Child> {
        let Some(cell) = (self.cell_of)(role) else {
            return PlainLauncher.spawn(role, cmd);
        };
        let mut c = Command::new(&self.tess);
        c.args(["run", "--cell", cell, "--"])
            .arg(&cmd.program)
            .args(&cmd.args)
            .stdin(Stdio::null());
        c.stdout(match &cmd.stdout {
            Some(p) => Stdio::from(std::fs::File::create(p)?),
            None => Stdio::null(),
        });
        c.stderr(match &cmd.stderr {
            Some(p) => Stdio::from(std::fs::File::create(p)?),
            None => Stdio::null(),
        });
        c.spawn()
    }
}

fn cell_of_role(role: &Role) -> Option<&'static str> {
    match role {
        Role::Synth => Some(SYNTH),
        // Test equipment standing in for the paper's second machine: outside the cells, placed
        // the same way in every scenario (see `equipment`).
        Role::Emulator => None,
        Role::Video { index: 0 } => Some(VIDEO_TT),
        Role::Video { .. } => Some(VIDEO_ET),
        Role::BestEffort { index } => Some(EP[*index % EP.len()]),
        Role::Rogue => Some(ROGUE),
        // Only the plain-Linux baselines use a separate spinner; cells have their own.
        Role::Spinner => None,
    }
}

/// The group-1 manifest (synthesizer, console), shipped as `examples/music/group1.toml`.
const GROUP1: &str = include_str!("../../../../examples/music/group1.toml");
/// The group-2 manifest (interference), shipped as `examples/music/group2.toml`.
const GROUP2: &str = include_str!("../../../../examples/music/group2.toml");
/// The rogue neighbour's cell (scenario E), shipped as `examples/music/rogue.toml`.
const ROGUE_CELL: &str = include_str!("../../../../examples/music/rogue.toml");

/// Cells of a manifest (the shipped one, or `DIR/NAME` when `--manifests DIR` is given).
fn manifest(
    dir: &Option<PathBuf>,
    name: &str,
    shipped: &str,
    mode: SynthMode,
) -> anyhow::Result<Vec<CellSpec>> {
    let text = match dir {
        Some(d) => std::fs::read_to_string(d.join(name))?,
        None => shipped.to_string(),
    };
    let mut cells = tess_core::manifest::parse(&text)?.cells;
    for c in &mut cells {
        if c.name == SYNTH {
            // A synthesizer that sleeps in recv gets the idle spinner, so that each packet wakes
            // it on a running hart; one that busy-polls keeps its hart busy itself.
            c.idle = Some(match mode {
                SynthMode::FifoBlock => IdleMode::Spin,
                SynthMode::Spin | SynthMode::FifoSpin => IdleMode::Halt,
            });
        }
    }
    Ok(cells)
}

/// A tess scenario: the synthesizer in its cell, run as `mode` says.
fn tess_spec(
    name: &str,
    title: &str,
    interference: Interference,
    duration: Duration,
    mode: SynthMode,
) -> ScenarioSpec {
    let (fifo, wait) = match mode {
        SynthMode::FifoBlock => (Some(99), Wait::Block),
        SynthMode::Spin => (None, Wait::Poll),
        SynthMode::FifoSpin => (Some(99), Wait::Poll),
    };
    ScenarioSpec {
        name: name.into(),
        title: title.into(),
        // The synthesizer owns its hart: one thread does communication and voices; tessd
        // places it (no pinning of its own).
        synth: SynthPlacement {
            harts: None,
            fifo,
            wait,
            oscillators: 100,
            idle_spinner: false,
        },
        emulator: scenario::default_emulator(),
        interference,
        duration,
        warmup: Duration::from_secs(1),
        gesture: None,
        netns: None,
        record: None,
        steer_receive: None,
        cell_spinner: None,
    }
}

fn run_capacity(
    tess: &Path,
    bin: &Path,
    synth_hart: usize,
    fraction_s: f64,
    capacity_s: f64,
) -> anyhow::Result<serde_json::Value> {
    let out = Command::new(tess)
        .args(["run", "--cell", SYNTH, "--"])
        .arg(bin.join("tess-migrator"))
        .args(["measure", "--hart", &synth_hart.to_string(), "--json"])
        .args([
            "--fraction-seconds",
            &fraction_s.to_string(),
            "--capacity-seconds",
            &capacity_s.to_string(),
        ])
        .stderr(Stdio::inherit())
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "tess-migrator measure failed ({})",
        out.status
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// What one round measured.
struct Round {
    results: Vec<ScenarioResult>,
    capacity: serde_json::Value,
}

/// Everything a round needs that does not change between rounds.
struct Plan<'a> {
    args: &'a MusicArgs,
    tess: PathBuf,
    env: RunEnv,
    synth_hart: usize,
    duration: Duration,
    capacity_s: f64,
    group1: Vec<CellSpec>,
    group2: Vec<CellSpec>,
    rogue: Vec<CellSpec>,
    swarm: u32,
    equipment: EmulatorPlacement,
    netns: Option<String>,
    steer: Option<HartSet>,
    /// The harts the synthesizer does not own.
    shared: HartSet,
}

/// A kernel trace taken while a scenario runs (`--trace`), in a thread of its own.
struct ScenarioTrace(std::thread::JoinHandle<anyhow::Result<(PathBuf, String)>>);

impl ScenarioTrace {
    /// Waits out the scenario's set-up and warm-up (3 s), then records up to 5 s of it.
    fn start(out: PathBuf, scenario: Duration) -> ScenarioTrace {
        let lead = Duration::from_secs(3);
        let length = scenario
            .saturating_sub(Duration::from_secs(1))
            .min(Duration::from_secs(5));
        ScenarioTrace(std::thread::spawn(move || {
            std::thread::sleep(lead);
            let summary =
                crate::cmd::trace::record_to(length.max(Duration::from_millis(500)), 8192, &out)?;
            Ok((
                out,
                format!(
                    "{} context switches, {} throttles, {} runtime events, {} missed",
                    summary.switches,
                    summary.throttles,
                    summary.runtime_events,
                    summary.runtime_misses
                ),
            ))
        }))
    }

    /// Waits for the trace and says where it is (or why there is none: tracing is extra).
    fn finish(self) {
        match self.0.join() {
            Ok(Ok((out, what))) => {
                eprintln!("trace of scenario B: {} ({what})", out.display())
            }
            Ok(Err(e)) => eprintln!("no trace of scenario B: {e:#}"),
            Err(_) => eprintln!("no trace of scenario B: the tracing thread panicked"),
        }
    }
}

impl Plan<'_> {
    fn want(&self, c: char) -> bool {
        self.args.scenarios.to_ascii_uppercase().contains(c)
    }

    /// Gives a scenario this plan's link, receive steering and test equipment.
    fn prepare(&self, mut spec: ScenarioSpec, round: u32) -> ScenarioSpec {
        spec.netns = self.netns.clone();
        spec.emulator = self.equipment.clone();
        spec.steer_receive = self.steer.clone();
        spec.duration = self.duration;
        if round == 0 && spec.name == "B" {
            spec.record = self.args.record.clone();
        }
        spec
    }

    /// The tess scenarios of one round (A, capacity, B, E), in the cells of the manifests.
    fn tess_part(
        &self,
        s: &mut Session,
        round: u32,
        work: &Path,
    ) -> anyhow::Result<(Vec<ScenarioResult>, serde_json::Value)> {
        let mut results = Vec::new();
        let mut capacity = serde_json::Value::Null;
        s.apply(self.group1.clone())?;
        let placed = match s
            .client
            .call(&tess_proto::Request::ShowCell { name: SYNTH.into() })?
        {
            tess_proto::Body::Cell(c) => c.harts,
            other => anyhow::bail!("unexpected reply {other:?}"),
        };
        anyhow::ensure!(
            placed == HartSet::single(self.synth_hart),
            "the synthesizer's cell was placed on harts {placed} instead of {}: free the highest hart or pass --hart",
            self.synth_hart
        );
        let env = RunEnv {
            work_dir: work.to_path_buf(),
            ..self.env.clone()
        };
        let launcher = CellLauncher {
            tess: self.tess.clone(),
            cell_of: cell_of_role,
        };
        // The console service runs for the tess scenarios, as in the paper's Group 1.
        let mut console = Command::new(&self.tess)
            .args(["run", "--cell", CONSOLE, "--"])
            .arg(self.env.bin_dir.join("tess-console"))
            .arg("--dir")
            .arg(work.join("console"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok();
        let mode = self.args.synth;
        // One tess scenario in the cells applied so far.
        let run = |name: &str, title: &str, interference: Interference| {
            let mut spec = tess_spec(name, title, interference, self.duration, mode);
            if mode == SynthMode::FifoBlock {
                // The synthesizer's cell spins while it sleeps: show what that costs.
                spec.cell_spinner = Some(self.synth_hart);
            }
            scenario::run_scenario(&self.prepare(spec, round), &env, &launcher)
        };
        let outcome = (|| -> anyhow::Result<()> {
            if self.want('A') {
                results.push(run(
                    "A",
                    "tess: synthesizer in its dedicated cell, alone",
                    Interference::NONE,
                )?);
            }
            capacity = run_capacity(
                &self.tess,
                &self.env.bin_dir,
                self.synth_hart,
                if self.args.common.quick { 1.0 } else { 5.0 },
                self.capacity_s,
            )?;
            if self.want('B') || self.want('E') {
                s.apply(self.group2.clone())?;
            }
            if self.want('B') {
                let tracer = self
                    .args
                    .trace
                    .clone()
                    .filter(|_| round == 0)
                    .map(|out| ScenarioTrace::start(out, self.duration));
                let r = run(
                    "B",
                    "tess: synthesizer in its cell, interference in cells",
                    Interference::GROUP2,
                );
                if let Some(t) = tracer {
                    t.finish();
                }
                results.push(r?);
            }
            if self.want('E') {
                s.apply(self.rogue.clone())?;
                let r = run(
                    "E",
                    "tess: as B, plus a rogue SCHED_FIFO 99 swarm in a cell",
                    Interference::group2_with_rogue(self.swarm),
                );
                s.delete(&[ROGUE]);
                results.push(r?);
            }
            Ok(())
        })();
        s.delete(&INTERFERENCE);
        if let Some(c) = console.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
        s.delete(&[CONSOLE]);
        // The pinned synthesizer cell is deleted explicitly (deleting is the user's own act).
        s.delete(&[SYNTH]);
        outcome?;
        for r in &mut results {
            // The runner describes placement from command-line flags; in cells tessd places.
            // The link (veth pair or loopback) is the runner's last clause.
            let link = r.layout.rsplit("; ").next().unwrap_or_default().to_string();
            r.layout = format!(
                "synthesizer in dedicated cell {SYNTH} (hart {}, {mode:?}); {}; {link}",
                self.synth_hart,
                match r.spec.name.as_str() {
                    "A" => "no interference",
                    "B" => "interference in cells on the shared hart(s)",
                    _ => "interference and the rogue swarm in cells on the shared hart(s)",
                }
            );
        }
        Ok((results, capacity))
    }

    /// The plain-Linux baselines of one round (C, D, E_linux).
    fn linux_part(&self, round: u32, work: &Path) -> anyhow::Result<Vec<ScenarioResult>> {
        let env = RunEnv {
            work_dir: work.to_path_buf(),
            ..self.env.clone()
        };
        let mut results = Vec::new();
        let mut specs = Vec::new();
        if self.want('C') {
            specs.push(scenario::baseline_c(self.duration));
        }
        let pin = |mut d: ScenarioSpec| {
            d.synth.harts = Some(vec![self.synth_hart]);
            d
        };
        if self.want('D') {
            specs.push(pin(scenario::baseline_d(self.duration)));
        }
        if self.want('E') {
            specs.push(pin(scenario::baseline_e_linux(self.duration, self.swarm)));
        }
        for spec in specs {
            results.push(scenario::run_scenario(
                &self.prepare(spec, round),
                &env,
                &PlainLauncher,
            )?);
        }
        Ok(results)
    }
}

/// The median of `values`; NaN when there is none (a scenario in which no package was
/// answered has no response percentiles).
fn median(values: &[f64]) -> f64 {
    if values.iter().all(|v| v.is_nan()) {
        return f64::NAN;
    }
    Summary::of(values).median
}

/// Runs the benchmark.
pub fn run(a: &MusicArgs) -> anyhow::Result<Report> {
    let mut s = Session::connect()?;
    let status = s.status()?;
    let synth_hart = pick_hart(a.common.hart, &status)?;
    let shared = status.managed.difference(&HartSet::single(synth_hart));
    anyhow::ensure!(
        !shared.is_empty(),
        "tess bench music needs at least 2 managed harts"
    );
    let quick = a.common.quick;
    std::fs::create_dir_all(&a.out)?;
    let out = std::fs::canonicalize(&a.out)?;
    let env = RunEnv::beside_current_exe(&out)?;
    for p in [
        "tess-migrator",
        "tess-slabs",
        "tess-ep",
        "tess-rogue",
        "tess-idle-spin",
    ] {
        anyhow::ensure!(
            env.bin_dir.join(p).exists(),
            "{} is missing (cargo build --workspace)",
            env.bin_dir.join(p).display()
        );
    }
    let emulator_hart = shared.iter().next().unwrap_or(0);
    let all_harts = std::thread::available_parallelism().map_or(2, |n| n.get()) as u32;
    let plan = Plan {
        args: a,
        tess: std::env::current_exe()?,
        env: env.clone(),
        synth_hart,
        duration: Duration::from_secs_f64(if quick { 5.0 } else { a.seconds }),
        capacity_s: if quick { 3.0 } else { a.capacity_seconds },
        group1: manifest(&a.manifests, "group1.toml", GROUP1, a.synth)?,
        group2: manifest(&a.manifests, "group2.toml", GROUP2, a.synth)?,
        rogue: manifest(&a.manifests, "rogue.toml", ROGUE_CELL, a.synth)?,
        swarm: a.rogue_swarm.unwrap_or(2 * all_harts),
        // The test equipment (module docs): the same in every scenario.
        equipment: EmulatorPlacement {
            hart: Some(emulator_hart),
            response: Response::Actual,
            pace: a.equipment_pace,
            ..scenario::default_emulator()
        },
        netns: (!a.loopback).then(|| a.netns.clone()),
        steer: (!a.no_steer && !a.loopback).then(|| HartSet::single(synth_hart)),
        shared: shared.clone(),
    };

    let floor = probe::noise_floor(synth_hart, if quick { 1000 } else { 5000 })?;
    let mut rounds: Vec<Round> = Vec::new();
    for round in 0..a.runs {
        let work = if a.runs == 1 {
            out.clone()
        } else {
            out.join(format!("run-{}", round + 1))
        };
        let (mut results, capacity) = plan.tess_part(&mut s, round, &work)?;
        results.extend(plan.linux_part(round, &work)?);
        rounds.push(Round { results, capacity });
    }
    report(&plan, &rounds, &floor, emulator_hart, &out)
}

/// The figure of scenario `name` in each round, as `f(result)`.
fn per_round(rounds: &[Round], name: &str, f: impl Fn(&ScenarioResult) -> f64) -> Vec<f64> {
    rounds
        .iter()
        .filter_map(|r| r.results.iter().find(|x| x.spec.name == name).map(&f))
        .collect()
}

/// `median (min-max)` of per-round values, or just the value for one round.
fn spread(values: &[f64], decimals: usize) -> String {
    if values.iter().all(|v| v.is_nan()) {
        return "none answered".into();
    }
    let s = Summary::of(values);
    if values.len() <= 1 {
        format!("{:.*}", decimals, s.median)
    } else {
        format!(
            "{:.*} ({:.*}-{:.*})",
            decimals, s.median, decimals, s.min, decimals, s.max
        )
    }
}

fn report(
    plan: &Plan<'_>,
    rounds: &[Round],
    floor: &probe::WakeupProbe,
    emulator_hart: usize,
    out: &Path,
) -> anyhow::Result<Report> {
    let a = plan.args;
    let synth_hart = plan.synth_hart;
    let mut r = Report::new("music");
    let names: Vec<String> = rounds
        .first()
        .map(|x| x.results.iter().map(|y| y.spec.name.clone()).collect())
        .unwrap_or_default();

    // Per scenario: the medians over rounds are the figures.
    let mut summary = Table::new(
        format!(
            "over {} round(s): median (min-max) per scenario; response tf - t0 as the device sees it (us)",
            rounds.len()
        ),
        &[
            "scenario",
            "packages",
            "misses",
            "miss %",
            "p99.9",
            "max",
            "ideal p99.9",
            "t2-t1 p99.9",
            "steal ms",
            "spinner CPU",
        ],
    );
    for name in &names {
        let misses = per_round(rounds, name, |x| x.misses() as f64);
        let packages = per_round(rounds, name, |x| x.device.packages as f64);
        let pct: Vec<f64> = misses
            .iter()
            .zip(&packages)
            .map(|(m, p)| 100.0 * m / p.max(1.0))
            .collect();
        let p999 = per_round(rounds, name, |x| x.summary().p999);
        let max = per_round(rounds, name, |x| x.summary().max);
        let ideal = per_round(rounds, name, ScenarioResult::ideal_p999_us);
        let host = per_round(rounds, name, |x| x.host.response_us.p999);
        let steal = per_round(rounds, name, |x| {
            x.harts.iter().map(|h| h.steal_ms).sum::<f64>()
        });
        let spinner = per_round(rounds, name, |x| x.spinner_cpu_fraction.unwrap_or(f64::NAN));
        let title = rounds[0]
            .results
            .iter()
            .find(|x| &x.spec.name == name)
            .map_or(String::new(), |x| x.spec.title.clone());
        summary.row(&[
            format!("{name}: {title}"),
            spread(&packages, 0),
            spread(&misses, 0),
            spread(&pct, 3),
            spread(&p999, 1),
            spread(&max, 0),
            spread(&ideal, 1),
            spread(&host, 1),
            spread(&steal, 0),
            if spinner.iter().all(|f| f.is_nan()) {
                "-".into()
            } else {
                format!(
                    "{}% of a hart",
                    spread(&spinner.iter().map(|f| f * 100.0).collect::<Vec<_>>(), 0)
                )
            },
        ]);
        let fig = |suffix: &str, v: &[f64]| (format!("{name}_{suffix}"), median(v));
        for (k, v) in [
            fig("packages", &packages),
            fig("misses", &misses),
            fig("miss_pct", &pct),
            fig("p999_us", &p999),
            fig("max_us", &max),
            fig(
                "median_us",
                &per_round(rounds, name, |x| x.summary().median),
            ),
            fig("ideal_p999_us", &ideal),
            fig("host_p999_us", &host),
            fig("steal_ms", &steal),
            fig(
                "device_late_p999_us",
                &per_round(rounds, name, |x| x.device.send_lateness_us.p999),
            ),
        ] {
            r.figure(k, v);
        }
        if spinner.iter().any(|f| !f.is_nan()) {
            r.figure(format!("{name}_spinner_cpu_fraction"), median(&spinner));
        }
    }
    r.table(summary);
    // Every round's full table.
    for (i, round) in rounds.iter().enumerate() {
        let mut t = scenario::results_table(&round.results);
        t.title = format!("round {} of {}: {}", i + 1, rounds.len(), t.title);
        r.table(t);
    }

    // Capacity, once per round.
    let osc: Vec<f64> = rounds
        .iter()
        .map(|x| {
            x.capacity["max_oscillators_per_hart"]
                .as_f64()
                .unwrap_or(0.0)
        })
        .collect();
    let fraction: Vec<f64> = rounds
        .iter()
        .filter_map(|x| x.capacity["migrator_hart_fraction"].as_f64())
        .collect();
    if !fraction.is_empty() {
        r.figure("migrator_hart_fraction", median(&fraction));
        r.figure("max_oscillators_per_hart", median(&osc));
        r.figure("max_oscillators_per_hart_min", Summary::of(&osc).min);
        r.figure("max_oscillators_per_hart_max", Summary::of(&osc).max);
        let mut t = Table::new(
            "capacity of one hart (in the synthesizer's dedicated cell), per round",
            &["measure", "median (min-max)", "target"],
        );
        t.row(&[
            "busy time per package / package period, 32 x 100 oscillators".to_string(),
            spread(&fraction, 4),
            "< 0.25".into(),
        ]);
        t.row(&[
            format!(
                "oscillators with at most {:.0}% of packages late (stalls counted) over {:.0} s",
                tess_music::measure::TOLERANCE * 100.0,
                plan.capacity_s
            ),
            spread(&osc, 0),
            ">= 30000; rounds within 10%".into(),
        ]);
        r.table(t);
        let fm = median(&fraction);
        r.target(
            "full Migrator under 25% of one hart",
            fm < 0.25,
            format!("{fm:.4}"),
        );
        let om = median(&osc);
        r.target(
            "one hart sustains >= 30,000 oscillators",
            om >= 30_000.0,
            format!("{om:.0}"),
        );
        if osc.len() > 1 {
            let s = Summary::of(&osc);
            let within = s.min >= 0.9 * s.median && s.max <= 1.1 * s.median;
            r.target(
                "capacity reproducible within 10% over the rounds",
                within,
                format!("{:.0}-{:.0} around {:.0}", s.min, s.max, s.median),
            );
        }
        for (i, round) in rounds.iter().enumerate() {
            let attempts: Vec<String> = round.capacity["capacity"]["confirmations"]
                .as_array()
                .map(|runs| runs.iter().map(describe_attempt).collect())
                .unwrap_or_default();
            let profile = &round.capacity["capacity"]["trials"][1];
            let predicted = match (
                profile["oscillators"].as_f64(),
                profile["cpu_us"]["p99"].as_f64(),
            ) {
                (Some(n), Some(p99)) if p99 > 0.0 => format!(
                    "predicted from a profile at {n:.0} oscillators (p99 CPU time per package {p99:.1} us of a {:.1} us period); ",
                    tess_music::slabs::PACKAGE_PERIOD_NS as f64 / 1000.0
                ),
                _ => String::new(),
            };
            if !attempts.is_empty() {
                r.note(format!(
                    "capacity, round {}: {predicted}{:.0}-s confirmation attempts: {}",
                    i + 1,
                    plan.capacity_s,
                    attempts.join("; ")
                ));
            }
        }
    }

    // Targets (issue 11 part 2 and 3), on the medians over rounds.
    let f = |k: &str| r.figures.get(k).copied();
    let mut checks = Vec::new();
    if let (Some(am), Some(bm), Some(ap), Some(bp), Some(pk)) = (
        f("A_misses"),
        f("B_misses"),
        f("A_p999_us"),
        f("B_p999_us"),
        f("A_packages"),
    ) {
        checks.push((
            "B misses <= A misses + 0.1% of packages".to_string(),
            bm <= am + 0.001 * pk,
            format!("B {bm:.0} vs A {am:.0} + {:.0}", 0.001 * pk),
        ));
        checks.push((
            "B p99.9 <= 1.10 x A p99.9".to_string(),
            bp <= 1.10 * ap,
            format!(
                "B {bp:.0} us vs A {ap:.0} us ({:+.1}%)",
                (bp / ap - 1.0) * 100.0
            ),
        ));
        if let (Some(em), Some(ep)) = (f("E_misses"), f("E_p999_us")) {
            checks.push((
                "E (rogue swarm, tess) misses <= A misses + 0.1% of packages".to_string(),
                em <= am + 0.001 * pk,
                format!("E {em:.0} vs A {am:.0} + {:.0}", 0.001 * pk),
            ));
            checks.push((
                "E p99.9 <= 1.10 x A p99.9".to_string(),
                ep <= 1.10 * ap,
                format!(
                    "E {ep:.0} us vs A {ap:.0} us ({:+.1}%)",
                    (ep / ap - 1.0) * 100.0
                ),
            ));
        }
    }
    if let (Some(bm), Some(dm), Some(bp), Some(dp)) =
        (f("B_misses"), f("D_misses"), f("B_p999_us"), f("D_p999_us"))
    {
        checks.push((
            "B <= D on misses (tess beside interference vs the careful plain-Linux user)".into(),
            bm <= dm,
            format!("B {bm:.0} vs D {dm:.0}"),
        ));
        checks.push((
            "B <= D on p99.9".into(),
            bp <= dp,
            format!("B {bp:.0} us vs D {dp:.0} us"),
        ));
    }
    if let (Some(em), Some(lm)) = (f("E_misses"), f("E_linux_misses")) {
        checks.push((
            "E: tess confines the rogue swarm (E misses < E_linux misses)".into(),
            em < lm,
            format!("tess {em:.0} vs plain Linux {lm:.0}"),
        ));
    }
    if let (Some(cm), Some(pk)) = (f("C_misses"), f("C_packages")) {
        checks.push((
            "C (plain Linux) misses many deadlines".into(),
            cm > 0.01 * pk,
            format!("{cm:.0} of {pk:.0} ({:.1}%)", 100.0 * cm / pk.max(1.0)),
        ));
    }
    for (t, met, m) in checks {
        r.target(t, met, m);
    }

    // Side by side: the paper, tess, the careful plain-Linux user.
    let fifo = "SCHED_FIFO 99 pinned + idle spinner + RPS, same equipment";
    r.compare(
        "missed deadlines, synthesizer alone (median of rounds)",
        Some("seed 000 Fig. 7, Group 1: 0"),
        "A_misses",
        None,
    );
    r.compare(
        "missed deadlines beside video + CPU interference",
        Some("seed 000 Fig. 7, Group 2: 0"),
        "B_misses",
        Some(("D_misses", fifo)),
    );
    r.compare(
        "response p99.9 beside interference (us)",
        Some("seed 000 Fig. 7, Group 2: max 1405, mean 1024.6"),
        "B_p999_us",
        Some(("D_p999_us", fifo)),
    );
    r.compare(
        "missed deadlines beside a rogue SCHED_FIFO 99 swarm",
        None,
        "E_misses",
        Some(("E_linux_misses", "the same swarm on plain Linux, D's setup")),
    );
    r.compare(
        "response p99.9 beside the rogue swarm (us)",
        None,
        "E_p999_us",
        Some((
            "E_linux_p999_us",
            "the same swarm on plain Linux, D's setup",
        )),
    );
    r.compare(
        "response time with / without a synthetic application in another cell: p99.9 (us)",
        Some("seed 001 Table 2: music response unchanged beside another cell"),
        "B_p999_us",
        Some(("A_p999_us", "tess alone, scenario A")),
    );
    r.compare(
        "oscillators one hart sustains",
        Some("seed 000 §4: Migrator 32 x 100 oscillators on one hart thread"),
        "max_oscillators_per_hart",
        None,
    );

    // Histograms of the first round.
    let mut images = Vec::new();
    if let Some(first) = rounds.first() {
        for res in &first.results {
            images.push(scenario::write_histogram(res, out)?);
        }
    }
    r.figure("noise_floor_max_us", floor.summary_us.max);
    r.note(format!(
        "hart layout: hart {synth_hart} is dedicated to the synthesizer's cell (A, B, E) or holds the SCHED_FIFO 99 synthesizer and its idle spinner (D, E_linux); hart(s) {} hold the console service, the interference and the rogue swarm, in the cells of examples/music/group1.toml, group2.toml and rogue.toml (by default a time-triggered video 200 us / 3 ms and an event-triggered one 200 us / 3 ms; two best-effort EP cells; the rogue's best-effort cell) or as plain floating processes (C, D, E_linux). The SLABS emulator is test equipment, the same in all: hart {emulator_hart}, outside the cells, SCHED_FIFO 98, pace {}. {}",
        plan.shared,
        plan.equipment.pace,
        if plan.steer.is_some() {
            format!("In every scenario the wire (the cable's forwarding, queue and timer, in its own network namespace) runs on hart {synth_hart}, as a network adapter's interrupt steered there would (RPS).")
        } else {
            "The wire (the cable's forwarding, queue and timer) runs where Linux puts it, the emulator's hart, in every scenario.".to_string()
        }
    ));
    r.note(format!(
        "noise floor on hart {synth_hart} (SCHED_FIFO 99, 1 ms wake-ups, idle): median {:.1} us, p99 {:.1} us, max {:.1} us",
        floor.summary_us.median, floor.summary_us.p99, floor.summary_us.max
    ));
    r.note("response = tf - t0 as the device sees it: from the actual send of the package's first packet to the kernel's receive stamp of the answer (the paper's measure); 'ideal' (680.27 us + tf - the last packet's kernel transmit stamp) is a derived column");
    r.note("steal ms = time the hypervisor kept the vCPUs off the host CPU during the scenario (/proc/stat, all harts): stalls no Linux setting prevents");
    for (i, round) in rounds.iter().enumerate() {
        for res in &round.results {
            let mut scratch = Report::new("scratch");
            scenario::add_figures(&mut scratch, res);
            for n in scratch.notes {
                r.note(format!("round {}: {n}", i + 1));
            }
        }
    }
    r.note(format!(
        "histograms (round 1): {}",
        images
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    ));
    if let Some(w) = &a.record {
        r.note(format!(
            "scenario B's audio (8 channels, round 1) recorded to {}",
            w.display()
        ));
    }
    r.detail(
        "capacity",
        rounds
            .iter()
            .map(|x| x.capacity.clone())
            .collect::<Vec<_>>(),
    );
    r.detail("noise_floor_us", floor.summary_us);
    r.detail(
        "rounds",
        rounds.iter().map(|x| &x.results).collect::<Vec<_>>(),
    );
    Ok(r)
}

/// One confirmation attempt of the capacity search, as `N oscillators: S s, K late`.
fn describe_attempt(run: &serde_json::Value) -> String {
    let seconds =
        run["packages"].as_f64().unwrap_or(0.0) * tess_music::slabs::PACKAGE_PERIOD_NS as f64 / 1e9;
    format!(
        "{} oscillators: {seconds:.1} s, {} late ({} stalls){}",
        run["oscillators"],
        run["late"],
        run["stalls"],
        if run["stopped_early"].as_bool() == Some(true) {
            ", refuted"
        } else {
            ", held"
        }
    )
}
