//! `tess run`: start an unmodified program inside a cell.
//!
//! The command asks tessd to move *this* process into the cell (tessd identifies it by
//! `SO_PEERCRED`, so no one can move someone else's process), then replaces itself with the
//! program (`execvp`). Every thread and child the program creates starts in the cell. With
//! `--reserve BUDGET/PERIOD` the cell is a fresh event-triggered one that tessd removes when the
//! program and all its children have exited: the `qres_wrap` of AQuoSA.
//!
//! The reservation belongs to the program, like `qres_wrap`'s: tessd divides the budget between
//! the threads that work (idle ones keep a small standby slice) and re-divides it as threads
//! start and stop working (docs/architecture.md, "Reservations belong to cells").

use super::usage;
use clap::Args;
use std::os::unix::process::CommandExt;
use tess_core::spec::HartRequest;
use tess_proto::{Body, Client, Request};

/// Run a program in a cell.
#[derive(Args, Debug)]
#[command(
    after_help = "A --reserve BUDGET/PERIOD reservation gives the program BUDGET of CPU time every PERIOD on\neach of its harts, whichever of its threads needs it, like qres_wrap: tessd divides the budget\nbetween the threads that are working (SCHED_DEADLINE), gives sleeping threads a small standby\nslice, and re-divides it within about 20 ms when a thread starts or stops working, so a\nwrapper like `timeout` or an idle helper thread costs the worker almost nothing\n(docs/architecture.md, \"Reservations belong to cells\").\n\nExamples:\n  tess run --cell synth -- ./synthesizer --fast\n  tess run --reserve 2ms/10ms -- ./control-loop     (like qres_wrap)\n  tess run --reserve 5ms/20ms --harts 2 -- make -j2"
)]
pub struct RunArgs {
    /// Existing cell to run in.
    #[arg(
        long,
        value_name = "NAME",
        conflicts_with = "reserve",
        required_unless_present = "reserve"
    )]
    pub cell: Option<String>,
    /// Run in a new event-triggered reservation BUDGET/PERIOD, removed when the program exits.
    #[arg(long, value_name = "BUDGET/PERIOD")]
    pub reserve: Option<String>,
    /// Harts for --reserve (default 1); the budget is per hart.
    #[arg(
        long,
        value_name = "N",
        requires = "reserve",
        conflicts_with = "hart_ids"
    )]
    pub harts: Option<usize>,
    /// Exactly these harts for --reserve (e.g. 1 or 2-3).
    #[arg(long, value_name = "LIST", requires = "reserve")]
    pub hart_ids: Option<tess_sched::HartSet>,
    /// Print the cell the program runs in on standard error.
    #[arg(long, short)]
    pub verbose: bool,
    /// Send the program's standard output and error, line by line, to the console service
    /// (read them with `tess logs CELL`); a small adapter process in the cell forwards them and
    /// drops lines rather than ever blocking the program. Needs `tess-console` running.
    #[arg(long)]
    pub console: bool,
    /// Give an unmodified program a heartbeat: pass this command's standard input to the
    /// program through a pipe that holds one frame and beat once per FRAME_BYTES bytes passed
    /// (e.g. 221184 for 512x288 raw yuv420p frames; the count is at most one frame ahead of
    /// what the program has read). See docs/broker.md.
    #[arg(long, value_name = "FRAME_BYTES", conflicts_with = "console")]
    pub heartbeat_pipe: Option<u64>,
    /// With --heartbeat-pipe: the heartbeat's name (default: the cell's name).
    #[arg(long, value_name = "NAME", requires = "heartbeat_pipe")]
    pub heartbeat_name: Option<String>,
    /// With --heartbeat-pipe: the performance target, a rate (`30/s`) or a time per frame
    /// (`33ms`).
    #[arg(long, value_name = "TARGET", requires = "heartbeat_pipe")]
    pub heartbeat_target: Option<String>,
    /// The program and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// Runs `tess run`; on success does not return (the process becomes the program).
pub fn run(a: RunArgs) -> anyhow::Result<i32> {
    let req = match (&a.cell, &a.reserve) {
        (Some(cell), None) => Request::Attach { cell: cell.clone() },
        (None, Some(r)) => match tess_core::units::parse_reservation(r) {
            Ok((budget, period)) => Request::Reserve {
                budget,
                period,
                harts: match &a.hart_ids {
                    Some(ids) => Some(HartRequest::Ids(ids.clone())),
                    None => a.harts.map(HartRequest::Count),
                },
            },
            Err(e) => return usage(format!("--reserve: {e}")),
        },
        _ => return usage("give --cell NAME or --reserve BUDGET/PERIOD"),
    };
    let body = {
        let mut c = Client::connect_default()?;
        let body = c.call(&req)?;
        // The kernel makes a thread a deadline thread only from a runqueue of its own hart, and a
        // task should join its cell's cpu group only from there too (tessd docs). This process
        // has just woken on the cell's hart (on the reply), so a second attach completes both.
        let cell = match &body {
            Body::Cell(c) => Some(c.name.clone()),
            Body::Applied(r) => r.cells.first().map(|c| c.name.clone()),
            _ => None,
        };
        if let Some(cell) = cell {
            c.call(&Request::Attach { cell })?;
        }
        body
    };
    if a.verbose {
        let name = match &body {
            Body::Cell(c) => format!("{} ({}, harts {})", c.name, c.policy.describe(), c.harts),
            Body::Applied(r) => r
                .cells
                .first()
                .map(|c| format!("{} ({}, harts {})", c.name, c.policy.describe(), c.harts))
                .unwrap_or_default(),
            _ => String::new(),
        };
        eprintln!("tess: running {} in cell {name}", a.command[0]);
    }
    if a.console {
        return run_with_console(&a.command);
    }
    if let Some(frame_bytes) = a.heartbeat_pipe {
        let cell = match &body {
            Body::Cell(c) => c.name.clone(),
            Body::Applied(r) => r.cells.first().map(|c| c.name.clone()).unwrap_or_default(),
            _ => String::new(),
        };
        let target = match a
            .heartbeat_target
            .as_deref()
            .map(super::heartbeat_pipe::parse_target)
        {
            None => None,
            Some(Ok(t)) => Some(t),
            Some(Err(e)) => return usage(format!("--heartbeat-target: {e}")),
        };
        let name = a.heartbeat_name.clone().unwrap_or(cell);
        return super::heartbeat_pipe::run(&a.command, frame_bytes, &name, target);
    }
    let err = std::process::Command::new(&a.command[0])
        .args(&a.command[1..])
        .exec();
    eprintln!("tess: cannot run {}: {err}", a.command[0]);
    Ok(if err.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    })
}

/// Runs the program with its output piped into the console service; returns its exit status.
fn run_with_console(command: &[String]) -> anyhow::Result<i32> {
    use std::io::BufRead;
    let mut console = tess_console::Console::connect().map_err(|e| {
        anyhow::anyhow!(
            "{e} (is the console service running? `tess run --cell console -- tess-console &`)"
        )
    })?;
    let (reader, writer) = std::io::pipe()?;
    let mut child = match std::process::Command::new(&command[0])
        .args(&command[1..])
        .stdout(writer.try_clone()?)
        .stderr(writer)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("tess: cannot run {}: {e}", command[0]);
            return Ok(if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            });
        }
    };
    for line in std::io::BufReader::new(reader).lines() {
        match line {
            Ok(l) => {
                console.log(&l);
            }
            Err(_) => break,
        }
    }
    let status = child.wait()?;
    if console.dropped() > 0 {
        eprintln!(
            "tess: {} line(s) of output were dropped: the console service was behind",
            console.dropped()
        );
    }
    use std::os::unix::process::ExitStatusExt;
    Ok(status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)))
}
