//! In-process tests of endpoints against the real kernel (memfd, futex, sockets).

use crate::*;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

fn small() -> ChannelOptions {
    ChannelOptions {
        capacity: 4096,
        max_message_size: 1000,
    }
}

fn pattern(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|k| (i * 31 + k * 7) as u8).collect()
}

#[test]
fn both_directions_all_sizes() {
    let (mut a, mut b) = Channel::pair(&ChannelOptions::default()).unwrap();
    assert_eq!(a.side(), Side::A);
    assert_eq!(b.side(), Side::B);
    let mut buf = vec![0u8; 4480];
    for &len in &[0usize, 1, 7, 8, 9, 64, 512, 1024, 1280, 2048, 4096, 4480] {
        let m = pattern(len, len);
        a.send(&m).unwrap();
        assert_eq!(b.recv(&mut buf).unwrap(), len);
        assert_eq!(&buf[..len], &m[..]);
        b.send(&m).unwrap();
        assert_eq!(a.recv(&mut buf).unwrap(), len);
        assert_eq!(&buf[..len], &m[..]);
    }
}

#[test]
fn full_empty_and_wrap_around() {
    let (mut a, mut b) = Channel::pair(&small()).unwrap();
    let mut buf = [0u8; 1000];
    assert_eq!(b.try_recv(&mut buf), Err(TryRecvError::Empty));
    // Fill: 100-byte messages take 112 bytes; 4096 - 8 (terminator) holds 36.
    let mut sent = 0;
    loop {
        match a.try_send(&pattern(sent, 100)) {
            Ok(()) => sent += 1,
            Err(TrySendError::Full) => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(sent, 36);
    // Drain and refill many times with odd sizes so records pad at the end of the ring.
    let mut next_rx = 0;
    for round in 0..200 {
        let len = 1 + (round * 37) % 999;
        while b.try_recv(&mut buf).is_ok() {
            next_rx += 1;
        }
        a.try_send(&pattern(round, len)).unwrap();
        let n = b.try_recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], &pattern(round, len)[..]);
    }
    assert_eq!(next_rx, 36);
}

#[test]
fn size_errors_leave_the_message() {
    let (mut a, mut b) = Channel::pair(&small()).unwrap();
    assert_eq!(
        a.try_send(&[0; 1001]),
        Err(TrySendError::TooLarge {
            len: 1001,
            max: 1000
        })
    );
    a.send(b"twelve bytes").unwrap();
    let mut tiny = [0u8; 4];
    assert_eq!(
        b.try_recv(&mut tiny),
        Err(TryRecvError::BufferTooSmall {
            len: 12,
            capacity: 4
        })
    );
    let mut buf = [0u8; 16];
    assert_eq!(b.try_recv(&mut buf), Ok(12));
}

#[test]
fn batches_and_zero_copy() {
    let (mut a, mut b) = Channel::pair(&small()).unwrap();
    let msgs: Vec<Vec<u8>> = (0..10).map(|i| pattern(i, i * 3)).collect();
    assert_eq!(a.try_send_batch(&msgs), Ok(10));
    let mut got = Vec::new();
    assert_eq!(b.try_recv_batch(4, |m| got.push(m.to_vec())), Ok(4));
    assert_eq!(b.recv_batch(100, |m| got.push(m.to_vec())), Ok(6));
    assert_eq!(got, msgs);
    // A batch larger than the ring is sent in parts by a blocking send_batch.
    let big: Vec<Vec<u8>> = (0..100).map(|i| pattern(i, 200)).collect();
    let t = std::thread::spawn(move || {
        a.send_batch(&big).unwrap();
        a
    });
    let mut n = 0;
    while n < 100 {
        n += b.recv_batch(7, |m| assert_eq!(m.len(), 200)).unwrap();
    }
    let mut a = t.join().unwrap();

    // Reserve / commit; an abandoned slot sends nothing.
    {
        let mut slot = a.try_reserve(10).unwrap();
        slot.write(0, b"abandoned!");
    }
    let mut slot = a.reserve(10).unwrap();
    assert_eq!(slot.len(), 10);
    slot.write(0, b"hel");
    slot.write(3, b"lo");
    slot.commit_len(5);
    // Through the private buffer.
    let mut slot = a.reserve(10).unwrap();
    slot.buffer()[..6].copy_from_slice(b"staged");
    slot.commit_len(6);
    // Peek leaves the message until released.
    {
        let mut m = b.try_peek().unwrap();
        assert_eq!(m.bytes(), b"hello");
    }
    let m = b.peek().unwrap();
    assert_eq!(m.to_vec(), b"hello");
    let mut part = [0u8; 3];
    m.read(2, &mut part);
    assert_eq!(&part, b"llo");
    m.release();
    // Ring to ring: B echoes the staged message back to A without a private copy.
    let (tx, rx) = b.halves();
    let m = rx.try_peek().unwrap();
    let mut slot = tx.try_reserve(m.len() + 1).unwrap();
    slot.copy_from(1, &m, 0, m.len());
    slot.write(0, b">");
    slot.commit();
    m.release();
    let mut buf = [0u8; 16];
    assert_eq!(a.try_recv(&mut buf), Ok(7));
    assert_eq!(&buf[..7], b">staged");
    assert!(matches!(b.try_peek(), Err(TryRecvError::Empty)));
}

#[test]
#[should_panic(expected = "read from a message: 2 bytes at byte 2 of 3")]
fn slot_access_outside_the_message_panics() {
    let (mut a, mut b) = Channel::pair(&small()).unwrap();
    a.send(b"abc").unwrap();
    let m = b.try_peek().unwrap();
    m.read(2, &mut [0u8; 2]);
}

#[test]
fn hang_up_is_seen_after_the_last_message() {
    let (mut a, b) = Channel::pair(&small()).unwrap();
    let (mut btx, brx) = b.split();
    btx.send(b"last words").unwrap();
    drop(btx);
    let mut buf = [0u8; 64];
    assert_eq!(a.recv(&mut buf), Ok(10));
    assert_eq!(a.recv(&mut buf), Err(RecvError::Disconnected));
    // B's receiver still lives: A can send.
    a.send(b"still there").unwrap();
    drop(brx);
    assert_eq!(a.try_send(b"x"), Err(TrySendError::Disconnected));
}

#[test]
fn peer_death_is_detected_without_hang_up() {
    for wait in [Wait::BusyPoll, Wait::Adaptive, Wait::Sleep] {
        let (mut a, b) = Channel::pair(&small()).unwrap();
        a.set_wait(wait);
        a.set_liveness_interval(Duration::from_millis(5));
        assert!(a.is_peer_alive());
        // Close B's descriptors and mapping without the orderly hang-up, as a crash would.
        b.discard();
        let t0 = Instant::now();
        let mut buf = [0u8; 8];
        assert_eq!(a.recv(&mut buf), Err(RecvError::Disconnected), "{wait:?}");
        assert!(t0.elapsed() < Duration::from_secs(20));
        assert!(!a.is_peer_alive());
        // A sender waiting on a full ring is released too.
        let (mut a, b) = Channel::pair(&small()).unwrap();
        a.set_wait(wait);
        a.set_liveness_interval(Duration::from_millis(5));
        while a.try_send(&[0; 500]).is_ok() {}
        b.discard();
        assert_eq!(a.send(&[0; 500]), Err(SendError::Disconnected));
    }
}

#[test]
fn blocking_modes_exchange_messages_between_threads() {
    for wait in [Wait::BusyPoll, Wait::Adaptive, Wait::Sleep] {
        let (mut a, mut b) = Channel::pair(&small()).unwrap();
        a.set_wait(wait);
        b.set_wait(wait);
        const N: usize = 3000;
        let t = std::thread::spawn(move || {
            let mut buf = [0u8; 1000];
            for i in 0..N {
                let n = b.recv(&mut buf).unwrap();
                assert_eq!(&buf[..n], &pattern(i, i % 300)[..]);
                if i % 10 == 0 {
                    b.send(&buf[..n]).unwrap();
                }
            }
            b
        });
        let mut buf = [0u8; 1000];
        for i in 0..N {
            a.send(&pattern(i, i % 300)).unwrap();
            if i % 10 == 0 {
                let n = a.recv(&mut buf).unwrap();
                assert_eq!(&buf[..n], &pattern(i, i % 300)[..]);
            }
        }
        t.join().unwrap();
    }
}

#[test]
fn timeouts_expire() {
    let (mut a, _b) = Channel::pair(&small()).unwrap();
    let mut buf = [0u8; 8];
    assert_eq!(
        a.recv_timeout(&mut buf, Duration::from_millis(20)),
        Err(RecvTimeoutError::Timeout)
    );
    while a.try_send(&[1; 900]).is_ok() {}
    assert_eq!(
        a.send_timeout(&[1; 900], Duration::from_millis(20)),
        Err(SendTimeoutError::Timeout)
    );
    assert!(matches!(
        a.reserve_timeout(900, Duration::from_millis(1)),
        Err(SendTimeoutError::Timeout)
    ));
}

/// Overwrites the 8-byte word at `off` of the mapping.
fn poke(ep: &Endpoint, off: usize, value: u64) {
    let (base, len) = ep.raw_memory();
    assert!(off + 8 <= len);
    // SAFETY: in bounds (checked) and 8-aligned (callers pass aligned offsets).
    unsafe {
        (*(base.add(off) as *const std::sync::atomic::AtomicU64))
            .store(value, std::sync::atomic::Ordering::SeqCst)
    };
}

#[test]
fn corruption_is_reported_and_sticky() {
    use crate::layout::{ctrl_offset, PAGE};
    // A record header with a wrong sequence number, in ring 0 (A -> B) at offset 0.
    let (a, mut b) = Channel::pair(&small()).unwrap();
    poke(&a, PAGE, crate::layout::header_word(4096, 5, false));
    let mut buf = [0u8; 64];
    assert!(matches!(
        b.try_recv(&mut buf),
        Err(TryRecvError::Corrupted(_))
    ));
    assert!(matches!(b.recv(&mut buf), Err(RecvError::Corrupted(_))));
    // A length beyond the maximum.
    let (a, mut b) = Channel::pair(&small()).unwrap();
    poke(&a, PAGE, crate::layout::header_word(0, 5000, false));
    let e = b.try_recv(&mut buf).unwrap_err();
    assert!(e.to_string().contains("longer than the maximum"), "{e}");
    // A PAD at offset 0.
    let (a, mut b) = Channel::pair(&small()).unwrap();
    poke(&a, PAGE, crate::layout::header_word(0, 4096, true));
    assert!(matches!(
        b.try_recv(&mut buf),
        Err(TryRecvError::Corrupted(_))
    ));
    // The consumer's head moved backwards / beyond the tail: the producer notices when full.
    let (mut a, _b) = Channel::pair(&small()).unwrap();
    poke(&a, ctrl_offset(0), 123_456);
    let mut r = Ok(());
    for _ in 0..100 {
        r = a.try_send(&[0; 900]);
        if r.is_err() {
            break;
        }
    }
    assert!(matches!(r, Err(TrySendError::Corrupted(_))), "{r:?}");
    assert!(matches!(a.send(b"x"), Err(SendError::Corrupted(_))));
}

#[test]
fn open_validates_the_memfd() {
    use std::os::fd::{FromRawFd, OwnedFd};
    // A tampered header.
    let (a, b) = Channel::create(&small()).unwrap();
    let ep = Endpoint::from_fds(a).unwrap();
    poke(&ep, 16, 1 << 20); // capacity
    assert!(matches!(Endpoint::from_fds(b), Err(OpenError::Layout(_))));
    // An unsealed memfd.
    // SAFETY: plain memfd_create with a valid name.
    let fd = unsafe { libc::memfd_create(c"x".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: just created, owned by nobody else.
    let memfd = unsafe { OwnedFd::from_raw_fd(fd) };
    let (l, _l2) = handoff::socket_pair().unwrap();
    let e = Endpoint::from_fds(EndpointFds {
        memfd,
        liveness: l,
        side: Side::A,
    })
    .unwrap_err();
    assert!(e.to_string().contains("seals"), "{e}");
}

#[test]
fn handoff_over_a_unix_socket() {
    let (a, b) = Channel::create(&small()).unwrap();
    let (s1, s2) = handoff::socket_pair().unwrap();
    handoff::send_endpoint(s1.as_fd(), &a).unwrap();
    b.send_over(&s1).unwrap();
    drop(a);
    let mut ea = Endpoint::recv_from(&s2).unwrap();
    let mut eb = Endpoint::recv_from(&s2).unwrap();
    assert_eq!((ea.side(), eb.side()), (Side::A, Side::B));
    ea.send(b"over the socket").unwrap();
    let mut buf = [0u8; 32];
    assert_eq!(eb.recv(&mut buf), Ok(15));
    // Garbage on the socket is refused.
    nix::unistd::write(&s1, &[0u8; 16]).unwrap();
    assert!(matches!(
        handoff::recv_endpoint(s2.as_fd()),
        Err(OpenError::Handoff { .. })
    ));
}

mod scribble {
    //! Property test: a hostile peer scribbles arbitrary bytes into the shared pages between the
    //! operations of an honest endpoint. No panic, no out-of-bounds access (the mapping sits
    //! between guard pages), no hang (only bounded operations), corruption reported as an error;
    //! and without scribbles, exactly the messages sent are received.

    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        /// The honest peer (B) sends a message of this length.
        PeerSend(usize),
        /// The honest peer receives whatever it can.
        PeerRecv,
        /// We (A) receive one message.
        Recv,
        /// We receive a batch.
        RecvBatch,
        /// We peek and maybe release.
        Peek(bool),
        /// We send a message of this length.
        Send(usize),
        /// The hostile peer writes bytes at an offset of the mapping.
        Scribble(usize, Vec<u8>),
        /// The hostile peer writes a plausible record header at the next read position area.
        ForgeHeader(usize, u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        let len = 0usize..300;
        prop_oneof![
            4 => len.clone().prop_map(Op::PeerSend),
            2 => Just(Op::PeerRecv),
            3 => Just(Op::Recv),
            1 => Just(Op::RecvBatch),
            1 => any::<bool>().prop_map(Op::Peek),
            3 => len.prop_map(Op::Send),
            2 => (0usize..(4096 + 2 * 1024), proptest::collection::vec(any::<u8>(), 1..24))
                .prop_map(|(o, b)| Op::Scribble(o, b)),
            1 => (0usize..(2 * 1024 / 8), any::<u64>()).prop_map(|(w, v)| Op::ForgeHeader(w, v)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 300,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        #[test]
        fn hostile_scribbles_never_break_the_honest_side(ops in proptest::collection::vec(op(), 1..120)) {
            let opts = ChannelOptions { capacity: 1024, max_message_size: 300 };
            let (mut a, mut b) = Channel::pair(&opts).unwrap();
            let (base, len) = a.raw_memory();
            let mut expect = std::collections::VecDeque::new();
            let mut scribbled = false;
            let mut buf = [0u8; 300];
            for op in ops {
                match op {
                    Op::PeerSend(n) => {
                        let m = pattern(expect.len(), n);
                        if b.try_send(&m).is_ok() {
                            expect.push_back(m);
                        }
                    }
                    Op::PeerRecv => while b.try_recv(&mut buf).is_ok() {},
                    Op::Recv => match a.recv_timeout(&mut buf, Duration::from_micros(100)) {
                        Ok(n) => {
                            if !scribbled {
                                prop_assert_eq!(Some(buf[..n].to_vec()), expect.pop_front());
                            }
                        }
                        Err(RecvTimeoutError::Timeout) => {
                            if !scribbled { prop_assert!(expect.is_empty()); }
                        }
                        // A scribbled hang-up flag is a hang-up.
                        Err(RecvTimeoutError::Corrupted(_) | RecvTimeoutError::Disconnected) => {
                            prop_assert!(scribbled)
                        }
                        Err(e) => prop_assert!(false, "unexpected {e}"),
                    },
                    Op::RecvBatch => {
                        let mut got = Vec::new();
                        match a.try_recv_batch(8, |m| got.push(m.to_vec())) {
                            Ok(_) | Err(TryRecvError::Empty) => {
                                if !scribbled {
                                    for g in got {
                                        prop_assert_eq!(Some(g), expect.pop_front());
                                    }
                                }
                            }
                            Err(TryRecvError::Corrupted(_) | TryRecvError::Disconnected) => {
                                prop_assert!(scribbled)
                            }
                            Err(e) => prop_assert!(false, "unexpected {e}"),
                        }
                    }
                    Op::Peek(release) => match a.try_peek() {
                        Ok(m) => {
                            prop_assert!(m.len() <= 300);
                            let _sum: u32 = m.to_vec().iter().map(|&x| x as u32).sum();
                            if release {
                                if !scribbled {
                                    prop_assert_eq!(Some(m.to_vec()), expect.pop_front());
                                }
                                m.release();
                            }
                        }
                        Err(TryRecvError::Empty) => {}
                        Err(TryRecvError::Corrupted(_) | TryRecvError::Disconnected) => {
                            prop_assert!(scribbled)
                        }
                        Err(e) => prop_assert!(false, "unexpected {e}"),
                    },
                    Op::Send(n) => match a.try_send(&pattern(n, n)) {
                        Ok(()) | Err(TrySendError::Full) => {}
                        Err(TrySendError::Corrupted(_) | TrySendError::Disconnected) => {
                            prop_assert!(scribbled)
                        }
                        Err(e) => prop_assert!(false, "unexpected {e}"),
                    },
                    Op::Scribble(off, bytes) => {
                        scribbled = true;
                        for (i, v) in bytes.into_iter().enumerate() {
                            let o = (off + i) % len;
                            // SAFETY: `o < len`, inside the mapping; an atomic byte store is
                            // how a hostile peer's write looks to us.
                            unsafe {
                                (*(base.add(o) as *const std::sync::atomic::AtomicU8))
                                    .store(v, std::sync::atomic::Ordering::Relaxed)
                            };
                        }
                    }
                    Op::ForgeHeader(word, v) => {
                        scribbled = true;
                        // Ring 1 (B -> A, the one we read) starts at 4096 + 1024.
                        let o = 4096 + 1024 + (word * 8) % 1024;
                        let v = if v & 1 == 0 { v } else {
                            // Often a header with the valid bit and a plausible sequence.
                            crate::layout::HDR_VALID | (v & !crate::layout::HDR_VALID & !(0xfff << 20))
                        };
                        poke(&a, o, v);
                    }
                }
            }
        }
    }

    #[test]
    fn concurrent_scribbler_thread() {
        // A thread scribbles random words all over the mapping while A and B exchange
        // messages; bounded in time. Checks no panic and no hang. (In one process the honest
        // side's memcpy races with the scribbler's stores, exactly as it would with a hostile
        // process; the separate-process version is tests/hostile.rs.)
        let opts = ChannelOptions {
            capacity: 4096,
            max_message_size: 500,
        };
        let (mut a, mut b) = Channel::pair(&opts).unwrap();
        let (base, len) = a.raw_memory();
        let base = base as usize;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s2 = stop.clone();
        let scribbler = std::thread::spawn(move || {
            let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
            while !s2.load(std::sync::atomic::Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let off = (x as usize % len) & !7;
                // SAFETY: `off + 8 <= len` (len is a multiple of 8), inside the mapping.
                unsafe {
                    (*((base + off) as *const std::sync::atomic::AtomicU64))
                        .store(x.rotate_left(17), std::sync::atomic::Ordering::Relaxed)
                };
                for _ in 0..50 {
                    std::hint::spin_loop();
                }
            }
        });
        let t0 = Instant::now();
        let mut buf = [0u8; 500];
        let mut errors = 0usize;
        while t0.elapsed() < Duration::from_millis(300) {
            let _ = b.send_timeout(&[7; 100], Duration::from_micros(200));
            match a.recv_timeout(&mut buf, Duration::from_micros(200)) {
                Ok(n) => assert!(n <= 500),
                Err(RecvTimeoutError::Corrupted(_)) => errors += 1,
                Err(_) => {}
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        scribbler.join().unwrap();
        // The scribbler may or may not have hit a live header within the time; both are fine.
        // (Once corrupted, the receiver stays so: every later call reports it, none hangs.)
        let _ = errors;
    }
}

#[test]
fn memfd_is_sealed() {
    let (a, _b) = Channel::create(&small()).unwrap();
    let ep = Endpoint::from_fds(a).unwrap();
    // SAFETY: plain fcntl / ftruncate on a descriptor we hold.
    let seals = unsafe {
        libc::fcntl(
            std::os::fd::AsRawFd::as_raw_fd(&ep.memfd()),
            libc::F_GET_SEALS,
        )
    };
    assert_eq!(
        seals & (libc::F_SEAL_SHRINK | libc::F_SEAL_GROW),
        libc::F_SEAL_SHRINK | libc::F_SEAL_GROW
    );
    // SAFETY: as above.
    let rc = unsafe { libc::ftruncate(std::os::fd::AsRawFd::as_raw_fd(&ep.memfd()), 0) };
    assert_ne!(rc, 0);
}
