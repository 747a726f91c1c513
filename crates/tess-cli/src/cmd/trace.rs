//! `tess trace`: record which cell ran on which hart, and when reservations were throttled, as
//! a Chrome / Perfetto trace (see [`tess_observe::trace`]).

use crate::cmd::usage;
use clap::Args;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tess_observe::trace::{chrome_trace, Instance, Summary};
use tess_proto::{Body, Client, Request};

/// `tess trace` arguments.
#[derive(Args, Debug)]
#[command(
    after_help = "Open the file in ui.perfetto.dev (Open trace file) or chrome://tracing. \
Each cell is a process with a track per thread (one slice per time it ran); the process \
'harts' shows which cell held each hart; 'throttled' marks a SCHED_DEADLINE thread switched out \
while still runnable (budget exhausted, or an earlier deadline). Runtimes that publish their \
events (the synthesizer, tess-pd play, Pulse EDF jobs, gang windows, the network service, the \
broker) add a span per event on the thread that recorded it, spanning its response time, and \
'missed' where it missed its deadline.\n\n\
Needs root (tracefs). Examples:\n  tess trace --seconds 5 --out trace.json\n  tess trace --seconds 2 --out - --json | jq .summary"
)]
pub struct TraceArgs {
    /// How long to record (0.1 to 600 seconds).
    #[arg(long, default_value_t = 5.0, value_name = "SECONDS")]
    pub seconds: f64,
    /// Where to write the trace JSON.
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
    /// Ring buffer per hart, KiB (raise it if the summary says events were lost).
    #[arg(long, default_value_t = 16384, value_name = "KIB")]
    pub buffer_kb: usize,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Every thread tessd reports in a cell, by thread id.
fn threads_by_cell(client: &mut Client) -> anyhow::Result<HashMap<i32, String>> {
    let Body::Cells { cells } = client.call(&Request::ListCells)? else {
        anyhow::bail!("tessd answered list-cells with something else");
    };
    Ok(cells
        .into_iter()
        .flat_map(|c| {
            let name = c.name.clone();
            c.threads.into_iter().map(move |t| (t.tid, name.clone()))
        })
        .collect())
}

/// Records `length` in a tracefs instance with `buffer_kb` per hart, maps threads to cells with
/// tessd (before and after, so threads started meanwhile count), and writes the Chrome trace to
/// `out` (what `tess trace` and `tess bench music --trace` do).
pub(crate) fn record_to(length: Duration, buffer_kb: usize, out: &Path) -> anyhow::Result<Summary> {
    let mut client = Client::connect_default()?;
    let mut cells = threads_by_cell(&mut client)?;
    let inst = Instance::create(buffer_kb)?;
    let records = inst.record(length)?;
    drop(inst);
    cells.extend(threads_by_cell(&mut client)?);
    let (trace, summary) = chrome_trace(&records, &cells);
    std::fs::write(out, serde_json::to_string(&trace)?)
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", out.display()))?;
    Ok(summary)
}

/// Runs `tess trace`.
pub fn run(a: TraceArgs) -> anyhow::Result<i32> {
    if !(0.1..=600.0).contains(&a.seconds) {
        return usage(format!("--seconds {} is outside 0.1-600", a.seconds));
    }
    let summary = record_to(Duration::from_secs_f64(a.seconds), a.buffer_kb, &a.out)?;
    if a.json {
        crate::output::json(&serde_json::json!({"out": a.out, "summary": summary}));
    } else {
        println!(
            "{} context switches in {:.1} s; {} run slices of cell threads, {} throttles; {} runtime events, {} missed; wrote {}",
            summary.switches,
            a.seconds,
            summary.cell_slices,
            summary.throttles,
            summary.runtime_events,
            summary.runtime_misses,
            a.out.display()
        );
        let mut t = tess_bench::Table::new("", &["CELL", "SLICES", "CPU s", "THROTTLES"]);
        for (name, c) in &summary.cells {
            t.row(&[
                name.clone(),
                c.slices.to_string(),
                format!("{:.3}", c.cpu_s),
                c.throttles.to_string(),
            ]);
        }
        print!("{}", t.render());
    }
    Ok(0)
}
