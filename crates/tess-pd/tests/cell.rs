//! The engine on a tess runtime's harts (`tess_pd::cell`), standalone: the runtime shrinks and
//! grows under a rendering patch as tessd would resize its cell, the executor splits the graph
//! again for the harts it has, and the output stays what the serial order renders.

use std::path::Path;
use std::time::{Duration, Instant};
use tess_pd::bench::voices_patch;
use tess_pd::engine::{Config, Engine};
use tess_pd::sched::{Executor, Strategy};

const CFG: Config = Config {
    sample_rate: 48000.0,
    block: 64,
};

/// What the program on vhart 0 saw.
struct Seen {
    out: Vec<Vec<f32>>,
    /// The executor's harts at each block.
    harts: Vec<usize>,
    /// Tasks each hart ran in the last split.
    tasks_per_hart: Vec<u64>,
    /// The runtime's acknowledged adaptations, `(seq, vharts)`.
    acks: Vec<(u64, usize)>,
}

/// Renders 200 blocks on 2 harts, asks for 1 and renders until the executor has split the
/// graph for 1 (then 200 blocks more), asks for 3 and renders until it has split for 3 (then
/// 300 blocks more).
fn render_resized(p: &Path, exec: &mut Executor) -> Seen {
    let mut e = Engine::open(p, CFG).expect("open");
    let rt = exec.runtime().expect("on a runtime");
    let mut seen = Seen {
        out: vec![Vec::new(); e.channels()],
        harts: Vec::new(),
        tasks_per_hart: Vec::new(),
        acks: Vec::new(),
    };
    let mut buf = vec![0.0f32; CFG.block];
    let mut block = |e: &mut Engine, exec: &mut Executor, seen: &mut Seen| {
        e.tick(exec);
        seen.harts.push(exec.harts());
        for (c, o) in seen.out.iter_mut().enumerate() {
            e.read_output(c, &mut buf);
            o.extend_from_slice(&buf);
        }
    };
    for _ in 0..200 {
        block(&mut e, exec, &mut seen);
    }
    for (n, after) in [(1, 200), (3, 300)] {
        assert!(rt.resize(n), "a standalone runtime resizes");
        let t0 = Instant::now();
        while exec.harts() != n {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "the executor did not follow the runtime to {n} harts"
            );
            block(&mut e, exec, &mut seen);
        }
        for _ in 0..after {
            block(&mut e, exec, &mut seen);
        }
    }
    seen.tasks_per_hart = exec.tasks_per_hart();
    seen.acks = rt.acknowledged();
    seen
}

fn serial(p: &Path, blocks: usize) -> Vec<Vec<f32>> {
    let mut e = Engine::open(p, CFG).expect("open");
    let mut out = vec![Vec::new(); e.channels()];
    let mut buf = vec![0.0f32; CFG.block];
    let mut exec = Executor::serial();
    for _ in 0..blocks {
        e.tick(&mut exec);
        for (c, o) in out.iter_mut().enumerate() {
            e.read_output(c, &mut buf);
            o.extend_from_slice(&buf);
        }
    }
    out
}

#[test]
fn the_engine_follows_its_harts_and_renders_what_serial_renders() {
    let d = tempfile::tempdir().expect("tmp");
    let p = d.path().join("v.pd");
    std::fs::write(&p, voices_patch(16)).expect("write");
    for strategy in [Strategy::WorkStealing, Strategy::GlobalQueue] {
        let p2 = p.clone();
        let seen = tess_pd::cell::run_on_harts(
            tess_runtime::Runtime::builder().standalone(2, None),
            strategy,
            move |exec| render_resized(&p2, exec),
        )
        .expect("the runtime ran");
        assert_eq!(seen.harts[0], 2, "{strategy:?}");
        // Both adaptations completed, and the last split is the graph dealt to 3 harts, on
        // which the workers ran tasks (not only hart 0 taking their shares over).
        let vharts: Vec<usize> = seen.acks.iter().map(|a| a.1).collect();
        assert_eq!(vharts, [1, 3], "{strategy:?}");
        assert_eq!(seen.tasks_per_hart.len(), 3, "{strategy:?}");
        assert!(
            seen.tasks_per_hart[1..].iter().sum::<u64>() > 0,
            "{strategy:?}: the new split's workers ran nothing: {:?}",
            seen.tasks_per_hart
        );
        let expect = serial(&p, seen.harts.len());
        for (ch, (a, b)) in expect.iter().zip(&seen.out).enumerate() {
            assert_eq!(a.len(), b.len());
            for (n, (x, y)) in a.iter().zip(b).enumerate() {
                assert!(
                    (x - y).abs() <= 1e-6,
                    "{strategy:?}: channel {ch} sample {n} (block {}, on {} harts): {y} vs serial {x}",
                    n / CFG.block,
                    seen.harts[n / CFG.block]
                );
            }
        }
    }
}

#[test]
fn a_panic_of_the_program_stops_the_harts_and_comes_back() {
    let r = std::panic::catch_unwind(|| {
        tess_pd::cell::run_on_harts(
            tess_runtime::Runtime::builder().standalone(2, None),
            Strategy::WorkStealing,
            |_exec| -> () { panic!("the program failed") },
        )
    });
    let panic = r.expect_err("the panic comes back to the caller");
    assert_eq!(panic.downcast_ref::<&str>(), Some(&"the program failed"));
}
