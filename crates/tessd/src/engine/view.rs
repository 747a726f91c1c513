//! The read side: an immutable [`Snapshot`] of the committed state that answers `status`,
//! `cell list`, `cell show` and `quota list` without the engine.
//!
//! The engine builds a new snapshot after every transaction (and after housekeeping) and
//! publishes it with a pointer swap (see [`crate::daemon`]); a reader clones the `Arc` and
//! answers from it, so no read ever waits for a transaction, a runtime or a window. What a
//! snapshot shows is always a committed state: it is built only after the journal commit.
//! Thread and process lists are read live from the cgroup files (the kernel is the authority
//! for membership, and reading them needs no lock of ours).

use super::error::{Caller, EResult, EngineError};
use super::kernel_backend::KernelHealth;
use crate::config::Config;
use crate::threads;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;
use tess_cgroup::Backend;
use tess_core::admission::{self, Capacity};
use tess_core::layout::Layout;
use tess_core::quota::{self, Quota};
use tess_core::state::{Cell, Cluster};
use tess_proto::{
    Body, CellInfo, ErrorKind, HartLoadInfo, QuotaInfo, Request, Response, StatusInfo, ThreadInfo,
};

/// The committed state, as readers see it.
#[derive(Debug)]
pub struct Snapshot {
    /// Generation of the last committed change.
    pub generation: u64,
    /// The cells.
    pub cluster: Cluster,
    /// Their layout.
    pub layout: Layout,
    pub(super) cap: Capacity,
    pub(super) quotas: BTreeMap<u32, Quota>,
    pub(super) config: Arc<Config>,
    pub(super) cgroups: Arc<dyn Backend>,
    pub(super) spinners: BTreeMap<String, Vec<i32>>,
    pub(super) health: KernelHealth,
    pub(super) started: Instant,
    /// Per-hart load, computed once per snapshot rather than per `status`.
    pub(super) load: Vec<HartLoadInfo>,
}

/// Whether a request only reads (and is answered from a snapshot).
pub fn is_read(req: &Request) -> bool {
    matches!(
        req,
        Request::Hello { .. }
            | Request::Status
            | Request::ListCells
            | Request::ShowCell { .. }
            | Request::ListQuotas
    )
}

/// Per-hart load of a cluster, for status.
pub(super) fn load_of(cluster: &Cluster, cap: &Capacity) -> Vec<HartLoadInfo> {
    admission::check(cluster, cap)
        .unwrap_or_default()
        .harts
        .into_iter()
        .map(|(hart, l)| HartLoadInfo {
            hart,
            utilization: l.utilization,
            dedicated_to: l.dedicated_to,
            cells: l.cells,
        })
        .collect()
}

/// The quota in force for `uid`: set with `tess quota`, else configured, else the default.
pub(super) fn quota_of(quotas: &BTreeMap<u32, Quota>, config: &Config, uid: u32) -> Quota {
    quotas
        .get(&uid)
        .or_else(|| config.user_quotas.get(&uid))
        .cloned()
        .unwrap_or_else(|| config.default_quota.clone())
}

/// What `tess cell show` prints for one cell: its definition and its live threads.
pub(super) fn cell_info(c: &Cell, cgroups: &dyn Backend, spinners: &[i32]) -> CellInfo {
    // Only cells with idle spinners need each thread's process looked up (a /proc read each).
    let threads = cgroups
        .threads(c.name())
        .unwrap_or_default()
        .into_iter()
        .filter(|tid| {
            spinners.is_empty() || !spinners.contains(&tess_sched::proc::tgid_of(*tid).unwrap_or(0))
        })
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
        broker: c.spec.broker,
        ephemeral_pid: c.ephemeral_pid,
        utilization: c.policy().utilization(),
        processes: cgroups
            .processes(c.name())
            .unwrap_or_default()
            .into_iter()
            .filter(|p| !spinners.contains(p))
            .collect(),
        idle_spinners: spinners.to_vec(),
        threads,
        cgroup: cgroups.cell_cpuset_dir(c.name()).display().to_string(),
        created_ms: c.created_ms,
    }
}

impl Snapshot {
    /// Answers a read request ([`is_read`]); `None` for anything else.
    pub fn handle(&self, caller: &Caller, req: &Request) -> Option<Response> {
        let res = match req {
            Request::Hello { version } => hello(caller, *version),
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
                .visible(caller, name)
                .map(|c| Body::Cell(Box::new(self.info(c)))),
            Request::ListQuotas => Ok(self.list_quotas(caller)),
            _ => return None,
        };
        Some(match res {
            Ok(body) => Response::Ok { body },
            Err(e) => Response::Error {
                kind: e.kind,
                message: e.message,
            },
        })
    }

    /// Who a caller is, for the nameserver: uid, pid and the cell it runs in.
    pub fn peer_info(&self, caller: &Caller) -> tess_proto::ns::PeerInfo {
        tess_proto::ns::PeerInfo {
            uid: caller.uid,
            pid: caller.pid,
            cell: self.cgroups.cell_of_pid(caller.pid),
        }
    }

    fn visible(&self, caller: &Caller, name: &str) -> EResult<&Cell> {
        match self.cluster.cells.get(name) {
            Some(c) if caller.is_root() || c.owner == caller.uid => Ok(c),
            _ => Err(EngineError::not_found(name)),
        }
    }

    /// One cell's description.
    pub fn info(&self, c: &Cell) -> CellInfo {
        let spinners = self.spinners.get(c.name()).cloned().unwrap_or_default();
        cell_info(c, self.cgroups.as_ref(), &spinners)
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
                quota: Some(quota_of(&self.quotas, &self.config, uid)),
                usage: Some(quota::usage_of(&self.cluster, uid).into()),
            })
            .collect();
        Body::Quotas { quotas }
    }

    /// `tess status`.
    pub fn status(&self) -> StatusInfo {
        StatusInfo {
            version: env!("CARGO_PKG_VERSION").into(),
            pid: std::process::id() as i32,
            uptime_s: self.started.elapsed().as_secs_f64(),
            cgroup: self.cgroups.describe(),
            harts: self.layout.all.clone(),
            managed: self.layout.managed.clone(),
            dedicated: self.layout.dedicated.clone(),
            reserved: self.layout.reserved.clone(),
            system: self.layout.system.clone(),
            utilization_limit: self.cap.utilization_limit,
            kernel_reservation_limit: self.cap.kernel_reservation_limit,
            load: self.load.clone(),
            cells: self.cluster.cells.len(),
            irqs_steered: self.health.irqs_steered,
            warnings: self.health.conflicts.clone(),
            state_dir: self.config.state_dir.display().to_string(),
        }
    }
}

fn hello(caller: &Caller, version: u32) -> EResult<Body> {
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
