//! The engine's view of the kernel: one trait, [`KernelBackend`], between the transaction logic
//! and everything that touches cgroups, `SCHED_DEADLINE`, IRQs and spinners.
//!
//! The real implementation is [`Enforcer`]. Unit tests drive the engine through a recording
//! double (`tests::Recorder` in `engine/tests.rs`); there is no fake mode in production code.

use crate::enforcer::Enforcer;
use crate::store::Store;
use anyhow::Result;
use std::collections::BTreeMap;
use std::sync::Arc;
use tess_cgroup::Backend;
use tess_core::layout::Layout;
use tess_core::state::Cluster;

/// What the kernel side reports for `tess status`.
#[derive(Debug, Clone, Default)]
pub struct KernelHealth {
    /// IRQs steered off dedicated harts at the last convergence.
    pub irqs_steered: usize,
    /// Foreign cgroups that undermine the layout.
    pub conflicts: Vec<String>,
}

/// Everything the engine asks of the kernel.
pub trait KernelBackend: Send + std::fmt::Debug {
    /// The layout of `cluster` on this machine (pure: no kernel change).
    fn plan(&self, cluster: &Cluster) -> Layout;
    /// Converges the kernel to `to` (idempotent; `from` is what it is believed to hold, `None`
    /// when anything may be there). Returns cells whose windows need re-aligning.
    fn converge(
        &mut self,
        from: Option<&Layout>,
        to: &Layout,
        store: &Store,
    ) -> Result<Vec<String>>;
    /// Re-places the threads of one reserved cell.
    fn sync_cell(&mut self, layout: &Layout, name: &str) -> Result<()>;
    /// Re-aligns the windows of a time-triggered cell; returns how many threads moved.
    fn rephase(&mut self, layout: &Layout, name: &str) -> Result<usize>;
    /// Periodic upkeep.
    fn housekeep(&mut self, layout: &Layout) -> Result<()>;
    /// Re-divides reserved cells' budgets between the threads that work (`threads::demand`).
    fn follow_demand(&mut self, layout: &Layout);
    /// Cells with threads waiting to be promoted.
    fn pending_cells(&self) -> Vec<String>;
    /// The reserved cell a thread belongs to, if tess tracks it.
    fn tracked_cell_of(&self, tid: i32) -> Option<String>;
    /// The cgroup backend, shared with readers (membership queries never wait for the engine).
    fn cgroups(&self) -> Arc<dyn Backend>;
    /// Idle-spinner pids by cell.
    fn spinners(&self) -> BTreeMap<String, Vec<i32>>;
    /// IRQ steering and conflicts, for status.
    fn health(&self) -> KernelHealth;
}

impl KernelBackend for Enforcer {
    fn plan(&self, cluster: &Cluster) -> Layout {
        Enforcer::plan(self, cluster)
    }

    fn converge(
        &mut self,
        from: Option<&Layout>,
        to: &Layout,
        store: &Store,
    ) -> Result<Vec<String>> {
        Enforcer::converge(self, from, to, store)
    }

    fn sync_cell(&mut self, layout: &Layout, name: &str) -> Result<()> {
        Enforcer::sync_cell(self, layout, name).map(|_| ())
    }

    fn rephase(&mut self, layout: &Layout, name: &str) -> Result<usize> {
        Enforcer::rephase(self, layout, name)
    }

    fn housekeep(&mut self, layout: &Layout) -> Result<()> {
        Enforcer::housekeep(self, layout)
    }

    fn follow_demand(&mut self, layout: &Layout) {
        Enforcer::follow_demand(self, layout)
    }

    fn pending_cells(&self) -> Vec<String> {
        self.threads.pending_cells()
    }

    fn tracked_cell_of(&self, tid: i32) -> Option<String> {
        self.threads.cell_of(tid).map(str::to_string)
    }

    fn cgroups(&self) -> Arc<dyn Backend> {
        self.shared_backend()
    }

    fn spinners(&self) -> BTreeMap<String, Vec<i32>> {
        self.spinners.by_cell()
    }

    fn health(&self) -> KernelHealth {
        KernelHealth {
            irqs_steered: self.irqs_steered,
            conflicts: self.conflicts.clone(),
        }
    }
}
