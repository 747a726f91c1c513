//! `tess net`: the network service's QoS interface (issue 6): its flows, their reservations and
//! achieved rates; setting and clearing a cell's spec.

use clap::{Args, Subcommand};
use std::time::Duration;
use tess_net::client::qos::{format_bps, format_ns, format_pps, parse_throughput};
use tess_net::client::{FlowTable, Net, QosSpec, Throughput};

/// `tess net`.
#[derive(Subcommand, Debug)]
pub enum NetCmd {
    /// Show the flows, their specs and their achieved rates.
    Flows(FlowsArgs),
    /// Give a cell's flow a reservation, weight, limit or latency bound (root).
    Set(SetArgs),
    /// Make a cell's flow best effort again (root).
    Clear(ClearArgs),
    /// A workload that needs bandwidth and CPU for every unit: fetch a chunk through the
    /// network service, hash it, beat a heartbeat (`--serve`: the matching server). For
    /// trying the broker's joint CPU + network model (`network = true`, docs/broker.md).
    Fetch(crate::net_fetch::FetchArgs),
}

#[derive(Args, Debug)]
pub struct Which {
    /// Network service name (default: $TESS_NET_SERVICE, else `net`).
    #[arg(long, global = true, value_name = "NAME")]
    service: Option<String>,
}

#[derive(Args, Debug)]
pub struct FlowsArgs {
    #[command(flatten)]
    which: Which,
    /// Print the table as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  tess net set synth --reserve 240mbit\n  tess net set synth --reserve 170mbit,25kpps --latency 250us\n  tess net set backup --weight 1 --limit 100mbit"
)]
pub struct SetArgs {
    #[command(flatten)]
    which: Which,
    /// The flow: a cell name, `cell:NAME` or `pid:N`; `/LABEL` after any of them names a
    /// labelled flow (`video/s3`: the sockets cell video opened with flow label s3).
    flow: String,
    /// Minimum throughput: a bit rate, a packet rate, or both (`240mbit`, `25kpps`,
    /// `240mbit,25kpps`).
    #[arg(long, value_name = "RATE")]
    reserve: Option<String>,
    /// Share of the excess relative to other flows (1-10000).
    #[arg(long, default_value_t = 1)]
    weight: u32,
    /// Maximum throughput, same form as --reserve.
    #[arg(long, value_name = "RATE")]
    limit: Option<String>,
    /// Latency bound within the reservation (e.g. `250us`).
    #[arg(long, value_name = "TIME")]
    latency: Option<String>,
}

#[derive(Args, Debug)]
pub struct ClearArgs {
    #[command(flatten)]
    which: Which,
    /// The flow: a cell name, `cell:NAME` or `pid:N`; `/LABEL` after any of them names a
    /// labelled flow (`video/s3`: the sockets cell video opened with flow label s3).
    #[arg(required_unless_present = "all")]
    flow: Option<String>,
    /// Clear every flow's spec.
    #[arg(long, conflicts_with = "flow")]
    all: bool,
}

fn net(w: &Which) -> Net {
    w.service.as_deref().map_or_else(Net::from_env, Net::named)
}

fn key(flow: &str) -> String {
    if flow.starts_with("cell:") || flow.starts_with("pid:") {
        flow.to_string()
    } else {
        format!("cell:{flow}")
    }
}

/// Runs `tess net`.
pub fn run(c: NetCmd) -> anyhow::Result<i32> {
    match c {
        NetCmd::Flows(a) => {
            let t = net(&a.which).control()?.flows()?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&t)?);
            } else {
                print!("{}", render(&t));
            }
        }
        NetCmd::Set(a) => {
            let rate = |s: &Option<String>, what: &str| -> anyhow::Result<Throughput> {
                match s {
                    None => Ok(Throughput::ZERO),
                    Some(s) => parse_throughput(s).map_err(|e| anyhow::anyhow!("--{what}: {e}")),
                }
            };
            let latency = a
                .latency
                .as_deref()
                .map(tess_core::units::parse_duration)
                .transpose()
                .map_err(|e| anyhow::anyhow!("--latency: {e}"))?;
            let spec = QosSpec {
                reservation: rate(&a.reserve, "reserve")?,
                weight: a.weight,
                limit: a
                    .limit
                    .is_some()
                    .then(|| rate(&a.limit, "limit"))
                    .transpose()?,
                latency_ns: latency.map(|d: Duration| d.as_nanos() as u64),
            };
            if let Err(why) = spec.validate() {
                anyhow::bail!("{why}");
            }
            let k = key(&a.flow);
            net(&a.which).control()?.set(&k, spec)?;
            eprintln!("tess: {k}: {spec}");
        }
        NetCmd::Fetch(a) => return crate::net_fetch::run(a),
        NetCmd::Clear(a) => {
            let mut c = net(&a.which).control()?;
            if a.all {
                c.clear_all()?;
            } else if let Some(f) = &a.flow {
                c.clear(&key(f))?;
            }
        }
    }
    Ok(0)
}

fn render(t: &FlowTable) -> String {
    let mut out = format!(
        "network service {:?}: link {}, {} ({}); reserved {} of it; latency bounds >= {}; best-effort weight {}\n",
        t.service,
        format_bps(t.capacity.bps as f64),
        format_pps(t.capacity.pps as f64),
        if t.paced { "paced" } else { "not paced" },
        t.reserved,
        format_ns(t.min_latency_ns),
        t.best_effort_weight,
    );
    let mut table = tess_bench::Table::new(
        format!(
            "flows (rates over the last {:.1} s, payload both ways)",
            t.window_s
        ),
        &[
            "flow",
            "sockets",
            "reserve",
            "weight",
            "limit",
            "latency",
            "rx",
            "tx",
            "packets/s",
            "drops",
            "late",
        ],
    );
    for f in &t.flows {
        let (reserve, weight, limit, latency) = match &f.spec {
            None => (
                "best effort".to_string(),
                "-".into(),
                "-".into(),
                "-".into(),
            ),
            Some(s) => (
                s.reservation.to_string(),
                s.weight.to_string(),
                s.limit.map_or("-".into(), |l| l.to_string()),
                s.latency_ns.map_or("-".into(), format_ns),
            ),
        };
        table.row(&[
            f.key.clone(),
            f.sockets.to_string(),
            reserve,
            weight,
            limit,
            latency,
            format_bps(f.rates.rx_bps),
            format_bps(f.rates.tx_bps),
            format_pps(f.rates.pps()),
            f.totals.drops.to_string(),
            f.totals.late.to_string(),
        ]);
    }
    out.push_str(&table.render());
    out
}
