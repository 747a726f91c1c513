//! Failures are reported, not silent: a thread that overflows its stack is named (from the
//! alternate signal stack) and the process dies of SIGSEGV; a scheduler callback that never
//! returns is reported by the watchdog. Each case runs in a child process (this test binary,
//! re-executed with `PULSE_FAULT_CASE` set).

use std::os::unix::process::ExitStatusExt;
use std::process::Command;
use std::time::Duration;
use tess_pulse::{Config, Grr, Hart, Pulse, Scheduler, Thread, ThreadOptions};

fn recurse(n: u64) -> u64 {
    if n == std::hint::black_box(u64::MAX) {
        return 0;
    }
    let buf = [n; 64];
    std::hint::black_box(&buf);
    recurse(n + 1) + buf[3]
}

/// A scheduler whose `enter` spins forever on vhart 0 (a bug the watchdog must name).
struct Stuck;

impl Scheduler for Stuck {
    fn enter(&self, _: &Hart<'_>) -> Option<Thread> {
        loop {
            std::hint::spin_loop();
        }
    }
    fn tick(&self, _: &Hart<'_>, t: Thread) -> Option<Thread> {
        Some(t)
    }
    fn r#yield(&self, _: &Hart<'_>, t: Thread) -> Option<Thread> {
        Some(t)
    }
    fn adapt(&self, _: usize, _: usize, _: Vec<Thread>) {}
    fn wake(&self, t: Thread) -> bool {
        std::mem::forget(t);
        false
    }
}

fn child_case(case: &str) {
    let one = Config {
        harts: 1,
        watchdog: Duration::from_millis(20),
        ..Config::default()
    };
    match case {
        "overflow" => {
            let mut p = Pulse::new(one, Grr::default()).unwrap();
            p.spawn_with(
                ThreadOptions::named("deep-recursion").stack_size(32 * 1024),
                || {
                    std::hint::black_box(recurse(0));
                },
            )
            .unwrap();
            p.run().unwrap();
        }
        "stuck" => {
            let mut p = Pulse::new(one, Stuck).unwrap();
            p.spawn(|| {}).unwrap();
            let h = p.handle();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_secs(2));
                // The report must have been written by now; end the child.
                let _ = h;
                std::process::exit(7);
            });
            p.run().unwrap();
        }
        _ => panic!("unknown case {case}"),
    }
}

fn run_child(case: &str) -> std::process::Output {
    let exe = std::env::current_exe().unwrap();
    Command::new(exe)
        .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env("PULSE_FAULT_CASE", case)
        .output()
        .unwrap()
}

/// Entry point of the child processes (does nothing in a normal run).
#[test]
fn child_entry() {
    if let Ok(case) = std::env::var("PULSE_FAULT_CASE") {
        child_case(&case);
    }
}

#[test]
fn stack_overflow_names_the_thread_and_kills_the_process() {
    let out = run_child("overflow");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.signal(), Some(libc::SIGSEGV), "stderr: {err}");
    assert!(
        err.contains("stack overflow: thread 'deep-recursion'") && err.contains("guard page"),
        "stderr: {err}"
    );
}

#[test]
fn a_scheduler_callback_that_never_returns_is_reported() {
    let out = run_child("stuck");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(7), "stderr: {err}");
    assert!(
        err.contains("scheduler callback on vhart 0 has run for"),
        "stderr: {err}"
    );
}
