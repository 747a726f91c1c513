//! The parallel scheduler: clustering keeps every dependency and keeps voices apart; both
//! strategies render exactly what the serial Pd order renders.

use std::path::Path;
use tess_pd::bench::{chain_patch, trivial_patch, voices_patch};
use tess_pd::engine::{Config, Engine};
use tess_pd::sched::{Executor, Strategy, TaskGraph};

const CFG: Config = Config {
    sample_rate: 48000.0,
    block: 64,
};

fn patch(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write");
    p
}

fn check_tasks(g: &tess_pd::graph::DspGraph, tg: &TaskGraph) {
    let n = g.nodes.len();
    let mut task_of = vec![usize::MAX; n];
    for (t, nodes) in tg.tasks.iter().enumerate() {
        for &k in nodes {
            assert_eq!(task_of[k], usize::MAX, "node {k} in two tasks");
            task_of[k] = t;
        }
    }
    assert!(
        task_of.iter().all(|&t| t != usize::MAX),
        "a node in no task"
    );
    for (a, node) in g.nodes.iter().enumerate() {
        for &b in &node.succs {
            let (ta, tb) = (task_of[a], task_of[b]);
            if ta == tb {
                let pos = |k| tg.tasks[ta].iter().position(|&x| x == k).expect("in task");
                assert!(
                    pos(a) < pos(b),
                    "edge {a}->{b} runs backwards inside task {ta}"
                );
            } else {
                assert!(
                    tg.succs[ta].contains(&tb),
                    "edge {a}->{b} lost between tasks"
                );
            }
        }
    }
    // acyclic: Kahn's algorithm consumes every task
    let mut np = tg.npreds.clone();
    let mut ready: Vec<usize> = (0..np.len()).filter(|&t| np[t] == 0).collect();
    let mut seen = 0;
    while let Some(t) = ready.pop() {
        seen += 1;
        for &s in &tg.succs[t] {
            np[s] -= 1;
            if np[s] == 0 {
                ready.push(s);
            }
        }
    }
    assert_eq!(seen, tg.tasks.len(), "task graph has a cycle");
}

#[test]
fn clustering_keeps_dependencies_and_voices_parallel() {
    let d = tempfile::tempdir().expect("tmp");
    for (name, text, harts) in [
        ("v.pd", voices_patch(64), 2),
        ("c.pd", chain_patch(100), 2),
        ("t.pd", trivial_patch(64), 4),
    ] {
        let p = patch(d.path(), name, &text);
        let e = Engine::open(&p, CFG).expect("open");
        let tg = TaskGraph::from_graph(e.graph(), harts);
        check_tasks(e.graph(), &tg);
        if name == "v.pd" {
            // every voice's seven objects end up together; the voices stay separate tasks
            assert!(
                tg.tasks.len() >= 8,
                "only {} tasks for 64 voices",
                tg.tasks.len()
            );
            assert!(
                tg.tasks.len() <= 64 + 1,
                "{} tasks: voices were split",
                tg.tasks.len()
            );
        }
        if name == "c.pd" {
            assert_eq!(tg.tasks.len(), 1, "a chain is one task");
        }
    }
}

#[test]
fn strategies_render_bit_identical_to_serial() {
    let d = tempfile::tempdir().expect("tmp");
    let p = patch(d.path(), "v.pd", &voices_patch(16));
    let serial = tess_pd::render::render(&p, CFG, 0.1, &mut Executor::serial()).expect("serial");
    for s in [Strategy::GlobalQueue, Strategy::WorkStealing] {
        for harts in [1, 2] {
            let par = tess_pd::render::render(&p, CFG, 0.1, &mut Executor::new(s, harts))
                .expect("parallel");
            assert_eq!(serial, par, "{s:?} on {harts} harts differs from serial");
        }
    }
}
