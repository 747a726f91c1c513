//! `tess bench record`: the benchmark record (`docs/benchmarks.md`) generated from one run set.
//!
//! `scripts/bench-all` first stamps the run set (`tess bench record --stamp DIR ...`: the
//! command, commit, date and machine, written to `DIR/meta.json` before any bench runs), then
//! runs every bench N times, saving each run's `tess bench NAME --json` as `DIR/NAME-REP.json`,
//! its stderr as `DIR/NAME-REP.log` and its exit status as `DIR/NAME-REP.status`, and finally
//! renders the page with `tess bench record DIR --narrative docs/bench-narrative`.
//!
//! No number on the page comes from anywhere but those files. Per bench it shows the narrative
//! (`docs/bench-narrative/NAME.md`, kept by hand: method, harts, why; no numbers), the
//! side-by-side rows of the reports' `comparisons` as `median (min–max)` over the repetitions,
//! every figure's median, min and max (and in how many runs it appeared), each target with the
//! number of runs that met it, and the notes of the median run. A failed or missing run is
//! listed as such, never dropped.

mod machine;
mod render;
mod runset;

use machine::{Machine, Meta};
use render::{render, Narrative};
use runset::RunSet;

use anyhow::Context as _;
use clap::Args;
use std::path::PathBuf;

/// `tess bench record`.
#[derive(Args, Debug)]
pub struct RecordArgs {
    /// Directory of one run set (`NAME-REP.json`, `.log`, `.status`, `meta.json`).
    #[arg(value_name = "DIR")]
    dir: PathBuf,
    /// Directory of the hand-kept narrative, one `NAME.md` per bench.
    #[arg(long, value_name = "DIR", default_value = "docs/bench-narrative")]
    narrative: PathBuf,
    /// Instead of rendering: write DIR/meta.json (commit, date, machine) for a run set about
    /// to start.
    #[arg(long)]
    stamp: bool,
    /// With --stamp: the command that makes the run set, as the page should quote it.
    #[arg(long, value_name = "CMD", requires = "stamp")]
    command: Option<String>,
    /// With --stamp: the benches the run set will run, comma-separated.
    #[arg(long, value_name = "A,B", requires = "stamp", value_delimiter = ',')]
    benches: Vec<String>,
    /// With --stamp: repetitions per bench.
    #[arg(long, value_name = "N", requires = "stamp", default_value_t = 3)]
    reps: u32,
    /// With --stamp: benches that run once instead of --reps times, comma-separated.
    #[arg(long, value_name = "A,B", requires = "stamp", value_delimiter = ',')]
    once: Vec<String>,
    /// With --stamp: the benches run with --quick (a smoke run, not a measurement).
    #[arg(long, requires = "stamp")]
    quick: bool,
}

/// Runs `tess bench record`.
pub fn run(a: &RecordArgs) -> anyhow::Result<()> {
    if a.stamp {
        let meta = Meta {
            command: a
                .command
                .clone()
                .unwrap_or_else(|| "scripts/bench-all".into()),
            commit: machine::git_commit(),
            date_utc: machine::date_utc(),
            machine: Machine::probe(),
            benches: a.benches.clone(),
            reps: a.reps,
            once: a.once.clone(),
            quick: a.quick,
        };
        std::fs::create_dir_all(&a.dir).with_context(|| format!("creating {}", a.dir.display()))?;
        let p = a.dir.join("meta.json");
        std::fs::write(&p, serde_json::to_string_pretty(&meta)?)
            .with_context(|| format!("writing {}", p.display()))?;
        return Ok(());
    }
    let set = RunSet::load(&a.dir)?;
    print!("{}", render(&set, &Narrative::Dir(a.narrative.clone())));
    Ok(())
}

#[cfg(test)]
mod tests;
