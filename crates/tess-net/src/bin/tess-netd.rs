//! `tess-netd`: the network service. Run it in a cell of its own:
//! `tess run --cell net -- tess-netd --hart 1`.

use anyhow::{bail, Context, Result};
use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;
use tess_net::client::qos::{format_bps, format_pps, parse_throughput};
use tess_net::client::wire;
use tess_net::service::{Config, Service, WaitMode};
use tess_proto::ns::{Access, Service as Registration};

/// The tess network service: owns sockets for client cells, which reach it over shared-memory
/// channels through tessd's nameserver, and schedules every client cell's flow with mClock
/// (reservation, weight, limit) and latency bounds.
///
/// Reservations are set through its QoS interface (`tess net set`, tessd or the broker) and
/// shown by `tess net flows`.
#[derive(Parser, Debug)]
#[command(version)]
struct Cli {
    /// Name to register with tessd's nameserver.
    #[arg(long, default_value = tess_net::client::DEFAULT_SERVICE)]
    name: String,
    /// The link the service shares: a bit rate and a packet rate, e.g. `1gbit,250kpps`.
    #[arg(long, default_value = "1gbit,250kpps")]
    capacity: String,
    /// Do not pace dispatch to the capacity (use it for admission only; run as fast as the
    /// host allows).
    #[arg(long)]
    no_pacing: bool,
    /// Most link time one dispatch commits, e.g. `20us`.
    #[arg(long, default_value = "20us")]
    quantum: String,
    /// Most datagrams per recvmmsg/sendmmsg.
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Largest datagram, bytes (bounds the blocking time, hence the smallest latency bound).
    #[arg(long, default_value_t = 9216)]
    max_datagram: usize,
    /// `busy` (poll without sleeping: a hart of its own) or `epoll` (sleep when idle).
    #[arg(long, default_value = "busy", value_parser = ["busy", "epoll"])]
    wait: String,
    /// Longest sleep in epoll mode (sends waiting in channels are seen after at most this).
    #[arg(long, default_value = "200us")]
    nap: String,
    /// Weight of the best-effort flows together.
    #[arg(long, default_value_t = 1)]
    best_effort_weight: u32,
    /// Receive buffer of the TCP connections the service opens, bytes (default: the kernel's
    /// autotuning). Bounding it keeps a held-back flow's backlog at its sender rather than in
    /// the link's shared queue.
    #[arg(long, value_name = "BYTES")]
    tcp_rcvbuf: Option<usize>,
    /// Pin the service thread to this hart.
    #[arg(long)]
    hart: Option<usize>,
    /// Run as SCHED_FIFO at this priority.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=99))]
    fifo: Option<u32>,
    /// Create this file once registered (contains the name).
    #[arg(long, value_name = "PATH")]
    ready_file: Option<PathBuf>,
    /// Print the final flow table as JSON on stdout at exit.
    #[arg(long)]
    json: bool,
}

fn duration(s: &str, what: &str) -> Result<Duration> {
    tess_core::units::parse_duration(s).with_context(|| format!("bad --{what}"))
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let capacity = parse_throughput(&cli.capacity).context("bad --capacity")?;
    if capacity.pps == 0 || capacity.bps == 0 {
        bail!("--capacity needs both a bit rate and a packet rate, e.g. 1gbit,250kpps");
    }
    let cfg = Config {
        name: cli.name.clone(),
        capacity,
        paced: !cli.no_pacing,
        quantum: duration(&cli.quantum, "quantum")?,
        batch: cli.batch,
        max_datagram: cli.max_datagram,
        wait: if cli.wait == "epoll" {
            WaitMode::Epoll {
                nap: duration(&cli.nap, "nap")?,
            }
        } else {
            WaitMode::BusyPoll
        },
        best_effort_weight: cli.best_effort_weight,
        window: Duration::from_secs(1),
        tcp_rcvbuf: cli.tcp_rcvbuf,
    };
    tess_sched::rt::install_signal_handlers().context("installing signal handlers")?;
    if let Err(e) = tess_sched::lock_memory() {
        eprintln!("tess-netd: mlockall failed ({e}); continuing");
    }
    tess_sched::rt::place_current_thread(
        cli.hart,
        cli.fifo
            .map(|priority| tess_sched::Policy::Fifo { priority }),
    )
    .context("placing the service thread")?;
    let reg = Registration::register(&cli.name, Access::anyone(), &wire::channel_options())
        .with_context(|| format!("registering {:?} with tessd's nameserver", cli.name))?;
    let mut svc = Service::new(cfg.clone(), Box::new(reg)).context("starting the service")?;
    eprintln!(
        "tess-netd: serving {:?}: link {}, {} ({}), quantum {:?}, batch {}, max datagram {} B, wait {}, blocking {} us{}",
        cli.name,
        format_bps(capacity.bps as f64),
        format_pps(capacity.pps as f64),
        if cfg.paced { "paced" } else { "not paced" },
        cfg.quantum,
        cfg.batch,
        cfg.max_datagram,
        cli.wait,
        cfg.blocking_ns() / 1000,
        cli.hart.map_or(String::new(), |h| format!(", hart {h}")),
    );
    if let Some(p) = &cli.ready_file {
        std::fs::write(p, &cli.name).with_context(|| format!("writing {}", p.display()))?;
    }
    let r = svc.run(&tess_sched::rt::STOP);
    let table = svc.flow_table();
    let c = svc.counters();
    eprintln!(
        "tess-netd: stopping: {} clients, {} packets in {} dispatches ({} empty), {} rounds ({} paced); packets by deadline {}, by reservation {}, by weight {}",
        c.clients,
        c.packets,
        c.dispatches,
        c.empty_dispatches,
        c.rounds,
        c.paced_rounds,
        c.by_phase[0],
        c.by_phase[1],
        c.by_phase[2]
    );
    if cli.json {
        println!("{}", serde_json::to_string_pretty(&table)?);
    }
    r.context("serving")
}
