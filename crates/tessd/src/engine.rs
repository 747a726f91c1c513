//! The engine: requests become transactions over the cluster state.
//!
//! Every change follows Tessellation's `update_cells` (seed 004 section 3.3): validate the new
//! distribution as a whole, prepare it, swap. Concretely:
//!
//! 1. **place and admit** the whole new cluster (placement, admission control, quotas);
//! 2. **enforce**: converge the kernel to the new layout;
//! 3. **commit** the new state in one database transaction.
//!
//! If step 2 fails, the kernel is converged back to the old layout. If the daemon dies anywhere
//! before step 3 completes, SQLite rolls the unfinished transaction back on the next start, and
//! start-up converges the kernel to the last committed state; after step 3, to the new one.
//! Either way the kernel ends up exactly as last committed.

use crate::config::Config;
use crate::enforcer::Enforcer;
use crate::kernel::{self, KernelPaths};
use crate::store::Store;
use crate::threads;
use anyhow::{Context, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};
use tess_cgroup::fs::Fs;
use tess_cgroup::{Backend, Version};
use tess_core::admission::{self, AdmissionError, Capacity};
use tess_core::layout::Layout;
use tess_core::placement;
use tess_core::quota::{self, Quota};
use tess_core::spec::{CellSpec, HartRequest, Policy, SpecError};
use tess_core::state::{Cell, Cluster};
use tess_proto::{
    ApplyResult, Body, CellInfo, CellUpdate, ErrorKind, HartLoadInfo, QuotaInfo, Request, Response,
    StatusInfo, ThreadInfo, Timing,
};
use tess_sched::HartSet;

/// Who is calling, as the kernel vouches (`SO_PEERCRED`).
#[derive(Debug)]
pub struct Caller {
    /// User id.
    pub uid: u32,
    /// Process id at connect time.
    pub pid: i32,
    /// A pidfd for that process, when the kernel offers `SO_PEERPIDFD` (immune to pid reuse).
    pub pidfd: Option<std::os::fd::OwnedFd>,
}

impl Caller {
    /// The daemon itself (housekeeping).
    pub fn daemon() -> Caller {
        Caller {
            uid: 0,
            pid: std::process::id() as i32,
            pidfd: None,
        }
    }

    fn is_root(&self) -> bool {
        self.uid == 0
    }

    /// Whether the calling process is still the one that connected.
    fn still_alive(&self) -> bool {
        match &self.pidfd {
            Some(fd) => {
                use std::os::fd::AsRawFd;
                let mut pfd = libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd, zero timeout.
                let n = unsafe { libc::poll(&mut pfd, 1, 0) };
                n == 0
            }
            None => tess_sched::proc::uid_of(self.pid) == Some(self.uid),
        }
    }
}

/// A failed request.
#[derive(Debug)]
pub struct EngineError {
    /// Category.
    pub kind: ErrorKind,
    /// Message.
    pub message: String,
}

impl EngineError {
    fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        EngineError {
            kind,
            message: message.into(),
        }
    }

    fn not_found(name: &str) -> Self {
        EngineError::new(ErrorKind::NotFound, format!("no cell named '{name}'"))
    }
}

impl From<AdmissionError> for EngineError {
    fn from(e: AdmissionError) -> Self {
        EngineError::new(ErrorKind::Admission, e.to_string())
    }
}

impl From<SpecError> for EngineError {
    fn from(e: SpecError) -> Self {
        EngineError::new(ErrorKind::Usage, e.to_string())
    }
}

type EResult<T> = std::result::Result<T, EngineError>;

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The daemon's state and its single point of change.
#[derive(Debug)]
pub struct Engine {
    config: Config,
    store: Store,
    enforcer: Enforcer,
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

/// Runtimes to tell about a change (see `Engine::apply`).
#[derive(Debug, Default)]
struct Adaptations {
    /// Fewer harts: told first, and waited for.
    shrinking: Vec<String>,
    /// More harts, same timing: told before the kernel work.
    gaining: Vec<String>,
    /// Other harts or other timing: told after the commit.
    changing: Vec<String>,
}

/// Builds the cgroup backend the configuration asks for.
pub fn make_backend(config: &Config) -> Result<Box<dyn Backend>> {
    let h = tess_cgroup::detect().context("reading /proc/self/mountinfo")?;
    let version = match config.cgroup {
        crate::config::CgroupChoice::Auto => h.preferred()?,
        crate::config::CgroupChoice::V1 => Version::V1,
        crate::config::CgroupChoice::V2 => Version::V2,
    };
    Ok(match version {
        Version::V1 => {
            let missing = |c: &str| anyhow::anyhow!("cgroup v1 has no {c} hierarchy mounted");
            Box::new(tess_cgroup::v1::V1::new(
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
            Box::new(tess_cgroup::v2::V2::new(root, &config.group, Fs::real()))
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
        kernel::exact_deadline_enforcement(&kpaths, &store);
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
            kernel_reservation_limit: kernel_cap.min(limit),
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
        Ok(Engine {
            config,
            store,
            enforcer,
            cap,
            cluster: persisted.cluster,
            layout,
            quotas: persisted.quotas,
            generation: persisted.generation,
            started: Instant::now(),
            rephase_due: BTreeSet::new(),
            runtimes: BTreeMap::new(),
            adapt_seq: 0,
        })
    }

    /// The current cluster.
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// The thread-to-cell map, for the fork watcher.
    pub fn tracked_cell_of(&self, tid: i32) -> Option<String> {
        self.enforcer.threads.cell_of(tid).map(str::to_string)
    }

    /// Handles one request.
    pub fn handle(&mut self, caller: &Caller, req: Request) -> Response {
        let res = match req {
            Request::Hello { version } => {
                if version == tess_proto::PROTOCOL_VERSION {
                    Ok(Body::Hello {
                        daemon: env!("CARGO_PKG_VERSION").into(),
                        uid: caller.uid,
                    })
                } else {
                    Err(EngineError::new(
                        ErrorKind::Usage,
                        format!(
                            "protocol version {version} is not supported (tessd speaks {})",
                            tess_proto::PROTOCOL_VERSION
                        ),
                    ))
                }
            }
            Request::Status => Ok(Body::Status(Box::new(self.status()))),
            Request::ListCells => Ok(Body::Cells {
                cells: self
                    .cluster
                    .cells
                    .values()
                    .filter(|c| caller.is_root() || c.owner == caller.uid)
                    .map(|c| self.info(c))
                    .collect(),
            }),
            Request::ShowCell { name } => self
                .visible(caller, &name)
                .map(|c| Body::Cell(Box::new(self.info(c)))),
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
            Request::ListQuotas => Ok(self.list_quotas(caller)),
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

    fn quota_of(&self, uid: u32) -> Quota {
        self.quotas
            .get(&uid)
            .or_else(|| self.config.user_quotas.get(&uid))
            .cloned()
            .unwrap_or_else(|| self.config.default_quota.clone())
    }

    /// The transaction: place, admit, enforce, commit (module docs).
    fn transact(
        &mut self,
        caller: &Caller,
        mut next: Cluster,
        changed: BTreeSet<String>,
        mut result: ApplyResult,
        dry_run: bool,
    ) -> EResult<ApplyResult> {
        let t0 = Instant::now();
        placement::place(&mut next, &self.cap, &changed)?;
        admission::check(&next, &self.cap)?;
        if !caller.is_root() {
            quota::check(&next, caller.uid, &self.quota_of(caller.uid))?;
        }
        let t1 = Instant::now();
        let mut named: Vec<&String> = result.created.iter().chain(result.updated.iter()).collect();
        named.sort();
        result.dry_run = dry_run;
        if dry_run {
            result.cells = named
                .iter()
                .filter_map(|n| next.cells.get(*n))
                .map(|c| self.info(c))
                .collect();
            result.timing = Timing {
                admit_us: us(t1 - t0),
                total_us: us(t1 - t0),
                ..Default::default()
            };
            return Ok(result);
        }
        let next_layout = self.enforcer.plan(&next);
        let generation = self.generation + 1;
        // Runtimes of shrinking cells retire their threads before the kernel takes harts away.
        let Adaptations {
            shrinking,
            gaining,
            changing,
        } = self.adaptations(&next);
        for name in &shrinking {
            self.notify_runtime(name, &next, true);
        }
        // Runtimes that only gain harts hear of it before the kernel work rather than after: a
        // runtime acts on it at its next window, and the thread it then starts is placed on the
        // new hart by the sync below or by the fork watcher. Overlapping the two saves the
        // runtime up to a period. If the change fails they are told the old harts again.
        for name in &gaining {
            self.notify_runtime(name, &next, false);
        }
        let undo_gains = |engine: &mut Engine| {
            let old = engine.cluster.clone();
            for name in &gaining {
                engine.notify_runtime(name, &old, false);
            }
        };
        let internal = |e: anyhow::Error| EngineError::new(ErrorKind::Internal, format!("{e:#}"));
        // Enforce first, then commit: a daemon killed in between restarts from the old committed
        // state and converges the kernel back to it.
        let enforced = self
            .enforcer
            .converge(Some(&self.layout), &next_layout, &self.store);
        let t2 = Instant::now();
        let enforced = enforced.map(|r| self.rephase_due.extend(r));
        if let Err(e) = enforced {
            if let Err(back) = self
                .enforcer
                .converge(Some(&next_layout), &self.layout, &self.store)
            {
                tracing::error!("rolling back a failed change also failed: {back:#}");
            }
            undo_gains(self);
            return Err(EngineError::new(
                ErrorKind::Kernel,
                format!("the kernel refused the change, which was rolled back: {e:#}"),
            ));
        }
        let committed = (|| -> Result<()> {
            let txn = self.store.begin()?;
            for name in result.created.iter().chain(result.updated.iter()) {
                txn.put_cell(&next.cells[name])?;
            }
            for name in &result.deleted {
                txn.delete_cell(name)?;
            }
            txn.set_generation(generation)?;
            txn.commit()
        })();
        if let Err(e) = committed {
            let _ = self
                .enforcer
                .converge(Some(&next_layout), &self.layout, &self.store);
            undo_gains(self);
            return Err(internal(e));
        }
        let t3 = Instant::now();
        for name in &result.deleted {
            if let Some(mut ep) = self.runtimes.remove(name) {
                let _ = ep.try_send(&tess_proto::runtime::encode(
                    &tess_proto::runtime::Control::Shutdown,
                ));
            }
        }
        self.cluster = next;
        self.layout = next_layout;
        self.generation = generation;
        // Runtimes whose harts move or whose timing changes hear of it once the kernel has it.
        for name in &changing {
            let next = self.cluster.clone();
            self.notify_runtime(name, &next, false);
        }
        tracing::info!(
            generation,
            created = ?result.created,
            updated = ?result.updated,
            deleted = ?result.deleted,
            uid = caller.uid,
            "committed in {:.0} us",
            us(t3 - t0)
        );
        result.cells = named
            .iter()
            .filter_map(|n| self.cluster.cells.get(*n))
            .map(|c| self.info(c))
            .collect();
        result.timing = Timing {
            admit_us: us(t1 - t0),
            enforce_us: us(t2 - t1),
            commit_us: us(t3 - t2),
            total_us: us(t3 - t0),
        };
        Ok(result)
    }

    /// Cells with a runtime that must adapt to `next`, by kind of change.
    fn adaptations(&self, next: &Cluster) -> Adaptations {
        let mut a = Adaptations::default();
        for name in self.runtimes.keys() {
            let (Some(old), Some(new)) = (self.cluster.cells.get(name), next.cells.get(name))
            else {
                continue;
            };
            let same_policy = new.spec.policy == old.spec.policy;
            if new.harts.len() < old.harts.len() {
                a.shrinking.push(name.clone());
            } else if same_policy && old.harts.is_subset(&new.harts) && new.harts != old.harts {
                a.gaining.push(name.clone());
            } else if new.harts != old.harts || !same_policy {
                a.changing.push(name.clone());
            }
        }
        a
    }

    /// Tells a cell's runtime about its new harts; when `wait`, waits for it to finish adapting
    /// (bounded by [`tess_proto::runtime::ADAPT_ACK_TIMEOUT`]).
    fn notify_runtime(&mut self, name: &str, next: &Cluster, wait: bool) {
        use tess_proto::runtime::{decode, encode, Control, Report, Window, ADAPT_ACK_TIMEOUT};
        let Some(cell) = next.cells.get(name) else {
            return;
        };
        self.adapt_seq += 1;
        let seq = self.adapt_seq;
        let window = cell
            .policy()
            .server()
            .filter(|_| cell.policy().is_reservation())
            .map(|s| Window {
                runtime_ns: s.budget.as_nanos() as u64,
                deadline_ns: s.deadline.as_nanos() as u64,
                period_ns: s.period.as_nanos() as u64,
                offset_ns: cell.window().map(|w| w.0.as_nanos() as u64),
            });
        let msg = encode(&Control::Adapt {
            seq,
            harts: cell.harts.iter().collect(),
            window,
        });
        let Some(ep) = self.runtimes.get_mut(name) else {
            return;
        };
        if ep.try_send(&msg).is_err() {
            tracing::info!(cell = name, "the cell's runtime is gone");
            self.runtimes.remove(name);
            return;
        }
        if !wait {
            return;
        }
        let deadline = Instant::now() + ADAPT_ACK_TIMEOUT;
        let mut buf = vec![0u8; 4096];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match ep.recv_timeout(&mut buf, left) {
                Ok(n) => {
                    if let Some(Report::Adapted { seq: s, .. }) = decode::<Report>(&buf[..n]) {
                        if s == seq {
                            return;
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(
                        cell = name,
                        "runtime did not confirm the adaptation ({e}); shrinking anyway"
                    );
                    return;
                }
            }
        }
    }

    /// Who a caller is, for the nameserver: uid, pid and the cell it runs in.
    pub fn peer_info(&self, caller: &Caller) -> tess_proto::ns::PeerInfo {
        tess_proto::ns::PeerInfo {
            uid: caller.uid,
            pid: caller.pid,
            cell: self.enforcer.backend().cell_of_pid(caller.pid),
        }
    }

    /// Gives a cell's runtime its control channel (`tess_proto::runtime`); returns the reply and
    /// the runtime's channel end (tessd keeps the other).
    pub fn runtime_attach(
        &mut self,
        caller: &Caller,
        cell: &str,
    ) -> EResult<(Body, tess_channel::EndpointFds)> {
        self.visible(caller, cell)?;
        if self.enforcer.backend().cell_of_pid(caller.pid).as_deref() != Some(cell) {
            return Err(EngineError::new(
                ErrorKind::Permission,
                format!("a runtime must run inside its cell: process {} is not in cell '{cell}' (start it with `tess run --cell {cell}`)", caller.pid),
            ));
        }
        let internal = |e: tess_channel::OpenError| {
            EngineError::new(
                ErrorKind::Internal,
                format!("creating a control channel: {e}"),
            )
        };
        let (ours, theirs) =
            tess_channel::Channel::create(&tess_channel::ChannelOptions::for_max_message(4096))
                .map_err(internal)?;
        let ep = tess_channel::Endpoint::from_fds(ours).map_err(internal)?;
        self.runtimes.insert(cell.to_string(), ep);
        Ok((
            Body::Cell(Box::new(self.info(&self.cluster.cells[cell]))),
            theirs,
        ))
    }

    fn new_cell(&self, caller: &Caller, spec: CellSpec) -> Cell {
        Cell {
            spec,
            harts: HartSet::new(),
            window_offset: None,
            owner: caller.uid,
            ephemeral_pid: None,
            created_ms: now_ms(),
        }
    }

    fn create(&mut self, caller: &Caller, spec: CellSpec) -> EResult<Body> {
        spec.validate()?;
        if self.cluster.cells.contains_key(&spec.name) {
            return Err(EngineError::new(
                ErrorKind::Exists,
                format!("a cell named '{}' already exists", spec.name),
            ));
        }
        let name = spec.name.clone();
        let mut next = self.cluster.clone();
        next.cells.insert(name.clone(), self.new_cell(caller, spec));
        let result = ApplyResult {
            created: vec![name.clone()],
            ..Default::default()
        };
        self.transact(caller, next, [name].into(), result, false)
            .map(Body::Applied)
    }

    fn update(&mut self, caller: &Caller, name: &str, u: &CellUpdate) -> EResult<Body> {
        let cell = self.visible(caller, name)?.clone();
        if u.is_empty() {
            return Err(EngineError::new(ErrorKind::Usage, "nothing to change: give at least one of --harts, --hart-ids, --period, --active, --offset, --budget, --weight, --memory, --pids"));
        }
        let spec = merge(&cell.spec, u)?;
        spec.validate()?;
        if spec == cell.spec {
            let result = ApplyResult {
                unchanged: vec![name.into()],
                cells: vec![self.info(&cell)],
                ..Default::default()
            };
            return Ok(Body::Applied(result));
        }
        if cell.spec.pinned {
            return Err(AdmissionError::Pinned { cell: name.into() }.into());
        }
        let mut next = self.cluster.clone();
        next.cells.get_mut(name).expect("visible").spec = spec;
        let result = ApplyResult {
            updated: vec![name.into()],
            ..Default::default()
        };
        self.transact(caller, next, [name.to_string()].into(), result, false)
            .map(Body::Applied)
    }

    fn set_pinned(&mut self, caller: &Caller, name: &str, pinned: bool) -> EResult<Body> {
        let cell = self.visible(caller, name)?;
        if cell.spec.pinned == pinned {
            let result = ApplyResult {
                unchanged: vec![name.into()],
                cells: vec![self.info(cell)],
                ..Default::default()
            };
            return Ok(Body::Applied(result));
        }
        let mut next = self.cluster.clone();
        let c = next.cells.get_mut(name).expect("visible");
        c.spec.pinned = pinned;
        if pinned {
            // Fix the placement itself, so that no later placement could move it.
            c.spec.harts = HartRequest::Ids(c.harts.clone());
            if let (Policy::TimeTriggered { offset, .. }, Some(o)) =
                (&mut c.spec.policy, c.window_offset)
            {
                *offset = Some(o);
            }
        }
        let result = ApplyResult {
            updated: vec![name.into()],
            ..Default::default()
        };
        self.transact(caller, next, BTreeSet::new(), result, false)
            .map(Body::Applied)
    }

    fn delete(&mut self, caller: &Caller, name: &str) -> EResult<Body> {
        self.visible(caller, name)?;
        let mut next = self.cluster.clone();
        next.cells.remove(name);
        let result = ApplyResult {
            deleted: vec![name.into()],
            ..Default::default()
        };
        self.transact(caller, next, BTreeSet::new(), result, false)
            .map(Body::Applied)
    }

    fn apply(
        &mut self,
        caller: &Caller,
        cells: Vec<CellSpec>,
        delete: Vec<String>,
        prune: bool,
        dry_run: bool,
    ) -> EResult<Body> {
        let mut next = self.cluster.clone();
        let mut changed = BTreeSet::new();
        let mut result = ApplyResult::default();
        let mut seen = BTreeSet::new();
        for spec in cells {
            spec.validate()?;
            if !seen.insert(spec.name.clone()) {
                return Err(EngineError::new(
                    ErrorKind::Usage,
                    format!("cell '{}' appears twice", spec.name),
                ));
            }
            match self.cluster.cells.get(&spec.name) {
                None => {
                    changed.insert(spec.name.clone());
                    result.created.push(spec.name.clone());
                    next.cells
                        .insert(spec.name.clone(), self.new_cell(caller, spec));
                }
                Some(c) if !caller.is_root() && c.owner != caller.uid => {
                    return Err(EngineError::new(
                        ErrorKind::Exists,
                        format!("a cell named '{}' already exists", spec.name),
                    ));
                }
                Some(c) if c.spec == spec => result.unchanged.push(spec.name.clone()),
                Some(c) => {
                    if c.spec.pinned && !c.spec.same_allocation(&spec) {
                        return Err(AdmissionError::Pinned {
                            cell: spec.name.clone(),
                        }
                        .into());
                    }
                    if !c.spec.same_allocation(&spec) {
                        changed.insert(spec.name.clone());
                    }
                    result.updated.push(spec.name.clone());
                    let name = spec.name.clone();
                    next.cells.get_mut(&name).expect("exists").spec = spec;
                }
            }
        }
        let mut to_delete: Vec<String> = delete
            .into_iter()
            .filter(|n| {
                self.cluster
                    .cells
                    .get(n)
                    .is_some_and(|c| caller.is_root() || c.owner == caller.uid)
            })
            .collect();
        if prune {
            to_delete.extend(
                self.cluster
                    .owned_by(caller.uid)
                    .filter(|c| {
                        !seen.contains(c.name()) && c.ephemeral_pid.is_none() && !c.spec.pinned
                    })
                    .map(|c| c.name().to_string()),
            );
        }
        to_delete.sort();
        to_delete.dedup();
        for n in &to_delete {
            if seen.contains(n) {
                return Err(EngineError::new(
                    ErrorKind::Usage,
                    format!("cell '{n}' is both applied and deleted"),
                ));
            }
            next.cells.remove(n);
        }
        result.deleted = to_delete;
        if result.created.is_empty() && result.updated.is_empty() && result.deleted.is_empty() {
            result.dry_run = dry_run;
            result.cells = result
                .unchanged
                .iter()
                .filter_map(|n| self.cluster.cells.get(n))
                .map(|c| self.info(c))
                .collect();
            return Ok(Body::Applied(result));
        }
        self.transact(caller, next, changed, result, dry_run)
            .map(Body::Applied)
    }

    fn attach(&mut self, caller: &Caller, name: &str) -> EResult<Body> {
        self.visible(caller, name)?;
        self.attach_pid(caller, name)?;
        Ok(Body::Cell(Box::new(self.info(&self.cluster.cells[name]))))
    }

    fn attach_pid(&mut self, caller: &Caller, name: &str) -> EResult<()> {
        if !caller.still_alive() {
            return Err(EngineError::new(
                ErrorKind::Permission,
                "the calling process exited",
            ));
        }
        let cpus = self
            .layout
            .cells
            .get(name)
            .map(|c| c.cpus.clone())
            .unwrap_or_default();
        let on_cell = tess_sched::proc::last_hart(caller.pid).is_some_and(|h| cpus.contains(h));
        self.enforcer.backend().attach_process(name, caller.pid, on_cell).map_err(|e| {
            let rt = matches!(tess_sched::attr::get_policy(caller.pid), Ok((tess_sched::Policy::Fifo { .. } | tess_sched::Policy::RoundRobin { .. }, _)));
            let hint = if rt && e.errno() == Some(libc::EINVAL) {
                " (a SCHED_FIFO/SCHED_RR process can only join a dedicated or an event-triggered cell on this kernel: RT group scheduling gives other cells no RT runtime)"
            } else {
                ""
            };
            EngineError::new(ErrorKind::Kernel, format!("cannot move process {} into cell '{name}': {e}{hint}", caller.pid))
        })?;
        self.enforcer
            .sync_cell(&self.layout, name)
            .map_err(|e| EngineError::new(ErrorKind::Kernel, format!("{e:#}")))?;
        Ok(())
    }

    fn reserve(
        &mut self,
        caller: &Caller,
        budget: Duration,
        period: Duration,
        harts: Option<HartRequest>,
    ) -> EResult<Body> {
        let name = format!("run-{}", caller.pid);
        if let Some(old) = self.cluster.cells.get(&name) {
            if self
                .enforcer
                .backend()
                .processes(old.name())
                .unwrap_or_default()
                .is_empty()
            {
                let mut next = self.cluster.clone();
                next.cells.remove(&name);
                let r = ApplyResult {
                    deleted: vec![name.clone()],
                    ..Default::default()
                };
                self.transact(&Caller::daemon(), next, BTreeSet::new(), r, false)?;
            } else {
                return Err(EngineError::new(
                    ErrorKind::Exists,
                    format!("cell '{name}' already exists"),
                ));
            }
        }
        let spec = CellSpec {
            name: name.clone(),
            policy: Policy::EventTriggered { period, budget },
            harts: harts.unwrap_or(HartRequest::Count(1)),
            memory_max: None,
            pids_max: None,
            pinned: false,
            idle: None,
        };
        spec.validate()?;
        let mut cell = self.new_cell(caller, spec);
        cell.ephemeral_pid = Some(caller.pid);
        let mut next = self.cluster.clone();
        next.cells.insert(name.clone(), cell);
        let result = ApplyResult {
            created: vec![name.clone()],
            ..Default::default()
        };
        let applied = self.transact(caller, next, [name.clone()].into(), result, false)?;
        if let Err(e) = self.attach_pid(caller, &name) {
            let mut next = self.cluster.clone();
            next.cells.remove(&name);
            let r = ApplyResult {
                deleted: vec![name.clone()],
                ..Default::default()
            };
            let _ = self.transact(&Caller::daemon(), next, BTreeSet::new(), r, false);
            return Err(e);
        }
        let mut applied = applied;
        applied.cells = vec![self.info(&self.cluster.cells[&name])];
        Ok(Body::Applied(applied))
    }

    fn set_quota(&mut self, caller: &Caller, uid: u32, quota: Option<Quota>) -> EResult<Body> {
        if !caller.is_root() {
            return Err(EngineError::new(
                ErrorKind::Permission,
                "only root may set quotas",
            ));
        }
        let txn = self
            .store
            .begin()
            .map_err(|e| EngineError::new(ErrorKind::Internal, format!("{e:#}")))?;
        txn.put_quota(uid, quota.as_ref())
            .and_then(|_| txn.commit())
            .map_err(|e| EngineError::new(ErrorKind::Internal, format!("{e:#}")))?;
        match quota {
            Some(q) => self.quotas.insert(uid, q),
            None => self.quotas.remove(&uid),
        };
        Ok(self.list_quotas(caller))
    }

    fn list_quotas(&self, caller: &Caller) -> Body {
        let mut uids: BTreeSet<u32> = self.quotas.keys().copied().collect();
        uids.extend(self.config.user_quotas.keys().copied());
        uids.extend(self.cluster.cells.values().map(|c| c.owner));
        uids.remove(&0);
        if !caller.is_root() {
            uids = [caller.uid].into();
        }
        let quotas = uids
            .into_iter()
            .map(|uid| QuotaInfo {
                uid,
                quota: Some(self.quota_of(uid)),
                usage: Some(quota::usage_of(&self.cluster, uid).into()),
            })
            .collect();
        Body::Quotas { quotas }
    }

    fn status(&self) -> StatusInfo {
        let admitted = admission::check(&self.cluster, &self.cap).unwrap_or_default();
        StatusInfo {
            version: env!("CARGO_PKG_VERSION").into(),
            pid: std::process::id() as i32,
            uptime_s: self.started.elapsed().as_secs_f64(),
            cgroup: self.enforcer.backend().describe(),
            harts: self.layout.all.clone(),
            managed: self.layout.managed.clone(),
            dedicated: self.layout.dedicated.clone(),
            reserved: self.layout.reserved.clone(),
            system: self.layout.system.clone(),
            utilization_limit: self.cap.utilization_limit,
            kernel_reservation_limit: self.cap.kernel_reservation_limit,
            load: admitted
                .harts
                .into_iter()
                .map(|(hart, l)| HartLoadInfo {
                    hart,
                    utilization: l.utilization,
                    dedicated_to: l.dedicated_to,
                    cells: l.cells,
                })
                .collect(),
            cells: self.cluster.cells.len(),
            irqs_steered: self.enforcer.irqs_steered,
            warnings: self.enforcer.conflicts.clone(),
            state_dir: self.config.state_dir.display().to_string(),
        }
    }

    fn info(&self, c: &Cell) -> CellInfo {
        let b = self.enforcer.backend();
        let spinners = self.enforcer.spinners.pids(c.name());
        let threads = b
            .threads(c.name())
            .unwrap_or_default()
            .into_iter()
            .filter(|tid| !spinners.contains(&tess_sched::proc::tgid_of(*tid).unwrap_or(0)))
            .map(|tid| {
                let (affinity, sched) = threads::describe(tid);
                ThreadInfo {
                    tid,
                    affinity,
                    sched,
                }
            })
            .collect();
        CellInfo {
            name: c.name().into(),
            owner: c.owner,
            policy: c.spec.policy.clone(),
            request: c.spec.harts.clone(),
            harts: c.harts.clone(),
            window_offset: c.window().map(|w| w.0),
            memory_max: c.spec.memory_max,
            pids_max: c.spec.pids_max,
            pinned: c.spec.pinned,
            ephemeral_pid: c.ephemeral_pid,
            utilization: c.policy().utilization(),
            processes: b
                .processes(c.name())
                .unwrap_or_default()
                .into_iter()
                .filter(|p| !spinners.contains(p))
                .collect(),
            idle_spinners: spinners.clone(),
            threads,
            cgroup: b.cell_cpuset_dir(c.name()).display().to_string(),
            created_ms: c.created_ms,
        }
    }

    /// Periodic upkeep: stray tasks, reserved threads, ephemeral cells whose process is gone.
    pub fn housekeep(&mut self) {
        if let Err(e) = self.enforcer.housekeep(&self.layout) {
            tracing::warn!("housekeeping: {e:#}");
        }
        for name in std::mem::take(&mut self.rephase_due) {
            match self.enforcer.rephase(&self.layout, &name) {
                Ok(n) if n > 0 => tracing::debug!(cell = name, threads = n, "windows re-aligned"),
                Ok(_) => {}
                Err(e) => tracing::warn!("cell {name}: re-aligning windows: {e:#}"),
            }
        }
        let gone: Vec<String> = self
            .cluster
            .cells
            .values()
            .filter(|c| c.ephemeral_pid.is_some())
            .filter(|c| {
                let spinners = self.enforcer.spinners.pids(c.name());
                self.enforcer
                    .backend()
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
        !self.enforcer.threads.pending_cells().is_empty()
    }

    /// Retries the promotions of threads that were waiting to wake on their hart.
    pub fn retry_pending(&mut self) {
        for cell in self.enforcer.threads.pending_cells() {
            if let Err(e) = self.enforcer.sync_cell(&self.layout, &cell) {
                tracing::warn!("cell {cell}: {e:#}");
            }
        }
    }

    /// Re-divides reserved cells' budgets between the threads that work (`threads::demand`).
    pub fn follow_demand(&mut self) {
        self.enforcer.follow_demand(&self.layout);
    }

    /// A thread forked inside a reserved cell: bring it under the reservation now.
    pub fn on_fork(&mut self, cell: &str) {
        if let Err(e) = self.enforcer.sync_cell(&self.layout, cell) {
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
        let p = store.load()?;
        if !p.cluster.cells.contains_key(name) {
            return Ok(false);
        }
        let txn = store.begin()?;
        txn.delete_cell(name)?;
        txn.commit()?;
        Ok(true)
    }
}

/// Applies a partial update to a spec.
pub fn merge(spec: &CellSpec, u: &CellUpdate) -> EResult<CellSpec> {
    let mut s = spec.clone();
    if let Some(p) = &u.policy {
        s.policy = p.clone();
    }
    let (kind, name) = (s.policy.name(), s.name.clone());
    let usage = |what: &str| {
        EngineError::new(
            ErrorKind::Usage,
            format!("{what} does not apply to {kind} cell '{name}'"),
        )
    };
    match &mut s.policy {
        Policy::TimeTriggered {
            period,
            active,
            offset,
        } => {
            if u.budget.is_some() {
                return Err(usage("--budget"));
            }
            if u.weight.is_some() {
                return Err(usage("--weight"));
            }
            if let Some(p) = u.period {
                *period = p;
            }
            if let Some(a) = u.active {
                *active = a;
            }
            if let Some(o) = u.offset {
                *offset = Some(o);
            }
        }
        Policy::EventTriggered { period, budget } => {
            if u.active.is_some() || u.offset.is_some() {
                return Err(usage("--active/--offset"));
            }
            if u.weight.is_some() {
                return Err(usage("--weight"));
            }
            if let Some(p) = u.period {
                *period = p;
            }
            if let Some(b) = u.budget {
                *budget = b;
            }
        }
        Policy::BestEffort { weight } => {
            if u.period.is_some() || u.active.is_some() || u.budget.is_some() || u.offset.is_some()
            {
                return Err(usage("--period/--active/--budget/--offset"));
            }
            if let Some(w) = u.weight {
                *weight = w;
            }
        }
        Policy::Dedicated => {
            if u.period.is_some()
                || u.active.is_some()
                || u.budget.is_some()
                || u.offset.is_some()
                || u.weight.is_some()
            {
                return Err(usage("--period/--active/--budget/--offset/--weight"));
            }
        }
    }
    if let Some(h) = &u.harts {
        s.harts = h.clone();
    }
    if let Some(m) = u.memory_max {
        s.memory_max = m.value();
    }
    if let Some(p) = u.pids_max {
        s.pids_max = p.value();
    }
    Ok(s)
}
