//! A Pulse program that follows its tess cell: spinning threads under GRR, one hart per hart of
//! the cell, and an `adapt` for every `tess cell resize`.
//!
//! ```sh
//! tess cell create pulse --policy time-triggered --period 10ms --active 2ms --harts 2
//! tess run --cell pulse -- target/debug/pulse-cell --threads 6
//! tess cell resize pulse --harts 1      # the program prints adapt(2 -> 1) ...
//! tess cell resize pulse --harts 2      # adapt(1 -> 2), and vhart 1 starts again
//! ```
//!
//! It runs until its standard input closes (or `--seconds S` pass), then reports. Lines:
//!
//! ```text
//! start cell=pulse harts=2 threads=6
//! vhart 1 runs on kernel thread 4242         the first time a thread ran on that pair
//! adapt(2 -> 1) handed=2 on vhart 0 t_ns=..  once per resize, when adapt returned
//!                                            (CLOCK_MONOTONIC)
//! phase 1 vharts=[0]                         at the end: the vharts threads ran on after
//!                                            1 adaptation
//! adapt_ns=[61234, 48211]                    at the end: per adaptation, from the hart that
//!                                            read tessd's Adapt to adapt returning
//! finished 6 of 6 threads (0 left)
//! ```
//!
//! `tests/in_cell.rs` runs it in a real cell, and `tess bench pulse` times tessd-driven
//! adaptations with it (request to the `t_ns` of the adapt line). A binary rather than an
//! example so that `cargo build --workspace` builds it.

use std::collections::BTreeSet;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tess_pulse::{Config, Grr, Hart, Pulse, Scheduler, Thread};

/// What the threads saw: (phase, vhart) and (vhart, kernel thread id) pairs.
#[derive(Default)]
struct Seen {
    phases: BTreeSet<(usize, usize)>,
    kernel_threads: BTreeSet<(usize, i32)>,
}

/// GRR that counts adaptations (the phase) and reports each one.
struct Following {
    inner: Grr,
    phase: Arc<AtomicUsize>,
}

impl Scheduler for Following {
    fn enter(&self, h: &Hart<'_>) -> Option<Thread> {
        self.inner.enter(h)
    }
    fn tick(&self, h: &Hart<'_>, t: Thread) -> Option<Thread> {
        self.inner.tick(h, t)
    }
    fn r#yield(&self, h: &Hart<'_>, t: Thread) -> Option<Thread> {
        self.inner.r#yield(h, t)
    }
    fn adapt(&self, old_n: usize, new_n: usize, running: Vec<Thread>) {
        let handed = running.len();
        self.inner.adapt(old_n, new_n, running);
        let t_ns = tess_pulse::clock::now_ns();
        // Every hart is at its checkpoint: no thread runs, none holds the stdout lock.
        self.phase.fetch_add(1, Ordering::SeqCst);
        say(format_args!(
            "adapt({old_n} -> {new_n}) handed={handed} on vhart {} t_ns={t_ns}",
            tess_pulse::vhart_id().unwrap_or(usize::MAX)
        ));
    }
    fn wake(&self, t: Thread) -> bool {
        self.inner.wake(t)
    }
}

fn say(line: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn arg(args: &[String], name: &str, default: u64) -> u64 {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map_or(default, |v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name} takes a number, not {v:?}"))
        })
}

fn main() -> Result<(), tess_pulse::PulseError> {
    let args: Vec<String> = std::env::args().collect();
    let threads = arg(&args, "--threads", 6) as usize;
    let seconds = arg(&args, "--seconds", 600);
    let phase = Arc::new(AtomicUsize::new(0));
    let sched = Following {
        inner: Grr::default(),
        phase: phase.clone(),
    };
    // Standalone (outside a cell) it runs 2 harts; in a cell, as many as the cell has.
    let mut pulse = Pulse::new(
        Config {
            harts: 2,
            ..Config::default()
        },
        sched,
    )?;
    say(format_args!(
        "start cell={} harts={} threads={threads}",
        pulse.cell().unwrap_or("-"),
        pulse.harts()
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let finished = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(Mutex::new(Seen::default()));
    for _ in 0..threads {
        let (stop, finished, seen, phase) =
            (stop.clone(), finished.clone(), seen.clone(), phase.clone());
        pulse.spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                // Spin without yielding: only ticks and adaptations move a thread.
                let t0 = tess_pulse::clock::now_ns();
                while tess_pulse::clock::now_ns() - t0 < 200_000 {
                    std::hint::spin_loop();
                }
                tess_pulse::without_ticks(|| {
                    let v = tess_pulse::vhart_id().unwrap_or(usize::MAX);
                    // SAFETY: gettid has no preconditions; a Pulse thread runs on its hart's
                    // kernel thread, so this is the hart's thread id.
                    let tid = unsafe { libc::gettid() };
                    let mut s = seen.lock().unwrap_or_else(|p| p.into_inner());
                    s.phases.insert((phase.load(Ordering::SeqCst), v));
                    if s.kernel_threads.insert((v, tid)) {
                        say(format_args!("vhart {v} runs on kernel thread {tid}"));
                    }
                });
            }
            finished.fetch_add(1, Ordering::SeqCst);
        })?;
    }
    // Waits for standard input to close without blocking a hart (Pulse's wait_fd).
    let s = stop.clone();
    pulse.spawn(move || {
        let until = tess_pulse::clock::now_ns() + seconds * 1_000_000_000;
        let mut buf = [0u8; 256];
        while tess_pulse::clock::now_ns() < until {
            let left = Duration::from_nanos(until.saturating_sub(tess_pulse::clock::now_ns()));
            match tess_pulse::wait_fd(0, libc::POLLIN, Some(left)) {
                Ok(0) => break,
                Ok(_) => {
                    // SAFETY: reading into our buffer; poll said stdin is readable (or at EOF).
                    let n = unsafe { libc::read(0, buf.as_mut_ptr().cast(), buf.len()) };
                    let interrupted = n < 0
                        && std::io::Error::last_os_error().kind()
                            == std::io::ErrorKind::Interrupted;
                    if n == 0 || (n < 0 && !interrupted) {
                        break; // end of input, or an error
                    }
                }
                Err(e) => {
                    eprintln!("pulse-cell: waiting for standard input: {e}");
                    break;
                }
            }
        }
        s.store(true, Ordering::Relaxed);
    })?;
    let handle = pulse.handle();
    let stats = pulse.run()?;
    let seen = seen.lock().unwrap_or_else(|p| p.into_inner());
    let phases = seen.phases.iter().map(|p| p.0).collect::<BTreeSet<_>>();
    for p in phases {
        let vharts: Vec<usize> = seen
            .phases
            .iter()
            .filter(|x| x.0 == p)
            .map(|x| x.1)
            .collect();
        say(format_args!("phase {p} vharts={vharts:?}"));
    }
    // Pulse's own part of each adaptation: the hart reading tessd's Adapt to adapt returning.
    say(format_args!("adapt_ns={:?}", stats.adapt_ns));
    say(format_args!(
        "finished {} of {threads} threads ({} left)",
        finished.load(Ordering::SeqCst),
        handle.live_threads()
    ));
    Ok(())
}
