//! `tess apply FILE.toml`

use super::{call, usage};
use crate::output;
use clap::Args;
use std::path::PathBuf;
use tess_proto::{Body, Request};

/// Apply a manifest.
#[derive(Args, Debug)]
#[command(
    after_help = "The manifest (TOML):\n\n  delete = [\"old\"]            # optional\n\n  [cells.synth]\n  policy = \"dedicated\"\n  hart-ids = [1]\n  memory = \"512M\"\n  pinned = true\n\n  [cells.video]\n  policy = \"time-triggered\"\n  period = \"33ms\"\n  active = \"4ms\"\n\n  [cells.ctl]\n  policy = \"event-triggered\"\n  period = \"10ms\"\n  budget = \"2ms\"\n\nApplying is idempotent and atomic: either every cell becomes as described, or nothing changes."
)]
pub struct ApplyArgs {
    /// Manifest file (`-` for standard input).
    pub file: PathBuf,
    /// Also delete your cells that the manifest does not name (never pinned or ephemeral ones).
    #[arg(long)]
    pub prune: bool,
    /// Check placement and admission only; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs `tess apply`.
pub fn run(a: ApplyArgs) -> anyhow::Result<i32> {
    let text = if a.file.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin())?
    } else {
        match std::fs::read_to_string(&a.file) {
            Ok(t) => t,
            Err(e) => return usage(format!("cannot read {}: {e}", a.file.display())),
        }
    };
    let m = match tess_core::manifest::parse(&text) {
        Ok(m) => m,
        Err(e) => return usage(format!("{}: {e}", a.file.display())),
    };
    let body = call(Request::Apply {
        cells: m.cells,
        delete: m.delete,
        prune: a.prune,
        dry_run: a.dry_run,
    })?;
    let Body::Applied(r) = body else {
        anyhow::bail!("unexpected reply")
    };
    if a.json {
        output::json(&r);
    } else {
        print!("{}", output::applied(&r));
    }
    Ok(0)
}
