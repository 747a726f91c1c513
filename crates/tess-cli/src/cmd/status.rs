//! `tess status`

use super::call;
use crate::output;
use clap::Args;
use tess_bench::Table;
use tess_proto::{Body, Request};

/// Status arguments.
#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs `tess status`.
pub fn run(a: StatusArgs) -> anyhow::Result<i32> {
    let Body::Status(s) = call(Request::Status)? else {
        anyhow::bail!("unexpected reply")
    };
    if a.json {
        output::json(&s);
        return Ok(0);
    }
    println!(
        "tessd {} (pid {}), up {:.0} s",
        s.version, s.pid, s.uptime_s
    );
    println!("{}", s.cgroup);
    println!(
        "harts {}; managed {}; dedicated {}; reserved {}; system tasks on {}",
        s.harts,
        s.managed,
        if s.dedicated.is_empty() {
            "none".into()
        } else {
            s.dedicated.to_string()
        },
        if s.reserved.is_empty() {
            "none".into()
        } else {
            s.reserved.to_string()
        },
        s.system
    );
    println!(
        "limits: {:.0}% of each hart for cells, SCHED_DEADLINE up to {:.0}%; {} IRQs steered off dedicated harts",
        s.utilization_limit * 100.0,
        s.kernel_reservation_limit * 100.0,
        s.irqs_steered
    );
    let mut t = Table::new("", &["HART", "LOAD", "CELLS"]);
    for l in &s.load {
        let cells = match &l.dedicated_to {
            Some(c) => format!("{c} (dedicated)"),
            None => l
                .cells
                .iter()
                .map(|(n, u)| format!("{n} {:.1}%", u * 100.0))
                .collect::<Vec<_>>()
                .join(", "),
        };
        t.row(&[
            l.hart.to_string(),
            format!("{:.1}%", l.utilization * 100.0),
            cells,
        ]);
    }
    print!("{}", t.render());
    for w in &s.warnings {
        println!("warning: {w}");
    }
    Ok(0)
}
