//! A hostile peer in a separate process.
//!
//! For each strategy, a forked child maps the channel memfd itself and writes into it whatever
//! the strategy says, as fast as it can, while this process uses its end normally; then the
//! child is killed with SIGKILL (no hang-up). Checks: no panic, no out-of-bounds access (the
//! mapping sits between guard pages, so one would crash this process), only the errors the API
//! promises, and after the child's death a blocking receive and a blocking send both return
//! (no hang).
//!
//! The child only makes system calls and atomic stores after `fork` (no allocation), so forking
//! from the multi-threaded test harness is safe.
#![cfg(not(loom))]

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tess_channel::layout::{ctrl_offset, header_word, record_size, PAGE};
use tess_channel::*;

const CAP: usize = 8192;
const MAX: usize = 1024;

#[derive(Debug, Clone, Copy)]
enum Strategy {
    /// Random words anywhere in the file (header, control blocks, both rings).
    RandomWords,
    /// Well-formed headers with the right sequence numbers and random lengths in the ring we
    /// read, so the parser gets past the first checks.
    PlausibleRecords,
    /// Random values in the consumer head of the ring we write.
    HeadGames,
    /// Hang-up flags and sleep words flipped, futex wake storms.
    FlagStorm,
}

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// The hostile child: never returns.
fn hostile_child(memfd: &OwnedFd, total: usize, strategy: Strategy, seed: u64) -> ! {
    // SAFETY: mapping a memfd we hold, shared, read-write; the result is checked.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            total,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            memfd.as_raw_fd(),
            0,
        )
    };
    if base == libc::MAP_FAILED {
        // SAFETY: _exit is async-signal-safe.
        unsafe { libc::_exit(3) };
    }
    let word = |off: usize| {
        // SAFETY: callers keep `off + 8 <= total` and 8-aligned.
        unsafe { &*((base as *mut u8).add(off) as *const AtomicU64) }
    };
    let rx_ring_data = PAGE + CAP; // ring 1: B -> A, what the parent reads
    let mut x = seed | 1;
    let mut index: u64 = 0;
    loop {
        let r = xorshift(&mut x);
        match strategy {
            Strategy::RandomWords => {
                let off = (r as usize % total) & !7;
                word(off).store(xorshift(&mut x), Ordering::Relaxed);
            }
            Strategy::PlausibleRecords => {
                let len = (r as usize) % (MAX + MAX / 4);
                let off = (index as usize) % CAP;
                if off + record_size(len) > CAP || r % 17 == 0 {
                    let pad = (CAP - off) as u32;
                    word(rx_ring_data + off)
                        .store(header_word(index, pad, true), Ordering::Release);
                    index += pad as u64;
                } else {
                    for k in (off + 8..off + record_size(len)).step_by(8) {
                        word(rx_ring_data + k).store(r.rotate_left(k as u32), Ordering::Relaxed);
                    }
                    word(rx_ring_data + off)
                        .store(header_word(index, len as u32, false), Ordering::Release);
                    index += record_size(len) as u64;
                }
                if r % 5 == 0 {
                    index = index.wrapping_add((r >> 32) & !7);
                }
            }
            Strategy::HeadGames => {
                word(ctrl_offset(0)).store(r & if r % 3 == 0 { !7 } else { !0 }, Ordering::Release);
            }
            Strategy::FlagStorm => {
                for ring in 0..2 {
                    let ctrl = ctrl_offset(ring);
                    let off = ctrl + 128 * (1 + (r as usize % 3));
                    word(off).store(r & 0x1_0000_0001, Ordering::Relaxed);
                    // SAFETY: FUTEX_WAKE on an aligned word of our mapping.
                    unsafe {
                        libc::syscall(
                            libc::SYS_futex,
                            (base as *mut u8).add(off),
                            libc::FUTEX_WAKE,
                            i32::MAX,
                            0,
                            0,
                            0,
                        )
                    };
                }
            }
        }
    }
}

/// Kills and reaps the hostile child, also when an assertion fails first.
struct KillOnDrop(libc::pid_t);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // SAFETY: plain kill / waitpid of our own child.
        unsafe {
            libc::kill(self.0, libc::SIGKILL);
            libc::waitpid(self.0, std::ptr::null_mut(), 0);
        }
    }
}

fn run(strategy: Strategy, seed: u64) {
    let opts = ChannelOptions {
        capacity: CAP,
        max_message_size: MAX,
    };
    let (a, b) = Channel::create(&opts).unwrap();
    let total = PAGE + 2 * CAP;
    // Open our end first: a peer that scribbles the header before we open is refused by the
    // validation in `from_fds` (tested in the unit tests), which would end this test early.
    let mut ep = Endpoint::from_fds(a).unwrap();
    // SAFETY: the child only calls async-signal-safe functions and atomics (hostile_child).
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // SAFETY: prctl is async-signal-safe; the child dies with this test process.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
        hostile_child(&b.memfd, total, strategy, seed);
    }
    let guard = KillOnDrop(pid);
    // The child holds B's liveness end now; ours must go so that its death shows.
    drop(b);
    ep.set_liveness_interval(Duration::from_millis(10));
    let mut buf = vec![0u8; MAX];
    let mut outcomes = std::collections::BTreeMap::<String, usize>::new();
    let mut note = |s: &str| *outcomes.entry(s.to_string()).or_default() += 1;
    let t0 = Instant::now();
    let mut i = 0u64;
    while t0.elapsed() < Duration::from_millis(150) {
        i += 1;
        match i % 4 {
            0 => match ep.try_send(&[i as u8; 100]) {
                Ok(()) => note("send ok"),
                Err(TrySendError::Full) => note("send full"),
                Err(TrySendError::Corrupted(_)) => note("send corrupted"),
                Err(TrySendError::Disconnected) => note("send disconnected"),
                Err(e) => panic!("{strategy:?}: unexpected {e}"),
            },
            1 => match ep.recv_timeout(&mut buf, Duration::from_micros(500)) {
                Ok(n) => {
                    assert!(n <= MAX);
                    note("recv ok")
                }
                Err(RecvTimeoutError::Timeout) => note("recv timeout"),
                Err(RecvTimeoutError::Corrupted(_)) => note("recv corrupted"),
                Err(RecvTimeoutError::Disconnected) => note("recv disconnected"),
                Err(e) => panic!("{strategy:?}: unexpected {e}"),
            },
            2 => match ep.try_peek() {
                Ok(m) => {
                    assert!(m.len() <= MAX);
                    let _ = m.to_vec().iter().fold(0u8, |a, &b| a ^ b);
                    m.release();
                    note("peek ok")
                }
                Err(TryRecvError::Empty) => note("peek empty"),
                Err(TryRecvError::Corrupted(_)) => note("peek corrupted"),
                Err(TryRecvError::Disconnected) => note("peek disconnected"),
                Err(e) => panic!("{strategy:?}: unexpected {e}"),
            },
            _ => match ep.try_recv_batch(16, |m| assert!(m.len() <= MAX)) {
                Ok(_) => note("batch ok"),
                Err(TryRecvError::Empty) => note("batch empty"),
                Err(TryRecvError::Corrupted(_)) => note("batch corrupted"),
                Err(TryRecvError::Disconnected) => note("batch disconnected"),
                Err(e) => panic!("{strategy:?}: unexpected {e}"),
            },
        }
    }
    // Kill the hostile peer: no hang-up, only the kernel's notice.
    drop(guard);
    // Blocking operations must return now (on a thread, with a watchdog, so a hang fails).
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; MAX];
        let mut received = 0usize;
        let recv_end = loop {
            match ep.recv(&mut buf) {
                Ok(_) => received += 1,
                Err(e) => break e,
            }
            if received > 100_000 {
                panic!("endless plausible messages after the peer's death");
            }
        };
        let send_end = loop {
            if let Err(e) = ep.send(&[1; 200]) {
                break e;
            }
        };
        tx.send((recv_end, send_end)).unwrap();
    });
    let (recv_end, send_end) = rx
        .recv_timeout(Duration::from_secs(10))
        .unwrap_or_else(|_| panic!("{strategy:?}: a blocking call hung after the peer died"));
    assert!(
        matches!(recv_end, RecvError::Disconnected | RecvError::Corrupted(_)),
        "{strategy:?}: {recv_end}"
    );
    assert!(
        matches!(send_end, SendError::Disconnected | SendError::Corrupted(_)),
        "{strategy:?}: {send_end}"
    );
    eprintln!("{strategy:?}: {outcomes:?}; after death: recv {recv_end}, send {send_end}");
}

#[test]
fn hostile_peer_process_cannot_crash_or_hang_us() {
    for (k, s) in [
        Strategy::RandomWords,
        Strategy::PlausibleRecords,
        Strategy::HeadGames,
        Strategy::FlagStorm,
    ]
    .into_iter()
    .enumerate()
    {
        run(s, 0x5eed_0000 + k as u64);
    }
}

/// The hostile-peer fuzzer of `tess_channel::fuzzing` for 20 s (`TESS_CHANNEL_HOSTILE_SECS`
/// overrides; the 10-minute run is `cargo run --release -p tess-channel --example hostile --
/// --secs 600`).
#[test]
fn hostile_fuzzer_finds_no_crash_hang_or_unpromised_error() {
    let secs = std::env::var("TESS_CHANNEL_HOSTILE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let opts = tess_channel::fuzzing::HostileOptions {
        duration: Duration::from_secs(secs),
        ..Default::default()
    };
    let report = tess_channel::fuzzing::hostile(&opts).expect("fuzzer harness");
    eprintln!("{report}");
    assert!(report.rounds >= 2, "{report}");
    assert!(report.operations > 1000, "{report}");
}
