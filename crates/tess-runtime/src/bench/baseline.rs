//! The plain-Linux baseline of the gang bench: what a careful user gets without cells.
//!
//! One `SCHED_FIFO` 99 thread pinned to each hart sleeps to the same absolute
//! `CLOCK_MONOTONIC` grid points (`clock_nanosleep(TIMER_ABSTIME)`), as a gang would be woken
//! by per-hart timers. Per grid point, skew is the largest minus the smallest wake-up across
//! the harts, and each hart's lateness (wake-up minus grid point) is its release-to-running
//! latency: the quantities the cell's kernel figures are compared with. No spinning to align
//! the harts afterwards, so this is the kernel's delivery only.
//!
//! Same preparation as the cell: tessd keeps a time-triggered cell's harts from halting between
//! windows with `SCHED_IDLE` spinners (a halted vCPU wakes tens of microseconds later), so the
//! baseline runs one `SCHED_IDLE` spinner per hart too, for as long as it measures.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;
use tess_bench::Summary;
use tess_sched::{affinity, attr, clock, HartSet, Policy};

/// What the baseline measured.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct GangBaseline {
    /// The harts of the gang.
    pub harts: Vec<usize>,
    /// Grid points at which every hart woke.
    pub windows: usize,
    /// Largest minus smallest wake-up per grid point (us).
    pub skew_us: Summary,
    /// Wake-up minus grid point, every hart and grid point (us).
    pub release_us: Summary,
    /// CPU time the `SCHED_IDLE` spinners burnt, as a share of one hart (mean over harts, %).
    pub idle_spin_cpu_pct: f64,
}

/// Wakes one FIFO-99 thread per hart of `harts` at `windows` common grid points `period`
/// apart; see the module docs.
pub fn fifo_gang(
    harts: &[usize],
    period: Duration,
    windows: usize,
) -> anyhow::Result<GangBaseline> {
    anyhow::ensure!(harts.len() >= 2, "a gang needs two harts or more");
    let period_ns = clock::ns(period);
    // Start a few periods from now so every thread is pinned and running FIFO first.
    let first = clock::next_grid_point(clock::now_ns() + 20 * period_ns, period_ns, 0);
    let stop = Arc::new(AtomicBool::new(false));
    let spinners: Vec<_> = harts
        .iter()
        .map(|&hart| {
            let stop = stop.clone();
            std::thread::spawn(move || -> (u64, u64) {
                // Best effort like tessd's spinners: without them the figures are only worse.
                let _ = affinity::set_affinity(0, &HartSet::single(hart));
                let _ = attr::set_policy(0, Policy::Idle, 0);
                let (wall0, cpu0) = (clock::now_ns(), clock::thread_cpu_ns());
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
                (clock::now_ns() - wall0, clock::thread_cpu_ns() - cpu0)
            })
        })
        .collect();
    let ready = Arc::new(Barrier::new(harts.len()));
    let threads: Vec<_> = harts
        .iter()
        .map(|&hart| {
            let ready = ready.clone();
            std::thread::spawn(move || -> anyhow::Result<Vec<u64>> {
                // Meet before anything can fail, so that no thread waits for one that gave up;
                // the first grid point is 20 periods away, time enough to pin and raise.
                ready.wait();
                affinity::set_affinity(0, &HartSet::single(hart))
                    .map_err(|e| anyhow::anyhow!("pinning the baseline to hart {hart}: {e}"))?;
                attr::set_policy(0, Policy::Fifo { priority: 99 }, 0)
                    .map_err(|e| anyhow::anyhow!("SCHED_FIFO 99 on hart {hart}: {e}"))?;
                let mut woke = Vec::with_capacity(windows);
                for k in 0..windows as u64 {
                    let grid = first + k * period_ns;
                    clock::sleep_until_ns(grid);
                    // A wake-up later than the next grid point would shift every later sample:
                    // record it (it is the kernel's delivery) and carry on at the next point.
                    woke.push(clock::now_ns());
                }
                Ok(woke)
            })
        })
        .collect();
    let joined: Vec<_> = threads.into_iter().map(|t| t.join()).collect();
    stop.store(true, Ordering::Relaxed);
    let spun: Vec<(u64, u64)> = spinners.into_iter().filter_map(|s| s.join().ok()).collect();
    let idle_spin_cpu_pct = spun
        .iter()
        .map(|&(wall, cpu)| cpu as f64 / wall.max(1) as f64 * 100.0)
        .sum::<f64>()
        / spun.len().max(1) as f64;
    let mut per_hart = Vec::new();
    for t in joined {
        per_hart.push(t.map_err(|_| anyhow::anyhow!("a baseline thread panicked"))??);
    }
    let mut skew = Vec::with_capacity(windows);
    let mut release = Vec::with_capacity(windows * harts.len());
    for k in 0..windows {
        let grid = first + k as u64 * period_ns;
        let at: Vec<u64> = per_hart.iter().map(|w| w[k]).collect();
        let (lo, hi) = (
            *at.iter().min().unwrap_or(&0),
            *at.iter().max().unwrap_or(&0),
        );
        skew.push(hi - lo);
        release.extend(at.iter().map(|t| t.saturating_sub(grid)));
    }
    Ok(GangBaseline {
        harts: harts.to_vec(),
        windows,
        skew_us: Summary::of_ns_as_us(&skew),
        release_us: Summary::of_ns_as_us(&release),
        idle_spin_cpu_pct,
    })
}
