//! Making the kernel match a layout.
//!
//! [`Enforcer::converge`] takes the kernel from whatever state it is in (the previous layout, or
//! anything a killed daemon left behind) to a target layout, idempotently. The engine uses it
//! both to apply a change and to roll one back, and once at start-up to restore the committed
//! state.

use crate::kernel::{self, KernelPaths};
use crate::store::Store;
use crate::threads::{SyncReport, ThreadManager};
use anyhow::{Context, Result};
use tess_cgroup::Backend;
use tess_core::layout::{plan_with, CellClass, Layout};
use tess_core::state::Cluster;
use tess_sched::HartSet;

/// How long a convergence waits for the budget ticks it starts before it promotes threads.
const TICK_START_LIMIT: std::time::Duration = std::time::Duration::from_millis(50);

/// Applies layouts to the kernel.
#[derive(Debug)]
pub struct Enforcer {
    backend: std::sync::Arc<dyn Backend>,
    /// Thread placement for reserved cells.
    pub threads: ThreadManager,
    kernel: KernelPaths,
    steer_irqs: bool,
    all: HartSet,
    managed: HartSet,
    /// IRQs steered at the last convergence.
    pub irqs_steered: usize,
    /// Idle spinners of dedicated cells and of the shared harts of time-triggered cells.
    pub spinners: crate::idle::Spinners,
    /// Foreign cgroups that undermine the layout (see `Backend::foreign_conflicts`).
    pub conflicts: Vec<String>,
    /// Serve event-triggered cells by RT group bandwidth where the backend can (the
    /// experimental `group-servers` setting).
    pub group_servers: bool,
    /// Budget ticks of the harts that hold reservations, where the kernel cannot end budgets
    /// exactly (`crate::budget_tick`); `None`: not needed or turned off.
    pub budget_ticks: Option<crate::budget_tick::BudgetTicks>,
}

/// Between the steps of a convergence: where the crash tests stop the daemon with the kernel
/// half changed (a no-op unless built with the `fault-injection` feature).
fn fault_pause() {
    crate::fault::reached(crate::fault::Point::MidApply);
}

impl Enforcer {
    /// A new enforcer over `backend`, managing `managed` out of `all` harts.
    pub fn new(
        backend: std::sync::Arc<dyn Backend>,
        kernel: KernelPaths,
        steer_irqs: bool,
        all: HartSet,
        managed: HartSet,
    ) -> Enforcer {
        let mut spinners = crate::idle::Spinners::default();
        spinners.adopt(backend.as_ref());
        Enforcer {
            backend,
            threads: ThreadManager::default(),
            kernel,
            steer_irqs,
            all,
            managed,
            irqs_steered: 0,
            spinners,
            conflicts: Vec::new(),
            group_servers: false,
            budget_ticks: None,
        }
    }

    /// The cgroup backend.
    pub fn backend(&self) -> &dyn Backend {
        self.backend.as_ref()
    }

    /// A shared handle on the cgroup backend, for readers that must not wait for the engine.
    pub fn shared_backend(&self) -> std::sync::Arc<dyn Backend> {
        self.backend.clone()
    }

    /// The layout of `cluster` on this machine.
    pub fn plan(&self, cluster: &Cluster) -> Layout {
        let mut layout = plan_with(
            cluster,
            &self.all,
            &self.managed,
            self.backend.domain_mode(),
            self.group_servers && self.backend.group_servers().is_some(),
        );
        // Where budget ticks end the budgets, a window's deadline must leave a tick room to
        // preempt it (crate::budget_tick).
        if let Some(t) = &self.budget_ticks {
            t.widen_windows(&mut layout);
        }
        layout
    }

    /// Converges the kernel to `to`. `from` is what the kernel is believed to hold (`None` at
    /// start-up, when anything may be there). Returns the time-triggered cells whose windows
    /// changed in place and need re-aligning ([`Enforcer::rephase`]).
    pub fn converge(
        &mut self,
        from: Option<&Layout>,
        to: &Layout,
        store: &Store,
    ) -> Result<Vec<String>> {
        if let Some(t) = self.budget_ticks.as_mut() {
            t.stop_unwanted(to);
        }
        let b = self.backend.as_ref();
        b.init(&self.all).context("creating tess's cgroups")?;
        // 1. Threads leave SCHED_DEADLINE before their cell stops being reserved, moves, or goes.
        let existing = b.existing_cells().context("listing cell cgroups")?;
        for name in &existing {
            let target = to.cells.get(name);
            let before = from.and_then(|f| f.cells.get(name));
            let release = match (before, target) {
                (_, None) => true,
                (_, Some(t)) if t.class != CellClass::Reserved => {
                    from.is_none() || before.is_some_and(|b| b.class == CellClass::Reserved)
                }
                // A reserved cell whose harts change keeps its threads; only those on harts it
                // loses leave SCHED_DEADLINE (below), and sync re-places them.
                (Some(_), Some(_)) => false,
                (None, Some(_)) => false,
            };
            if let (Some(t), false) = (target, release) {
                if t.class == CellClass::Reserved {
                    self.threads.evict(b, name, &t.cpus).with_context(|| {
                        format!("moving the threads of cell {name} off the harts it loses")
                    })?;
                }
            }
            if release {
                let cpus = target
                    .map(|t| t.cpus.clone())
                    .unwrap_or_else(|| to.system.clone());
                self.threads
                    .release(b, name, &cpus)
                    .with_context(|| format!("releasing the threads of cell {name}"))?;
            }
        }
        fault_pause();
        // 2. Spinners that are not wanted stop, and cells that should not exist go (their tasks
        // to the system group, with their timer slack back to the default).
        self.spinners.stop_unwanted(to);
        for name in &existing {
            let was_spinning = from
                .and_then(|f| f.cells.get(name))
                .is_none_or(|c| c.idle_spin);
            let spins = to.cells.get(name).is_some_and(|c| c.idle_spin);
            if was_spinning && !spins {
                crate::idle::set_timer_slack(b, name, 0, &[]);
            }
            if !to.cells.contains_key(name) {
                b.remove_cell(name)
                    .with_context(|| format!("removing cell {name}"))?;
            }
        }
        fault_pause();
        // 3. Partitioning, then each cell.
        b.apply_topology(to)
            .context("applying the hart partitioning")?;
        for (name, cl) in &to.cells {
            b.apply_cell(name, cl, to)
                .with_context(|| format!("configuring cell {name}"))?;
        }
        fault_pause();
        // 4. Stray tasks out of the root (v1), tessd among them at start-up. Before the ticks
        // join their domains: on v1 a process written to `cgroup.procs` takes all its threads
        // along, so sweeping tessd after its ticks had joined them would pull them back out.
        if from.is_none_or(|f| f.system != to.system || f.dedicated != to.dedicated) {
            b.sweep_into_system()
                .context("moving tasks out of the cgroup root")?;
        }
        fault_pause();
        // 5. Budget ticks on the harts that now hold reservations (a tick that lost its domain
        // or policy is restarted), running before any thread is promoted there: a reservation
        // on a hart without its tick overruns its budget by up to a scheduler tick
        // (crate::budget_tick). The root domains they join exist since step 3.
        if let Some(t) = self.budget_ticks.as_mut() {
            t.reconcile(&self.backend, to, true);
            let late = t.wait_started(TICK_START_LIMIT);
            if !late.is_empty() {
                tracing::warn!(
                    "the budget ticks of harts {late} did not start within \
                     {TICK_START_LIMIT:?}; the reservations there are ended by the scheduler \
                     tick until they do"
                );
            }
        }
        // 6. Reservations.
        let mut rephase = Vec::new();
        for (name, cl) in &to.cells {
            if cl.class == CellClass::Reserved {
                let r = self.threads.sync(b, name, cl).with_context(|| {
                    format!("placing the threads of cell {name} under its reservation")
                })?;
                if r.rephase {
                    rephase.push(name.clone());
                }
            }
        }
        fault_pause();
        // 7. Cells that spin: spinners, and a 1 ns timer slack for their threads.
        self.spinners
            .start_wanted(b, to)
            .context("starting idle spinners")?;
        for name in to.cells.iter().filter(|(_, c)| c.idle_spin).map(|(n, _)| n) {
            crate::idle::set_timer_slack(b, name, 1, &self.spinners.pids(name));
        }
        fault_pause();
        // 8. IRQs and kernel workers off dedicated harts.
        let dedicated_changed = from.is_none_or(|f| f.dedicated != to.dedicated);
        if self.steer_irqs && dedicated_changed {
            let r = kernel::steer_off(&self.kernel, store, &to.dedicated, &self.all)
                .context("steering IRQs")?;
            if !r.unmovable.is_empty() && !to.dedicated.is_empty() {
                tracing::debug!(irqs = ?r.unmovable, "IRQs the kernel does not let move");
            }
            self.irqs_steered = r.steered;
        }
        // Other software's cgroups that undermine the layout cannot be fixed by tess: say so.
        self.conflicts = b.foreign_conflicts(to);
        for c in &self.conflicts {
            tracing::warn!("{c}");
        }
        Ok(rephase)
    }

    /// Re-aligns the windows of a time-triggered cell to the grid (after an in-place change).
    pub fn rephase(&mut self, layout: &Layout, name: &str) -> Result<usize> {
        match layout.cells.get(name) {
            Some(cl) => Ok(self.threads.rephase(self.backend.as_ref(), name, cl)?),
            None => Ok(0),
        }
    }

    /// Re-places the threads of one reserved cell (after a fork, or periodically).
    pub fn sync_cell(&mut self, layout: &Layout, name: &str) -> Result<SyncReport> {
        match layout.cells.get(name) {
            Some(cl) if cl.class == CellClass::Reserved => {
                Ok(self.threads.sync(self.backend.as_ref(), name, cl)?)
            }
            _ => Ok(SyncReport::default()),
        }
    }

    /// Lets each reserved cell's budget follow its working threads: samples their CPU time and
    /// re-divides the budget of a cell whose working set changed (`threads::demand`).
    pub fn follow_demand(&mut self, layout: &Layout) {
        for (name, cl) in &layout.cells {
            if cl.class != CellClass::Reserved {
                continue;
            }
            match self.threads.observe_demand(self.backend.as_ref(), name, cl) {
                Ok(true) => match self.threads.sync(self.backend.as_ref(), name, cl) {
                    Ok(report) => tracing::debug!(cell = name, ?report, "budget re-divided"),
                    Err(e) => tracing::warn!("cell {name}: re-dividing the budget: {e:#}"),
                },
                Ok(false) => {}
                Err(e) => tracing::debug!("cell {name}: sampling its threads: {e:#}"),
            }
        }
    }

    /// Periodic upkeep: sweep the root, finish attachments, keep reserved threads placed.
    pub fn housekeep(&mut self, layout: &Layout) -> Result<()> {
        self.backend.sweep_into_system()?;
        for (name, cl) in &layout.cells {
            self.backend.complete_attach(name, &cl.cpus)?;
            if cl.idle_spin {
                crate::idle::set_timer_slack(
                    self.backend.as_ref(),
                    name,
                    1,
                    &self.spinners.pids(name),
                );
            }
        }
        self.spinners.stop_unwanted(layout);
        if let Err(e) = self.spinners.start_wanted(self.backend.as_ref(), layout) {
            tracing::warn!("restarting idle spinners: {e:#}");
        }
        if let Some(t) = self.budget_ticks.as_mut() {
            t.reconcile(&self.backend, layout, true);
        }
        for (name, cl) in &layout.cells {
            if cl.class == CellClass::Reserved {
                if let Err(e) = self.threads.sync(self.backend.as_ref(), name, cl) {
                    tracing::warn!("cell {name}: {e:#}");
                }
            }
        }
        Ok(())
    }

    /// Removes everything tess set up and restores saved kernel settings.
    pub fn teardown(&mut self, layout: Option<&Layout>, store: &Store) -> Result<()> {
        // Deadline ticks first: the kernel refuses to restore sched_rt_runtime_us below the
        // bandwidth of running deadline tasks.
        if let Some(t) = self.budget_ticks.as_mut() {
            t.stop_all();
        }
        let b = self.backend.as_ref();
        self.spinners.stop_all(b);
        for name in b.existing_cells()? {
            let cpus = self.all.clone();
            let _ = self.threads.release(b, &name, &cpus);
            crate::idle::set_timer_slack(b, &name, 0, &[]);
        }
        let _ = layout;
        b.teardown().context("removing tess's cgroups")?;
        kernel::restore_all(&self.kernel, store)?;
        Ok(())
    }
}
