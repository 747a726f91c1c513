//! A reservation belongs to the program, not to each thread (issue 11 part 7): under CPU hogs,
//! a program whose one busy thread sits beside idle threads gets its whole `--reserve`. Run as
//! root; starts a private tessd.

mod common;

use common::{outcome, read, Daemon};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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
    // One busy thread, three asleep, behind `sh -c` (which stays as a fifth, idle thread).
    let prog = Command::new(&tess)
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
            "{} work share --busy=1 --idle=3 --window-ms=2000; true",
            tess.display()
        ))
        .env("TESS_SOCKET", &d.socket)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
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
