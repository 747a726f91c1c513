//! The display of the conference experiment: the frame sink, a service in a cell of its own
//! (the paper's GUI service; this one counts frames, it does not draw them).
//!
//! It registers [`DISPLAY_SERVICE`] with tessd's nameserver, open to the video cell. Each of
//! the video cell's streams connects to it by name ([`connect`]) and gets a shared-memory
//! channel of its own, over which it sends a [`Shown`] record of every decoded frame; the
//! display counts each frame in the second of its release, on time when it was decoded
//! within [`PLAYOUT_NS`] of it ([`Tally`]). The records carry their own times, so the display
//! need not be prompt: it drains the channels every 100 ms.

use super::roles::{bump, window_of, VideoOut, GRACE_NS, PLAYOUT_NS};
use super::wire::{Schedule, STREAMS};
use std::time::Duration;
use tess_heartbeat::clock::now_ns;
use tess_proto::client::ApiError;
use tess_proto::ErrorKind;

/// The display's name at tessd's nameserver.
pub const DISPLAY_SERVICE: &str = "conf-display";

/// One decoded frame, as the video cell reports it to the display.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Shown {
    pub stream: u8,
    pub release_ns: u64,
    pub arrival_ns: u64,
    pub done_ns: u64,
}

impl Shown {
    pub const LEN: usize = 25;
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0] = self.stream;
        b[1..9].copy_from_slice(&self.release_ns.to_le_bytes());
        b[9..17].copy_from_slice(&self.arrival_ns.to_le_bytes());
        b[17..25].copy_from_slice(&self.done_ns.to_le_bytes());
        b
    }
    pub fn decode(b: &[u8]) -> Option<Shown> {
        if b.len() != Self::LEN {
            return None;
        }
        let u = |r: std::ops::Range<usize>| u64::from_le_bytes(b[r].try_into().expect("8 bytes"));
        Some(Shown {
            stream: b[0],
            release_ns: u(1..9),
            arrival_ns: u(9..17),
            done_ns: u(17..25),
        })
    }
}

/// A stream's channel to the display, through tessd's nameserver. The display starts first,
/// but it may not have registered yet: while the name is unknown it is asked for again, until
/// the streams' start `t0_ns` (the bench leaves seconds for that); any other error is final.
pub(super) fn connect(t0_ns: u64) -> anyhow::Result<tess_channel::Endpoint> {
    loop {
        match tess_proto::ns::connect(DISPLAY_SERVICE) {
            Ok((endpoint, _)) => return Ok(endpoint),
            Err(ApiError::Daemon {
                kind: ErrorKind::NotFound,
                ..
            }) if now_ns() < t0_ns => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => anyhow::bail!("cannot reach the display ({DISPLAY_SERVICE}): {e}"),
        }
    }
}

/// The display: registers [`DISPLAY_SERVICE`] (open to the video cell's processes, and to root
/// as every service is), takes every decoded frame's record off the channel of the stream that
/// sent it and counts it against its display deadline, until all [`STREAMS`] streams have
/// connected and hung up, or a grace period after the last release.
pub fn run(sched: Schedule, video_cell: &str) -> anyhow::Result<VideoOut> {
    let opts = tess_channel::ChannelOptions::for_max_message(Shown::LEN);
    let access = tess_proto::ns::Access {
        cells: vec![video_cell.to_string()],
        ..Default::default()
    };
    let mut service = tess_proto::ns::Service::register(DISPLAY_SERVICE, access, &opts)
        .map_err(|e| anyhow::anyhow!("registering {DISPLAY_SERVICE}: {e}"))?;
    let mut tally = Tally::new(sched.t0_ns);
    let mut from: Vec<tess_channel::Endpoint> = Vec::new();
    let mut open: Vec<bool> = Vec::new();
    let mut errors = Vec::new();
    let mut buf = [0u8; 64];
    let all_gone = |from: &[tess_channel::Endpoint], open: &[bool]| {
        from.len() >= STREAMS && open.iter().all(|&o| !o)
    };
    while !all_gone(&from, &open) && now_ns() < sched.end_ns() + GRACE_NS {
        while service
            .client_waiting()
            .map_err(|e| anyhow::anyhow!("{DISPLAY_SERVICE}: {e}"))?
        {
            let inc = service
                .accept()
                .map_err(|e| anyhow::anyhow!("{DISPLAY_SERVICE}: accepting a stream: {e}"))?;
            from.push(inc.endpoint);
            open.push(true);
        }
        let mut got = false;
        for (k, ep) in from.iter_mut().enumerate() {
            // A peer that died without closing its end (killed, crashed) is seen by its
            // liveness socket. Asked before draining: all a dead peer sent is in the ring
            // already, so its channel is done when the drain finds it empty.
            let alive = open[k] && ep.is_peer_alive();
            while open[k] {
                match ep.try_recv(&mut buf) {
                    Ok(n) => {
                        got = true;
                        if let Some(s) = Shown::decode(&buf[..n]) {
                            tally.add(&s);
                        }
                    }
                    Err(tess_channel::TryRecvError::Empty) if alive => break,
                    Err(tess_channel::TryRecvError::Empty) => open[k] = false,
                    Err(tess_channel::TryRecvError::Corrupted(e)) => {
                        errors.push(format!("display: stream channel {k}: {e}"));
                        open[k] = false;
                    }
                    Err(_) => open[k] = false,
                }
            }
        }
        if !got {
            // The records carry their own times: the display need not be prompt (a ring holds
            // more than 100 ms of frames), and waking seldom keeps it off the shared hart.
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let mut out = tally.finish();
    out.errors = errors;
    if from.len() < STREAMS {
        out.errors.push(format!(
            "display: {} of {STREAMS} streams connected",
            from.len()
        ));
    }
    Ok(out)
}

/// What the display counts: each frame in the 1 s window of its release, on time when decoded
/// within [`PLAYOUT_NS`] of it, and the spread of its times.
struct Tally {
    t0_ns: u64,
    out: VideoOut,
    e2e: Vec<u64>,
    transfer: Vec<u64>,
    decode: Vec<u64>,
}

impl Tally {
    fn new(t0_ns: u64) -> Tally {
        Tally {
            t0_ns,
            out: VideoOut::default(),
            e2e: Vec::new(),
            transfer: Vec::new(),
            decode: Vec::new(),
        }
    }

    /// Counts one frame's record (one released before `t0` is not counted).
    fn add(&mut self, s: &Shown) {
        let Some(w) = window_of(s.release_ns, self.t0_ns) else {
            return;
        };
        let out = &mut self.out;
        for v in [&mut out.frames, &mut out.on_time] {
            bump(v, w).resize(STREAMS, 0);
        }
        let st = usize::from(s.stream).min(STREAMS - 1);
        out.frames[w][st] += 1;
        if s.done_ns <= s.release_ns + PLAYOUT_NS {
            out.on_time[w][st] += 1;
        }
        self.e2e.push(s.done_ns.saturating_sub(s.release_ns));
        self.transfer
            .push(s.arrival_ns.saturating_sub(s.release_ns));
        self.decode.push(s.done_ns.saturating_sub(s.arrival_ns));
    }

    fn finish(mut self) -> VideoOut {
        // In ms; no frames at all give zeros (the run's frame counts say so; JSON has no NaN).
        let ms = |v: &[u64]| {
            let s = tess_bench::Summary::of_ns(v);
            [s.median / 1e6, s.p99 / 1e6, s.max / 1e6]
        };
        self.out.e2e_ms = ms(&self.e2e);
        let [p50, p99, _] = ms(&self.transfer);
        self.out.transfer_ms = [p50, p99];
        let [p50, p99, _] = ms(&self.decode);
        self.out.decode_ms = [p50, p99];
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shown_frame_round_trips_and_garbage_is_refused() {
        let s = Shown {
            stream: 3,
            release_ns: 1,
            arrival_ns: 2,
            done_ns: u64::MAX,
        };
        assert_eq!(Shown::decode(&s.encode()), Some(s));
        assert_eq!(Shown::decode(&[0u8; 3]), None);
    }

    #[test]
    fn the_display_counts_frames_by_release_window_against_the_deadline() {
        let t0 = 1_000_000_000;
        let mut t = Tally::new(t0);
        let frame = |stream, release_ns, done_ns| Shown {
            stream,
            release_ns,
            arrival_ns: release_ns + 1_000_000,
            done_ns,
        };
        // window 0: stream 1 on time, stream 2 late; window 2: stream 1 exactly at the deadline
        t.add(&frame(1, t0 + 10, t0 + 10 + PLAYOUT_NS / 2));
        t.add(&frame(2, t0 + 20, t0 + 20 + PLAYOUT_NS + 1));
        t.add(&frame(
            1,
            t0 + 2_500_000_000,
            t0 + 2_500_000_000 + PLAYOUT_NS,
        ));
        // released before t0: not counted; a stream id out of range counts as the last stream
        t.add(&frame(0, t0 - 1, t0 + 5));
        t.add(&frame(200, t0 + 30, t0 + 40));
        let out = t.finish();
        assert_eq!(out.frames.len(), 3);
        assert_eq!(out.frames[0][1], 1);
        assert_eq!(out.frames[0][2], 1);
        assert_eq!(out.frames[0][STREAMS - 1], 1);
        assert_eq!(out.on_time[0][1], 1);
        assert_eq!(out.on_time[0][2], 0, "late by 1 ns");
        assert!(out.frames[1].is_empty(), "an empty window has no row");
        assert_eq!(out.on_time[2][1], 1, "at the deadline is on time");
        assert_eq!(out.frames.iter().flatten().sum::<u32>(), 4);
        assert!(
            out.e2e_ms[2] > 100.0 && out.e2e_ms[2] < 100.1,
            "{:?}",
            out.e2e_ms
        );
    }
}
