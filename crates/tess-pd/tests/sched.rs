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
            // every voice's seven objects end up together; the voices stay in several tasks,
            // at least two per hart
            assert!(
                tg.tasks.len() > 2 * harts,
                "only {} tasks for 64 voices on {harts} harts",
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
fn strategies_render_what_serial_renders() {
    // Long enough (1 s, 750 blocks) for a hart that falls a block behind to show up.
    let d = tempfile::tempdir().expect("tmp");
    for (name, text) in [("v.pd", voices_patch(16)), ("t.pd", trivial_patch(64))] {
        let p = patch(d.path(), name, &text);
        render_like_serial(&p);
    }
}

/// Two sub-mixes that go on through filters before they meet in the `dac~`: joins that are not
/// the last task, and a join fed by joins.
fn submix_patch(voices: usize) -> String {
    let mut objs = String::from(
        "#N canvas 0 0 800 600 12;\n#X obj 10 10 lop~ 3000;\n#X obj 10 10 hip~ 50;\n#X obj 10 10 dac~ 1 2;\n",
    );
    let mut wires = String::from("#X connect 0 0 2 0;\n#X connect 1 0 2 0;\n#X connect 0 0 2 1;\n");
    for v in 0..voices {
        let osc = 3 + 2 * v;
        objs += &format!(
            "#X obj 10 10 osc~ {};\n#X obj 10 10 *~ 0.05;\n",
            110 + 13 * v
        );
        wires += &format!("#X connect {osc} 0 {} 0;\n", osc + 1);
        wires += &format!("#X connect {} 0 {} 0;\n", osc + 1, v % 2);
    }
    objs + &wires
}

#[test]
fn joins_that_feed_more_work_render_what_serial_renders() {
    let d = tempfile::tempdir().expect("tmp");
    let p = patch(d.path(), "m.pd", &submix_patch(24));
    let serial = tess_pd::render::render(&p, CFG, 0.5, &mut Executor::serial()).expect("serial");
    assert!(
        serial[0].iter().any(|x| x.abs() > 0.01),
        "the patch is not silent"
    );
    // three harts for two sub-mixes: the block-start tasks are dealt unevenly, and harts steal
    for s in [Strategy::GlobalQueue, Strategy::WorkStealing] {
        for harts in [1, 2, 3] {
            let par = tess_pd::render::render(&p, CFG, 0.5, &mut Executor::new(s, harts))
                .expect("parallel");
            // partial sums add the voices in another order, and the filters carry the
            // rounding on: Pd's tolerance (1e-5), not the 1e-6 of the plain mixes above
            for (a, b) in serial.iter().zip(&par) {
                for (n, (x, y)) in a.iter().zip(b).enumerate() {
                    assert!(
                        (x - y).abs() <= 1e-5,
                        "{s:?} on {harts} harts: sample {n}: {y} vs serial {x}"
                    );
                }
            }
        }
    }
}

fn render_like_serial(p: &Path) {
    let serial = tess_pd::render::render(p, CFG, 1.0, &mut Executor::serial()).expect("serial");
    for s in [Strategy::GlobalQueue, Strategy::WorkStealing] {
        for harts in [1, 2] {
            let par = tess_pd::render::render(p, CFG, 1.0, &mut Executor::new(s, harts))
                .expect("parallel");
            assert_eq!(serial.len(), par.len());
            // The voices meet in the dac~ as per-task partial sums on many harts: the same
            // values added in another order, so equal to float rounding, not bit for bit.
            for (ch, (a, b)) in serial.iter().zip(&par).enumerate() {
                assert_eq!(a.len(), b.len());
                for (n, (x, y)) in a.iter().zip(b).enumerate() {
                    assert!(
                        (x - y).abs() <= 1e-6,
                        "{s:?} on {harts} harts: channel {ch} sample {n}: {y} vs serial {x}"
                    );
                }
            }
        }
    }
}

#[test]
fn a_patch_without_sums_renders_bit_identical_on_two_harts() {
    let d = tempfile::tempdir().expect("tmp");
    let p = patch(d.path(), "c.pd", &chain_patch(40));
    let serial = tess_pd::render::render(&p, CFG, 0.5, &mut Executor::serial()).expect("serial");
    for s in [Strategy::GlobalQueue, Strategy::WorkStealing] {
        let par = tess_pd::render::render(&p, CFG, 0.5, &mut Executor::new(s, 2)).expect("par");
        assert_eq!(serial, par, "{s:?} on 2 harts differs from serial");
    }
}
