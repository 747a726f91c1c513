//! The synthesizer host: the communication loop that assembles packages, has the voices
//! computed, answers the device, and measures `t2 - t1` (seed 000, section 4, Fig. 6).
//!
//! # What is measured
//! ```text
//! t1 = kernel receive timestamp of packet 0 of package k          (SO_TIMESTAMPNS, CLOCK_REALTIME)
//! t2 = CLOCK_REALTIME just after sendto() of package k's answer returns
//!      (through the network service: just after its sendmmsg returns; see crate::netsvc)
//! response = t2 - t1        late if response > 62 / 44100 s = 1405.896 us
//! compute  = CLOCK_MONOTONIC from publishing package k to the last voice done
//! ```
//! As in the paper, `t1` and `t2` are taken as close to the socket as a user-level network
//! driver can: the kernel stamps `t1` before any thread is scheduled, and `t2` is read right after
//! the system call that hands the answer to the kernel. `t2 - t1` includes the time spent
//! gathering packets 1..15 (at least 15 x 45.35 = 680.3 us when the device paces exactly), the
//! compute time, and every scheduling delay of the communication and worker threads.
//!
//! # The loop (one communication thread, non-preemptive)
//! ```text
//! loop:
//!   recvmsg (MSG_DONTWAIT when spinning or a package is in flight; blocking otherwise)
//!   packet -> assembly of package `seq`; on packet 15 the package is complete:
//!             publish controls (pool) ; with no workers compute it right here
//!   all voices done -> mix -> encode -> sendto -> t2 -> log t2 - t1
//! ```
//! If packets are lost, a package is completed when a packet of a newer package arrives, with
//! `FLAG_INCOMPLETE` set; if packet 0 is lost, `t1` comes from the earliest packet that arrived
//! and `FLAG_NO_FIRST_PACKET` is set. Should a package complete while the previous one is still
//! being computed, it waits in a one-slot queue; a third one overwrites it (an *overrun*).
//!
//! Nothing in [`Host::run`] allocates, locks or makes system calls other than `recvmsg` and
//! `sendto` (`clock_gettime` is served by the vDSO); `tests/no_alloc.rs` checks the first claim.
//!
//! # Glossary
//! - **assembly**: the package whose packets are arriving; **ready**: a complete package
//!   waiting for the workers; **in flight**: the package the workers are computing.
//! - **incomplete**: answered with some of its 16 packets missing; **stale**: a packet of a
//!   package older than the one being assembled (dropped); **overrun**: a ready package
//!   replaced by a newer one because the workers were still busy (never answered).
//! - **warm-up**: packages answered but not measured.
//!
//! # Worked example
//! Package 100 has packet 0 stamped at `t1`; packet 15 arrives 680 us later; its 24 pressed
//! voices take 14 us on one hart; `sendto` returns at `t2 = t1 + 697 us`: a response of 697 us,
//! 709 us inside the deadline.

use crate::net::{realtime_ns, NetError, Peer, Received, Wait};
use crate::netsvc::Transport;
use crate::pool::{Pool, ThreadSetup};
use crate::record::{AudioRecorder, SampleLog};
use crate::slabs::{
    self, Header, PadSample, FLAG_INCOMPLETE, FLAG_NO_FIRST_PACKET, INPUT_PACKET_BYTES,
    OUTPUT_MAGIC, OUTPUT_PACKET_BYTES, PACKETS_PER_PACKAGE, PADS,
};
use crate::synth::{AudioBlock, Engine, SynthParams};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tess_bench::Summary;
use tess_sched::clock;

/// Configuration of the host.
#[derive(Clone)]
pub struct HostConfig {
    /// Address to listen on.
    pub bind: SocketAddr,
    /// Synthesizer parameters.
    pub synth: SynthParams,
    /// How the communication thread waits for packets when nothing is in flight.
    pub wait: Wait,
    /// Worker threads computing voices (0: the communication thread computes them).
    pub workers: usize,
    /// Run on each worker thread before it starts spinning (pinning, policy).
    pub worker_setup: Option<ThreadSetup>,
    /// Stop after this long (from the start of [`Host::run`]).
    pub duration: Option<Duration>,
    /// Stop after answering this many packages (warm-up included).
    pub max_packages: Option<u64>,
    /// Packages whose `t1` is within this time of the first package's are answered but not
    /// measured (the paper's 1 s warm-up).
    pub warmup: Duration,
    /// Capacity of the response-time log, in packages.
    pub log_capacity: usize,
    /// Seconds of output audio to keep for `--record` (0: none).
    pub record_seconds: f64,
    /// Use a socket of this tess network service instead of one of our own (`t1` and `t2`
    /// are then taken by the service; see [`crate::netsvc`]).
    pub net_service: Option<String>,
}

impl std::fmt::Debug for HostConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostConfig")
            .field("bind", &self.bind)
            .field("synth", &self.synth)
            .field("wait", &self.wait)
            .field("workers", &self.workers)
            .field("duration", &self.duration)
            .field("max_packages", &self.max_packages)
            .field("warmup", &self.warmup)
            .field("log_capacity", &self.log_capacity)
            .field("record_seconds", &self.record_seconds)
            .field("net_service", &self.net_service)
            .finish()
    }
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            bind: "127.0.0.1:9701".parse().expect("valid address"),
            synth: SynthParams::default(),
            wait: Wait::Poll,
            workers: 0,
            worker_setup: None,
            duration: None,
            max_packages: None,
            warmup: Duration::from_secs(1),
            // Ten minutes of packages.
            log_capacity: 10 * 60 * 1379,
            record_seconds: 0.0,
            net_service: None,
        }
    }
}

/// Error starting the host.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The socket could not be set up.
    #[error(transparent)]
    Net(#[from] NetError),
    /// A worker thread could not be started.
    #[error("cannot start {workers} worker threads: {source}")]
    Workers {
        /// Requested workers.
        workers: usize,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// Event counters of a run.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct HostCounters {
    /// Input packets received (valid ones).
    pub packets: u64,
    /// Datagrams that were not SLABS input packets.
    pub malformed: u64,
    /// Packets of a package older than the one being assembled (dropped).
    pub stale_packets: u64,
    /// Packages answered.
    pub answered: u64,
    /// Of those, answered during the warm-up (not measured).
    pub warmup_packages: u64,
    /// Packages answered with some packets missing.
    pub incomplete: u64,
    /// Packages dropped because two were waiting while the workers were busy.
    pub overruns: u64,
    /// Measured packages with `t2 - t1` over the deadline.
    pub late: u64,
    /// `sendto` failures.
    pub send_errors: u64,
    /// Packets without a kernel timestamp (userspace time used instead).
    pub user_stamps: u64,
}

/// What the host reports at the end (or on request).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HostReport {
    /// Event counters.
    pub counters: HostCounters,
    /// Measured packages (after warm-up).
    pub packages: u64,
    /// Measured packages over the deadline (`counters.late`).
    pub misses: u64,
    /// Deadline in microseconds.
    pub deadline_us: f64,
    /// `t2 - t1` in microseconds.
    #[serde(skip_deserializing, default)]
    pub response_us: Summary,
    /// Compute time per package in microseconds.
    #[serde(skip_deserializing, default)]
    pub compute_us: Summary,
    /// Mean compute time / package period.
    pub hart_fraction_mean: f64,
    /// Worker threads (0: computed on the communication thread).
    pub workers: usize,
    /// Oscillators per voice.
    pub oscillators_per_voice: usize,
    /// `spin` or `block`.
    pub wait: String,
    /// Samples that did not fit the log.
    pub dropped_samples: u64,
}

impl HostReport {
    /// The report of a synthesizer that printed none (it was starved or killed).
    pub fn missing(packages: u64) -> HostReport {
        HostReport {
            counters: HostCounters::default(),
            packages,
            misses: packages,
            deadline_us: crate::slabs::DEADLINE_NS as f64 / 1000.0,
            response_us: Summary {
                p999: f64::NAN,
                max: f64::NAN,
                ..Summary::default()
            },
            compute_us: Summary::default(),
            hart_fraction_mean: 0.0,
            workers: 0,
            oscillators_per_voice: 0,
            wait: String::new(),
            dropped_samples: 0,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Assembly {
    seq: u32,
    mask: u16,
    t1_ns: u64,
    t0_ns: u64,
    have_first: bool,
    peer: Peer,
}

#[derive(Debug, Clone, Copy)]
struct Ready {
    seq: u32,
    t1_ns: u64,
    t0_ns: u64,
    flags: u16,
    peer: Peer,
    controls: [PadSample; PADS],
}

/// An answer sent through the network service, waiting for its transmit stamp (`t2`).
#[derive(Debug, Clone, Copy)]
struct Unstamped {
    seq: u32,
    t1_ns: u64,
    compute_ns: u64,
}

/// Answers awaiting their stamps, by sequence number: 64 packages (46 ms) of slack for a
/// service that falls behind.
const UNSTAMPED_SLOTS: usize = 64;

#[derive(Debug, Clone, Copy)]
struct InFlight {
    ready: Ready,
    start_ns: u64,
}

/// The synthesizer host.
#[derive(Debug)]
pub struct Host {
    cfg: HostConfig,
    ep: Transport,
    pool: Pool,
    response_log: Arc<SampleLog>,
    compute_log: Arc<SampleLog>,
    /// `t2 - t1` of every answer, published for `tess top` and Prometheus (crate `tess-stats`).
    published: Option<tess_stats::Publisher>,
    recorder: Option<AudioRecorder>,
    counters: HostCounters,
    // Audio-path state, all preallocated.
    rx_buf: Box<[u8; 2048]>,
    tx_buf: Box<[u8; OUTPUT_PACKET_BYTES]>,
    frames: [[PadSample; PADS]; slabs::FRAMES_PER_PACKET],
    controls: [PadSample; PADS],
    block: AudioBlock,
    assembly: Option<Assembly>,
    pending: Option<Ready>,
    in_flight: Option<InFlight>,
    first_t1_ns: Option<u64>,
    unstamped: [Option<Unstamped>; UNSTAMPED_SLOTS],
}

fn is_newer(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

impl Host {
    /// Binds the socket, builds the 32 voices and starts the workers.
    pub fn new(cfg: HostConfig) -> Result<Host, HostError> {
        let ep = Transport::open(cfg.bind, cfg.net_service.as_deref())?;
        let (tables, voices) = Engine::new(&cfg.synth).into_parts();
        let pool =
            Pool::new(tables, voices, cfg.workers, cfg.worker_setup.clone()).map_err(|source| {
                HostError::Workers {
                    workers: cfg.workers,
                    source,
                }
            })?;
        let recorder =
            (cfg.record_seconds > 0.0).then(|| AudioRecorder::with_seconds(cfg.record_seconds));
        Ok(Host {
            response_log: Arc::new(SampleLog::with_capacity(cfg.log_capacity)),
            compute_log: Arc::new(SampleLog::with_capacity(cfg.log_capacity)),
            published: tess_stats::Publisher::try_create(
                "synth",
                Some(std::time::Duration::from_nanos(slabs::DEADLINE_NS)),
            ),
            cfg,
            ep,
            pool,
            recorder,
            counters: HostCounters::default(),
            rx_buf: Box::new([0; 2048]),
            tx_buf: Box::new([0; OUTPUT_PACKET_BYTES]),
            frames: [[PadSample::default(); PADS]; slabs::FRAMES_PER_PACKET],
            controls: [PadSample::default(); PADS],
            block: [[0.0; slabs::OUTPUT_CHANNELS]; slabs::FRAMES_PER_PACKAGE],
            assembly: None,
            pending: None,
            in_flight: None,
            first_t1_ns: None,
            unstamped: [None; UNSTAMPED_SLOTS],
        })
    }

    /// The address the host listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.ep.local_addr()
    }

    /// The `t2 - t1` log (nanoseconds), readable while the host runs.
    pub fn response_log(&self) -> Arc<SampleLog> {
        Arc::clone(&self.response_log)
    }

    /// The compute-time log (nanoseconds), readable while the host runs.
    pub fn compute_log(&self) -> Arc<SampleLog> {
        Arc::clone(&self.compute_log)
    }

    /// The audio recorded so far, if recording.
    pub fn recorder(&self) -> Option<&AudioRecorder> {
        self.recorder.as_ref()
    }

    /// Event counters so far.
    pub fn counters(&self) -> HostCounters {
        self.counters
    }

    /// Serves the device until `stop` is set, the duration passes or `max_packages` are
    /// answered. This is the audio path: call it on the communication thread, pinned as wanted.
    pub fn run(&mut self, stop: &AtomicBool) -> std::io::Result<()> {
        let end_ns = self
            .cfg
            .duration
            .map(|d| clock::now_ns().saturating_add(clock::ns(d)));
        let mut spins: u32 = 0;
        loop {
            // Checking the clock every 64 empty polls keeps the spin loop tight.
            spins = spins.wrapping_add(1);
            if spins & 63 == 0 || self.cfg.wait == Wait::Block {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                if end_ns.is_some_and(|e| clock::now_ns() >= e) {
                    break;
                }
            }
            if self
                .cfg
                .max_packages
                .is_some_and(|m| self.counters.answered >= m)
            {
                break;
            }
            let busy = self.in_flight.is_some() || self.pending.is_some();
            let wait = if busy { Wait::Poll } else { self.cfg.wait };
            if let Some(r) = self.ep.recv(&mut self.rx_buf[..], wait)? {
                self.on_datagram(r);
            }
            while let Some((seq, t2_ns)) = self.ep.take_sent() {
                self.on_stamp(seq as u32, t2_ns);
            }
            if self.in_flight.is_some() && self.pool.is_done() {
                self.answer();
                if let Some(next) = self.pending.take() {
                    self.start(next);
                }
            }
        }
        Ok(())
    }

    fn on_datagram(&mut self, r: Received) {
        let len = r.len.min(self.rx_buf.len());
        let header = if r.truncated || len != INPUT_PACKET_BYTES {
            None
        } else {
            slabs::decode_input(&self.rx_buf[..len], &mut self.frames).ok()
        };
        let Some(h) = header else {
            self.counters.malformed += 1;
            return;
        };
        self.counters.packets += 1;
        if !r.kernel_stamp {
            self.counters.user_stamps += 1;
        }
        if let Some(a) = self.assembly {
            if h.seq != a.seq {
                if is_newer(h.seq, a.seq) {
                    // The rest of package `a.seq` is lost: answer what we have.
                    self.complete(FLAG_INCOMPLETE);
                } else {
                    self.counters.stale_packets += 1;
                    return;
                }
            }
        }
        let a = self.assembly.get_or_insert(Assembly {
            seq: h.seq,
            mask: 0,
            t1_ns: r.rx_ns,
            t0_ns: h.timestamp_ns,
            have_first: false,
            peer: r.peer,
        });
        a.mask |= 1 << h.index;
        if h.index == 0 {
            a.t1_ns = r.rx_ns;
            a.t0_ns = h.timestamp_ns;
            a.have_first = true;
            a.peer = r.peer;
        }
        // The control values of a package are its latest frame.
        self.controls = self.frames[slabs::FRAMES_PER_PACKET - 1];
        if usize::from(h.index) == PACKETS_PER_PACKAGE - 1 {
            let full = a.mask == u16::MAX;
            self.complete(if full { 0 } else { FLAG_INCOMPLETE });
        }
    }

    fn complete(&mut self, mut flags: u16) {
        let Some(a) = self.assembly.take() else {
            return;
        };
        if !a.have_first {
            flags |= FLAG_NO_FIRST_PACKET;
        }
        if flags & FLAG_INCOMPLETE != 0 {
            self.counters.incomplete += 1;
        }
        let ready = Ready {
            seq: a.seq,
            t1_ns: a.t1_ns,
            t0_ns: a.t0_ns,
            flags,
            peer: a.peer,
            controls: self.controls,
        };
        if self.in_flight.is_some() {
            if self.pending.replace(ready).is_some() {
                self.counters.overruns += 1;
            }
            return;
        }
        self.start(ready);
    }

    fn start(&mut self, ready: Ready) {
        let start_ns = clock::now_ns();
        self.pool.publish(&ready.controls);
        self.in_flight = Some(InFlight { ready, start_ns });
        if self.pool.workers() == 0 {
            self.pool.run_inline();
            self.answer();
        }
    }

    fn answer(&mut self) {
        let Some(f) = self.in_flight.take() else {
            return;
        };
        let compute_ns = clock::now_ns().saturating_sub(f.start_ns);
        self.pool.finish(&mut self.block);
        let header = Header {
            magic: OUTPUT_MAGIC,
            seq: f.ready.seq,
            index: 0,
            flags: f.ready.flags,
            aux: compute_ns.min(u64::from(u32::MAX)) as u32,
            timestamp_ns: f.ready.t0_ns,
        };
        slabs::encode_output(&mut self.tx_buf, &header, &self.block);
        let sent = self
            .ep
            .send_to(&self.tx_buf[..], &f.ready.peer, u64::from(f.ready.seq));
        self.counters.answered += 1;
        let first = *self.first_t1_ns.get_or_insert(f.ready.t1_ns);
        let t2_ns = match sent {
            Ok(t2) => t2,
            Err(_) => {
                self.counters.send_errors += 1;
                Some(realtime_ns())
            }
        };
        if f.ready.t1_ns.saturating_sub(first) < clock::ns(self.cfg.warmup) {
            self.counters.warmup_packages += 1;
        } else if let Some(t2_ns) = t2_ns {
            self.log_response(f.ready.t1_ns, t2_ns, compute_ns);
        } else {
            // Through the network service: `t2` comes with the transmit stamp (on_stamp).
            let slot = (f.ready.seq as usize) % UNSTAMPED_SLOTS;
            self.unstamped[slot] = Some(Unstamped {
                seq: f.ready.seq,
                t1_ns: f.ready.t1_ns,
                compute_ns,
            });
        }
        if let Some(rec) = self.recorder.as_mut() {
            rec.push(&self.block);
        }
    }

    fn log_response(&mut self, t1_ns: u64, t2_ns: u64, compute_ns: u64) {
        let response_ns = t2_ns.saturating_sub(t1_ns);
        if response_ns > slabs::DEADLINE_NS {
            self.counters.late += 1;
        }
        self.response_log.push(response_ns);
        self.compute_log.push(compute_ns);
        if let Some(p) = &self.published {
            p.record(response_ns);
        }
    }

    /// The network service reports when the answer to package `seq` left: `t2`.
    fn on_stamp(&mut self, seq: u32, t2_ns: u64) {
        let slot = (seq as usize) % UNSTAMPED_SLOTS;
        if let Some(u) = self.unstamped[slot].filter(|u| u.seq == seq) {
            self.unstamped[slot] = None;
            self.log_response(u.t1_ns, t2_ns, u.compute_ns);
        }
    }

    /// What the host has published for observers so far (`None` when it could not publish).
    pub fn published(&self) -> Option<tess_stats::Published> {
        self.published.as_ref().map(|p| p.read_back())
    }

    /// The report of the run so far (allocates: call it off the audio path).
    pub fn report(&self) -> HostReport {
        report_from(
            &self.counters,
            &self.response_log,
            &self.compute_log,
            &self.cfg,
            self.pool.workers(),
        )
    }
}

/// Builds a report from the counters and logs (usable from a statistics thread with a copy of
/// the counters).
pub fn report_from(
    counters: &HostCounters,
    response_log: &SampleLog,
    compute_log: &SampleLog,
    cfg: &HostConfig,
    workers: usize,
) -> HostReport {
    let response_us = Summary::of(&response_log.snapshot_us());
    let compute_us = Summary::of(&compute_log.snapshot_us());
    HostReport {
        counters: *counters,
        packages: response_us.count as u64,
        misses: counters.late,
        deadline_us: slabs::DEADLINE_NS as f64 / 1000.0,
        response_us,
        compute_us,
        hart_fraction_mean: compute_us.mean * 1000.0 / slabs::PACKAGE_PERIOD_NS as f64,
        workers,
        oscillators_per_voice: cfg.synth.voice.oscillators,
        wait: match cfg.wait {
            Wait::Poll => "spin".into(),
            Wait::Block => "block".into(),
        },
        dropped_samples: response_log.dropped(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_numbers_compare_across_wraparound() {
        assert!(is_newer(1, 0));
        assert!(is_newer(0, u32::MAX));
        assert!(!is_newer(5, 5));
        assert!(!is_newer(u32::MAX, 0));
    }
}
