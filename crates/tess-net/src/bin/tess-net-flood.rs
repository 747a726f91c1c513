//! `tess-net-flood`: the abusive streaming client of seed 000 section 4.2: sends datagrams
//! through the network service as fast as the service takes them.

use anyhow::{Context, Result};
use clap::Parser;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tess_net::client::{Net, Wait};

/// Streams UDP datagrams through the network service as fast as it will take them (the
/// abusive application of seed 000 section 4.2), until SIGINT/SIGTERM or --duration.
#[derive(Parser, Debug)]
#[command(version)]
struct Cli {
    /// Destination.
    #[arg(long, value_name = "ADDR:PORT")]
    to: SocketAddr,
    /// Local address to bind through the service.
    #[arg(long, default_value = "0.0.0.0:0")]
    bind: SocketAddr,
    /// Datagram payload, bytes.
    #[arg(long, default_value_t = 1472)]
    size: usize,
    /// Network service name (default: $TESS_NET_SERVICE, else `net`).
    #[arg(long)]
    service: Option<String>,
    /// Stop after this many seconds.
    #[arg(long)]
    duration: Option<f64>,
    /// Pin to this hart.
    #[arg(long)]
    hart: Option<usize>,
    /// Create this file once the socket is open.
    #[arg(long, value_name = "PATH")]
    ready_file: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    tess_sched::rt::install_signal_handlers()?;
    tess_sched::rt::place_current_thread(cli.hart, None)?;
    let net = cli
        .service
        .as_deref()
        .map_or_else(Net::from_env, Net::named);
    let mut s = net
        .udp_bind(cli.bind)
        .context("opening a socket in the service")?;
    // Spin on a full channel: as fast as the service drains it, and no faster.
    s.set_wait(Wait::BusyPoll);
    s.set_write_timeout(Some(Duration::from_millis(50)))?;
    if let Some(p) = &cli.ready_file {
        std::fs::write(p, s.local_addr()?.to_string())?;
    }
    let start = Instant::now();
    let end = cli.duration.map(|d| start + Duration::from_secs_f64(d));
    let mut sent: u64 = 0;
    let mut seq: u64 = 0;
    while !tess_sched::rt::STOP.load(Ordering::Relaxed) && end.is_none_or(|e| Instant::now() < e) {
        seq += 1;
        // Only the sequence number is written: the rest is whatever the slot held, which is
        // as good as anything for a flood and costs nothing.
        let r = s.send_to_with(cli.size, cli.to, |b| {
            let n = b.len().min(8);
            b[..n].copy_from_slice(&seq.to_le_bytes()[..n]);
        });
        match r {
            Ok(_) => sent += 1,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e).context("sending"),
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let mbps = sent as f64 * cli.size as f64 * 8.0 / secs / 1e6;
    if cli.json {
        println!(
            "{}",
            serde_json::json!({ "sent": sent, "seconds": secs, "size": cli.size, "mbps": mbps })
        );
    } else {
        eprintln!(
            "tess-net-flood: {sent} datagrams of {} B in {secs:.1} s into the service ({mbps:.1} Mbit/s)",
            cli.size
        );
    }
    Ok(())
}
