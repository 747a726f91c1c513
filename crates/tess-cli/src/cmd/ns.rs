//! `tess ns ...`

use super::call;
use crate::output;
use clap::{Args, Subcommand};
use tess_bench::Table;
use tess_proto::{Body, Request};

/// Nameserver subcommands.
#[derive(Subcommand, Debug)]
pub enum NsCmd {
    /// List registered services: name, serving process, its cell, channels handed out.
    List(ListArgs),
}

/// `tess ns list`.
#[derive(Args, Debug)]
pub struct ListArgs {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs an ns subcommand.
pub fn run(cmd: NsCmd) -> anyhow::Result<i32> {
    match cmd {
        NsCmd::List(a) => {
            let Body::Names { names } = call(Request::ListNames)? else {
                anyhow::bail!("unexpected reply")
            };
            if a.json {
                output::json(&names);
                return Ok(0);
            }
            if names.is_empty() {
                println!("no services registered");
                return Ok(0);
            }
            let mut t = Table::new("", &["NAME", "PID", "UID", "CELL", "CHANNELS"]);
            for n in names {
                t.row(&[
                    n.name,
                    n.service.pid.to_string(),
                    n.service.uid.to_string(),
                    n.service.cell.unwrap_or_else(|| "-".into()),
                    n.clients.to_string(),
                ]);
            }
            print!("{}", t.render());
            Ok(0)
        }
    }
}
