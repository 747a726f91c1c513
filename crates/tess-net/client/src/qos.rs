//! The QoS specification interface of the network service: what tessd, the broker or an
//! administrator asks for a client cell's flow, and what the service reports back.
//!
//! A **flow** is all the traffic, in both directions, between the network and one client cell
//! (processes outside any cell form a flow of their own, keyed by pid). Its [`QosSpec`] has:
//!
//! - a **reservation**: the minimum throughput the flow gets whenever it has traffic, in
//!   packets/s and bits/s of payload (0 = no reservation in that dimension);
//! - a **weight**: its share of whatever capacity the reservations leave;
//! - an optional **limit**: the most it may take, in packets/s and bits/s;
//! - an optional **latency bound**: within its reservation, each request is served within this
//!   long of its arrival.
//!
//! Flows without a spec are best effort: together they share, first come first served, what
//! the flows with specs leave.
//!
//! Requests and replies travel as JSON in `CONTROL` / `CONTROL_REPLY` records (see
//! [`wire`](crate::wire)); [`Control`](crate::Control) is the client side.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;

/// A throughput in both dimensions the service schedules: packets and payload bits per second.
/// A zero field means "not constrained in that dimension".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Throughput {
    /// Packets per second.
    #[serde(default)]
    pub pps: u64,
    /// Payload bits per second.
    #[serde(default)]
    pub bps: u64,
}

impl Throughput {
    /// Zero in both dimensions.
    pub const ZERO: Throughput = Throughput { pps: 0, bps: 0 };

    /// Bits per second only.
    pub fn bits(bps: u64) -> Throughput {
        Throughput { pps: 0, bps }
    }

    /// Whether both fields are zero.
    pub fn is_zero(&self) -> bool {
        self.pps == 0 && self.bps == 0
    }
}

impl fmt::Display for Throughput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.pps, self.bps) {
            (0, 0) => write!(f, "-"),
            (0, b) => write!(f, "{}", format_bps(b as f64)),
            (p, 0) => write!(f, "{}", format_pps(p as f64)),
            (p, b) => write!(f, "{}, {}", format_bps(b as f64), format_pps(p as f64)),
        }
    }
}

/// What a flow is promised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QosSpec {
    /// Minimum throughput.
    #[serde(default)]
    pub reservation: Throughput,
    /// Share of the excess, relative to the other flows' weights (1..=10000).
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// Maximum throughput; `None` or zero fields: unlimited.
    #[serde(default)]
    pub limit: Option<Throughput>,
    /// Latency bound within the reservation, in nanoseconds.
    #[serde(default, rename = "latency_ns")]
    pub latency_ns: Option<u64>,
}

fn default_weight() -> u32 {
    1
}

impl Default for QosSpec {
    fn default() -> Self {
        QosSpec {
            reservation: Throughput::ZERO,
            weight: 1,
            limit: None,
            latency_ns: None,
        }
    }
}

impl QosSpec {
    /// The latency bound.
    pub fn latency(&self) -> Option<Duration> {
        self.latency_ns.map(Duration::from_nanos)
    }

    /// Checks the fields on their own (admission against the capacity is the service's).
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=10_000).contains(&self.weight) {
            return Err(format!("weight {} is outside 1..=10000", self.weight));
        }
        if let Some(l) = self.limit {
            let r = self.reservation;
            if (l.bps != 0 && r.bps > l.bps) || (l.pps != 0 && r.pps > l.pps) {
                return Err(format!("limit ({l}) is below the reservation ({r})"));
            }
        }
        if self.latency_ns.is_some() && self.reservation.is_zero() {
            return Err("a latency bound needs a reservation to be served within".into());
        }
        if self.latency_ns == Some(0) {
            return Err("a latency bound must be positive".into());
        }
        Ok(())
    }
}

impl fmt::Display for QosSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "reserve {} weight {}", self.reservation, self.weight)?;
        if let Some(l) = self.limit.filter(|l| !l.is_zero()) {
            write!(f, " limit {l}")?;
        }
        if let Some(d) = self.latency_ns {
            write!(f, " latency {}", format_ns(d))?;
        }
        Ok(())
    }
}

/// Longest flow label, bytes.
pub const MAX_FLOW_LABEL: usize = 32;

/// Whether `label` may name one of a cell's flows ([`crate::Net::flow`]): 1 to
/// [`MAX_FLOW_LABEL`] characters of `A-Z a-z 0-9 _ . -`.
pub fn valid_flow_label(label: &str) -> bool {
    !label.is_empty()
        && label.len() <= MAX_FLOW_LABEL
        && label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

/// The name a flow's statistics page is published under (crate `tess-stats`): `prefix`, then
/// `flow` (`CELL`, `pid:N`, or either with `/LABEL`) as `tess_stats::runtime_name` makes it, with
/// `-F-` before a label. Cell names have no capital letters, so no cell's own flow can take a
/// labelled flow's name; where the mapping loses something (a label's `.`, or a name cut to
/// the page's length) the name ends in a hash of the whole flow instead.
pub fn flow_page_name(prefix: &str, flow: &str) -> String {
    let Some((base, label)) = flow.split_once('/') else {
        return tess_stats::runtime_name(prefix, flow);
    };
    let full = format!("{prefix}{base}-F-{label}");
    let name = tess_stats::runtime_name(prefix, &format!("{base}-F-{label}"));
    if name == full {
        return name;
    }
    // FNV-1a of the flow: short, stable, and enough to tell a cell's labels apart.
    let hash = flow.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let tag = format!("-{:06x}", hash & 0xff_ffff);
    let keep = name.len().min(tess_stats::NAME_BYTES - tag.len());
    format!("{}{tag}", &name[..keep])
}

/// The flow key of a client: `cell:NAME`, or `pid:N` for a process outside any cell. A
/// labelled flow's key is this followed by `/LABEL` ([`crate::Net::flow`]): a cell's labelled
/// flows are flows of their own, each with its own spec (the video conference gives each of
/// its streams one).
pub fn flow_key(cell: Option<&str>, pid: i32) -> String {
    match cell {
        Some(c) => format!("cell:{c}"),
        None => format!("pid:{pid}"),
    }
}

/// A request on the QoS interface.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "request", rename_all = "kebab-case")]
pub enum ControlRequest {
    /// The flow table.
    Flows,
    /// Sets the spec of a flow (by key, e.g. `cell:synth` or `cell:video/s3`), connected or
    /// not. Refused when the reservations would no longer fit the capacity.
    Set {
        /// Flow key.
        flow: String,
        /// The spec.
        spec: QosSpec,
    },
    /// Removes a flow's spec: it becomes best effort.
    Clear {
        /// Flow key.
        flow: String,
    },
    /// Removes every spec.
    ClearAll,
}

/// Achieved rates of a flow over the service's last measuring window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Rates {
    /// Packets per second received from the network for the flow.
    pub rx_pps: f64,
    /// Payload bits per second received.
    pub rx_bps: f64,
    /// Packets per second sent for the flow.
    pub tx_pps: f64,
    /// Payload bits per second sent.
    pub tx_bps: f64,
}

impl Rates {
    /// Both directions, bits per second.
    pub fn bps(&self) -> f64 {
        self.rx_bps + self.tx_bps
    }

    /// Both directions, packets per second.
    pub fn pps(&self) -> f64 {
        self.rx_pps + self.tx_pps
    }
}

/// Running totals of a flow since the service started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    /// Packets received from the network and delivered to the client.
    pub rx_packets: u64,
    /// Their payload bytes.
    pub rx_bytes: u64,
    /// Packets sent for the client.
    pub tx_packets: u64,
    /// Their payload bytes.
    pub tx_bytes: u64,
    /// Datagrams dropped (client channel full, kernel refused, too large).
    pub drops: u64,
    /// Requests of a latency-bound flow served after their deadline.
    pub late: u64,
    /// Requests served under the reservation (deadline or reservation tag).
    pub reserved_served: u64,
}

impl Totals {
    /// Packets both ways.
    pub fn packets(&self) -> u64 {
        self.rx_packets + self.tx_packets
    }

    /// Payload bytes both ways.
    pub fn bytes(&self) -> u64 {
        self.rx_bytes + self.tx_bytes
    }
}

/// One row of the flow table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlowInfo {
    /// `cell:NAME` or `pid:N`.
    pub key: String,
    /// Its spec; `None`: best effort.
    pub spec: Option<QosSpec>,
    /// Client channels (sockets) open now.
    pub sockets: usize,
    /// Achieved rates over the last window.
    pub rates: Rates,
    /// Totals.
    pub totals: Totals,
}

/// The service's capacity and what is reserved of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlowTable {
    /// Service name.
    pub service: String,
    /// What the service schedules: its link rate and packet rate.
    pub capacity: Throughput,
    /// Whether the service paces its dispatch to the capacity (a link of that rate).
    pub paced: bool,
    /// Sum of the reservations of every spec, connected or not.
    pub reserved: Throughput,
    /// The smallest latency bound the service accepts, ns.
    pub min_latency_ns: u64,
    /// Weight of the best-effort flows together.
    pub best_effort_weight: u32,
    /// Seconds the rates were measured over.
    pub window_s: f64,
    /// Rows, sorted by key.
    pub flows: Vec<FlowInfo>,
}

impl FlowTable {
    /// The row of `key`.
    pub fn flow(&self, key: &str) -> Option<&FlowInfo> {
        self.flows.iter().find(|f| f.key == key)
    }
}

/// A reply on the QoS interface.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "kebab-case")]
pub enum ControlReply {
    /// The flow table.
    Flows(FlowTable),
    /// Done.
    Ok,
    /// Refused; the message says why (which resource, by how much).
    Error {
        /// What went wrong.
        message: String,
    },
}

/// Error parsing a rate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot parse {input:?} as {what}: {why}")]
pub struct ParseRateError {
    input: String,
    what: &'static str,
    why: &'static str,
}

fn split_number(s: &str) -> Option<(f64, &str)> {
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let n: f64 = s[..end].parse().ok()?;
    Some((n, s[end..].trim()))
}

/// Parses a bit rate: `240mbit`, `240Mbps`, `1.5gbit`, `800k`, `1000000` (bits/s).
pub fn parse_bps(s: &str) -> Result<u64, ParseRateError> {
    let err = |why| ParseRateError {
        input: s.into(),
        what: "a bit rate",
        why,
    };
    let (n, unit) = split_number(s.trim()).ok_or_else(|| err("expected a number"))?;
    let unit = unit.to_ascii_lowercase();
    let unit = unit
        .trim_end_matches("/s")
        .trim_end_matches("ps")
        .trim_end_matches("it");
    let mult = match unit {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        _ => return Err(err("unit must be bit, kbit, mbit or gbit (per second)")),
    };
    Ok((n * mult).round() as u64)
}

/// Parses a packet rate: `20k`, `20kpps`, `1.2m`, `5000`.
pub fn parse_pps(s: &str) -> Result<u64, ParseRateError> {
    let err = |why| ParseRateError {
        input: s.into(),
        what: "a packet rate",
        why,
    };
    let (n, unit) = split_number(s.trim()).ok_or_else(|| err("expected a number"))?;
    let unit = unit.to_ascii_lowercase();
    let unit = unit.trim_end_matches("pps").trim_end_matches("/s");
    let mult = match unit {
        "" => 1.0,
        "k" => 1e3,
        "m" => 1e6,
        _ => return Err(err("unit must be pps, kpps or mpps")),
    };
    Ok((n * mult).round() as u64)
}

/// Parses a throughput: a bit rate, a packet rate (ending in `pps`), or both separated by a
/// comma: `240mbit`, `20kpps`, `240mbit,25kpps`.
pub fn parse_throughput(s: &str) -> Result<Throughput, ParseRateError> {
    let mut t = Throughput::ZERO;
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if part.to_ascii_lowercase().ends_with("pps") {
            t.pps = parse_pps(part)?;
        } else {
            t.bps = parse_bps(part)?;
        }
    }
    Ok(t)
}

/// `240.0 Mbit/s` style.
pub fn format_bps(bps: f64) -> String {
    if bps >= 1e9 {
        format!("{:.2} Gbit/s", bps / 1e9)
    } else if bps >= 1e6 {
        format!("{:.1} Mbit/s", bps / 1e6)
    } else if bps >= 1e3 {
        format!("{:.1} kbit/s", bps / 1e3)
    } else {
        format!("{bps:.0} bit/s")
    }
}

/// `25.0 kpps` style.
pub fn format_pps(pps: f64) -> String {
    if pps >= 1e6 {
        format!("{:.2} Mpps", pps / 1e6)
    } else if pps >= 1e3 {
        format!("{:.1} kpps", pps / 1e3)
    } else {
        format!("{pps:.0} pps")
    }
}

/// `250us` style.
pub fn format_ns(ns: u64) -> String {
    if ns >= 1_000_000 && ns % 1_000_000 == 0 {
        format!("{}ms", ns / 1_000_000)
    } else if ns >= 1000 {
        format!("{}us", ns / 1000)
    } else {
        format!("{ns}ns")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse() {
        assert_eq!(parse_bps("240mbit").unwrap(), 240_000_000);
        assert_eq!(parse_bps("240Mbps").unwrap(), 240_000_000);
        assert_eq!(parse_bps("1.5gbit").unwrap(), 1_500_000_000);
        assert_eq!(parse_bps("800k").unwrap(), 800_000);
        assert_eq!(parse_bps("1000").unwrap(), 1000);
        assert!(parse_bps("fast").is_err());
        assert!(parse_bps("3 parsecs").is_err());
        assert_eq!(parse_pps("20kpps").unwrap(), 20_000);
        assert_eq!(parse_pps("1.2m").unwrap(), 1_200_000);
        assert_eq!(
            parse_throughput("240mbit, 25kpps").unwrap(),
            Throughput {
                pps: 25_000,
                bps: 240_000_000
            }
        );
    }

    #[test]
    fn specs_validate() {
        let mut s = QosSpec {
            reservation: Throughput::bits(100),
            ..QosSpec::default()
        };
        assert!(s.validate().is_ok());
        s.limit = Some(Throughput::bits(50));
        assert!(s.validate().unwrap_err().contains("below the reservation"));
        s.limit = None;
        s.weight = 0;
        assert!(s.validate().is_err());
        let lat = QosSpec {
            latency_ns: Some(1000),
            ..QosSpec::default()
        };
        assert!(lat.validate().unwrap_err().contains("needs a reservation"));
    }

    #[test]
    fn control_messages_are_json() {
        let r = ControlRequest::Set {
            flow: "cell:synth".into(),
            spec: QosSpec {
                reservation: Throughput::bits(240_000_000),
                latency_ns: Some(250_000),
                ..QosSpec::default()
            },
        };
        let j = serde_json::to_string(&r).unwrap();
        assert!(j.contains("\"request\":\"set\""), "{j}");
        assert_eq!(serde_json::from_str::<ControlRequest>(&j).unwrap(), r);
        let spec: QosSpec = serde_json::from_str(r#"{"reservation":{"bps":5}}"#).unwrap();
        assert_eq!(spec.weight, 1);
    }
}
