//! The Ethernet audio device as test equipment: sends a packet of 32 frames x 10 channels every
//! 725.6 us to the host, as the seed's device does, and measures per packet the response time
//! the device sees.
//!
//! ```text
//! t0(n)  = CLOCK_REALTIME just before sendto() of packet n (also written into its header)
//! tf(n)  = the kernel's receive timestamp (SO_TIMESTAMPNS) of the answer to n
//! response(n) = tf(n) - t0(n)     missed if > 725.6 us (the next packet is due) or no answer
//! ```
//! Packets are due at `start + n * 725.6 us` on `CLOCK_MONOTONIC`; the sender sleeps until each
//! (absolute `clock_nanosleep`) at `SCHED_FIFO` 98 on the equipment's hart, and a second thread
//! there blocks in `recvmsg` for the answers. `t0` is the actual send time, so the equipment's
//! own lateness is never charged to the host; it is reported as `send_late` instead. Answers
//! whose header does not match a packet sent are counted as `bad_answers`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tess_music::net::{realtime_ns, Endpoint, Peer, Wait};
use tess_pd::device::{self, Header, PACKET_BYTES};
use tess_sched::clock::{now_ns, sleep_until_ns};
use tess_sched::Policy;

/// What the device saw.
#[derive(Debug, Default)]
pub struct Seen {
    /// Response times of the measured packets that were answered, ns.
    pub response_ns: Vec<u64>,
    /// Measured packets sent.
    pub measured: u64,
    /// Measured packets answered after the next packet was due.
    pub late: u64,
    /// Measured packets never answered (within the drain after the last).
    pub lost: u64,
    /// Answers that matched no packet sent (wrong size, magic, sequence or stamp).
    pub bad_answers: u64,
    /// How late the equipment sent its packets (actual minus due, monotonic), ns.
    pub send_late_ns: Vec<u64>,
    /// Answers without a kernel receive stamp (timed in user space instead).
    pub unstamped: u64,
}

impl Seen {
    /// Misses: late plus lost.
    pub fn misses(&self) -> u64 {
        self.late + self.lost
    }
}

/// One answer as it arrived: the header it echoed (`None`: not a packet) and the kernel's
/// receive stamp.
struct Answer {
    echoed: Option<Header>,
    rx_ns: u64,
}

/// How long answers may still arrive after the last packet.
const DRAIN: Duration = Duration::from_millis(200);

/// Plays the device to `host` for `warmup + measure`, from hart `hart`; packets of the warm-up
/// are answered but not measured.
pub fn run(
    host: SocketAddr,
    hart: usize,
    warmup: Duration,
    measure: Duration,
) -> anyhow::Result<Seen> {
    let period = device::period_ns();
    let warm = (warmup.as_nanos() as f64 / period).ceil() as usize;
    let total = warm + (measure.as_nanos() as f64 / period).ceil() as usize;
    let ep = Endpoint::bind("127.0.0.1:0".parse().expect("address"))?;
    let peer = Peer::from_socket_addr(host);
    // per packet: realtime send stamp; per answer: realtime kernel receive stamp
    let mut sent = vec![0u64; total];
    let mut answered = vec![0u64; total];
    let mut send_late = Vec::with_capacity(total);
    let done = AtomicBool::new(false);
    let (got, unstamped) = std::thread::scope(|s| -> anyhow::Result<_> {
        let receiver = s.spawn(|| -> anyhow::Result<(Vec<Answer>, u64)> {
            tess_sched::rt::place_current_thread(Some(hart), Some(Policy::Fifo { priority: 98 }))?;
            let mut got = Vec::with_capacity(total);
            let mut buf = [0u8; PACKET_BYTES + 1];
            let mut unstamped = 0;
            while !done.load(Ordering::Acquire) {
                let Some(r) = ep.recv(&mut buf, Wait::Block)? else {
                    continue;
                };
                if !r.kernel_stamp {
                    unstamped += 1;
                }
                got.push(Answer {
                    echoed: device::decode_header(&buf[..r.len]).ok(),
                    rx_ns: r.rx_ns,
                });
            }
            Ok((got, unstamped))
        });
        let sender = s.spawn(|| -> anyhow::Result<()> {
            tess_sched::rt::place_current_thread(Some(hart), Some(Policy::Fifo { priority: 98 }))?;
            let mut pkt = [0u8; PACKET_BYTES];
            let start = now_ns() + 20_000_000;
            for (n, t0) in sent.iter_mut().enumerate() {
                let due = start + (n as f64 * period) as u64;
                sleep_until_ns(due);
                *t0 = realtime_ns();
                send_late.push(now_ns().saturating_sub(due));
                // channel 1: a 220 Hz sine at half scale, continuous across packets; others silent
                let first = n * device::FRAMES;
                device::encode(
                    Header {
                        seq: n as u32,
                        stamp_ns: *t0,
                    },
                    &mut pkt,
                    |ch, frame| {
                        if ch == 0 {
                            let t = (first + frame) as f64 / device::SAMPLE_RATE as f64;
                            (0.5 * (2.0 * std::f64::consts::PI * 220.0 * t).sin()) as f32
                        } else {
                            0.0
                        }
                    },
                );
                ep.send_to(&pkt, &peer)?;
            }
            Ok(())
        });
        let sent_ok = sender
            .join()
            .map_err(|_| anyhow::anyhow!("the device's sender panicked"))?;
        std::thread::sleep(DRAIN);
        done.store(true, Ordering::Release);
        sent_ok?;
        receiver
            .join()
            .map_err(|_| anyhow::anyhow!("the device's receiver panicked"))?
    })?;
    let mut bad = 0u64;
    for a in got {
        match a.echoed {
            Some(h)
                if (h.seq as usize) < total
                    && sent[h.seq as usize] == h.stamp_ns
                    && answered[h.seq as usize] == 0 =>
            {
                answered[h.seq as usize] = a.rx_ns;
            }
            _ => bad += 1,
        }
    }
    let mut seen = Seen {
        bad_answers: bad,
        unstamped,
        send_late_ns: send_late,
        ..Seen::default()
    };
    for n in warm..total {
        seen.measured += 1;
        if answered[n] == 0 {
            seen.lost += 1;
            continue;
        }
        let r = answered[n].saturating_sub(sent[n]);
        if r as f64 > period {
            seen.late += 1;
        }
        seen.response_ns.push(r);
    }
    Ok(seen)
}
