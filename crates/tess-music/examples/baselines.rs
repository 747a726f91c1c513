//! Runs the plain-Linux baselines C and D (and, with `--alone`, the same placement as D without
//! interference) and prints the side-by-side table; writes the histograms and reports to a
//! directory.
//!
//! ```text
//! cargo run --release -p tess-music --example baselines -- [SECONDS] [OUT_DIR] [--alone] [--netns] [--only=C]
//! ```

use std::time::Duration;
use tess_music::scenario::{self, Interference, PlainLauncher, RunEnv};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let secs: f64 = args.iter().find_map(|a| a.parse().ok()).unwrap_or(10.0);
    let out = args
        .iter()
        .filter(|a| !a.starts_with("--") && a.parse::<f64>().is_err())
        .map(std::path::PathBuf::from)
        .next()
        .unwrap_or_else(|| std::env::temp_dir().join("tess-music"));
    let d = Duration::from_secs_f64(secs);
    let mut specs = Vec::new();
    if args.iter().any(|a| a == "--alone") {
        let mut alone = scenario::baseline_d(d);
        alone.name = "D0".into();
        alone.title = "plain Linux: SCHED_FIFO 99 on hart 1, alone".into();
        alone.interference = Interference::NONE;
        specs.push(alone);
    }
    specs.push(scenario::baseline_c(d));
    specs.push(scenario::baseline_d(d));
    if args.iter().any(|a| a == "--netns") {
        for s in &mut specs {
            s.netns = Some("tess-slabs".into());
        }
    }
    if let Some(only) = args.iter().find_map(|a| a.strip_prefix("--only=")) {
        specs.retain(|s| s.name == only);
    }
    let env = RunEnv::beside_current_exe(&out)?;
    let mut results = Vec::new();
    let mut report = tess_bench::Report::new("music (baselines)");
    for s in &specs {
        eprintln!("running {}: {} for {secs} s", s.name, s.title);
        let r = scenario::run_scenario(s, &env, &PlainLauncher)?;
        let svg = scenario::write_histogram(&r, &out)?;
        eprintln!("  histogram: {}", svg.display());
        scenario::add_figures(&mut report, &r);
        report.detail(&s.name, &r);
        results.push(r);
    }
    report.table(scenario::results_table(&results));
    print!("{}", report.render_text());
    std::fs::write(out.join("music-baselines.json"), report.render_json())?;
    Ok(())
}
