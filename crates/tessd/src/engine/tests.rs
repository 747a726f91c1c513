//! Unit tests of the transaction pipeline, through a recording kernel backend (a test double:
//! it records every convergence and can be told to refuse one) and a real journal in a
//! temporary directory. The real kernel backend is exercised by the root tests.

use super::*;
use crate::daemon::Daemon;
use std::sync::Mutex;
use std::time::Duration;
use tess_cgroup::CgroupError;
use tess_core::layout::{plan_with, CellLayout, DomainMode};
use tess_core::spec::{CellSpec, HartRequest, Policy};
use tess_proto::{ApplyResult, Body};
use tess_sched::HartSet;

/// A cell owned by root with no harts yet.
pub fn cell(name: &str, policy: Policy, harts: HartRequest) -> Cell {
    Cell {
        spec: CellSpec {
            name: name.into(),
            policy,
            harts,
            memory_max: None,
            pids_max: None,
            pinned: false,
            idle: None,
            broker: Default::default(),
        },
        harts: HartSet::new(),
        window_offset: None,
        owner: 0,
        ephemeral_pid: None,
        created_ms: 1,
    }
}

/// A machine of `n` harts with the default limits.
pub fn machine(n: usize) -> Capacity {
    Capacity::new((0..n).collect())
}

/// What the recorder saw: each convergence as (cells before, cells after).
type Log = Arc<Mutex<Vec<(Option<Vec<String>>, Vec<String>)>>>;

/// The recording kernel backend.
#[derive(Debug)]
struct Recorder {
    harts: HartSet,
    log: Log,
    /// Refuse the convergence with this index (0-based), as the kernel would refuse a write.
    refuse: Option<usize>,
}

fn names(l: &Layout) -> Vec<String> {
    l.cells.keys().cloned().collect()
}

impl KernelBackend for Recorder {
    fn plan(&self, cluster: &Cluster) -> Layout {
        plan_with(
            cluster,
            &self.harts,
            &self.harts,
            DomainMode::PerHart,
            false,
        )
    }

    fn converge(&mut self, from: Option<&Layout>, to: &Layout, _: &Store) -> Result<Vec<String>> {
        let mut log = self.log.lock().unwrap();
        let index = log.len();
        log.push((from.map(names), names(to)));
        if self.refuse == Some(index) {
            anyhow::bail!("writing cpuset.cpus: invalid argument (recorder refused)");
        }
        Ok(Vec::new())
    }

    fn sync_cell(&mut self, _: &Layout, _: &str) -> Result<()> {
        Ok(())
    }

    fn rephase(&mut self, _: &Layout, _: &str) -> Result<usize> {
        Ok(0)
    }

    fn housekeep(&mut self, _: &Layout) -> Result<()> {
        Ok(())
    }

    fn follow_demand(&mut self, _: &Layout) {}

    fn pending_cells(&self) -> Vec<String> {
        Vec::new()
    }

    fn tracked_cell_of(&self, _: i32) -> Option<String> {
        None
    }

    fn cgroups(&self) -> Arc<dyn Backend> {
        Arc::new(NoCgroups)
    }

    fn spinners(&self) -> BTreeMap<String, Vec<i32>> {
        BTreeMap::new()
    }

    fn health(&self) -> KernelHealth {
        KernelHealth::default()
    }
}

/// Cgroup membership for the recorder: every cell is empty.
#[derive(Debug)]
struct NoCgroups;

impl Backend for NoCgroups {
    fn version(&self) -> Version {
        Version::V2
    }
    fn domain_mode(&self) -> DomainMode {
        DomainMode::PerHart
    }
    fn describe(&self) -> String {
        "recorder".into()
    }
    fn init(&self, _: &HartSet) -> tess_cgroup::Result<()> {
        Ok(())
    }
    fn apply_topology(&self, _: &Layout) -> tess_cgroup::Result<()> {
        Ok(())
    }
    fn apply_cell(&self, _: &str, _: &CellLayout, _: &Layout) -> tess_cgroup::Result<()> {
        Ok(())
    }
    fn remove_cell(&self, _: &str) -> tess_cgroup::Result<()> {
        Ok(())
    }
    fn attach_process(&self, name: &str, _: i32, _: bool) -> tess_cgroup::Result<()> {
        Err(CgroupError::Write {
            path: self.cell_cpuset_dir(name).join("cgroup.procs"),
            value: "0".into(),
            source: std::io::Error::from_raw_os_error(libc::EINVAL),
        })
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
        Ok(Vec::new())
    }
    fn sweep_into_system(&self) -> tess_cgroup::Result<usize> {
        Ok(0)
    }
    fn teardown(&self) -> tess_cgroup::Result<()> {
        Ok(())
    }
    fn cell_cpuset_dir(&self, name: &str) -> std::path::PathBuf {
        std::path::Path::new("/recorder").join(name)
    }
    fn cell_of_pid(&self, _: i32) -> Option<String> {
        None
    }
    fn foreign_conflicts(&self, _: &Layout) -> Vec<String> {
        Vec::new()
    }
}

pub(crate) struct Rig {
    dir: tempfile::TempDir,
    log: Log,
}

pub(crate) fn engine(refuse: Option<usize>) -> (Engine, Rig) {
    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        state_dir: dir.path().to_path_buf(),
        ..Config::default()
    };
    let store = Store::open(dir.path()).unwrap();
    let log: Log = Arc::default();
    let rec = Recorder {
        harts: (0..4).collect(),
        log: log.clone(),
        refuse,
    };
    let layout = rec.plan(&Cluster::default());
    let e = Engine::from_parts(
        config,
        store,
        Box::new(rec),
        machine(4),
        Persisted::default(),
        layout,
    );
    (e, Rig { dir, log })
}

pub(crate) fn root() -> Caller {
    Caller {
        uid: 0,
        pid: std::process::id() as i32,
        pidfd: None,
    }
}

pub(crate) fn create(name: &str, policy: Policy) -> Request {
    Request::CreateCell {
        spec: cell(name, policy, HartRequest::Count(1)).spec,
    }
}

fn journal(rig: &Rig) -> Vec<String> {
    let p = Store::open(rig.dir.path()).unwrap().load().unwrap();
    p.cluster.cells.keys().cloned().collect()
}

fn ok(r: Response) -> Body {
    match r {
        Response::Ok { body } => body,
        Response::Error { kind, message } => panic!("{kind:?}: {message}"),
    }
}

fn error(r: Response) -> (ErrorKind, String) {
    match r {
        Response::Error { kind, message } => (kind, message),
        Response::Ok { body } => panic!("expected an error, got {body:?}"),
    }
}

#[test]
fn a_change_is_planned_applied_once_and_committed() {
    let (mut e, rig) = engine(None);
    ok(e.handle(&root(), create("a", Policy::Dedicated)));
    assert_eq!(
        *rig.log.lock().unwrap(),
        vec![(Some(vec![]), vec!["a".to_string()])]
    );
    assert_eq!(journal(&rig), ["a"]);
    assert_eq!(e.generation(), 1);
    assert_eq!(e.snapshot().cluster.cells["a"].harts.len(), 1);
}

#[test]
fn a_kernel_refusal_is_rolled_back_and_not_committed() {
    let (mut e, rig) = engine(Some(1));
    ok(e.handle(&root(), create("a", Policy::Dedicated)));
    let (kind, msg) = error(e.handle(&root(), create("b", Policy::BestEffort { weight: 100 })));
    assert_eq!(kind, ErrorKind::Kernel);
    assert!(
        msg.contains("rolled back") && msg.contains("cpuset.cpus"),
        "{msg}"
    );
    // Convergence 1 (to a+b) failed; convergence 2 went back from a+b to a.
    let log = rig.log.lock().unwrap().clone();
    assert_eq!(log.len(), 3);
    assert_eq!(
        log[2],
        (Some(vec!["a".into(), "b".into()]), vec!["a".into()])
    );
    assert_eq!(journal(&rig), ["a"]);
    assert_eq!(e.generation(), 1);
    assert!(!e.cluster().cells.contains_key("b"));
}

#[test]
fn a_journal_failure_rolls_the_kernel_back() {
    let (mut e, rig) = engine(None);
    e.store.fail_writes_for_test();
    let (kind, msg) = error(e.handle(&root(), create("a", Policy::Dedicated)));
    assert_eq!(kind, ErrorKind::Internal);
    assert!(msg.contains("could not be recorded"), "{msg}");
    let log = rig.log.lock().unwrap().clone();
    assert_eq!(
        log,
        vec![
            (Some(vec![]), vec!["a".into()]),
            (Some(vec!["a".into()]), vec![]),
        ]
    );
    assert!(e.cluster().cells.is_empty());
    assert_eq!(e.generation(), 0);
}

#[test]
fn refusals_and_dry_runs_touch_neither_kernel_nor_journal() {
    let (mut e, rig) = engine(None);
    // Four harts, one kept for the system: four dedicated cells do not fit.
    let specs: Vec<CellSpec> = ["a", "b", "c", "d"]
        .iter()
        .map(|n| cell(n, Policy::Dedicated, HartRequest::Count(1)).spec)
        .collect();
    let (kind, _) = error(e.handle(
        &root(),
        Request::Apply {
            cells: specs.clone(),
            delete: vec![],
            prune: false,
            dry_run: false,
        },
    ));
    assert_eq!(kind, ErrorKind::Admission);
    let body = ok(e.handle(
        &root(),
        Request::Apply {
            cells: specs[..2].to_vec(),
            delete: vec![],
            prune: false,
            dry_run: true,
        },
    ));
    let Body::Applied(ApplyResult { dry_run, cells, .. }) = body else {
        panic!("{body:?}")
    };
    assert!(dry_run);
    assert_eq!(cells.len(), 2);
    assert!(rig.log.lock().unwrap().is_empty());
    assert!(journal(&rig).is_empty());
}

#[test]
fn delete_converges_without_the_cell_and_forgets_it() {
    let (mut e, rig) = engine(None);
    ok(e.handle(&root(), create("a", Policy::Dedicated)));
    ok(e.handle(&root(), Request::DeleteCell { name: "a".into() }));
    assert_eq!(rig.log.lock().unwrap()[1], (Some(vec!["a".into()]), vec![]));
    assert!(journal(&rig).is_empty());
    assert_eq!(e.generation(), 2);
}

#[test]
fn reads_are_answered_while_a_transaction_holds_the_engine() {
    let (e, _rig) = engine(None);
    let d = Arc::new(Daemon::new(e));
    let (read_done_tx, read_done_rx) = std::sync::mpsc::channel();
    let (holding_tx, holding_rx) = std::sync::mpsc::channel();
    let writer = {
        let d = d.clone();
        std::thread::spawn(move || {
            d.transact(|e| {
                let r = e.handle(&root(), create("a", Policy::Dedicated));
                holding_tx.send(()).unwrap();
                // Hold the engine until the reader has its answer; a read that needed the
                // engine would never come and this would time out.
                read_done_rx
                    .recv_timeout(Duration::from_secs(10))
                    .expect("a read waited for the transaction");
                r
            })
            .unwrap()
        })
    };
    holding_rx.recv().unwrap();
    // The change is not published until the transaction ends: the reader sees the old state.
    let body = ok(d.handle(&root(), Request::Status));
    let Body::Status(s) = body else { panic!() };
    assert_eq!(s.cells, 0);
    read_done_tx.send(()).unwrap();
    ok(writer.join().unwrap());
    let Body::Status(s) = ok(d.handle(&root(), Request::Status)) else {
        panic!()
    };
    assert_eq!(s.cells, 1);
}

#[test]
fn a_cell_named_twice_in_one_apply_is_a_usage_error() {
    let (mut e, rig) = engine(None);
    let spec = cell("a", Policy::Dedicated, HartRequest::Count(1)).spec;
    let (kind, msg) = error(e.handle(
        &root(),
        Request::Apply {
            cells: vec![spec.clone(), spec],
            delete: vec![],
            prune: false,
            dry_run: false,
        },
    ));
    assert_eq!(kind, ErrorKind::Usage);
    assert!(msg.contains("appears twice"), "{msg}");
    assert!(rig.log.lock().unwrap().is_empty());
}

#[test]
fn merge_refuses_options_of_another_policy_and_applies_its_own() {
    let spec = cell(
        "a",
        Policy::EventTriggered {
            period: Duration::from_millis(10),
            budget: Duration::from_millis(1),
        },
        HartRequest::Count(1),
    )
    .spec;
    let weight = tess_proto::CellUpdate {
        weight: Some(5),
        ..Default::default()
    };
    let e = merge(&spec, &weight).unwrap_err();
    assert!(e.message.contains("--weight"), "{}", e.message);
    let budget = tess_proto::CellUpdate {
        budget: Some(Duration::from_millis(3)),
        ..Default::default()
    };
    let merged = merge(&spec, &budget).unwrap();
    assert_eq!(
        merged.policy,
        Policy::EventTriggered {
            period: Duration::from_millis(10),
            budget: Duration::from_millis(3),
        }
    );
}

#[test]
fn other_users_cells_are_invisible_to_reads_and_writes() {
    let (mut e, _rig) = engine(None);
    ok(e.handle(&root(), create("a", Policy::Dedicated)));
    let user = Caller {
        uid: 1000,
        pid: std::process::id() as i32,
        pidfd: None,
    };
    let (kind, _) = error(e.handle(&user, Request::ShowCell { name: "a".into() }));
    assert_eq!(kind, ErrorKind::NotFound);
    let (kind, _) = error(e.handle(&user, Request::DeleteCell { name: "a".into() }));
    assert_eq!(kind, ErrorKind::NotFound);
    let Body::Cells { cells } = ok(e.handle(&user, Request::ListCells)) else {
        panic!()
    };
    assert!(cells.is_empty());
}
