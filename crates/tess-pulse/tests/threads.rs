//! User-level threads on real harts: cooperative switching, preemption by the tick, locks,
//! sleep, adaptation. None of these needs root (timers and signals are unprivileged).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tess_pulse::{Config, Edf, Grr, Pulse, PulseMutex, ThreadOptions};

fn one_hart(tick: Option<Duration>) -> Config {
    Config {
        harts: 1,
        cpus: vec![0],
        tick,
        ..Config::default()
    }
}

#[test]
fn cooperative_threads_alternate_on_one_hart() {
    let mut p = Pulse::new(one_hart(None), Grr::default()).unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    for id in 0..2u32 {
        let log = log.clone();
        p.spawn(move || {
            for i in 0..3u32 {
                tess_pulse::without_ticks(|| log.lock().unwrap().push((id, i)));
                tess_pulse::yield_now();
            }
        })
        .unwrap();
    }
    p.run().unwrap();
    let log = log.lock().unwrap().clone();
    assert_eq!(log, vec![(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]);
}

/// The calling context's MXCSR and x87 control word.
fn control_words() -> (u32, u16) {
    let (mut mxcsr, mut cw) = (0u32, 0u16);
    // SAFETY: stores the two registers into our own locals.
    unsafe {
        std::arch::asm!(
            "stmxcsr [{m}]",
            "fnstcw [{c}]",
            m = in(reg) &mut mxcsr,
            c = in(reg) &mut cw,
            options(nostack)
        )
    };
    (mxcsr, cw)
}

/// Loads MXCSR and the x87 control word.
///
/// Rust assumes the default floating-point environment (see `_mm_setcsr` in `std::arch`), so
/// strictly no Rust code should run with other control words. The test needs a thread that
/// runs with its own words across yields, as a C thread does after `fesetround`; between
/// setting and restoring them it only yields and reads the words, with no floating-point
/// operation that a different rounding mode could change.
fn set_control_words(mxcsr: u32, cw: u16) {
    // SAFETY: valid values (all exceptions stay masked), so no floating-point trap follows.
    unsafe {
        std::arch::asm!(
            "ldmxcsr [{m}]",
            "fldcw [{c}]",
            m = in(reg) &mxcsr,
            c = in(reg) &cw,
            options(nostack)
        )
    };
}

/// MXCSR's control bits (its low six bits are sticky status flags, which a switch need not
/// carry: the ABI lets any call change them).
const MXCSR_CONTROL: u32 = 0xFFC0;

/// The control words every thread starts with: all exceptions masked, round to nearest, x87
/// extended precision (the values a fresh context carries, and the ABI's initial state).
const FRESH: (u32, u16) = (0x1F80, 0x037F);

/// A thread that changes its rounding modes keeps them across switches, and a thread beside
/// it keeps the defaults: the switch must carry each thread's control words with it.
#[test]
fn each_thread_keeps_its_own_floating_point_control_words() {
    let mut p = Pulse::new(one_hart(None), Grr::default()).unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    // Round toward zero in SSE; 24-bit precision and round up in x87.
    let custom: (u32, u16) = (0x1F80 | 0x6000, 0x007F | 0x0800);
    for (who, mine) in [("custom", custom), ("default", FRESH)] {
        let seen = seen.clone();
        p.spawn(move || {
            let first = control_words();
            if who == "custom" {
                set_control_words(mine.0, mine.1);
            }
            let mut resumed = Vec::with_capacity(100);
            for _ in 0..100 {
                tess_pulse::yield_now();
                resumed.push(control_words());
            }
            set_control_words(FRESH.0, FRESH.1);
            tess_pulse::without_ticks(|| seen.lock().unwrap().push((who, mine, first, resumed)));
        })
        .unwrap();
    }
    p.run().unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    let control = |(mxcsr, cw): (u32, u16)| (mxcsr & MXCSR_CONTROL, cw);
    for (who, mine, first, resumed) in seen {
        assert_eq!(
            control(first),
            control(FRESH),
            "{who} thread started with {first:x?}"
        );
        for now in resumed {
            assert_eq!(
                control(now),
                control(mine),
                "{who} thread resumed with MXCSR and x87 control word {now:x?}"
            );
        }
    }
}

/// CPU time of the calling kernel thread (the hart), ns: unlike wall-clock time it does not
/// grow while other processes' threads hold the CPU.
fn hart_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[test]
fn a_spinning_thread_is_preempted_within_two_ticks() {
    let tick = Duration::from_millis(1);
    let mut p = Pulse::new(one_hart(Some(tick)), Grr::default()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let started = Arc::new(AtomicU64::new(0));
    let other_ran_at = Arc::new(AtomicU64::new(0));
    {
        let stop = stop.clone();
        let started = started.clone();
        p.spawn(move || {
            started.store(hart_cpu_ns(), Ordering::SeqCst);
            // Never yields: only the tick can take the hart away.
            while !stop.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        })
        .unwrap();
    }
    {
        let stop = stop.clone();
        let other = other_ran_at.clone();
        p.spawn(move || {
            other.store(hart_cpu_ns(), Ordering::SeqCst);
            stop.store(true, Ordering::SeqCst);
        })
        .unwrap();
    }
    let stats = p.run().unwrap();
    let waited = other_ran_at.load(Ordering::SeqCst) - started.load(Ordering::SeqCst);
    assert!(stats.preempted >= 1, "{stats:?}");
    // Both ran on the one hart's kernel thread, so the difference of its CPU clock is how
    // long the spinner held the hart: at most two tick periods (plus the tick's own cost).
    assert!(
        waited < 2 * 1_000_000 + 200_000,
        "the second thread ran after the spinner held the hart for {waited} ns of CPU time"
    );
}

#[test]
fn many_threads_on_two_harts_all_finish() {
    let cfg = Config {
        harts: 2,
        ..Config::default()
    };
    let mut p = Pulse::new(cfg, Grr::default()).unwrap();
    let done = Arc::new(AtomicUsize::new(0));
    for _ in 0..50 {
        let done = done.clone();
        p.spawn(move || {
            let mut x = 0u64;
            for k in 0..200_000u64 {
                x = x.wrapping_mul(31).wrapping_add(k);
                if k % 50_000 == 0 {
                    tess_pulse::yield_now();
                }
            }
            std::hint::black_box(x);
            done.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    }
    p.run().unwrap();
    assert_eq!(done.load(Ordering::SeqCst), 50);
}

#[test]
fn pulse_mutex_excludes_under_preemption() {
    let cfg = Config {
        harts: 2,
        tick: Some(Duration::from_micros(200)),
        ..Config::default()
    };
    let mut p = Pulse::new(cfg, Grr::default()).unwrap();
    let m = Arc::new(PulseMutex::new((0u64, 0u64)));
    for _ in 0..8 {
        let m = m.clone();
        p.spawn(move || {
            for _ in 0..20_000 {
                let mut g = m.lock();
                // A torn update would show as a != b.
                g.0 += 1;
                std::hint::black_box(&mut *g);
                g.1 += 1;
            }
        })
        .unwrap();
    }
    p.run().unwrap();
    let g = m.lock();
    assert_eq!(*g, (160_000, 160_000));
}

#[test]
fn sleep_does_not_block_the_hart() {
    let mut p = Pulse::new(one_hart(Some(Duration::from_millis(1))), Edf::default()).unwrap();
    let worked = Arc::new(AtomicU64::new(0));
    let slept_ns = Arc::new(AtomicU64::new(0));
    {
        let slept_ns = slept_ns.clone();
        p.spawn(move || {
            let t0 = tess_pulse::clock::now_ns();
            tess_pulse::sleep(Duration::from_millis(20));
            slept_ns.store(tess_pulse::clock::now_ns() - t0, Ordering::SeqCst);
        })
        .unwrap();
    }
    {
        let worked = worked.clone();
        let slept_ns = slept_ns.clone();
        p.spawn(move || {
            while slept_ns.load(Ordering::SeqCst) == 0 {
                worked.fetch_add(1, Ordering::Relaxed);
                tess_pulse::yield_now();
            }
        })
        .unwrap();
    }
    p.run().unwrap();
    let slept = slept_ns.load(Ordering::SeqCst);
    assert!(slept >= 20_000_000, "woke after {slept} ns");
    assert!(
        worked.load(Ordering::SeqCst) > 100,
        "the other thread ran meanwhile"
    );
}

#[test]
fn threads_can_spawn_threads() {
    let mut p = Pulse::new(one_hart(Some(Duration::from_millis(1))), Grr::default()).unwrap();
    let n = Arc::new(AtomicUsize::new(0));
    let n2 = n.clone();
    p.spawn(move || {
        for _ in 0..10 {
            let n = n2.clone();
            tess_pulse::spawn(ThreadOptions::named("child"), move || {
                n.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
        }
    })
    .unwrap();
    p.run().unwrap();
    assert_eq!(n.load(Ordering::SeqCst), 10);
}

#[test]
fn an_idle_hart_is_not_woken_by_its_ticks() {
    // One thread sleeps 300 ms with a 1 ms tick: a periodic timer left armed would fire about
    // 300 times into the idle hart; stopped while the hart idles, it fires a handful at most
    // (around the thread's own short runs). Counts, not timings.
    let mut p = Pulse::new(one_hart(Some(Duration::from_millis(1))), Grr::default()).unwrap();
    p.spawn(|| {
        let until = tess_pulse::clock::now_ns() + 300_000_000;
        tess_pulse::sleep_until_ns(until);
        assert!(tess_pulse::clock::now_ns() >= until);
    })
    .unwrap();
    let stats = p.run().unwrap();
    assert!(stats.fired < 30, "ticks fired into an idle hart: {stats:?}");
}

#[test]
fn ticks_come_back_after_an_idle_spell() {
    // After a sleep the hart's timer is re-armed: a thread spinning 20 ms afterwards beside
    // another is still preempted (round robin alternates them).
    let mut p = Pulse::new(one_hart(Some(Duration::from_millis(1))), Grr::default()).unwrap();
    let last = Arc::new(AtomicUsize::new(usize::MAX));
    let switches = Arc::new(AtomicUsize::new(0));
    for id in 0..2usize {
        let (last, switches) = (last.clone(), switches.clone());
        p.spawn(move || {
            tess_pulse::sleep_until_ns(tess_pulse::clock::now_ns() + 50_000_000);
            let t0 = tess_pulse::clock::now_ns();
            while tess_pulse::clock::now_ns() - t0 < 20_000_000 {
                if last.swap(id, Ordering::Relaxed) != id {
                    switches.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
        .unwrap();
    }
    let stats = p.run().unwrap();
    assert!(
        stats.preempted >= 2,
        "no tick preempted after the sleep: {stats:?}"
    );
    assert!(switches.load(Ordering::Relaxed) >= 3, "{stats:?}");
}
