//! `tess-console`: the console service. Run it in its own cell:
//!
//! ```text
//! tess cell create console --policy best-effort
//! tess run --cell console -- tess-console &
//! ```

use clap::Parser;
use std::path::PathBuf;

/// The tess console service: registers `console` with the nameserver and writes every cell's
/// log lines, with the cell's name and the time, to DIR/CELL.log (read them with `tess logs`).
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Directory for the log files.
    #[arg(long, default_value = tess_console::service::DEFAULT_DIR)]
    dir: PathBuf,
}

fn main() {
    let args = Args::parse();
    if let Err(e) = tess_console::service::run(&args.dir) {
        eprintln!("tess-console: {e:#}");
        std::process::exit(1);
    }
}
