//! cgroup v2: the unified hierarchy.
//!
//! ```text
//! <root>/tess/                  +cpuset +cpu +memory +pids; cpuset.cpus.exclusive = partitioned harts
//! <root>/tess/cells/<name>/     dedicated cells are isolated partitions; best-effort cells and
//!                               reserved cells outside a partition live here too
//! <root>/tess/part-<harts>/     a root partition (its own root domain) per component of reserved
//!   <name>/                     harts, holding the reserved cells placed on it
//! ```
//!
//! Partitions whose parent is not a partition root are "remote partitions" (Linux 6.7+): every
//! ancestor lists the harts in `cpuset.cpus.exclusive`. The kernel removes a partition's harts
//! from every cgroup outside it, so tasks outside cells (in the root) automatically stay off
//! dedicated and reserved harts; no sweeping is needed. Because the root must keep at least one
//! hart, when no pool hart is left the last reserved component stays unpartitioned (it is then
//! exactly the root's remaining harts, hence still its own root domain).

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

/// The v2 backend.
#[derive(Debug)]
pub struct V2 {
    root: PathBuf,
    group: String,
    fs: Fs,
}

impl V2 {
    /// A backend over the unified hierarchy mounted at `root`, keeping its groups under `group`.
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

    /// The reserved components that become partitions (all but the last when no pool is left).
    fn partitions(layout: &Layout) -> Vec<HartSet> {
        let mut comps: Vec<HartSet> = layout
            .domains
            .iter()
            .filter(|d| d.is_subset(&layout.reserved))
            .cloned()
            .collect();
        if layout.pool.is_empty() && layout.all.difference(&layout.managed).is_empty() {
            comps.pop();
        }
        comps
    }

    fn partition_dir(&self, harts: &HartSet) -> PathBuf {
        self.top().join(format!("part-{harts}"))
    }

    /// Where cell `name` lives under `layout`.
    fn cell_dir_in(&self, name: &str, cell: &CellLayout, layout: &Layout) -> PathBuf {
        if cell.class == CellClass::Reserved {
            if let Some(p) = Self::partitions(layout)
                .iter()
                .find(|p| cell.cpus.is_subset(p))
            {
                return self.partition_dir(p).join(name);
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
        self.fs
            .children(&self.top())
            .into_iter()
            .filter(|c| c.starts_with("part-"))
            .map(|c| self.top().join(c).join(name))
            .find(|p| p.is_dir())
    }

    fn evacuate_and_remove(&self, dir: &Path) -> Result<()> {
        if !dir.exists() {
            return Ok(());
        }
        for child in self.fs.children(dir) {
            self.evacuate_and_remove(&dir.join(child))?;
        }
        self.fs.move_all(&dir.join(PROCS), &self.root.join(PROCS))?;
        if dir.join(cpuset::PARTITION).exists() {
            let _ = cpuset::set_partition(&self.fs, dir, cpuset::Partition::Member);
        }
        self.fs.rmdir(dir)
    }

    fn ensure_parent(&self, dir: &Path, cpus: &HartSet) -> Result<()> {
        self.fs.mkdir(dir)?;
        cpuset::set_cpus(&self.fs, dir, cpus)?;
        self.fs.write(&dir.join(SUBTREE_CONTROL), CONTROLLERS)
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
            "cgroup v2 at {}; groups under {}/",
            self.root.display(),
            self.group
        )
    }

    fn init(&self, all: &HartSet) -> Result<()> {
        self.fs
            .write(&self.root.join(SUBTREE_CONTROL), CONTROLLERS)?;
        self.ensure_parent(&self.top(), all)?;
        self.ensure_parent(&self.top().join("cells"), all)?;
        Ok(())
    }

    fn apply_topology(&self, layout: &Layout) -> Result<()> {
        let parts = Self::partitions(layout);
        let exclusive = parts
            .iter()
            .fold(layout.dedicated.clone(), |acc, p| acc.union(p));
        // Grow the ancestors' exclusive sets before children claim harts; stale partitions are
        // dissolved first (their cells are moved by apply_cell).
        let wanted: Vec<String> = parts.iter().map(|p| format!("part-{p}")).collect();
        for child in self.fs.children(&self.top()) {
            if child.starts_with("part-") && !wanted.contains(&child) {
                let dir = self.top().join(&child);
                if self.fs.children(&dir).is_empty() {
                    self.evacuate_and_remove(&dir)?;
                }
            }
        }
        cpuset::set_exclusive(&self.fs, &self.top(), &exclusive)?;
        cpuset::set_exclusive(&self.fs, &self.top().join("cells"), &layout.dedicated)?;
        for p in &parts {
            let dir = self.partition_dir(p);
            self.ensure_parent(&dir, p)?;
            cpuset::set_exclusive(&self.fs, &dir, p)?;
            cpuset::set_partition(&self.fs, &dir, cpuset::Partition::Root)?;
        }
        Ok(())
    }

    fn apply_cell(&self, name: &str, cell: &CellLayout, layout: &Layout) -> Result<()> {
        let dir = self.cell_dir_in(name, cell, layout);
        let moved_from = self.current_dir(name).filter(|d| *d != dir);
        self.fs.mkdir(&dir)?;
        cpuset::set_cpus(&self.fs, &dir, &cell.cpus)?;
        if cell.class == CellClass::Dedicated {
            cpuset::set_exclusive(&self.fs, &dir, &cell.cpus)?;
            cpuset::set_partition(&self.fs, &dir, cpuset::Partition::Isolated)?;
        } else if dir.join(cpuset::PARTITION).exists() && !self.fs.is_fake() {
            cpuset::set_partition(&self.fs, &dir, cpuset::Partition::Member)?;
        }
        cpu::set_weight(&self.fs, &dir, cell.cpu_weight.unwrap_or(100))?;
        cpu::set_max(&self.fs, &dir, cell.cfs_limit)?;
        memory::set_max(&self.fs, &dir, cell.memory_max)?;
        pids::set_max(&self.fs, &dir, cell.pids_max)?;
        if let Some(old) = moved_from {
            self.fs.move_all(&old.join(PROCS), &dir.join(PROCS))?;
            self.evacuate_and_remove(&old)?;
        }
        Ok(())
    }

    fn remove_cell(&self, name: &str) -> Result<()> {
        match self.current_dir(name) {
            Some(dir) => self.evacuate_and_remove(&dir),
            None => Ok(()),
        }
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
        for part in self
            .fs
            .children(&self.top())
            .into_iter()
            .filter(|c| c.starts_with("part-"))
        {
            names.extend(self.fs.children(&self.top().join(part)));
        }
        names.sort();
        Ok(names)
    }

    fn sweep_into_system(&self) -> Result<usize> {
        Ok(0)
    }

    fn teardown(&self) -> Result<()> {
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
