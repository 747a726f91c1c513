//! The Ethernet audio device of seed 001 (section 5): the engine as the host of a networked
//! audio interface with 10 input and 10 output channels at 44.1 kHz. The device sends a packet
//! of 32 frames every 725.6 us (32 / 44100 s) and the host must answer each with a packet of
//! output samples before the next one arrives, or the device plays a glitch.
//!
//! # Wire format
//! The paper gives only the payload (1280 bytes: 32 samples x 4 bytes x 10 channels); the
//! header is ours. One UDP datagram per packet, both ways:
//! ```text
//! offset  size  field
//!      0     4  magic "TPDA"
//!      4     4  sequence number, u32 little-endian (the device counts its packets)
//!      8     8  stamp, u64 little-endian: the device's send time; the host echoes it
//!     16  1280  32 frames x 10 channels, f32 little-endian, frame-major (interleaved)
//! ```
//! The answer to packet `n` carries `n`'s sequence number and stamp, so the device computes a
//! response time without a lookup.
//!
//! # Serving
//! [`serve`] runs the patch one 32-sample block per packet: the packet's channels go to
//! `adc~ 1` .. `adc~ 10`, the block runs, `dac~ 1` .. `dac~ 10` go back to the sender. Block
//! time is driven by the device, not by a clock of ours, as with a real audio interface. A
//! datagram that is not a packet (wrong length or magic) is counted and dropped; the engine goes
//! on.

use crate::engine::{Config, Engine};
use crate::play::percentile;
use crate::sched::Executor;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tess_sched::clock::now_ns;

/// Input and output channels.
pub const CHANNELS: usize = 10;
/// Frames per packet (the engine's block size when it serves the device).
pub const FRAMES: usize = 32;
/// The device's sample rate, Hz.
pub const SAMPLE_RATE: u32 = 44_100;
/// Header bytes before the samples.
pub const HEADER_BYTES: usize = 16;
/// Sample bytes per packet (the paper's 1280-byte payload).
pub const PAYLOAD_BYTES: usize = FRAMES * CHANNELS * 4;
/// Bytes of one datagram.
pub const PACKET_BYTES: usize = HEADER_BYTES + PAYLOAD_BYTES;
/// First bytes of every packet.
pub const MAGIC: [u8; 4] = *b"TPDA";

/// The device's packet period in ns: 32 / 44100 s = 725,624 ns.
pub fn period_ns() -> f64 {
    FRAMES as f64 * 1e9 / SAMPLE_RATE as f64
}

/// The engine settings a device host runs with.
pub fn config() -> Config {
    Config {
        sample_rate: SAMPLE_RATE as f32,
        block: FRAMES,
    }
}

/// A packet's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The device's packet count.
    pub seq: u32,
    /// The device's send time (any clock of the device's; echoed unchanged).
    pub stamp_ns: u64,
}

/// Why a datagram is not a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PacketError {
    /// Not [`PACKET_BYTES`] long.
    #[error("a device packet is {PACKET_BYTES} bytes, this datagram {0}")]
    Length(usize),
    /// Does not start with [`MAGIC`].
    #[error("not a device packet (magic {0:02x?}, expected \"TPDA\")")]
    Magic([u8; 4]),
}

/// Reads a packet's header; `buf` must be one whole datagram.
pub fn decode_header(buf: &[u8]) -> Result<Header, PacketError> {
    if buf.len() != PACKET_BYTES {
        return Err(PacketError::Length(buf.len()));
    }
    let magic: [u8; 4] = buf[0..4].try_into().expect("4 bytes");
    if magic != MAGIC {
        return Err(PacketError::Magic(magic));
    }
    Ok(Header {
        seq: u32::from_le_bytes(buf[4..8].try_into().expect("4 bytes")),
        stamp_ns: u64::from_le_bytes(buf[8..16].try_into().expect("8 bytes")),
    })
}

/// Writes header `h` and the samples `sample(channel, frame)` into `buf` (a whole packet).
pub fn encode(
    h: Header,
    buf: &mut [u8; PACKET_BYTES],
    mut sample: impl FnMut(usize, usize) -> f32,
) {
    buf[0..4].copy_from_slice(&MAGIC);
    buf[4..8].copy_from_slice(&h.seq.to_le_bytes());
    buf[8..16].copy_from_slice(&h.stamp_ns.to_le_bytes());
    for frame in 0..FRAMES {
        for ch in 0..CHANNELS {
            let at = HEADER_BYTES + (frame * CHANNELS + ch) * 4;
            buf[at..at + 4].copy_from_slice(&sample(ch, frame).to_le_bytes());
        }
    }
}

/// Channel `ch`'s 32 samples of a packet whose header [`decode_header`] accepted.
pub fn channel(buf: &[u8], ch: usize, out: &mut [f32; FRAMES]) {
    for (frame, o) in out.iter_mut().enumerate() {
        let at = HEADER_BYTES + (frame * CHANNELS + ch) * 4;
        *o = f32::from_le_bytes(buf[at..at + 4].try_into().expect("4 bytes"));
    }
}

/// Where the host's datagrams go: its own socket, or one in the tess network service.
pub enum Link {
    /// A kernel socket of the engine's own.
    Direct(std::net::UdpSocket),
    /// A socket owned by the network service (`tess-netd`), reached over a channel.
    Service(Box<tess_net_client::UdpSocket>),
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Link::Direct(s) => write!(f, "Direct({:?})", s.local_addr().ok()),
            Link::Service(_) => f.write_str("Service"),
        }
    }
}

/// How long a receive waits before the serve loop looks at its stop flag and clock.
const RECV_TIMEOUT: Duration = Duration::from_millis(50);

/// How much earlier than a period after this packet arrived the next one may come: this
/// packet's own lateness (the sender's timer, the network, the wake-up), which the device's
/// thread leaves free of background pieces.
const ARRIVAL_SLACK_NS: u64 = 50_000;

impl Link {
    /// Binds `addr`: directly, or in the network service named `service`.
    pub fn bind(addr: SocketAddr, service: Option<&str>) -> io::Result<Link> {
        match service {
            None => {
                let s = std::net::UdpSocket::bind(addr)?;
                s.set_read_timeout(Some(RECV_TIMEOUT))?;
                Ok(Link::Direct(s))
            }
            Some(name) => {
                let mut s = tess_net_client::Net::named(name).udp_bind(addr)?;
                s.set_read_timeout(Some(RECV_TIMEOUT))?;
                s.set_wait(tess_net_client::Wait::Sleep);
                Ok(Link::Service(Box::new(s)))
            }
        }
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        match self {
            Link::Direct(s) => s.local_addr(),
            Link::Service(s) => s.local_addr(),
        }
    }

    /// Receives one datagram into `buf`; `None` when the wait timed out.
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<Option<(usize, SocketAddr)>> {
        let r = match self {
            Link::Direct(s) => s.recv_from(buf),
            Link::Service(s) => s.recv_from(buf),
        };
        match r {
            Ok(x) => Ok(Some(x)),
            // a timeout, or a signal (the stop flag is looked at next)
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    fn send_to(&mut self, buf: &[u8], to: SocketAddr) -> io::Result<usize> {
        match self {
            Link::Direct(s) => s.send_to(buf, to),
            Link::Service(s) => s.send_to(buf, to),
        }
    }
}

/// How many packets were lost before `seq` arrived when `expected` was due next: `Some(gap)`
/// for `seq` at or after `expected` (in sequence-number order, which wraps), `None` for a late
/// or duplicate packet (before `expected`), which must not move the expectation back.
fn gap(expected: u32, seq: u32) -> Option<u32> {
    let d = seq.wrapping_sub(expected);
    (d < 1 << 31).then_some(d)
}

/// What a serve run did.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ServeReport {
    /// Packets answered.
    pub answered: u64,
    /// Datagrams that were not packets (dropped, the first error in `first_malformed`).
    pub malformed: u64,
    /// The first malformed datagram's error.
    pub first_malformed: Option<String>,
    /// Device packets that never reached the engine (gaps in the sequence numbers).
    pub gaps: u64,
    /// Time from a packet's arrival in the engine to its answer being sent, us: median (over
    /// every packet of a run with `until`, else over the first 2^20, 12.7 minutes).
    pub turnaround_p50_us: f64,
    /// 99th percentile.
    pub turnaround_p99_us: f64,
    /// Largest.
    pub turnaround_max_us: f64,
    /// `tess~conv` long steps that missed their deadline (preemptive workers).
    #[serde(default)]
    pub conv_late: u64,
    /// Background pieces started before the next packet was due that ended after it
    /// (`--conv background`; on the device's thread or a worker hart).
    #[serde(default)]
    pub piece_overruns: u64,
    /// What the OSC input delivered and dropped (with `--osc-udp`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub osc: Option<crate::osc::OscStats>,
}

/// Serves the device with `engine` (opened with [`config`]) until `stop` is set or `until`
/// passes (from the first packet), polling `control` before each block. Errors only when the
/// socket fails.
pub fn serve(
    engine: &mut Engine,
    exec: &mut Executor,
    link: &mut Link,
    stop: &AtomicBool,
    until: Option<Duration>,
    control: &mut crate::play::ControlIn,
) -> io::Result<ServeReport> {
    let cfg = engine.config();
    if cfg.block != FRAMES || cfg.sample_rate != SAMPLE_RATE as f32 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "the device runs {FRAMES}-sample blocks at {SAMPLE_RATE} Hz; the engine was opened with {} at {} Hz",
                cfg.block, cfg.sample_rate
            ),
        ));
    }
    let (ins, outs) = (
        engine.input_channels().min(CHANNELS),
        engine.channels().min(CHANNELS),
    );
    // The first block splits the graph into tasks; do it before the device's first packet.
    engine.tick(exec);
    let mut report = ServeReport::default();
    // preallocated, so that recording never reallocates between two packets
    let expected = until.map_or(1 << 20, |u| {
        (u.as_nanos() as f64 / period_ns()) as usize + 16
    });
    let mut turnaround: Vec<u64> = Vec::with_capacity(expected);
    let mut rx = vec![0u8; PACKET_BYTES + 1];
    let mut tx = [0u8; PACKET_BYTES];
    let mut samples = [[0f32; FRAMES]; CHANNELS];
    let mut next_seq: Option<u32> = None;
    let mut started: Option<u64> = None;
    // On a cell's harts, the runtime stopping (tessd deleted the cell) stops the device too.
    while !stop.load(Ordering::Relaxed) && !exec.stop_requested() {
        if let (Some(t0), Some(u)) = (started, until) {
            if now_ns().saturating_sub(t0) >= u.as_nanos() as u64 {
                break;
            }
        }
        let Some((len, from)) = link.recv(&mut rx)? else {
            // No packet within the receive timeout: no block runs, so tessd's messages are
            // read here (on a cell's harts; Executor::checkpoint). No block is due either:
            // the workers' background work runs unbounded until packets come again.
            exec.checkpoint();
            exec.expect_next_block(0);
            continue;
        };
        let arrived = now_ns();
        started.get_or_insert(arrived);
        // The next packet is due a period after this one arrived (less this one's lateness):
        // the workers, idle during this block's answer, know it now.
        let next_due = arrived + (period_ns() as u64).saturating_sub(ARRIVAL_SLACK_NS);
        exec.expect_next_block(next_due);
        let h = match decode_header(&rx[..len]) {
            Ok(h) => h,
            Err(e) => {
                report.malformed += 1;
                report.first_malformed.get_or_insert_with(|| e.to_string());
                continue;
            }
        };
        match next_seq.map(|n| gap(n, h.seq)) {
            Some(None) => {} // late or duplicate: answered, the expectation stays
            Some(Some(lost)) => {
                report.gaps += u64::from(lost);
                next_seq = Some(h.seq.wrapping_add(1));
            }
            None => next_seq = Some(h.seq.wrapping_add(1)),
        }
        for (ch, s) in samples.iter_mut().enumerate().take(ins) {
            channel(&rx[..len], ch, s);
            engine.write_input(ch, s);
        }
        control.poll(engine);
        engine.tick(exec);
        for (ch, s) in samples.iter_mut().enumerate() {
            if ch < outs {
                engine.read_output(ch, s);
            } else {
                s.fill(0.0);
            }
        }
        encode(h, &mut tx, |ch, frame| samples[ch][frame]);
        link.send_to(&tx, from)?;
        report.answered += 1;
        if turnaround.len() < turnaround.capacity() {
            turnaround.push(now_ns() - arrived);
        }
        // Background work (`tess~conv --conv background`) in the quiet part of the period:
        // the next packet is due a period after this one arrived; only the pieces expected
        // to end before then start, so that a piece does not delay its answer (worker harts,
        // if any, run pieces while they wait for a block).
        engine.run_background_until(next_due);
    }
    turnaround.sort_unstable();
    report.turnaround_p50_us = percentile(&turnaround, 0.5);
    report.turnaround_p99_us = percentile(&turnaround, 0.99);
    report.turnaround_max_us = percentile(&turnaround, 1.0);
    report.conv_late = engine.conv_late();
    report.piece_overruns = engine.background_overruns();
    report.osc = control.osc_report();
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_packet_round_trips_through_encode_and_decode() {
        let mut buf = [0u8; PACKET_BYTES];
        let h = Header {
            seq: 7,
            stamp_ns: 123_456_789,
        };
        encode(h, &mut buf, |ch, frame| ch as f32 * 100.0 + frame as f32);
        assert_eq!(decode_header(&buf), Ok(h));
        let mut s = [0f32; FRAMES];
        channel(&buf, 3, &mut s);
        assert_eq!(s[0], 300.0);
        assert_eq!(s[31], 331.0);
        assert_eq!(PAYLOAD_BYTES, 1280, "the paper's payload");
    }

    #[test]
    fn gaps_count_lost_packets_and_never_a_late_one() {
        assert_eq!(gap(5, 5), Some(0));
        assert_eq!(gap(5, 8), Some(3));
        assert_eq!(gap(u32::MAX, 1), Some(2), "the sequence number wraps");
        assert_eq!(gap(5, 4), None, "late or duplicate");
        assert_eq!(gap(0, u32::MAX), None);
    }

    #[test]
    fn datagrams_that_are_not_packets_are_refused_with_the_reason() {
        assert_eq!(decode_header(&[0; 10]), Err(PacketError::Length(10)));
        let mut buf = [0u8; PACKET_BYTES];
        buf[0..4].copy_from_slice(b"NOPE");
        assert_eq!(decode_header(&buf), Err(PacketError::Magic(*b"NOPE")));
        assert!(PacketError::Length(10).to_string().contains("1296"));
    }

    #[test]
    fn the_engine_answers_each_packet_with_its_patch_applied_to_the_input() {
        let d = tempfile::tempdir().unwrap();
        let patch = d.path().join("gain.pd");
        // channel 1 doubled to output 1; channel 2 passed to output 2
        std::fs::write(
            &patch,
            "#N canvas 0 0 400 300 12;\n#X obj 10 10 adc~ 1 2;\n#X obj 10 40 *~ 2;\n\
             #X obj 10 70 dac~ 1 2;\n#X connect 0 0 1 0;\n#X connect 1 0 2 0;\n#X connect 0 1 2 1;\n",
        )
        .unwrap();
        let mut engine = Engine::open(&patch, config()).unwrap();
        let mut exec = Executor::serial();
        let mut link = Link::bind("127.0.0.1:0".parse().unwrap(), None).unwrap();
        let host = link.local_addr().unwrap();
        let device = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        device
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let server = s.spawn(|| {
                serve(
                    &mut engine,
                    &mut exec,
                    &mut link,
                    &stop,
                    None,
                    &mut crate::play::ControlIn::default(),
                )
            });
            // a stray datagram first: counted, dropped, the engine goes on
            device.send_to(b"hello", host).unwrap();
            let mut pkt = [0u8; PACKET_BYTES];
            let mut ans = [0u8; PACKET_BYTES + 1];
            for seq in 0..3u32 {
                let h = Header {
                    seq,
                    stamp_ns: 1000 + seq as u64,
                };
                encode(h, &mut pkt, |ch, frame| {
                    (ch as f32 + 1.0) * (frame as f32 + seq as f32) / 100.0
                });
                device.send_to(&pkt, host).unwrap();
                let (n, _) = device.recv_from(&mut ans).unwrap();
                assert_eq!(decode_header(&ans[..n]), Ok(h));
                let (mut out1, mut out2, mut out3) = ([0f32; 32], [0f32; 32], [0f32; 32]);
                channel(&ans[..n], 0, &mut out1);
                channel(&ans[..n], 1, &mut out2);
                channel(&ans[..n], 2, &mut out3);
                for f in 0..FRAMES {
                    let x = (f as f32 + seq as f32) / 100.0;
                    assert_eq!(out1[f], 2.0 * x, "frame {f} of packet {seq}");
                    assert_eq!(out2[f], 2.0 * x, "frame {f} of packet {seq}");
                    assert_eq!(out3[f], 0.0, "no dac~ 3");
                }
            }
            stop.store(true, Ordering::Relaxed);
            let r = server.join().unwrap().unwrap();
            assert_eq!(r.answered, 3);
            assert_eq!(r.malformed, 1);
            assert_eq!(r.gaps, 0);
            assert!(r.first_malformed.unwrap().contains("5"));
        });
    }
}
