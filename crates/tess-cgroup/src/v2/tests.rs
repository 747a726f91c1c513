//! v2 logic against the model of cgroupfs (`crate::fs::model`) in a temporary directory.

use super::*;
use std::collections::BTreeMap;
use std::time::Duration;
use tess_core::layout::plan;
use tess_core::spec::{CellSpec, HartRequest, Policy};
use tess_core::state::{Cell, Cluster};

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
                    memory_max: None,
                    pids_max: None,
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

fn read(p: PathBuf) -> String {
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .trim()
        .to_string()
}

fn apply(b: &V2, c: &Cluster, n: usize) -> Layout {
    let all = HartSet::first_n(n);
    let layout = plan(c, &all, &all, DomainMode::PerComponent);
    b.init(&all).unwrap();
    b.apply_topology(&layout).unwrap();
    for (name, cl) in &layout.cells {
        b.apply_cell(name, cl, &layout).unwrap();
    }
    layout
}

fn et() -> Policy {
    Policy::EventTriggered {
        period: Duration::from_millis(10),
        budget: Duration::from_millis(2),
    }
}

#[test]
fn dedicated_and_reserved_harts_are_partitions_beside_the_group() {
    let dir = tempfile::tempdir().unwrap();
    let b = V2::new(dir.path().to_path_buf(), "tess", model_fs(dir.path()));
    apply(
        &b,
        &cluster(&[("synth", Policy::Dedicated, "3"), ("ctl", et(), "2")]),
        4,
    );
    let r = dir.path();
    assert_eq!(
        read(r.join("cgroup.subtree_control")),
        "cpuset cpu memory pids"
    );
    // tess's own group never lists harts (it would collide with the partitions).
    assert_eq!(read(r.join("tess/cpuset.cpus")), "");
    assert_eq!(
        read(r.join("tess.part-3/cpuset.cpus.partition")),
        "isolated"
    );
    assert_eq!(read(r.join("tess.part-3/synth/cpuset.cpus")), "3");
    // The reserved hart is its own root partition holding the reserved cell.
    assert_eq!(read(r.join("tess.part-2/cpuset.cpus.partition")), "root");
    assert_eq!(read(r.join("tess.part-2/ctl/cpuset.cpus")), "2");
    assert_eq!(read(r.join("tess.part-2/ctl/cpu.max")), "2000 10000");
    assert_eq!(read(r.join("tess.part-2/ctl/memory.max")), "max");
    assert_eq!(
        b.existing_cells().unwrap(),
        vec!["ctl".to_string(), "synth".to_string()]
    );
    b.teardown().unwrap();
    assert!(!r.join("tess").exists());
    assert!(!r.join("tess.part-2").exists());
    assert!(!r.join("tess.part-3").exists());
}

#[test]
fn last_component_stays_in_the_root_when_no_pool_is_left() {
    let dir = tempfile::tempdir().unwrap();
    let b = V2::new(dir.path().to_path_buf(), "tess", model_fs(dir.path()));
    apply(
        &b,
        &cluster(&[("synth", Policy::Dedicated, "1"), ("ctl", et(), "0")]),
        2,
    );
    let r = dir.path();
    assert!(
        r.join("tess/cells/ctl").is_dir(),
        "reserved cell stays outside a partition"
    );
    assert!(!r.join("tess.part-0").exists());
    assert_eq!(
        read(r.join("tess.part-1/cpuset.cpus.partition")),
        "isolated"
    );
}

#[test]
fn cells_follow_their_partition_and_keep_their_processes() {
    let dir = tempfile::tempdir().unwrap();
    let b = V2::new(dir.path().to_path_buf(), "tess", model_fs(dir.path()));
    apply(
        &b,
        &cluster(&[("ctl", Policy::BestEffort { weight: 50 }, "2")]),
        4,
    );
    let r = dir.path();
    assert_eq!(read(r.join("tess/cells/ctl/cpu.weight")), "50");
    b.attach_process("ctl", 99, true).unwrap();
    apply(&b, &cluster(&[("ctl", et(), "2")]), 4);
    assert!(!r.join("tess/cells/ctl").exists());
    assert_eq!(read(r.join("tess.part-2/ctl/cgroup.procs")), "99");
    assert_eq!(b.processes("ctl").unwrap(), vec![99]);
    // Moving to another hart: the old partition goes once its cell has moved out.
    apply(&b, &cluster(&[("ctl", et(), "3")]), 4);
    assert_eq!(read(r.join("tess.part-3/ctl/cgroup.procs")), "99");
    assert!(!r.join("tess.part-2").exists());
    // Back to best effort: out of every partition.
    apply(
        &b,
        &cluster(&[("ctl", Policy::BestEffort { weight: 50 }, "3")]),
        4,
    );
    assert_eq!(read(r.join("tess/cells/ctl/cgroup.procs")), "99");
    assert!(!r.join("tess.part-3").exists());
    b.remove_cell("ctl").unwrap();
    assert!(!r.join("tess/cells/ctl").exists());
    b.teardown().unwrap();
    assert!(!r.join("tess").exists());
}

fn model_fs(root: &std::path::Path) -> Fs {
    Fs::over(std::sync::Arc::new(crate::fs::model::Model::v2(root)))
}

#[test]
fn a_partition_the_kernel_finds_invalid_is_an_error_naming_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let model = std::sync::Arc::new(crate::fs::model::Model::v2(dir.path()));
    let b = V2::new(dir.path().to_path_buf(), "tess", Fs::over(model.clone()));
    apply(&b, &cluster(&[("synth", Policy::Dedicated, "3")]), 4);
    let part = dir.path().join("tess.part-3");
    assert_eq!(read(part.join("cpuset.cpus.partition")), "isolated");
    // Something took the partition's harts: the next change reads back "invalid (reason)".
    model.invalidate_partition(&part);
    let err = cpuset::set_partition(&b.fs, &part, cpuset::Partition::Root)
        .unwrap_err()
        .to_string();
    assert!(err.contains("invalid (Cpu list"), "{err}");
}
