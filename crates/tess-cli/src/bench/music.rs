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
//! other harts: the emulator (test equipment standing in for the paper's second machine, in an
//! event-triggered cell whose short deadline gives it precedence), the console service, and the
//! interference cells. On one shared hart the demand-bound test decides what fits: a
//! time-triggered window gives its cell the hart outright for its length, so windows must be
//! shorter than the emulator's deadline minus its budget (here 500 us windows every 5 ms, beside
//! a 200 us / 725.6 us emulator).

use super::support::{pick_hart, Session};
use super::Common;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tess_bench::{probe, Report, Table};
use tess_core::spec::{CellSpec, HartRequest, IdleMode, Policy};
use tess_music::emulator::Pace;
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
}

const SYNTH: &str = "music-synth";
const SLABS: &str = "music-slabs";
const CONSOLE: &str = "music-console";
const VIDEO_TT: &str = "music-video-tt";
const VIDEO_ET: &str = "music-video-et";
const EP: [&str; 2] = ["music-ep-1", "music-ep-2"];

/// One package of the SLABS protocol: 32 frames at 44.1 kHz.
const PACKAGE: Duration = Duration::from_nanos(725_624);

fn cell(name: &str, policy: Policy, harts: HartSet) -> CellSpec {
    CellSpec {
        name: name.into(),
        policy,
        harts: HartRequest::Ids(harts),
        memory_max: None,
        pids_max: None,
        pinned: false,
        idle: None,
    }
}

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
        Role::Emulator => Some(SLABS),
        Role::Video { index: 0 } => Some(VIDEO_TT),
        Role::Video { .. } => Some(VIDEO_ET),
        Role::BestEffort { index } => Some(EP[*index % EP.len()]),
    }
}

/// The group-1 cells: synthesizer (dedicated), emulator and console service.
fn group1(synth_hart: usize, shared: &HartSet) -> Vec<CellSpec> {
    let mut synth = cell(SYNTH, Policy::Dedicated, HartSet::single(synth_hart));
    synth.pinned = true;
    synth.memory_max = Some(1 << 30);
    // The synthesizer busy-polls its socket: it keeps the hart busy by itself.
    synth.idle = Some(IdleMode::Halt);
    let one = HartSet::single(shared.first().expect("a shared hart"));
    vec![
        synth,
        cell(
            SLABS,
            Policy::EventTriggered {
                period: PACKAGE,
                budget: Duration::from_micros(200),
            },
            one.clone(),
        ),
        cell(CONSOLE, Policy::BestEffort { weight: 100 }, one),
    ]
}

/// The group-2 (interference) cells.
fn group2(shared: &HartSet) -> Vec<CellSpec> {
    let one = HartSet::single(shared.first().expect("a shared hart"));
    let ms = Duration::from_millis;
    vec![
        cell(
            VIDEO_TT,
            Policy::TimeTriggered {
                period: ms(5),
                active: Duration::from_micros(500),
                offset: None,
            },
            one.clone(),
        ),
        cell(
            VIDEO_ET,
            Policy::EventTriggered {
                period: ms(33),
                budget: ms(4),
            },
            one.clone(),
        ),
        cell(EP[0], Policy::BestEffort { weight: 100 }, shared.clone()),
        cell(EP[1], Policy::BestEffort { weight: 100 }, shared.clone()),
    ]
}

fn tess_spec(
    name: &str,
    title: &str,
    interference: Interference,
    duration: Duration,
    record: Option<PathBuf>,
) -> ScenarioSpec {
    ScenarioSpec {
        name: name.into(),
        title: title.into(),
        // The synthesizer owns its hart: one thread does communication and voices, busy-polling.
        synth: SynthPlacement {
            harts: None,
            fifo: None,
            wait: Wait::Poll,
            oscillators: 100,
        },
        // tessd places the emulator's threads and reserves their CPU: no pinning, no FIFO; sleep
        // pacing keeps it inside its budget.
        emulator: EmulatorPlacement {
            hart: None,
            fifo: None,
            pace: Pace::Sleep,
        },
        interference,
        duration,
        warmup: Duration::from_secs(1),
        gesture: None,
        netns: None,
        record,
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

    s.apply(group1(synth_hart, &shared))?;
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
    let tess_part = (|| -> anyhow::Result<()> {
        if want('A') {
            let spec = tess_spec(
                "A",
                "tess: synthesizer in its dedicated cell, alone",
                Interference::NONE,
                duration,
                None,
            );
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
            s.apply(group2(&shared))?;
            let spec = tess_spec(
                "B",
                "tess: synthesizer in its cell, interference in cells",
                Interference::GROUP2,
                duration,
                a.record.clone(),
            );
            let r = scenario::run_scenario(&spec, &env, &launcher);
            s.delete(&[VIDEO_TT, VIDEO_ET, EP[0], EP[1]])?;
            results.push(r?);
        }
        Ok(())
    })();
    if let Some(c) = console.as_mut() {
        let _ = c.kill();
        let _ = c.wait();
    }
    s.delete(&[CONSOLE, SLABS])?;
    // The pinned synthesizer cell is deleted explicitly (deleting is the user's own act).
    s.delete(&[SYNTH])?;
    tess_part?;
    if want('C') {
        results.push(scenario::run_scenario(
            &scenario::baseline_c(duration),
            &env,
            &PlainLauncher,
        )?);
    }
    if want('D') {
        let mut d = scenario::baseline_d(duration);
        d.synth.harts = Some(vec![synth_hart]);
        results.push(scenario::run_scenario(&d, &env, &PlainLauncher)?);
    }

    let mut r = Report::new("music");
    r.table(scenario::results_table(&results));
    let mut images = Vec::new();
    for res in &results {
        scenario::add_figures(&mut r, res);
        images.push(scenario::write_histogram(res, &out)?);
        for n in &res.notes {
            r.note(format!("{}: {n}", res.spec.name));
        }
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
        "hart layout: hart {synth_hart} is dedicated to the synthesizer's cell (scenarios A, B) or holds the SCHED_FIFO 99 synthesizer (D); hart(s) {shared} hold the emulator (event-triggered 200 us / 725.6 us cell), the console service, and the interference (time-triggered 500 us / 5 ms and event-triggered 4 ms / 33 ms video cells, two best-effort EP cells); C and D run the same programs without cells"
    ));
    r.note(format!("noise floor on hart {synth_hart} (SCHED_FIFO 99, 1 ms wake-ups, idle): median {:.1} us, p99 {:.1} us, max {:.1} us", floor.summary_us.median, floor.summary_us.p99, floor.summary_us.max));
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
