//! `tess bench audio-device`: the graph engine as the host of seed 001's Ethernet audio device,
//! alone and beside a synthetic application in another cell (seed 001 section 5.3, Table 2),
//! with plain-Linux baselines in the same run.
//!
//! The device ([`emulator`], test equipment) sends a 1296-byte UDP packet (10 channels x 32
//! frames) every 725.6 us; `tess-pd device` runs the Table 2 patch
//! ([`tess_pd::bench::effects_patch`]: eight parallel blocks on the input) one 32-sample block
//! per packet and answers. The response time is the device's, from its send to the kernel's
//! receive stamp of the answer; a packet not answered before the next is due is a miss.
//!
//! Hart layout (the engine's hart is `--hart`, default the highest tessd manages; the others
//! are "the rest"):
//!
//! | scenario | engine | synthetic application (one sorting thread per hart) |
//! |---|---|---|
//! | `alone` | dedicated cell on the engine's hart, `SCHED_FIFO` 99 inside it | none |
//! | `synthetic` | as `alone` | best-effort cell on the rest |
//! | `linux` | plain process, unpinned, `SCHED_OTHER` | plain process, every hart |
//! | `linux-fifo` | `chrt -f 99 taskset -c HART`, idle spinner there | plain process, every hart |
//!
//! The device runs on the lowest of the rest at `SCHED_FIFO` 98 in every scenario, outside the
//! cells, like the paper's second machine. The dedicated cell asks for `idle = spin` (its hart
//! never halts, so a packet wakes the engine at once), and `linux-fifo` gets the same preparation (`tess-idle-spin`), so the comparison
//! with the careful plain-Linux user is like for like.

mod emulator;

use super::net::cells::Guard;
use super::support::{cell_on_hart, pick_hart, sibling_exe, tess_exe, Session};
use super::Common;
use clap::{Args, ValueEnum};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tess_bench::{Report, Summary, Table};
use tess_core::spec::{CellSpec, HartRequest, IdleMode, Policy};
use tess_sched::HartSet;

/// `tess bench audio-device`.
#[derive(Args, Debug, Clone)]
pub struct AudioDeviceArgs {
    #[command(flatten)]
    pub common: Common,
    /// Seconds measured per scenario (the paper ran 5 minutes each); one more second of
    /// warm-up is sent first and not measured. `--quick`: at most 10.
    #[arg(long, default_value_t = 300.0)]
    pub seconds: f64,
    /// Scenarios to run, in this order (comma-separated).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "alone,synthetic,linux,linux-fifo"
    )]
    pub scenarios: Vec<Scenario>,
    /// In the tess scenarios, bind the engine's socket in the tess network service of this
    /// name (start `tess-netd --name NAME` in a cell first): the paper's path, "a guaranteed
    /// communication path to the Ethernet audio device". The plain-Linux baselines keep kernel
    /// sockets. Default: kernel sockets everywhere.
    #[arg(long, value_name = "NAME")]
    pub net_service: Option<String>,
}

/// One arrangement of the engine and the synthetic application (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// tess: the engine in a dedicated cell, alone.
    Alone,
    /// tess: as alone, plus the synthetic application in a best-effort cell.
    Synthetic,
    /// Plain Linux: the engine and the synthetic application as ordinary processes.
    Linux,
    /// Plain Linux, the careful user: the engine SCHED_FIFO 99 pinned, an idle spinner.
    LinuxFifo,
}

impl Scenario {
    /// Figure prefix.
    fn key(self) -> &'static str {
        match self {
            Scenario::Alone => "alone",
            Scenario::Synthetic => "synthetic",
            Scenario::Linux => "linux",
            Scenario::LinuxFifo => "linux_fifo",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Scenario::Alone => "tess: engine in its dedicated cell, alone",
            Scenario::Synthetic => "tess: engine in its cell, synthetic app in another cell",
            Scenario::Linux => "plain Linux: engine and synthetic app as ordinary processes",
            Scenario::LinuxFifo => {
                "plain Linux: engine SCHED_FIFO 99 pinned + idle spinner, synthetic app floating"
            }
        }
    }
}

/// The engine's cell and the synthetic application's.
const ENGINE_CELL: &str = "pd-device-engine";
const SYNTHETIC_CELL: &str = "pd-device-synthetic";
/// Warm-up sent before each measured run (the paper left out the first three blocks).
const WARMUP: Duration = Duration::from_secs(1);

/// What one scenario measured.
struct Outcome {
    scenario: Scenario,
    seen: emulator::Seen,
    /// The response times' summary, us.
    response: Summary,
    /// Each hart's busy time and the hypervisor's steal over the device's run.
    harts: Vec<tess_bench::cpu::HartLoad>,
    engine: Option<tess_pd::device::ServeReport>,
    notes: Vec<String>,
}

/// Runs the benchmark.
pub fn run(a: &AudioDeviceArgs) -> anyhow::Result<Report> {
    anyhow::ensure!(
        a.seconds > 0.0 && a.seconds.is_finite(),
        "--seconds must be positive"
    );
    anyhow::ensure!(!a.scenarios.is_empty(), "--scenarios names none");
    let measure = Duration::from_secs_f64(if a.common.quick {
        a.seconds.min(10.0)
    } else {
        a.seconds
    });
    let mut session = Session::connect().map_err(|e| {
        anyhow::anyhow!("tess bench audio-device needs tessd (scripts/with-tessd): {e}")
    })?;
    let status = session.status()?;
    let engine_hart = pick_hart(a.common.hart, &status)?;
    let online = tess_sched::online_harts()?;
    let rest: HartSet = online.iter().filter(|&h| h != engine_hart).collect();
    let equipment_hart = rest.iter().next().ok_or_else(|| {
        anyhow::anyhow!("the bench needs two harts: one for the engine, one for the device")
    })?;
    let managed_rest: HartSet = status
        .managed
        .iter()
        .filter(|&h| h != engine_hart)
        .collect();
    let dir = tempfile::tempdir()?;
    let patch = dir.path().join("table2-effects.pd");
    std::fs::write(&patch, tess_pd::bench::effects_patch())?;
    let floor = tess_bench::probe::noise_floor(engine_hart, 1000).ok();
    let plan = Plan {
        patch,
        engine_hart,
        equipment_hart,
        managed_rest,
        harts_online: online.len(),
        measure,
        net_service: a.net_service.clone(),
    };
    let mut outcomes = Vec::new();
    for &s in &a.scenarios {
        outcomes.push(plan.run(s, &mut session)?);
    }
    Ok(report(&plan, &outcomes, floor))
}

/// What every scenario shares.
struct Plan {
    patch: PathBuf,
    engine_hart: usize,
    equipment_hart: usize,
    managed_rest: HartSet,
    harts_online: usize,
    measure: Duration,
    net_service: Option<String>,
}

impl Plan {
    fn run(&self, s: Scenario, session: &mut Session) -> anyhow::Result<Outcome> {
        let mut notes = Vec::new();
        let port = {
            let probe = std::net::UdpSocket::bind("127.0.0.1:0")?;
            probe.local_addr()?.port()
        };
        let listen = format!("127.0.0.1:{port}");
        let engine_secs = (WARMUP + self.measure).as_secs_f64() + 1.0;
        let tess = tess_exe();
        let pd = sibling_exe("tess-pd");
        let mut engine_cmd = match s {
            Scenario::Alone | Scenario::Synthetic => {
                // idle = spin, as the music bench's manifest asks for its synthesizer (the
                // default is halt): the same preparation as linux-fifo's idle spinner
                session.apply(vec![CellSpec {
                    idle: Some(IdleMode::Spin),
                    ..cell_on_hart(ENGINE_CELL, Policy::Dedicated, self.engine_hart)
                }])?;
                let mut c = Command::new(&tess);
                c.args(["run", "--cell", ENGINE_CELL, "--"]).arg(&pd);
                c
            }
            Scenario::Linux => Command::new(&pd),
            // the careful user's chrt; inside the cell the engine sets the same priority itself
            // (below), as the music bench's synthesizer does
            Scenario::LinuxFifo => {
                let mut c = Command::new("chrt");
                c.args(["-f", "99", "taskset", "-c", &self.engine_hart.to_string()])
                    .arg(&pd);
                c
            }
        };
        engine_cmd.arg("device").arg(&self.patch);
        if matches!(s, Scenario::Alone | Scenario::Synthetic) {
            engine_cmd.args(["--rt-priority", "99"]);
            if let Some(n) = &self.net_service {
                engine_cmd.args(["--net-service", n]);
            }
        }
        engine_cmd
            .args([
                "--listen",
                &listen,
                "--seconds",
                &format!("{engine_secs:.3}"),
                "--json",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut engine =
            Guard(Some(engine_cmd.spawn().map_err(|e| {
                anyhow::anyhow!("starting {}: {e}", pd.display())
            })?));
        wait_ready(engine.0.as_mut().expect("started"))?;
        let _spinner = match s {
            Scenario::LinuxFifo => Some(Guard(Some(
                Command::new(sibling_exe("tess-idle-spin"))
                    .args(["--hart", &self.engine_hart.to_string()])
                    .stdout(Stdio::null())
                    .spawn()
                    .map_err(|e| anyhow::anyhow!("starting tess-idle-spin: {e}"))?,
            ))),
            _ => None,
        };
        let _synthetic = match s {
            Scenario::Alone => None,
            Scenario::Synthetic => {
                anyhow::ensure!(
                    !self.managed_rest.is_empty(),
                    "tessd manages no hart besides the engine's {}: nowhere for the synthetic application's cell",
                    self.engine_hart
                );
                session.apply(vec![CellSpec {
                    harts: HartRequest::Ids(self.managed_rest.clone()),
                    ..cell_on_hart(SYNTHETIC_CELL, Policy::BestEffort { weight: 100 }, 0)
                }])?;
                let threads = self.managed_rest.len().to_string();
                Some(Guard(Some(
                    Command::new(&tess)
                        .args(["run", "--cell", SYNTHETIC_CELL, "--", &tess, "work", "sort"])
                        .args(["--threads", &threads])
                        .spawn()?,
                )))
            }
            Scenario::Linux | Scenario::LinuxFifo => Some(Guard(Some(
                Command::new(&tess)
                    .args(["work", "sort", "--threads", &self.harts_online.to_string()])
                    .spawn()?,
            ))),
        };
        // let the synthetic application's sorts fill the caches before the device starts
        std::thread::sleep(Duration::from_millis(300));
        let before = tess_bench::cpu::ticks();
        let seen = emulator::run(listen.parse()?, self.equipment_hart, WARMUP, self.measure)?;
        let harts = tess_bench::cpu::loads(&before, &tess_bench::cpu::ticks());
        drop(_synthetic);
        drop(_spinner);
        let engine_report = collect_engine(&mut engine, Duration::from_secs(5));
        match &engine_report {
            Ok(_) => {}
            Err(e) => notes.push(format!(
                "{}: the engine's own report is missing: {e}",
                s.key()
            )),
        }
        session.delete(&[SYNTHETIC_CELL, ENGINE_CELL]);
        if seen.unstamped > 0 {
            notes.push(format!(
                "{}: {} answers had no kernel receive stamp and were timed in user space",
                s.key(),
                seen.unstamped
            ));
        }
        Ok(Outcome {
            scenario: s,
            response: Summary::of_ns_as_us(&seen.response_ns),
            seen,
            harts,
            engine: engine_report.ok(),
            notes,
        })
    }
}

/// Waits until the engine says it serves (its first stderr line), forwarding its stderr.
fn wait_ready(child: &mut Child) -> anyhow::Result<()> {
    let err = child.stderr.take().expect("piped");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if line.contains("serving the audio device") {
                let _ = tx.send(());
            } else {
                eprintln!("tess-pd: {line}");
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(10)).map_err(|_| {
        anyhow::anyhow!("tess-pd device did not start serving within 10 s (see its errors above)")
    })
}

/// Waits up to `patience` for the engine to finish and parses its JSON report.
fn collect_engine(
    engine: &mut Guard,
    patience: Duration,
) -> anyhow::Result<tess_pd::device::ServeReport> {
    let mut child = engine.0.take().expect("started");
    let until = Instant::now() + patience;
    while child.try_wait()?.is_none() {
        if Instant::now() > until {
            let _ = child.kill();
            let _ = child.wait();
            anyhow::bail!("it did not stop within {patience:?} of the last packet");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output()?;
    anyhow::ensure!(out.status.success(), "it failed ({})", out.status);
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// The paper's Table 2 (us): alone (min, mean, max), beside the synthetic application.
const PAPER_ALONE: (f64, f64, f64) = (107.0, 110.0, 119.0);
const PAPER_SYNTHETIC: (f64, f64, f64) = (107.0, 110.0, 121.0);

fn report(
    plan: &Plan,
    outcomes: &[Outcome],
    floor: Option<tess_bench::probe::WakeupProbe>,
) -> Report {
    let mut r = Report::new("audio-device");
    let period_us = tess_pd::device::period_ns() / 1e3;
    let mut t = Table::new(
        format!(
            "response time as the device sees it (us), one packet every {period_us:.1} us; miss = answered after the next packet was due, or never"
        ),
        &[
            "scenario", "packets", "misses", "lost", "min", "mean", "median", "p99", "p99.9", "max",
            "engine p99", "send late p99", "steal ms",
        ],
    );
    for o in outcomes {
        let k = o.scenario.key();
        let sum = o.response;
        let late = Summary::of_ns_as_us(&o.seen.send_late_ns);
        r.figure(format!("{k}_packets"), o.seen.measured as f64);
        r.figure(format!("{k}_misses"), o.seen.misses() as f64);
        r.figure(format!("{k}_lost"), o.seen.lost as f64);
        r.figure(format!("{k}_bad_answers"), o.seen.bad_answers as f64);
        r.figure(format!("{k}_min_us"), sum.min);
        r.figure(format!("{k}_mean_us"), sum.mean);
        r.figure(format!("{k}_median_us"), sum.median);
        r.figure(format!("{k}_p99_us"), sum.p99);
        r.figure(format!("{k}_p999_us"), sum.p999);
        r.figure(format!("{k}_max_us"), sum.max);
        r.figure(format!("{k}_send_late_p99_us"), late.p99);
        let steal: f64 = o.harts.iter().map(|h| h.steal_ms).sum();
        r.figure(format!("{k}_steal_ms"), steal);
        if let Some(e) = &o.engine {
            r.figure(format!("{k}_engine_turnaround_p99_us"), e.turnaround_p99_us);
        }
        t.row(&[
            o.scenario.describe().to_string(),
            o.seen.measured.to_string(),
            o.seen.misses().to_string(),
            o.seen.lost.to_string(),
            format!("{:.1}", sum.min),
            format!("{:.1}", sum.mean),
            format!("{:.1}", sum.median),
            format!("{:.1}", sum.p99),
            format!("{:.1}", sum.p999),
            format!("{:.0}", sum.max),
            o.engine
                .as_ref()
                .map_or("-".into(), |e| format!("{:.1}", e.turnaround_p99_us)),
            format!("{:.1}", late.p99),
            o.harts
                .iter()
                .map(|h| format!("{}: {:.0}", h.hart, h.steal_ms))
                .collect::<Vec<_>>()
                .join(", "),
        ]);
        for n in &o.notes {
            r.note(n.clone());
        }
    }
    r.table(t);
    let get = |s: Scenario| outcomes.iter().find(|o| o.scenario == s);
    let has = |s: Scenario| get(s).is_some();
    let linux_fifo = "SCHED_FIFO 99 pinned + idle spinner, the same sorting app floating";
    for (what, fig, paper) in [
        ("mean", "mean_us", (PAPER_ALONE.1, PAPER_SYNTHETIC.1)),
        ("max", "max_us", (PAPER_ALONE.2, PAPER_SYNTHETIC.2)),
        ("min", "min_us", (PAPER_ALONE.0, PAPER_SYNTHETIC.0)),
    ] {
        if has(Scenario::Alone) {
            r.compare(
                format!("response {what}, music app alone (us)"),
                Some(&format!("seed 001 Table 2: {}", paper.0)),
                format!("alone_{fig}"),
                None,
            );
        }
        if has(Scenario::Synthetic) {
            r.compare(
                format!("response {what}, beside the synthetic app in another cell (us)"),
                Some(&format!("seed 001 Table 2: {}", paper.1)),
                format!("synthetic_{fig}"),
                has(Scenario::LinuxFifo).then_some((&*format!("linux_fifo_{fig}"), linux_fifo)),
            );
        }
    }
    if has(Scenario::Synthetic) {
        r.compare(
            "misses beside the synthetic app (packets answered after the next was due, or never)",
            None,
            "synthetic_misses",
            if has(Scenario::LinuxFifo) {
                Some(("linux_fifo_misses", linux_fifo))
            } else if has(Scenario::Linux) {
                Some(("linux_misses", "plain processes, the same sorting app"))
            } else {
                None
            },
        );
    }
    if let (Some(a), Some(b)) = (get(Scenario::Alone), get(Scenario::Synthetic)) {
        let (sa, sb) = (a.response, b.response);
        r.target(
            "synthetic p99 <= 1.10 x alone p99 (no significant difference, as Table 2)",
            sb.p99 <= 1.10 * sa.p99,
            format!(
                "{:.1} vs {:.1} us ({:+.1}%)",
                sb.p99,
                sa.p99,
                (sb.p99 / sa.p99 - 1.0) * 100.0
            ),
        );
        let allowance = (b.seen.measured as f64 * 0.001).ceil() as u64;
        r.target(
            "synthetic misses <= alone misses + 0.1% of packets",
            b.seen.misses() <= a.seen.misses() + allowance,
            format!("{} vs {} + {allowance}", b.seen.misses(), a.seen.misses()),
        );
    }
    if let (Some(b), Some(d)) = (get(Scenario::Synthetic), get(Scenario::LinuxFifo)) {
        let (sb, sd) = (b.response, d.response);
        r.target(
            "synthetic (tess) p99 <= linux-fifo p99 (the careful plain-Linux user)",
            sb.p99 <= sd.p99,
            format!("{:.1} vs {:.1} us", sb.p99, sd.p99),
        );
    }
    if let Some(f) = floor {
        let f = f.summary_us;
        r.figure("noise_floor_p99_us", f.p99);
        r.figure("noise_floor_max_us", f.max);
        r.note(format!(
            "noise floor on hart {} (SCHED_FIFO 99, 1 ms wake-ups, idle): median {:.1} us, p99 {:.1} us, max {:.1} us",
            plan.engine_hart, f.median, f.p99, f.max
        ));
    }
    r.note(format!(
        "hart {} runs the engine; the device (test equipment, SCHED_FIFO 98, outside the cells) runs on hart {}; the synthetic app sorts 1 Mi keys per thread, one thread per hart of its cell (tess) or per hart online (plain Linux)",
        plan.engine_hart, plan.equipment_hart
    ));
    r.note(format!(
        "{:.0} s measured per scenario after {:.0} s of warm-up; the patch is seed 001's eight parallel blocks (tess_pd::bench::effects_patch), run serially at 32-sample blocks and 44.1 kHz over loopback UDP",
        plan.measure.as_secs_f64(),
        WARMUP.as_secs_f64()
    ));
    r.note(match &plan.net_service {
        Some(n) => format!("the tess scenarios' engine reaches the device through network service {n} (tess-netd); the plain-Linux ones through kernel sockets"),
        None => "every engine reaches the device through a kernel socket of its own (--net-service NAME puts the tess scenarios' socket in the network service)".into(),
    });
    r.note("response = the kernel's receive stamp of the answer minus the device's send time; engine p99 = the engine's own arrival-to-answer time; send late = the device's pacing error (never charged to the host); steal ms = per hart, the time the hypervisor kept the vCPU off the host CPU during the scenario (/proc/stat): stalls no Linux setting prevents");
    r
}
