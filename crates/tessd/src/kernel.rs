//! System-wide kernel settings tess depends on or changes, each saved before the first change
//! so that `tessd --teardown` can restore it.
//!
//! - `SCHED_DEADLINE` capacity per hart: the kernel admits deadline tasks up to
//!   `sched_rt_runtime_us / sched_rt_period_us` of each root domain, minus the bandwidth of the
//!   fair server (the deadline server that guarantees CFS tasks 50 ms/s since Linux 6.12). With
//!   the defaults that is 95% - 5% = 90%. To offer `1 - headroom` (95% by default), tess raises
//!   `sched_rt_runtime_us` so that the fair server's 5% is the headroom.
//! - IRQ affinity: movable IRQs are steered off dedicated harts (`/proc/irq/N/smp_affinity_list`,
//!   `/proc/irq/default_smp_affinity` for new ones).
//! - The unbound workqueue mask (`/sys/devices/virtual/workqueue/cpumask`), so kernel worker
//!   threads stay off dedicated harts too.
//! - `sched_rr_timeslice_ms`, where cells are group servers (threads `SCHED_RR` sharing one RT
//!   group budget): threads of one cell on one hart take turns every time slice of run time,
//!   so a thread that wakes beside a busy one waits up to a slice (100 ms by default, which
//!   under a 20% budget is half a second of wall time). tess shortens it to one scheduler tick.
//!   It applies to every `SCHED_RR` thread of the system (few exist; `SCHED_FIFO` is unaffected).
//! - The scheduler feature `HRTICK_DL` (`/sys/kernel/debug/sched/features`). Without it the
//!   kernel notices that a `SCHED_DEADLINE` thread has used up its budget only at the next
//!   scheduler tick, so a 200 us window can run for up to a tick (4 ms at HZ=250) before it is
//!   throttled; the overrun is paid back later, but everything below it on that hart waits
//!   meanwhile (measured: a time-triggered video cell's 200 us window held the shared hart for
//!   3.9 ms, `docs/architecture.md`). With `HRTICK_DL` a high-resolution timer ends the budget
//!   on time. Distribution kernels ship it off, and a kernel in lockdown (integrity) refuses
//!   the write: tessd then logs that budgets are enforced per tick and goes on.

use crate::store::Store;
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use tess_sched::HartSet;

/// The default fair-server reservation (runtime / period) on kernels that have one.
const FAIR_SERVER_SHARE: f64 = 0.05;

/// Where the kernel's files are (tests point these at temporary trees).
#[derive(Debug, Clone)]
pub struct KernelPaths {
    /// `/proc`.
    pub proc_root: PathBuf,
    /// `/sys`.
    pub sys_root: PathBuf,
}

impl KernelPaths {
    fn rt_runtime(&self) -> PathBuf {
        self.proc_root.join("sys/kernel/sched_rt_runtime_us")
    }

    fn rt_period(&self) -> PathBuf {
        self.proc_root.join("sys/kernel/sched_rt_period_us")
    }

    fn rr_timeslice(&self) -> PathBuf {
        self.proc_root.join("sys/kernel/sched_rr_timeslice_ms")
    }

    fn irq_dir(&self) -> PathBuf {
        self.proc_root.join("irq")
    }

    fn sched_features(&self) -> PathBuf {
        self.sys_root.join("kernel/debug/sched/features")
    }

    fn workqueue_mask(&self) -> PathBuf {
        self.sys_root.join("devices/virtual/workqueue/cpumask")
    }
}

fn read_trim(p: &Path) -> Result<String> {
    Ok(std::fs::read_to_string(p)
        .with_context(|| format!("reading {}", p.display()))?
        .trim()
        .to_string())
}

fn write(p: &Path, v: &str) -> Result<()> {
    std::fs::write(p, v).with_context(|| format!("writing {v:?} to {}", p.display()))
}

/// Whether this kernel runs CFS under a fair deadline server (Linux 6.12 and later), whose
/// bandwidth counts against the `SCHED_DEADLINE` limit.
fn has_fair_server(paths: &KernelPaths) -> bool {
    if paths
        .sys_root
        .join("kernel/debug/sched/fair_server")
        .exists()
    {
        return true;
    }
    let release =
        std::fs::read_to_string(paths.proc_root.join("sys/kernel/osrelease")).unwrap_or_default();
    let mut it = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|x| x.parse::<u32>().ok());
    matches!((it.next(), it.next()), (Some(maj), Some(min)) if (maj, min) >= (6, 12))
}

/// The kernel's per-hart `SCHED_DEADLINE` capacity now.
pub fn deadline_capacity(paths: &KernelPaths) -> Result<f64> {
    let runtime: i64 = read_trim(&paths.rt_runtime())?
        .parse()
        .context("sched_rt_runtime_us")?;
    let period: f64 = read_trim(&paths.rt_period())?
        .parse()
        .context("sched_rt_period_us")?;
    if runtime < 0 {
        // -1 disables the limit (and the kernel's deadline admission control with it).
        return Ok(1.0);
    }
    let fair = if has_fair_server(paths) {
        FAIR_SERVER_SHARE
    } else {
        0.0
    };
    Ok((runtime as f64 / period - fair).max(0.0))
}

/// Raises `sched_rt_runtime_us` so that deadline tasks may use `target` of each hart, if it is
/// lower now. Returns the capacity in effect afterwards.
pub fn raise_deadline_capacity(paths: &KernelPaths, store: &Store, target: f64) -> Result<f64> {
    let now = deadline_capacity(paths)?;
    if now + 1e-9 >= target {
        return Ok(now);
    }
    let period: f64 = read_trim(&paths.rt_period())?.parse()?;
    let fair = if has_fair_server(paths) {
        FAIR_SERVER_SHARE
    } else {
        0.0
    };
    let runtime = ((target + fair).min(1.0) * period).round() as i64;
    store.save_original(
        "sysctl/sched_rt_runtime_us",
        &read_trim(&paths.rt_runtime())?,
    )?;
    write(&paths.rt_runtime(), &runtime.to_string())?;
    tracing::info!(
        runtime_us = runtime,
        "raised sched_rt_runtime_us so SCHED_DEADLINE can use {:.0}% per hart",
        target * 100.0
    );
    deadline_capacity(paths)
}

/// Result of steering IRQs.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct IrqReport {
    /// IRQs now kept off dedicated harts by tess.
    pub steered: usize,
    /// IRQs the kernel would not move (per-CPU or managed), by number.
    pub unmovable: Vec<String>,
}

/// Steers movable IRQs, the default IRQ affinity and the unbound workqueue mask off `dedicated`
/// harts (out of `all`), or restores the saved originals when `dedicated` is empty.
pub fn steer_off(
    paths: &KernelPaths,
    store: &Store,
    dedicated: &HartSet,
    all: &HartSet,
) -> Result<IrqReport> {
    let mut report = IrqReport::default();
    let allowed = all.difference(dedicated);
    let entries = match std::fs::read_dir(paths.irq_dir()) {
        Ok(e) => e,
        Err(_) => return Ok(report),
    };
    let mut irqs: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.chars().all(|c| c.is_ascii_digit()))
        .collect();
    irqs.sort_by_key(|n| n.parse::<u32>().unwrap_or(0));
    for irq in irqs {
        let file = paths.irq_dir().join(&irq).join("smp_affinity_list");
        let Ok(cur_text) = read_trim(&file) else {
            continue;
        };
        let Ok(current) = cur_text.parse::<HartSet>() else {
            continue;
        };
        let key = format!("irq/{irq}");
        let saved: Option<HartSet> = store.saved(&key)?.and_then(|s| s.parse().ok());
        let original = saved.clone().unwrap_or_else(|| current.clone());
        let wanted = if dedicated.is_empty() {
            original.clone()
        } else {
            let w = original.difference(dedicated);
            if w.is_empty() {
                allowed.clone()
            } else {
                w
            }
        };
        if wanted != current {
            if saved.is_none() {
                store.save_original(&key, &cur_text)?;
            }
            if write(&file, &wanted.to_string()).is_err() {
                report.unmovable.push(irq.clone());
                continue;
            }
        }
        if dedicated.is_empty() {
            store.forget_saved(&key)?;
        } else if saved.is_some() || wanted != current {
            report.steered += 1;
        }
    }
    steer_mask(
        store,
        "irq/default",
        &paths.irq_dir().join("default_smp_affinity"),
        dedicated,
        &allowed,
    )?;
    steer_mask(
        store,
        "wq/cpumask",
        &paths.workqueue_mask(),
        dedicated,
        &allowed,
    )?;
    Ok(report)
}

/// Steers one hexadecimal mask file.
fn steer_mask(
    store: &Store,
    key: &str,
    file: &Path,
    dedicated: &HartSet,
    allowed: &HartSet,
) -> Result<()> {
    let Ok(cur_text) = read_trim(file) else {
        return Ok(());
    };
    let Ok(current) = HartSet::from_hex_mask(&cur_text) else {
        return Ok(());
    };
    if dedicated.is_empty() {
        if let Some(orig) = store.saved(key)? {
            if write(file, &orig).is_ok() {
                store.forget_saved(key)?;
            }
        }
        return Ok(());
    }
    let wanted = allowed.intersection(&current);
    let wanted = if wanted.is_empty() {
        allowed.clone()
    } else {
        wanted
    };
    if wanted != current {
        store.save_original(key, &cur_text)?;
        if let Err(e) = write(file, &wanted.to_hex_mask()) {
            tracing::warn!("cannot steer {}: {e:#}", file.display());
        }
    }
    Ok(())
}

/// The `SCHED_RR` time slice tess sets for group servers: 1 ms, which the kernel rounds up to
/// one tick (4 ms at `HZ=250`).
const GROUP_RR_TIMESLICE_MS: &str = "1";

/// Shortens `sched_rr_timeslice_ms` (module docs), saving the original for teardown.
pub fn shorten_rr_timeslice(paths: &KernelPaths, store: &Store) -> Result<()> {
    let cur = read_trim(&paths.rr_timeslice())?;
    if cur == GROUP_RR_TIMESLICE_MS {
        return Ok(());
    }
    if store.saved("sysctl/sched_rr_timeslice_ms")?.is_none() {
        store.save_original("sysctl/sched_rr_timeslice_ms", &cur)?;
    }
    write(&paths.rr_timeslice(), GROUP_RR_TIMESLICE_MS)
}

/// How precisely the kernel ends a `SCHED_DEADLINE` budget (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadlineEnforcement {
    /// `HRTICK_DL` is on: a budget ends when it is used up.
    Exact,
    /// Only at the next scheduler tick: a reservation can overrun by up to a tick.
    PerTick,
}

/// Turns the scheduler feature `HRTICK_DL` on if it is off and the kernel lets us (saving the
/// original for teardown), and says how budgets are enforced afterwards.
pub fn exact_deadline_enforcement(paths: &KernelPaths, store: &Store) -> DeadlineEnforcement {
    let file = paths.sched_features();
    let Ok(features) = read_trim(&file) else {
        tracing::warn!(
            "{} is not readable (no debugfs, or kernel lockdown): SCHED_DEADLINE budgets are enforced at the scheduler tick, so a reservation may overrun its budget by up to a tick",
            file.display()
        );
        return DeadlineEnforcement::PerTick;
    };
    let words: Vec<&str> = features.split_whitespace().collect();
    if words.contains(&"HRTICK_DL") {
        return DeadlineEnforcement::Exact;
    }
    if !words.contains(&"NO_HRTICK_DL") {
        tracing::warn!("this kernel has no HRTICK_DL feature: SCHED_DEADLINE budgets are enforced at the scheduler tick");
        return DeadlineEnforcement::PerTick;
    }
    if store
        .saved("sched_feature/HRTICK_DL")
        .ok()
        .flatten()
        .is_none()
        && store
            .save_original("sched_feature/HRTICK_DL", "NO_HRTICK_DL")
            .is_err()
    {
        return DeadlineEnforcement::PerTick;
    }
    match write(&file, "HRTICK_DL") {
        Ok(()) => {
            tracing::info!("turned on HRTICK_DL: SCHED_DEADLINE budgets end on time");
            DeadlineEnforcement::Exact
        }
        Err(e) => {
            let _ = store.forget_saved("sched_feature/HRTICK_DL");
            tracing::warn!("cannot turn on HRTICK_DL ({e:#}): SCHED_DEADLINE budgets are enforced at the scheduler tick, so a reservation may overrun its budget by up to a tick");
            DeadlineEnforcement::PerTick
        }
    }
}

/// How long [`restore_all`] retries restoring `sched_rt_runtime_us` while deadline tasks exit.
const RESTORE_RETRY: std::time::Duration = std::time::Duration::from_secs(3);

/// Restores every saved setting (teardown).
pub fn restore_all(paths: &KernelPaths, store: &Store) -> Result<()> {
    let all = tess_sched::online_harts().unwrap_or_default();
    steer_off(paths, store, &HartSet::new(), &all)?;
    if let Some(orig) = store.saved("sysctl/sched_rt_runtime_us")? {
        // The kernel refuses a value below the bandwidth of the deadline tasks still alive, and
        // a program killed just before the teardown may take a moment to exit: retry for a
        // while before giving up (a private tessd's state, and with it the saved value, is often
        // removed right after its teardown, so a give-up leaves the raised value behind).
        let give_up = std::time::Instant::now() + RESTORE_RETRY;
        loop {
            match write(&paths.rt_runtime(), &orig) {
                Ok(()) => {
                    store.forget_saved("sysctl/sched_rt_runtime_us")?;
                    break;
                }
                Err(_) if std::time::Instant::now() < give_up => {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                Err(e) => {
                    tracing::warn!(
                        "cannot restore sched_rt_runtime_us to {orig} (deadline tasks still running?): {e:#}"
                    );
                    break;
                }
            }
        }
    }
    if let Some(orig) = store.saved("sysctl/sched_rr_timeslice_ms")? {
        write(&paths.rr_timeslice(), &orig)?;
        store.forget_saved("sysctl/sched_rr_timeslice_ms")?;
    }
    if let Some(orig) = store.saved("sched_feature/HRTICK_DL")? {
        match write(&paths.sched_features(), &orig) {
            Ok(()) => store.forget_saved("sched_feature/HRTICK_DL")?,
            Err(e) => tracing::warn!("cannot restore the HRTICK_DL scheduler feature: {e:#}"),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_kernel() -> (tempfile::TempDir, KernelPaths) {
        let dir = tempfile::tempdir().unwrap();
        let proc_root = dir.path().join("proc");
        let sys_root = dir.path().join("sys");
        std::fs::create_dir_all(proc_root.join("sys/kernel")).unwrap();
        std::fs::write(proc_root.join("sys/kernel/sched_rt_runtime_us"), "950000\n").unwrap();
        std::fs::write(proc_root.join("sys/kernel/sched_rt_period_us"), "1000000\n").unwrap();
        std::fs::write(proc_root.join("sys/kernel/osrelease"), "6.18.44\n").unwrap();
        for (irq, aff) in [("24", "0-1"), ("26", "1"), ("27", "0")] {
            std::fs::create_dir_all(proc_root.join("irq").join(irq)).unwrap();
            std::fs::write(
                proc_root.join("irq").join(irq).join("smp_affinity_list"),
                aff,
            )
            .unwrap();
        }
        std::fs::write(proc_root.join("irq/default_smp_affinity"), "3\n").unwrap();
        std::fs::create_dir_all(sys_root.join("devices/virtual/workqueue")).unwrap();
        std::fs::write(sys_root.join("devices/virtual/workqueue/cpumask"), "3\n").unwrap();
        (
            dir,
            KernelPaths {
                proc_root,
                sys_root,
            },
        )
    }

    fn read(p: PathBuf) -> String {
        std::fs::read_to_string(p).unwrap().trim().to_string()
    }

    #[test]
    fn deadline_capacity_accounts_for_the_fair_server() {
        let (dir, paths) = fake_kernel();
        assert!((deadline_capacity(&paths).unwrap() - 0.90).abs() < 1e-9);
        let store = Store::open(&dir.path().join("state")).unwrap();
        let cap = raise_deadline_capacity(&paths, &store, 0.95).unwrap();
        assert!((cap - 0.95).abs() < 1e-9);
        assert_eq!(read(paths.rt_runtime()), "1000000");
        restore_all(&paths, &store).unwrap();
        assert_eq!(read(paths.rt_runtime()), "950000");
    }

    #[test]
    fn rr_timeslice_is_shortened_once_and_restored() {
        let (dir, paths) = fake_kernel();
        std::fs::write(paths.rr_timeslice(), "100\n").unwrap();
        let store = Store::open(&dir.path().join("state")).unwrap();
        shorten_rr_timeslice(&paths, &store).unwrap();
        assert_eq!(read(paths.rr_timeslice()), "1");
        // A restarted daemon finds it shortened and keeps the true original.
        shorten_rr_timeslice(&paths, &store).unwrap();
        restore_all(&paths, &store).unwrap();
        assert_eq!(read(paths.rr_timeslice()), "100");
    }

    #[test]
    fn irqs_move_off_dedicated_harts_and_come_back() {
        let (dir, paths) = fake_kernel();
        let store = Store::open(&dir.path().join("state")).unwrap();
        let all = HartSet::first_n(2);
        let r = steer_off(&paths, &store, &HartSet::single(1), &all).unwrap();
        assert_eq!(r.steered, 2);
        assert_eq!(read(paths.irq_dir().join("24/smp_affinity_list")), "0");
        assert_eq!(read(paths.irq_dir().join("26/smp_affinity_list")), "0");
        assert_eq!(read(paths.irq_dir().join("27/smp_affinity_list")), "0");
        assert_eq!(
            read(paths.irq_dir().join("default_smp_affinity")),
            "00000001"
        );
        assert_eq!(read(paths.workqueue_mask()), "00000001");
        // Idempotent.
        assert_eq!(
            steer_off(&paths, &store, &HartSet::single(1), &all)
                .unwrap()
                .steered,
            2
        );
        steer_off(&paths, &store, &HartSet::new(), &all).unwrap();
        assert_eq!(read(paths.irq_dir().join("24/smp_affinity_list")), "0-1");
        assert_eq!(read(paths.irq_dir().join("26/smp_affinity_list")), "1");
        assert_eq!(read(paths.irq_dir().join("default_smp_affinity")), "3");
        assert!(store.saved_with_prefix("irq/").unwrap().is_empty());
    }

    #[test]
    fn hrtick_dl_is_turned_on_and_restored() {
        let (dir, paths) = fake_kernel();
        let store = Store::open(&dir.path().join("state")).unwrap();
        // No debugfs: per tick, nothing written.
        assert_eq!(
            exact_deadline_enforcement(&paths, &store),
            DeadlineEnforcement::PerTick
        );
        let features = dir.path().join("sys/kernel/debug/sched/features");
        std::fs::create_dir_all(features.parent().unwrap()).unwrap();
        std::fs::write(&features, "GENTLE_FAIR_SLEEPERS NO_HRTICK NO_HRTICK_DL\n").unwrap();
        assert_eq!(
            exact_deadline_enforcement(&paths, &store),
            DeadlineEnforcement::Exact
        );
        // The fake file takes the write as is (the real one sets the one feature).
        assert_eq!(std::fs::read_to_string(&features).unwrap(), "HRTICK_DL");
        restore_all(&paths, &store).unwrap();
        assert_eq!(std::fs::read_to_string(&features).unwrap(), "NO_HRTICK_DL");
        assert!(store.saved("sched_feature/HRTICK_DL").unwrap().is_none());
    }
}
