//! Requests that change cells: each builds the next cluster from the current one and hands it
//! to the transaction ([`super::txn`]).

use super::error::{now_ms, Caller, EResult, EngineError};
use super::Engine;
use std::collections::BTreeSet;
use std::time::Duration;
use tess_core::admission::AdmissionError;
use tess_core::quota::Quota;
use tess_core::spec::{CellSpec, HartRequest, Policy};
use tess_core::state::Cell;
use tess_proto::{ApplyResult, Body, CellUpdate, ErrorKind};
use tess_sched::HartSet;

impl Engine {
    pub(super) fn new_cell(&self, caller: &Caller, spec: CellSpec) -> Cell {
        Cell {
            spec,
            harts: HartSet::new(),
            window_offset: None,
            owner: caller.uid,
            ephemeral_pid: None,
            created_ms: now_ms(),
        }
    }

    pub(super) fn create(&mut self, caller: &Caller, spec: CellSpec) -> EResult<Body> {
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

    pub(super) fn update(&mut self, caller: &Caller, name: &str, u: &CellUpdate) -> EResult<Body> {
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

    pub(super) fn set_pinned(
        &mut self,
        caller: &Caller,
        name: &str,
        pinned: bool,
    ) -> EResult<Body> {
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

    pub(super) fn delete(&mut self, caller: &Caller, name: &str) -> EResult<Body> {
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

    pub(super) fn apply(
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

    pub(super) fn attach(&mut self, caller: &Caller, name: &str) -> EResult<Body> {
        self.visible(caller, name)?;
        self.attach_pid(caller, name)?;
        Ok(Body::Cell(Box::new(self.info(&self.cluster.cells[name]))))
    }

    pub(super) fn attach_pid(&mut self, caller: &Caller, name: &str) -> EResult<()> {
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
        self.kernel.cgroups().attach_process(name, caller.pid, on_cell).map_err(|e| {
            let rt = matches!(tess_sched::attr::get_policy(caller.pid), Ok((tess_sched::Policy::Fifo { .. } | tess_sched::Policy::RoundRobin { .. }, _)));
            let hint = if rt && e.errno() == Some(libc::EINVAL) {
                " (a SCHED_FIFO/SCHED_RR process can only join a dedicated or an event-triggered cell on this kernel: RT group scheduling gives other cells no RT runtime)"
            } else {
                ""
            };
            EngineError::new(ErrorKind::Kernel, format!("cannot move process {} into cell '{name}': {e}{hint}", caller.pid))
        })?;
        self.kernel
            .sync_cell(&self.layout, name)
            .map_err(|e| EngineError::new(ErrorKind::Kernel, format!("{e:#}")))?;
        Ok(())
    }

    pub(super) fn reserve(
        &mut self,
        caller: &Caller,
        budget: Duration,
        period: Duration,
        harts: Option<HartRequest>,
    ) -> EResult<Body> {
        let name = format!("run-{}", caller.pid);
        if let Some(old) = self.cluster.cells.get(&name) {
            if self
                .kernel
                .cgroups()
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
            broker: Default::default(),
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

    pub(super) fn set_quota(
        &mut self,
        caller: &Caller,
        uid: u32,
        quota: Option<Quota>,
    ) -> EResult<Body> {
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
        let snapshot = self.snapshot();
        Ok(snapshot
            .handle(caller, &tess_proto::Request::ListQuotas)
            .and_then(|r| match r {
                tess_proto::Response::Ok { body } => Some(body),
                _ => None,
            })
            .unwrap_or(Body::Quotas { quotas: Vec::new() }))
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
