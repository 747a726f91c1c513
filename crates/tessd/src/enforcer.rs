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
    /// When the last convergence that skipped nothing ended, if the ones since all succeeded:
    /// `None` at first, after a failed convergence (the kernel may then hold neither layout) or
    /// a teardown, and the next one writes everything, `Backend::init` included.
    full_pass: Option<std::time::Instant>,
    /// How long convergences may write only what differs before one writes everything again,
    /// which repairs what other programs changed meanwhile (an outside edit, a partition the
    /// kernel invalidated after a hotplug).
    pub full_pass_every: std::time::Duration,
}

/// Default of [`Enforcer::full_pass_every`].
const FULL_PASS_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// What a convergence from a known layout may leave alone: the partitioning, and the cgroups
/// of cells whose plan is the same and whose cgroup is there.
///
/// `from` is trusted only while every convergence since the last full one succeeded, and for
/// at most [`Enforcer::full_pass_every`]. Applying a change, `from` is then the committed
/// layout the kernel holds: tessd is the only writer of these files. A convergence that fails
/// part-way leaves the kernel between two layouts, so the one after it (the rollback) writes
/// everything, as start-up does; start-up and the periodic full pass also repair whatever a
/// killed daemon or another program left behind.
struct Unchanged<'a> {
    /// The partitioning ([`same_partitioning`]) is the same, so `Backend::apply_topology`
    /// would write nothing new.
    topology: bool,
    /// The cells' plans before, when the partitioning is the same.
    cells: Option<&'a std::collections::BTreeMap<String, tess_core::layout::CellLayout>>,
    to: &'a Layout,
    /// Cells whose cgroups exist now.
    existing: &'a [String],
}

impl<'a> Unchanged<'a> {
    fn between(from: Option<&'a Layout>, to: &'a Layout, existing: &'a [String]) -> Unchanged<'a> {
        let topology = from.is_some_and(|f| same_partitioning(f, to));
        Unchanged {
            topology,
            cells: from.filter(|_| topology).map(|f| &f.cells),
            to,
            existing,
        }
    }

    /// Whether cell `name` is planned the same before and after, on the same partitioning
    /// (a cell's cgroup path and limits may depend on the partitioning, as on v2), and its
    /// cgroup is there (another program may have removed it).
    fn cell(&self, name: &str) -> bool {
        self.cells
            .and_then(|c| c.get(name))
            .is_some_and(|before| self.to.cells.get(name) == Some(before))
            && self.existing.iter().any(|e| e == name)
    }
}

/// Whether two layouts partition the harts alike, as far as `Backend::apply_topology` goes:
/// the hart sets and scheduling domains, each dedicated cell's harts (v2 makes one partition
/// per dedicated cell: a split or merge keeps the union of their harts), and the RT bandwidth
/// the group servers need from their parents (v1 sets that in the topology step).
fn same_partitioning(a: &Layout, b: &Layout) -> bool {
    // By name (the cells' order): a dedicated cell renamed on the same harts counts as a new
    // partitioning, which only costs the writes of a full pass.
    fn dedicated(l: &Layout) -> Vec<(&String, &HartSet)> {
        l.cells
            .iter()
            .filter(|(_, c)| c.class == CellClass::Dedicated)
            .map(|(n, c)| (n, &c.cpus))
            .collect()
    }
    fn group_servers(l: &Layout) -> Vec<(&String, Option<tess_core::layout::Reservation>)> {
        l.cells
            .iter()
            .filter(|(_, c)| c.group_server)
            .map(|(n, c)| (n, c.reservation))
            .collect()
    }
    a.all == b.all
        && a.managed == b.managed
        && a.dedicated == b.dedicated
        && a.reserved == b.reserved
        && a.pool == b.pool
        && a.system == b.system
        && a.domains == b.domains
        && group_servers(a) == group_servers(b)
        && dedicated(a) == dedicated(b)
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
            full_pass: None,
            full_pass_every: FULL_PASS_EVERY,
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
        // From a known layout, only what differs is written (see `Unchanged`): a transaction
        // that changes one cell's weight costs a few cgroup files, not the whole tree. That
        // matters because the engine holds the system hart at SCHED_FIFO while it converges.
        // Everything is written at start-up, after a convergence that failed, and once every
        // `full_pass_every`.
        let prev_full_pass = self.full_pass.take();
        let trusted =
            from.filter(|_| prev_full_pass.is_some_and(|t| t.elapsed() < self.full_pass_every));
        let started = std::time::Instant::now();
        // A trusted `from` means a full convergence, `init` included, succeeded since the
        // last teardown: tess's cgroups are there.
        if trusted.is_none() {
            b.init(&self.all).context("creating tess's cgroups")?;
        }
        let existing = b.existing_cells().context("listing cell cgroups")?;
        let kept = Unchanged::between(trusted, to, &existing);
        // 1. Threads leave SCHED_DEADLINE before their cell stops being reserved, moves, or goes.
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
        if !kept.topology {
            b.apply_topology(to)
                .context("applying the hart partitioning")?;
        }
        for (name, cl) in &to.cells {
            if kept.cell(name) {
                continue;
            }
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
        self.full_pass = Some(
            prev_full_pass
                .filter(|_| trusted.is_some())
                .unwrap_or(started),
        );
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
        self.full_pass = None;
        b.teardown().context("removing tess's cgroups")?;
        kernel::restore_all(&self.kernel, store)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! What a convergence writes, through a cgroup backend that records each step (a test
    //! double; the real backends run against a model of cgroupfs in tess-cgroup's tests and
    //! against the kernel in the root tests).

    use super::*;
    use crate::engine::tests::cell;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;
    use tess_cgroup::{CgroupError, Version};
    use tess_core::layout::{CellLayout, DomainMode};
    use tess_core::spec::{HartRequest, Policy};

    /// Records `init`, `topology`, `cell NAME` and `remove NAME`; refuses `apply_cell` of
    /// one cell while `refuse` names it.
    #[derive(Debug, Default)]
    struct Steps {
        log: Mutex<Vec<String>>,
        cells: Mutex<Vec<String>>,
        refuse: Mutex<Option<String>>,
    }

    impl Steps {
        fn take(&self) -> Vec<String> {
            std::mem::take(&mut *self.log.lock().unwrap())
        }
        fn note(&self, s: String) {
            self.log.lock().unwrap().push(s);
        }
    }

    impl Backend for Steps {
        fn version(&self) -> Version {
            Version::V1
        }
        fn domain_mode(&self) -> DomainMode {
            DomainMode::PerHart
        }
        fn describe(&self) -> String {
            "steps".into()
        }
        fn init(&self, _: &HartSet) -> tess_cgroup::Result<()> {
            self.note("init".into());
            Ok(())
        }
        fn apply_topology(&self, _: &Layout) -> tess_cgroup::Result<()> {
            self.note("topology".into());
            Ok(())
        }
        fn apply_cell(&self, name: &str, _: &CellLayout, _: &Layout) -> tess_cgroup::Result<()> {
            self.note(format!("cell {name}"));
            if self.refuse.lock().unwrap().as_deref() == Some(name) {
                return Err(CgroupError::Unsupported(format!("refused {name}")));
            }
            let mut cells = self.cells.lock().unwrap();
            if !cells.iter().any(|c| c == name) {
                cells.push(name.into());
            }
            Ok(())
        }
        fn remove_cell(&self, name: &str) -> tess_cgroup::Result<()> {
            self.note(format!("remove {name}"));
            self.cells.lock().unwrap().retain(|c| c != name);
            Ok(())
        }
        fn attach_process(&self, _: &str, _: i32, _: bool) -> tess_cgroup::Result<()> {
            Ok(())
        }
        fn complete_attach(&self, _: &str, _: &HartSet) -> tess_cgroup::Result<usize> {
            Ok(0)
        }
        fn threads(&self, _: &str) -> tess_cgroup::Result<Vec<i32>> {
            Ok(Vec::new())
        }
        fn processes(&self, _: &str) -> tess_cgroup::Result<Vec<i32>> {
            Ok(Vec::new())
        }
        fn existing_cells(&self) -> tess_cgroup::Result<Vec<String>> {
            Ok(self.cells.lock().unwrap().clone())
        }
        fn sweep_into_system(&self) -> tess_cgroup::Result<usize> {
            Ok(0)
        }
        fn teardown(&self) -> tess_cgroup::Result<()> {
            self.note("teardown".into());
            self.cells.lock().unwrap().clear();
            Ok(())
        }
        fn cell_cpuset_dir(&self, name: &str) -> std::path::PathBuf {
            std::path::Path::new("/steps").join(name)
        }
        fn cell_of_pid(&self, _: i32) -> Option<String> {
            None
        }
        fn foreign_conflicts(&self, _: &Layout) -> Vec<String> {
            Vec::new()
        }
    }

    struct Rig {
        steps: Arc<Steps>,
        enforcer: Enforcer,
        store: Store,
        _dir: tempfile::TempDir,
    }

    fn rig() -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let steps = Arc::new(Steps::default());
        let kernel = KernelPaths {
            proc_root: dir.path().join("proc"),
            sys_root: dir.path().join("sys"),
        };
        let all: HartSet = (0..4).collect();
        let enforcer = Enforcer::new(steps.clone(), kernel, false, all.clone(), all);
        Rig {
            steps,
            enforcer,
            store: Store::open(dir.path()).unwrap(),
            _dir: dir,
        }
    }

    /// A layout of best-effort cells `(name, weight, hart)` and one event-triggered cell per
    /// `(name, budget_ms, hart)`.
    fn layout(rig: &Rig, best_effort: &[(&str, u32, usize)], et: &[(&str, u64, usize)]) -> Layout {
        let best_effort = best_effort
            .iter()
            .map(|&(name, weight, hart)| (name, Policy::BestEffort { weight }, hart));
        let et = et.iter().map(|&(name, budget_ms, hart)| {
            let policy = Policy::EventTriggered {
                period: Duration::from_millis(10),
                budget: Duration::from_millis(budget_ms),
            };
            (name, policy, hart)
        });
        let mut cluster = Cluster::default();
        for (name, policy, hart) in best_effort.chain(et) {
            let harts = HartSet::single(hart);
            let mut c = cell(name, policy, HartRequest::Ids(harts.clone()));
            c.harts = harts;
            cluster.cells.insert(name.into(), c);
        }
        rig.enforcer.plan(&cluster)
    }

    #[test]
    fn start_up_writes_everything_and_a_change_only_what_differs() {
        let mut r = rig();
        let a = layout(&r, &[("be", 100, 1), ("other", 100, 1)], &[("et", 1, 1)]);
        r.enforcer.converge(None, &a, &r.store).unwrap();
        assert_eq!(
            r.steps.take(),
            ["init", "topology", "cell be", "cell et", "cell other"]
        );
        // A new weight for one cell: that cell alone.
        let b = layout(&r, &[("be", 101, 1), ("other", 100, 1)], &[("et", 1, 1)]);
        assert!(same_partitioning(&a, &b));
        r.enforcer.converge(Some(&a), &b, &r.store).unwrap();
        assert_eq!(r.steps.take(), ["cell be"]);
        // Nothing new: nothing written.
        r.enforcer.converge(Some(&b), &b, &r.store).unwrap();
        assert!(r.steps.take().is_empty());
        // Not knowing what the kernel holds: everything again.
        r.enforcer.converge(None, &b, &r.store).unwrap();
        assert_eq!(
            r.steps.take(),
            ["init", "topology", "cell be", "cell et", "cell other"]
        );
    }

    #[test]
    fn a_new_partitioning_rewrites_every_cell() {
        let mut r = rig();
        let a = layout(&r, &[("be", 100, 1)], &[("et", 1, 1)]);
        r.enforcer.converge(None, &a, &r.store).unwrap();
        r.steps.take();
        // The reservation moves to hart 2: the domains change, and a cell's cgroup may depend
        // on them (v2 places cells under their partition), so every cell is written.
        let b = layout(&r, &[("be", 100, 1)], &[("et", 1, 2)]);
        assert!(!same_partitioning(&a, &b));
        r.enforcer.converge(Some(&a), &b, &r.store).unwrap();
        assert_eq!(r.steps.take(), ["topology", "cell be", "cell et"]);
    }

    #[test]
    fn a_deleted_cell_is_removed_and_the_others_left_alone() {
        let mut r = rig();
        let a = layout(&r, &[("be", 100, 1), ("gone", 100, 1)], &[]);
        r.enforcer.converge(None, &a, &r.store).unwrap();
        r.steps.take();
        let b = layout(&r, &[("be", 100, 1)], &[]);
        r.enforcer.converge(Some(&a), &b, &r.store).unwrap();
        assert_eq!(r.steps.take(), ["remove gone"]);
    }

    #[test]
    fn after_a_failed_change_everything_is_written_again() {
        let mut r = rig();
        let a = layout(&r, &[("x", 100, 1), ("y", 100, 1), ("z", 100, 1)], &[]);
        r.enforcer.converge(None, &a, &r.store).unwrap();
        r.steps.take();
        // The change to x and y fails at y, after x was written.
        let b = layout(&r, &[("x", 200, 1), ("y", 200, 1), ("z", 100, 1)], &[]);
        *r.steps.refuse.lock().unwrap() = Some("y".into());
        assert!(r.enforcer.converge(Some(&a), &b, &r.store).is_err());
        assert_eq!(r.steps.take(), ["cell x", "cell y"]);
        // The rollback does not trust the attempted layout: the kernel holds neither.
        *r.steps.refuse.lock().unwrap() = None;
        r.enforcer.converge(Some(&b), &a, &r.store).unwrap();
        assert_eq!(
            r.steps.take(),
            ["init", "topology", "cell x", "cell y", "cell z"]
        );
        // Once that succeeded, changes write only what differs again.
        r.enforcer.converge(Some(&a), &b, &r.store).unwrap();
        assert_eq!(r.steps.take(), ["cell x", "cell y"]);
    }

    #[test]
    fn a_cell_whose_cgroup_went_is_made_again() {
        let mut r = rig();
        let a = layout(&r, &[("be", 100, 1), ("other", 100, 1)], &[]);
        r.enforcer.converge(None, &a, &r.store).unwrap();
        r.steps.take();
        // Another program removed the cell's cgroup.
        r.steps.cells.lock().unwrap().retain(|c| c != "other");
        r.enforcer.converge(Some(&a), &a, &r.store).unwrap();
        assert_eq!(r.steps.take(), ["cell other"]);
    }

    #[test]
    fn splitting_a_dedicated_cell_is_a_new_partitioning() {
        let mut r = rig();
        let dedicated = |r: &Rig, cells: &[(&str, &[usize])]| {
            let mut cluster = Cluster::default();
            for &(name, harts) in cells {
                let set: HartSet = harts.iter().copied().collect();
                let mut c = cell(name, Policy::Dedicated, HartRequest::Ids(set.clone()));
                c.harts = set;
                cluster.cells.insert(name.into(), c);
            }
            r.enforcer.plan(&cluster)
        };
        let a = dedicated(&r, &[("a", &[2, 3])]);
        let b = dedicated(&r, &[("a", &[2]), ("b", &[3])]);
        assert_eq!(
            a.dedicated, b.dedicated,
            "the union of dedicated harts is the same"
        );
        assert!(
            !same_partitioning(&a, &b),
            "v2 makes a partition per dedicated cell"
        );
        r.enforcer.converge(None, &a, &r.store).unwrap();
        r.steps.take();
        r.enforcer.converge(Some(&a), &b, &r.store).unwrap();
        assert_eq!(r.steps.take(), ["topology", "cell a", "cell b"]);
    }

    #[test]
    fn a_full_pass_comes_every_full_pass_every() {
        let mut r = rig();
        let a = layout(&r, &[("be", 100, 1)], &[]);
        r.enforcer.converge(None, &a, &r.store).unwrap();
        r.steps.take();
        r.enforcer.full_pass_every = Duration::ZERO;
        r.enforcer.converge(Some(&a), &a, &r.store).unwrap();
        assert_eq!(r.steps.take(), ["init", "topology", "cell be"]);
    }

    #[test]
    fn after_a_teardown_the_cgroups_are_made_again() {
        let mut r = rig();
        let a = layout(&r, &[("be", 100, 1)], &[]);
        r.enforcer.converge(None, &a, &r.store).unwrap();
        r.enforcer.teardown(Some(&a), &r.store).unwrap_or_default();
        r.steps.take();
        r.enforcer.converge(Some(&a), &a, &r.store).unwrap();
        assert_eq!(r.steps.take()[0], "init");
    }
}
