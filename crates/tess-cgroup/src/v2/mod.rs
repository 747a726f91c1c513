//! cgroup v2: the unified hierarchy.
//!
//! ```text
//! <root>/tess/                  +cpuset +cpu +memory +pids; cpuset.cpus left empty (it inherits
//!                               whatever the partitions leave to the root)
//! <root>/tess/cells/<name>/     best-effort cells, and reserved cells outside a partition
//! <root>/tess.part-<harts>/     a partition of the root: `isolated` for a dedicated cell (no
//!   <name>/                     load balancing), `root` for a component of reserved harts (its
//!                               own root domain), holding the cells placed on it
//! ```
//!
//! A cpuset partition's parent must be a partition root on every kernel before 6.7 (Debian 12
//! runs 6.1), and the hierarchy's root is the only one tess can count on, so the partitions are
//! children of the root, beside tess's own group, named after it. (Linux 6.7 added "remote"
//! partitions deeper in the tree, but `cpuset.cpus.exclusive` must then be granted by every
//! ancestor; siblings of the root work on every kernel with partitions.) The kernel removes a
//! partition's harts from every cgroup outside it, so tasks outside cells stay off dedicated and
//! reserved harts; no sweeping is needed.
//!
//! The kernel's rules this follows (Documentation/admin-guide/cgroup-v2.rst, "cpuset.cpus.
//! partition"): a partition's harts must be exclusive among its siblings, so tess's own group
//! and `cells/` never set `cpuset.cpus` (empty means "inherit", and conflicts with nobody); the
//! root must keep a hart while it holds tasks, so when no pool hart is left the last reserved
//! component stays unpartitioned (it is then exactly the root's remaining harts, hence still its
//! own root domain). A partition the kernel finds invalid reads back `root invalid (reason)`,
//! which is reported as an error.

pub mod cpu;
pub mod cpuset;
pub mod memory;

use crate::fs::Fs;
use crate::v1::pids;
use crate::{Backend, CgroupError, Result, Version};
use std::path::{Path, PathBuf};
use tess_core::layout::{CellClass, CellLayout, DomainMode, Layout};
use tess_sched::HartSet;

const PROCS: &str = "cgroup.procs";
const THREADS: &str = "cgroup.threads";
const SUBTREE_CONTROL: &str = "cgroup.subtree_control";
const CONTROLLERS: &str = "+cpuset +cpu +memory +pids";

/// One cpuset partition the layout wants: its harts and whether it is isolated.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Part {
    harts: HartSet,
    kind: cpuset::Partition,
}

/// The v2 backend.
#[derive(Debug)]
pub struct V2 {
    root: PathBuf,
    group: String,
    fs: Fs,
}

impl V2 {
    /// A backend over the unified hierarchy mounted at `root`, keeping its groups under `group`
    /// (and its partitions beside it, `group.part-HARTS`).
    pub fn new(root: PathBuf, group: &str, fs: Fs) -> V2 {
        V2 {
            root,
            group: group.to_string(),
            fs,
        }
    }

    fn top(&self) -> PathBuf {
        self.root.join(&self.group)
    }

    fn part_prefix(&self) -> String {
        format!("{}.part-", self.group)
    }

    /// The partitions `layout` wants: one isolated partition per dedicated cell, one root
    /// partition per component of reserved harts (all but the last when no pool is left).
    fn partitions(layout: &Layout) -> Vec<Part> {
        let mut parts: Vec<Part> = layout
            .domains
            .iter()
            .filter(|d| d.is_subset(&layout.reserved))
            .map(|d| Part {
                harts: d.clone(),
                kind: cpuset::Partition::Root,
            })
            .collect();
        if layout.pool.is_empty() && layout.all.difference(&layout.managed).is_empty() {
            parts.pop();
        }
        parts.extend(
            layout
                .cells
                .values()
                .filter(|c| c.class == CellClass::Dedicated)
                .map(|c| Part {
                    harts: c.cpus.clone(),
                    kind: cpuset::Partition::Isolated,
                }),
        );
        parts
    }

    fn partition_dir(&self, harts: &HartSet) -> PathBuf {
        self.root.join(format!("{}{harts}", self.part_prefix()))
    }

    /// Partition directories present now (tess's, by name).
    fn existing_partitions(&self) -> Vec<PathBuf> {
        let prefix = self.part_prefix();
        self.fs
            .children(&self.root)
            .into_iter()
            .filter(|c| c.starts_with(&prefix))
            .map(|c| self.root.join(c))
            .collect()
    }

    /// Where cell `name` lives under `layout`.
    fn cell_dir_in(&self, name: &str, cell: &CellLayout, layout: &Layout) -> PathBuf {
        if cell.class != CellClass::Shared {
            if let Some(p) = Self::partitions(layout)
                .iter()
                .find(|p| cell.cpus.is_subset(&p.harts))
            {
                return self.partition_dir(&p.harts).join(name);
            }
        }
        self.top().join("cells").join(name)
    }

    /// Where cell `name` lives now, found by looking.
    fn current_dir(&self, name: &str) -> Option<PathBuf> {
        let plain = self.top().join("cells").join(name);
        if plain.is_dir() {
            return Some(plain);
        }
        self.existing_partitions()
            .into_iter()
            .map(|p| p.join(name))
            .find(|p| p.is_dir())
    }

    fn evacuate_and_remove(&self, dir: &Path) -> Result<()> {
        if !dir.exists() {
            return Ok(());
        }
        for child in self.fs.children(dir) {
            self.evacuate_and_remove(&dir.join(child))?;
        }
        if dir.join(cpuset::PARTITION).exists() {
            let _ = cpuset::set_partition(&self.fs, dir, cpuset::Partition::Member);
        }
        // Moves the group's processes to the root, then removes it.
        self.fs.evacuate_and_rmdir(dir, &self.root.join(PROCS))
    }

    fn ensure_parent(&self, dir: &Path) -> Result<()> {
        self.fs.mkdir(dir)?;
        self.fs
            .write_if_changed(&dir.join(SUBTREE_CONTROL), CONTROLLERS)
            .map(|_| ())
    }

    /// Removes partition `dir` once no cell is left in it.
    fn remove_if_empty(&self, dir: &Path) -> Result<()> {
        if dir.is_dir() && self.fs.children(dir).is_empty() {
            self.evacuate_and_remove(dir)?;
        }
        Ok(())
    }
}

impl Backend for V2 {
    fn version(&self) -> Version {
        Version::V2
    }

    fn domain_mode(&self) -> DomainMode {
        DomainMode::PerComponent
    }

    fn describe(&self) -> String {
        format!(
            "cgroup v2 at {}; groups under {}/, partitions {}*",
            self.root.display(),
            self.group,
            self.part_prefix()
        )
    }

    fn init(&self, _all: &HartSet) -> Result<()> {
        // The root's subtree_control lists what it already enables: `write_if_changed` would
        // compare "+cpuset ..." with "cpuset ..." and write anyway, which is harmless.
        self.fs
            .write(&self.root.join(SUBTREE_CONTROL), CONTROLLERS)?;
        self.ensure_parent(&self.top())?;
        self.ensure_parent(&self.top().join("cells"))?;
        Ok(())
    }

    fn apply_topology(&self, layout: &Layout) -> Result<()> {
        let wanted = Self::partitions(layout);
        // Partitions that are not wanted as they are give their harts back first, so that the
        // wanted ones can claim them: they become members (their cells keep their tasks until
        // `apply_cell` moves them) and go once empty.
        for dir in self.existing_partitions() {
            let keep = wanted.iter().any(|p| {
                self.partition_dir(&p.harts) == dir
                    && self
                        .fs
                        .read(&dir.join(cpuset::PARTITION))
                        .is_ok_and(|k| k.trim() == p.kind.as_str())
            });
            if !keep {
                if dir.join(cpuset::PARTITION).exists() {
                    cpuset::set_partition(&self.fs, &dir, cpuset::Partition::Member)?;
                }
                self.remove_if_empty(&dir)?;
            }
        }
        for p in &wanted {
            let dir = self.partition_dir(&p.harts);
            self.fs.mkdir(&dir)?;
            cpuset::set_cpus(&self.fs, &dir, &p.harts)?;
            cpuset::set_partition(&self.fs, &dir, p.kind)?;
            self.ensure_parent(&dir)?;
        }
        Ok(())
    }

    fn apply_cell(&self, name: &str, cell: &CellLayout, layout: &Layout) -> Result<()> {
        let dir = self.cell_dir_in(name, cell, layout);
        let moved_from = self.current_dir(name).filter(|d| *d != dir);
        self.fs.mkdir(&dir)?;
        cpuset::set_cpus(&self.fs, &dir, &cell.cpus)?;
        cpu::set_weight(&self.fs, &dir, cell.cpu_weight.unwrap_or(100))?;
        cpu::set_max(&self.fs, &dir, cell.cfs_limit)?;
        memory::set_max(&self.fs, &dir, cell.memory_max)?;
        pids::set_max(&self.fs, &dir, cell.pids_max)?;
        if let Some(old) = moved_from {
            self.fs.move_all(&old.join(PROCS), &dir.join(PROCS))?;
            self.evacuate_and_remove(&old)?;
            if let Some(parent) = old.parent().filter(|p| *p != self.top().join("cells")) {
                let wanted = Self::partitions(layout)
                    .iter()
                    .any(|p| self.partition_dir(&p.harts) == parent);
                if !wanted {
                    self.remove_if_empty(parent)?;
                }
            }
        }
        Ok(())
    }

    fn remove_cell(&self, name: &str) -> Result<()> {
        let Some(dir) = self.current_dir(name) else {
            return Ok(());
        };
        self.evacuate_and_remove(&dir)?;
        // A partition left without cells stays until the next `apply_topology` decides.
        Ok(())
    }

    fn attach_process(&self, name: &str, pid: i32, _cpu: bool) -> Result<()> {
        // One hierarchy: every controller moves at once (see the trait docs for what that costs
        // on single-hart partitions).
        let dir = self
            .current_dir(name)
            .ok_or_else(|| CgroupError::Unsupported(format!("cell {name} has no cgroup")))?;
        self.fs.write(&dir.join(PROCS), &pid.to_string())
    }

    fn complete_attach(&self, _name: &str, _cpus: &HartSet) -> Result<usize> {
        Ok(0)
    }

    fn threads(&self, name: &str) -> Result<Vec<i32>> {
        match self.current_dir(name) {
            Some(d) => self.fs.read_ids(&d.join(THREADS)),
            None => Ok(Vec::new()),
        }
    }

    fn processes(&self, name: &str) -> Result<Vec<i32>> {
        match self.current_dir(name) {
            Some(d) => self.fs.read_ids(&d.join(PROCS)),
            None => Ok(Vec::new()),
        }
    }

    fn existing_cells(&self) -> Result<Vec<String>> {
        let mut names = self.fs.children(&self.top().join("cells"));
        for part in self.existing_partitions() {
            names.extend(self.fs.children(&part));
        }
        names.sort();
        names.dedup();
        Ok(names)
    }

    fn sweep_into_system(&self) -> Result<usize> {
        Ok(0)
    }

    fn teardown(&self) -> Result<()> {
        for part in self.existing_partitions() {
            self.evacuate_and_remove(&part)?;
        }
        self.evacuate_and_remove(&self.top())
    }

    fn cell_cpuset_dir(&self, name: &str) -> PathBuf {
        self.current_dir(name)
            .unwrap_or_else(|| self.top().join("cells").join(name))
    }

    fn cell_of_pid(&self, pid: i32) -> Option<String> {
        crate::cell_in_path(&crate::proc_cgroup_path(pid, None)?, &self.group)
    }

    fn foreign_conflicts(&self, _layout: &Layout) -> Vec<String> {
        // Partitions are exclusive on v2: the kernel itself keeps everyone else off.
        Vec::new()
    }
}

#[cfg(test)]
mod tests;
