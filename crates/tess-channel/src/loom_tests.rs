//! Loom model checks of the ring and its sleep/wake protocol.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p tess-channel --release --lib loom`.
//!
//! Loom explores the interleavings and the weak-memory visibilities allowed by the orderings
//! the ring uses (payload words are relaxed atomics here, so a missing Release/Acquire shows up
//! as a wrong payload). The futex is modelled so that a lost wake-up is a deadlock, which loom
//! reports. Rings are tiny (64 bytes, messages up to 16 bytes) so that three messages already
//! fill the ring, pad at its end and wrap around.

use crate::ring::{Consumer, PlaceError, Producer, RingRef};
use crate::sync::{AtomicU32, Ordering};
use loom::sync::Arc;
use loom::thread;

const CAP: usize = 64;
const MAX: usize = 16;

fn ring() -> (Producer, Consumer) {
    let r = RingRef::new_model(CAP);
    (
        Producer::new(r.clone(), CAP, MAX),
        Consumer::new(r, CAP, MAX),
    )
}

fn msg(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|k| (i * 16 + k + 1) as u8).collect()
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(f);
}

/// Sends by spinning on `Full` (yielding to the model).
fn send_spin(p: &mut Producer, m: &[u8]) {
    loop {
        match p.place(m.len()) {
            Ok(pl) => {
                p.write(&pl, m);
                p.commit(pl, m.len());
                p.publish();
                return;
            }
            Err(PlaceError::Full) => thread::yield_now(),
            Err(e) => panic!("{e:?}"),
        }
    }
}

/// Receives by spinning on empty.
fn recv_spin(c: &mut Consumer) -> Vec<u8> {
    loop {
        if let Some(r) = c.peek().expect("no corruption") {
            let mut out = vec![0u8; r.len];
            c.read(&r, &mut out);
            c.consume(r);
            c.publish();
            return out;
        }
        thread::yield_now();
    }
}

/// Receives with the sleep protocol and unbounded futex waits: a lost wake-up deadlocks.
/// Returns `None` once the producer has hung up and the ring is drained.
fn recv_sleep(c: &mut Consumer, alive: Option<&AtomicU32>) -> Option<Vec<u8>> {
    loop {
        let take = |c: &mut Consumer| {
            c.peek().expect("no corruption").map(|r| {
                let mut out = vec![0u8; r.len];
                c.read(&r, &mut out);
                c.consume(r);
                c.publish();
                out
            })
        };
        if let Some(m) = take(c) {
            return Some(m);
        }
        let gone = c.producer_closed() || alive.is_some_and(|a| a.load(Ordering::Acquire) == 0);
        if gone {
            // Whatever was published before the hang-up is visible now.
            return take(c);
        }
        c.announce_sleep();
        if let Some(m) = take(c) {
            c.cancel_sleep();
            return Some(m);
        }
        if c.producer_closed() {
            c.cancel_sleep();
            continue;
        }
        // With a liveness flag to watch, waits are bounded (as in the real endpoint, which
        // polls the liveness socket between bounded futex waits); otherwise unbounded.
        c.sleep(alive.map(|_| 1_000_000));
    }
}

#[test]
fn loom_one_direction_wraps_pads_and_fills() {
    model(|| {
        let (mut p, mut c) = ring();
        // Three 16-byte messages: the third does not fit before the end, so it pads and wraps,
        // and it needs the first two consumed first (the ring is full until then).
        let t = thread::spawn(move || {
            for i in 0..3 {
                send_spin(&mut p, &msg(i, MAX));
            }
        });
        for i in 0..3 {
            assert_eq!(recv_spin(&mut c), msg(i, MAX));
        }
        t.join().unwrap();
    });
}

#[test]
fn loom_full_ring_becomes_free() {
    model(|| {
        let (mut p, mut c) = ring();
        // Fill before any concurrency: 24 + 24 bytes, then the terminator rule says full.
        send_spin(&mut p, &msg(0, MAX));
        send_spin(&mut p, &msg(1, MAX));
        assert!(matches!(p.place(MAX), Err(PlaceError::Full)));
        let t = thread::spawn(move || {
            assert_eq!(recv_spin(&mut c), msg(0, MAX));
            assert_eq!(recv_spin(&mut c), msg(1, MAX));
            assert_eq!(recv_spin(&mut c), msg(2, 3));
        });
        send_spin(&mut p, &msg(2, 3));
        t.join().unwrap();
    });
}

#[test]
fn loom_empty_ring_and_batch() {
    model(|| {
        let (mut p, mut c) = ring();
        assert_eq!(c.peek(), Ok(None));
        let t = thread::spawn(move || {
            // A batch of two published with one store.
            for i in 0..2 {
                let pl = p.place(5).unwrap();
                p.write(&pl, &msg(i, 5));
                p.commit(pl, 5);
            }
            p.publish();
        });
        // Whenever the first is visible, the second is too (one publishing store).
        loop {
            if let Some(r) = c.peek().unwrap() {
                let mut out = vec![0u8; r.len];
                c.read(&r, &mut out);
                assert_eq!(out, msg(0, 5));
                c.consume(r);
                let r2 = c.peek().unwrap().expect("batch published at once");
                let mut out = vec![0u8; r2.len];
                c.read(&r2, &mut out);
                assert_eq!(out, msg(1, 5));
                break;
            }
            thread::yield_now();
        }
        t.join().unwrap();
    });
}

#[test]
fn loom_both_directions_ping_pong() {
    model(|| {
        let (mut p_ab, mut c_ab) = ring();
        let (mut p_ba, mut c_ba) = ring();
        let t = thread::spawn(move || {
            for i in 0..2 {
                let m = recv_spin(&mut c_ab);
                assert_eq!(m, msg(i, 9));
                send_spin(&mut p_ba, &m[..4]);
            }
        });
        for i in 0..2 {
            send_spin(&mut p_ab, &msg(i, 9));
            assert_eq!(recv_spin(&mut c_ba), msg(i, 4));
        }
        t.join().unwrap();
    });
}

#[test]
fn loom_sleeping_consumer_is_always_woken() {
    model(|| {
        let (mut p, mut c) = ring();
        let t = thread::spawn(move || {
            send_spin(&mut p, &msg(0, 8));
            send_spin(&mut p, &msg(1, 8));
            p
        });
        assert_eq!(recv_sleep(&mut c, None), Some(msg(0, 8)));
        assert_eq!(recv_sleep(&mut c, None), Some(msg(1, 8)));
        let _p = t.join().unwrap();
    });
}

#[test]
fn loom_sleeping_producer_is_always_woken() {
    model(|| {
        let (mut p, mut c) = ring();
        send_spin(&mut p, &msg(0, MAX));
        send_spin(&mut p, &msg(1, MAX));
        let t = thread::spawn(move || {
            assert_eq!(recv_spin(&mut c), msg(0, MAX));
            assert_eq!(recv_spin(&mut c), msg(1, MAX));
            c
        });
        // The sleep protocol on a full ring, with unbounded futex waits.
        let pl = loop {
            match p.place(MAX) {
                Ok(pl) => break pl,
                Err(PlaceError::Full) => {}
                Err(e) => panic!("{e:?}"),
            }
            p.announce_sleep();
            match p.place(MAX) {
                Ok(pl) => {
                    p.cancel_sleep();
                    break pl;
                }
                Err(PlaceError::Full) => p.sleep(None),
                Err(e) => panic!("{e:?}"),
            }
        };
        p.write(&pl, &msg(2, MAX));
        p.commit(pl, MAX);
        p.publish();
        let _c = t.join().unwrap();
    });
}

#[test]
fn loom_hang_up_after_last_message() {
    model(|| {
        let (mut p, mut c) = ring();
        let t = thread::spawn(move || {
            send_spin(&mut p, &msg(0, 8));
            p.close();
        });
        assert_eq!(recv_sleep(&mut c, None), Some(msg(0, 8)));
        assert_eq!(recv_sleep(&mut c, None), None);
        t.join().unwrap();
    });
}

#[test]
fn loom_peer_death_without_hang_up() {
    model(|| {
        let (mut p, mut c) = ring();
        // Stands for the liveness socket: the kernel reports POLLHUP once the peer process
        // has exited, after every store it made.
        let alive = Arc::new(AtomicU32::new(1));
        let a2 = alive.clone();
        let t = thread::spawn(move || {
            send_spin(&mut p, &msg(0, 8));
            // Crash: no close(), no wake-up; only the kernel's notice.
            a2.store(0, Ordering::Release);
        });
        assert_eq!(recv_sleep(&mut c, Some(&alive)), Some(msg(0, 8)));
        assert_eq!(recv_sleep(&mut c, Some(&alive)), None);
        t.join().unwrap();
    });
}
