//! The broker's service loop (seed 004 section 5.1): accept heartbeats, measure each cell's
//! rate every decision period, ask the policy for shares (POTA: one controller per cell;
//! PACORA: all cells together, [`crate::pacora::policy`]), apply them through tessd
//! transactions.
//!
//! What it never does, whatever a cell writes into its heartbeat:
//! - change a pinned cell, or a dedicated or best-effort one (reported as the reason);
//! - go outside a cell's floor and ceiling (the controller clamps);
//! - decide more often than once per decision period per cell (a heartbeat flood only makes a
//!   high rate, read in bounded time: one ring);
//! - grant what tessd's admission control refuses: a refused change leaves the last good
//!   allocation in force, and the controller continues from it.
//!
//! Its state lives in tessd (the cells' windows and budgets) and in the cells' heartbeats, which
//! re-register when the broker restarts; the models are re-learned within a few periods.
//!
//! With PACORA and a `[network]` section, network bandwidth is a second resource: a heartbeat
//! named `NAME.net` ([`NET_SUFFIX`]) measures the cell's flow at the network service, one named
//! `NAME@LABEL.net` its labelled flow `LABEL` ([`flow_label`]; a cell gives each of its
//! streams a flow and a heartbeat of its own), the flows share the configured link (a PACORA
//! pool of its own, in Mbit/s), and a flow's share becomes its reservation and its limit
//! ([`Flows`]).

use crate::config::{Config, Policy};
use crate::pacora::policy::{Allocation, AllocationReason, CellView, Pacora};
use crate::pota::{Decision, Pota, Reason};
use crate::share;
use crate::status::{BrokerStatus, CellStatus, DecisionRecord, KEEP_DECISIONS};
use std::collections::VecDeque;
use std::os::unix::net::UnixStream;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tess_heartbeat::clock::now_ns;
use tess_heartbeat::register::{Incoming, Listener};
use tess_heartbeat::HeartbeatReader;
use tess_proto::{Body, CellInfo, Client, Request};

/// Most heartbeats the broker reads at once (more registrations are refused).
pub const MAX_HEARTBEATS: usize = 64;
/// A heartbeat whose name ends so measures its cell's network flow, not its CPU.
pub const NET_SUFFIX: &str = ".net";
/// PACORA's pool of harts.
pub const CPU_POOL: usize = 0;
/// PACORA's pool of the network service's link, Mbit/s (with `[network]`).
pub const NET_POOL: usize = 1;

/// What a heartbeat's allocation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    /// The cell's CPU share (harts), through tessd.
    Cpu,
    /// The cell's flow at the network service (Mbit/s).
    Net,
}

impl Resource {
    /// The resource a heartbeat named `name` measures.
    pub fn of_heartbeat(name: &str) -> Resource {
        if name.ends_with(NET_SUFFIX) {
            Resource::Net
        } else {
            Resource::Cpu
        }
    }

    /// `cpu` or `net`.
    pub fn name(self) -> &'static str {
        match self {
            Resource::Cpu => "cpu",
            Resource::Net => "net",
        }
    }
}

/// Separates a flow heartbeat's name from the label of the flow it measures.
pub const FLOW_LABEL_SEPARATOR: char = '@';

/// The flow label a network heartbeat names: `None` for `NAME.net` (the cell's own flow),
/// `Some(LABEL)` for `NAME@LABEL.net`; an error for an empty NAME, a second `@`, or a label the
/// network service would refuse.
pub fn flow_label(heartbeat: &str) -> Result<Option<&str>, String> {
    let stem = heartbeat.strip_suffix(NET_SUFFIX).unwrap_or(heartbeat);
    let Some((name, label)) = stem.split_once(FLOW_LABEL_SEPARATOR) else {
        return Ok(None);
    };
    if name.is_empty() || label.contains(FLOW_LABEL_SEPARATOR) {
        return Err(format!(
            "heartbeat '{heartbeat}' must be NAME@LABEL.net with a NAME and one '@'"
        ));
    }
    if !tess_net_client::qos::valid_flow_label(label) {
        return Err(format!(
            "heartbeat '{heartbeat}' names flow label {label:?}, which is not 1 to {} characters of A-Z a-z 0-9 _ . -",
            tess_net_client::qos::MAX_FLOW_LABEL
        ));
    }
    Ok(Some(label))
}

/// Most flow heartbeats one cell may have (its own flow and its labelled ones): each holds a
/// slot of the broker's [`MAX_HEARTBEATS`] and a floor of the link, so a cell inventing labels
/// could otherwise take both from the others.
pub const MAX_FLOWS_PER_CELL: usize = 16;

/// How the broker sets a flow at the network service. A flow is named `CELL` (the cell's own
/// flow, key `cell:CELL` at the service) or `CELL/LABEL` (a labelled flow, `cell:CELL/LABEL`).
pub trait Flows {
    /// Gives flow `flow` `mbps` Mbit/s as its reservation and its limit.
    fn set(&mut self, flow: &str, mbps: f64) -> anyhow::Result<()>;
    /// Makes flow `flow` best effort again (its heartbeat is gone).
    fn clear(&mut self, flow: &str) -> anyhow::Result<()>;
}

/// [`Flows`] through a network service's QoS interface (connected lazily, and again after a
/// failure). A request waits at most [`FLOW_REPLY_TIMEOUT`] for the service, and after a
/// failure the service is left alone for [`FLOW_RETRY_AFTER`]: a stalled service delays the
/// broker's round by a fraction of a second, not by 15 s per flow.
pub struct NetService {
    net: tess_net_client::Net,
    control: Option<tess_net_client::Control>,
    /// `CLOCK_MONOTONIC` ns before which no request is tried (after a failure).
    quiet_until_ns: u64,
}

/// Longest wait for the network service's answer to one request.
pub const FLOW_REPLY_TIMEOUT: Duration = Duration::from_millis(200);
/// How long the broker leaves a network service alone after it failed to answer.
pub const FLOW_RETRY_AFTER: Duration = Duration::from_secs(5);

impl NetService {
    /// The service named `name` at tessd's nameserver.
    pub fn named(name: &str) -> NetService {
        NetService {
            net: tess_net_client::Net::named(name),
            control: None,
            quiet_until_ns: 0,
        }
    }

    /// Sends `req` (connecting first if needed); a failure other than a refusal drops the
    /// connection and quiets the service for a while.
    fn call(&mut self, req: &tess_net_client::ControlRequest) -> anyhow::Result<()> {
        let now = now_ns();
        if now < self.quiet_until_ns {
            anyhow::bail!(
                "the network service failed a moment ago; trying again in {} ms",
                (self.quiet_until_ns - now) / 1_000_000
            );
        }
        let result = self.try_call(req);
        if let Err(e) = &result {
            let refused = e
                .downcast_ref::<tess_net_client::ControlError>()
                .is_some_and(|e| matches!(e, tess_net_client::ControlError::Refused(_)));
            if !refused {
                self.control = None;
                self.quiet_until_ns = now_ns() + FLOW_RETRY_AFTER.as_nanos() as u64;
            }
        }
        result
    }

    fn try_call(&mut self, req: &tess_net_client::ControlRequest) -> anyhow::Result<()> {
        if self.control.is_none() {
            let mut c = self.net.control()?;
            c.set_reply_timeout(FLOW_REPLY_TIMEOUT);
            self.control = Some(c);
        }
        let c = self.control.as_mut().expect("just connected");
        c.call(req)?;
        Ok(())
    }
}

impl std::fmt::Debug for NetService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NetService({:?})", self.net)
    }
}

impl Flows for NetService {
    fn set(&mut self, flow: &str, mbps: f64) -> anyhow::Result<()> {
        use tess_net_client::{qos::flow_key, ControlRequest, QosSpec, Throughput};
        let rate = Throughput::bits((mbps * 1e6).round() as u64);
        let spec = QosSpec {
            reservation: rate,
            limit: Some(rate),
            ..QosSpec::default()
        };
        self.call(&ControlRequest::Set {
            flow: flow_key(Some(flow), 0),
            spec,
        })
    }

    fn clear(&mut self, flow: &str) -> anyhow::Result<()> {
        self.call(&tess_net_client::ControlRequest::Clear {
            flow: tess_net_client::qos::flow_key(Some(flow), 0),
        })
    }
}

/// How the broker reaches tessd.
pub trait Cells {
    /// The cell in its current state.
    fn show(&mut self, name: &str) -> anyhow::Result<CellInfo>;
    /// The cell a process runs in.
    fn cell_of(&mut self, pid: i32) -> anyhow::Result<Option<String>>;
    /// One transaction changing the cell's window or budget.
    fn update(&mut self, name: &str, update: tess_proto::CellUpdate) -> anyhow::Result<()>;
}

/// [`Cells`] through tessd's socket.
#[derive(Debug)]
pub struct Tessd {
    client: Option<Client>,
}

impl Tessd {
    /// Connects lazily (and again after tessd restarts).
    pub fn new() -> Tessd {
        Tessd { client: None }
    }

    fn call(&mut self, req: &Request) -> anyhow::Result<Body> {
        if self.client.is_none() {
            self.client = Some(Client::connect_default()?);
        }
        let c = self.client.as_mut().expect("just connected");
        match c.call(req) {
            Ok(b) => Ok(b),
            Err(e) => {
                if !matches!(e, tess_proto::ApiError::Daemon { .. }) {
                    self.client = None;
                }
                Err(e.into())
            }
        }
    }
}

impl Default for Tessd {
    fn default() -> Self {
        Tessd::new()
    }
}

impl Cells for Tessd {
    fn show(&mut self, name: &str) -> anyhow::Result<CellInfo> {
        match self.call(&Request::ShowCell { name: name.into() })? {
            Body::Cell(c) => Ok(*c),
            other => anyhow::bail!("unexpected reply {other:?}"),
        }
    }

    fn cell_of(&mut self, pid: i32) -> anyhow::Result<Option<String>> {
        match self.call(&Request::ListCells)? {
            Body::Cells { cells } => Ok(cells
                .into_iter()
                .find(|c| c.processes.contains(&pid))
                .map(|c| c.name)),
            other => anyhow::bail!("unexpected reply {other:?}"),
        }
    }

    fn update(&mut self, name: &str, update: tess_proto::CellUpdate) -> anyhow::Result<()> {
        self.call(&Request::UpdateCell {
            name: name.into(),
            update,
        })?;
        Ok(())
    }
}

/// A cell the broker may change, as tessd has it now.
struct Target {
    info: CellInfo,
    /// Its share in force, harts.
    current: f64,
    cfg: crate::pota::PotaConfig,
    /// Target rate, units per second.
    target: f64,
}

/// Records one decision in the cell's recent history.
fn record(b: &mut Brokered, rate: f64, from: f64, to: f64, reason: &str, note: String) {
    // Rounds that hold for want of an event collapse into one record, so that the history
    // keeps the decisions that changed something.
    if let Some(last) = b.decisions.back_mut().filter(|d| {
        reason == AllocationReason::NoEvent.as_str() && d.reason == reason && d.to == to
    }) {
        last.at_unix_ms = unix_ms();
        last.rate = rate;
        last.note = note;
        last.rounds += 1;
        return;
    }
    if b.decisions.len() >= KEEP_DECISIONS {
        b.decisions.pop_front();
    }
    b.decisions.push_back(DecisionRecord {
        at_unix_ms: unix_ms(),
        rate,
        from,
        to,
        reason: reason.into(),
        note,
        rounds: 1,
    });
}

/// One heartbeat the broker reads.
#[derive(Debug)]
struct Brokered {
    cell: String,
    /// What its allocation is of, by name: the cell for CPU; for the network the flow, `CELL`
    /// or `CELL/LABEL` (the name in its pool, and at the network service).
    key: String,
    resource: Resource,
    /// A CPU heartbeat whose units also need the cell's own flow (`network = true` in the
    /// broker's configuration): one PACORA entry of both pools. Read once, when it registers.
    joint: bool,
    pid: i32,
    conn: UnixStream,
    reader: HeartbeatReader,
    pota: Option<Pota>,
    last_decision_ns: u64,
    status: CellStatus,
    decisions: VecDeque<DecisionRecord>,
    /// Each decision period as `tess top` and Prometheus see it (crate `tess-stats`, runtime
    /// `hb-CELL` under the broker's own cell): the mean time between the cell's heartbeats,
    /// a miss when the rate fell below 95% of its target.
    published: Option<tess_stats::Publisher>,
}

impl Brokered {
    /// Its name in the PACORA policy: the cell for a CPU heartbeat, `net:FLOW` for a flow's
    /// (a cell and its own flow would otherwise share a name; no cell name has a `:`).
    fn entry(&self) -> String {
        match self.resource {
            Resource::Cpu => self.cell.clone(),
            Resource::Net => format!("net:{}", self.key),
        }
    }

    /// The Mbit/s its flow holds: a flow heartbeat's share, or the flow a CPU heartbeat's
    /// units need (`network = true`).
    fn flow_share(&self) -> f64 {
        match self.resource {
            Resource::Net => self.status.share,
            Resource::Cpu => self.status.flow_share.unwrap_or(0.0),
        }
    }
}

/// A decision period counts as on target at 95% of the target rate or more (as `tess bench
/// pota` counts windows).
pub const ON_TARGET: f64 = 0.95;

/// The broker.
pub struct Broker<C: Cells> {
    config: Config,
    cells: C,
    brokered: Vec<Brokered>,
    refused: VecDeque<String>,
    /// The PACORA policy's samples and models (policy `pacora`): the harts and, with
    /// `[network]`, the link, in one policy.
    pacora: Pacora,
    /// How flows' shares are applied (`[network]`).
    flows: Option<Box<dyn Flows + Send>>,
}

impl<C: Cells + std::fmt::Debug> std::fmt::Debug for Broker<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("config", &self.config)
            .field("cells", &self.cells)
            .field("brokered", &self.brokered)
            .field("pacora", &self.pacora)
            .finish()
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl<C: Cells> Broker<C> {
    /// A broker with no heartbeats yet.
    pub fn new(config: Config, cells: C) -> Broker<C> {
        let flows = config
            .network
            .as_ref()
            .map(|n| Box::new(NetService::named(&n.service)) as Box<dyn Flows + Send>);
        Broker {
            pacora: Pacora::with_pools(config.pacora.clone(), config.pools()),
            flows,
            config,
            cells,
            brokered: Vec::new(),
            refused: VecDeque::new(),
        }
    }

    /// Sets flows through `flows` instead of the configured network service (tests, or a
    /// service reached another way). Needs a `[network]` section.
    pub fn with_flows(mut self, flows: Box<dyn Flows + Send>) -> Broker<C> {
        if let Some(f) = self.flows.as_mut() {
            *f = flows;
        }
        self
    }

    fn refuse(&mut self, conn: &UnixStream, why: String) {
        Incoming::refuse(conn, &why);
        if self.refused.len() >= KEEP_DECISIONS {
            self.refused.pop_front();
        }
        self.refused.push_back(why);
    }

    /// Takes one registration: finds the cell of the registering process, refuses what cannot be
    /// brokered.
    pub fn admit(&mut self, inc: Incoming) {
        if self.brokered.len() >= MAX_HEARTBEATS {
            return self.refuse(
                &inc.conn,
                format!("the broker reads {MAX_HEARTBEATS} heartbeats already"),
            );
        }
        let cell = match self.cells.cell_of(inc.pid) {
            Ok(Some(c)) => c,
            Ok(None) => {
                return self.refuse(&inc.conn, format!("process {} runs in no cell", inc.pid))
            }
            Err(e) => return self.refuse(&inc.conn, format!("cannot ask tessd: {e:#}")),
        };
        let resource = Resource::of_heartbeat(&inc.hello.name);
        if resource == Resource::Net && self.flows.is_none() {
            let why = format!(
                "heartbeat '{}' measures a network flow, but the broker allocates no network ([network] with policy = \"pacora\")",
                inc.hello.name
            );
            return self.refuse(&inc.conn, why);
        }
        let key = match resource {
            Resource::Cpu => cell.clone(),
            Resource::Net => match flow_label(&inc.hello.name) {
                Ok(None) => cell.clone(),
                Ok(Some(label)) => format!("{cell}/{label}"),
                Err(why) => return self.refuse(&inc.conn, why),
            },
        };
        let flows_of_cell = self
            .brokered
            .iter()
            .filter(|b| b.cell == cell && b.resource == Resource::Net)
            .count();
        if resource == Resource::Net && self.config.joint(&key) {
            let why = format!(
                "flow '{key}' is allocated with cell {cell}'s CPU (network = true): heartbeat '{}' is not needed",
                inc.hello.name
            );
            return self.refuse(&inc.conn, why);
        }
        if resource == Resource::Net && flows_of_cell >= MAX_FLOWS_PER_CELL {
            let why = format!(
                "cell '{cell}' has {MAX_FLOWS_PER_CELL} flow heartbeats already (heartbeat '{}')",
                inc.hello.name
            );
            return self.refuse(&inc.conn, why);
        }
        if let Some(b) = self
            .brokered
            .iter()
            .find(|b| b.key == key && b.resource == resource)
        {
            let why = match resource {
                Resource::Cpu => format!(
                    "cell '{cell}' already has cpu heartbeat '{}'",
                    b.status.heartbeat
                ),
                Resource::Net => format!(
                    "flow '{key}' already has heartbeat '{}'",
                    b.status.heartbeat
                ),
            };
            return self.refuse(&inc.conn, why);
        }
        let reader = match HeartbeatReader::open(inc.fd) {
            Ok(r) => r,
            Err(e) => return self.refuse(&inc.conn, format!("from pid {}: {e}", inc.pid)),
        };
        if reader.name() != inc.hello.name {
            return self.refuse(
                &inc.conn,
                "the name in the region differs from the registration".into(),
            );
        }
        Incoming::accept(&inc.conn);
        let _ = inc.conn.set_nonblocking(true);
        let joint = resource == Resource::Cpu && self.config.joint(&cell);
        let prefix = match resource {
            Resource::Cpu => "hb-",
            Resource::Net => "hb-net-",
        };
        let published = tess_stats::Publisher::try_create(
            &tess_net_client::qos::flow_page_name(prefix, &key),
            None,
        );
        self.brokered.push(Brokered {
            status: CellStatus {
                cell: cell.clone(),
                heartbeat: reader.name().to_string(),
                pid: inc.pid,
                resource: if joint { "cpu+net" } else { resource.name() }.into(),
                flow: (resource == Resource::Net || joint).then(|| key.clone()),
                ..Default::default()
            },
            resource,
            joint,
            key,
            cell,
            pid: inc.pid,
            conn: inc.conn,
            reader,
            pota: None,
            last_decision_ns: now_ns(),
            decisions: VecDeque::new(),
            published,
        });
        let i = self.brokered.len() - 1;
        if resource == Resource::Net {
            let (floor, ceiling) = self.config.flow_limits(&self.brokered[i].key);
            self.brokered[i].status.floor = floor;
            self.brokered[i].status.ceiling = ceiling;
        }
        if resource == Resource::Net || joint {
            // The flow's first period is measured at a share the broker set.
            self.start_flow(i, 0.0);
        }
    }

    /// Gives heartbeat `i`'s flow its first share ([`Broker::initial_flow`]) and records it
    /// (measured at `rate`); a refusal is recorded, and the flow holds nothing.
    fn start_flow(&mut self, i: usize, rate: f64) {
        let initial = self.initial_flow(i);
        let outcome = self.set_flow(i, initial);
        let b = &mut self.brokered[i];
        let (from, to) = match b.resource {
            Resource::Net => (0.0, b.status.share),
            Resource::Cpu => (b.status.share, b.status.share),
        };
        match outcome {
            Ok(()) if b.joint => {
                let note = format!("flow {initial:.3} Mbit/s");
                record(b, rate, from, to, "initial", note)
            }
            Ok(()) => record(b, rate, from, to, "initial", String::new()),
            Err(why) => record(b, rate, from, to, "refused", format!("initial {why}")),
        }
    }

    /// The share heartbeat `i`'s flow starts at: its `initial`, never more than the other
    /// flows leave of the link.
    fn initial_flow(&self, i: usize) -> f64 {
        let others = self.flows_held_except(i);
        let capacity = self.config.network.as_ref().map_or(0.0, |n| n.capacity);
        self.config
            .flow_initial(&self.brokered[i].key)
            .min((capacity - others).max(0.0))
    }

    /// What every heartbeat holds now, per pool of the policy: harts (CPU heartbeats' shares
    /// as last read from tessd) and, with `[network]`, Mbit/s (every flow's).
    fn held_per_pool(&self) -> Vec<f64> {
        let mut held = vec![0.0; self.pacora.pools()];
        for b in &self.brokered {
            if b.resource == Resource::Cpu {
                held[CPU_POOL] += b.status.share;
            }
        }
        if let Some(net) = held.get_mut(NET_POOL) {
            *net = self.flows_held();
        }
        held
    }

    /// The Mbit/s every flow holds now (flows of their own, and the flows of cells whose CPU
    /// heartbeats need them).
    fn flows_held(&self) -> f64 {
        self.brokered.iter().map(Brokered::flow_share).sum()
    }

    /// The Mbit/s every flow but heartbeat `i`'s holds now.
    fn flows_held_except(&self, i: usize) -> f64 {
        self.flows_held() - self.brokered[i].flow_share()
    }

    /// Gives heartbeat `i`'s flow `to` Mbit/s; a refusal leaves the share in force and says
    /// why.
    fn set_flow(&mut self, i: usize, to: f64) -> Result<(), String> {
        let Some(flows) = self.flows.as_mut() else {
            return Err("the broker allocates no network".into());
        };
        let b = &mut self.brokered[i];
        match flows.set(&b.key, to) {
            Ok(()) => {
                match b.resource {
                    Resource::Net => b.status.share = to,
                    Resource::Cpu => b.status.flow_share = Some(to),
                }
                self.pacora.applied(&b.entry(), NET_POOL, to);
                Ok(())
            }
            Err(e) => Err(format!("flow to {to:.3} Mbit/s: {e:#}")),
        }
    }

    /// Drops heartbeats whose process hung up; returns whether any did.
    pub fn reap(&mut self) -> bool {
        let before = self.brokered.len();
        let mut gone_flows = Vec::new();
        self.brokered.retain(|b| {
            use std::io::Read;
            let mut buf = [0u8; 16];
            let alive = !matches!((&b.conn).read(&mut buf), Ok(0));
            // A flow heartbeat's flow, or a joint cell's once it was set.
            if !alive && (b.resource == Resource::Net || b.status.flow_share.is_some()) {
                gone_flows.push(b.key.clone());
            }
            alive
        });
        // A flow whose heartbeat is gone gives its reservation back to the service, so that
        // what the pool counts as free is free there too.
        if let Some(flows) = self.flows.as_mut() {
            for flow in gone_flows {
                if let Err(e) = flows.clear(&flow) {
                    self.refused
                        .push_back(format!("clearing flow {flow}: {e:#}"));
                    if self.refused.len() > KEEP_DECISIONS {
                        self.refused.pop_front();
                    }
                }
            }
        }
        self.brokered.len() != before
    }

    /// Runs the decisions that are due. Returns whether any ran. Under PACORA all cells are
    /// decided together, once a period (when the first of them is due).
    pub fn decide_due(&mut self) -> bool {
        let now = now_ns();
        let period = self.config.period.as_nanos() as u64;
        if self.config.policy == Policy::Pacora {
            let due = self
                .brokered
                .iter()
                .any(|b| now.saturating_sub(b.last_decision_ns) >= period);
            if due {
                self.decide_all(now);
            }
            return due;
        }
        let mut any = false;
        for i in 0..self.brokered.len() {
            if now.saturating_sub(self.brokered[i].last_decision_ns) >= period {
                self.decide(i, now);
                any = true;
            }
        }
        any
    }

    /// Reads cell `i`'s new beats since its last decision and returns the rate over the
    /// broker's own clock and the mean value its beats carried, if they carried any (and
    /// publishes the period).
    fn measure(&mut self, i: usize, now: u64) -> (f64, Option<f64>) {
        let b = &mut self.brokered[i];
        let elapsed_s = (now - b.last_decision_ns) as f64 / 1e9;
        b.last_decision_ns = now;
        let reading = b.reader.read_new(now);
        let rate = reading.new_count as f64 / elapsed_s;
        let a = &mut b.status.anomalies;
        a.unreadable += reading.unreadable;
        a.bad_timestamps += reading.bad_timestamps;
        a.count_went_back += reading.count_went_back as u64;
        a.bad_target += reading.bad_target as u64;
        b.status.beats = reading.count;
        b.status.measured_rate = rate;
        b.status.target_rate = reading.target_ns.map(|ns| 1e9 / ns as f64);
        let values: Vec<u64> = reading
            .beats
            .iter()
            .map(|beat| beat.value)
            .filter(|&v| v > 0)
            .collect();
        let mean = match b.resource {
            // A flow's demand steps (a resized stream) and its queue drains only at the share
            // it is given above the demand: see `demand_of`.
            Resource::Net => demand_of(&values),
            // The CPU's is the plain mean: it is measured over many more beats, and the max
            // of two noisy means would bias it up every period.
            Resource::Cpu => (!values.is_empty())
                .then(|| values.iter().map(|&v| v as f64).sum::<f64>() / values.len() as f64),
        };
        b.status.measured_value = mean;
        b.status.measured_tau_ms = match b.resource {
            // The unit's CPU time at the share in force.
            Resource::Cpu => mean
                .filter(|_| b.status.share > 0.0)
                .map(|ns| ns / 1e6 / b.status.share),
            // Set by flow_view, from the unit size and the share.
            Resource::Net => None,
        };
        if let Some(p) = &b.published {
            let window_ns = (elapsed_s * 1e9) as u64;
            let interval_ns = window_ns / reading.new_count.max(1);
            let missed = b.status.target_rate.is_some_and(|t| rate < ON_TARGET * t);
            p.record_judged(interval_ns, missed);
        }
        (rate, mean)
    }

    /// Asks tessd for cell `i` and checks that the broker may change it. `Err` holds the
    /// decision already recorded (unreachable, not brokered, pinned, no target).
    fn brokerable(&mut self, i: usize, rate: f64) -> Result<Target, ()> {
        let b = &mut self.brokered[i];
        let info = match self.cells.show(&b.cell) {
            Ok(c) => c,
            Err(e) => {
                let s = b.status.share;
                record(b, rate, s, s, "tessd-unreachable", format!("{e:#}"));
                return Err(());
            }
        };
        let harts = info.harts.len();
        let Some(current) = share::share_of(&info.policy, harts) else {
            let s = b.status.share;
            let why = format!("a {} cell is not brokered", info.policy.describe());
            record(b, rate, s, s, "not-brokered", why);
            return Err(());
        };
        b.status.share = current;
        let cfg = self.config.controller_with(&b.cell, harts, &info.broker);
        b.status.floor = cfg.floor;
        b.status.ceiling = cfg.ceiling;
        if info.pinned {
            record(b, rate, current, current, "pinned", String::new());
            return Err(());
        }
        let Some(target) = b.status.target_rate else {
            record(b, rate, current, current, "no-target", String::new());
            return Err(());
        };
        Ok(Target {
            info,
            current,
            cfg,
            target,
        })
    }

    /// Applies `to` to cell `i` (one tessd transaction) and records the decision; a refusal
    /// leaves the share in force.
    fn apply(&mut self, i: usize, t: &Target, rate: f64, to: f64, reason: &str, note: String) {
        match self.apply_share(i, t, to) {
            Ok(()) => record(&mut self.brokered[i], rate, t.current, to, reason, note),
            Err(e) => {
                let why = format!("{reason} to {to:.3}: {e}");
                record(
                    &mut self.brokered[i],
                    rate,
                    t.current,
                    t.current,
                    "refused",
                    why,
                );
            }
        }
    }

    /// Gives cell `i` `to` harts (one tessd transaction); a refusal (admission, or tessd
    /// failing) leaves the last good allocation in force, and the controller continues from it.
    fn apply_share(&mut self, i: usize, t: &Target, to: f64) -> Result<(), String> {
        let harts = t.info.harts.len();
        let update = share::update_for(&t.info.policy, harts, to).expect("brokered policy");
        let b = &mut self.brokered[i];
        match self.cells.update(&b.cell, update) {
            Ok(()) => {
                b.status.share = to;
                Ok(())
            }
            Err(e) => {
                if let Some(p) = b.pota.as_mut() {
                    p.force_share(t.current);
                }
                Err(format!("{e:#}"))
            }
        }
    }

    fn decide(&mut self, i: usize, now: u64) {
        let (rate, _) = self.measure(i, now);
        let Ok(t) = self.brokerable(i, rate) else {
            return;
        };
        let b = &mut self.brokered[i];
        let pota = b
            .pota
            .get_or_insert_with(|| Pota::new(t.cfg, t.target, t.current));
        pota.set_target(t.target);
        pota.set_limits(t.cfg.floor, t.cfg.ceiling);
        // Someone else (or a refused change) set the share: continue from what is in force.
        if (pota.share() - t.current).abs() > 1e-6 {
            pota.force_share(t.current);
        }
        let d: Decision = pota.step(rate);
        let [ma, mb] = pota.model();
        b.status.model_a = ma;
        b.status.model_b = mb;
        let reason = DecisionRecord::reason_name(d.reason);
        let note = format!("wanted {:.3}", d.wanted);
        if !d.changed || d.reason == Reason::BadMeasurement {
            return record(b, rate, t.current, t.current, &reason, note);
        }
        self.apply(i, &t, rate, d.share, &reason, note);
    }

    /// One PACORA round over every brokered heartbeat (policy `pacora`): all are measured, the
    /// allocation is decided for all together (one problem over the harts and the link), and
    /// changes are applied lowerings first, so that tessd's admission (or the network
    /// service's) sees what is given back before what is taken.
    fn decide_all(&mut self, now: u64) {
        let present: Vec<String> = self.brokered.iter().map(Brokered::entry).collect();
        self.pacora
            .retain(&present.iter().map(String::as_str).collect::<Vec<_>>());
        let period = self.config.period.as_nanos() as u64;
        let mut views = Vec::new();
        // Per view: its heartbeat and, for a CPU share, the cell as tessd has it.
        let mut of: Vec<(usize, Option<Target>)> = Vec::new();
        for i in 0..self.brokered.len() {
            // A cell registered moments ago would give a rate over a sliver of a period: it
            // waits for the next round.
            if now.saturating_sub(self.brokered[i].last_decision_ns) < period / 2 {
                continue;
            }
            let (rate, value) = self.measure(i, now);
            if self.brokered[i].resource == Resource::Net {
                if let Some(v) = self.flow_view(i, rate, value) {
                    views.push(v);
                    of.push((i, None));
                }
                continue;
            }
            let Ok(t) = self.brokerable(i, rate) else {
                continue;
            };
            if self.brokered[i].joint && self.brokered[i].status.flow_share.is_none() {
                // Its flow's first share was refused (the service not up yet): again, before
                // the cell is decided with its flow. The period just measured ran without its
                // flow: decided from the next one.
                self.start_flow(i, rate);
                continue;
            }
            let b = &self.brokered[i];
            let mut v = CellView::single(
                &b.entry(),
                CPU_POOL,
                t.current,
                rate,
                t.target,
                t.cfg.floor,
                t.cfg.ceiling,
                self.config.slope(&b.cell),
            );
            match b.status.flow_share {
                // Its units need its flow too: one model over both (fitted from the rates
                // measured at the two shares; a CPU demand alone would not say it).
                Some(mbps) => {
                    let (floor, ceiling) = self.config.flow_limits(&b.key);
                    v.uses.push(NET_POOL);
                    v.share.push(mbps);
                    v.floor.push(floor);
                    v.ceiling.push(ceiling);
                    let b = &mut self.brokered[i];
                    b.status.measured_tau_ms = (rate > 0.0).then(|| 1e3 / rate);
                }
                None => {
                    v.known = self.plausible(i, value, rate, t.info.harts.len() as f64, 1e-9);
                }
            }
            views.push(v);
            of.push((i, Some(t)));
        }
        let allocations = self.pacora.decide(&views);
        let events = self.pacora.last_events().to_vec();
        let mut refusals: Vec<Vec<String>> = vec![Vec::new(); views.len()];
        let min_step = self.config.min_step;
        let short = short_of_room(
            &self.held_per_pool(),
            &views,
            &allocations,
            |p| self.pacora.capacity(p),
            min_step,
        );
        for (k, j) in lowerings_first(&views, &allocations, |p| self.pacora.capacity(p)) {
            let ((i, t), v) = (&of[k], &views[k]);
            let to = allocations[k].share[j];
            // Applied however small: a step the policy takes to learn or to approach
            // (`held_back`), and a lowering in a pool whose raises need the room it gives back.
            let needed = to < v.share[j] && short[v.uses[j]];
            let a = &allocations[k];
            let applied = match v.uses[j] {
                CPU_POOL => {
                    let t = t.as_ref().expect("a CPU share has its cell");
                    if held_back(min_step, v, a, j, t.current, to) && !needed {
                        continue;
                    }
                    let r = self.apply_share(*i, t, to);
                    self.pacora
                        .applied(&v.cell, CPU_POOL, self.brokered[*i].status.share);
                    r
                }
                _ => {
                    // What the other flows hold now (a lowering held back by the hysteresis,
                    // or refused, still holds its share): a raise takes no more than is free.
                    let others = self.flows_held_except(*i);
                    let capacity = self.pacora.capacity(NET_POOL);
                    let to = to.min((capacity - others).max(v.share[j]));
                    if held_back(min_step, v, a, j, v.share[j], to) && !needed {
                        continue;
                    }
                    self.set_flow(*i, to)
                }
            };
            if let Err(why) = applied {
                refusals[k].push(why);
            }
        }
        for (k, (v, a)) in views.iter().zip(&allocations).enumerate() {
            let b = &mut self.brokered[of[k].0];
            b.status.response_model = a.model.clone();
            let mut note = decision_note(a, &events);
            if v.uses.len() > 1 {
                let flow = format!("flow {:.3} -> {:.3} Mbit/s", v.share[1], b.flow_share());
                note = [flow, note].join("; ");
            }
            let (from, to) = (v.share[0], b.status.share);
            if refusals[k].is_empty() {
                record(b, v.rate, from, to, a.reason.as_str(), note);
            } else {
                let wanted: Vec<String> = a.share.iter().map(|s| format!("{s:.3}")).collect();
                let why = format!(
                    "{} to {}: {}",
                    a.reason,
                    wanted.join(" + "),
                    refusals[k].join("; ")
                );
                record(b, v.rate, from, to, "refused", why);
            }
        }
    }

    /// The demand model of heartbeat `i`'s period, from the mean value its beats carried
    /// (`scale` turns it into the resource's unit: ns into CPU seconds, bytes into Mbit), or
    /// `None` if they carried none or claimed the impossible: more of the resource per second,
    /// `value x rate`, than `most` (the cell's harts; the link). A cell cannot take the pool
    /// by inflating its values beyond what it could have used; within that, a cell that lies
    /// gets at most its ceiling.
    fn plausible(
        &mut self,
        i: usize,
        value: Option<f64>,
        rate: f64,
        most: f64,
        scale: f64,
    ) -> Option<crate::pacora::ResponseModel> {
        let w = value? * scale;
        if !(w.is_finite() && w * rate <= most * 1.05) {
            self.brokered[i].status.anomalies.impossible_values += 1;
            return None;
        }
        Some(demand_model(w))
    }

    /// Heartbeat `i`'s flow as PACORA sees it, or `None` (recorded why) when it has no target.
    /// A flow heartbeat's value is the unit's size in bytes ([`demand_model`]).
    fn flow_view(&mut self, i: usize, rate: f64, bytes: Option<f64>) -> Option<CellView> {
        let (floor, ceiling) = self.config.flow_limits(&self.brokered[i].key);
        let slope = self.config.flow_slope(&self.brokered[i].key);
        let b = &mut self.brokered[i];
        b.status.floor = floor;
        b.status.ceiling = ceiling;
        let share = b.status.share;
        let Some(target) = b.status.target_rate else {
            record(b, rate, share, share, "no-target", String::new());
            return None;
        };
        let capacity = self.config.network.as_ref().map_or(0.0, |n| n.capacity);
        let known = self.plausible(i, bytes, rate, capacity, 8.0 / 1e6);
        let b = &mut self.brokered[i];
        let tau = known
            .as_ref()
            .filter(|_| share > 0.0)
            .map(|m| m.eval(&[share]));
        b.status.measured_tau_ms = tau.map(|t| t * 1e3);
        let mut v = CellView::single(
            &b.entry(),
            NET_POOL,
            share,
            rate,
            target,
            floor,
            ceiling,
            slope,
        );
        v.known = known;
        Some(v)
    }

    /// The status to report.
    pub fn status(&self) -> BrokerStatus {
        BrokerStatus {
            pid: std::process::id(),
            written_unix_ms: unix_ms(),
            period_ms: self.config.period.as_millis() as u64,
            policy: match self.config.policy {
                Policy::Pota => "pota",
                Policy::Pacora => "pacora",
            }
            .into(),
            refused: self.refused.iter().cloned().collect(),
            cells: self
                .brokered
                .iter()
                .map(|b| CellStatus {
                    decisions: b.decisions.iter().cloned().collect(),
                    pid: b.pid,
                    ..b.status.clone()
                })
                .collect(),
        }
    }
}

/// The demand per unit a period's beat values say, in beat order: their mean, or the mean of
/// the newer half if that is more. A demand that steps up within the period (a video stream
/// resized to a larger encoding) is then sized for at once instead of as a mix of before and
/// after, which would leave the cell a little above its new demand and slow to work off what
/// queued meanwhile; a step down is followed a period later, when it fills the whole period.
/// `None` if no beat carried a value.
pub fn demand_of(values: &[u64]) -> Option<f64> {
    let mean = |v: &[u64]| v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
    if values.is_empty() {
        return None;
    }
    let newer = &values[values.len() / 2..];
    Some(mean(values).max(mean(newer)))
}

/// The response-time function of a cell whose beats carry each unit's *demand* `w` on the
/// resource (CPU seconds: a CPU heartbeat's value in ns; Mbit: a flow heartbeat's value in
/// bytes): at a share `a` (harts, Mbit/s) a unit takes `w / a`, PACORA's `tau(a) = tau0 + w / a`
/// with `tau0 = 0`, its parameter measured every period instead of fitted across shares.
///
/// Why not a measured latency: the cells that report demand are paced (a video stream's frames
/// arrive at 30 a second whatever it is given), so their rate says nothing about their share,
/// and their latency carries the queue an earlier, smaller share built: below its need it
/// grows without bound, and above it drains only slowly, so a latency sample depends on the
/// past as much as on the share (tried first, in `tess bench conference`: the models swung
/// between a share that starved the cell and the whole pool).
fn demand_model(w: f64) -> crate::pacora::ResponseModel {
    crate::pacora::ResponseModel {
        tau0: 0.0,
        w: vec![w],
        resources: 1,
    }
}

/// The smallest change of view `v`'s share in its pool `j` the hysteresis lets through:
/// `min_step` harts, or on the link `min_step` of the flow's ceiling (Mbit/s).
fn min_change(min_step: f64, v: &CellView, j: usize) -> f64 {
    match v.uses[j] {
        CPU_POOL => min_step,
        _ => min_step * v.ceiling[j],
    }
}

/// Whether the hysteresis holds back allocation `a`'s change of view `v`'s share in its pool
/// `j` from `from` to `to`: smaller than [`min_change`], and not a step the policy takes to
/// learn or to approach (those are applied however small).
fn held_back(min_step: f64, v: &CellView, a: &Allocation, j: usize, from: f64, to: f64) -> bool {
    !a.reason.is_step() && (to - from).abs() < min_change(min_step, v, j)
}

/// Per pool, whether the raises this round applies (those the hysteresis of `min_step` does
/// not hold back, [`held_back`]) need more room than the pool has free, `held` being what
/// every heartbeat of each pool holds now (brokered this round or not). Its lowerings are then
/// applied however small: held back by the hysteresis, several small lowerings together would
/// keep what a raise needs (see docs/broker.md). A raise the hysteresis holds back needs no
/// room.
fn short_of_room(
    held: &[f64],
    views: &[CellView],
    allocations: &[Allocation],
    capacity: impl Fn(usize) -> f64,
    min_step: f64,
) -> Vec<bool> {
    let mut need = held.to_vec();
    for (v, a) in views.iter().zip(allocations) {
        if a.reason == AllocationReason::BadView {
            continue;
        }
        for (j, &p) in v.uses.iter().enumerate() {
            let raise = a.share[j] - v.share[j];
            if raise > 0.0 && !held_back(min_step, v, a, j, v.share[j], a.share[j]) {
                need[p] += raise;
            }
        }
    }
    need.iter()
        .enumerate()
        .map(|(p, n)| *n > capacity(p) * (1.0 + 1e-9))
        .collect()
}

/// The order to apply a round's changes in, as (view, index into its pools): the largest
/// lowering first, the largest raise last, each relative to its pool's `capacity`.
fn lowerings_first(
    views: &[CellView],
    allocations: &[Allocation],
    capacity: impl Fn(usize) -> f64,
) -> Vec<(usize, usize)> {
    let mut order: Vec<(usize, usize, f64)> = views
        .iter()
        .zip(allocations)
        .enumerate()
        // A view the policy refused (`bad-view`) has nothing to apply.
        .filter(|(_, (_, a))| a.reason != AllocationReason::BadView)
        .flat_map(|(k, (v, a))| {
            let capacity = &capacity;
            (0..v.uses.len()).map(move |j| {
                let change = (a.share[j] - v.share[j]) / capacity(v.uses[j]).max(1e-9);
                (k, j, change)
            })
        })
        .collect();
    order.sort_by(|x, y| x.2.total_cmp(&y.2));
    order.into_iter().map(|(k, j, _)| (k, j)).collect()
}

/// The decision's note: what the model predicts at the allocation, and the events the round
/// solved on (none when it held: `no-event`).
fn decision_note(a: &Allocation, events: &[String]) -> String {
    let predicted = a
        .predicted_tau
        .map(|tau| format!("predicted {:.2} ms per unit", tau * 1e3));
    let on = (a.reason != AllocationReason::NoEvent && !events.is_empty())
        .then(|| format!("solved on: {}", events.join("; ")));
    [predicted, on]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join("; ")
}

/// Runs the broker until killed: accepts on `listener`, decides every period, writes the
/// status file after every round.
pub fn serve<C: Cells>(
    mut broker: Broker<C>,
    listener: &Listener,
    status_path: &std::path::Path,
) -> anyhow::Result<()> {
    listener.set_nonblocking(true)?;
    let _ = crate::status::write(status_path, &broker.status());
    loop {
        loop {
            match listener.accept() {
                Ok(Some(inc)) => broker.admit(inc),
                Ok(None) => break,
                Err(e) => {
                    // A malformed registration was answered already; note it and go on.
                    let why = format!("{e}");
                    if broker.refused.len() >= KEEP_DECISIONS {
                        broker.refused.pop_front();
                    }
                    broker.refused.push_back(why);
                }
            }
        }
        let reaped = broker.reap();
        if broker.decide_due() || reaped {
            if let Err(e) = crate::status::write(status_path, &broker.status()) {
                eprintln!("tess-broker: writing {}: {e}", status_path.display());
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::demand_of;

    #[test]
    fn a_demand_that_steps_up_is_taken_at_its_new_size() {
        assert_eq!(demand_of(&[]), None);
        assert_eq!(demand_of(&[7]), Some(7.0));
        // Steady: the mean.
        assert_eq!(demand_of(&[10, 30, 10, 30]), Some(20.0));
        // Up within the period: the newer half.
        assert_eq!(demand_of(&[800, 800, 800, 3200, 3200, 3200]), Some(3200.0));
        // Down: the mean until the period is all small.
        assert_eq!(demand_of(&[3200, 3200, 800, 800]), Some(2000.0));
        // Noise around a steady mean costs a little: at most the newer half's excess.
        let noisy = [1000, 3000, 1500, 2500, 2000, 2000, 900, 3100];
        let d = demand_of(&noisy).unwrap();
        assert!((2000.0..=2125.0).contains(&d), "{d}");
    }

    #[test]
    fn lowerings_are_needed_only_where_the_raises_outgrow_the_pool() {
        use super::short_of_room;
        use crate::pacora::policy::{Allocation, AllocationReason, CellView};
        let flow = |name: &str, share: f64, to: f64| {
            let v = CellView::single(name, 1, share, 30.0, 30.0, 0.1, 10.0, 1.0);
            let a = Allocation {
                cell: name.into(),
                share: vec![to],
                reason: AllocationReason::TradeOff,
                predicted_tau: None,
                model: None,
            };
            (v, a)
        };
        // A link of 9.5 held whole: a raise of 0.82 needs the 0.06 each of five flows gives back.
        let mut round = vec![flow("big", 0.37, 1.19), flow("hog", 7.26, 6.8)];
        round.extend((0..5).map(|k| flow(&format!("s{k}"), 0.374, 0.31)));
        let (views, allocations): (Vec<_>, Vec<_>) = round.into_iter().unzip();
        let held: f64 = views.iter().map(|v| v.share[0]).sum();
        assert!((held - 9.5).abs() < 1e-9, "{held}");
        let held = [0.0, held];
        // The service's own rule: a change applies unless the hysteresis holds it back, here
        // a change under `min_step` times the flows' ceiling of 10.
        let short = |capacity: f64, min_step: f64| {
            short_of_room(&held, &views, &allocations, |_| capacity, min_step)
        };
        assert_eq!(short(9.5, 0.05), vec![false, true]);
        // With room for the raise, they may wait.
        assert_eq!(short(10.5, 0.05), vec![false, false]);
        // A raise the hysteresis holds back (0.82 under 0.1 x 10) needs no room.
        assert_eq!(short(9.5, 0.1), vec![false, false]);
    }

    #[test]
    fn flow_heartbeat_names_say_their_label() {
        use super::flow_label;
        assert_eq!(flow_label("video.net"), Ok(None));
        assert_eq!(flow_label("video@s3.net"), Ok(Some("s3")));
        assert_eq!(flow_label("video@a.b.net"), Ok(Some("a.b")));
        for bad in ["@s3.net", "a@b@c.net", "x@.net"] {
            assert!(flow_label(bad).is_err(), "{bad}");
        }
    }
}
