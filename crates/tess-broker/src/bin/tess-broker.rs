//! `tess-broker`: the Resource Allocation Broker service (seed 004 section 5). Run it in a cell
//! of its own, like the network service:
//!
//! ```text
//! tess cell create broker --policy best-effort
//! tess run --cell broker -- tess-broker [--config broker.toml] &
//! ```

use clap::Parser;
use std::path::PathBuf;
use tess_broker::config::Config;
use tess_broker::service::{serve, Broker, Tessd};

/// The tess Resource Allocation Broker: reads the heartbeats of cells against their targets and
/// moves CPU (a time-triggered cell's window, an event-triggered cell's budget) through tessd
/// transactions so that each target holds with as little reserved as possible (POTA).
#[derive(Parser, Debug)]
#[command(
    version,
    after_help = "Programs register heartbeats with tess_heartbeat (Rust), tess_heartbeat.h (C), or `tess run\n--heartbeat-pipe FRAME_BYTES`. `tess broker status` shows what the broker does and why.\nSee docs/broker.md."
)]
struct Args {
    /// Configuration (TOML): decision period, pole, per-cell floor and ceiling.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Socket heartbeats register on (default $TESS_BROKER_SOCKET or /run/tess/broker.sock).
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Status file for `tess broker status` (default $TESS_BROKER_STATUS or
    /// /run/tess/broker-status.json).
    #[arg(long, value_name = "PATH")]
    status: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let config = match &a.config {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .map_err(|e| anyhow::anyhow!("reading {}: {e}", p.display()))?;
            Config::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e:#}", p.display()))?
        }
        None => Config::default(),
    };
    let socket = a
        .socket
        .unwrap_or_else(tess_heartbeat::register::socket_path);
    let status = a.status.unwrap_or_else(tess_broker::status::status_path);
    let listener = tess_heartbeat::register::Listener::bind(&socket)?;
    eprintln!(
        "tess-broker: reading heartbeats registered at {}, deciding every {:?}",
        socket.display(),
        config.period
    );
    serve(Broker::new(config, Tessd::new()), &listener, &status)
}
