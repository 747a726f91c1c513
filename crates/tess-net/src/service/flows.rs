//! The flow table: one row per client cell (or process), its QoS spec, the scheduler entity it
//! belongs to, its counters and achieved rates; and the QoS interface's requests.

use crate::sched::admission::{self, AdmissionError};
use crate::sched::{EntityId, EntitySpec, Link, Scheduler};
use std::collections::HashMap;
use tess_net_client::qos::{Rates, Totals};
use tess_net_client::{ControlReply, ControlRequest, FlowInfo, FlowTable, QosSpec, Throughput};

/// Windows a best-effort flow without sessions stays in the table.
pub const KEEP_IDLE_WINDOWS: u32 = 10;

/// One flow.
#[derive(Debug, Clone)]
pub struct Flow {
    /// `cell:NAME` or `pid:N`, then `/LABEL` for a labelled flow.
    pub key: String,
    /// Its spec; `None`: best effort.
    pub spec: Option<QosSpec>,
    /// The scheduler entity serving it (its own, or the best-effort aggregate).
    pub entity: EntityId,
    /// Latency bound of its entity, ns (for counting late packets).
    pub latency_ns: Option<u64>,
    /// Open client channels.
    pub sessions: usize,
    /// Open sockets (channels that opened one).
    pub sockets: usize,
    /// Measuring windows closed since the last session left (rows of best-effort flows are
    /// kept for a while so that their totals can still be read).
    idle_windows: u32,
    /// Counters.
    pub totals: Totals,
    window_start: Totals,
    /// Rates over the last window.
    pub rates: Rates,
    /// Its packets as tess top and Prometheus see them (crate `tess-stats`): one event per
    /// packet, its queueing (arrival to served) as the response time, late ones as misses, and
    /// its bytes. The page goes with the row.
    pub published: Option<std::sync::Arc<tess_stats::Publisher>>,
}

/// The runtime name a flow publishes under: `net-` and its cell (or `pid-N`), and for a
/// labelled flow its label ([`tess_net_client::qos::flow_page_name`]).
pub fn published_name(key: &str) -> String {
    tess_net_client::qos::flow_page_name("net-", key.strip_prefix("cell:").unwrap_or(key))
}

/// All flows, the best-effort entity, and admission.
#[derive(Debug)]
pub struct Flows {
    service: String,
    link: Link,
    capacity: Throughput,
    paced: bool,
    blocking_ns: u64,
    best_effort: EntityId,
    best_effort_weight: u32,
    /// Rows by stable index (sessions keep theirs); `None`: a freed slot.
    rows: Vec<Option<Flow>>,
    index: HashMap<String, usize>,
    /// Rows of labelled flows (`BASE/LABEL`) per base (`cell:NAME`, `pid:N`).
    labelled: HashMap<String, usize>,
    window_s: f64,
}

impl Flows {
    /// An empty table; registers the best-effort entity with `sched`.
    pub fn new(
        service: &str,
        capacity: Throughput,
        paced: bool,
        blocking_ns: u64,
        best_effort_weight: u32,
        sched: &mut Scheduler,
    ) -> Flows {
        let best_effort = sched.add(EntitySpec::best_effort(best_effort_weight));
        Flows {
            service: service.to_string(),
            link: *sched.link(),
            capacity,
            paced,
            blocking_ns,
            best_effort,
            best_effort_weight,
            rows: Vec::new(),
            index: HashMap::new(),
            labelled: HashMap::new(),
            window_s: 0.0,
        }
    }

    /// The best-effort entity.
    pub fn best_effort(&self) -> EntityId {
        self.best_effort
    }

    /// Row `i` (an index from [`row_for`](Self::row_for), valid while it has sessions or a
    /// spec).
    pub fn get(&self, i: usize) -> &Flow {
        self.rows[i].as_ref().expect("flow row in use")
    }

    /// Row `i`, writable.
    pub fn get_mut(&mut self, i: usize) -> &mut Flow {
        self.rows[i].as_mut().expect("flow row in use")
    }

    fn live(&self) -> impl Iterator<Item = &Flow> {
        self.rows.iter().flatten()
    }

    /// Whether `key` has a row.
    pub fn has(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    /// Rows of labelled flows of `base` (`cell:NAME` or `pid:N`): keys `base/LABEL`.
    pub fn labelled(&self, base: &str) -> usize {
        self.labelled.get(base).copied().unwrap_or(0)
    }

    /// The row of `key`, created (best effort) if new.
    pub fn row_for(&mut self, key: &str) -> usize {
        if let Some(&i) = self.index.get(key) {
            return i;
        }
        let row = Flow {
            key: key.to_string(),
            spec: None,
            entity: self.best_effort,
            latency_ns: None,
            sessions: 0,
            sockets: 0,
            idle_windows: 0,
            totals: Totals::default(),
            window_start: Totals::default(),
            rates: Rates::default(),
            published: tess_stats::Publisher::try_create(&published_name(key), None)
                .map(std::sync::Arc::new),
        };
        let i = match self.rows.iter().position(Option::is_none) {
            Some(i) => {
                self.rows[i] = Some(row);
                i
            }
            None => {
                self.rows.push(Some(row));
                self.rows.len() - 1
            }
        };
        self.index.insert(key.to_string(), i);
        if let Some((base, _)) = key.split_once('/') {
            *self.labelled.entry(base.to_string()).or_default() += 1;
        }
        i
    }

    /// Sets or clears the spec of `key` after checking admission.
    pub fn set_spec(
        &mut self,
        key: &str,
        spec: Option<QosSpec>,
        sched: &mut Scheduler,
    ) -> Result<(), AdmissionError> {
        let mut specs: Vec<(&str, &QosSpec)> = self
            .live()
            .filter(|f| f.key != key)
            .filter_map(|f| f.spec.as_ref().map(|s| (f.key.as_str(), s)))
            .collect();
        if let Some(s) = &spec {
            specs.push((key, s));
        }
        admission::check(&self.service, &self.link, self.blocking_ns, specs)?;
        let i = self.row_for(key);
        let link = self.link;
        let best_effort = self.best_effort;
        let f = self.get_mut(i);
        match (&spec, f.entity == best_effort) {
            (Some(s), true) => f.entity = sched.add(EntitySpec::from_qos(&link, s)),
            (Some(s), false) => sched.update(f.entity, EntitySpec::from_qos(&link, s)),
            (None, true) => {}
            (None, false) => {
                sched.remove(f.entity);
                f.entity = best_effort;
            }
        }
        f.latency_ns = spec.and_then(|s| s.latency_ns);
        f.spec = spec;
        Ok(())
    }

    /// A client channel joins flow `key`: its row (made if new), with the channel counted.
    pub fn join(&mut self, key: &str) -> usize {
        let i = self.row_for(key);
        self.get_mut(i).sessions += 1;
        i
    }

    /// A client channel leaves row `i` (its socket, if any, already uncounted); the row goes
    /// if nothing keeps it ([`Flows::forget_if_idle`]).
    pub fn leave(&mut self, i: usize) {
        let f = self.get_mut(i);
        f.sessions = f.sessions.saturating_sub(1);
        self.forget_if_idle(i);
    }

    /// Frees row `i` if it has neither a spec nor sessions (a best-effort client that left)
    /// and has been idle for [`KEEP_IDLE_WINDOWS`] windows.
    pub fn forget_if_idle(&mut self, i: usize) {
        let idle = self.rows[i].as_ref().is_some_and(|f| {
            f.spec.is_none() && f.sessions == 0 && f.idle_windows >= KEEP_IDLE_WINDOWS
        });
        if idle {
            if let Some(f) = self.rows[i].take() {
                self.index.remove(&f.key);
                if let Some((base, _)) = f.key.split_once('/') {
                    if let Some(n) = self.labelled.get_mut(base) {
                        *n -= 1;
                        if *n == 0 {
                            self.labelled.remove(base);
                        }
                    }
                }
            }
        }
    }

    /// Closes a measuring window of `elapsed_s` seconds: rates from the counters' growth.
    pub fn close_window(&mut self, elapsed_s: f64) {
        if elapsed_s <= 0.0 {
            return;
        }
        self.window_s = elapsed_s;
        for f in self.rows.iter_mut().flatten() {
            f.idle_windows = if f.sessions == 0 {
                f.idle_windows.saturating_add(1)
            } else {
                0
            };
            let d = |now: u64, then: u64| now.saturating_sub(then) as f64 / elapsed_s;
            f.rates = Rates {
                rx_pps: d(f.totals.rx_packets, f.window_start.rx_packets),
                rx_bps: 8.0 * d(f.totals.rx_bytes, f.window_start.rx_bytes),
                tx_pps: d(f.totals.tx_packets, f.window_start.tx_packets),
                tx_bps: 8.0 * d(f.totals.tx_bytes, f.window_start.tx_bytes),
            };
            f.window_start = f.totals;
        }
        for i in 0..self.rows.len() {
            self.forget_if_idle(i);
        }
    }

    /// The table as the QoS interface shows it.
    pub fn table(&self) -> FlowTable {
        let mut reserved = Throughput::ZERO;
        for s in self.live().filter_map(|f| f.spec.as_ref()) {
            reserved.pps += s.reservation.pps;
            reserved.bps += s.reservation.bps;
        }
        // Channels that never opened a socket (the QoS interface's own) are not flows.
        let mut flows: Vec<FlowInfo> = self
            .live()
            .filter(|f| f.spec.is_some() || f.sockets > 0 || f.totals.packets() > 0)
            .map(|f| FlowInfo {
                key: f.key.clone(),
                spec: f.spec,
                sockets: f.sockets,
                rates: f.rates,
                totals: f.totals,
            })
            .collect();
        flows.sort_by(|a, b| a.key.cmp(&b.key));
        FlowTable {
            service: self.service.clone(),
            capacity: self.capacity,
            paced: self.paced,
            reserved,
            min_latency_ns: 2 * self.blocking_ns + 1,
            best_effort_weight: self.best_effort_weight,
            window_s: self.window_s,
            flows,
        }
    }

    /// Answers a QoS-interface request. `admin`: the caller may change specs.
    pub fn control(
        &mut self,
        req: ControlRequest,
        admin: bool,
        sched: &mut Scheduler,
    ) -> ControlReply {
        let refuse = |what: &str| ControlReply::Error {
            message: format!(
                "{what} needs root or the network service's own user (the QoS interface is \
                 for tessd, the broker and administrators)"
            ),
        };
        match req {
            ControlRequest::Flows => ControlReply::Flows(self.table()),
            ControlRequest::Set { .. }
            | ControlRequest::Clear { .. }
            | ControlRequest::ClearAll
                if !admin =>
            {
                refuse("changing a flow's spec")
            }
            ControlRequest::Set { flow, spec } => {
                if !valid_key(&flow) {
                    return ControlReply::Error {
                        message: format!(
                            "flow key {flow:?} must be cell:NAME or pid:N, optionally followed by /LABEL"
                        ),
                    };
                }
                match self.set_spec(&flow, Some(spec), sched) {
                    Ok(()) => ControlReply::Ok,
                    Err(e) => ControlReply::Error {
                        message: e.to_string(),
                    },
                }
            }
            ControlRequest::Clear { flow } => match self.set_spec(&flow, None, sched) {
                Ok(()) => {
                    if let Some(&i) = self.index.get(&flow) {
                        self.forget_if_idle(i);
                    }
                    ControlReply::Ok
                }
                Err(e) => ControlReply::Error {
                    message: e.to_string(),
                },
            },
            ControlRequest::ClearAll => {
                let keys: Vec<String> = self
                    .live()
                    .filter(|f| f.spec.is_some())
                    .map(|f| f.key.clone())
                    .collect();
                for k in keys {
                    // Removing specs always fits.
                    let _ = self.set_spec(&k, None, sched);
                }
                ControlReply::Ok
            }
        }
    }
}

/// `cell:NAME` or `pid:N`, then `/LABEL` for a labelled flow.
fn valid_key(k: &str) -> bool {
    let k = match k.split_once('/') {
        Some((base, label)) if tess_net_client::qos::valid_flow_label(label) => base,
        Some(_) => return false,
        None => k,
    };
    match k.split_once(':') {
        Some(("cell", name)) => !name.is_empty() && name.len() <= 64,
        Some(("pid", n)) => n.parse::<i32>().is_ok_and(|n| n > 0),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (Flows, Scheduler) {
        let cap = Throughput {
            pps: 250_000,
            bps: 1_000_000_000,
        };
        let mut sched = Scheduler::new(Link::new(cap));
        let flows = Flows::new("net", cap, true, 20_000, 1, &mut sched);
        (flows, sched)
    }

    fn reserve(bps: u64) -> QosSpec {
        QosSpec {
            reservation: Throughput::bits(bps),
            ..QosSpec::default()
        }
    }

    #[test]
    fn keys_name_a_cell_or_a_process_and_maybe_a_label() {
        for k in ["cell:video", "cell:video/s3", "pid:7", "pid:7/a.b-c_d"] {
            assert!(valid_key(k), "{k}");
        }
        for k in [
            "video",
            "cell:",
            "cell:v/",
            "cell:v/a/b",
            "cell:v/a b",
            "pid:0/x",
            "pid:x",
        ] {
            assert!(!valid_key(k), "{k}");
        }
        assert_eq!(published_name("cell:video/s3"), "net-video-F-s3");
    }

    #[test]
    fn labelled_flows_are_counted_per_cell() {
        let (mut f, _s) = setup();
        for k in ["cell:v", "cell:v/a", "cell:v/b", "cell:vv/a", "pid:3/a"] {
            f.row_for(k);
        }
        assert_eq!(f.labelled("cell:v"), 2);
        assert_eq!(f.labelled("cell:vv"), 1);
        assert_eq!(f.labelled("pid:3"), 1);
        assert!(f.has("cell:v/a") && !f.has("cell:v/c"));
    }

    #[test]
    fn flows_publish_under_their_cells_name() {
        assert_eq!(published_name("cell:music-synth"), "net-music-synth");
        assert_eq!(published_name("pid:4242"), "net-pid-4242");
        assert_eq!(published_name("cell:a.b"), "net-a-b");
        let long = published_name(&format!("cell:{}", "x".repeat(40)));
        assert_eq!(long.len(), tess_stats::NAME_BYTES);
    }

    #[test]
    fn specs_move_flows_between_entities() {
        let (mut f, mut s) = setup();
        let i = f.row_for("cell:synth");
        assert_eq!(f.get(i).entity, f.best_effort());
        f.set_spec("cell:synth", Some(reserve(240_000_000)), &mut s)
            .unwrap();
        let e = f.get(i).entity;
        assert_ne!(e, f.best_effort());
        assert!((s.spec(e).unwrap().share - 0.24).abs() < 1e-9);
        f.set_spec("cell:synth", None, &mut s).unwrap();
        assert_eq!(f.get(i).entity, f.best_effort());
        assert!(s.spec(e).is_none());
    }

    #[test]
    fn over_commitment_is_refused_with_the_amount() {
        let (mut f, mut s) = setup();
        f.set_spec("cell:a", Some(reserve(600_000_000)), &mut s)
            .unwrap();
        let r = f.control(
            ControlRequest::Set {
                flow: "cell:b".into(),
                spec: reserve(500_000_000),
            },
            true,
            &mut s,
        );
        let ControlReply::Error { message } = r else {
            panic!("{r:?}")
        };
        assert!(message.contains("over by 10.0%"), "{message}");
        assert!(message.contains("100.0 Mbit/s"), "{message}");
        // Nothing changed.
        assert!(f.table().flow("cell:b").is_none_or(|b| b.spec.is_none()));
    }

    #[test]
    fn only_admins_change_specs() {
        let (mut f, mut s) = setup();
        let r = f.control(ControlRequest::ClearAll, false, &mut s);
        assert!(matches!(r, ControlReply::Error { .. }));
        assert!(matches!(
            f.control(ControlRequest::Flows, false, &mut s),
            ControlReply::Flows(_)
        ));
        let bad = f.control(
            ControlRequest::Set {
                flow: "synth".into(),
                spec: reserve(1),
            },
            true,
            &mut s,
        );
        assert!(matches!(bad, ControlReply::Error { .. }));
    }

    #[test]
    fn windows_turn_counters_into_rates() {
        let (mut f, _s) = setup();
        let i = f.row_for("pid:7");
        f.get_mut(i).totals.tx_packets = 500;
        f.get_mut(i).totals.tx_bytes = 500 * 1000;
        f.close_window(0.5);
        let r = f.get(i).rates;
        assert_eq!(r.tx_pps, 1000.0);
        assert_eq!(r.tx_bps, 8_000_000.0);
        f.close_window(0.5);
        assert_eq!(f.get(i).rates.tx_pps, 0.0);
    }
}
