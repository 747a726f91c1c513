//! `tess bench heartbeat`: what one heartbeat costs the program that beats (issue 14: `beat_ns`,
//! goal under 100 ns), beside what the same time-stamping costs through a system call.
//!
//! A beat is a `fetch_add`, a vDSO clock read, a compare-and-swap and three stores into shared
//! memory. The baselines in the same run: the clock read alone, and the cheapest system call
//! (`getppid`), which is what any beat through a socket, a pipe or a futex would cost at least.

use super::Common;
use tess_bench::{Report, Summary, Table};
use tess_heartbeat::clock::now_ns;
use tess_heartbeat::{Heartbeat, HeartbeatReader};

const BATCH: u64 = 1000;

/// Per-operation ns, one sample per batch of [`BATCH`] operations.
fn per_op(batches: usize, mut op: impl FnMut()) -> Vec<f64> {
    (0..batches)
        .map(|_| {
            let t0 = now_ns();
            for _ in 0..BATCH {
                op();
            }
            (now_ns() - t0) as f64 / BATCH as f64
        })
        .collect()
}

/// Runs the benchmark.
pub fn run(c: &Common) -> anyhow::Result<Report> {
    let batches = if c.quick { 200 } else { 5000 };
    if let Some(h) = c.hart {
        let _ = tess_sched::affinity::set_affinity(0, &tess_sched::HartSet::single(h));
    }
    let hb = Heartbeat::new("bench", Some(tess_heartbeat::Target::Rate(30.0)))?;
    let mut reader = HeartbeatReader::open(hb.fd().try_clone_to_owned()?)?;
    // Warm up: fault in the pages, settle the frequency.
    let _ = per_op(50, || hb.beat());
    let beat = Summary::of(&per_op(batches, || hb.beat()));
    let beat_value = Summary::of(&per_op(batches, || hb.beat_with(42)));
    let clock = Summary::of(&per_op(batches, || {
        std::hint::black_box(now_ns());
    }));
    let syscall = Summary::of(&per_op(batches / 10, || {
        // SAFETY: getppid has no arguments and cannot fail.
        std::hint::black_box(unsafe { libc::getppid() });
    }));
    // The broker's side: reading one full ring.
    let read = Summary::of(
        &(0..if c.quick { 20 } else { 200 })
            .map(|_| {
                for _ in 0..tess_heartbeat::layout::RING {
                    hb.beat();
                }
                let t0 = now_ns();
                let r = reader.read_new(now_ns());
                let dt = (now_ns() - t0) as f64;
                std::hint::black_box(r.beats.len());
                dt / 1000.0
            })
            .collect::<Vec<_>>(),
    );
    let mut r = Report::new("heartbeat");
    let mut t = Table::new(
        format!("cost per operation, ns (median of {batches} batches of {BATCH})"),
        &["operation", "median", "p99", "max"],
    );
    for (name, s) in [
        ("beat (tess heartbeat)", &beat),
        ("beat with a value", &beat_value),
        ("clock_gettime (vDSO) alone", &clock),
        ("getppid (cheapest system call)", &syscall),
    ] {
        t.row(&[
            name.to_string(),
            format!("{:.1}", s.median),
            format!("{:.1}", s.p99),
            format!("{:.1}", s.max),
        ]);
    }
    r.table(t);
    r.figure("beat_ns", beat.median);
    r.figure("beat_ns_p99", beat.p99);
    r.figure("beat_value_ns", beat_value.median);
    r.figure("clock_ns", clock.median);
    r.figure("syscall_ns", syscall.median);
    r.figure("read_ring_us", read.median);
    r.target(
        "beat under 100 ns (median)",
        beat.median < 100.0,
        format!("{:.1} ns", beat.median),
    );
    r.note(format!(
        "the broker reads a full ring of {} beats in {:.1} us (median)",
        tess_heartbeat::layout::RING,
        read.median
    ));
    r.note(
        "a beat makes no system call: the clock is read through the vDSO (clock source tsc here)",
    );
    Ok(r)
}
