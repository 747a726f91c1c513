//! Test support (not part of the channel API): the hostile-peer fuzzer and the entry points of
//! the `cargo fuzz` targets in `crates/tess-channel/fuzz`.
//!
//! # The hostile-peer fuzzer ([`hostile`])
//!
//! Round after round, a fresh channel is made. This process keeps end A, the real endpoint, and
//! drives it with every non-blocking and bounded operation at random. A forked child, pinned to
//! the other hart, plays end B: an honest echo peer (the real endpoint, so records wrap, pad and
//! fill the ring) that between its own steps writes the shared segment at random, with a
//! strategy and a rate drawn for the round (random words anywhere, well-formed but lying record
//! headers, impossible heads, flag and futex storms, bit flips near the live indices, or dying
//! in the middle of a message). Each round ends by killing the child without a hang-up, after
//! which a blocking receive and a blocking send must both return.
//!
//! Checked: no crash (an out-of-bounds access would hit the guard pages around the mapping and
//! kill the process), no hang (a watchdog thread aborts the process if a round makes no
//! progress for [`HANG_LIMIT`]), and only the errors each operation promises. Run it with
//! `cargo run --release -p tess-channel --example hostile -- --secs 600` (the 10-minute run);
//! `tests/hostile.rs` runs it for 20 s.

use crate::bench::proc::spawn_pinned;
use crate::layout::{ctrl_offset, header_word, record_size, ChannelHeader, Geometry, PAGE};
use crate::layout::{CTRL_HEAD, CTRL_RX_SLEEP, CTRL_TX_SLEEP};
use crate::region::Region;
use crate::ring::{decode_record, RecordWord};
use crate::shm::Mapping;
use crate::*;
use std::collections::BTreeMap;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A round that makes no progress for this long is a hang: the watchdog aborts the process.
pub const HANG_LIMIT: Duration = Duration::from_secs(30);

/// Parameters of [`hostile`].
#[derive(Debug, Clone)]
pub struct HostileOptions {
    /// Total running time.
    pub duration: Duration,
    /// Seed of every random choice (the child of round `r` uses `seed + r`).
    pub seed: u64,
    /// Ring capacity per direction (small, so records wrap often).
    pub capacity: usize,
    /// Largest message.
    pub max_message: usize,
    /// Hart of this process (the real endpoint).
    pub hart: usize,
    /// Hart of the hostile child.
    pub child_hart: usize,
}

impl Default for HostileOptions {
    fn default() -> Self {
        HostileOptions {
            duration: Duration::from_secs(20),
            seed: 0x7e55_c4a2,
            capacity: 8192,
            max_message: 1024,
            hart: 0,
            child_hart: 1,
        }
    }
}

/// What a [`hostile`] run saw.
#[derive(Debug, Default, Clone)]
pub struct HostileReport {
    /// Rounds run (one channel and one child each).
    pub rounds: u64,
    /// Rounds per strategy.
    pub strategies: BTreeMap<&'static str, u64>,
    /// How often each operation ended each way (`"recv ok"`, `"send corrupted"`, ...).
    pub outcomes: BTreeMap<&'static str, u64>,
    /// Operations on the real endpoint.
    pub operations: u64,
}

impl std::fmt::Display for HostileReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{} rounds, {} operations on the real endpoint; no crash, no hang, no unpromised error",
            self.rounds, self.operations
        )?;
        writeln!(f, "strategies: {:?}", self.strategies)?;
        write!(f, "outcomes: {:?}", self.outcomes)
    }
}

#[derive(Debug, Clone, Copy)]
enum Strategy {
    RandomWords,
    PlausibleRecords,
    HeadGames,
    FlagStorm,
    BitFlips,
    DieMidMessage,
    Mixed,
}

const STRATEGIES: [Strategy; 7] = [
    Strategy::RandomWords,
    Strategy::PlausibleRecords,
    Strategy::HeadGames,
    Strategy::FlagStorm,
    Strategy::BitFlips,
    Strategy::DieMidMessage,
    Strategy::Mixed,
];

impl Strategy {
    fn name(self) -> &'static str {
        match self {
            Strategy::RandomWords => "random words",
            Strategy::PlausibleRecords => "plausible records",
            Strategy::HeadGames => "head games",
            Strategy::FlagStorm => "flag storm",
            Strategy::BitFlips => "bit flips",
            Strategy::DieMidMessage => "die mid-message",
            Strategy::Mixed => "mixed",
        }
    }
}

/// xorshift64: allocation-free randomness for the forked child.
fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// Runs the hostile-peer fuzzer (module docs) and returns what it saw; an error only if the
/// harness itself failed (fork, pinning). A crash or hang of the channel ends the process.
pub fn hostile(opts: &HostileOptions) -> anyhow::Result<HostileReport> {
    use anyhow::Context;
    tess_sched::affinity::set_affinity(0, &tess_sched::HartSet::single(opts.hart))
        .with_context(|| format!("pinning the fuzzer to hart {}", opts.hart))?;
    let heartbeat = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let watchdog = {
        let (heartbeat, done) = (heartbeat.clone(), done.clone());
        std::thread::spawn(move || {
            let mut last = (0, Instant::now());
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                let beat = heartbeat.load(Ordering::Relaxed);
                if beat != last.0 {
                    last = (beat, Instant::now());
                } else if last.1.elapsed() > HANG_LIMIT {
                    eprintln!(
                        "hostile fuzzer: no progress for {HANG_LIMIT:?} (beat {beat}): the \
                         real endpoint hangs"
                    );
                    std::process::abort();
                }
            }
        })
    };
    let mut report = HostileReport::default();
    let t0 = Instant::now();
    let mut x = opts.seed | 1;
    while t0.elapsed() < opts.duration {
        let strategy = STRATEGIES[next(&mut x) as usize % STRATEGIES.len()];
        // From a scribble per honest step to one per ~4000 spins: sometimes the traffic flows.
        let quiet_spins = [0u32, 10, 200, 4000][next(&mut x) as usize % 4];
        let round_ms = 50 + next(&mut x) % 400;
        round(
            opts,
            strategy,
            quiet_spins,
            opts.seed.wrapping_add(report.rounds),
            Duration::from_millis(round_ms),
            &heartbeat,
            &mut report,
        )
        .with_context(|| format!("round {} ({})", report.rounds, strategy.name()))?;
        report.rounds += 1;
        *report.strategies.entry(strategy.name()).or_default() += 1;
    }
    done.store(true, Ordering::Relaxed);
    watchdog.join().expect("watchdog thread");
    Ok(report)
}

fn round(
    opts: &HostileOptions,
    strategy: Strategy,
    quiet_spins: u32,
    seed: u64,
    duration: Duration,
    heartbeat: &AtomicU64,
    report: &mut HostileReport,
) -> anyhow::Result<()> {
    let (cap, max) = (opts.capacity, opts.max_message);
    let (a, b) = Channel::create(&ChannelOptions {
        capacity: cap,
        max_message_size: max,
    })?;
    // The child's own view of the whole segment, to scribble on (mapped before the fork).
    let raw = Mapping::map(b.memfd.as_fd(), Geometry::new(cap, max)?.total_size())?;
    let mut ep = Endpoint::from_fds(a)?;
    let mut peer = Endpoint::from_fds(b)?;
    ep.set_liveness_interval(Duration::from_millis(5));
    let child = spawn_pinned(opts.child_hart, || {
        hostile_child(
            &mut peer,
            raw.region(),
            cap,
            max,
            strategy,
            quiet_spins,
            seed,
        )
    })?;
    // The child holds B now; this process must not, or B's death would not show.
    peer.discard();
    drop(raw);

    // Counts an outcome; false: not a corruption.
    let mut note = |what: &'static str| {
        *report.outcomes.entry(what).or_default() += 1;
        false
    };
    let mut buf = vec![0u8; max];
    let mut x = seed.rotate_left(17) | 1;
    let t0 = Instant::now();
    while t0.elapsed() < duration {
        heartbeat.fetch_add(1, Ordering::Relaxed);
        report.operations += 1;
        let r = next(&mut x);
        let len = (r >> 8) as usize % (max + 1);
        let corrupted = match r % 6 {
            0 => match ep.try_send(&buf[..len]) {
                Ok(()) => note("send ok"),
                Err(TrySendError::Full) => note("send full"),
                Err(TrySendError::Disconnected) => note("send disconnected"),
                Err(TrySendError::Corrupted(_)) => true,
                Err(e) => panic!("{}: try_send: unpromised {e}", strategy.name()),
            },
            1 => match ep.recv_timeout(&mut buf, Duration::from_micros(200)) {
                Ok(n) => {
                    assert!(n <= max, "received {n} > {max} bytes");
                    note("recv ok")
                }
                Err(RecvTimeoutError::Timeout) => note("recv timeout"),
                Err(RecvTimeoutError::Disconnected) => note("recv disconnected"),
                Err(RecvTimeoutError::Corrupted(_)) => true,
                Err(e) => panic!("{}: recv_timeout: unpromised {e}", strategy.name()),
            },
            2 => match ep.try_peek() {
                Ok(mut m) => {
                    let n = m.len();
                    assert!(n <= max, "peeked {n} > {max} bytes");
                    if n > 0 {
                        let mut part = [0u8; 8];
                        let k = n.min(8);
                        m.read(n - k, &mut part[..k]);
                    }
                    std::hint::black_box(m.bytes());
                    if r & 1 << 40 != 0 {
                        m.release();
                    }
                    note("peek ok")
                }
                Err(TryRecvError::Empty) => note("peek empty"),
                Err(TryRecvError::Disconnected) => note("peek disconnected"),
                Err(TryRecvError::Corrupted(_)) => true,
                Err(e) => panic!("{}: try_peek: unpromised {e}", strategy.name()),
            },
            3 => match ep.try_recv_batch(16, |m| assert!(m.len() <= max)) {
                Ok(_) => note("batch ok"),
                Err(TryRecvError::Empty) => note("batch empty"),
                Err(TryRecvError::Disconnected) => note("batch disconnected"),
                Err(TryRecvError::Corrupted(_)) => true,
                Err(e) => panic!("{}: try_recv_batch: unpromised {e}", strategy.name()),
            },
            4 => match ep.reserve_timeout(len, Duration::from_micros(100)) {
                Ok(mut slot) => {
                    let half = len / 2;
                    slot.write(0, &buf[..half]);
                    slot.buffer()[half..].fill(7);
                    slot.commit();
                    note("reserve ok")
                }
                Err(SendTimeoutError::Timeout) => note("reserve timeout"),
                Err(SendTimeoutError::Disconnected) => note("reserve disconnected"),
                Err(SendTimeoutError::Corrupted(_)) => true,
                Err(e) => panic!("{}: reserve_timeout: unpromised {e}", strategy.name()),
            },
            _ => {
                let msgs = [&buf[..len / 3], &buf[..len / 5], &buf[..len / 7]];
                match ep.try_send_batch(&msgs) {
                    Ok(_) => note("batch send ok"),
                    Err(TrySendError::Full) => note("batch send full"),
                    Err(TrySendError::Disconnected) => note("batch send disconnected"),
                    Err(TrySendError::Corrupted(_)) => true,
                    Err(e) => panic!("{}: try_send_batch: unpromised {e}", strategy.name()),
                }
            }
        };
        if corrupted {
            // Sticky from now on: the round is over for this endpoint.
            note("corrupted");
            break;
        }
    }
    // Kill the child: no hang-up, only the kernel's notice. Blocking calls must return.
    drop(child);
    let mut received = 0u64;
    let recv_end = loop {
        heartbeat.fetch_add(1, Ordering::Relaxed);
        match ep.recv(&mut buf) {
            Ok(_) => received += 1,
            Err(e) => break e,
        }
        assert!(received < 1_000_000, "endless messages from a dead peer");
    };
    assert!(
        matches!(recv_end, RecvError::Disconnected | RecvError::Corrupted(_)),
        "{}: recv after the peer's death: {recv_end}",
        strategy.name()
    );
    let send_end = loop {
        heartbeat.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = ep.send(&buf[..max / 2]) {
            break e;
        }
    };
    assert!(
        matches!(send_end, SendError::Disconnected | SendError::Corrupted(_)),
        "{}: send after the peer's death: {send_end}",
        strategy.name()
    );
    note(match recv_end {
        RecvError::Corrupted(_) => "after death: recv corrupted",
        _ => "after death: recv disconnected",
    });
    Ok(())
}

/// The hostile child: an honest echo on B between scribbles. Allocates nothing (it runs after a
/// fork of a multi-threaded process).
fn hostile_child(
    peer: &mut Endpoint,
    mem: Region,
    cap: usize,
    max: usize,
    strategy: Strategy,
    quiet_spins: u32,
    seed: u64,
) -> i32 {
    let mut x = seed | 1;
    let mut buf = [0u8; 4096];
    let buf = &mut buf[..max.min(4096)];
    // Ring 1 (B -> A) is what the real endpoint reads; ring 0 (A -> B) what it writes.
    let read_by_a = PAGE + cap;
    let mut forged: u64 = 0;
    let die_after = 1 + next(&mut x) % 5000;
    for step in 0u64.. {
        // Honest part: echo what arrives, sometimes send something new.
        if let Ok(n) = peer.try_recv(buf) {
            let _ = peer.try_send(&buf[..n]);
        }
        if next(&mut x) % 3 == 0 {
            let n = next(&mut x) as usize % (buf.len() + 1);
            let _ = peer.try_send(&buf[..n]);
        }
        for _ in 0..quiet_spins {
            std::hint::spin_loop();
        }
        let r = next(&mut x);
        let s = match strategy {
            Strategy::Mixed => STRATEGIES[r as usize % (STRATEGIES.len() - 1)],
            s => s,
        };
        let word_in = |base: usize, r: u64| base + (((r as usize) % cap) & !7);
        match s {
            Strategy::RandomWords => {
                let off = (r as usize % mem.len()) & !7;
                mem.store_u64(off, next(&mut x), Ordering::Relaxed);
            }
            Strategy::PlausibleRecords => {
                // Well-formed headers with the right sequence at a forged index that follows
                // its own records (and jumps now and then), random lengths up to 1.25 max.
                let len = (r >> 16) as usize % (max + max / 4 + 1);
                let off = (forged as usize) % cap;
                if off + record_size(len) > cap || r % 17 == 0 {
                    let pad = (cap - off) as u32;
                    mem.store_u64(
                        read_by_a + off,
                        header_word(forged, pad, true),
                        Ordering::Release,
                    );
                    forged += pad as u64;
                } else {
                    mem.store_u64(
                        read_by_a + off,
                        header_word(forged, len as u32, false),
                        Ordering::Release,
                    );
                    forged += record_size(len) as u64;
                }
                if r % 5 == 0 {
                    forged = forged.wrapping_add((r >> 32) & !7);
                }
            }
            Strategy::HeadGames => {
                let v = match r % 4 {
                    0 => r,
                    1 => r & !7,
                    2 => mem.load_u64(ctrl_offset(0) + CTRL_HEAD, Ordering::Relaxed) + 8,
                    _ => 0,
                };
                mem.store_u64(ctrl_offset(0) + CTRL_HEAD, v, Ordering::Release);
            }
            Strategy::FlagStorm => {
                for ring in 0..2 {
                    let off = ctrl_offset(ring)
                        + [CTRL_RX_SLEEP, CTRL_TX_SLEEP, 384, 388][r as usize % 4];
                    mem.store_u32(off, (r >> 8) as u32 & 1, Ordering::Relaxed);
                    mem.futex_wake(off);
                }
            }
            Strategy::BitFlips => {
                // Flip one bit of a word near where the real endpoint reads or writes next.
                let ring = (r >> 3) as usize % 2;
                let head = mem.load_u64(ctrl_offset(ring) + CTRL_HEAD, Ordering::Relaxed);
                let base = PAGE + ring * cap;
                let off = base + ((((head as usize) + ((r as usize >> 8) % 64) * 8) % cap) & !7);
                let w = mem.load_u64(off, Ordering::Relaxed);
                mem.store_u64(off, w ^ (1 << (r >> 58)), Ordering::Relaxed);
            }
            Strategy::DieMidMessage => {
                if step >= die_after {
                    // Reserve, write half, publish nothing (or publish a header for a payload
                    // never written), and die.
                    if let Ok(mut slot) = peer.try_reserve(buf.len()) {
                        let half = buf.len() / 2;
                        slot.write(0, &buf[..half]);
                        // Dropped uncommitted: half a message lies in the ring, unpublished.
                    }
                    if r % 2 == 0 {
                        let at = word_in(read_by_a, r);
                        mem.store_u64(
                            at,
                            header_word((at - read_by_a) as u64, max as u32, false),
                            Ordering::Release,
                        );
                    }
                    return 0;
                }
            }
            Strategy::Mixed => unreachable!(),
        }
    }
    0
}

/// Parses a channel header from arbitrary bytes, as an opener does after copying it out of
/// shared memory; the `cargo fuzz` target `header` feeds it. Panics only on a bug.
pub fn parse_header(bytes: &[u8]) -> Option<Geometry> {
    let h = ChannelHeader::decode(bytes)?;
    let g = Geometry::validate(&h).ok()?;
    // A validated geometry must describe a layout whose every offset fits the file.
    assert!(g.capacity.is_power_of_two());
    assert!(Geometry::capacity_for(g.max_message) <= g.capacity);
    assert_eq!(h.total_size as usize, g.total_size());
    for r in 0..2 {
        assert!(ctrl_offset(r) + crate::layout::CTRL_SIZE <= PAGE);
        assert!(g.data_offset(r) + g.capacity <= g.total_size());
    }
    Some(g)
}

/// Reads records from a ring whose data area is `data` (its length a power of two of at least
/// 64, else nothing is read) as the real consumer would, with the parser that ships, and returns
/// the payload lengths it accepted before it found the ring empty or corrupted. The `cargo fuzz`
/// target `records` feeds it arbitrary ring contents. Panics only on a bug.
pub fn drain_ring(data: &[u8], max_message: usize) -> Vec<usize> {
    let cap = data.len();
    if !cap.is_power_of_two() || cap < 64 {
        return Vec::new();
    }
    let max_message = max_message.min((cap - 24) / 2);
    // A private, 8-aligned copy: the parser reads it through a Region like shared memory.
    let mut words = vec![0u64; cap / 8 + crate::layout::CTRL_SIZE / 8];
    let bytes = crate::layout::CTRL_SIZE + cap;
    for (i, chunk) in data.chunks(8).enumerate() {
        let mut w = [0u8; 8];
        w[..chunk.len()].copy_from_slice(chunk);
        words[crate::layout::CTRL_SIZE / 8 + i] = u64::from_ne_bytes(w);
    }
    let base = std::ptr::NonNull::new(words.as_mut_ptr().cast::<u8>()).expect("vec pointer");
    // SAFETY: `words` is 8-aligned, `bytes` long, alive until the end of this function, and
    // reached only through the Region from here on.
    let region = unsafe { Region::new(base, bytes) };
    let ring = crate::ring::RingRef::new(region, 0, crate::layout::CTRL_SIZE, cap);
    let mut cons = crate::ring::Consumer::new(ring, cap, max_message);
    let mut lens = Vec::new();
    let mut out = vec![0u8; max_message];
    // Each record advances the head by at least 8 bytes; stop after one lap's worth.
    for _ in 0..cap / 8 {
        match cons.peek() {
            Ok(Some(r)) => {
                assert!(r.len <= max_message);
                cons.read(&r, &mut out);
                lens.push(r.len);
                cons.consume(r);
            }
            Ok(None) | Err(_) => break,
        }
    }
    // The pure parser agrees with itself on the first word.
    let first = u64::from_ne_bytes(data[..8].try_into().expect("cap >= 64"));
    if let Ok(RecordWord::Record(len)) = decode_record(first, 0, cap as u64, max_message) {
        assert_eq!(lens.first(), Some(&len));
    }
    // `cons` (raw pointers into `words`) is not used past this point.
    drop(words);
    lens
}
