//! The SLABS emulator: plays a gesture script to the host at the device's real packet rate and
//! measures, per package, the response time the device sees.
//!
//! # Pacing
//! Packet `k` of the run is due at `start + k * 2 / 44100 s` (computed exactly from the frame
//! count, see [`slabs::packet_offset_ns`]), one every 45.35 us. No Linux sleep is that precise
//! (a timer wake-up costs several microseconds and is late by tens on a virtual machine), so the
//! default [`Pace::Spin`] busy-waits on absolute `CLOCK_MONOTONIC` time and keeps its hart
//! 100 % busy, like the device's FPGA. [`Pace::Hybrid`] sleeps until `margin` before each packet
//! and spins the rest (fewer cycles, still precise if wake-ups are earlier than `margin`);
//! [`Pace::Sleep`] only sleeps (cheap, jittery). Each packet's lateness against its due time is
//! recorded, so a report shows how faithful the pacing was.
//!
//! [`Pace::Link`] leaves the pacing to the kernel, as a real device's hardware does: the
//! device's interface holds a token-bucket queue (`tbf`, [`link_rate`]) that releases one packet
//! every 45.35 us from its own timer, in interrupt context, whatever the scheduler runs; the
//! emulator keeps `lead` packages queued ahead and wakes twice a package to top the queue up.
//! Its own scheduling delays (a reserved neighbour on its hart, say) then move nothing as long
//! as they are shorter than the lead, and it needs a few percent of a hart instead of most of
//! one. `t0` and packet 15's send time are then the kernel's transmit stamps (taken as each
//! packet reaches the device), and the lateness recorded per package is how much longer than
//! 680.27 us the kernel took from packet 0 to packet 15.
//!
//! # Response time (seed 000, Fig. 6)
//! ```text
//! t0 = CLOCK_REALTIME just before sendto() of packet 0 of package k (stamped into the packet)
//! tf = kernel receive timestamp (SO_TIMESTAMPNS, CLOCK_REALTIME) of the answer to package k
//! response = tf - t0          missed if response > 62 / 44100 s = 1405.896 us, or never answered
//! ```
//! The host echoes `t0` in the answer's header, so `tf - t0` needs no lookup; `t0` is the actual
//! send time (not the due time), so the emulator's own lateness does not count against the host.
//!
//! When the emulator shares a busy hart with other work it can be late sending packets 1-15 of a
//! package, and `tf - t0` then includes the test equipment's own lateness, which a real SLABS
//! (an FPGA) never has. [`Response::Ideal`] measures what a perfect device would see: the
//! package's ideal duration (packet 15 is due 15 x 45.35 us = 680.27 us after packet 0) plus
//! `tf` minus the actual send time of packet 15. The host cannot start on a package before its
//! last packet arrives, so this removes exactly the emulator's lateness and nothing of the
//! host's.
//! Packages whose answers have not arrived `drain` after the last packet count as lost (missed).
//! The first `warmup` of packages is sent and answered but not measured.
//!
//! # Glossary
//! - **due time**: when the real device would send a packet; **lateness**: actual send time
//!   minus due time (the emulator's own jitter, reported as `send_lateness_us`).
//! - **lost**: a measured package with no answer after the drain; counted as a miss.
//! - **after last packet**: `tf` minus the send time of the package's 16th packet, the share of
//!   the response that the emulator's pacing cannot inflate.
//!
//! # Worked example
//! A 10 s run with 1 s warm-up sends `ceil(1 s / 725.624 us) = 1,379` warm-up packages, then
//! measures `ceil(10 s / 725.624 us) = 13,782` more: 15,161 packages, 242,576 packets.

use crate::gesture::Gesture;
use crate::net::{realtime_ns, Endpoint, NetError, Peer, Wait, WireTap};
use crate::slabs::{self, PadSample, FRAMES_PER_PACKET, INPUT_PACKET_BYTES, PACKETS_PER_PACKAGE};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tess_bench::Summary;
use tess_sched::clock;

/// Packages the emulator keeps queued ahead of the link under [`Pace::Link`] by default:
/// 8.7 ms, longer than a reserved neighbour on its hart overruns without `HRTICK_DL` (a
/// scheduler tick, 4 ms at HZ=250) plus a hypervisor's stall of a millisecond or two.
pub const DEFAULT_LINK_LEAD: u32 = 12;

/// The token-bucket rate and burst (bytes per second, bytes) that release one input packet every
/// 45.35 us on an Ethernet-like link: the queue counts the 14-byte Ethernet header and the
/// 28 bytes of IPv4 and UDP headers, and the rate is exact because a packet period is 2/44100 s.
/// The burst is three packets (`tc` rounds it down a little), so a release that the kernel's
/// timer makes late is caught up by the next ones instead of being lost, and the long-run rate
/// stays exact.
pub fn link_rate() -> (u64, u64) {
    let wire = (INPUT_PACKET_BYTES + 14 + 28) as u64;
    let per_second = wire * u64::from(slabs::SAMPLE_RATE_HZ) / FRAMES_PER_PACKET as u64;
    (per_second, 3 * wire)
}

/// How the emulator waits for each packet's due time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pace {
    /// Busy-wait on absolute time (precise; one hart fully busy).
    Spin,
    /// Sleep until `margin` before the due time, then busy-wait.
    Hybrid {
        /// Time spun before each packet.
        margin: Duration,
    },
    /// Absolute-time sleeps only (cheap; late by the wake-up latency).
    Sleep,
    /// The link paces: a token-bucket queue on the device's interface releases a packet every
    /// 45.35 us ([`link_rate`]); the emulator keeps `lead` packages queued (module docs).
    Link {
        /// Packages kept queued ahead of the link.
        lead: u32,
    },
}

impl std::str::FromStr for Pace {
    type Err = String;

    /// `spin`, `sleep`, `hybrid:MICROSECONDS`, `link` or `link:PACKAGES`.
    fn from_str(s: &str) -> Result<Pace, String> {
        let bad = || {
            format!(
                "pace {s:?} is not one of spin, sleep, hybrid:MICROSECONDS, link, link:PACKAGES"
            )
        };
        match s {
            "spin" => Ok(Pace::Spin),
            "sleep" => Ok(Pace::Sleep),
            "link" => Ok(Pace::Link {
                lead: DEFAULT_LINK_LEAD,
            }),
            _ => {
                if let Some(us) = s.strip_prefix("hybrid:") {
                    let us = us.parse::<u64>().map_err(|_| bad())?;
                    return Ok(Pace::Hybrid {
                        margin: Duration::from_micros(us),
                    });
                }
                match s.strip_prefix("link:").map(str::parse::<u32>) {
                    Some(Ok(lead)) if (1..=64).contains(&lead) => Ok(Pace::Link { lead }),
                    Some(Ok(_)) => Err(format!("pace {s:?}: the lead is 1 to 64 packages")),
                    _ => Err(bad()),
                }
            }
        }
    }
}

impl std::fmt::Display for Pace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Pace::Spin => write!(f, "spin"),
            Pace::Sleep => write!(f, "sleep"),
            Pace::Hybrid { margin } => write!(f, "hybrid:{}", margin.as_micros()),
            Pace::Link { lead } => write!(f, "link:{lead}"),
        }
    }
}

/// Configuration of one emulator run.
#[derive(Debug, Clone)]
pub struct EmulatorConfig {
    /// The host's address.
    pub target: SocketAddr,
    /// Local address to bind (port 0: any).
    pub bind: SocketAddr,
    /// What the pads do.
    pub gesture: Gesture,
    /// Measured time (after the warm-up).
    pub duration: Duration,
    /// Time sent and answered but not measured.
    pub warmup: Duration,
    /// Pacing method.
    pub pace: Pace,
    /// How long to wait for the last answers.
    pub drain: Duration,
    /// What the response time is measured from.
    pub response: Response,
}

/// What the response time of a package is measured from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Response {
    /// `tf - t0`, from the actual send time of packet 0.
    #[default]
    Actual,
    /// What a perfectly timed device would see: 680.27 us (packet 15's due offset) plus `tf`
    /// minus the actual send time of packet 15 (module docs).
    Ideal,
}

impl EmulatorConfig {
    /// Defaults: 10 s measured after 1 s of warm-up, spinning, 50 ms drain.
    pub fn new(target: SocketAddr, gesture: Gesture) -> EmulatorConfig {
        let bind = if target.is_ipv4() {
            "0.0.0.0:0"
        } else {
            "[::]:0"
        };
        EmulatorConfig {
            target,
            bind: bind.parse().expect("valid address"),
            gesture,
            duration: Duration::from_secs(10),
            warmup: Duration::from_secs(1),
            pace: Pace::Spin,
            drain: Duration::from_millis(50),
            response: Response::Actual,
        }
    }
}

/// Summary of an emulator run, as printed by `tess-slabs --json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EmulatorReport {
    /// Gesture name.
    pub gesture: String,
    /// Host address.
    pub target: String,
    /// Pacing method.
    pub pace: String,
    /// Packages sent, warm-up included.
    pub packages_sent: u64,
    /// Packages measured (sent after the warm-up).
    pub packages: u64,
    /// Measured packages answered.
    pub answered: u64,
    /// Measured packages never answered.
    pub lost: u64,
    /// Measured packages answered after the deadline.
    pub late: u64,
    /// `late + lost`.
    pub misses: u64,
    /// Answers for packages already answered, unknown or malformed.
    pub unexpected_answers: u64,
    /// Answers flagged incomplete by the host.
    pub incomplete_answers: u64,
    /// Deadline in microseconds.
    pub deadline_us: f64,
    /// `tf - t0` of the answered measured packages, in microseconds.
    #[serde(skip_deserializing, default)]
    pub response_us: Summary,
    /// Worst lateness of a packet within each package against its due time, in microseconds
    /// (under `link` pacing: packet 15's, with the due times counted from packet 0's departure).
    #[serde(skip_deserializing, default)]
    pub send_lateness_us: Summary,
    /// Host compute time per package as reported in the answers, in microseconds.
    #[serde(skip_deserializing, default)]
    pub host_compute_us: Summary,
    /// `tf` minus the send time of the package's last packet (index 15; the kernel's transmit
    /// stamp when the socket gives one), in microseconds: the part of the response after the
    /// device finished sending, which neither the emulator's pacing nor a preemption of the
    /// emulator before its send inflates. With exact pacing it is the response minus 680.3 us.
    #[serde(skip_deserializing, default)]
    pub after_last_packet_us: Summary,
    /// Measured packages whose last packet's send time is the kernel's transmit stamp (the
    /// rest use the emulator's clock just before the send).
    #[serde(default)]
    pub tx_kernel_stamps: u64,
    /// Kernel transmit stamp of each package's last packet minus the emulator's clock just
    /// before its send, in microseconds: the emulator's own delay in sending, no longer
    /// charged to the host.
    #[serde(skip_deserializing, default)]
    pub send_delay_us: Summary,
    /// Under `link` pacing: measured packages before which the link stood idle for more than
    /// two packet periods, because the emulator let its queue run dry (its own scheduling
    /// delays exceeded the lead) or the kernel's timer was that late. 0 in the other modes.
    #[serde(default)]
    pub link_gaps: u64,
}

impl EmulatorReport {
    /// The report of a device that could not play at all (its process was starved, as a
    /// SCHED_FIFO 99 swarm on plain Linux does to it): `packages` expected, none answered,
    /// every one missed. Its response times are undefined (NaN, `null` in JSON): no answer
    /// came at all, so no percentile of them exists.
    pub fn starved(packages: u64, target: String) -> EmulatorReport {
        let none = Summary {
            count: 0,
            mean: f64::NAN,
            stdev: f64::NAN,
            min: f64::NAN,
            median: f64::NAN,
            p99: f64::NAN,
            p999: f64::NAN,
            max: f64::NAN,
        };
        EmulatorReport {
            gesture: String::new(),
            target,
            pace: String::new(),
            packages_sent: 0,
            packages,
            answered: 0,
            lost: packages,
            late: 0,
            misses: packages,
            unexpected_answers: 0,
            incomplete_answers: 0,
            deadline_us: slabs::DEADLINE_NS as f64 / 1000.0,
            response_us: none,
            send_lateness_us: none,
            host_compute_us: none,
            after_last_packet_us: none,
            tx_kernel_stamps: 0,
            send_delay_us: none,
            link_gaps: 0,
        }
    }
}

/// The result of a run: the report plus the raw per-package samples.
#[derive(Debug, Clone)]
pub struct EmulatorRun {
    /// The summary.
    pub report: EmulatorReport,
    /// `tf - t0` of every answered measured package, in ns, in package order.
    pub response_ns: Vec<u32>,
}

/// Error running the emulator.
#[derive(Debug, thiserror::Error)]
pub enum EmulatorError {
    /// The socket could not be set up.
    #[error(transparent)]
    Net(#[from] NetError),
    /// Link pacing needs the kernel's transmit stamps, and the socket gives none.
    #[error("emulator to {target}: link pacing needs kernel transmit stamps (SO_TIMESTAMPING), which this socket does not give")]
    NoTxStamps {
        /// Host address.
        target: SocketAddr,
    },
    /// A send or receive failed.
    #[error("emulator {op} with {target} failed: {source}")]
    Io {
        /// `sendto` or `recvmsg`.
        op: &'static str,
        /// Host address.
        target: SocketAddr,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

const NONE: u32 = u32::MAX;
const NO_TIME: u64 = u64::MAX;

struct State<'t> {
    ep: Endpoint,
    /// Under [`Pace::Link`] with a tap on the cable: where the departures come from.
    tap: Option<&'t WireTap>,
    target: SocketAddr,
    /// The kernel's receive stamp of each package's answer (`tf`).
    rx_ns: Vec<u64>,
    compute: Vec<u32>,
    /// Send time of each package's first packet (`t0`): the emulator's clock just before
    /// `sendmsg`, or under [`Pace::Link`] the kernel's transmit stamp once read.
    first_sent_ns: Vec<u64>,
    /// Send time of each package's last packet: the kernel's transmit stamp once read, the
    /// emulator's clock just before `sendmsg` until then (or if the kernel gives none).
    last_sent_ns: Vec<u64>,
    /// The emulator's clock just before sending each package's last packet.
    user_sent_ns: Vec<u64>,
    /// Kernel transmit stamp minus `user_sent_ns`, per package (NONE: no kernel stamp).
    send_delay: Vec<u32>,
    /// Whether the socket gives kernel transmit stamps.
    tx_stamps: bool,
    /// Stamped sends per package: 1 (packet 15) when the emulator paces, 2 (packets 0 and
    /// 15) when the link does. Stamp number `n` belongs to package `n / stamps_per_package`.
    stamps_per_package: u32,
    /// Stamped sends whose stamp has not been read yet: the error queue is read only while
    /// this is non-zero, so the pacing loop's frequent drains cost no extra system call.
    stamps_pending: u32,
    /// Packets known to have left (from the transmit stamps), under [`Pace::Link`].
    departed_packets: u64,
    unexpected: u64,
    incomplete: u64,
    rx: [u8; 2048],
}

impl State<'_> {
    /// Records that packet `index` of package `k` left at `ns`.
    fn departed(&mut self, k: usize, last: bool, ns: u64) {
        if k >= self.last_sent_ns.len() {
            return;
        }
        if last {
            self.last_sent_ns[k] = ns;
            if self.user_sent_ns[k] != NO_TIME && self.tap.is_none() {
                self.send_delay[k] = ns
                    .saturating_sub(self.user_sent_ns[k])
                    .min(u64::from(NONE - 1)) as u32;
            }
        } else {
            self.first_sent_ns[k] = ns;
        }
        let gone = k as u64 * PACKETS_PER_PACKAGE as u64
            + if last { PACKETS_PER_PACKAGE as u64 } else { 1 };
        self.departed_packets = self.departed_packets.max(gone);
    }

    /// Takes every departure, transmit stamp and answer queued on the sockets.
    fn drain(&mut self) -> Result<(), EmulatorError> {
        while let Some(d) = self
            .tap
            .map(WireTap::next)
            .transpose()
            .map_err(|source| EmulatorError::Io {
                op: "recvmsg (wire tap)",
                target: self.target,
                source,
            })?
            .flatten()
        {
            self.departed(d.seq as usize, d.index != 0, d.ns);
        }
        // Transmit stamps first: an answer is matched against its package's kernel send time.
        while self.stamps_pending > 0 {
            let stamp = self
                .ep
                .recv_tx_stamp()
                .map_err(|source| EmulatorError::Io {
                    op: "recvmsg (transmit stamps)",
                    target: self.target,
                    source,
                })?;
            let Some((n, ns)) = stamp else { break };
            self.stamps_pending -= 1;
            let per = self.stamps_per_package;
            self.departed((n / per) as usize, n % per == per - 1, ns);
        }
        loop {
            let r = self
                .ep
                .recv(&mut self.rx, Wait::Poll)
                .map_err(|source| EmulatorError::Io {
                    op: "recvmsg",
                    target: self.target,
                    source,
                })?;
            let Some(r) = r else { return Ok(()) };
            let h = match slabs::decode_output_header(&self.rx[..r.len.min(self.rx.len())]) {
                Ok(h) if !r.truncated => h,
                _ => {
                    self.unexpected += 1;
                    continue;
                }
            };
            let k = h.seq as usize;
            match self.rx_ns.get_mut(k) {
                Some(slot) if *slot == NO_TIME => {
                    *slot = r.rx_ns;
                    self.compute[k] = h.aux;
                    if h.flags & slabs::FLAG_INCOMPLETE != 0 {
                        self.incomplete += 1;
                    }
                }
                _ => self.unexpected += 1,
            }
        }
    }
}

/// Runs the emulator on the calling thread until the configured time has been sent (or `stop`
/// is set), then waits `drain` for the last answers.
pub fn run(cfg: &EmulatorConfig, stop: &AtomicBool) -> Result<EmulatorRun, EmulatorError> {
    run_tapped(cfg, stop, None)
}

/// [`run`], with a tap on the cable ([`WireTap`]) that gives each package's departure times
/// under [`Pace::Link`] (instead of the kernel's transmit stamps of the emulator's own socket,
/// which are taken when a packet leaves the emulator's interface, before a cable in between).
pub fn run_tapped(
    cfg: &EmulatorConfig,
    stop: &AtomicBool,
    tap: Option<&WireTap>,
) -> Result<EmulatorRun, EmulatorError> {
    let ep = Endpoint::bind(cfg.bind)?;
    let link_paced = matches!(cfg.pace, Pace::Link { .. });
    let tap = tap.filter(|_| link_paced);
    // Without kernel transmit stamps the emulator's own clock before each send is used.
    let tx_stamps = tap.is_none() && ep.enable_tx_stamps().is_ok();
    if link_paced && !tx_stamps && tap.is_none() {
        return Err(EmulatorError::NoTxStamps { target: cfg.target });
    }
    let period = slabs::PACKAGE_PERIOD_NS;
    let warmup_packages = clock::ns(cfg.warmup).div_ceil(period) as usize;
    let total_packages = warmup_packages + clock::ns(cfg.duration).div_ceil(period) as usize;
    let mut st = State {
        ep,
        tap,
        target: cfg.target,
        rx_ns: vec![NO_TIME; total_packages],
        compute: vec![0; total_packages],
        first_sent_ns: vec![NO_TIME; total_packages],
        last_sent_ns: vec![NO_TIME; total_packages],
        user_sent_ns: vec![NO_TIME; total_packages],
        send_delay: vec![NONE; total_packages],
        tx_stamps,
        stamps_per_package: if link_paced { 2 } else { 1 },
        stamps_pending: 0,
        departed_packets: 0,
        unexpected: 0,
        incomplete: 0,
        rx: [0; 2048],
    };
    let mut lateness = vec![0u32; total_packages];
    let sent_packages = match cfg.pace {
        Pace::Link { lead } => send_link_paced(cfg, stop, &mut st, lead)?,
        _ => send_self_paced(cfg, stop, &mut st, &mut lateness)?,
    };
    let end = clock::now_ns() + clock::ns(cfg.drain);
    while clock::now_ns() < end {
        st.drain()?;
        std::hint::spin_loop();
    }
    st.drain()?;
    if link_paced {
        record_link_lateness(&st, &mut lateness[..sent_packages]);
    }
    Ok(summarise(
        cfg,
        st,
        &lateness,
        warmup_packages,
        sent_packages,
    ))
}

/// Packet `n` of the run (package `n / 16`, index `n % 16`), encoded into `pkt` with `stamp`
/// as its send time.
fn encode_packet(
    gesture: &Gesture,
    n: u64,
    stamp: u64,
    frames: &mut [[PadSample; slabs::PADS]; FRAMES_PER_PACKET],
    pkt: &mut [u8; INPUT_PACKET_BYTES],
) {
    for (f, frame) in frames.iter_mut().enumerate() {
        gesture.frame(n * FRAMES_PER_PACKET as u64 + f as u64, frame);
    }
    let per = PACKETS_PER_PACKAGE as u64;
    slabs::encode_input(pkt, (n / per) as u32, (n % per) as u16, 0, frames);
    slabs::stamp(pkt, stamp);
}

/// The emulator paces: each packet is sent at its due time by the emulator's own clock.
/// Returns the packages sent.
fn send_self_paced(
    cfg: &EmulatorConfig,
    stop: &AtomicBool,
    st: &mut State<'_>,
    lateness: &mut [u32],
) -> Result<usize, EmulatorError> {
    let peer = Peer::from_socket_addr(cfg.target);
    let mut pkt = [0u8; INPUT_PACKET_BYTES];
    let mut frames = [[PadSample::default(); slabs::PADS]; FRAMES_PER_PACKET];
    let start = clock::now_ns() + 2_000_000;
    let mut sent_packages = 0usize;
    'packages: for (k, package_lateness) in lateness.iter_mut().enumerate() {
        for i in 0..PACKETS_PER_PACKAGE {
            let n = (k * PACKETS_PER_PACKAGE + i) as u64;
            let due = start + slabs::packet_offset_ns(n);
            wait_until(due, cfg.pace, st)?;
            if stop.load(Ordering::Relaxed) {
                break 'packages;
            }
            let now = clock::now_ns();
            let t_send = realtime_ns();
            encode_packet(&cfg.gesture, n, t_send, &mut frames, &mut pkt);
            let last = i == PACKETS_PER_PACKAGE - 1;
            if i == 0 {
                st.first_sent_ns[k] = t_send;
            }
            if last {
                st.last_sent_ns[k] = t_send;
                st.user_sent_ns[k] = t_send;
            }
            // The last packet of a package is stamped by the kernel when it reaches the device,
            // so a preemption of the emulator between `t_send` and the send is not charged to
            // the host (package k is stamp number k: one stamped send per package, in order).
            let sent = if last && st.tx_stamps {
                st.ep.send_to_stamped(&pkt, &peer)
            } else {
                st.ep.send_to(&pkt, &peer)
            };
            sent.map_err(|source| EmulatorError::Io {
                op: "sendto",
                target: cfg.target,
                source,
            })?;
            if last && st.tx_stamps {
                st.stamps_pending += 1;
            }
            let late = now.saturating_sub(due).min(u64::from(u32::MAX)) as u32;
            *package_lateness = (*package_lateness).max(late);
        }
        sent_packages = k + 1;
        if !matches!(cfg.pace, Pace::Spin) {
            st.drain()?;
        }
    }
    Ok(sent_packages)
}

/// The link paces ([`Pace::Link`]): keeps `lead` packages queued ahead of the packets the
/// kernel's transmit stamps show gone, topping the queue up twice a package. Packets 0 and 15 of
/// every package ask for a transmit stamp (`t0` and the last packet's send time). Returns the
/// packages sent.
fn send_link_paced(
    cfg: &EmulatorConfig,
    stop: &AtomicBool,
    st: &mut State<'_>,
    lead: u32,
) -> Result<usize, EmulatorError> {
    let peer = Peer::from_socket_addr(cfg.target);
    let mut pkt = [0u8; INPUT_PACKET_BYTES];
    let mut frames = [[PadSample::default(); slabs::PADS]; FRAMES_PER_PACKET];
    let per = PACKETS_PER_PACKAGE as u64;
    let total = st.rx_ns.len() as u64 * per;
    let lead = u64::from(lead) * per;
    let nap = slabs::PACKAGE_PERIOD_NS / 2;
    let mut n = 0u64;
    while n < total && !stop.load(Ordering::Relaxed) {
        st.drain()?;
        let queue_to = (st.departed_packets + lead).min(total);
        while n < queue_to {
            let (k, i) = ((n / per) as usize, n % per);
            let t_queue = realtime_ns();
            encode_packet(&cfg.gesture, n, t_queue, &mut frames, &mut pkt);
            let stamped = st.tx_stamps && (i == 0 || i == per - 1);
            if i == per - 1 {
                st.user_sent_ns[k] = t_queue;
            }
            let sent = if stamped {
                st.ep.send_to_stamped(&pkt, &peer)
            } else {
                st.ep.send_to(&pkt, &peer)
            };
            sent.map_err(|source| EmulatorError::Io {
                op: "sendto",
                target: cfg.target,
                source,
            })?;
            if stamped {
                st.stamps_pending += 1;
            }
            n += 1;
        }
        clock::sleep_until_ns(clock::now_ns() + nap);
    }
    // Wait for the queue to empty, so that every package has both stamps before the drain.
    let queued_until = clock::now_ns() + (lead + per) * slabs::packet_offset_ns(1) * 2;
    while st.departed_packets < n && clock::now_ns() < queued_until {
        st.drain()?;
        clock::sleep_until_ns(clock::now_ns() + nap);
    }
    Ok(n.div_ceil(per) as usize)
}

/// Under [`Pace::Link`]: each package's lateness is how much longer than 680.27 us the kernel
/// took from its packet 0 to its packet 15 (a late timer, a queue the emulator let run dry).
fn record_link_lateness(st: &State<'_>, lateness: &mut [u32]) {
    let span = slabs::packet_offset_ns((PACKETS_PER_PACKAGE - 1) as u64);
    for (k, late) in lateness.iter_mut().enumerate() {
        let (t0, t15) = (st.first_sent_ns[k], st.last_sent_ns[k]);
        if t0 != NO_TIME && t15 != NO_TIME {
            *late = t15
                .saturating_sub(t0)
                .saturating_sub(span)
                .min(u64::from(NONE - 1)) as u32;
        }
    }
}

/// Packages before which the link stood idle for more than two packet periods: the emulator
/// let the queue run dry (under [`Pace::Link`]), or it was that late itself.
fn link_gaps(st: &State<'_>, measured: std::ops::Range<usize>) -> u64 {
    let limit = 2 * slabs::packet_offset_ns(1);
    measured
        .filter(|&k| k > 0)
        .filter(|&k| {
            let (before, first) = (st.last_sent_ns[k - 1], st.first_sent_ns[k]);
            before != NO_TIME && first != NO_TIME && first.saturating_sub(before) > limit
        })
        .count() as u64
}

fn wait_until(due: u64, pace: Pace, st: &mut State<'_>) -> Result<(), EmulatorError> {
    match pace {
        Pace::Sleep => {
            clock::sleep_until_ns(due);
            return Ok(());
        }
        Pace::Hybrid { margin } => {
            let wake = due.saturating_sub(clock::ns(margin));
            if clock::now_ns() < wake {
                clock::sleep_until_ns(wake);
            }
        }
        Pace::Spin | Pace::Link { .. } => {}
    }
    // Spin, taking answers while there is time for a receive call (about 1 us).
    loop {
        let now = clock::now_ns();
        if now >= due {
            return Ok(());
        }
        if due - now > 3_000 {
            st.drain()?;
        } else {
            std::hint::spin_loop();
        }
    }
}

/// `later - earlier` in nanoseconds as a sample (NONE when either is unknown).
fn interval_ns(earlier: u64, later: u64) -> u32 {
    if earlier == NO_TIME || later == NO_TIME {
        NONE
    } else {
        later.saturating_sub(earlier).min(u64::from(NONE - 1)) as u32
    }
}

fn summarise(
    cfg: &EmulatorConfig,
    st: State<'_>,
    lateness: &[u32],
    warmup_packages: usize,
    sent: usize,
) -> EmulatorRun {
    let measured = warmup_packages.min(sent)..sent;
    let span_ns = slabs::packet_offset_ns((PACKETS_PER_PACKAGE - 1) as u64) as u32;
    let response: Vec<u32> = (0..st.rx_ns.len())
        .map(|k| interval_ns(st.first_sent_ns[k], st.rx_ns[k]))
        .collect();
    let after_last: Vec<u32> = (0..st.rx_ns.len())
        .map(|k| interval_ns(st.last_sent_ns[k], st.rx_ns[k]))
        .collect();
    let response_ns: Vec<u32> = match cfg.response {
        Response::Actual => response[measured.clone()]
            .iter()
            .copied()
            .filter(|&r| r != NONE)
            .collect(),
        Response::Ideal => after_last[measured.clone()]
            .iter()
            .copied()
            .filter(|&r| r != NONE)
            .map(|r| r.saturating_add(span_ns))
            .collect(),
    };
    let compute_us: Vec<f64> = measured
        .clone()
        .filter(|&k| response[k] != NONE)
        .map(|k| f64::from(st.compute[k]) / 1000.0)
        .collect();
    let send_delay_us: Vec<f64> = st.send_delay[measured.clone()]
        .iter()
        .filter(|&&d| d != NONE)
        .map(|&d| f64::from(d) / 1000.0)
        .collect();
    let after_last_us: Vec<f64> = after_last[measured.clone()]
        .iter()
        .filter(|&&r| r != NONE)
        .map(|&r| f64::from(r) / 1000.0)
        .collect();
    let late = response_ns
        .iter()
        .filter(|&&r| u64::from(r) > slabs::DEADLINE_NS)
        .count() as u64;
    let packages = measured.len() as u64;
    let answered = response_ns.len() as u64;
    let lost = packages - answered;
    let us: Vec<f64> = response_ns.iter().map(|&r| f64::from(r) / 1000.0).collect();
    let lateness_us: Vec<f64> = lateness[measured.clone()]
        .iter()
        .map(|&l| f64::from(l) / 1000.0)
        .collect();
    let link_paced = matches!(cfg.pace, Pace::Link { .. });
    EmulatorRun {
        report: EmulatorReport {
            gesture: cfg.gesture.name.clone(),
            target: cfg.target.to_string(),
            pace: cfg.pace.to_string(),
            packages_sent: sent as u64,
            packages,
            answered,
            lost,
            late,
            misses: late + lost,
            unexpected_answers: st.unexpected,
            incomplete_answers: st.incomplete,
            deadline_us: slabs::DEADLINE_NS as f64 / 1000.0,
            response_us: Summary::of(&us),
            send_lateness_us: Summary::of(&lateness_us),
            host_compute_us: Summary::of(&compute_us),
            after_last_packet_us: Summary::of(&after_last_us),
            tx_kernel_stamps: if link_paced {
                measured
                    .clone()
                    .filter(|&k| st.last_sent_ns[k] != NO_TIME)
                    .count() as u64
            } else {
                send_delay_us.len() as u64
            },
            send_delay_us: if link_paced {
                Summary::default()
            } else {
                Summary::of(&send_delay_us)
            },
            link_gaps: if link_paced {
                link_gaps(&st, measured)
            } else {
                0
            },
        },
        response_ns,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pace_parses_and_prints() {
        for s in ["spin", "sleep", "hybrid:20", "link:8"] {
            assert_eq!(s.parse::<Pace>().unwrap().to_string(), s);
        }
        assert_eq!(
            "link".parse::<Pace>(),
            Ok(Pace::Link {
                lead: DEFAULT_LINK_LEAD
            })
        );
        for bad in ["hybrid:x", "link:0", "link:65", "link:", "fast"] {
            assert!(bad.parse::<Pace>().is_err(), "{bad}");
        }
    }

    #[test]
    fn link_rate_releases_one_packet_per_packet_period() {
        let (rate, burst) = link_rate();
        let wire = (INPUT_PACKET_BYTES + 42) as u64;
        assert_eq!(burst, 3 * wire);
        // wire bytes / rate = 2 / 44100 s exactly: 834 bytes at 18,389,700 bytes/s.
        assert_eq!((wire, rate), (834, 834 * 22_050));
        assert_eq!(wire * 1_000_000_000 / rate, slabs::packet_offset_ns(1));
    }

    #[test]
    fn worked_example_package_counts() {
        let p = slabs::PACKAGE_PERIOD_NS;
        assert_eq!(1_000_000_000u64.div_ceil(p), 1_379);
        assert_eq!(10_000_000_000u64.div_ceil(p), 13_782);
    }
}
