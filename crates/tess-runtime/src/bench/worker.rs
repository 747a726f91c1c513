//! The process the gang benchmark runs inside its cell (`tess-gang-worker`, or `tess work gang`).
//!
//! It joins the cell, runs the runtime with a [`PerWindow`] function that records when each
//! hart entered each window, and talks to the benchmark with JSON lines on standard output:
//! `{"event":"ready"}` once both harts run, `{"event":"measured","result":...}` after the skew windows (with the skew, entry,
//! release and spin statistics),
//! `{"event":"adapted","old":..,"new":..,"t_ns":..}` when an adaptation has taken effect (a
//! shrink: `adapt` returned; a grow: the new hart ran application code, which it does only after
//! `adapt` returned), and `{"event":"stopped"}` when tessd deleted the cell.

use crate::{PerWindow, Runtime, WindowInfo};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tess_bench::Summary;
use tess_sched::clock;

/// Harts the worker records (the bench cell has two).
const MAX_VHARTS: usize = 8;

/// Arguments of the worker.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerArgs {
    /// The cell to join.
    pub cell: String,
    /// Windows of vhart 0 to measure skew over.
    pub windows: usize,
}

impl WorkerArgs {
    /// Parses `--cell NAME --windows N`.
    pub fn parse(args: impl IntoIterator<Item = String>) -> anyhow::Result<WorkerArgs> {
        let mut it = args.into_iter();
        let (mut cell, mut windows) = (None, 10_000usize);
        while let Some(a) = it.next() {
            match a.as_str() {
                "--cell" => cell = it.next(),
                "--windows" => {
                    windows = it
                        .next()
                        .ok_or_else(|| anyhow::anyhow!("--windows N"))?
                        .parse()?
                }
                other => anyhow::bail!("unknown argument {other:?} (use --cell NAME --windows N)"),
            }
        }
        Ok(WorkerArgs {
            cell: cell.ok_or_else(|| anyhow::anyhow!("--cell NAME is required"))?,
            windows,
        })
    }
}

/// What the worker measured (the `result` line).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WorkerResult {
    /// Windows in which both harts ran.
    pub matched_windows: usize,
    /// Largest minus smallest window entry across the harts, per window, after the runtime's
    /// alignment spin to the scheduled start (us).
    pub skew_us: Summary,
    /// Largest minus smallest kernel release across the harts, per window: when each hart's
    /// thread actually ran again after the kernel released it, before any spinning (us).
    #[serde(default)]
    pub kernel_skew_us: Summary,
    /// Entry minus scheduled start, every hart and window (us).
    pub entry_us: Summary,
    /// Kernel release minus grid point, every hart and window (us).
    pub release_us: Summary,
    /// Spinning to the window start, per hart and window (us).
    pub spin_us: Summary,
    /// The physical hart each vhart ran on when it last recorded.
    pub cpus: Vec<Option<usize>>,
    /// Runtime counters at the end.
    pub windows: u64,
    /// Windows entered after their scheduled start.
    pub late_windows: u64,
    /// Re-anchors of kernel periods.
    pub reanchors: u64,
    /// Adaptations completed.
    pub adaptations: u64,
}

fn emit(v: &serde_json::Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

/// Runs the worker; returns the process exit status.
pub fn worker_main(args: WorkerArgs) -> anyhow::Result<i32> {
    crate::join_cell(&args.cell)?;
    let _ = tess_sched::lock_memory();
    let records: Arc<Vec<Mutex<Vec<WindowInfo>>>> = Arc::new(
        (0..MAX_VHARTS)
            .map(|_| Mutex::new(Vec::with_capacity(args.windows + 64)))
            .collect(),
    );
    let cpus: Arc<Vec<AtomicU64>> = Arc::new((0..MAX_VHARTS).map(|_| AtomicU64::new(0)).collect());
    let running: Arc<Vec<AtomicBool>> =
        Arc::new((0..MAX_VHARTS).map(|_| AtomicBool::new(false)).collect());
    let measuring = Arc::new(AtomicBool::new(false));
    let measured = Arc::new(AtomicBool::new(false));
    let (r, c, run, m, md) = (
        records.clone(),
        cpus.clone(),
        running.clone(),
        measuring.clone(),
        measured.clone(),
    );
    let goal = args.windows;
    let work = PerWindow::new(move |hart| {
        let v = hart.vhart_id().min(MAX_VHARTS - 1);
        let Some(w) = hart.window().copied() else {
            return;
        };
        if !run[v].swap(true, Ordering::AcqRel) {
            // First application code of this (possibly new) hart.
            c[v].store(hart.cpu() as u64 + 1, Ordering::Relaxed);
            if m.load(Ordering::Acquire) || md.load(Ordering::Acquire) {
                emit(
                    &serde_json::json!({"event": "adapted", "old": hart.harts() - 1,
                    "new": hart.harts(), "t_ns": clock::now_ns()}),
                );
            }
        }
        if md.load(Ordering::Acquire) {
            return;
        }
        if m.load(Ordering::Acquire) {
            let mut rec = r[v].lock().unwrap_or_else(|p| p.into_inner());
            rec.push(w);
            if v == 0 && rec.len() >= goal {
                drop(rec);
                md.store(true, Ordering::Release);
                // Summarise now (once, costing vhart 0 part of one window): the skew data is
                // complete, and the adaptation phase is timed by the benchmark.
                let recs: Vec<Vec<WindowInfo>> = r
                    .iter()
                    .map(|m| std::mem::take(&mut *m.lock().unwrap_or_else(|p| p.into_inner())))
                    .collect();
                let mut res = summarise(&recs);
                res.cpus = c
                    .iter()
                    .take(hart.harts())
                    .map(|x| match x.load(Ordering::Relaxed) {
                        0 => None,
                        x => Some(x as usize - 1),
                    })
                    .collect();
                let stats = hart.handle().stats();
                res.windows = stats.windows;
                res.late_windows = stats.late_windows;
                res.reanchors = stats.reanchors;
                res.adaptations = stats.adaptations;
                emit(&serde_json::json!({"event": "measured", "result": res}));
            }
        } else if v == 0 && (0..hart.harts()).all(|h| run[h].load(Ordering::Acquire)) {
            m.store(true, Ordering::Release);
            emit(&serde_json::json!({"event": "ready"}));
        }
    })
    .on_adapt({
        let run = running.clone();
        move |old, new| {
            for flag in run.iter().take(old).skip(new) {
                flag.store(false, Ordering::Release);
            }
            if new < old {
                emit(
                    &serde_json::json!({"event": "adapted", "old": old, "new": new,
                    "t_ns": clock::now_ns()}),
                );
            }
        }
    });
    let stats = Runtime::builder().cell(&args.cell).build(work)?.run()?;
    emit(&serde_json::json!({"event": "stopped", "adaptations": stats.adaptations}));
    Ok(0)
}

/// Skew, entry, release and spin statistics from per-vhart window records.
pub fn summarise(recs: &[Vec<WindowInfo>]) -> WorkerResult {
    use std::collections::BTreeMap;
    // Per window index: (entered, released) of each hart that ran it.
    let mut by_index: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
    let (mut entry, mut release, mut spin) = (Vec::new(), Vec::new(), Vec::new());
    for rec in recs {
        for w in rec {
            by_index
                .entry(w.index)
                .or_default()
                .push((w.entered_ns, w.released_ns));
            entry.push(w.entered_ns.saturating_sub(w.start_ns));
            release.push(w.released_ns.saturating_sub(w.grid_ns));
            spin.push(w.spin_ns);
        }
    }
    let harts = recs.iter().filter(|r| !r.is_empty()).count();
    let spread = |xs: &mut dyn Iterator<Item = u64>| {
        let (lo, hi) = xs.fold((u64::MAX, 0), |(lo, hi), x| (lo.min(x), hi.max(x)));
        hi.saturating_sub(lo)
    };
    let complete: Vec<&Vec<(u64, u64)>> = by_index
        .values()
        .filter(|e| e.len() == harts && harts >= 2)
        .collect();
    let skew: Vec<u64> = complete
        .iter()
        .map(|e| spread(&mut e.iter().map(|x| x.0)))
        .collect();
    let kernel_skew: Vec<u64> = complete
        .iter()
        .map(|e| spread(&mut e.iter().map(|x| x.1)))
        .collect();
    WorkerResult {
        matched_windows: skew.len(),
        skew_us: Summary::of_ns_as_us(&skew),
        kernel_skew_us: Summary::of_ns_as_us(&kernel_skew),
        entry_us: Summary::of_ns_as_us(&entry),
        release_us: Summary::of_ns_as_us(&release),
        spin_us: Summary::of_ns_as_us(&spin),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skew_is_the_spread_of_entries_per_window() {
        let w = |index, entered_ns, released_late_ns| WindowInfo {
            index,
            grid_ns: index * 1000,
            start_ns: index * 1000 + 100,
            entered_ns,
            released_ns: index * 1000 + released_late_ns,
            end_ns: index * 1000 + 380,
            spin_ns: 70,
        };
        let recs = vec![
            vec![w(1, 1100, 30), w(2, 2102, 30), w(3, 3100, 30)],
            vec![w(1, 1101, 35), w(2, 2100, 42)],
        ];
        let r = summarise(&recs);
        assert_eq!(r.matched_windows, 2);
        assert_eq!(r.skew_us.max, 0.002);
        // The kernel's spread (5 and 12 ns), not the spread after the spin (1 and 2 ns).
        assert_eq!(r.kernel_skew_us.count, 2);
        assert_eq!(r.kernel_skew_us.max, 0.012);
        assert_eq!(r.kernel_skew_us.min, 0.005);
        assert_eq!(r.release_us.median, 0.03);
    }

    #[test]
    fn args_parse() {
        let a = WorkerArgs::parse(["--cell", "g", "--windows", "5"].map(String::from)).unwrap();
        assert_eq!((a.cell.as_str(), a.windows), ("g", 5));
        assert!(WorkerArgs::parse(["--windows".to_string(), "5".into()]).is_err());
    }
}
