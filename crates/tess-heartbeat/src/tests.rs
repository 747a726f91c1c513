use crate::clock::now_ns;
use crate::layout::{self, COUNT_OFFSET, RING, RING_OFFSET, SLOT_SIZE, TARGET_OFFSET};
use crate::reader::HeartbeatReader;
use crate::region::{self, Mapping};
use crate::register::Listener;
use crate::writer::{Heartbeat, Target};
use crate::HeartbeatError;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

fn reader_of(hb: &Heartbeat) -> HeartbeatReader {
    let fd: OwnedFd = hb.fd().try_clone_to_owned().unwrap();
    HeartbeatReader::open(fd).unwrap()
}

/// A writable mapping of the heartbeat's memfd: a hostile cell scribbling on its region.
fn scribbler(hb: &Heartbeat) -> Mapping {
    Mapping::map(hb.fd(), true).unwrap()
}

fn word(m: &Mapping, off: usize) -> &AtomicU64 {
    // SAFETY: test helper: 8-aligned offset inside the region, atomics only.
    unsafe { &*m.at(off).cast::<AtomicU64>() }
}

#[test]
fn beats_are_read_in_order_with_values_and_the_target() {
    let hb = Heartbeat::new("enc", Some(Target::Rate(30.0))).unwrap();
    let mut r = reader_of(&hb);
    assert_eq!(r.name(), "enc");
    for v in 0..10 {
        hb.beat_with(v * 7);
    }
    let x = r.read_new(now_ns());
    assert_eq!(x.count, 10);
    assert_eq!(x.new_count, 10);
    assert_eq!(x.target_ns, Some(33_333_333));
    assert_eq!(x.beats.len(), 10);
    for (i, b) in x.beats.iter().enumerate() {
        assert_eq!(b.index, i as u64);
        assert_eq!(b.value, i as u64 * 7);
    }
    assert!(x.beats.windows(2).all(|w| w[0].ts_ns <= w[1].ts_ns));
    let again = r.read_new(now_ns());
    assert_eq!((again.new_count, again.beats.len()), (0, 0));
}

#[test]
fn beats_before_the_reader_opened_are_not_counted_as_new() {
    let hb = Heartbeat::new("a", None).unwrap();
    hb.beat();
    hb.beat();
    let mut r = reader_of(&hb);
    hb.beat();
    let x = r.read_new(now_ns());
    assert_eq!((x.count, x.new_count, x.beats.len()), (3, 1, 1));
    assert_eq!(x.target_ns, None);
}

#[test]
fn targets_change_at_run_time() {
    let hb = Heartbeat::new("a", Some(Target::PerUnit(Duration::from_millis(10)))).unwrap();
    let mut r = reader_of(&hb);
    assert_eq!(r.read_new(now_ns()).target_ns, Some(10_000_000));
    hb.set_target(Some(Target::Rate(100.0))).unwrap();
    assert_eq!(hb.target_ns(), 10_000_000);
    hb.set_target(Some(Target::Rate(50.0))).unwrap();
    assert_eq!(r.read_new(now_ns()).target_ns, Some(20_000_000));
    hb.set_target(None).unwrap();
    assert_eq!(r.read_new(now_ns()).target_ns, None);
}

#[test]
fn bad_names_and_targets_are_refused() {
    assert!(matches!(
        Heartbeat::new("a b", None),
        Err(HeartbeatError::BadName(_))
    ));
    assert!(matches!(
        Heartbeat::new(&"x".repeat(65), None),
        Err(HeartbeatError::BadName(_))
    ));
    for t in [
        Target::Rate(0.0),
        Target::Rate(-1.0),
        Target::Rate(f64::NAN),
        Target::PerUnit(Duration::ZERO),
    ] {
        assert!(matches!(
            Heartbeat::new("a", Some(t)),
            Err(HeartbeatError::BadTarget(_))
        ));
    }
}

#[test]
fn an_overrun_ring_reports_what_it_lost_and_keeps_the_count() {
    let hb = Heartbeat::new("flood", None).unwrap();
    let mut r = reader_of(&hb);
    for _ in 0..RING + 10 {
        hb.beat();
    }
    let x = r.read_new(now_ns());
    assert_eq!(x.count, RING as u64 + 10);
    assert_eq!(x.unreadable, 10);
    assert_eq!(x.beats.len(), RING);
    assert_eq!(x.beats[0].index, 10);
}

#[test]
fn beats_from_many_threads_are_all_counted() {
    let hb = Heartbeat::new("mt", None).unwrap();
    let mut r = reader_of(&hb);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..10_000 {
                    hb.beat();
                }
            });
        }
    });
    let x = r.read_new(now_ns());
    assert_eq!(x.count, 40_000);
    assert_eq!(x.unreadable + x.beats.len() as u64, 40_000);
}

#[test]
fn a_count_that_goes_back_is_reported_and_ignored() {
    let hb = Heartbeat::new("liar", None).unwrap();
    let mut r = reader_of(&hb);
    for _ in 0..5 {
        hb.beat();
    }
    assert_eq!(r.read_new(now_ns()).count, 5);
    let m = scribbler(&hb);
    word(&m, COUNT_OFFSET).store(2, Ordering::SeqCst);
    let x = r.read_new(now_ns());
    assert!(x.count_went_back);
    assert_eq!((x.count, x.new_count), (5, 0));
}

#[test]
fn forged_timestamps_and_targets_are_rejected() {
    let hb = Heartbeat::new("forger", None).unwrap();
    let mut r = reader_of(&hb);
    let m = scribbler(&hb);
    let now = now_ns();
    // Beat 0 far in the future, beat 1 at time 0, beat 2 honest.
    for (i, ts) in [(0u64, now + 10_000_000_000), (1, 0), (2, now)] {
        let slot = RING_OFFSET + i as usize * SLOT_SIZE;
        word(&m, slot + 8).store(ts, Ordering::SeqCst);
        word(&m, slot).store(2 * i + 2, Ordering::SeqCst);
    }
    word(&m, COUNT_OFFSET).store(3, Ordering::SeqCst);
    word(&m, TARGET_OFFSET).store(u64::MAX, Ordering::SeqCst);
    let x = r.read_new(now + 1);
    assert_eq!(x.bad_timestamps, 2);
    assert_eq!(x.beats.len(), 1);
    assert!(x.bad_target);
    assert_eq!(x.target_ns, None);
}

#[test]
fn a_half_written_slot_is_not_read() {
    let hb = Heartbeat::new("torn", None).unwrap();
    let mut r = reader_of(&hb);
    let m = scribbler(&hb);
    word(&m, RING_OFFSET).store(1, Ordering::SeqCst); // beat 0 being written
    word(&m, COUNT_OFFSET).store(1, Ordering::SeqCst);
    let x = r.read_new(now_ns());
    assert_eq!((x.unreadable, x.beats.len()), (1, 0));
}

#[test]
fn regions_that_are_not_sealed_heartbeats_are_refused() {
    // Unsealed memfd of the right size.
    let raw =
        nix::sys::memfd::memfd_create(c"x", nix::sys::memfd::MemFdCreateFlag::MFD_ALLOW_SEALING)
            .unwrap();
    nix::unistd::ftruncate(&raw, layout::REGION_LEN as i64).unwrap();
    let e = HeartbeatReader::open(raw).unwrap_err();
    assert!(e.to_string().contains("not sealed"), "{e}");
    // A plain file.
    let f: OwnedFd = tempfile::tempfile().unwrap().into();
    assert!(HeartbeatReader::open(f).is_err());
    // Sealed, right size, garbage header.
    let fd = region::create("ok").unwrap();
    let m = Mapping::map(fd.as_fd(), true).unwrap();
    word(&m, 0).store(0xdead_beef, Ordering::SeqCst);
    let e = HeartbeatReader::open(fd).unwrap_err();
    assert!(e.to_string().contains("magic"), "{e}");
}

#[test]
fn registration_hands_the_heartbeat_and_the_peer_to_the_broker() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("broker.sock");
    let listener = Listener::bind(&sock).unwrap();
    let hb = Heartbeat::register_at("enc", Some(Target::Rate(30.0)), &sock).unwrap();
    let inc = listener
        .accept()
        .unwrap()
        .expect("a blocking accept returns one");
    assert_eq!(inc.hello.name, "enc");
    assert_eq!(inc.pid, std::process::id() as i32);
    crate::register::Incoming::accept(&inc.conn);
    let mut r = HeartbeatReader::open(inc.fd).unwrap();
    hb.beat();
    assert_eq!(r.read_new(now_ns()).new_count, 1);
    // Dropping the heartbeat closes the connection: the broker sees end of file.
    drop(hb);
    use std::io::Read;
    let mut buf = [0u8; 8];
    inc.conn
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    assert_eq!((&inc.conn).read(&mut buf).unwrap(), 0);
}

#[test]
fn registration_retries_until_a_broker_listens() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("late.sock");
    let hb = Heartbeat::register_at("late", None, &sock).unwrap();
    hb.beat(); // beats never wait for the broker
    std::thread::sleep(Duration::from_millis(300));
    let listener = Listener::bind(&sock).unwrap();
    let inc = listener.accept().unwrap().unwrap();
    assert_eq!(inc.hello.name, "late");
}

proptest::proptest! {
    /// Whatever a hostile cell writes into its region after the header, reading never panics
    /// and every accepted beat passed the checks.
    #[test]
    fn reading_garbage_is_contained(words in proptest::collection::vec(proptest::num::u64::ANY, 64), count in 0u64..5000) {
        let hb = Heartbeat::new("fuzz", None).unwrap();
        let mut r = reader_of(&hb);
        let m = scribbler(&hb);
        for (i, w) in words.iter().enumerate() {
            word(&m, TARGET_OFFSET + 8 * (i % 2)).store(*w, Ordering::Relaxed);
            word(&m, RING_OFFSET + (i * 8 * 7) % (RING * SLOT_SIZE)).store(*w, Ordering::Relaxed);
            word(&m, RING_OFFSET + i * SLOT_SIZE).store(2 * i as u64 + 2, Ordering::Relaxed);
            word(&m, RING_OFFSET + i * SLOT_SIZE + 8).store(w % 2_000_000_000_000, Ordering::Relaxed);
        }
        word(&m, COUNT_OFFSET).store(count, Ordering::Relaxed);
        let now = now_ns();
        let x = r.read_new(now);
        proptest::prop_assert!(x.beats.len() as u64 + x.unreadable + x.bad_timestamps == x.new_count);
        for b in &x.beats {
            proptest::prop_assert!(b.ts_ns != 0 && b.ts_ns <= now + crate::reader::FUTURE_TOLERANCE_NS);
        }
        if let Some(t) = x.target_ns { proptest::prop_assert!(t <= crate::reader::MAX_TARGET_NS); }
    }
}
