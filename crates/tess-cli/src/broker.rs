//! `tess broker`: what the Resource Allocation Broker (`tess-broker`) is doing and why.

use clap::{Args, Subcommand};
use tess_bench::Table;
use tess_broker::status;

/// `tess broker` subcommands.
#[derive(Subcommand, Debug)]
pub enum BrokerCmd {
    /// Per brokered cell: its target, measured rate, share in force, floor and ceiling, model
    /// parameters, bad input seen, and the last decisions with their reasons.
    Status(StatusArgs),
}

/// `tess broker status`.
#[derive(Args, Debug)]
#[command(
    after_help = "Reasons: raise/lower (below/above target), hold (change under the hysteresis step),\nat-ceiling/at-floor (clamped), learning (first period), pinned, no-target, not-brokered\n(dedicated or best-effort), refused (tessd's admission said no: the last good allocation\nstays), tessd-unreachable, bad-measurement.\nPACORA: learning, meets-target (the least-reserving shares that meet the target), trade-off\n(the pools cannot meet every target: the least total penalty), approaching (a model of harts and\nlink moved at most twice beyond where it was measured), no-event (nothing changed: held),\nno-rate (no beats), initial (a flow's first share), solver-failed, bad-view. A cell marked network = true\nshows its harts and its flow's Mbit/s together (cpu+net). See docs/broker.md."
)]
pub struct StatusArgs {
    /// Print the status as JSON.
    #[arg(long)]
    json: bool,
    /// Status file (default $TESS_BROKER_STATUS or /run/tess/broker-status.json).
    #[arg(long, value_name = "PATH")]
    file: Option<std::path::PathBuf>,
}

/// Runs a `tess broker` command.
pub fn run(c: BrokerCmd) -> anyhow::Result<i32> {
    match c {
        BrokerCmd::Status(a) => {
            let path = a.file.unwrap_or_else(status::status_path);
            let s = status::read(&path)?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&s)?);
                return Ok(0);
            }
            let mut t = Table::new(
                format!(
                    "broker pid {}, policy {}, decision period {} ms",
                    s.pid,
                    if s.policy.is_empty() {
                        "pota"
                    } else {
                        &s.policy
                    },
                    s.period_ms
                ),
                &[
                    "cell or flow",
                    "heartbeat",
                    "target/s",
                    "rate/s",
                    "share",
                    "floor",
                    "ceiling",
                    "model",
                    "last decision",
                ],
            );
            for c in &s.cells {
                let last = c
                    .decisions
                    .last()
                    .map(|d| {
                        let rounds = if d.rounds > 1 {
                            format!(" (x{})", d.rounds)
                        } else {
                            String::new()
                        };
                        format!("{}{rounds} {:.3}->{:.3} {}", d.reason, d.from, d.to, d.note)
                    })
                    .unwrap_or_default();
                t.row(&[
                    // A flow heartbeat's share is of a flow: `CELL.net` or `CELL/LABEL.net`; a
                    // cell whose units need its flow too holds both (`cpu+net`).
                    match (&c.flow, c.resource.as_str()) {
                        (Some(f), "cpu+net") => format!("{} + {f}.net", c.cell),
                        (Some(f), _) => format!("{f}.net"),
                        (None, _) => c.cell.clone(),
                    },
                    c.heartbeat.clone(),
                    c.target_rate
                        .map(|r| format!("{r:.2}"))
                        .unwrap_or("-".into()),
                    format!("{:.2}", c.measured_rate),
                    match (c.resource.as_str(), c.flow_share) {
                        ("cpu+net", Some(mbps)) => format!("{:.3} + {mbps:.2} Mbit/s", c.share),
                        ("cpu+net", None) => format!("{:.3} + (flow not set)", c.share),
                        _ => format!("{:.3}", c.share),
                    },
                    format!("{:.3}", c.floor),
                    format!("{:.3}", c.ceiling),
                    match &c.response_model {
                        Some(m) if m.resources == 2 => format!(
                            "tau = {:.2} + {:.2}/harts + {:.2}/sqrt(harts Mbit/s) + {:.2}/Mbit/s ms",
                            m.tau0 * 1e3,
                            m.w[0] * 1e3,
                            m.w[1] * 1e3,
                            m.w[2] * 1e3
                        ),
                        Some(m) => format!(
                            "tau = {:.2} + {:.2}/share ms",
                            m.tau0 * 1e3,
                            m.w.first().copied().unwrap_or(0.0) * 1e3
                        ),
                        None => format!("a {:.3} b {:.1}", c.model_a, c.model_b),
                    },
                    last,
                ]);
            }
            print!("{}", t.render());
            for c in &s.cells {
                let a = &c.anomalies;
                if a.unreadable + a.bad_timestamps + a.count_went_back + a.bad_target > 0 {
                    println!(
                        "  {}: bad input: {} unreadable beats, {} forged timestamps, count went back {} times, invalid target {} times",
                        c.cell, a.unreadable, a.bad_timestamps, a.count_went_back, a.bad_target
                    );
                }
            }
            for r in &s.refused {
                println!("  refused registration: {r}");
            }
            Ok(0)
        }
    }
}
