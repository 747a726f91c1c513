//! Idle spinners: what keeps a cell's harts busy when nothing wants them
//! ([`tess_core::spec::IdleMode::Spin`], the default of dedicated and time-triggered cells).
//!
//! A spinner is a tiny process (`tessd __spin-idle HART`) under `SCHED_IDLE`, pinned to one hart
//! of the cell and placed in the cell's cgroups (a dedicated cell) or left in the system group
//! (the shared harts of time- and event-triggered cells: in the cell's cgroup it would compete
//! with the system by the cell's group weight). A waking thread of the cell preempts it at once,
//! so it only ever takes time nobody in the cell wants, but the hart never enters an idle state:
//! measured on this virtual machine, the median wake-up latency of a 1 ms periodic task in a
//! dedicated cell falls from 71 us to 23 us (an idle vCPU must be woken by the hypervisor).
//! Spinners outlive the daemon like the cells do, and a restarted daemon adopts them.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::{Duration, Instant};
use tess_cgroup::Backend;
use tess_core::layout::{CellClass, Layout};
use tess_sched::HartSet;

/// The argument that turns the tessd binary into a spinner.
pub const SPIN_ARG: &str = "__spin-idle";

/// Entry point of a spinner process; never returns.
pub fn spin(hart: usize) -> ! {
    // Already done before exec when tessd started it (`idle_from_the_start`); again for a
    // spinner started some other way.
    become_idle();
    loop {
        // Moving a task into a v1 cpuset, or shrinking its cpuset, resets its affinity (the
        // sweep of the root does that to a shared-hart spinner), so the pinning is checked now
        // and then. A spinner that cannot run on its hart (its group lost the hart for now)
        // sleeps and tries again: spinning elsewhere would only take time from others, and
        // exiting would have the daemon start it again and again.
        let pinned =
            tess_sched::affinity::get_affinity(0).is_ok_and(|a| a == HartSet::single(hart));
        if !pinned && tess_sched::affinity::set_affinity(0, &HartSet::single(hart)).is_err() {
            std::thread::sleep(std::time::Duration::from_millis(50));
            continue;
        }
        for _ in 0..1_000_000 {
            std::hint::spin_loop();
        }
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

/// The key of spinners that belong to no cell: those keeping the shared harts of spinning
/// time-triggered or event-triggered cells busy. They run where tessd runs (the system group),
/// so other cells' tasks, and the system's, always come first.
const SHARED: &str = "";

/// What spinners `to` wants: by cell for dedicated cells, and under [`SHARED`] the harts that
/// spinning reserved cells share with others (only those the system group may run on).
fn wanted(to: &Layout) -> BTreeMap<String, HartSet> {
    let mut want = BTreeMap::new();
    let mut shared = HartSet::new();
    for (cell, c) in to.cells.iter().filter(|(_, c)| c.idle_spin) {
        match c.class {
            CellClass::Dedicated => {
                want.insert(cell.clone(), c.cpus.clone());
            }
            _ => shared = shared.union(&c.cpus.intersection(&to.system)),
        }
    }
    if !shared.is_empty() {
        want.insert(SHARED.to_string(), shared);
    }
    want
}

/// How long a shared-hart spinner outlives the last spinning cell on its hart. Starting a
/// spinner costs a process spawn on the path of a change, and a cell that shrinks often grows
/// back (a resize 2 -> 1 -> 2 harts would otherwise stop and start one each time).
const SHARED_LINGER: Duration = Duration::from_secs(2);

/// Spinners by cell (or [`SHARED`]) and hart.
#[derive(Debug, Default)]
pub struct Spinners {
    by_cell: BTreeMap<String, BTreeMap<usize, i32>>,
    /// Shared-hart spinners no cell wants any more, and since when.
    unwanted_since: BTreeMap<usize, Instant>,
}

impl Spinners {
    /// Spinner pids of `cell`.
    pub fn pids(&self, cell: &str) -> Vec<i32> {
        self.by_cell
            .get(cell)
            .map(|m| m.values().copied().collect())
            .unwrap_or_default()
    }

    /// Spinner pids of every cell.
    pub fn by_cell(&self) -> BTreeMap<String, Vec<i32>> {
        self.by_cell
            .iter()
            .map(|(cell, m)| (cell.clone(), m.values().copied().collect()))
            .collect()
    }

    /// Whether `pid` is one of ours.
    pub fn is_spinner(&self, pid: i32) -> bool {
        self.by_cell.values().any(|m| m.values().any(|p| *p == pid))
    }

    /// Finds spinners already running (left by an earlier daemon): in cells, and those of
    /// shared harts anywhere else.
    pub fn adopt(&mut self, backend: &dyn Backend) {
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return;
        };
        for pid in dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok()) {
            let Some(h) = spinner_hart(pid) else {
                continue;
            };
            let cell = backend.cell_of_pid(pid).unwrap_or_default();
            self.by_cell.entry(cell).or_default().insert(h, pid);
        }
    }

    /// Stops the spinners that `to` does not want (or whose cell is gone). Run before cells
    /// are removed, so no spinner is ever evacuated onto the system's harts.
    /// Shared-hart spinners linger for [`SHARED_LINGER`].
    pub fn stop_unwanted(&mut self, to: &Layout) {
        let want = wanted(to);
        let now = Instant::now();
        let unwanted_since = &mut self.unwanted_since;
        for (cell, harts) in self.by_cell.iter_mut() {
            let want = want.get(cell).cloned().unwrap_or_default();
            harts.retain(|h, pid| {
                let lingers = cell == SHARED && {
                    let since = if want.contains(*h) {
                        unwanted_since.remove(h);
                        now
                    } else {
                        *unwanted_since.entry(*h).or_insert(now)
                    };
                    now.duration_since(since) < SHARED_LINGER
                };
                let keep = (want.contains(*h) || lingers) && spinner_hart(*pid) == Some(*h);
                if !keep {
                    kill(*pid);
                    if cell == SHARED {
                        unwanted_since.remove(h);
                    }
                }
                keep
            });
        }
        self.by_cell.retain(|_, h| !h.is_empty());
    }

    /// Starts the missing spinners that `to` wants.
    pub fn start_wanted(&mut self, backend: &dyn Backend, to: &Layout) -> anyhow::Result<()> {
        // This very binary, through the kernel's link to it: `current_exe()` names a path that
        // is gone once the file is replaced (an upgrade, a rebuild while tessd runs), and a
        // spinning cell then failed to start with "No such file or directory".
        let exe = std::path::Path::new("/proc/self/exe");
        for (cell, harts) in wanted(to) {
            for h in harts.iter() {
                let running = self
                    .by_cell
                    .get(&cell)
                    .and_then(|m| m.get(&h))
                    .is_some_and(|p| spinner_hart(*p) == Some(h));
                if running {
                    continue;
                }
                let child = idle_from_the_start(
                    Command::new(exe)
                        .arg0("tessd")
                        .args([SPIN_ARG, &h.to_string()])
                        .stdin(std::process::Stdio::null())
                        .stdout(std::process::Stdio::null())
                        .stderr(std::process::Stdio::null()),
                )
                .spawn()?;
                let pid = child.id() as i32;
                // Never waited for: tessd ignores SIGCHLD, so the kernel reaps spinners.
                drop(child);
                if cell == SHARED {
                    backend.attach_spinner(pid)?;
                } else {
                    backend.attach_process(&cell, pid, true)?;
                }
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

/// Makes `cmd`'s process `SCHED_IDLE` at nice 19 before it executes anything.
///
/// Spinners are started inside transactions, whose thread runs `SCHED_FIFO` (`daemon::Urgent`),
/// and a child inherits that. The spinner drops it itself (`spin`), but only once it runs, and
/// tessd moves it into its cgroup as soon as `spawn` returns: under cgroup v1 RT group
/// scheduling the kernel refuses a real-time task in a group with no RT runtime (EINVAL), so
/// the transaction failed, now and then, with "starting idle spinners".
fn idle_from_the_start(cmd: &mut Command) -> &mut Command {
    // SAFETY: the hook runs in the forked child before exec; `become_idle` only makes two
    // system calls, which are async-signal-safe, touches no lock and allocates nothing.
    unsafe {
        cmd.pre_exec(|| {
            become_idle();
            Ok(())
        })
    }
}

/// Makes the calling process `SCHED_IDLE` at nice 19, so that it yields to everything (nice 19
/// too, in case the kernel refuses `SCHED_IDLE`). Failures are ignored: a spinner runs all the
/// same. Two raw system calls and nothing else, so that it may run between fork and exec.
fn become_idle() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: setpriority and sched_setscheduler on the calling process, with a valid
    // sched_param; neither touches this process's memory otherwise.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, 19);
        libc::sched_setscheduler(0, libc::SCHED_IDLE, &param);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A spinner started by a transaction's `SCHED_FIFO` thread is `SCHED_IDLE` from its first
    /// instruction: the child here reports its own policy, as the kernel sees it, before it
    /// could have changed it.
    #[test]
    #[ignore = "needs root: SCHED_FIFO"]
    fn a_spinner_never_runs_with_the_transactions_real_time_priority() {
        tess_testkit::require_root();
        let _urgent = crate::daemon::Urgent::raise();
        let now = tess_sched::attr::get_policy(0);
        if !matches!(now, Ok((tess_sched::Policy::Fifo { .. }, _))) {
            // RT group scheduling without RT runtime for this process's cpu group
            eprintln!("skipped: this thread may not become SCHED_FIFO here ({now:?})");
            return;
        }
        let out = idle_from_the_start(Command::new("sh").args(["-c", "chrt -p $$"]))
            .output()
            .expect("running sh and chrt");
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(said.contains("SCHED_IDLE"), "the child ran as: {said}");
    }
}
