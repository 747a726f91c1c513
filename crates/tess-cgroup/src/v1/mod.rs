//! cgroup v1: one hierarchy per controller.
//!
//! ```text
//! <cpuset>/                      root: sched_load_balance = 0 while tess runs
//! <cpuset>/tess/                 every hart, load balancing off
//! <cpuset>/tess/system/          tasks outside cells (swept in from the root)
//! <cpuset>/tess/domains/<harts>/ empty anchors, load balancing on: each is one root domain
//! <cpuset>/tess/cells/<name>/    one per cell, load balancing off
//! <cpu>/tess/cells/<name>/       best-effort and reserved cells (dedicated cells stay in the
//!                                cpu root so that SCHED_FIFO works under RT group scheduling);
//!                                group servers get cpu.rt_runtime_us / cpu.rt_period_us = B / P,
//!                                every other cell 0 (no RT threads)
//! <cpu>/tess/, <cpu>/tess/cells/ cpu.rt_runtime_us per second = the sum of the group servers'
//!                                B / P (the kernel's check: children within their parent)
//! <memory>/tess/cells/<name>/    memory.limit_in_bytes
//! <pids>/tess/cells/<name>/      pids.max
//! ```
//!
//! v1 builds sched domains from the top-most cpusets with `sched_load_balance = 1`, merging
//! overlapping ones. With the root and every tess group at 0, the anchors alone decide the root
//! domains: one per reserved hart, one for the pool. Dedicated harts belong to no domain, so no
//! load balancing ever pulls work onto them.
//!
//! The `cpu_exclusive` flag is not used: v1 accepts it only when every ancestor is exclusive,
//! which would forbid any other software's cpusets from using any hart. tess enforces
//! exclusivity itself: dedicated harts are removed from every other tess cpuset and from the
//! system cpuset, and tasks in the root cpuset are swept into the system cpuset.

pub mod cpu;
pub mod cpuset;
pub mod memory;
pub mod pids;

use crate::fs::Fs;
use crate::{Backend, CgroupError, Result, Version};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use tess_core::layout::{CellClass, CellLayout, DomainMode, Layout};
use tess_sched::HartSet;

/// Mount points of the v1 hierarchies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct V1Paths {
    /// cpuset hierarchy (required).
    pub cpuset: PathBuf,
    /// cpu hierarchy (required).
    pub cpu: PathBuf,
    /// memory hierarchy (needed for memory limits).
    pub memory: Option<PathBuf>,
    /// pids hierarchy (needed for task limits).
    pub pids: Option<PathBuf>,
}

/// The v1 backend.
#[derive(Debug)]
pub struct V1 {
    paths: V1Paths,
    group: String,
    fs: Fs,
    all: Mutex<HartSet>,
    /// Root tasks the kernel refused to move (kernel threads). The sweep runs on every change
    /// and housekeeping tick; skipping them saves a refused open+write per kernel thread each
    /// time (hundreds of microseconds in a resize on a small machine, more on a large one).
    unmovable: Mutex<BTreeSet<i32>>,
}

const PROCS: &str = "cgroup.procs";
const TASKS: &str = "tasks";

impl V1 {
    /// A backend over `paths`, keeping its groups under `group` (normally `tess`).
    pub fn new(paths: V1Paths, group: &str, fs: Fs) -> V1 {
        V1 {
            paths,
            group: group.to_string(),
            fs,
            all: Mutex::new(HartSet::new()),
            unmovable: Mutex::new(BTreeSet::new()),
        }
    }

    fn top(&self, hierarchy: &Path) -> PathBuf {
        hierarchy.join(&self.group)
    }

    fn cell_dir(&self, hierarchy: &Path, name: &str) -> PathBuf {
        self.top(hierarchy).join("cells").join(name)
    }

    fn mems(&self) -> String {
        self.fs
            .read(&self.paths.cpuset.join(cpuset::MEMS))
            .map(|s| s.trim().to_string())
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "0".to_string())
    }

    /// Creates a cpuset group with load balancing off (before it gets any harts, so that it never
    /// forms a domain of its own), memory nodes, and `cpus`.
    fn ensure_cpuset(&self, dir: &Path, cpus: &HartSet, balance: bool) -> Result<()> {
        if self.fs.mkdir(dir)? {
            cpuset::set_load_balance(&self.fs, dir, false)?;
            cpuset::set_mems(&self.fs, dir, &self.mems())?;
        }
        cpuset::set_cpus(&self.fs, dir, cpus)?;
        cpuset::set_load_balance(&self.fs, dir, balance)
    }

    fn ensure_plain(&self, dir: &Path) -> Result<()> {
        self.fs.mkdir(dir)?;
        Ok(())
    }

    /// Moves every task of `dir` into `to`, then removes `dir`.
    fn evacuate_and_remove(&self, dir: &Path, to: &Path) -> Result<()> {
        if !dir.exists() {
            return Ok(());
        }
        self.fs.evacuate_and_rmdir(dir, &to.join(PROCS))
    }

    /// RT bandwidth of cell `cl` in microseconds `(runtime, period)`: its reservation for a group
    /// server, nothing otherwise.
    fn rt_target(cl: Option<&CellLayout>) -> Option<(u64, u64)> {
        let cl = cl.filter(|c| c.group_server)?;
        let r = cl.reservation?;
        Some((r.runtime.as_micros() as u64, r.period.as_micros() as u64))
    }

    /// Lowers every cell group's RT bandwidth towards the layout's, then sets the parents to the
    /// sum the layout needs (children before parents when shrinking, parents first when
    /// growing), so that [`Backend::apply_cell`] can grow each cell within them.
    fn apply_rt_parents(&self, layout: &Layout) -> Result<()> {
        let cells_dir = self.top(&self.paths.cpu).join("cells");
        for name in self.fs.children(&cells_dir) {
            if name == SPINNER_GROUP {
                continue;
            }
            let dir = cells_dir.join(&name);
            let cur_period = cpu::rt_bandwidth(&self.fs, &dir).map_or(0, |b| b.1);
            let (runtime, period) =
                Self::rt_target(layout.cells.get(&name)).unwrap_or((0, cur_period));
            cpu::shrink_rt(&self.fs, &dir, runtime, period)?;
        }
        // The parents hold, per second (their period), the sum of their children plus one budget
        // of each: a child's run time counted over the parent's 1-s period can exceed
        // `B * 1 s / P` by one budget, depending on how the periods align, and a parent holding
        // the bare sum would then throttle every group server below it until its next second.
        // (Admission keeps all group servers on one hart, where the parents' period timer runs:
        // the kernel refills a group only on the harts of the domain its timer fires in.)
        let need_us: u64 = layout
            .cells
            .values()
            .filter_map(|c| Self::rt_target(Some(c)))
            .map(|(r, p)| (r * 1_000_000).div_ceil(p.max(1)) + r)
            .sum::<u64>()
            .min(1_000_000);
        let top = self.top(&self.paths.cpu);
        let cur = cpu::rt_bandwidth(&self.fs, &top).map_or(0, |b| b.0.max(0) as u64);
        let order = if need_us > cur {
            [top.clone(), cells_dir]
        } else {
            [cells_dir, top.clone()]
        };
        for dir in order {
            cpu::grow_rt(&self.fs, &dir, need_us, 1_000_000)?;
        }
        Ok(())
    }

    fn optional_hierarchies(&self) -> Vec<&Path> {
        [self.paths.memory.as_deref(), self.paths.pids.as_deref()]
            .into_iter()
            .flatten()
            .collect()
    }
}

/// The cpu group of shared-hart idle spinners, beside the cells' groups (a cell name cannot
/// start with a dot).
const SPINNER_GROUP: &str = ".idle-spinners";

impl Backend for V1 {
    fn version(&self) -> Version {
        Version::V1
    }

    fn domain_mode(&self) -> DomainMode {
        DomainMode::PerHart
    }

    fn describe(&self) -> String {
        format!(
            "cgroup v1: cpuset {}, cpu {}, memory {}, pids {}; groups under {}/",
            self.paths.cpuset.display(),
            self.paths.cpu.display(),
            self.paths
                .memory
                .as_ref()
                .map_or("-".into(), |p| p.display().to_string()),
            self.paths
                .pids
                .as_ref()
                .map_or("-".into(), |p| p.display().to_string()),
            self.group
        )
    }

    fn init(&self, all: &HartSet) -> Result<()> {
        *self.all.lock().expect("not poisoned") = all.clone();
        let top = self.top(&self.paths.cpuset);
        self.ensure_cpuset(&top, all, false)?;
        for sub in ["cells", "domains"] {
            self.ensure_cpuset(&top.join(sub), all, false)?;
        }
        if !top.join("system").exists() {
            self.ensure_cpuset(&top.join("system"), all, false)?;
        }
        self.ensure_plain(&self.top(&self.paths.cpu))?;
        self.ensure_plain(&self.top(&self.paths.cpu).join("cells"))?;
        for h in self.optional_hierarchies() {
            self.ensure_plain(&self.top(h))?;
            self.ensure_plain(&self.top(h).join("cells"))?;
        }
        Ok(())
    }

    fn apply_topology(&self, layout: &Layout) -> Result<()> {
        if self.group_servers().is_some() {
            self.apply_rt_parents(layout)?;
        }
        let top = self.top(&self.paths.cpuset);
        // The root must not balance, or it would form one domain over everything.
        cpuset::set_load_balance(&self.fs, &self.paths.cpuset, false)?;
        self.ensure_cpuset(&top.join("system"), &layout.system, false)?;
        let domains_dir = top.join("domains");
        let wanted: Vec<String> = layout.domains.iter().map(|d| d.to_string()).collect();
        // Stale anchors go first so that a hart is never in two balanced cpusets (which would
        // merge their domains).
        for existing in self.fs.children(&domains_dir) {
            if !wanted.contains(&existing) {
                self.fs.rmdir(&domains_dir.join(&existing))?;
            }
        }
        for (name, harts) in wanted.iter().zip(&layout.domains) {
            self.ensure_cpuset(&domains_dir.join(name), harts, true)?;
        }
        Ok(())
    }

    fn apply_cell(&self, name: &str, cell: &CellLayout, _layout: &Layout) -> Result<()> {
        self.ensure_cpuset(&self.cell_dir(&self.paths.cpuset, name), &cell.cpus, false)?;
        let cpu_dir = self.cell_dir(&self.paths.cpu, name);
        if cell.class == CellClass::Dedicated {
            // Dedicated cells live in the cpu root: RT group scheduling would otherwise refuse
            // SCHED_FIFO threads (a child group's rt_runtime_us is 0).
            self.evacuate_and_remove(&cpu_dir, &self.paths.cpu)?;
        } else {
            let new = self.fs.mkdir(&cpu_dir)?;
            cpu::set_weight(&self.fs, &cpu_dir, cell.cpu_weight.unwrap_or(100))?;
            cpu::set_bandwidth(&self.fs, &cpu_dir, cell.cfs_limit)?;
            if let Some((runtime, period)) = Self::rt_target(Some(cell)) {
                cpu::grow_rt(&self.fs, &cpu_dir, runtime, period)?;
            }
            if new {
                // Processes attached while the cell was dedicated sit in the cpu root.
                for pid in self
                    .fs
                    .read_ids(&self.cell_dir(&self.paths.cpuset, name).join(PROCS))?
                {
                    let _ = self.fs.write(&cpu_dir.join(PROCS), &pid.to_string());
                }
            }
        }
        if let Some(m) = &self.paths.memory {
            let dir = self.cell_dir(m, name);
            self.fs.mkdir(&dir)?;
            memory::set_limit(&self.fs, &dir, cell.memory_max)?;
        } else if cell.memory_max.is_some() {
            return Err(CgroupError::Unsupported(
                "a memory limit needs the memory controller, which this host does not mount".into(),
            ));
        }
        if let Some(p) = &self.paths.pids {
            let dir = self.cell_dir(p, name);
            self.fs.mkdir(&dir)?;
            pids::set_max(&self.fs, &dir, cell.pids_max)?;
        } else if cell.pids_max.is_some() {
            return Err(CgroupError::Unsupported(
                "a task limit needs the pids controller, which this host does not mount".into(),
            ));
        }
        Ok(())
    }

    fn remove_cell(&self, name: &str) -> Result<()> {
        let system = self.top(&self.paths.cpuset).join("system");
        self.evacuate_and_remove(&self.cell_dir(&self.paths.cpuset, name), &system)?;
        let cpu_dir = self.cell_dir(&self.paths.cpu, name);
        if cpu::rt_bandwidth(&self.fs, &cpu_dir).is_some_and(|b| b.0 > 0) {
            // A removed group lingers among its parent's children until the kernel frees it,
            // still counted against the parent's RT bandwidth: release it first, once its tasks
            // are out (they left real time before, see tessd's thread manager).
            self.fs
                .move_all(&cpu_dir.join(PROCS), &self.paths.cpu.join(PROCS))?;
            self.fs.write(&cpu_dir.join(cpu::RT_RUNTIME_US), "0")?;
        }
        self.evacuate_and_remove(&cpu_dir, &self.paths.cpu)?;
        for h in self.optional_hierarchies() {
            self.evacuate_and_remove(&self.cell_dir(h, name), h)?;
        }
        Ok(())
    }

    fn attach_process(&self, name: &str, pid: i32, cpu: bool) -> Result<()> {
        let pid_s = pid.to_string();
        let cpuset_dir = self.cell_dir(&self.paths.cpuset, name);
        if !cpuset_dir.exists() {
            return Err(CgroupError::Unsupported(format!(
                "cell {name} has no cgroup"
            )));
        }
        self.fs.write(&cpuset_dir.join(PROCS), &pid_s)?;
        for h in self.optional_hierarchies() {
            self.fs.write(&self.cell_dir(h, name).join(PROCS), &pid_s)?;
        }
        let cpu_dir = self.cell_dir(&self.paths.cpu, name);
        if cpu || !cpu_dir.exists() {
            // Dedicated cells (no cpu group) go to the cpu root at once: nothing to skew there.
            let target = if cpu_dir.exists() {
                cpu_dir
            } else {
                self.paths.cpu.clone()
            };
            self.fs.write(&target.join(PROCS), &pid_s)?;
        }
        Ok(())
    }

    fn attach_spinner(&self, pid: i32) -> Result<()> {
        let cells = self.top(&self.paths.cpu).join("cells");
        let dir = cells.join(SPINNER_GROUP);
        self.fs.mkdir(&cells)?;
        if self.fs.mkdir(&dir)? {
            // Lowest weight where cpu.idle is missing (before Linux 5.15); an idle group
            // refuses a weight, so it is set first.
            let _ = self.fs.write(&dir.join("cpu.shares"), "2");
            let _ = self.fs.write(&dir.join("cpu.idle"), "1");
        }
        self.fs.write(&dir.join(PROCS), &pid.to_string())
    }

    fn attach_thread_to_domain(&self, tid: i32, domain: &HartSet) -> Result<()> {
        // The anchor exists while `domain` is one of the layout's root domains; a thread inside
        // keeps it from being removed, so tessd stops its ticks before the domains change.
        let anchor = self
            .top(&self.paths.cpuset)
            .join("domains")
            .join(domain.to_string());
        self.fs.write(&anchor.join(TASKS), &tid.to_string())
    }

    fn complete_attach(&self, name: &str, cpus: &HartSet) -> Result<usize> {
        let cpu_dir = self.cell_dir(&self.paths.cpu, name);
        if !cpu_dir.exists() {
            return Ok(0);
        }
        let inside: std::collections::HashSet<i32> = self
            .fs
            .read_ids(&cpu_dir.join(PROCS))?
            .into_iter()
            .collect();
        let mut moved = 0;
        for pid in self
            .fs
            .read_ids(&self.cell_dir(&self.paths.cpuset, name).join(PROCS))?
        {
            if inside.contains(&pid) {
                continue;
            }
            let on_cell = self.fs.last_hart(pid).is_some_and(|h| cpus.contains(h));
            if on_cell
                && self
                    .fs
                    .write(&cpu_dir.join(PROCS), &pid.to_string())
                    .is_ok()
            {
                moved += 1;
            }
        }
        Ok(moved)
    }

    fn group_servers(&self) -> Option<f64> {
        let (runtime, period) = cpu::rt_bandwidth(&self.fs, &self.paths.cpu)?;
        if runtime < 0 {
            return Some(1.0);
        }
        Some(runtime as f64 / period.max(1) as f64)
    }

    fn in_cpu_group(&self, name: &str, tid: i32) -> bool {
        crate::proc_cgroup_path(tid, Some("cpu"))
            .is_some_and(|p| p == format!("/{}/cells/{name}", self.group))
    }

    fn threads(&self, name: &str) -> Result<Vec<i32>> {
        self.fs
            .read_ids(&self.cell_dir(&self.paths.cpuset, name).join(TASKS))
    }

    fn processes(&self, name: &str) -> Result<Vec<i32>> {
        self.fs
            .read_ids(&self.cell_dir(&self.paths.cpuset, name).join(PROCS))
    }

    fn existing_cells(&self) -> Result<Vec<String>> {
        Ok(self
            .fs
            .children(&self.top(&self.paths.cpuset).join("cells")))
    }

    fn sweep_into_system(&self) -> Result<usize> {
        let system = self.top(&self.paths.cpuset).join("system");
        if !system.exists() {
            return Ok(0);
        }
        let ids = self.fs.read_ids(&self.paths.cpuset.join(PROCS))?;
        let mut unmovable = self.unmovable.lock().unwrap_or_else(|p| p.into_inner());
        // A pid that left the root is forgotten, so a reused pid is tried again.
        let present: BTreeSet<i32> = ids.iter().copied().collect();
        unmovable.retain(|id| present.contains(id));
        let to = system.join(PROCS);
        let mut moved = 0;
        for id in ids {
            if unmovable.contains(&id) {
                continue;
            }
            match self.fs.write(&to, &id.to_string()) {
                Ok(()) => moved += 1,
                Err(CgroupError::Write { source, .. })
                    if source.raw_os_error() == Some(libc::EINVAL) =>
                {
                    unmovable.insert(id);
                }
                // Exited meanwhile.
                Err(_) => {}
            }
        }
        Ok(moved)
    }

    fn teardown(&self) -> Result<()> {
        for name in self.existing_cells()? {
            self.remove_cell(&name)?;
        }
        let top = self.top(&self.paths.cpuset);
        let domains = top.join("domains");
        for d in self.fs.children(&domains) {
            self.fs.rmdir(&domains.join(d))?;
        }
        for sub in ["system", "cells", "domains", ""] {
            let dir = if sub.is_empty() {
                top.clone()
            } else {
                top.join(sub)
            };
            self.evacuate_and_remove(&dir, &self.paths.cpuset)?;
        }
        cpuset::set_load_balance(&self.fs, &self.paths.cpuset, true)?;
        for h in [Some(self.paths.cpu.as_path())]
            .into_iter()
            .flatten()
            .chain(self.optional_hierarchies())
        {
            let top = self.top(h);
            self.evacuate_and_remove(&top.join("cells").join(SPINNER_GROUP), h)?;
            self.evacuate_and_remove(&top.join("cells"), h)?;
            self.evacuate_and_remove(&top, h)?;
        }
        Ok(())
    }

    fn cell_cpuset_dir(&self, name: &str) -> PathBuf {
        self.cell_dir(&self.paths.cpuset, name)
    }

    fn cell_of_pid(&self, pid: i32) -> Option<String> {
        crate::cell_in_path(&crate::proc_cgroup_path(pid, Some("cpuset"))?, &self.group)
    }

    fn foreign_conflicts(&self, layout: &Layout) -> Vec<String> {
        let mut out = Vec::new();
        let mut stack: Vec<PathBuf> = self
            .fs
            .children(&self.paths.cpuset)
            .into_iter()
            .filter(|c| *c != self.group)
            .map(|c| self.paths.cpuset.join(c))
            .collect();
        while let Some(dir) = stack.pop() {
            let cpus: HartSet = self
                .fs
                .read(&dir.join(cpuset::CPUS))
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or_default();
            let balanced = self
                .fs
                .read(&dir.join(cpuset::SCHED_LOAD_BALANCE))
                .is_ok_and(|s| s.trim() == "1");
            let tasks = !self
                .fs
                .read_ids(&dir.join(TASKS))
                .unwrap_or_default()
                .is_empty();
            if tasks && cpus.intersects(&layout.dedicated) {
                out.push(format!(
                    "{} holds tasks allowed on dedicated harts {}",
                    dir.display(),
                    cpus.intersection(&layout.dedicated)
                ));
            }
            if balanced && cpus.intersects(&layout.reserved) && cpus.len() > 1 {
                out.push(format!(
                    "{} balances load across harts {cpus}, merging the scheduling domains of reserved harts {} (set its cpuset.sched_load_balance to 0)",
                    dir.display(),
                    cpus.intersection(&layout.reserved)
                ));
            } else if !balanced {
                stack.extend(self.fs.children(&dir).into_iter().map(|c| dir.join(c)));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests;
