//! A reservation belongs to the program, not to each thread (issue 11 part 7): under CPU hogs,
//! a program whose one busy thread sits beside idle threads gets its whole `--reserve`. Run as
//! root; starts a private tessd.

mod common;

use common::{outcome, read, Daemon};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `tess run --reserve 2ms/10ms` on `hart` of one busy thread and three asleep (`tess work
/// share`, its window `window_ms` long) behind `sh -c`, which stays as a fifth, idle thread.
fn share_program(d: &Daemon, hart: usize, window_ms: u32) -> std::process::Child {
    let tess = common::tess_bin();
    Command::new(&tess)
        .args([
            "run",
            "--reserve",
            "2ms/10ms",
            "--hart-ids",
            &hart.to_string(),
            "--",
        ])
        .args(["sh", "-c"])
        .arg(format!(
            "{} work share --busy=1 --idle=3 --window-ms={window_ms}; true",
            tess.display()
        ))
        .env("TESS_SOCKET", &d.socket)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
#[ignore = "needs root: a private tessd on the real kernel"]
fn a_busy_thread_beside_idle_ones_gets_the_whole_reservation() {
    if !std::path::Path::new("/sys/fs/cgroup/cpu/cpu.rt_runtime_us").exists() {
        // cgroup v2 (no RT group scheduling): the budget is split between threads there.
        eprintln!("skipped: no cgroup v1 RT group scheduling on this host");
        return;
    }
    // Group servers are experimental (off by default: docs/architecture.md, "Reservations
    // belong to cells"); this test turns them on.
    let d = Daemon::start_configured("group-servers = true\n");
    let hart = 1;
    let o = d.tess(&[
        "cell",
        "create",
        "hogs",
        "--policy",
        "best-effort",
        "--hart-ids",
        &hart.to_string(),
    ]);
    assert_eq!(outcome(&o).0, 0, "{}", outcome(&o).1);
    let tess = common::tess_bin();
    let mut hogs = Command::new(&tess)
        .args(["run", "--cell", "hogs", "--"])
        .arg(&tess)
        .args(["work", "load", "--threads=16"])
        .env("TESS_SOCKET", &d.socket)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let prog = share_program(&d, hart, 2000);
    // While it runs, every thread of the program is served by the cell's one RT group server.
    let t0 = Instant::now();
    let threads = loop {
        let run = d.cells().into_iter().find(|c| c.0.starts_with("run-"));
        if let Some((name, _)) = run {
            let v = d.json(&["cell", "show", &name]);
            let th = v["threads"].as_array().unwrap().clone();
            if th.len() >= 5 && th.iter().all(|t| t["sched"] == "SCHED_RR 31") {
                let dir = format!("/sys/fs/cgroup/cpu/{}/cells/{name}", d.group);
                assert_eq!(read(format!("{dir}/cpu.rt_runtime_us")), "2000");
                assert_eq!(read(format!("{dir}/cpu.rt_period_us")), "10000");
                break th;
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "program threads not all served by the cell"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = prog.wait_with_output().unwrap();
    // `tess run` became `tess work load`: one process holds all the hogs.
    let _ = hogs.kill();
    let _ = hogs.wait();
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let share = v["cpu_s"].as_f64().unwrap() / v["wall_s"].as_f64().unwrap();
    // The whole 20% (a per-thread split gave this thread a fifth of it), never much more.
    assert!(
        (0.15..=0.25).contains(&share),
        "the busy thread got {share:.3} of hart {hart} (threads {threads:?})"
    );
}

/// The kernel's `SCHED_DEADLINE` runtime of a thread, if it is a deadline thread.
fn deadline_runtime(tid: i32) -> Option<Duration> {
    match tess_sched::attr::get_policy(tid) {
        Ok((tess_sched::Policy::Deadline { runtime, .. }, _)) => Some(runtime),
        _ => None,
    }
}

#[test]
#[ignore = "needs root: a private tessd on the real kernel"]
fn by_default_the_budget_follows_the_working_thread() {
    // The default mechanism (docs/architecture.md, "Reservations belong to cells"): tessd gives
    // the working threads the budget and idle ones a standby slice, the slices summing to it.
    let d = Daemon::start();
    let hart = tess_sched::online_harts().unwrap().iter().max().unwrap();
    // The worker sleeps 300 ms before its window, so every thread is idle at first.
    let prog = share_program(&d, hart, 3000);
    let budget = Duration::from_millis(2);
    let t0 = Instant::now();
    let mut last = Vec::new();
    let followed = loop {
        if let Some((name, _)) = d.cells().into_iter().find(|c| c.0.starts_with("run-")) {
            let v = d.json(&["cell", "show", &name]);
            let tids: Vec<i32> = v["threads"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["tid"].as_i64().unwrap() as i32)
                .collect();
            let runtimes: Vec<Option<Duration>> =
                tids.iter().map(|&t| deadline_runtime(t)).collect();
            last = runtimes.clone();
            if tids.len() == 5 && runtimes.iter().all(Option::is_some) {
                let mut r: Vec<Duration> = runtimes.into_iter().flatten().collect();
                r.sort();
                let total: Duration = r.iter().sum();
                // Exact admission: the slices never add up to more than the budget (integer
                // division may lose a nanosecond per thread).
                assert!(
                    total <= budget && budget - total <= Duration::from_nanos(5),
                    "{r:?}"
                );
                if r[4] > budget * 9 / 10 {
                    // the others hold small slices: an idle thread its standby slice
                    // (budget / 64), a thread that woke for a moment its measured demand, at
                    // least the kernel-friendly minimum (the demand split, threads/demand.rs).
                    // That demand is what the wake-up cost, not bounded by the standby slice:
                    // 35 us against 31 us on a host with slow context switches (2026-11-28).
                    let small = tess_core::layout::MIN_THREAD_SLICE..=budget / 16;
                    assert!(r[..4].iter().all(|s| small.contains(s)), "{r:?}");
                    break r;
                }
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "the busy thread never got the budget: {last:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = prog.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?} (slices {followed:?})");
}

#[test]
#[ignore = "needs root: a private tessd on the real kernel"]
fn between_working_threads_the_budget_follows_demand() {
    // A greedy thread beside a light one (a tenth of a hart) under `--reserve 4ms/10ms`: an
    // even split would hold the greedy one at 2 ms of every 10 while the light one left most of
    // its 2 ms unused; split by demand, the light one keeps what it uses plus headroom and the
    // greedy one gets the rest (docs/architecture.md, "Reservations belong to cells").
    let d = Daemon::start();
    let hart = tess_sched::online_harts().unwrap().iter().max().unwrap();
    let tess = common::tess_bin();
    let prog = Command::new(&tess)
        .args([
            "run",
            "--reserve",
            "4ms/10ms",
            "--hart-ids",
            &hart.to_string(),
            "--",
        ])
        .arg(&tess)
        .args(["work", "share", "--busy=1", "--light=1", "--window-ms=3000"])
        .env("TESS_SOCKET", &d.socket)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = prog.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let greedy = v["main_cpu_s"].as_f64().unwrap() / v["wall_s"].as_f64().unwrap();
    let all = v["cpu_s"].as_f64().unwrap() / v["wall_s"].as_f64().unwrap();
    // even: at most 0.2 (the kernel enforces it); by demand about 0.4 - 0.13 (the light one's
    // tenth plus headroom; the first samples of the window run on the even split, measured
    // 0.25); never more than the budget
    assert!(
        (0.215..=0.41).contains(&greedy),
        "the greedy thread got {greedy:.3} of hart {hart} (both threads {all:.3})"
    );
}

/// The budget ticks of tessd (`tessd::budget_tick`): name and scheduling policy of each thread
/// named `budget-tick-HART` (`None` while it is still becoming a deadline task).
fn budget_ticks(tessd_pid: u32) -> Vec<(String, Option<tess_sched::Policy>)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(format!("/proc/{tessd_pid}/task")).unwrap() {
        let tid = e.unwrap().file_name().into_string().unwrap();
        let comm = std::fs::read_to_string(format!("/proc/{tessd_pid}/task/{tid}/comm"))
            .unwrap_or_default();
        if comm.trim().starts_with("budget-tick-") {
            let policy = tess_sched::attr::get_policy(tid.parse().unwrap())
                .ok()
                .map(|(p, _)| p)
                .filter(|p| p.is_deadline());
            out.push((comm.trim().to_string(), policy));
        }
    }
    out
}

/// Whether this kernel ends deadline budgets exactly (`HRTICK_DL` on), so tessd needs no ticks.
fn exact_budgets() -> bool {
    std::fs::read_to_string("/sys/kernel/debug/sched/features")
        .is_ok_and(|f| f.split_whitespace().any(|x| x == "HRTICK_DL"))
}

#[test]
#[ignore = "needs root: a private tessd on the real kernel"]
fn a_hart_with_reservations_gets_a_budget_tick_and_loses_it_with_them() {
    let d = Daemon::start();
    let pid = d.pid().unwrap();
    assert!(budget_ticks(pid).is_empty(), "ticks with no reservation");
    let o = d.tess(&[
        "cell",
        "create",
        "et",
        "--policy",
        "event-triggered",
        "--budget",
        "1ms",
        "--period",
        "10ms",
        "--hart-ids",
        "0",
    ]);
    assert_eq!(outcome(&o).0, 0, "{}", outcome(&o).1);
    // The tick thread names itself as it starts, then becomes a deadline task; tessd waits for
    // that before it promotes any thread on the hart, so a change normally returns with the
    // tick in place (its log says when one was late).
    let t0 = Instant::now();
    let mut ticks = budget_ticks(pid);
    let started = |t: &Vec<(String, Option<tess_sched::Policy>)>| {
        !t.is_empty() && t.iter().all(|(_, p)| p.is_some())
    };
    while !started(&ticks) && !exact_budgets() && t0.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(20));
        ticks = budget_ticks(pid);
    }
    if exact_budgets() {
        assert!(ticks.is_empty(), "HRTICK_DL is on, yet tessd runs ticks");
        return;
    }
    assert_eq!(
        ticks.len(),
        1,
        "one tick for hart 0: {ticks:?}\n{}",
        d.log()
    );
    let (name, policy) = &ticks[0];
    assert_eq!(name, "budget-tick-0");
    // 5 us within 20 us, every 200 us (the default).
    assert_eq!(
        *policy,
        Some(tess_sched::Policy::Deadline {
            runtime: Duration::from_micros(5),
            deadline: Duration::from_micros(20),
            period: Duration::from_micros(200),
        })
    );
    // Admission sets the tick's 2.5% aside: beside the 10% cell, 82% more of hart 0 fits
    // (92.5% in all), 83% does not.
    let big = |budget: &str| {
        d.tess(&[
            "cell",
            "create",
            "big",
            "--policy",
            "event-triggered",
            "--budget",
            budget,
            "--period",
            "10ms",
            "--hart-ids",
            "0",
        ])
    };
    assert_ne!(
        outcome(&big("8300us")).0,
        0,
        "admitted beyond the tick's share"
    );
    let o = big("8200us");
    assert_eq!(outcome(&o).0, 0, "{}", outcome(&o).1);
    let o = d.tess(&["cell", "delete", "big"]);
    assert_eq!(outcome(&o).0, 0, "{}", outcome(&o).1);
    let o = d.tess(&["cell", "delete", "et"]);
    assert_eq!(outcome(&o).0, 0, "{}", outcome(&o).1);
    // The transaction that removes the last reservation stops (joins) the tick before it returns.
    assert!(
        budget_ticks(pid).is_empty(),
        "the tick outlived the reservation"
    );
}
