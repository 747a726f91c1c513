//! A gang-scheduled program: every hart of a time-triggered cell runs a little work at the same
//! instant of every window, and the program survives `tess cell resize`.
//!
//! ```text
//! tess cell create gang --policy time-triggered --period 10ms --active 2ms --harts 2
//! tess run --cell gang -- target/debug/examples/gang --seconds 10
//! tess cell resize gang --harts 1      # prints adapt(2 -> 1)
//! tess cell resize gang --harts 2      # prints adapt(1 -> 2) and "vhart 1 ... started"
//! ```
//!
//! Without a cell, `--standalone N` runs N harts on a simulated 10 ms / 2 ms grid and resizes
//! itself to 1 hart and back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tess_runtime::{PerWindow, Runtime, WindowSpec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (mut seconds, mut standalone) = (10u64, None::<usize>);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--seconds" => seconds = args.next().ok_or("--seconds N")?.parse()?,
            "--standalone" => standalone = Some(args.next().ok_or("--standalone N")?.parse()?),
            _ => {
                return Err(format!("unknown argument {a}; use --seconds N, --standalone N").into())
            }
        }
    }
    // Windows each vhart has run since it (re)started; 0 means "not started yet".
    let counts: Arc<Vec<AtomicU64>> = Arc::new((0..64).map(|_| AtomicU64::new(0)).collect());
    let started = tess_sched::clock::now_ns();
    let c = counts.clone();
    let work = PerWindow::new(move |hart| {
        let v = hart.vhart_id();
        let w = hart.window().copied().unwrap_or_default();
        let n = c[v].fetch_add(1, Ordering::Relaxed);
        if n == 0 {
            println!(
                "vhart {v} on hart {} started at window {} ({} of {} harts)",
                hart.cpu(),
                w.index,
                v + 1,
                hart.harts()
            );
        }
        // The application's work for this window: a few microseconds of arithmetic.
        std::hint::black_box((0..2_000u64).fold(v as u64, |a, x| a.wrapping_mul(31) ^ x));
        let h = hart.handle();
        if v == 0 {
            let standalone_script = h.cell().is_none();
            let elapsed = tess_sched::clock::now_ns() - started;
            let total = seconds * 1_000_000_000;
            let mut done = true;
            if standalone_script {
                // Resize ourselves as tessd would: to 1 hart after 1/3 of the run, back after 2/3.
                // Each step waits for the previous adaptation and the run lasts until both
                // happened (at most a minute more): a loaded machine slows the script down
                // instead of skipping a step.
                let adapted = h.stats().adaptations;
                if elapsed > total / 3 && adapted == 0 && h.harts() > 1 {
                    h.resize(1);
                } else if elapsed > 2 * total / 3 && adapted == 1 && h.harts() == 1 {
                    h.resize(standalone.unwrap_or(2));
                }
                done = adapted >= 2 || elapsed > total + 60_000_000_000;
            }
            if elapsed > total && done {
                h.stop();
            }
        }
    })
    .on_adapt({
        let c = counts.clone();
        move |old, new| {
            // Retired vharts start counting afresh if they come back.
            for v in new..old {
                c[v].store(0, Ordering::Relaxed);
            }
            println!("adapt({old} -> {new})");
        }
    });
    let mut builder = Runtime::builder();
    if let Some(n) = standalone {
        builder = builder.standalone(
            n,
            Some(WindowSpec {
                period: Duration::from_millis(10),
                active: Duration::from_millis(2),
                offset: Duration::ZERO,
            }),
        );
    }
    let rt = builder.build(work)?;
    let h = rt.handle();
    println!(
        "gang: cell {}, {} harts {:?}, {:?}",
        h.cell().unwrap_or("(standalone)"),
        h.harts(),
        h.physical_harts(),
        h.timing()
    );
    let stats = rt.run()?;
    println!(
        "gang: done: {} windows ({} started late), {} adaptations, {} re-anchors, {:.1} us spun per window",
        stats.windows,
        stats.late_windows,
        stats.adaptations,
        stats.reanchors,
        stats.spin_ns as f64 / 1000.0 / stats.windows.max(1) as f64
    );
    Ok(())
}
