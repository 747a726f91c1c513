//! `tess bench music`: the live-music proof (seed 000 sections 3-4, issue 5).
//!
//! The SLABS emulator plays a gesture script to the Migrator synthesizer over UDP at the real
//! packet rate; each input package (16 packets, 725.6 us) must be answered within 1405.9 us.
//! Scenarios, in one run:
//!
//! ```text
//! A  synthesizer in its dedicated cell, alone (Group 1 of Table 1)
//! B  A + interference cells: a time-triggered and an event-triggered cell each decoding a video
//!    at 30 frames/s, and two best-effort cells running the EP kernel (Group 2)
//! C  plain Linux: synthesizer under CFS, unpinned, same interference as plain processes
//! D  plain Linux: synthesizer SCHED_FIFO 99 pinned to the synthesizer's hart, same interference
//! ```
//!
//! # Hart layout (2 harts; scales by taking the highest hart for the synthesizer)
//!
//! The synthesizer's cell is dedicated to the highest managed hart. Everything else shares the
//! other harts: the console service and the interference cells, where the demand-bound test
//! decides what fits (200 us time-triggered windows every 3 ms, a 2 ms / 33 ms event-triggered
//! cell, best-effort cells), and the emulator. The emulator is test equipment standing in for
//! the paper's second machine, so it is placed the same way in all four scenarios: on the first
//! shared hart, outside the cells, `SCHED_FIFO` 98, paced by sleeping until 20 us before each
//! packet. (In an event-triggered cell of its own it needed two thirds of the hart on this
//! virtual machine and still fell seconds behind the device's rate.)
//!
//! In A and B the kernel's receive processing of the synthesizer's packets is steered to the
//! synthesizer's hart (RPS on the veth, `--no-steer` to leave it): otherwise it runs on the
//! sending hart, shared with the interference. C and D leave it where Linux puts it.
//!
//! # What is measured
//!
//! Every scenario measures the response a perfectly timed device would see (`tess-slabs
//! --response ideal`): the package's ideal duration, 680.27 us, plus the time from sending its
//! last packet to receiving the answer. The emulator shares its hart with the interference, and
//! a late emulator would otherwise charge its own lateness to the system under test (the paper's
//! device was an FPGA on another machine). The raw `tf - t0` is kept in the detail.

use super::support::{pick_hart, Session};
use super::Common;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tess_bench::{probe, Report, Table};
use tess_core::spec::{CellSpec, IdleMode};
use tess_music::emulator::{Pace, Response};
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
    #[arg(long, default_value_t = 30.0)]
    pub seconds: f64,
    /// Seconds the oscillator capacity must hold with zero misses.
    #[arg(long, default_value_t = 60.0)]
    pub capacity_seconds: f64,
    /// Directory for histograms, samples and logs.
    #[arg(long, default_value = "out/music")]
    pub out: PathBuf,
    /// Also record the synthesizer's 8 channels in scenario B to this WAV file.
    #[arg(long)]
    pub record: Option<PathBuf>,
    /// Only run these scenarios (e.g. AB); default ABCD.
    #[arg(long, default_value = "ABCD")]
    pub scenarios: String,
    /// Read group1.toml and group2.toml from this directory instead of the shipped manifests.
    #[arg(long, value_name = "DIR")]
    pub manifests: Option<PathBuf>,
    /// How the synthesizer runs in its cell (A, B): `spin` (busy-poll, SCHED_OTHER: the paper's
    /// one hart continuously handling communication), `fifo-block` (SCHED_FIFO 99, sleeping in
    /// recv; its hart stays busy with the cell's idle spinner) or `fifo-spin` (busy-poll under
    /// SCHED_FIFO, which the kernel's fair server stalls for 50 ms at a time: a bad idea shown
    /// for completeness).
    #[arg(long, value_enum, default_value = "spin")]
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
    /// Leave the kernel's receive processing of the synthesizer's packets where Linux puts it
    /// (the sending hart) in A and B too, instead of steering it to the synthesizer's hart.
    #[arg(long)]
    pub no_steer: bool,
}

/// How the synthesizer runs inside its dedicated cell.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum SynthMode {
    /// SCHED_FIFO 99, blocking receive; the dedicated cell's idle spinner keeps the hart busy.
    FifoBlock,
    /// SCHED_OTHER, busy-polling its socket.
    Spin,
    /// SCHED_FIFO 99, busy-polling.
    FifoSpin,
}

const SYNTH: &str = "music-synth";
const CONSOLE: &str = "music-console";
const VIDEO_TT: &str = "music-video-tt";
const VIDEO_ET: &str = "music-video-et";
const EP: [&str; 2] = ["music-ep-1", "music-ep-2"];

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
        // like in C and D (see `test_equipment`).
        Role::Emulator => None,
        Role::Video { index: 0 } => Some(VIDEO_TT),
        Role::Video { .. } => Some(VIDEO_ET),
        Role::BestEffort { index } => Some(EP[*index % EP.len()]),
    }
}

/// The group-1 manifest (synthesizer, emulator, console), shipped as
/// `examples/music/group1.toml`.
const GROUP1: &str = include_str!("../../../../examples/music/group1.toml");
/// The group-2 manifest (interference), shipped as `examples/music/group2.toml`.
const GROUP2: &str = include_str!("../../../../examples/music/group2.toml");

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
        if c.name == SYNTH && mode == SynthMode::FifoBlock {
            // A synthesizer that sleeps in recv gets the idle spinner, so that each packet wakes
            // it on a running hart.
            c.idle = Some(IdleMode::Spin);
        }
    }
    Ok(cells)
}

fn tess_spec(
    name: &str,
    title: &str,
    interference: Interference,
    duration: Duration,
    record: Option<PathBuf>,
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
        // The synthesizer owns its hart: one thread does communication and voices.
        synth: SynthPlacement {
            harts: None,
            fifo,
            wait,
            oscillators: 100,
        },
        // tessd places the emulator's threads and reserves their CPU: no pinning, no FIFO; sleep
        // pacing keeps it inside its budget.
        emulator: EmulatorPlacement {
            hart: None,
            fifo: None,
            pace: Pace::Sleep,
            response: Response::Ideal,
        },
        interference,
        duration,
        warmup: Duration::from_secs(1),
        gesture: None,
        netns: None,
        record,
        steer_receive: None,
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
    let duration = Duration::from_secs_f64(if quick { 5.0 } else { a.seconds });
    let capacity_s = if quick { 3.0 } else { a.capacity_seconds };
    std::fs::create_dir_all(&a.out)?;
    let out = std::fs::canonicalize(&a.out)?;
    let tess = std::env::current_exe()?;
    let env = RunEnv::beside_current_exe(&out)?;
    for p in ["tess-migrator", "tess-slabs", "tess-ep"] {
        anyhow::ensure!(
            env.bin_dir.join(p).exists(),
            "{} is missing (cargo build --workspace)",
            env.bin_dir.join(p).display()
        );
    }
    let want = |c: char| a.scenarios.to_ascii_uppercase().contains(c);

    let floor = probe::noise_floor(synth_hart, if quick { 1000 } else { 5000 })?;
    let mut results: Vec<ScenarioResult> = Vec::new();
    let mut capacity = serde_json::Value::Null;
    let launcher = CellLauncher {
        tess: tess.clone(),
        cell_of: cell_of_role,
    };

    let group1 = manifest(&a.manifests, "group1.toml", GROUP1, a.synth)?;
    let group2 = manifest(&a.manifests, "group2.toml", GROUP2, a.synth)?;
    s.apply(group1)?;
    let placed = match s
        .client
        .call(&tess_proto::Request::ShowCell { name: SYNTH.into() })?
    {
        tess_proto::Body::Cell(c) => c.harts,
        other => anyhow::bail!("unexpected reply {other:?}"),
    };
    anyhow::ensure!(
        placed == HartSet::single(synth_hart),
        "the synthesizer's cell was placed on harts {placed} instead of {synth_hart}: free the highest hart or pass --hart"
    );
    // The console service runs for the tess scenarios, as in the paper's Group 1.
    let mut console = Command::new(&tess)
        .args(["run", "--cell", CONSOLE, "--"])
        .arg(env.bin_dir.join("tess-console"))
        .arg("--dir")
        .arg(out.join("console"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok();
    let netns = (!a.loopback).then(|| a.netns.clone());
    // The emulator is test equipment (the paper's SLABS was a second machine): the same
    // placement in every scenario, on the first shared hart, outside the cells, answered
    // as a perfectly timed device would see it.
    let emulator_hart = shared.iter().next().unwrap_or(0);
    let test_equipment = EmulatorPlacement {
        hart: Some(emulator_hart),
        response: Response::Ideal,
        ..scenario::default_emulator()
    };
    let steer = (!a.no_steer).then(|| placed.clone());
    let tess_part = (|| -> anyhow::Result<()> {
        if want('A') {
            let mut spec = tess_spec(
                "A",
                "tess: synthesizer in its dedicated cell, alone",
                Interference::NONE,
                duration,
                None,
                a.synth,
            );
            spec.netns = netns.clone();
            spec.emulator = test_equipment.clone();
            spec.steer_receive = steer.clone();
            results.push(scenario::run_scenario(&spec, &env, &launcher)?);
        }
        capacity = run_capacity(
            &tess,
            &env.bin_dir,
            synth_hart,
            if quick { 1.0 } else { 5.0 },
            capacity_s,
        )?;
        if want('B') {
            s.apply(group2.clone())?;
            let mut spec = tess_spec(
                "B",
                "tess: synthesizer in its cell, interference in cells",
                Interference::GROUP2,
                duration,
                a.record.clone(),
                a.synth,
            );
            spec.netns = netns.clone();
            spec.emulator = test_equipment.clone();
            spec.steer_receive = steer.clone();
            let r = scenario::run_scenario(&spec, &env, &launcher);
            s.delete(&[VIDEO_TT, VIDEO_ET, EP[0], EP[1]]);
            results.push(r?);
        }
        Ok(())
    })();
    if let Some(c) = console.as_mut() {
        let _ = c.kill();
        let _ = c.wait();
    }
    s.delete(&[CONSOLE]);
    // The pinned synthesizer cell is deleted explicitly (deleting is the user's own act).
    s.delete(&[SYNTH]);
    tess_part?;
    if want('C') {
        let mut c = scenario::baseline_c(duration);
        c.netns = netns.clone();
        c.emulator = test_equipment.clone();
        results.push(scenario::run_scenario(&c, &env, &PlainLauncher)?);
    }
    if want('D') {
        let mut d = scenario::baseline_d(duration);
        d.synth.harts = Some(vec![synth_hart]);
        d.emulator = test_equipment.clone();
        d.netns = netns.clone();
        results.push(scenario::run_scenario(&d, &env, &PlainLauncher)?);
    }
    for r in results
        .iter_mut()
        .filter(|r| r.spec.name == "A" || r.spec.name == "B")
    {
        // The runner describes placement from command-line flags; in cells tessd places. The
        // link (veth pair or loopback) is the runner's last clause.
        let link = r.layout.rsplit("; ").next().unwrap_or_default().to_string();
        r.layout = format!(
            "synthesizer in dedicated cell {SYNTH} (hart {synth_hart}, {:?}); emulator outside the cells (hart {emulator_hart}, SCHED_FIFO 98){}; {link}",
            a.synth,
            if r.spec.name == "B" { "; interference in cells on the same hart" } else { "" }
        );
    }

    let mut r = Report::new("music");
    r.table(scenario::results_table(&results));
    let mut images = Vec::new();
    for res in &results {
        scenario::add_figures(&mut r, res);
        images.push(scenario::write_histogram(res, &out)?);
    }
    let fraction = capacity["migrator_hart_fraction"]
        .as_f64()
        .unwrap_or(f64::NAN);
    let oscillators = capacity["max_oscillators_per_hart"].as_f64().unwrap_or(0.0);
    r.figure("noise_floor_max_us", floor.summary_us.max);
    if !capacity.is_null() {
        r.figure("migrator_hart_fraction", fraction);
        r.figure("max_oscillators_per_hart", oscillators);
    }
    let get = |name: &str| results.iter().find(|x| x.spec.name == name);
    let mut t = Table::new(
        "capacity of one hart (in the synthesizer's dedicated cell)",
        &["measure", "value", "target"],
    );
    if !capacity.is_null() {
        t.row(&[
            "busy time per package / package period, 32 x 100 oscillators".to_string(),
            format!("{fraction:.4}"),
            "< 0.25".into(),
        ]);
        t.row(&[
            format!("oscillators with zero misses for {capacity_s:.0} s"),
            format!("{oscillators:.0}"),
            ">= 30000".into(),
        ]);
        r.target(
            "full Migrator under 25% of one hart",
            fraction < 0.25,
            format!("{fraction:.4}"),
        );
        let attempts: Vec<String> = capacity["capacity"]["confirmations"]
            .as_array()
            .map(|runs| runs.iter().map(describe_attempt).collect())
            .unwrap_or_default();
        if !attempts.is_empty() {
            r.note(format!(
                "capacity: {capacity_s:.0}-s confirmation attempts (each ends at its first miss): {}",
                attempts.join("; ")
            ));
        }
        if let Some(c) = capacity["capacity"]["confirmed"].as_object() {
            r.note(format!(
                "capacity: {oscillators:.0} oscillators computed every package within its period (busy and CPU time) over {} packages; {} packages were late because the hart was stalled (busy > period, own CPU time not: hypervisor, interrupts), which is not the hart's capacity",
                c["packages"], c["stalls"]
            ));
        }
        r.target(
            "one hart sustains >= 30,000 oscillators",
            oscillators >= 30_000.0,
            format!("{oscillators:.0}"),
        );
    }
    r.table(t);
    if let (Some(ra), Some(rb)) = (get("A"), get("B")) {
        let (pa, pb) = (ra.summary().p999, rb.summary().p999);
        r.target(
            "B misses no more deadlines than A",
            rb.misses() <= ra.misses(),
            format!("B {} vs A {}", rb.misses(), ra.misses()),
        );
        r.target(
            "B p99.9 within 5% of A",
            pb <= pa * 1.05,
            format!(
                "B {pb:.0} us vs A {pa:.0} us ({:+.1}%)",
                (pb / pa - 1.0) * 100.0
            ),
        );
    }
    if let Some(rc) = get("C") {
        let frac = rc.misses() as f64 / rc.device.packages.max(1) as f64;
        r.target(
            "C (plain Linux) misses many deadlines",
            frac > 0.01,
            format!(
                "{} of {} ({:.1}%)",
                rc.misses(),
                rc.device.packages,
                frac * 100.0
            ),
        );
    }
    r.note(format!(
        "hart layout: hart {synth_hart} is dedicated to the synthesizer's cell (scenarios A, B) or holds the SCHED_FIFO 99 synthesizer (D); hart(s) {shared} hold the console service and the interference, in the cells of examples/music/group1.toml and group2.toml (video time-triggered 200 us / 3 ms and event-triggered 2 ms / 33 ms; two best-effort EP cells); C and D run the same programs without cells. The SLABS emulator is test equipment, the same in all four: hart {emulator_hart}, outside the cells, SCHED_FIFO 98, paced by sleeping until 20 us before each packet. {}",
        if a.no_steer || a.loopback {
            "The kernel's receive processing of the synthesizer's packets runs where Linux puts it (the sending hart) in all four.".to_string()
        } else {
            format!("In A and B the kernel's receive processing of the synthesizer's packets is steered to hart {synth_hart} (RPS on the veth, set up by the bench); in C and D it runs where Linux puts it (the sending hart).")
        }
    ));
    r.note(format!("noise floor on hart {synth_hart} (SCHED_FIFO 99, 1 ms wake-ups, idle): median {:.1} us, p99 {:.1} us, max {:.1} us", floor.summary_us.median, floor.summary_us.p99, floor.summary_us.max));
    r.note("response = what a perfectly timed device sees: 680.27 us (the package's ideal duration) + time from the last packet's send (the kernel's transmit stamp) to the answer (tess-slabs --response ideal), so the emulator's own lateness on its shared hart is not charged to the system under test");
    r.note("seed 000 Fig. 7 (Tessellation, 16 hardware threads): Group 1 alone 0 misses, max 1336 us, mean 997.5 us; with Group 2, 0 misses, max 1405 us, mean 1024.6 us");
    r.note(format!(
        "histograms: {}",
        images
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    ));
    if let Some(w) = &a.record {
        r.note(format!(
            "scenario B's audio (8 channels) recorded to {}",
            w.display()
        ));
    }
    r.detail("capacity", capacity);
    r.detail("noise_floor_us", floor.summary_us);
    r.detail("scenarios", &results);
    Ok(r)
}

/// One confirmation attempt of the capacity search, as `N oscillators: S s, OUTCOME`.
fn describe_attempt(run: &serde_json::Value) -> String {
    let seconds =
        run["packages"].as_f64().unwrap_or(0.0) * tess_music::slabs::PACKAGE_PERIOD_NS as f64 / 1e9;
    let outcome = if run["misses"].as_u64() == Some(0) {
        "no miss"
    } else {
        "missed"
    };
    format!(
        "{} oscillators: {seconds:.1} s, {outcome}",
        run["oscillators"]
    )
}
