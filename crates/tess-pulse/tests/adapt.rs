//! Adaptation (seed 004 section 4.4): 2 harts -> 1 -> 2 loses no thread, keeps vhart ids,
//! calls `adapt` once per change with the threads that were running; a second resize while
//! one is in progress is a clear error.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tess_pulse::{Config, Grr, Hart, Pulse, PulseError, Scheduler, Thread};

/// One `adapt` call: (old_n, new_n, threads handed over, the vhart it ran on).
type AdaptCall = (usize, usize, usize, Option<usize>);

/// GRR that records every `adapt` call and can be slowed down inside it.
struct Recording {
    inner: Grr,
    calls: Arc<Mutex<Vec<AdaptCall>>>,
    slow: Duration,
}

impl Scheduler for Recording {
    fn enter(&self, h: &Hart<'_>) -> Option<Thread> {
        self.inner.enter(h)
    }
    fn tick(&self, h: &Hart<'_>, t: Thread) -> Option<Thread> {
        self.inner.tick(h, t)
    }
    fn r#yield(&self, h: &Hart<'_>, t: Thread) -> Option<Thread> {
        self.inner.r#yield(h, t)
    }
    fn adapt(&self, old_n: usize, new_n: usize, running: Vec<Thread>) {
        std::thread::sleep(self.slow);
        self.calls
            .lock()
            .unwrap()
            .push((old_n, new_n, running.len(), tess_pulse::vhart_id()));
        self.inner.adapt(old_n, new_n, running);
    }
    fn wake(&self, t: Thread) -> bool {
        self.inner.wake(t)
    }
}

#[test]
fn two_to_one_to_two_loses_no_thread_and_keeps_vhart_ids() {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let sched = Recording {
        inner: Grr::default(),
        calls: calls.clone(),
        slow: Duration::ZERO,
    };
    let cfg = Config {
        harts: 2,
        ..Config::default()
    };
    let mut p = Pulse::new(cfg, sched).unwrap();
    let finished = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    // phase 0: two harts, 1: one hart, 2: two again; each thread records the vharts it saw.
    let phase = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(Mutex::new([[false; 2]; 3]));
    for _ in 0..8 {
        let (finished, stop, phase, seen) =
            (finished.clone(), stop.clone(), phase.clone(), seen.clone());
        p.spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                // Spin without yielding for a while: only ticks and adaptations move us.
                let t0 = tess_pulse::clock::now_ns();
                while tess_pulse::clock::now_ns() - t0 < 200_000 {
                    std::hint::spin_loop();
                }
                tess_pulse::without_ticks(|| {
                    let v = tess_pulse::vhart_id().unwrap();
                    let ph = phase.load(Ordering::SeqCst);
                    seen.lock().unwrap()[ph][v] = true;
                });
            }
            finished.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    }
    let h = p.handle();
    let driver = {
        let (stop, phase, seen) = (stop.clone(), phase.clone(), seen.clone());
        // Waits (up to 20 s: a loaded machine starves harts) until vhart v ran in phase ph.
        let ran = move |ph: usize, v: usize| {
            let until = std::time::Instant::now() + Duration::from_secs(20);
            while !seen.lock().unwrap()[ph][v] && std::time::Instant::now() < until {
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        std::thread::spawn(move || {
            ran(0, 0);
            ran(0, 1);
            h.resize(1).unwrap();
            assert!(
                h.wait_adapted(Duration::from_secs(5)),
                "2 -> 1 did not finish"
            );
            assert_eq!(h.harts(), 1);
            phase.store(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(50));
            ran(1, 0);
            phase.store(2, Ordering::SeqCst);
            h.resize(2).unwrap();
            assert!(
                h.wait_adapted(Duration::from_secs(5)),
                "1 -> 2 did not finish"
            );
            assert_eq!(h.harts(), 2);
            ran(2, 0);
            ran(2, 1);
            stop.store(true, Ordering::SeqCst);
            h.stats().adapt_ns
        })
    };
    p.run().unwrap();
    let adapt_ns = driver.join().unwrap();
    assert_eq!(finished.load(Ordering::SeqCst), 8, "a thread was lost");
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!((calls[0].0, calls[0].1), (2, 1));
    assert_eq!((calls[1].0, calls[1].1), (1, 2));
    assert!(
        calls.iter().all(|c| c.3 == Some(0)),
        "adapt runs on vhart 0: {calls:?}"
    );
    assert!(
        calls[0].2 >= 1,
        "the threads running on 2 harts were handed to adapt"
    );
    let seen = *seen.lock().unwrap();
    assert!(
        seen[0][0] && seen[0][1],
        "both vharts ran threads before: {seen:?}"
    );
    // Threads can still be finishing the observation of phase 0 when phase 1 is set, but
    // after the change to one hart only vhart 0 exists.
    assert!(
        seen[1][0] && !seen[1][1],
        "only vhart 0 during the 1-hart phase: {seen:?}"
    );
    assert!(
        seen[2][0] && seen[2][1],
        "vhart 1 is back after regrowing: {seen:?}"
    );
    assert_eq!(adapt_ns.len(), 2);
}

#[test]
fn a_second_resize_during_an_adaptation_is_an_error() {
    let sched = Recording {
        inner: Grr::default(),
        calls: Arc::new(Mutex::new(Vec::new())),
        slow: Duration::from_millis(200),
    };
    let cfg = Config {
        harts: 2,
        ..Config::default()
    };
    let mut p = Pulse::new(cfg, sched).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    p.spawn(move || {
        while !s.load(Ordering::Relaxed) {
            std::hint::spin_loop();
        }
    })
    .unwrap();
    let h = p.handle();
    let driver = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        h.resize(1).unwrap();
        let second = h.resize(2);
        assert!(h.wait_adapted(Duration::from_secs(5)));
        stop.store(true, Ordering::SeqCst);
        second
    });
    p.run().unwrap();
    match driver.join().unwrap() {
        Err(PulseError::AdaptInProgress { old: 2, new: 1 }) => {}
        other => panic!("expected AdaptInProgress, got {other:?}"),
    }
}
