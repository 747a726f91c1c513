//! `tess~conv`: the left channel is the right channel convolved with the array's response,
//! sample for sample (to float rounding), serially and on 2 harts.

use std::fmt::Write;
use tess_pd::engine::Config;
use tess_pd::sched::{Executor, Strategy};

const CFG: Config = Config {
    sample_rate: 44100.0,
    block: 64,
};

/// A patch: `noise~` into `dac~ 2` directly and through `tess~conv ir` into `dac~ 1`; the
/// response is a graph array saved in the patch (`#A`).
fn patch(ir: &[f32]) -> String {
    let mut p = String::from("#N canvas 0 0 450 300 12;\n");
    p += "#X obj 10 10 noise~;\n"; // 0
    p += "#X obj 10 50 tess~conv ir;\n"; // 1
    p += "#X obj 10 90 dac~ 1 2;\n"; // 2
    p += "#N canvas 0 0 450 300 (subpatch) 0;\n";
    writeln!(p, "#X array ir {} float 2;", ir.len()).unwrap();
    p += "#A 0";
    for v in ir {
        write!(p, " {v}").unwrap();
    }
    p += ";\n#X coords 0 1 4 -1 200 140 1;\n#X restore 200 20 graph;\n"; // 3
    p += "#X connect 0 0 1 0;\n#X connect 1 0 2 0;\n#X connect 0 0 2 1;\n";
    p
}

fn check(ir: &[f32], exec: &mut Executor) {
    let d = tempfile::tempdir().expect("tmp");
    let path = d.path().join("conv.pd");
    std::fs::write(&path, patch(ir)).expect("write");
    let out = tess_pd::render::render(&path, CFG, 0.2, exec).expect("render");
    let (wet, dry) = (&out[0], &out[1]);
    for n in 0..wet.len() {
        let want: f64 = (n.saturating_sub(ir.len() - 1)..=n)
            .map(|m| f64::from(dry[m]) * f64::from(ir[n - m]))
            .sum();
        assert!(
            (f64::from(wet[n]) - want).abs() < 1e-4,
            "sample {n}: {} vs {want}",
            wet[n]
        );
    }
}

fn response(len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 37 % 101) as f32 / 101.0 - 0.5) * (-(i as f32) / 600.0).exp())
        .collect()
}

#[test]
fn tess_conv_convolves_with_the_array_serially() {
    for len in [1, 63, 64, 1000, 3000] {
        check(&response(len), &mut Executor::serial());
    }
}

#[test]
fn tess_conv_convolves_with_the_array_on_two_harts() {
    let mut exec = Executor::new(Strategy::WorkStealing, 2);
    check(&response(3000), &mut exec);
}

#[test]
fn tess_conv_without_its_array_is_silent() {
    let d = tempfile::tempdir().expect("tmp");
    let path = d.path().join("conv.pd");
    let text = "#N canvas 0 0 450 300 12;\n#X obj 10 10 noise~;\n#X obj 10 50 tess~conv nosuch;\n#X obj 10 90 dac~ 1;\n#X connect 0 0 1 0;\n#X connect 1 0 2 0;\n";
    std::fs::write(&path, text).expect("write");
    let out = tess_pd::render::render(&path, CFG, 0.05, &mut Executor::serial()).expect("render");
    assert!(out[0].iter().all(|v| *v == 0.0));
}

/// The plan `tess~conv` makes for a `len`-sample response at 64-sample blocks, for `objective`.
fn object_plan(len: usize, objective: tess_conv::Objective) -> tess_conv::Plan {
    tess_conv::Plan::optimal(64, len, 65_536, &tess_conv::CostModel::default(), objective)
        .expect("plan")
}

/// The patch of `ir` in a temporary folder (kept while the first value lives), its path, and
/// 1 s of it rendered serially with the synchronous long levels.
fn patch_and_sync_render(ir: &[f32]) -> (tempfile::TempDir, std::path::PathBuf, Vec<Vec<f32>>) {
    let d = tempfile::tempdir().expect("tmp");
    let path = d.path().join("conv.pd");
    std::fs::write(&path, patch(ir)).expect("write");
    let sync = tess_pd::render::render(&path, CFG, 1.0, &mut Executor::serial()).expect("sync");
    (d, path, sync)
}

/// 1 s of the patch at `path` with `options`, serially and with work stealing on 2 harts;
/// neither is silent.
fn render_serially_and_on_2_harts(
    path: &std::path::Path,
    options: &tess_pd::engine::EngineOptions,
) -> [Vec<Vec<f32>>; 2] {
    [Executor::serial(), Executor::new(Strategy::WorkStealing, 2)].map(|mut exec| {
        let out = tess_pd::render::render_with(path, CFG, 1.0, &mut exec, options).expect("render");
        assert!(out[0].iter().any(|&v| v != 0.0), "silent");
        out
    })
}

/// Preemptive workers (ordinary threads here, told to wait for late steps so the output is
/// exact): the same samples as the synchronous mode, bit for bit (the same steps, run on
/// another thread), serially and on 2 harts, with a response long enough for several levels.
#[test]
fn tess_conv_on_preemptive_workers_renders_what_the_synchronous_mode_renders() {
    let ir = response(20_000);
    // the object's plan (its defaults) has long levels for the workers to run
    let plan = object_plan(ir.len(), tess_conv::Objective::MeanLoad);
    assert!(plan.levels.len() > 2, "{plan}");
    let (_d, path, sync) = patch_and_sync_render(&ir);
    let workers = tess_pd::shared::ConvWorkers {
        pool: std::sync::Arc::new(
            tess_conv::Pool::new(tess_conv::PoolOptions {
                hart: None,
                top_priority: None,
                levels: tess_pd::engine::CONV_LEVELS,
            })
            .expect("pool"),
        ),
        when_late: tess_conv::WhenLate::Wait,
    };
    let options = tess_pd::engine::EngineOptions {
        long_levels: tess_pd::shared::LongLevels::Preemptive(workers),
    };
    for pre in render_serially_and_on_2_harts(&path, &options) {
        assert_eq!(pre, sync);
    }
}

/// Long levels in the background (each step run in pieces between blocks, by the render loop
/// and, on 2 harts, by the worker hart while it waits; a step not done when due would be
/// silence): the same samples as the synchronous mode, bit for bit (the same plan and the same
/// steps), so no step was late.
#[test]
fn tess_conv_in_the_background_renders_what_the_synchronous_mode_renders() {
    let ir = response(20_000);
    let (_d, path, sync) = patch_and_sync_render(&ir);
    let options = tess_pd::engine::EngineOptions {
        long_levels: tess_pd::shared::LongLevels::Background,
    };
    let e = tess_pd::engine::Engine::open_with(&path, CFG, &options).expect("open");
    assert!(
        !e.graph().background.is_empty(),
        "the long levels are background work"
    );
    for bg in render_serially_and_on_2_harts(&path, &options) {
        assert_eq!(bg, sync);
    }
}

/// Time-distributed long levels (the steps cut into sub-tasks over their period's blocks, in
/// the engine's own blocks): the same samples as the synchronous mode, serially and on 2
/// harts. Its plan differs (partitions for the heaviest block), so equal to float rounding.
#[test]
fn tess_conv_time_distributed_renders_what_the_synchronous_mode_renders() {
    let ir = response(20_000);
    let plan = object_plan(ir.len(), tess_conv::Objective::WorstCallback);
    assert!(plan.levels.len() > 1, "a long level to distribute: {plan}");
    let (_d, path, sync) = patch_and_sync_render(&ir);
    let options = tess_pd::engine::EngineOptions {
        long_levels: tess_pd::shared::LongLevels::TimeDistributed,
    };
    let renders = render_serially_and_on_2_harts(&path, &options);
    for td in &renders {
        // Another plan, so other rounding: bit-identical output would mean the synchronous
        // mode's plan ran.
        assert_ne!(td, &sync, "the time-distributed plan was not used");
        for (n, (x, y)) in sync[0].iter().zip(&td[0]).enumerate() {
            assert!((x - y).abs() <= 1e-5, "sample {n}: {y} vs synchronous {x}");
        }
    }
    // Each level's sub-tasks run in the same order wherever they run.
    assert_eq!(renders[0], renders[1], "serial and 2 harts differ");
}

/// Time-distributed, `tess~conv` is a parallel plug-in (seed 001 section 2.2): each long level
/// is a node of the graph of its own, before the object and its predecessor, with nothing
/// before it; on 2 harts each is a task apart from the object's, so the scheduler runs the
/// long levels on either hart alongside the rest of the graph.
#[test]
fn time_distributed_long_levels_are_tasks_of_the_engines_scheduler() {
    let ir = response(20_000);
    let long = object_plan(ir.len(), tess_conv::Objective::WorstCallback)
        .levels
        .len()
        - 1;
    assert!(long >= 1, "a long level");
    let (_d, path, _) = patch_and_sync_render(&ir);
    let options = tess_pd::engine::EngineOptions {
        long_levels: tess_pd::shared::LongLevels::TimeDistributed,
    };
    let plain = tess_pd::engine::Engine::open(&path, CFG).expect("open");
    let td = tess_pd::engine::Engine::open_with(&path, CFG, &options).expect("open");
    let g = td.graph();
    assert_eq!(g.nodes.len(), plain.graph().nodes.len() + long);
    let parts: Vec<usize> = (0..g.nodes.len())
        .filter(|&k| g.nodes[k].part_of.is_some())
        .collect();
    assert_eq!(parts.len(), long, "one part per long level");
    let owner = g.nodes[parts[0]].part_of.expect("a part");
    for &p in &parts {
        assert!(p < owner && g.nodes[p].preds.is_empty());
        assert_eq!(g.nodes[p].succs, [owner]);
        assert!(g.nodes[owner].preds.contains(&p));
    }
    let tasks = tess_pd::sched::TaskGraph::from_graph(g, 2);
    let task_of = |n: usize| {
        tasks
            .tasks
            .iter()
            .position(|t| t.contains(&n))
            .expect("task")
    };
    for &p in &parts {
        assert_ne!(
            task_of(p),
            task_of(owner),
            "a part merged into its object's task"
        );
    }
}
