//! `tess bench rtapp`: activation jitter of periodic tasks (seed 002, AQuoSA's RTApp experiment).
//!
//! The paper runs a periodic thread (RTApp, 40 ms period) and reports how far each activation
//! falls from its ideal instant on the timer grid: with no reservation a second instance pushes
//! it to 92 ms (more than two periods); under `qres_wrap` (25% of the CPU each) it stays at 11 ms.
//!
//! Here Debian's `rt-app` plays RTApp. The bench writes one rt-app JSON workload per task (kept
//! in `--out`, one file per task and scenario, for the reader to rerun): a single phase looping
//! "run C us of calibrated work, then wait for an absolute periodic timer of P us". Four tasks,
//! rate-monotonic order, 60% of one hart in total (see [`TASKS`]).
//!
//! Hart layout: the plain-Linux scenarios run every task on one hart `H` (`--hart`, default the
//! highest hart tessd manages); under tess, tessd places each reservation (`tess run` has no hart
//! choice) and may spread them over its managed harts, so the interference is the same on every
//! managed hart: [`HOGS`] CPU-bound `SCHED_OTHER` threads (`tess work load`) pinned to each, for
//! the whole run. The hogs start after rt-app's loop calibration (done once, on `H`, on the
//! quiet machine, so that every scenario runs the same number of loops per job). Each
//! task is its own rt-app process, so that it can have a reservation of its own, and the three
//! scenarios run one after the other with the same hogs:
//!
//! - `tess`: each process under `tess run --reserve BUDGET/PERIOD` (budget = run time x 1.25 +
//!   100 us, period = the task's period), the `qres_wrap` of the paper. tessd places the
//!   reservations; the bench records the hart each task ran on and warns if it is not `H`.
//!   Event-triggered cells let their harts idle (no spinner), so no scenario has one.
//! - `cfs`: plain Linux, each process pinned to `H` (rt-app's `cpus`), nice 0 like the hogs.
//! - `fifo`: the careful plain-Linux user: `chrt -f PRIO`, rate-monotonic priorities (shorter
//!   period, higher priority, from 80 down), pinned to `H`. The best Linux offers without tess.
//!
//! No scenario locks memory (rt-app's `lock_pages` is off everywhere): the preparation is the same.
//!
//! Activation jitter, per job, from rt-app's per-period log: a job that finished before the next
//! timer instant slept until it, and `wu_lat` is how late it woke; one that overran (`slack` < 0)
//! starts the next job at once, `-slack` after the ideal instant. A deadline miss is a job with
//! `slack` < 0 (implicit deadline = period). rt-app logs the line of job `k` when it wakes for
//! job `k+1`, so each line gives the lateness of the next activation. The timer never drops a
//! backlog, so a task that cannot keep up (more work than CPU time per period) falls further
//! behind with every job and its jitter grows with the run's length: compare such scenarios by
//! their miss fraction, not by their jitter.
//!
//! The report also records, sampled half-way, each tess task's threads and their scheduling
//! (rt-app runs the task on a thread of its own beside an idle main thread), so a reader sees how
//! the reservation reached the thread that needs it.

use super::support::{pick_hart, spawn_work, stop, tess_exe, us, Session};
use super::Common;
use anyhow::Context as _;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tess_bench::{Report, Summary, Table};
use tess_sched::HartSet;

/// CPU-bound interference threads on each managed hart (the paper's interference was other
/// nice-0 Linux activity and a second RTApp; 8 hogs give a plain nice-0 task 1/9 of the hart).
pub const HOGS: usize = 8;

/// One periodic rt-app task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Task {
    /// Thread name in rt-app (also names the log file).
    pub name: &'static str,
    /// Period (= implicit deadline), microseconds.
    pub period_us: u64,
    /// Calibrated work per job, microseconds (on the quiet hart).
    pub run_us: u64,
}

/// The task set: 20% + 20% + 10% + 10% = 60% of one hart, periods 5-100 ms (the paper's 40 ms
/// among them), in rate-monotonic order.
pub const TASKS: [Task; 4] = [
    Task {
        name: "t5ms",
        period_us: 5_000,
        run_us: 1_000,
    },
    Task {
        name: "t10ms",
        period_us: 10_000,
        run_us: 2_000,
    },
    Task {
        name: "t40ms",
        period_us: 40_000,
        run_us: 4_000,
    },
    Task {
        name: "t100ms",
        period_us: 100_000,
        run_us: 10_000,
    },
];

impl Task {
    /// The reservation budget: the run time with a margin for the VM's slower moments and
    /// rt-app's own bookkeeping.
    pub fn budget_us(&self) -> u64 {
        self.run_us * 5 / 4 + 100
    }
}

/// The three scenarios, in run order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// `tess run --reserve` per task.
    Tess,
    /// Plain CFS, pinned.
    Cfs,
    /// `chrt -f`, rate-monotonic priorities, pinned.
    Fifo,
}

impl Scenario {
    const ALL: [Scenario; 3] = [Scenario::Tess, Scenario::Cfs, Scenario::Fifo];

    /// Short name, used in figure names and file names.
    pub fn key(self) -> &'static str {
        match self {
            Scenario::Tess => "tess",
            Scenario::Cfs => "cfs",
            Scenario::Fifo => "fifo",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Scenario::Tess => "tess run --reserve (one reservation per task)",
            Scenario::Cfs => "plain Linux CFS, pinned",
            Scenario::Fifo => "plain Linux chrt -f, RM priorities, pinned",
        }
    }
}

/// Rate-monotonic SCHED_FIFO priority of task `index` of [`TASKS`] (sorted by period).
pub fn fifo_priority(index: usize) -> u32 {
    80 - index as u32
}

/// The rt-app workload of one task: one thread, one looping phase of `run` then an absolute
/// periodic `timer` (an overrun job does not shift later activations off the grid).
/// `ns_per_loop` skips rt-app's calibration so every scenario does the same work per job;
/// `hart` pins the thread (plain-Linux scenarios), `fifo_prio` makes it SCHED_FIFO.
pub fn workload_json(
    task: &Task,
    duration_s: u64,
    ns_per_loop: u64,
    logdir: &Path,
    basename: &str,
    hart: Option<usize>,
    fifo_prio: Option<u32>,
) -> serde_json::Value {
    let mut thread = json!({
        "phases": {
            "periodic": {
                "loop": -1,
                "run": task.run_us,
                "timer": { "ref": format!("tick_{}", task.name), "period": task.period_us, "mode": "absolute" }
            }
        }
    });
    if let Some(h) = hart {
        thread["cpus"] = json!([h]);
    }
    if let Some(p) = fifo_prio {
        thread["policy"] = json!("SCHED_FIFO");
        thread["priority"] = json!(p);
    }
    let mut tasks = serde_json::Map::new();
    tasks.insert(task.name.to_string(), thread);
    json!({
        "global": {
            "duration": duration_s,
            "calibration": ns_per_loop,
            "default_policy": "SCHED_OTHER",
            "lock_pages": false,
            "logdir": logdir.display().to_string(),
            "log_basename": basename,
            "ftrace": false,
            "gnuplot": false
        },
        "tasks": tasks
    })
}

/// One job's line of an rt-app log, reduced to what the jitter needs (microseconds).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Job {
    /// Time from the end of the job's work to its deadline (negative: a miss).
    pub slack_us: i64,
    /// Wake-up latency after the timer (0 when the job overran and did not sleep).
    pub wu_lat_us: i64,
}

impl Job {
    /// How late the next activation is against the timer grid (see the module docs).
    pub fn activation_jitter_us(&self) -> f64 {
        if self.slack_us < 0 {
            (-self.slack_us + self.wu_lat_us.max(0)) as f64
        } else {
            self.wu_lat_us.max(0) as f64
        }
    }

    /// Whether the job finished after its deadline.
    pub fn missed(&self) -> bool {
        self.slack_us < 0
    }
}

/// Parses an rt-app per-thread log (`#idx perf run period start end rel_st slack c_duration
/// c_period wu_lat`); columns are found by the header's names.
pub fn parse_log(text: &str) -> anyhow::Result<Vec<Job>> {
    let mut cols: Option<(usize, usize)> = None;
    let mut jobs = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(h) = line.strip_prefix('#') {
            let names: Vec<&str> = h.split_whitespace().collect();
            if names.first() == Some(&"idx") {
                let at = |n: &str| names.iter().position(|x| *x == n);
                cols = Some((
                    at("slack").context("rt-app log header has no slack column")?,
                    at("wu_lat").context("rt-app log header has no wu_lat column")?,
                ));
            }
            continue;
        }
        let (slack, wu) = cols.context("rt-app log has data before its #idx header")?;
        let f: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| -> anyhow::Result<i64> {
            f.get(i)
                .with_context(|| format!("short rt-app log line {line:?}"))?
                .parse::<i64>()
                .with_context(|| format!("bad number in rt-app log line {line:?}"))
        };
        jobs.push(Job {
            slack_us: num(slack)?,
            wu_lat_us: num(wu)?,
        });
    }
    Ok(jobs)
}

/// Extracts rt-app's calibration (`pLoad = 15ns`) from its output.
pub fn parse_calibration(output: &str) -> Option<u64> {
    let at = output.find("pLoad = ")? + "pLoad = ".len();
    let digits: String = output[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().ok().filter(|&n| n > 0)
}

/// Options of `tess bench rtapp`.
#[derive(clap::Args, Debug, Clone)]
pub struct RtappArgs {
    #[command(flatten)]
    pub common: Common,
    /// Seconds per scenario (default 30; 3 with --quick).
    #[arg(long)]
    pub seconds: Option<u64>,
    /// Directory for the generated rt-app workloads and their logs.
    #[arg(long, default_value = "out/rtapp")]
    pub out: PathBuf,
}

/// Per-scenario result.
#[derive(Debug, Clone, serde::Serialize)]
struct Outcome {
    scenario: &'static str,
    jitter_us: Summary,
    jobs: usize,
    misses: usize,
    per_task: Vec<(String, Summary, usize)>,
    harts: Vec<(String, Option<usize>)>,
    /// Each task's threads and their scheduling, sampled half-way.
    sched: Vec<(String, Vec<String>)>,
}

fn rt_app() -> anyhow::Result<()> {
    match Command::new("rt-app")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(_) => Ok(()),
        Err(e) => anyhow::bail!("cannot run rt-app ({e}); install it with scripts/setup"),
    }
}

/// Runs rt-app's own calibration once on `hart`, on the quiet machine.
fn calibrate(hart: usize, dir: &Path) -> anyhow::Result<u64> {
    let file = dir.join("calibrate.json");
    let w = json!({
        "global": { "duration": 1, "calibration": format!("CPU{hart}"), "logdir": dir.display().to_string(),
                    "log_basename": "calibrate", "log_size": "Disable" },
        "tasks": { "cal": { "cpus": [hart], "phases": { "p": { "loop": 1, "run": 1000 } } } }
    });
    std::fs::write(&file, serde_json::to_vec_pretty(&w)?)?;
    let out = Command::new("rt-app")
        .arg(&file)
        .output()
        .context("running rt-app for calibration")?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    parse_calibration(&text)
        .with_context(|| format!("rt-app printed no calibration (pLoad): {}", text.trim()))
}

/// How each thread of process `pid` is scheduled, e.g. `t5ms SCHED_DEADLINE 1350/5000 us`.
fn policies(pid: u32) -> Vec<String> {
    tess_sched::proc::threads_of(pid as i32)
        .into_iter()
        .filter_map(|tid| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).ok()?;
            let (p, _) = tess_sched::attr::get_policy(tid).ok()?;
            let what = match p {
                tess_sched::Policy::Deadline {
                    runtime, period, ..
                } => format!(
                    "SCHED_DEADLINE {}/{} us",
                    runtime.as_micros(),
                    period.as_micros()
                ),
                tess_sched::Policy::Fifo { priority } => format!("SCHED_FIFO {priority}"),
                other => other.name().to_string(),
            };
            Some(format!("{} {what}", comm.trim()))
        })
        .collect()
}

/// The highest hart any thread of process `pid` last ran on.
fn last_hart(pid: u32) -> Option<usize> {
    tess_sched::proc::threads_of(pid as i32)
        .into_iter()
        .filter_map(tess_sched::proc::last_hart)
        .max()
}

fn run_scenario(
    s: Scenario,
    hart: usize,
    seconds: u64,
    ns_per_loop: u64,
    dir: &Path,
) -> anyhow::Result<Outcome> {
    let mut children: Vec<(String, Child)> = Vec::new();
    type Sampled = (Vec<(String, Option<usize>)>, Vec<(String, Vec<String>)>);
    let res = (|| -> anyhow::Result<Sampled> {
        for (i, t) in TASKS.iter().enumerate() {
            let pinned = (s != Scenario::Tess).then_some(hart);
            let prio = (s == Scenario::Fifo).then(|| fifo_priority(i));
            let w = workload_json(t, seconds, ns_per_loop, dir, s.key(), pinned, prio);
            let file = dir.join(format!("{}-{}.json", s.key(), t.name));
            std::fs::write(&file, serde_json::to_vec_pretty(&w)?)?;
            let _ = std::fs::remove_file(dir.join(format!("{}-{}-0.log", s.key(), t.name)));
            let mut cmd = match s {
                Scenario::Tess => {
                    let mut c = Command::new(tess_exe());
                    // Every reservation on the measured hart, like the baselines' pinning
                    // (and group servers share one hart, docs/architecture.md).
                    c.args([
                        "run",
                        "--reserve",
                        &format!("{}us/{}us", t.budget_us(), t.period_us),
                        "--hart-ids",
                        &hart.to_string(),
                        "--",
                        "rt-app",
                    ]);
                    c
                }
                Scenario::Cfs => Command::new("rt-app"),
                Scenario::Fifo => {
                    let mut c = Command::new("chrt");
                    c.args(["-f", &fifo_priority(i).to_string(), "rt-app"]);
                    c
                }
            };
            cmd.arg(&file).stdout(Stdio::null()).stderr(Stdio::piped());
            let child = cmd
                .spawn()
                .with_context(|| format!("starting {} for {}", s.key(), t.name))?;
            children.push((t.name.to_string(), child));
        }
        // Where the tasks run, sampled half-way.
        std::thread::sleep(Duration::from_millis(seconds * 500));
        let harts = children
            .iter()
            .map(|(n, c)| (n.clone(), last_hart(c.id())))
            .collect();
        let sched = children
            .iter()
            .map(|(n, c)| (n.clone(), policies(c.id())))
            .collect();
        let deadline = Instant::now() + Duration::from_secs(seconds + 20);
        for (name, c) in children.iter_mut() {
            loop {
                if let Some(st) = c.try_wait()? {
                    if !st.success() {
                        let mut err = String::new();
                        if let Some(e) = c.stderr.as_mut() {
                            use std::io::Read as _;
                            let _ = e.read_to_string(&mut err);
                        }
                        anyhow::bail!(
                            "rt-app for {name} ({}) failed ({st}): {}",
                            s.key(),
                            err.trim()
                        );
                    }
                    break;
                }
                anyhow::ensure!(
                    Instant::now() < deadline,
                    "rt-app for {name} ({}) did not finish",
                    s.key()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok((harts, sched))
    })();
    for (_, c) in children {
        stop(c);
    }
    let (harts, sched) = res?;

    let mut all = Vec::new();
    let mut misses = 0;
    let mut per_task = Vec::new();
    for t in TASKS.iter() {
        let log = dir.join(format!("{}-{}-0.log", s.key(), t.name));
        let text = std::fs::read_to_string(&log)
            .with_context(|| format!("reading rt-app log {}", log.display()))?;
        let jobs = parse_log(&text)?;
        let j: Vec<f64> = jobs.iter().map(Job::activation_jitter_us).collect();
        let m = jobs.iter().filter(|j| j.missed()).count();
        misses += m;
        per_task.push((t.name.to_string(), Summary::of(&j), m));
        all.extend(j);
    }
    Ok(Outcome {
        scenario: s.key(),
        jitter_us: Summary::of(&all),
        jobs: all.len(),
        misses,
        per_task,
        harts,
        sched,
    })
}

/// Runs the benchmark.
pub fn run(a: &RtappArgs) -> anyhow::Result<Report> {
    let c = &a.common;
    rt_app()?;
    let mut s = Session::connect()?;
    let status = s.status()?;
    let hart = pick_hart(c.hart, &status)?;
    let seconds = a.seconds.unwrap_or(if c.quick { 3 } else { 30 });
    std::fs::create_dir_all(&a.out)?;
    let dir = std::fs::canonicalize(&a.out)?;
    let ns_per_loop = calibrate(hart, &dir)?;

    // The same interference on every hart tessd may place a reservation on (module docs).
    let mut hogs = Vec::new();
    let res = (|| -> anyhow::Result<Vec<Outcome>> {
        for h in status.managed.iter() {
            let p = spawn_work(None, &["load".into(), "--threads".into(), HOGS.to_string()])?;
            let pid = p.id() as i32;
            hogs.push(p);
            // Threads created before the affinity change keep the old mask: pin each one, after
            // the process has created them all.
            std::thread::sleep(Duration::from_millis(200));
            for tid in tess_sched::proc::threads_of(pid) {
                tess_sched::affinity::set_affinity(tid, &HartSet::single(h))?;
            }
        }
        std::thread::sleep(Duration::from_millis(500));
        let mut out = Vec::new();
        for sc in Scenario::ALL {
            out.push(run_scenario(sc, hart, seconds, ns_per_loop, &dir)?);
            // Let tessd finish removing the scenario's cells (cpusets, root domains) first.
            std::thread::sleep(Duration::from_millis(1000));
        }
        Ok(out)
    })();
    for h in hogs {
        stop(h);
    }
    drop(s);
    let outcomes = res?;

    let mut r = Report::new("rtapp");
    let mut t = Table::new(
        format!("activation jitter of 4 periodic rt-app tasks (60% of hart {hart}) beside {HOGS} CPU hogs on each managed hart (us)"),
        &["scenario", "jobs", "median", "p99", "max", "deadline misses"],
    );
    for o in &outcomes {
        let sc = Scenario::ALL
            .iter()
            .find(|x| x.key() == o.scenario)
            .copied()
            .unwrap_or(Scenario::Tess);
        let frac = o.misses as f64 / o.jobs.max(1) as f64;
        t.row(&[
            sc.describe().to_string(),
            o.jobs.to_string(),
            us(o.jitter_us.median),
            us(o.jitter_us.p99),
            us(o.jitter_us.max),
            format!("{} ({:.2}%)", o.misses, 100.0 * frac),
        ]);
        let k = o.scenario;
        r.figure(format!("rtapp_{k}_jitter_median_us"), o.jitter_us.median);
        r.figure(format!("rtapp_{k}_jitter_p99_us"), o.jitter_us.p99);
        r.figure(format!("rtapp_{k}_jitter_max_us"), o.jitter_us.max);
        r.figure(format!("rtapp_{k}_miss_fraction"), frac);
    }
    r.table(t);
    let mut pt = Table::new(
        "per task: jitter p99 / max (us), misses",
        &[
            "task",
            "period",
            "run",
            "budget (tess)",
            "tess",
            "cfs",
            "fifo",
        ],
    );
    for (i, task) in TASKS.iter().enumerate() {
        let cell = |o: &Outcome| {
            let (_, sm, m) = &o.per_task[i];
            format!("{} / {} / {}", us(sm.p99), us(sm.max), m)
        };
        let mut row = vec![
            task.name.to_string(),
            format!("{} ms", task.period_us / 1000),
            format!("{} us", task.run_us),
            format!("{} us", task.budget_us()),
        ];
        row.extend(outcomes.iter().map(cell));
        pt.row(&row);
    }
    r.table(pt);

    let fifo = (
        "rtapp_fifo_jitter_max_us",
        "chrt -f RM priorities, pinned, same hogs",
    );
    r.compare(
        "activation jitter max (us)",
        Some("seed 002 (RTApp, 40 ms period, whole ms): max 11 ms under qres_wrap 25% while a second RTApp starts; 4 ms undisturbed"),
        "rtapp_tess_jitter_max_us",
        Some(fifo),
    );
    r.compare(
        "activation jitter p99 (us)",
        None,
        "rtapp_tess_jitter_p99_us",
        Some((
            "rtapp_fifo_jitter_p99_us",
            "chrt -f RM priorities, pinned, same hogs",
        )),
    );
    r.compare(
        "deadline-miss fraction",
        None,
        "rtapp_tess_miss_fraction",
        Some((
            "rtapp_fifo_miss_fraction",
            "chrt -f RM priorities, pinned, same hogs",
        )),
    );
    r.compare(
        "activation jitter max without any reservation, plain CFS (us)",
        Some("seed 002: 92 ms (nice -19) when a second RTApp starts"),
        "rtapp_cfs_jitter_max_us",
        None,
    );
    for o in &outcomes {
        let off: Vec<String> = o
            .harts
            .iter()
            .filter(|(_, h)| *h != Some(hart))
            .map(|(n, h)| format!("{n} on {}", h.map_or("?".into(), |h| h.to_string())))
            .collect();
        if !off.is_empty() {
            r.note(format!(
                "{}: not every task ran on hart {hart} (sampled half-way): {}",
                o.scenario,
                off.join(", ")
            ));
        }
    }
    r.note(format!(
        "{HOGS} CPU-bound SCHED_OTHER hogs pinned to each managed hart ({}) for all scenarios; plain-Linux tasks pinned to hart {hart}, tess reservations placed by tessd; {seconds} s per scenario; rt-app calibrated once on the quiet hart ({ns_per_loop} ns per loop); workloads and logs in {}",
        status.managed,
        dir.display()
    ));
    if let Some(o) = outcomes.iter().find(|o| o.scenario == "tess") {
        let list: Vec<String> = o
            .sched
            .iter()
            .map(|(n, th)| format!("{n}: [{}]", th.join(", ")))
            .collect();
        r.note(format!(
            "tess: threads of each rt-app process and their scheduling, sampled half-way (rt-app has a main thread besides the task's): {}",
            list.join("; ")
        ));
    }
    r.note("jitter per job = wu_lat after the absolute timer, or -slack when the previous job overran; a miss is slack < 0 (module docs)");
    r.detail("outcomes", &outcomes);
    r.detail("tasks", TASKS.iter().map(|t| json!({"name": t.name, "period_us": t.period_us, "run_us": t.run_us, "budget_us": t.budget_us()})).collect::<Vec<_>>());
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A log in rt-app 1.0's format (header as it prints it), with one overrun job.
    const LOG: &str = "# Policy : SCHED_OTHER priority : 0
#idx     perf      run   period           start             end          rel_st      slack c_duration   c_period     wu_lat
   0   100000     2147    10070       520656611       520666681             512       7781       2000      10000        128
   0   100000     2195     9977       520666698       520676675           10599       7657       2000      10000        122
   0   100000    12166    12993       520676685       520689678           20586      -2700       2000      10000          0
";

    #[test]
    fn log_parses_into_jitter_and_misses() {
        let jobs = parse_log(LOG).unwrap();
        assert_eq!(jobs.len(), 3);
        let j: Vec<f64> = jobs.iter().map(Job::activation_jitter_us).collect();
        assert_eq!(j, vec![128.0, 122.0, 2700.0]);
        assert_eq!(jobs.iter().filter(|j| j.missed()).count(), 1);
    }

    #[test]
    fn log_without_header_is_an_error() {
        assert!(parse_log("   0 1 2 3 4 5 6 7 8 9 10\n").is_err());
    }

    #[test]
    fn calibration_is_read_from_output() {
        assert_eq!(
            parse_calibration("[rt-app] <notice> pLoad = 15ns : calib_cpu 1\n"),
            Some(15)
        );
        assert_eq!(parse_calibration("nothing"), None);
    }

    #[test]
    fn workload_has_absolute_timer_pinning_and_policy() {
        let w = workload_json(
            &TASKS[2],
            3,
            15,
            Path::new("/tmp/x"),
            "fifo",
            Some(1),
            Some(fifo_priority(2)),
        );
        let t = &w["tasks"]["t40ms"];
        assert_eq!(t["cpus"], json!([1]));
        assert_eq!(t["policy"], "SCHED_FIFO");
        assert_eq!(t["priority"], 78);
        let p = &t["phases"]["periodic"];
        assert_eq!(p["run"], 4000);
        assert_eq!(p["timer"]["period"], 40_000);
        assert_eq!(p["timer"]["mode"], "absolute");
        assert_eq!(w["global"]["calibration"], 15);
        assert_eq!(w["global"]["duration"], 3);
        assert_eq!(w["global"]["log_basename"], "fifo");
        let plain = workload_json(&TASKS[0], 3, 15, Path::new("/tmp/x"), "tess", None, None);
        assert!(plain["tasks"]["t5ms"].get("cpus").is_none());
        assert!(plain["tasks"]["t5ms"].get("policy").is_none());
    }

    #[test]
    fn task_set_fits_one_hart_with_reservations() {
        let util: f64 = TASKS
            .iter()
            .map(|t| t.budget_us() as f64 / t.period_us as f64)
            .sum();
        assert!(util < 0.9, "reserved utilisation {util}");
        assert!(TASKS.windows(2).all(|w| w[0].period_us < w[1].period_us));
        assert!(TASKS.iter().all(|t| t.budget_us() > t.run_us));
    }
}
