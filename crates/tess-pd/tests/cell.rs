//! The engine on a tess runtime's harts (`tess_pd::cell`), standalone: the runtime shrinks and
//! grows under a rendering patch as tessd would resize its cell, the executor splits the graph
//! again for the harts it has, and the output stays what the serial order renders.

use std::path::Path;
use tess_pd::bench::voices_patch;
use tess_pd::engine::{Config, Engine};
use tess_pd::sched::{Executor, Strategy};

const CFG: Config = Config {
    sample_rate: 48000.0,
    block: 64,
};

/// Renders `blocks` blocks, asking the runtime for `resizes` (block, harts) on the way;
/// returns the output and the executor's harts at each block.
fn render_resized(
    p: &Path,
    blocks: usize,
    resizes: &'static [(usize, usize)],
    exec: &mut Executor,
) -> (Vec<Vec<f32>>, Vec<usize>) {
    let mut e = Engine::open(p, CFG).expect("open");
    let mut out = vec![Vec::new(); e.channels()];
    let mut harts = Vec::new();
    let mut buf = vec![0.0f32; CFG.block];
    for b in 0..blocks {
        if let Some(&(_, n)) = resizes.iter().find(|(at, _)| *at == b) {
            let rt = exec.runtime().expect("on a runtime");
            assert!(rt.resize(n), "a standalone runtime resizes");
        }
        e.tick(exec);
        harts.push(exec.harts());
        for (c, o) in out.iter_mut().enumerate() {
            e.read_output(c, &mut buf);
            o.extend_from_slice(&buf);
        }
    }
    (out, harts)
}

#[test]
fn the_engine_follows_its_harts_and_renders_what_serial_renders() {
    let d = tempfile::tempdir().expect("tmp");
    let p = d.path().join("v.pd");
    std::fs::write(&p, voices_patch(16)).expect("write");
    const BLOCKS: usize = 1500;
    const RESIZES: &[(usize, usize)] = &[(300, 1), (800, 3)];
    let (serial, _) = {
        let mut e = Engine::open(&p, CFG).expect("open");
        let mut out = vec![Vec::new(); e.channels()];
        let mut buf = vec![0.0f32; CFG.block];
        let mut exec = Executor::serial();
        for _ in 0..BLOCKS {
            e.tick(&mut exec);
            for (c, o) in out.iter_mut().enumerate() {
                e.read_output(c, &mut buf);
                o.extend_from_slice(&buf);
            }
        }
        (out, ())
    };
    for strategy in [Strategy::WorkStealing, Strategy::GlobalQueue] {
        let p2 = p.clone();
        let (par, harts) = tess_pd::cell::run_on_harts(
            tess_runtime::Runtime::builder().standalone(2, None),
            strategy,
            move |exec| render_resized(&p2, BLOCKS, RESIZES, exec),
        )
        .expect("the runtime ran");
        // It started on 2, went to 1 after the shrink, and to 3 after the growth.
        assert_eq!(harts[0], 2, "{strategy:?}");
        let after = |b: usize| &harts[b..];
        assert!(
            after(300).contains(&1),
            "{strategy:?}: never split for 1 hart after the shrink: {:?}",
            &harts[290..320]
        );
        assert_eq!(
            harts.last(),
            Some(&3),
            "{strategy:?}: not on 3 harts at the end"
        );
        for (ch, (a, b)) in serial.iter().zip(&par).enumerate() {
            for (n, (x, y)) in a.iter().zip(b).enumerate() {
                assert!(
                    (x - y).abs() <= 1e-6,
                    "{strategy:?}: channel {ch} sample {n} (block {}, on {} harts): {y} vs serial {x}",
                    n / CFG.block,
                    harts[n / CFG.block]
                );
            }
        }
    }
}
