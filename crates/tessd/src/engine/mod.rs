//! The engine: requests become transactions over the cluster state.
//!
//! Every change follows Tessellation's `update_cells` (seed 004 section 3.3): validate the new
//! distribution as a whole, prepare it, swap. One module per step:
//!
//! 1. [`admit`]: **place and admit** the whole new cluster (placement, admission control,
//!    quotas); pure.
//! 2. **plan**: the layout of the new cluster ([`KernelBackend::plan`], pure).
//! 3. **apply**: converge the kernel to the new layout ([`KernelBackend::converge`]; the real
//!    backend is [`crate::enforcer::Enforcer`]).
//! 4. [`journal`]: **commit** the new state in one database transaction.
//! 5. **publish** a [`view::Snapshot`] of it for readers ([`crate::daemon`]).
//!
//! [`txn`] orders the steps. If step 3 fails, the kernel is converged back to the old layout; if
//! step 4 fails (a full disk), likewise. If the daemon dies anywhere before step 4 completes,
//! SQLite rolls the unfinished transaction back on the next start, and start-up converges the
//! kernel to the last committed state; after step 4, to the new one. Either way the kernel ends
//! up exactly as last committed (docs/tessd.md, "Crash safety").
//!
//! [`requests`] turns each request into a next cluster; [`runtimes`] tells cell runtimes about
//! changes.

pub mod admit;
mod error;
pub mod journal;
pub mod kernel_backend;
mod requests;
mod runtimes;
#[cfg(test)]
pub(crate) mod tests;
mod txn;
pub mod view;

pub use error::{Caller, EngineError};
pub use kernel_backend::{KernelBackend, KernelHealth};
pub use requests::merge;

use crate::config::Config;
use crate::enforcer::Enforcer;
use crate::kernel::{self, KernelPaths};
use crate::store::{Persisted, Store};
use anyhow::{Context, Result};
use error::EResult;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tess_cgroup::fs::Fs;
use tess_cgroup::{Backend, Version};
use tess_core::admission::{self, Capacity};
use tess_core::layout::Layout;
use tess_core::quota::Quota;
use tess_core::state::{Cell, Cluster};
use tess_proto::{ApplyResult, CellInfo, ErrorKind, Request, Response};
use view::Snapshot;

/// The daemon's state and its single point of change. One transaction at a time holds it
/// ([`crate::daemon::Daemon`]); readers use [`Snapshot`]s instead.
#[derive(Debug)]
pub struct Engine {
    config: Arc<Config>,
    store: Store,
    kernel: Box<dyn KernelBackend>,
    cap: Capacity,
    cluster: Cluster,
    layout: Layout,
    quotas: BTreeMap<u32, Quota>,
    generation: u64,
    started: Instant,
    /// Time-triggered cells whose windows changed in place, re-aligned by housekeeping.
    rephase_due: BTreeSet<String>,
    /// Control channels of cell runtimes (`tess_proto::runtime`), by cell.
    runtimes: BTreeMap<String, tess_channel::Endpoint>,
    /// Sequence number of adaptation events.
    adapt_seq: u64,
}

/// Builds the cgroup backend the configuration asks for.
pub fn make_backend(config: &Config) -> Result<Arc<dyn Backend>> {
    let h = tess_cgroup::detect().context("reading /proc/self/mountinfo")?;
    let version = match config.cgroup {
        crate::config::CgroupChoice::Auto => h.preferred()?,
        crate::config::CgroupChoice::V1 => Version::V1,
        crate::config::CgroupChoice::V2 => Version::V2,
    };
    Ok(match version {
        Version::V1 => {
            let missing = |c: &str| anyhow::anyhow!("cgroup v1 has no {c} hierarchy mounted");
            Arc::new(tess_cgroup::v1::V1::new(
                tess_cgroup::v1::V1Paths {
                    cpuset: h.v1_cpuset.clone().ok_or_else(|| missing("cpuset"))?,
                    cpu: h.v1_cpu.clone().ok_or_else(|| missing("cpu"))?,
                    memory: h.v1_memory.clone(),
                    pids: h.v1_pids.clone(),
                },
                &config.group,
                Fs::real(),
            ))
        }
        Version::V2 => {
            let root = config
                .cgroup_root
                .clone()
                .or(h.v2.clone())
                .ok_or_else(|| anyhow::anyhow!("no cgroup v2 hierarchy is mounted"))?;
            Arc::new(tess_cgroup::v2::V2::new(root, &config.group, Fs::real()))
        }
    })
}

impl Engine {
    /// Opens the state, prepares the kernel and restores every committed cell.
    pub fn start(config: Config) -> Result<Engine> {
        let store = Store::open(&config.state_dir)?;
        let backend = make_backend(&config)?;
        let all = tess_sched::online_harts().context("reading the online harts")?;
        let managed = match &config.harts {
            Some(h) => {
                let m = h.intersection(&all);
                anyhow::ensure!(
                    !m.is_empty(),
                    "none of the configured harts {h} is online (online: {all})"
                );
                m
            }
            None => all.clone(),
        };
        let kpaths = KernelPaths {
            proc_root: config.proc_root.clone(),
            sys_root: config.sys_root.clone(),
        };
        let limit = 1.0 - config.headroom;
        let kernel_cap = if config.raise_kernel_limit {
            kernel::raise_deadline_capacity(&kpaths, &store, limit)?
        } else {
            kernel::deadline_capacity(&kpaths)?
        };
        // Without exact budget ends, budget ticks bound overruns; admission sets their
        // bandwidth aside on every hart (the kernel counts them like any deadline task).
        let ticks = match kernel::exact_deadline_enforcement(&kpaths, &store) {
            kernel::DeadlineEnforcement::PerTick if config.budget_tick_us > 0 => Some(
                crate::budget_tick::BudgetTicks::new(Duration::from_micros(config.budget_tick_us)),
            ),
            _ => None,
        };
        let tick_share = ticks
            .as_ref()
            .map_or(0.0, |t| crate::budget_tick::bandwidth(t.period()));
        let group_servers = if config.group_servers {
            backend.group_servers()
        } else {
            None
        };
        if group_servers.is_some() {
            kernel::shorten_rr_timeslice(&kpaths, &store)
                .context("shortening sched_rr_timeslice_ms for group servers")?;
        }
        let cap = Capacity {
            harts: managed.clone(),
            utilization_limit: limit,
            kernel_reservation_limit: kernel_cap.min(limit) - tick_share,
            min_system_harts: config.system_harts,
            group_servers,
        };
        let persisted = store.load()?;
        admission::check(&persisted.cluster, &cap).map_err(|e| {
            anyhow::anyhow!(
                "the committed cells no longer fit this machine: {e}; remove the cell with `tessd --forget NAME` or fix the configuration"
            )
        })?;
        let mut enforcer = Enforcer::new(backend, kpaths, config.steer_irqs, all, managed);
        enforcer.group_servers = config.group_servers;
        enforcer.budget_ticks = ticks;
        let layout = enforcer.plan(&persisted.cluster);
        enforcer
            .converge(None, &layout, &store)
            .context("restoring the committed cells")?;
        tracing::info!(
            cells = persisted.cluster.cells.len(),
            generation = persisted.generation,
            "{}; SCHED_DEADLINE capacity {:.0}% per hart",
            enforcer.backend().describe(),
            kernel_cap * 100.0
        );
        Ok(Engine::from_parts(
            config,
            store,
            Box::new(enforcer),
            cap,
            persisted,
            layout,
        ))
    }

    /// An engine over given parts, the kernel already holding `layout` (start-up, and unit
    /// tests with a recording kernel backend).
    pub fn from_parts(
        config: Config,
        store: Store,
        kernel: Box<dyn KernelBackend>,
        cap: Capacity,
        persisted: Persisted,
        layout: Layout,
    ) -> Engine {
        crate::fault::arm();
        Engine {
            config: Arc::new(config),
            store,
            kernel,
            cap,
            cluster: persisted.cluster,
            layout,
            quotas: persisted.quotas,
            generation: persisted.generation,
            started: Instant::now(),
            rephase_due: BTreeSet::new(),
            runtimes: BTreeMap::new(),
            adapt_seq: 0,
        }
    }

    /// The committed state as readers see it (built after every change; cheap: the cluster and
    /// layout are a few kilobytes).
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            generation: self.generation,
            cluster: self.cluster.clone(),
            layout: self.layout.clone(),
            cap: self.cap.clone(),
            quotas: self.quotas.clone(),
            config: self.config.clone(),
            cgroups: self.kernel.cgroups(),
            spinners: self.kernel.spinners(),
            health: self.kernel.health(),
            started: self.started,
            load: view::load_of(&self.cluster, &self.cap),
        }
    }

    /// The current cluster.
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// The generation of the last committed change.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The thread-to-cell map, for the fork watcher.
    pub fn tracked_cell_of(&self, tid: i32) -> Option<String> {
        self.kernel.tracked_cell_of(tid)
    }

    /// Handles one request. Reads are answered from a fresh snapshot (the daemon answers them
    /// from the published one without calling this).
    pub fn handle(&mut self, caller: &Caller, req: Request) -> Response {
        if view::is_read(&req) {
            return self
                .snapshot()
                .handle(caller, &req)
                .expect("a read request");
        }
        let res = match req {
            Request::CreateCell { spec } => self.create(caller, spec),
            Request::UpdateCell { name, update } => self.update(caller, &name, &update),
            Request::SetPinned { name, pinned } => self.set_pinned(caller, &name, pinned),
            Request::DeleteCell { name } => self.delete(caller, &name),
            Request::Apply {
                cells,
                delete,
                prune,
                dry_run,
            } => self.apply(caller, cells, delete, prune, dry_run),
            Request::Attach { cell } => self.attach(caller, &cell),
            Request::Reserve {
                budget,
                period,
                harts,
            } => self.reserve(caller, budget, period, harts),
            Request::SetQuota { uid, quota } => self.set_quota(caller, uid, quota),
            Request::Hello { .. }
            | Request::Status
            | Request::ListCells
            | Request::ShowCell { .. }
            | Request::ListQuotas => unreachable!("reads are answered above"),
            Request::Register { .. }
            | Request::Connect { .. }
            | Request::ListNames
            | Request::RuntimeAttach { .. } => Err(EngineError::new(
                ErrorKind::Internal,
                "nameserver requests are served by the connection layer",
            )),
        };
        match res {
            Ok(body) => Response::Ok { body },
            Err(e) => Response::Error {
                kind: e.kind,
                message: e.message,
            },
        }
    }

    fn visible(&self, caller: &Caller, name: &str) -> EResult<&Cell> {
        match self.cluster.cells.get(name) {
            Some(c) if caller.is_root() || c.owner == caller.uid => Ok(c),
            _ => Err(EngineError::not_found(name)),
        }
    }

    fn info(&self, c: &Cell) -> CellInfo {
        let spinners = self.kernel.spinners().remove(c.name()).unwrap_or_default();
        view::cell_info(c, self.kernel.cgroups().as_ref(), &spinners)
    }

    /// Periodic upkeep: stray tasks, reserved threads, ephemeral cells whose process is gone.
    pub fn housekeep(&mut self) {
        if let Err(e) = self.kernel.housekeep(&self.layout) {
            tracing::warn!("housekeeping: {e:#}");
        }
        for name in std::mem::take(&mut self.rephase_due) {
            match self.kernel.rephase(&self.layout, &name) {
                Ok(n) if n > 0 => tracing::debug!(cell = name, threads = n, "windows re-aligned"),
                Ok(_) => {}
                Err(e) => tracing::warn!("cell {name}: re-aligning windows: {e:#}"),
            }
        }
        let (cgroups, spinners) = (self.kernel.cgroups(), self.kernel.spinners());
        let gone: Vec<String> = self
            .cluster
            .cells
            .values()
            .filter(|c| c.ephemeral_pid.is_some())
            .filter(|c| {
                let spinners = spinners.get(c.name()).cloned().unwrap_or_default();
                cgroups
                    .processes(c.name())
                    .map(|p| p.iter().all(|x| spinners.contains(x)))
                    .unwrap_or(false)
            })
            .map(|c| c.name().to_string())
            .collect();
        if !gone.is_empty() {
            let mut next = self.cluster.clone();
            for n in &gone {
                next.cells.remove(n);
            }
            let r = ApplyResult {
                deleted: gone.clone(),
                ..Default::default()
            };
            match self.transact(&Caller::daemon(), next, BTreeSet::new(), r, false) {
                Ok(_) => {
                    tracing::info!(cells = ?gone, "removed ephemeral cells whose processes exited")
                }
                Err(e) => tracing::warn!("removing ephemeral cells {gone:?}: {}", e.message),
            }
        }
    }

    /// Whether threads wait to be promoted (housekeeping then runs every few milliseconds).
    pub fn has_pending(&self) -> bool {
        !self.kernel.pending_cells().is_empty()
    }

    /// Retries the promotions of threads that were waiting to wake on their hart.
    pub fn retry_pending(&mut self) {
        for cell in self.kernel.pending_cells() {
            if let Err(e) = self.kernel.sync_cell(&self.layout, &cell) {
                tracing::warn!("cell {cell}: {e:#}");
            }
        }
    }

    /// Re-divides reserved cells' budgets between the threads that work (`threads::demand`).
    pub fn follow_demand(&mut self) {
        self.kernel.follow_demand(&self.layout);
    }

    /// A thread forked inside a reserved cell: bring it under the reservation now.
    pub fn on_fork(&mut self, cell: &str) {
        if let Err(e) = self.kernel.sync_cell(&self.layout, cell) {
            tracing::warn!("cell {cell}: placing a new thread: {e:#}");
        }
    }

    /// Removes all tess cgroups and restores kernel settings; the database is kept.
    pub fn teardown(config: &Config, forget: bool) -> Result<()> {
        let store = Store::open(&config.state_dir)?;
        let backend = make_backend(config)?;
        let all = tess_sched::online_harts()?;
        let kpaths = KernelPaths {
            proc_root: config.proc_root.clone(),
            sys_root: config.sys_root.clone(),
        };
        let mut enforcer = Enforcer::new(backend, kpaths, config.steer_irqs, all.clone(), all);
        enforcer.teardown(None, &store)?;
        if forget {
            let mut store = store;
            let p = store.load()?;
            let txn = store.begin()?;
            for name in p.cluster.cells.keys() {
                txn.delete_cell(name)?;
            }
            txn.commit()?;
        }
        Ok(())
    }

    /// Deletes one cell from the database without enforcing anything (for a state that no
    /// longer fits the machine).
    pub fn forget(config: &Config, name: &str) -> Result<bool> {
        let mut store = Store::open(&config.state_dir)?;
        if !store.cell_names()?.iter().any(|n| n == name) {
            return Ok(false);
        }
        let txn = store.begin()?;
        txn.delete_cell(name)?;
        txn.commit()?;
        Ok(true)
    }
}
