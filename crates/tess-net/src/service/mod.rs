//! The network service (`tess-netd`): owns the sockets of its client cells and moves their
//! packets between the sockets and the clients' channels, in the order the [scheduler]
//! (crate::sched) decides.
//!
//! # One round of the loop (one thread, on the service's hart)
//! ```text
//!  1. epoll: which sockets are readable/writable; new clients from the nameserver
//!  2. each client channel: handle the records at its head that are not data (bind, connect,
//!     listen, adopt, shutdown, QoS requests); note the arrival of a waiting SEND/WRITE;
//!     note a readable socket whose channel has room (an RX packet waits)
//!  3. each scheduler entity: the arrival of its oldest waiting packet
//!  4. if the link is free: pick an entity (mClock + deadlines), then its oldest packet's
//!     channel, and dispatch a batch from it, re-picking after every packet:
//!       TX: channel -> sendmmsg          RX: recvmmsg (kernel timestamps) -> channel
//!     the link is then busy for the batch's link time (pacing to the declared capacity)
//!  5. every window (1 s): rates, and liveness of the clients
//! ```
//! In busy-poll mode the loop never sleeps (epoll is polled with a zero timeout); in epoll mode
//! it sleeps in `epoll_pwait2` when it has nothing to do, for at most the nap (sends waiting in
//! channels are noticed after at most one nap) or until the link or a limited flow is free.
//!
//! Data moves with one copy in the service in each direction (channel slot to the `sendmmsg`
//! buffer, `recvmmsg` buffer to the channel), into preallocated buffers; TCP reads go straight
//! into a slot of the client's channel and writes straight from it. Nothing on the data path
//! allocates.
//!
//! # Timestamps
//! A datagram delivered to a client carries the kernel's receive timestamp (`SO_TIMESTAMPNS`,
//! `CLOCK_REALTIME`); a send asked for with `FLAG_WANT_SENT` is answered with the time right
//! after its `sendmmsg` returned: the `t1` and `t2` of seed 000 section 4, taken where the
//! paper's network driver took them.

mod dispatch;
pub mod flows;
mod ops;
pub mod session;
pub mod sys;

use crate::sched::admission;
use crate::sched::{EntityId, Link, Pick, Scheduler};
use flows::Flows;
use session::Session;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;
use sys::{Epoll, Mmsg, RxMeta};
use tess_channel::Channel;
use tess_net_client::wire::{self, HEADER_LEN};
use tess_net_client::{FlowTable, Net, Throughput};
use tess_proto::ns::{Incoming, PeerInfo};
use tess_sched::clock;

/// Largest batch of one `recvmmsg`/`sendmmsg`.
pub const MAX_BATCH: usize = 64;
/// Epoll token of the nameserver registration.
const TOKEN_ACCEPTOR: u64 = u64::MAX;

/// How the service waits when it has nothing to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitMode {
    /// Never: poll sockets and channels in a loop (a hart of its own).
    BusyPoll,
    /// Sleep in epoll; sends in channels are noticed after at most `nap`.
    Epoll {
        /// Longest sleep.
        nap: Duration,
    },
}

/// Configuration of the service.
#[derive(Debug, Clone)]
pub struct Config {
    /// Name at tessd's nameserver (also in reports).
    pub name: String,
    /// The link the service shares: packets/s and bits/s.
    pub capacity: Throughput,
    /// Pace dispatch to the capacity (the service behaves as a link of that rate); otherwise
    /// it dispatches as fast as the host allows and the capacity is used for admission only.
    pub paced: bool,
    /// Most link time committed by one dispatch (the rest waits for the next decision).
    pub quantum: Duration,
    /// Most datagrams per `recvmmsg` / `sendmmsg`.
    pub batch: usize,
    /// Largest datagram sent or received; larger sends fail with `EMSGSIZE`, larger
    /// receptions are cut.
    pub max_datagram: usize,
    /// Waiting.
    pub wait: WaitMode,
    /// Weight of the best-effort flows together.
    pub best_effort_weight: u32,
    /// Rate-measuring window.
    pub window: Duration,
    /// Receive buffer of the TCP connections the service opens (`SO_RCVBUF`, set before
    /// connecting); `None`: the kernel's autotuning. A bounded buffer bounds what a sender
    /// has in flight towards a flow the scheduler holds back, so the backlog waits at the
    /// sender, per flow, instead of in the link's shared queue ahead of other flows.
    pub tcp_rcvbuf: Option<usize>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            name: tess_net_client::DEFAULT_SERVICE.into(),
            capacity: Throughput {
                pps: 250_000,
                bps: 1_000_000_000,
            },
            paced: true,
            quantum: Duration::from_micros(20),
            batch: 16,
            max_datagram: 9216,
            wait: WaitMode::BusyPoll,
            best_effort_weight: 1,
            window: Duration::from_secs(1),
            tcp_rcvbuf: None,
        }
    }
}

impl Config {
    /// The link.
    pub fn link(&self) -> Link {
        Link::new(self.capacity)
    }

    /// The longest the service is committed to others when a packet arrives: a quantum, or
    /// one maximal datagram.
    pub fn blocking_ns(&self) -> u64 {
        let q = clock::ns(self.quantum) as f64;
        let big = self.link().cost_ns(self.max_datagram as u64 * 8);
        q.max(big).ceil() as u64
    }
}

/// Where new clients come from.
pub trait Acceptor: Send {
    /// A descriptor that becomes readable when a client waits (`None`: poll every round).
    fn fd(&self) -> Option<RawFd>;
    /// The next client, if one waits.
    fn accept(&mut self) -> io::Result<Option<Incoming>>;
}

impl Acceptor for tess_proto::ns::Service {
    fn fd(&self) -> Option<RawFd> {
        Some(self.as_fd().as_raw_fd())
    }

    fn accept(&mut self) -> io::Result<Option<Incoming>> {
        tess_proto::ns::Service::accept(self)
            .map(Some)
            .map_err(|e| io::Error::other(format!("nameserver registration: {e}")))
    }
}

/// Clients handed over in-process (tests, and programs that run the service on a thread).
#[derive(Debug)]
pub struct LocalAcceptor {
    rx: mpsc::Receiver<Incoming>,
}

impl Acceptor for LocalAcceptor {
    fn fd(&self) -> Option<RawFd> {
        None
    }

    fn accept(&mut self) -> io::Result<Option<Incoming>> {
        Ok(self.rx.try_recv().ok())
    }
}

/// A service running on a thread of this process, for tests and examples.
#[derive(Debug)]
pub struct LocalService {
    tx: mpsc::Sender<Incoming>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<io::Result<()>>>,
}

impl LocalService {
    /// Starts a service with `cfg` on a new thread.
    pub fn start(cfg: Config) -> io::Result<LocalService> {
        let (tx, rx) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let mut svc = Service::new(cfg, Box::new(LocalAcceptor { rx }))?;
        let s = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("tess-netd".into())
            .spawn(move || svc.run(&s))?;
        Ok(LocalService {
            tx,
            stop,
            thread: Some(thread),
        })
    }

    /// A handle whose sockets appear to come from a process of `cell` (`None`: no cell) run by
    /// user `uid`.
    pub fn net(&self, cell: Option<&str>, uid: u32) -> Net {
        let tx = self.tx.clone();
        let client = PeerInfo {
            uid,
            pid: std::process::id() as i32,
            cell: cell.map(str::to_string),
        };
        Net::with_connector(move || {
            let (a, b) = Channel::pair(&wire::channel_options()).map_err(io::Error::other)?;
            tx.send(Incoming {
                client: client.clone(),
                endpoint: b,
            })
            .map_err(|_| io::Error::new(io::ErrorKind::ConnectionRefused, "service stopped"))?;
            Ok(a)
        })
    }

    /// A bare channel to the service, as a client of `cell` run by `uid` (tests that speak
    /// the wire format themselves).
    pub fn connect_raw(&self, cell: Option<&str>, uid: u32) -> io::Result<tess_channel::Endpoint> {
        let (a, b) = Channel::pair(&wire::channel_options()).map_err(io::Error::other)?;
        self.tx
            .send(Incoming {
                client: PeerInfo {
                    uid,
                    pid: std::process::id() as i32,
                    cell: cell.map(str::to_string),
                },
                endpoint: b,
            })
            .map_err(|_| io::Error::new(io::ErrorKind::ConnectionRefused, "service stopped"))?;
        Ok(a)
    }

    /// Stops the service and returns how its loop ended.
    pub fn stop(mut self) -> io::Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(io::Error::other("service thread panicked")),
            None => Ok(()),
        }
    }
}

impl Drop for LocalService {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// An accepted TCP connection waiting for its `ADOPT`.
#[derive(Debug)]
struct Pending {
    token: u64,
    stream: std::net::TcpStream,
    uid: u32,
    listener: usize,
    since_ns: u64,
}

/// Counters of the service as a whole.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct ServiceCounters {
    /// Loop rounds.
    pub rounds: u64,
    /// Dispatches (one batch each).
    pub dispatches: u64,
    /// Packets moved.
    pub packets: u64,
    /// Clients accepted.
    pub clients: u64,
    /// Rounds that found the link busy (pacing).
    pub paced_rounds: u64,
    /// Dispatches that found nothing to move (the head had gone).
    pub empty_dispatches: u64,
    /// Packets served by deadline, by reservation tag, and by weight.
    pub by_phase: [u64; 3],
}

/// The service.
pub struct Service {
    cfg: Config,
    acceptor: Box<dyn Acceptor>,
    epoll: Epoll,
    sessions: Vec<Option<Session>>,
    flows: Flows,
    sched: Scheduler,
    link_free_ns: u64,
    pending: Vec<Pending>,
    next_token: u64,
    /// Arrival of each entity's oldest waiting packet, rebuilt every round.
    entity_heads: Vec<Option<u64>>,
    tx_mmsg: Mmsg,
    rx_mmsg: Mmsg,
    rx_meta: Vec<RxMeta>,
    tx_meta: Vec<TxMeta>,
    scratch: Vec<u8>,
    own_uid: u32,
    window_start_ns: u64,
    counters: ServiceCounters,
    next_wait: Duration,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("cfg", &self.cfg)
            .field("sessions", &self.sessions.iter().flatten().count())
            .field("counters", &self.counters)
            .finish()
    }
}

/// What a send in the transmit batch asked for.
#[derive(Debug, Clone, Copy, Default)]
struct TxMeta {
    cookie: Option<u64>,
}

impl Service {
    /// A service taking clients from `acceptor`. Fails if the capacity is zero or the batch
    /// out of range.
    pub fn new(cfg: Config, acceptor: Box<dyn Acceptor>) -> io::Result<Service> {
        if cfg.capacity.pps == 0 || cfg.capacity.bps == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the service's capacity needs both a packet rate and a bit rate",
            ));
        }
        if cfg.max_datagram == 0 || cfg.max_datagram > wire::MAX_PAYLOAD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("max datagram must be 1..={}", wire::MAX_PAYLOAD),
            ));
        }
        let batch = cfg.batch.clamp(1, MAX_BATCH);
        let mut sched = Scheduler::new(cfg.link());
        let flows = Flows::new(
            &cfg.name,
            cfg.capacity,
            cfg.paced,
            cfg.blocking_ns(),
            cfg.best_effort_weight,
            &mut sched,
        );
        let epoll = Epoll::new(256)?;
        if let Some(fd) = acceptor.fd() {
            epoll.add(fd, libc::EPOLLIN as u32, TOKEN_ACCEPTOR)?;
        }
        let payload = cfg.max_datagram;
        Ok(Service {
            tx_mmsg: Mmsg::new(batch, 0, payload),
            rx_mmsg: Mmsg::new(batch, HEADER_LEN, payload),
            rx_meta: vec![
                RxMeta {
                    len: 0,
                    from: None,
                    kernel_ns: None,
                    truncated: false,
                };
                batch
            ],
            tx_meta: vec![TxMeta::default(); batch],
            cfg: Config { batch, ..cfg },
            acceptor,
            epoll,
            sessions: Vec::new(),
            flows,
            sched,
            link_free_ns: 0,
            pending: Vec::new(),
            next_token: initial_token(),
            entity_heads: Vec::new(),
            scratch: Vec::with_capacity(wire::MAX_RECORD),
            // SAFETY: geteuid has no preconditions.
            own_uid: unsafe { libc::geteuid() },
            window_start_ns: clock::now_ns(),
            counters: ServiceCounters::default(),
            next_wait: Duration::ZERO,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The flow table.
    pub fn flow_table(&self) -> FlowTable {
        self.flows.table()
    }

    /// Counters.
    pub fn counters(&self) -> ServiceCounters {
        self.counters
    }

    /// Sets a spec as the QoS interface would (for the binary's command line).
    pub fn set_spec(
        &mut self,
        key: &str,
        spec: tess_net_client::QosSpec,
    ) -> Result<(), admission::AdmissionError> {
        self.flows.set_spec(key, Some(spec), &mut self.sched)
    }

    /// Serves until `stop` is set. Returns an error only when the acceptor fails (tessd went
    /// away) or epoll does.
    pub fn run(&mut self, stop: &AtomicBool) -> io::Result<()> {
        while !stop.load(Ordering::Relaxed) {
            self.round()?;
        }
        Ok(())
    }

    /// One round of the loop (module docs).
    pub fn round(&mut self) -> io::Result<()> {
        self.counters.rounds += 1;
        let timeout = std::mem::take(&mut self.next_wait);
        self.poll_events(timeout)?;
        let now = clock::now_ns();
        self.refresh_sessions(now);
        if now.saturating_sub(self.window_start_ns) >= clock::ns(self.cfg.window) {
            self.close_window(now);
        }
        let mut worked = false;
        let mut wait_until = None;
        if self.cfg.paced && self.link_free_ns > now {
            self.counters.paced_rounds += 1;
            wait_until = Some(self.link_free_ns);
        } else {
            self.update_entity_heads();
            match self.sched.pick(now) {
                Pick::Serve(entity, phase) => {
                    worked = self.dispatch(entity, phase, now);
                }
                Pick::WaitUntil(t) => wait_until = Some(t),
                Pick::Idle => {}
            }
        }
        if let WaitMode::Epoll { nap } = self.cfg.wait {
            if !worked {
                let now = clock::now_ns();
                let mut d = nap;
                if let Some(t) = wait_until {
                    d = d.min(Duration::from_nanos(t.saturating_sub(now)));
                }
                self.next_wait = d;
            }
        }
        Ok(())
    }

    fn poll_events(&mut self, timeout: Duration) -> io::Result<()> {
        for s in self.sessions.iter_mut().flatten() {
            s.readable = false;
            s.writable = false;
        }
        self.epoll.wait(timeout)?;
        let mut accept = self.acceptor.fd().is_none();
        for (token, ev) in self.epoll.ready() {
            if token == TOKEN_ACCEPTOR {
                accept = true;
                continue;
            }
            if let Some(Some(s)) = self.sessions.get_mut(token as usize) {
                let err = ev & (libc::EPOLLERR | libc::EPOLLHUP) as u32 != 0;
                s.readable |= ev & libc::EPOLLIN as u32 != 0 || err;
                s.writable |= ev & libc::EPOLLOUT as u32 != 0 || err;
            }
        }
        if accept {
            // One client per round keeps a flood of connections from starving the data path.
            if let Some(inc) = self.acceptor.accept()? {
                self.add_session(inc);
            }
        }
        Ok(())
    }

    fn add_session(&mut self, inc: Incoming) {
        // Unlabelled until the client says otherwise (`LABEL`, before its socket opens).
        let key = tess_net_client::qos::flow_key(inc.client.cell.as_deref(), inc.client.pid);
        let flow = self.flows.join(&key);
        let mut ep = inc.endpoint;
        ep.set_wait(tess_channel::Wait::BusyPoll);
        let s = Session::new(ep, inc.client, flow, clock::now_ns());
        self.counters.clients += 1;
        match self.sessions.iter().position(Option::is_none) {
            Some(i) => self.sessions[i] = Some(s),
            None => self.sessions.push(Some(s)),
        }
    }

    fn remove_session(&mut self, i: usize) {
        let Some(s) = self.sessions[i].take() else {
            return;
        };
        if let Some(fd) = s.sock.fd() {
            self.epoll.delete(fd);
        }
        self.pending.retain(|p| p.listener != i);
        if !matches!(s.sock, session::Sock::None) {
            let f = self.flows.get_mut(s.flow);
            f.sockets = f.sockets.saturating_sub(1);
        }
        self.flows.leave(s.flow);
    }

    fn close_window(&mut self, now: u64) {
        let elapsed = now.saturating_sub(self.window_start_ns) as f64 / 1e9;
        self.flows.close_window(elapsed);
        self.window_start_ns = now;
        for s in self.sessions.iter_mut().flatten() {
            if !s.ep.is_peer_alive() {
                s.closing = true;
            }
        }
        let expired: Vec<usize> = self
            .pending
            .iter()
            .enumerate()
            .filter(|(_, p)| now.saturating_sub(p.since_ns) > 10_000_000_000)
            .map(|(i, _)| i)
            .collect();
        for i in expired.into_iter().rev() {
            self.pending.remove(i);
        }
        let closing: Vec<usize> = self
            .sessions
            .iter()
            .enumerate()
            .filter(|(_, s)| s.as_ref().is_some_and(|s| s.closing))
            .map(|(i, _)| i)
            .collect();
        for i in closing {
            self.remove_session(i);
        }
    }

    fn entity_of(&self, s: &Session) -> EntityId {
        self.flows.get(s.flow).entity
    }

    fn update_entity_heads(&mut self) {
        for h in self.entity_heads.iter_mut() {
            *h = None;
        }
        for s in self.sessions.iter().flatten() {
            let Some((a, _)) = s.head() else { continue };
            let e = self.flows.get(s.flow).entity.0;
            if self.entity_heads.len() <= e {
                self.entity_heads.resize(e + 1, None);
            }
            let h = &mut self.entity_heads[e];
            *h = Some(h.map_or(a, |x| x.min(a)));
        }
        for (e, h) in self.entity_heads.iter().enumerate() {
            self.sched.set_head(EntityId(e), *h);
        }
    }
}

fn initial_token() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: `b` is writable for its length; getrandom writes at most that many bytes.
    let n = unsafe { libc::getrandom(b.as_mut_ptr() as *mut libc::c_void, b.len(), 0) };
    if n == 8 {
        u64::from_le_bytes(b) | 1
    } else {
        clock::now_ns() ^ ((std::process::id() as u64) << 40) | 1
    }
}
