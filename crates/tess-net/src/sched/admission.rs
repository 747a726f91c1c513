//! Admission of reservations and latency bounds.
//!
//! # The test
//! With shares `u_i` (see [`Link::share`]), latency bounds `d_i` and a blocking time `B` (the
//! longest the service is committed when a packet arrives: one dispatch), the reservation
//! phase is non-preemptive EDF over token-bucket flows whose burst is `u_i d_i` link time
//! (a flow runs at most `d_i` ahead of its reservation). EDF meets every deadline iff for all
//! `t >= min d`: `sum over {i: d_i <= t} u_i t + B <= t`, i.e.
//! ```text
//! sum u_i  <=  1 - B / d_min            (d_min = smallest latency bound; no bound: B / d = 0)
//! ```
//! and each bound must exceed `2 B` (so that at least half the link stays reservable). Flows
//! reserved without a latency bound take part in the sum: they get their share as throughput.
//!
//! # Worked example
//! Link 1 Gbit/s and 250 kpps, dispatch quantum 20 us, largest datagram 1500 bytes (12 us):
//! `B` = 20 us. The synthesizer reserves 170 Mbit/s with a 250 us bound (`u` = 0.17): the
//! others may reserve up to `1 - 20/250 - 0.17` = 0.75 more, e.g. 750 Mbit/s; a further
//! 800 Mbit/s request is refused: "over by 5.0% of the link (50.0 Mbit/s)".

use super::Link;
use std::fmt::Write as _;
use tess_net_client::qos::{format_bps, format_ns, format_pps};
use tess_net_client::QosSpec;

/// Why a set of specs does not fit.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AdmissionError {
    /// The reservations need more link time than there is.
    #[error("{0}")]
    OverCommitted(Box<OverCommit>),
    /// A latency bound below what the service can promise.
    #[error(
        "latency bound {bound} of flow {flow} is below the network service's minimum of {min} \
         (twice its blocking time: one dispatch of up to {blocking})"
    )]
    LatencyTooSmall {
        /// Flow key.
        flow: String,
        /// The bound asked for.
        bound: String,
        /// The minimum.
        min: String,
        /// The blocking time.
        blocking: String,
    },
    /// A spec is wrong on its own.
    #[error("spec of flow {flow}: {why}")]
    Invalid {
        /// Flow key.
        flow: String,
        /// What is wrong.
        why: String,
    },
}

/// How far a set of reservations exceeds the link.
#[derive(Debug, Clone, PartialEq)]
pub struct OverCommit {
    /// Service name.
    pub service: String,
    /// The link, described.
    pub link: String,
    /// Percent of link time the reservations need.
    pub need: f64,
    /// Percent reservable.
    pub avail: f64,
    /// Why less than 100%, if so.
    pub why: String,
    /// Percent over.
    pub over: f64,
    /// The excess in the link's units.
    pub over_rate: String,
    /// Each flow's share.
    pub list: String,
}

impl std::fmt::Display for OverCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "reservations on network service {:?} would take {:.1}% of its link ({}); {:.1}% is \
             reservable{}: over by {:.1}% ({}); reserved: {}",
            self.service,
            self.need,
            self.link,
            self.avail,
            self.why,
            self.over,
            self.over_rate,
            self.list
        )
    }
}

/// Where a set of specs stands.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Usage {
    /// Sum of shares.
    pub share: f64,
    /// Reservable share (`1 - B / d_min`).
    pub reservable: f64,
}

/// Checks that `specs` (flow key, spec) fit a service on `link` whose blocking time is
/// `blocking_ns`.
pub fn check<'a>(
    service: &str,
    link: &Link,
    blocking_ns: u64,
    specs: impl IntoIterator<Item = (&'a str, &'a QosSpec)>,
) -> Result<Usage, AdmissionError> {
    let min_latency = 2 * blocking_ns;
    let mut share = 0.0;
    let mut d_min: Option<u64> = None;
    let mut list = String::new();
    for (key, spec) in specs {
        spec.validate().map_err(|why| AdmissionError::Invalid {
            flow: key.to_string(),
            why,
        })?;
        if let Some(d) = spec.latency_ns {
            if d <= min_latency {
                return Err(AdmissionError::LatencyTooSmall {
                    flow: key.to_string(),
                    bound: format_ns(d),
                    min: format_ns(min_latency + 1),
                    blocking: format_ns(blocking_ns),
                });
            }
            d_min = Some(d_min.map_or(d, |m| m.min(d)));
        }
        let u = link.share(spec.reservation);
        if u > 0.0 {
            share += u;
            let _ = write!(
                list,
                "{}{key} {:.1}%",
                if list.is_empty() { "" } else { ", " },
                u * 100.0
            );
        }
    }
    let reservable = match d_min {
        Some(d) => 1.0 - blocking_ns as f64 / d as f64,
        None => 1.0,
    };
    // A part per million of slack absorbs rounding in the shares.
    if share > reservable + 1e-6 {
        let over = share - reservable;
        return Err(AdmissionError::OverCommitted(Box::new(OverCommit {
            service: service.to_string(),
            link: describe(link),
            need: share * 100.0,
            avail: reservable * 100.0,
            why: match d_min {
                Some(d) => format!(
                    " (a {} latency bound leaves 1 - {}/{} of it)",
                    format_ns(d),
                    format_ns(blocking_ns),
                    format_ns(d)
                ),
                None => String::new(),
            },
            over: over * 100.0,
            over_rate: format!(
                "{} or {}",
                format_bps(over * link.bps),
                format_pps(over * link.pps)
            ),
            list,
        })));
    }
    Ok(Usage { share, reservable })
}

/// `1.00 Gbit/s, 250.0 kpps`.
pub fn describe(link: &Link) -> String {
    format!("{}, {}", format_bps(link.bps), format_pps(link.pps))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tess_net_client::Throughput;

    fn link() -> Link {
        Link::new(Throughput {
            pps: 250_000,
            bps: 1_000_000_000,
        })
    }

    fn bits(bps: u64, latency_us: Option<u64>) -> QosSpec {
        QosSpec {
            reservation: Throughput::bits(bps),
            latency_ns: latency_us.map(|u| u * 1000),
            ..QosSpec::default()
        }
    }

    #[test]
    fn the_worked_example() {
        let synth = bits(170_000_000, Some(250));
        let other = bits(750_000_000, None);
        let u = check(
            "net",
            &link(),
            20_000,
            [("cell:synth", &synth), ("cell:x", &other)],
        )
        .unwrap();
        assert!((u.share - 0.92).abs() < 1e-9);
        assert!((u.reservable - 0.92).abs() < 1e-9);
        let greedy = bits(800_000_000, None);
        let e = check(
            "net",
            &link(),
            20_000,
            [("cell:synth", &synth), ("cell:x", &greedy)],
        )
        .unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("over by 5.0%"), "{msg}");
        assert!(msg.contains("50.0 Mbit/s"), "{msg}");
        assert!(msg.contains("cell:x 80.0%"), "{msg}");
    }

    #[test]
    fn packet_and_bit_reservations_share_one_sum() {
        let pps = QosSpec {
            reservation: Throughput {
                pps: 125_000,
                bps: 0,
            },
            ..QosSpec::default()
        };
        let half = bits(500_000_000, None);
        assert!(check("net", &link(), 20_000, [("a", &pps), ("b", &half)]).is_ok());
        let more = bits(501_000_000, None);
        assert!(check("net", &link(), 20_000, [("a", &pps), ("b", &more)]).is_err());
    }

    #[test]
    fn tight_latency_bounds_are_refused() {
        let s = bits(1000, Some(30));
        let e = check("net", &link(), 20_000, [("cell:a", &s)]).unwrap_err();
        assert!(matches!(e, AdmissionError::LatencyTooSmall { .. }), "{e}");
        assert!(e.to_string().contains("minimum of 40us"), "{e}");
    }
}
