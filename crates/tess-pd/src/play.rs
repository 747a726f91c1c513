//! Real-time play: the patch runs block by block against the clock, as an audio driver would
//! drive it, and every block is judged against its deadline (what `tess-pd play` does).
//!
//! # Timing
//! ```text
//! release(k) = t0 + k * P          P = block / sample rate (64 / 48000 s = 1333 us)
//! due(k)     = release(k + 1)      the block must be ready when the driver asks for the next
//! response   = done(k) - release(k)   a miss if done(k) > due(k)
//! ```
//! The engine sleeps until each release (`clock_nanosleep`, absolute), computes the block, and
//! records the response. When it falls more than one block behind it does what a driver's xrun
//! does: the releases already past are skipped (counted as misses, never computed late) and it
//! goes on from the next one. No audio device is needed; the output is computed and dropped.
//!
//! Each block is also published to the process's `pd` page (crate `tess-stats`), so `tess top`
//! and Prometheus show the engine's misses and tail while it plays.

use crate::engine::{Config, Engine, EngineError, EngineOptions};
use crate::sched::Executor;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tess_sched::clock::{now_ns, sleep_until_ns};

/// What a play run measured.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PlayReport {
    /// Block period, us.
    pub period_us: f64,
    /// Blocks computed.
    pub blocks: u64,
    /// Blocks done after their deadline.
    pub late: u64,
    /// Releases skipped because the engine was more than a block behind (xruns).
    pub skipped: u64,
    /// `late + skipped`.
    pub misses: u64,
    /// Response times (release to done), us: median, 99th and 99.9th percentile, largest.
    pub p50_us: f64,
    /// 99th percentile, us.
    pub p99_us: f64,
    /// 99.9th percentile, us.
    pub p999_us: f64,
    /// Largest, us.
    pub max_us: f64,
    /// Median compute time of a block (done minus start), us.
    pub compute_p50_us: f64,
    /// `tess~conv` long steps that missed their deadline (preemptive workers).
    pub conv_late: u64,
    /// Background pieces started before a release that ended after it (`--conv
    /// background`; on this thread or a worker hart): each delayed that block, or kept a
    /// worker out of it.
    pub piece_overruns: u64,
    /// What the OSC input delivered and dropped (with `--osc-udp`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub osc: Option<crate::osc::OscStats>,
    /// The harts the graph was split for, in order (none for the serial strategy): one entry,
    /// or on a cell's harts (`--harts cell`) one more after each resize of the cell
    /// ([`Executor::splits`]).
    pub splits: Vec<usize>,
}

/// The sample at or above rank `q` of `sorted` ns samples, in us (0 when there are none).
pub(crate) fn percentile(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i] as f64 / 1e3
}

/// Control input the engine polls before each block, as Pd polls its MIDI queue and network
/// objects: non-blocking UDP sockets for raw MIDI (each datagram MIDI bytes, to `notein` and
/// `ctlin`) and for OSC ([`crate::osc`]).
#[derive(Debug, Default)]
pub struct ControlIn {
    /// Raw MIDI datagrams (`--midi-udp`).
    pub midi: Option<std::net::UdpSocket>,
    /// OSC datagrams (`--osc-udp`).
    pub osc: Option<std::net::UdpSocket>,
    /// What the OSC input delivered and dropped.
    pub osc_stats: crate::osc::OscStats,
}

/// A non-blocking UDP socket bound to `addr`, as [`ControlIn`] polls them.
pub fn control_socket(addr: std::net::SocketAddr) -> std::io::Result<std::net::UdpSocket> {
    let s = std::net::UdpSocket::bind(addr)?;
    s.set_nonblocking(true)?;
    Ok(s)
}

impl ControlIn {
    /// Binds the sockets asked for ([`control_socket`]).
    pub fn bind(
        midi: Option<std::net::SocketAddr>,
        osc: Option<std::net::SocketAddr>,
    ) -> std::io::Result<ControlIn> {
        Ok(ControlIn {
            midi: midi.map(control_socket).transpose()?,
            osc: osc.map(control_socket).transpose()?,
            osc_stats: Default::default(),
        })
    }

    /// What the OSC input did, if it is on (for a run's report).
    pub fn osc_report(&self) -> Option<crate::osc::OscStats> {
        self.osc.is_some().then(|| self.osc_stats.clone())
    }

    /// Delivers every datagram that has arrived to `e` (call between blocks).
    pub fn poll(&mut self, e: &mut Engine) {
        let mut buf = [0u8; 1500];
        if let Some(sock) = &self.midi {
            while let Ok(n) = sock.recv(&mut buf) {
                e.midi_in(&buf[..n]);
            }
        }
        if let Some(sock) = &self.osc {
            while let Ok(n) = sock.recv(&mut buf) {
                crate::osc::deliver(e, &buf[..n], &mut self.osc_stats);
            }
        }
    }
}

/// Plays `patch` for `seconds` (or until `stop`), judging every block against its deadline;
/// `control` is polled before each block.
pub fn play(
    patch: &Path,
    config: Config,
    options: &EngineOptions,
    seconds: f64,
    exec: &mut Executor,
    stop: &AtomicBool,
    control: &mut ControlIn,
) -> Result<PlayReport, EngineError> {
    let mut e = Engine::open_with(patch, config, options)?;
    let period_ns = (config.block as f64 / config.sample_rate as f64 * 1e9).round() as u64;
    let total = ((seconds * 1e9) / period_ns as f64).round().max(1.0) as u64;
    let published = tess_stats::Publisher::try_create("pd", Some(Duration::from_nanos(period_ns)));
    let mut response = Vec::with_capacity(total as usize);
    let mut compute = Vec::with_capacity(total as usize);
    let (mut late, mut skipped) = (0u64, 0u64);
    // The first block computes the graph's task split; do it before the clock starts.
    e.tick(exec);
    let t0 = now_ns() + period_ns;
    let mut k = 0u64;
    // On a cell's harts, the runtime stopping (tessd deleted the cell) stops the play too.
    while k < total && !stop.load(Ordering::Relaxed) && !exec.stop_requested() {
        let release = t0 + k * period_ns;
        // Until the block is due, this thread's time is the background work's: the pieces
        // expected to end before the release (on every hart).
        exec.expect_next_block(release);
        e.run_background_until(release);
        sleep_until_ns(release);
        let start = now_ns();
        control.poll(&mut e);
        e.tick(exec);
        let done = now_ns();
        let resp = done.saturating_sub(release);
        let due = release + period_ns;
        if done > due {
            late += 1;
        }
        response.push(resp);
        compute.push(done - start);
        if let Some(p) = &published {
            p.record(resp);
        }
        // More than a block behind: the releases already past are xruns.
        let next = (done.saturating_sub(t0) / period_ns).clamp(k + 1, total.max(k + 1));
        skipped += next - (k + 1);
        k = next;
    }
    response.sort_unstable();
    compute.sort_unstable();
    Ok(PlayReport {
        period_us: period_ns as f64 / 1e3,
        blocks: response.len() as u64,
        late,
        skipped,
        misses: late + skipped,
        p50_us: percentile(&response, 0.5),
        p99_us: percentile(&response, 0.99),
        p999_us: percentile(&response, 0.999),
        max_us: response.last().map_or(0.0, |v| *v as f64 / 1e3),
        compute_p50_us: percentile(&compute, 0.5),
        conv_late: e.conv_late(),
        piece_overruns: e.background_overruns(),
        osc: control.osc_report(),
        splits: exec.splits().to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_take_the_sample_at_or_above_the_rank() {
        let v: Vec<u64> = (1..=1000).map(|i| i * 1000).collect();
        assert_eq!(percentile(&v, 0.5), 500.0);
        assert_eq!(percentile(&v, 0.99), 990.0);
        assert_eq!(percentile(&v, 0.999), 999.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }

    #[test]
    fn control_datagrams_reach_the_patch_before_the_next_block() {
        let d = tempfile::tempdir().unwrap();
        let patch = d.path().join("r.pd");
        std::fs::write(
            &patch,
            "#N canvas 0 0 400 300 12;\n#X obj 10 10 r level;\n#X obj 10 40 sig~;\n\
             #X obj 10 70 dac~ 1;\n#X obj 100 10 notein;\n#X obj 100 40 sig~;\n\
             #X obj 100 70 dac~ 2;\n#X connect 0 0 1 0;\n#X connect 1 0 2 0;\n\
             #X connect 3 0 4 0;\n#X connect 4 0 5 0;\n",
        )
        .unwrap();
        let mut e = Engine::open(
            &patch,
            Config {
                sample_rate: 48000.0,
                block: 64,
            },
        )
        .unwrap();
        let local: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
        let mut c = ControlIn::bind(Some(local), Some(local)).unwrap();
        let (midi, osc) = (
            c.midi.as_ref().unwrap().local_addr().unwrap(),
            c.osc.as_ref().unwrap().local_addr().unwrap(),
        );
        let tx = std::net::UdpSocket::bind(local).unwrap();
        let packet = rosc::encoder::encode(&rosc::OscPacket::Message(rosc::OscMessage {
            addr: "/level".into(),
            args: vec![rosc::OscType::Float(0.75)],
        }))
        .unwrap();
        tx.send_to(&packet, osc).unwrap();
        tx.send_to(&[0x90, 60, 100], midi).unwrap();
        // loopback delivers at once; allow the kernel a moment all the same
        std::thread::sleep(std::time::Duration::from_millis(20));
        c.poll(&mut e);
        e.tick(&mut Executor::serial());
        let mut out = [0f32; 64];
        e.read_output(0, &mut out);
        assert_eq!(out[0], 0.75, "the OSC message set the level");
        e.read_output(1, &mut out);
        assert_eq!(out[0], 60.0, "the MIDI note reached notein");
        assert_eq!(c.osc_stats.delivered, 1);
    }

    #[test]
    fn a_light_patch_plays_in_time() {
        let d = tempfile::tempdir().unwrap();
        let patch = d.path().join("osc.pd");
        std::fs::write(
            &patch,
            "#N canvas 0 0 400 300 12;\n#X obj 10 10 osc~ 440;\n#X obj 10 40 *~ 0.1;\n\
             #X obj 10 70 dac~;\n#X connect 0 0 1 0;\n#X connect 1 0 2 0;\n#X connect 1 0 2 1;\n",
        )
        .unwrap();
        let cfg = Config {
            sample_rate: 48000.0,
            block: 64,
        };
        let r = play(
            &patch,
            cfg,
            &EngineOptions::default(),
            0.2,
            &mut Executor::serial(),
            &AtomicBool::new(false),
            &mut ControlIn::default(),
        )
        .unwrap();
        assert!((r.period_us - 1333.333).abs() < 0.01, "{r:?}");
        // 0.2 s of 1.333 ms blocks: 150 releases, each computed or skipped.
        assert_eq!(r.blocks + r.skipped, 150, "{r:?}");
        assert!(r.p50_us > 0.0 && r.max_us >= r.p99_us && r.p99_us >= r.p50_us);
    }
}
