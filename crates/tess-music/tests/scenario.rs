//! The scenario runner end to end, briefly: synthesizer, emulator and one EP process as child
//! processes on loopback. No timing is asserted; only that both ends report packages.

use std::time::Duration;
use tess_music::emulator::Pace;
use tess_music::net::Wait;
use tess_music::scenario::{
    self, EmulatorPlacement, Interference, PlainLauncher, RunEnv, ScenarioSpec, SynthPlacement,
};

#[test]
fn a_short_scenario_reports_both_ends_and_draws_its_histogram() {
    let work = tempfile::tempdir().unwrap();
    let bin_dir = std::path::Path::new(env!("CARGO_BIN_EXE_tess-migrator"))
        .parent()
        .unwrap()
        .to_path_buf();
    let env = RunEnv {
        bin_dir,
        cache_dir: work.path().join("cache"),
        work_dir: work.path().to_path_buf(),
    };
    let spec = ScenarioSpec {
        name: "T".into(),
        title: "test: unpinned, one EP process".into(),
        synth: SynthPlacement {
            harts: None,
            fifo: None,
            wait: Wait::Block,
            oscillators: 100,
            idle_spinner: false,
        },
        emulator: EmulatorPlacement {
            hart: None,
            fifo: None,
            pace: Pace::Hybrid {
                margin: Duration::from_micros(20),
            },
            response: tess_music::emulator::Response::Actual,
        },
        interference: Interference {
            videos: 0,
            ep_processes: 1,
            ep_threads: 1,
            rogue: 0,
        },
        duration: Duration::from_millis(1500),
        warmup: Duration::from_millis(300),
        gesture: None,
        netns: None,
        record: None,
        steer_receive: None,
        cell_spinner: None,
    };
    let r = scenario::run_scenario(&spec, &env, &PlainLauncher).unwrap();
    assert!(
        r.device.packages > 0 && r.device.answered > 0,
        "{:?}",
        r.device
    );
    assert_eq!(r.device_us.len() as u64, r.device.answered);
    assert!(r.host.packages > 0 && !r.host_us.is_empty());
    assert!(r.summary().mean > 0.0);
    let svg = scenario::histogram_svg(&r);
    assert!(svg.contains("deadline"));
    let table = scenario::results_table(std::slice::from_ref(&r)).render();
    assert!(table.contains("T: test"));
    let mut report = tess_bench::Report::new("music");
    scenario::add_figures(&mut report, &r);
    assert!(report.figures.contains_key("T_p999_us"));
}
