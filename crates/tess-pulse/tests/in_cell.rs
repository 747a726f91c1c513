//! Pulse in a real cell (root, real kernel, a private tessd): `pulse-cell`, six spinning
//! threads under GRR, runs in a 2-hart time-triggered cell and follows `tess cell resize` from
//! 2 harts to 1 and back: `adapt` is called once per resize with the right counts, no thread is
//! lost, vhart 0 stays the same kernel thread throughout (the one that called `Pulse::run`),
//! vhart 1 is retired and started again, and after each change `tess cell show` has exactly
//! one thread of the program on each hart of the cell, under the cell's reservation. No timing
//! is asserted.
//!
//! Needs `cargo build --workspace` first (for `tess` and `tessd`).
#![cfg(not(loom))]

use std::collections::BTreeSet;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};
use tess_testkit::Tessd;

const CELL: &str = "pulse";

/// The cell as `tess cell show --json` prints it.
fn show(d: &Tessd) -> serde_json::Value {
    let out = d.tess(&["cell", "show", CELL, "--json"]);
    assert!(
        out.status.success(),
        "tess cell show: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Waits until the cell has `harts` harts with exactly one thread of the program on each,
/// under the reservation (`SCHED_DEADLINE`); tessd places threads asynchronously (on fork
/// events and periodically), so a slow machine makes this slower, not flaky.
fn wait_placed(d: &Tessd, harts: usize, log: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = serde_json::Value::Null;
    while Instant::now() < deadline {
        last = show(d);
        if placed_one_per_hart(&last, harts) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!(
        "the cell never had one thread of the program on each of {harts} harts:\n{last:#}\nprogram so far:\n{log}"
    );
}

fn harts_of(v: &serde_json::Value) -> Vec<u64> {
    v.as_array()
        .map(|a| a.iter().filter_map(|h| h.as_u64()).collect())
        .unwrap_or_default()
}

fn placed_one_per_hart(cell: &serde_json::Value, harts: usize) -> bool {
    let cell_harts: BTreeSet<u64> = harts_of(&cell["harts"]).into_iter().collect();
    let Some(threads) = cell["threads"].as_array() else {
        return false;
    };
    let on: Vec<Vec<u64>> = threads.iter().map(|t| harts_of(&t["affinity"])).collect();
    let one_each: BTreeSet<u64> = on.iter().filter(|a| a.len() == 1).map(|a| a[0]).collect();
    cell_harts.len() == harts
        && threads.len() == harts
        && one_each == cell_harts
        && threads.iter().all(|t| {
            t["sched"]
                .as_str()
                .is_some_and(|s| s.starts_with("SCHED_DEADLINE"))
        })
}

/// The program, killed if the test fails before it exits.
struct Program(Option<Child>);

impl Drop for Program {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// What the program has printed so far, read line by line from its stdout (and its stderr, kept
/// for failure messages).
struct Transcript {
    lines: std::sync::mpsc::Receiver<String>,
    text: String,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Transcript {
    fn follow(stdout: std::process::ChildStdout, stderr: std::process::ChildStderr) -> Transcript {
        use std::io::{BufRead, Read};
        let errors = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let e = errors.clone();
        std::thread::spawn(move || {
            let mut text = String::new();
            let mut stderr = stderr;
            let _ = stderr.read_to_string(&mut text);
            e.lock().unwrap().push_str(&text);
        });
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Transcript {
            lines,
            text: String::new(),
            stderr: errors,
        }
    }

    /// Waits until `needle` has been printed `times` times; panics with the transcript after a
    /// generous 30 s.
    fn wait_for(&mut self, needle: &str, times: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.text.matches(needle).count() < times {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.text.push_str(&line);
                    self.text.push('\n');
                }
                Err(_) => panic!(
                    "{needle:?} not printed {times} time(s) in:\n{}\nstderr:\n{}",
                    self.text,
                    self.stderr.lock().unwrap()
                ),
            }
        }
    }

    /// Everything printed, once the program's stdout is closed.
    fn finish(mut self) -> String {
        while let Ok(line) = self.lines.recv() {
            self.text.push_str(&line);
            self.text.push('\n');
        }
        self.text
    }
}

/// The kernel thread ids printed for `vhart`.
fn kernel_threads(text: &str, vhart: usize) -> Vec<i64> {
    let prefix = format!("vhart {vhart} runs on kernel thread ");
    text.lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .filter_map(|t| t.trim().parse().ok())
        .collect()
}

/// A fresh 2-hart time-triggered cell with `pulse-cell --threads 6` running in it, both harts
/// running threads and placed; returns the daemon, the program, its pid, its stdin (closing it
/// ends the program) and its transcript.
fn start_in_cell() -> (Tessd, Program, i64, std::process::ChildStdin, Transcript) {
    let d = Tessd::start();
    d.tess_ok(&[
        "cell",
        "create",
        CELL,
        "--policy",
        "time-triggered",
        "--period",
        "10ms",
        "--active",
        "2ms",
        "--harts",
        "2",
    ]);
    let program = env!("CARGO_BIN_EXE_pulse-cell");
    let mut child = Program(Some(
        d.tess_command(&["run", "--cell", CELL, "--", program, "--threads", "6"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    ));
    let c = child.0.as_mut().unwrap();
    let pid = i64::from(c.id());
    let stdin = c.stdin.take().unwrap();
    let mut t = Transcript::follow(c.stdout.take().unwrap(), c.stderr.take().unwrap());
    t.wait_for(&format!("start cell={CELL} harts=2 threads=6"), 1);
    t.wait_for("vhart 1 runs on kernel thread", 1);
    wait_placed(&d, 2, &t.text);
    (d, child, pid, stdin, t)
}

#[test]
#[ignore = "needs root: a private tessd on the real kernel"]
fn pulse_follows_its_cell_through_resizes() {
    let (d, mut child, pid, stdin, mut t) = start_in_cell();

    d.tess_ok(&["cell", "resize", CELL, "--harts", "1"]);
    t.wait_for("adapt(2 -> 1) ", 1);
    wait_placed(&d, 1, &t.text);

    d.tess_ok(&["cell", "resize", CELL, "--harts", "2"]);
    t.wait_for("adapt(1 -> 2) ", 1);
    // vhart 1 runs again, on a new kernel thread.
    t.wait_for("vhart 1 runs on kernel thread", 2);
    wait_placed(&d, 2, &t.text);

    // Closing its standard input ends the program.
    drop(stdin);
    let status = child.0.take().unwrap().wait().unwrap();
    let stderr = t.stderr.clone();
    let text = t.finish();
    assert!(
        status.success(),
        "the program failed: {text}{}",
        stderr.lock().unwrap()
    );
    // adapt once per resize, with the right counts, on vhart 0.
    let adapts: Vec<&str> = text.lines().filter(|l| l.starts_with("adapt(")).collect();
    assert_eq!(adapts.len(), 2, "adapt once per resize:\n{text}");
    assert!(adapts[0].starts_with("adapt(2 -> 1) "), "{text}");
    assert!(adapts[1].starts_with("adapt(1 -> 2) "), "{text}");
    assert!(adapts.iter().all(|l| l.contains(" on vhart 0 ")), "{text}");
    // vhart 0 is the thread that called Pulse::run (the main thread) from start to end; vhart 1
    // was retired and started again on another kernel thread.
    assert_eq!(kernel_threads(&text, 0), vec![pid], "{text}");
    let v1 = kernel_threads(&text, 1);
    assert_eq!(v1.len(), 2, "{text}");
    assert_ne!(v1[0], v1[1], "{text}");
    // Threads ran on both vharts, then on vhart 0 only, then on both again.
    for want in [
        "phase 0 vharts=[0, 1]",
        "phase 1 vharts=[0]",
        "phase 2 vharts=[0, 1]",
    ] {
        assert!(text.contains(want), "no {want:?} in:\n{text}");
    }
    // No thread lost.
    assert!(
        text.contains("finished 6 of 6 threads (0 left)"),
        "a thread was lost:\n{text}"
    );
    // tessd had Pulse's acknowledgement of the shrink before it took the hart away.
    let log = d.log();
    assert!(
        !log.contains("did not confirm the adaptation"),
        "tessd shrank the cell without Pulse's acknowledgement:\n{log}"
    );
}

#[test]
#[ignore = "needs root: a private tessd on the real kernel"]
fn pulse_stops_when_its_cell_is_deleted() {
    let (d, mut child, _pid, _stdin, t) = start_in_cell();
    // tessd sends Shutdown: the harts leave at their next scheduler entry and Pulse::run
    // returns, abandoning the threads (they spin until stdin closes, which it does not).
    d.tess_ok(&["cell", "delete", CELL]);
    let mut c = child.0.take().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = c.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = c.kill();
            panic!("the program did not stop within 30 s of its cell's deletion");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stderr = t.stderr.clone();
    let text = t.finish();
    assert!(
        status.success(),
        "the program failed: {text}{}",
        stderr.lock().unwrap()
    );
    assert!(
        text.contains("finished 0 of 6 threads (7 left)"),
        "every thread (6 spinners and the stdin watcher) should be abandoned:\n{text}"
    );
}
