//! `tess`: the command-line interface to tessd.

mod bench;
mod broker;
mod cmd;
mod net;
mod net_fetch;
mod net_stream;
mod output;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// tess: guaranteed harts, CPU time, memory and task limits for real-time and interactive
/// software, in cells.
///
/// A cell is a named, performance-isolated container with harts (hardware threads) under one
/// of four policies: dedicated (the harts are its alone), time-triggered (a periodic window on
/// all its harts), event-triggered (a CPU budget per period on each hart) or best-effort.
/// Requests that cannot be guaranteed are refused (exit status 3) with the resource, hart and
/// amount that is short.
///
/// Exit status: 0 success, 1 other failure, 2 usage, 3 admission refused, 4 permission denied,
/// 5 no such cell, 6 name taken, 7 tessd unreachable, 8 the kernel refused (rolled back).
#[derive(Parser, Debug)]
#[command(
    name = "tess",
    version,
    propagate_version = true,
    after_help = "Examples:\n  tess cell create synth --policy dedicated --hart-ids 1 --memory 512M\n  tess cell create video --policy time-triggered --period 33ms --active 4ms\n  tess run --cell synth -- ./synthesizer --fast\n  tess run --reserve 2ms/10ms -- ./control-loop\n  tess apply cells.toml\n  tess bench mux --json"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create, inspect, change and delete cells.
    #[command(subcommand)]
    Cell(cmd::cell::CellCmd),
    /// Apply a manifest of cells as one transaction (all or nothing).
    Apply(cmd::apply::ApplyArgs),
    /// Run a program inside a cell, or inside a fresh reservation removed when it exits.
    Run(cmd::run::RunArgs),
    /// Show the daemon, the harts and their load.
    Status(cmd::status::StatusArgs),
    /// Watch cells keep their guarantees live: CPU granted vs used, waits, preemption and
    /// throttling per cell, busy and admission headroom per hart (`--once --json` for scripts).
    Top(cmd::top::TopArgs),
    /// Record which cell ran on which hart, throttling, and runtimes' events and misses, as a
    /// Chrome / Perfetto trace.
    Trace(cmd::trace::TraceArgs),
    /// Serve a live, read-only dashboard of cells and harts on localhost.
    Web(cmd::web::WebArgs),
    /// Per-user quotas (root sets them; users see their own).
    #[command(subcommand)]
    Quota(cmd::quota::QuotaCmd),
    /// Show a cell's log lines written by the console service (`tess-console`).
    Logs(cmd::logs::LogsArgs),
    /// The nameserver: services registered with tessd.
    #[command(subcommand)]
    Ns(cmd::ns::NsCmd),
    /// The network service: flows, reservations and achieved rates.
    #[command(subcommand)]
    Net(net::NetCmd),
    /// The Resource Allocation Broker (tess-broker): targets, rates, shares and decisions.
    #[command(subcommand)]
    Broker(broker::BrokerCmd),
    /// Run a benchmark and print its figures (table, or one JSON object with --json); list the
    /// benchmarks; write the benchmark record (docs/benchmarks.md) from a run set.
    Bench(bench::BenchArgs),
    /// Internal workloads used by the benchmarks.
    #[command(hide = true, subcommand)]
    Work(bench::work::WorkCmd),
}

fn main() -> ExitCode {
    // Like any Unix filter, die quietly when the reader of our output goes away (`| head`).
    // SAFETY: restoring the default SIGPIPE disposition has no memory-safety implications.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    let res = match cli.command {
        Command::Cell(c) => cmd::cell::run(c),
        Command::Apply(a) => cmd::apply::run(a),
        Command::Run(a) => cmd::run::run(a),
        Command::Status(a) => cmd::status::run(a),
        Command::Top(a) => cmd::top::run(a),
        Command::Trace(a) => cmd::trace::run(a),
        Command::Web(a) => cmd::web::run(a),
        Command::Quota(q) => cmd::quota::run(q),
        Command::Ns(n) => cmd::ns::run(n),
        Command::Logs(a) => cmd::logs::run(a),
        Command::Net(n) => net::run(n),
        Command::Broker(b) => broker::run(b),
        Command::Bench(b) => bench::run(b),
        Command::Work(w) => bench::work::run(w),
    };
    match res {
        Ok(code) => ExitCode::from(code as u8),
        Err(e) => {
            let code = cmd::exit_code(&e);
            eprintln!("tess: {e:#}");
            ExitCode::from(code as u8)
        }
    }
}
