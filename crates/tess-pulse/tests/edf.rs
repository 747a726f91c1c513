//! Global EDF on real harts: deadline order, and priority inheritance through a Pulse lock
//! (the classic inversion: low holds a lock high needs while medium wants the CPU).

use std::sync::{Arc, Mutex};
use std::time::Duration;
use tess_pulse::{Config, Edf, Pulse, PulseMutex, ThreadOptions};

fn one_hart() -> Config {
    Config {
        harts: 1,
        cpus: vec![0],
        ..Config::default()
    }
}

fn spin_for(d: Duration) {
    let t0 = tess_pulse::clock::now_ns();
    while tess_pulse::clock::now_ns() - t0 < d.as_nanos() as u64 {
        std::hint::spin_loop();
    }
}

fn note(log: &Mutex<Vec<&'static str>>, what: &'static str) {
    tess_pulse::without_ticks(|| log.lock().unwrap().push(what));
}

#[test]
fn earliest_deadline_runs_first() {
    let mut p = Pulse::new(one_hart(), Edf::default()).unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    for (name, d) in [("late", 300u64), ("early", 100), ("middle", 200)] {
        let log = log.clone();
        let opts =
            ThreadOptions::named(name).timing(Duration::from_millis(d), Duration::from_millis(d));
        p.spawn_with(opts, move || {
            spin_for(Duration::from_millis(3));
            note(&log, name);
        })
        .unwrap();
    }
    p.run().unwrap();
    assert_eq!(*log.lock().unwrap(), vec!["early", "middle", "late"]);
}

#[test]
fn priority_inheritance_runs_the_lock_holder_before_medium_work() {
    let mut p = Pulse::new(one_hart(), Edf::default()).unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let lock = Arc::new(PulseMutex::new(()));
    let ms = Duration::from_millis;
    {
        let (log, lock) = (log.clone(), lock.clone());
        p.spawn_with(
            ThreadOptions::named("low").timing(ms(1000), ms(1000)),
            move || {
                let g = lock.lock();
                note(&log, "low locked");
                spin_for(ms(30));
                note(&log, "low unlocks");
                drop(g);
                note(&log, "low done");
            },
        )
        .unwrap();
    }
    {
        let (log, lock) = (log.clone(), lock.clone());
        p.spawn_with(
            ThreadOptions::named("high").timing(ms(20), ms(20)),
            move || {
                tess_pulse::sleep(ms(5));
                note(&log, "high wants lock");
                let _g = lock.lock();
                note(&log, "high locked");
            },
        )
        .unwrap();
    }
    {
        let log = log.clone();
        p.spawn_with(
            ThreadOptions::named("medium").timing(ms(100), ms(100)),
            move || {
                tess_pulse::sleep(ms(6));
                note(&log, "medium starts");
                spin_for(ms(50));
                note(&log, "medium done");
            },
        )
        .unwrap();
    }
    p.run().unwrap();
    let log = log.lock().unwrap().clone();
    let at = |s: &str| {
        log.iter()
            .position(|x| *x == s)
            .unwrap_or_else(|| panic!("{s} missing: {log:?}"))
    };
    assert!(at("low locked") < at("high wants lock"), "{log:?}");
    // With inheritance, low (now carrying high's deadline) finishes its critical section
    // before medium runs, and high gets the lock before medium finishes.
    assert!(at("low unlocks") < at("medium done"), "{log:?}");
    assert!(at("high locked") < at("medium done"), "{log:?}");
    assert!(
        at("high locked") < at("low done"),
        "the unlock handed over at once: {log:?}"
    );
}

#[test]
fn every_job_is_published_with_its_misses() {
    // Jobs publish to this process's `pulse-edf` page (crate tess-stats), made at the first
    // job's end in TESS_STATS_DIR: a private directory, set before any job ends.
    let stats = tempfile::tempdir().unwrap();
    std::env::set_var("TESS_STATS_DIR", stats.path());
    let mut p = Pulse::new(one_hart(), Edf::default()).unwrap();
    let ms = Duration::from_millis;
    p.spawn_with(
        ThreadOptions::named("periodic").timing(ms(5), ms(5)),
        move || {
            for job in 0..20 {
                // Job 10 runs 8 ms against its 5 ms deadline: a miss whatever else the machine does.
                spin_for(if job == 10 {
                    ms(8)
                } else {
                    Duration::from_micros(100)
                });
                tess_pulse::edf::wait_next_period();
            }
        },
    )
    .unwrap();
    p.run().unwrap();
    let me = std::process::id() as i32;
    let pages = tess_stats::for_processes(stats.path(), &[me]);
    let page = pages
        .iter()
        .find(|p| p.name == "pulse-edf")
        .unwrap_or_else(|| panic!("no pulse-edf page in {pages:?}"));
    assert_eq!(page.events, 20, "{page:?}");
    assert!(page.misses >= 1, "{page:?}");
    assert!(page.max_ns >= 8_000_000, "{page:?}");
    assert_eq!(page.buckets.iter().sum::<u64>(), 20);
}

#[test]
fn release_at_puts_threads_on_one_time_base() {
    // Two periodic threads created at different times start their jobs at one instant T:
    // `release_at(T)` returns T, and their next releases are T + their periods.
    let mut p = Pulse::new(one_hart(), Edf::default()).unwrap();
    let base = tess_pulse::clock::now_ns() + 30_000_000;
    let seen = Arc::new(Mutex::new(Vec::new()));
    for (name, period) in [("a", 7u64), ("b", 11)] {
        let seen = seen.clone();
        let ms = Duration::from_millis(period);
        p.spawn_with(ThreadOptions::named(name).timing(ms, ms), move || {
            spin_for(Duration::from_millis(2));
            let first = tess_pulse::edf::release_at(base);
            let woke = tess_pulse::clock::now_ns();
            let next = tess_pulse::edf::wait_next_period();
            tess_pulse::without_ticks(|| seen.lock().unwrap().push((period, first, woke, next)));
        })
        .unwrap();
    }
    p.run().unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    for (period, first, woke, next) in seen {
        assert_eq!(first, Some(base));
        assert!(woke >= base, "woke {} ns early", base - woke);
        assert_eq!(next, Some(base + period * 1_000_000));
    }
}

#[test]
fn release_at_outside_an_edf_thread_is_none() {
    assert_eq!(tess_pulse::edf::release_at(0), None);
}
