//! v1 logic against the model of cgroupfs (`crate::fs::model`) in a temporary directory.

use super::*;
use std::collections::BTreeMap;
use std::time::Duration;
use tess_core::layout::{plan, CellLayout};
use tess_core::spec::{CellSpec, HartRequest, Policy};
use tess_core::state::{Cell, Cluster};

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    backend: V1,
    kernel: std::sync::Arc<crate::fs::model::Model>,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    for h in ["cpuset", "cpu", "memory", "pids"] {
        std::fs::create_dir(root.join(h)).unwrap();
        std::fs::write(root.join(h).join("cgroup.procs"), "1\n2\n").unwrap();
    }
    std::fs::write(root.join("cpuset/cpuset.mems"), "0\n").unwrap();
    let paths = V1Paths {
        cpuset: root.join("cpuset"),
        cpu: root.join("cpu"),
        memory: Some(root.join("memory")),
        pids: Some(root.join("pids")),
    };
    let kernel = std::sync::Arc::new(crate::fs::model::Model::v1(&[
        paths.cpuset.clone(),
        paths.cpu.clone(),
        root.join("memory"),
        root.join("pids"),
    ]));
    let backend = V1::new(paths, "tess", Fs::over(kernel.clone()));
    Fixture {
        _dir: dir,
        root,
        backend,
        kernel,
    }
}

fn read(p: PathBuf) -> String {
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .trim()
        .to_string()
}

fn cluster(cells: &[(&str, Policy, &str)]) -> Cluster {
    let mut c = Cluster {
        cells: BTreeMap::new(),
    };
    for (name, policy, harts) in cells {
        let harts: HartSet = harts.parse().unwrap();
        c.cells.insert(
            name.to_string(),
            Cell {
                spec: CellSpec {
                    name: name.to_string(),
                    policy: policy.clone(),
                    harts: HartRequest::Ids(harts.clone()),
                    memory_max: Some(64 << 20),
                    pids_max: Some(32),
                    pinned: false,
                    idle: None,
                    broker: Default::default(),
                },
                harts,
                window_offset: None,
                owner: 0,
                ephemeral_pid: None,
                created_ms: 0,
            },
        );
    }
    c
}

fn apply(f: &Fixture, c: &Cluster) -> Layout {
    let all = HartSet::first_n(4);
    let layout = plan(c, &all, &all, DomainMode::PerHart);
    f.backend.init(&all).unwrap();
    f.backend.apply_topology(&layout).unwrap();
    for (name, cl) in &layout.cells {
        f.backend.apply_cell(name, cl, &layout).unwrap();
    }
    layout
}

#[test]
fn topology_builds_anchors_and_system() {
    let f = fixture();
    let et = Policy::EventTriggered {
        period: Duration::from_millis(10),
        budget: Duration::from_millis(2),
    };
    let c = cluster(&[("synth", Policy::Dedicated, "3"), ("ctl", et, "2")]);
    apply(&f, &c);
    let cs = f.root.join("cpuset");
    assert_eq!(read(cs.join("cpuset.sched_load_balance")), "0");
    assert_eq!(read(cs.join("tess/cpuset.cpus")), "0-3");
    assert_eq!(read(cs.join("tess/cpuset.sched_load_balance")), "0");
    assert_eq!(read(cs.join("tess/system/cpuset.cpus")), "0-1");
    assert_eq!(read(cs.join("tess/domains/2/cpuset.cpus")), "2");
    assert_eq!(
        read(cs.join("tess/domains/2/cpuset.sched_load_balance")),
        "1"
    );
    assert_eq!(read(cs.join("tess/domains/0-1/cpuset.cpus")), "0-1");
    assert_eq!(read(cs.join("tess/cells/synth/cpuset.cpus")), "3");
    assert_eq!(
        read(cs.join("tess/cells/synth/cpuset.sched_load_balance")),
        "0"
    );
    assert_eq!(read(cs.join("tess/cells/synth/cpuset.mems")), "0");
    // Dedicated cells have no cpu group; reserved ones are capped against CFS leakage.
    assert!(!f.root.join("cpu/tess/cells/synth").exists());
    assert_eq!(
        read(f.root.join("cpu/tess/cells/ctl/cpu.cfs_quota_us")),
        "2000"
    );
    assert_eq!(
        read(f.root.join("cpu/tess/cells/ctl/cpu.cfs_period_us")),
        "10000"
    );
    assert_eq!(
        read(f.root.join("memory/tess/cells/ctl/memory.limit_in_bytes")),
        (64u64 << 20).to_string()
    );
    assert_eq!(read(f.root.join("pids/tess/cells/ctl/pids.max")), "32");
}

#[test]
fn stale_anchors_are_removed() {
    let f = fixture();
    let et = Policy::EventTriggered {
        period: Duration::from_millis(10),
        budget: Duration::from_millis(2),
    };
    apply(&f, &cluster(&[("ctl", et, "2")]));
    assert!(f.root.join("cpuset/tess/domains/2").exists());
    apply(&f, &cluster(&[]));
    assert!(!f.root.join("cpuset/tess/domains/2").exists());
    assert_eq!(
        read(f.root.join("cpuset/tess/domains/0-3/cpuset.cpus")),
        "0-3"
    );
}

#[test]
fn attach_remove_and_sweep() {
    let f = fixture();
    let be = Policy::BestEffort { weight: 200 };
    apply(&f, &cluster(&[("batch", be, "0-1")]));
    assert_eq!(read(f.root.join("cpu/tess/cells/batch/cpu.shares")), "2048");
    f.backend.attach_process("batch", 4242, false).unwrap();
    assert_eq!(
        read(f.root.join("cpu/tess/cells/batch/cgroup.procs")),
        "",
        "the cpu group waits"
    );
    // Until the process has run on one of the cell's harts.
    f.kernel.set_last_hart(4242, 3);
    assert_eq!(
        f.backend
            .complete_attach("batch", &"0-1".parse().unwrap())
            .unwrap(),
        0
    );
    f.kernel.set_last_hart(4242, 1);
    assert_eq!(
        f.backend
            .complete_attach("batch", &"0-1".parse().unwrap())
            .unwrap(),
        1
    );
    for h in ["cpuset", "cpu", "memory", "pids"] {
        assert_eq!(
            read(f.root.join(h).join("tess/cells/batch/cgroup.procs")),
            "4242",
            "{h}"
        );
    }
    assert_eq!(f.backend.processes("batch").unwrap(), vec![4242]);
    assert_eq!(
        f.backend.existing_cells().unwrap(),
        vec!["batch".to_string()]
    );
    f.backend.remove_cell("batch").unwrap();
    assert!(!f.root.join("cpuset/tess/cells/batch").exists());
    // Its task went to the system group.
    assert_eq!(read(f.root.join("cpuset/tess/system/cgroup.procs")), "4242");
    // Root tasks are swept into the system group.
    assert_eq!(f.backend.sweep_into_system().unwrap(), 2);
}

#[test]
fn foreign_cpusets_that_break_the_layout_are_reported() {
    let f = fixture();
    let et = Policy::EventTriggered {
        period: Duration::from_millis(10),
        budget: Duration::from_millis(2),
    };
    let layout = apply(
        &f,
        &cluster(&[("ctl", et, "2"), ("syn", Policy::Dedicated, "3")]),
    );
    let docker = f.root.join("cpuset/docker");
    std::fs::create_dir(&docker).unwrap();
    std::fs::write(docker.join("cpuset.cpus"), "0-3").unwrap();
    std::fs::write(docker.join("cpuset.sched_load_balance"), "1").unwrap();
    std::fs::write(docker.join("tasks"), "77\n").unwrap();
    let c = f.backend.foreign_conflicts(&layout);
    assert_eq!(c.len(), 2, "{c:?}");
    assert!(c[0].contains("dedicated harts 3"), "{c:?}");
    assert!(
        c[1].contains("merging the scheduling domains of reserved harts 2"),
        "{c:?}"
    );
    std::fs::write(docker.join("cpuset.sched_load_balance"), "0").unwrap();
    std::fs::write(docker.join("cpuset.cpus"), "0-1").unwrap();
    assert!(f.backend.foreign_conflicts(&layout).is_empty());
}

#[test]
fn teardown_restores_the_root() {
    let f = fixture();
    apply(&f, &cluster(&[("synth", Policy::Dedicated, "3")]));
    f.backend.teardown().unwrap();
    assert!(!f.root.join("cpuset/tess").exists());
    assert!(!f.root.join("cpu/tess").exists());
    assert_eq!(read(f.root.join("cpuset/cpuset.sched_load_balance")), "1");
}

#[test]
fn dedicated_to_best_effort_gains_a_cpu_group() {
    let f = fixture();
    apply(&f, &cluster(&[("x", Policy::Dedicated, "3")]));
    f.backend.attach_process("x", 77, true).unwrap();
    let layout = apply(
        &f,
        &cluster(&[("x", Policy::BestEffort { weight: 100 }, "3")]),
    );
    let cl: &CellLayout = &layout.cells["x"];
    assert_eq!(cl.class, tess_core::layout::CellClass::Shared);
    assert_eq!(read(f.root.join("cpu/tess/cells/x/cgroup.procs")), "77");
}

fn apply_groups(f: &Fixture, c: &Cluster) -> Layout {
    let all = HartSet::first_n(4);
    let groups = f.backend.group_servers().is_some();
    let layout = tess_core::layout::plan_with(c, &all, &all, DomainMode::PerHart, groups);
    f.backend.init(&all).unwrap();
    f.backend.apply_topology(&layout).unwrap();
    for (name, cl) in &layout.cells {
        f.backend.apply_cell(name, cl, &layout).unwrap();
    }
    layout
}

#[test]
fn event_triggered_cells_get_rt_group_bandwidth_within_their_parents() {
    let f = fixture();
    // Without RT group scheduling (no cpu.rt_* files) there are no group servers.
    assert_eq!(f.backend.group_servers(), None);
    std::fs::write(f.root.join("cpu/cpu.rt_runtime_us"), "950000\n").unwrap();
    std::fs::write(f.root.join("cpu/cpu.rt_period_us"), "1000000\n").unwrap();
    assert_eq!(f.backend.group_servers(), Some(0.95));
    let ms = Duration::from_millis;
    let et = |budget, period| Policy::EventTriggered {
        period: ms(period),
        budget: ms(budget),
    };
    let tt = Policy::TimeTriggered {
        period: ms(20),
        active: ms(3),
        offset: Some(ms(5)),
    };
    let c = cluster(&[
        ("ctl", et(2, 10), "2"),
        ("io", et(1, 4), "1"),
        ("win", tt, "2"),
    ]);
    let layout = apply_groups(&f, &c);
    assert!(layout.cells["ctl"].group_server);
    assert!(!layout.cells["win"].group_server);
    let cpu = f.root.join("cpu/tess");
    let rt = |dir: &str| {
        (
            read(cpu.join(dir).join("cpu.rt_runtime_us")),
            read(cpu.join(dir).join("cpu.rt_period_us")),
        )
    };
    assert_eq!(rt("cells/ctl"), ("2000".into(), "10000".into()));
    assert_eq!(rt("cells/io"), ("1000".into(), "4000".into()));
    // Time-triggered cells keep per-thread SCHED_DEADLINE: no RT bandwidth (the kernel's
    // default for a new group).
    assert_eq!(rt("cells/win").0, "0");
    // Parents: 0.2 + 0.25 of a second, plus one budget of each (2 ms + 1 ms) for how the
    // children's periods align with the parents' second.
    assert_eq!(rt(""), ("453000".into(), "1000000".into()));
    assert_eq!(rt("cells"), ("453000".into(), "1000000".into()));
    // ctl goes (its group lingers until removed), io changes period: shrink, then grow.
    let c = cluster(&[("io", et(1, 5), "1")]);
    apply_groups(&f, &c);
    assert_eq!(rt("cells/ctl").0, "0");
    assert_eq!(rt("cells/io"), ("1000".into(), "5000".into()));
    assert_eq!(rt(""), ("201000".into(), "1000000".into()));
    assert_eq!(rt("cells"), ("201000".into(), "1000000".into()));
    // No group server left: the parents give their RT bandwidth back.
    let tt2 = Policy::TimeTriggered {
        period: ms(20),
        active: ms(3),
        offset: Some(ms(5)),
    };
    apply_groups(&f, &cluster(&[("win2", tt2, "2")]));
    assert_eq!(rt(""), ("0".into(), "1000000".into()));
    assert_eq!(rt("cells"), ("0".into(), "1000000".into()));
}
