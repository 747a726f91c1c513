//! `tess bench pulse`: Pulse's costs beside the kernel's, measured in the same run (seed 004
//! section 4.5, Table 3).
//!
//! | figure | what | baseline in the same run |
//! |---|---|---|
//! | `coop_switch_ns` | median over batches of 1,000 round trips of one `yield_now` to the next thread (GRR, one hart, two threads ping-ponging) | `kernel_switch_ns`: two kernel threads on one CPU ping-ponging through a futex, per switch, batches of 100 round trips |
//! | `tick_total_ns`, `tick_total_p99_ns` | timer expiry to the next application context running (GRR, one hart, two spinning threads, 1 ms tick) | `fifo_preempt_ns`, `fifo_preempt_p99_ns`: expiry of a `SCHED_FIFO` thread's absolute `clock_nanosleep` to it running, preempting a lower `SCHED_FIFO` spinner on the same CPU |
//! | `tick_kernel_ns` / `tick_sigreturn_ns` / `tick_user_ns` | the split: expiry -> handler (kernel delivery), handler -> trampoline (`rt_sigreturn`), trampoline -> next thread (user level) | |
//! | `thread_create_ns` | `pulse_thread_alloc` + `pulse_ctx_make` from a warm stack pool | `pthread_create_ns`: `std::thread::spawn` + `join` |
//! | `adapt_ms`, `adapt_max_ms` | `PulseHandle::resize` to the scheduler's `adapt` returning, 2 -> 1 -> 2 harts repeatedly | |
//!
//! The same adaptation driven by tessd (`adapt_tessd_ms`, `adapt_tessd_max_ms`: a Pulse
//! program in a 2-hart cell, `tess cell resize` to `adapt` returning) needs a running tessd and
//! is measured by the command (`crates/tess-cli/src/bench/pulse.rs`), not here.
//!
//! The paper's Table 3 splits a tick into a 1st level (kernel, 1,452 ns) and a 2nd level
//! (user, 1,598 ns), 3,050 ns in total on a 3.3 GHz i5. Here the kernel part is delivery plus
//! `rt_sigreturn`.

use crate::clock::now_ns;
use crate::{CellMode, Config, Grr, Pulse};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tess_bench::{Report, Summary, Table};

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// A short smoke run.
    pub quick: bool,
    /// The CPU to measure on (default: the highest the process may use).
    pub cpu: Option<usize>,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn median(v: &mut [f64]) -> f64 {
    Summary::of(v).median
}

fn pin(cpu: usize) -> std::io::Result<()> {
    // SAFETY: zeroed cpu_set_t is valid; CPU_SET writes inside it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: pid 0 = calling thread.
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn default_cpu() -> usize {
    // SAFETY: zeroed cpu_set_t is valid; sched_getaffinity fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-buffer.
    unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    // SAFETY: CPU_ISSET reads the set.
    (0..libc::CPU_SETSIZE as usize)
        .rev()
        .find(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .unwrap_or(0)
}

/// Standalone even when the bench itself runs in a cell: these figures are Pulse's own.
fn one_hart(cpu: usize, tick: Option<Duration>) -> Config {
    Config {
        cell: CellMode::Standalone,
        harts: 1,
        cpus: vec![cpu],
        tick,
        ..Config::default()
    }
}

/// Switches per timed batch: short enough (tens of microseconds) that most batches run
/// without another process taking the CPU, so the median is the switch's own cost even on a
/// busy machine.
const BATCH: u64 = 1000;

/// Per-switch cost: two threads on one hart yield to each other; one of them times batches of
/// `BATCH` of its yields (each is two switches: to the other thread and back).
fn coop_switch(cpu: usize, batches: usize) -> Result<Vec<f64>, BoxError> {
    let mut p = Pulse::new(one_hart(cpu, None), Grr::new(8))?;
    let stop = Arc::new(AtomicBool::new(false));
    let out = Arc::new(std::sync::Mutex::new(Vec::with_capacity(batches)));
    {
        let (stop, out) = (stop.clone(), out.clone());
        p.spawn(move || {
            let mut v = Vec::with_capacity(batches);
            for _ in 0..batches {
                let t0 = now_ns();
                for _ in 0..BATCH {
                    crate::yield_now();
                }
                v.push((now_ns() - t0) as f64 / (2 * BATCH) as f64);
            }
            stop.store(true, Ordering::Relaxed);
            *out.lock().unwrap_or_else(|e| e.into_inner()) = v;
        })?;
    }
    p.spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            crate::yield_now();
        }
    })?;
    p.run()?;
    let v = std::mem::take(&mut *out.lock().unwrap_or_else(|e| e.into_inner()));
    Ok(v)
}

fn futex_wait(w: &AtomicU32, v: u32) {
    // SAFETY: FUTEX_WAIT on our own word, no timeout.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            w.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            v,
            std::ptr::null::<libc::timespec>(),
        )
    };
}

fn futex_wake(w: &AtomicU32) {
    // SAFETY: FUTEX_WAKE on our own word.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            w.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            1,
        )
    };
}

/// Per-switch cost of two kernel threads on one CPU handing a token back and forth by futex,
/// timed in batches of `BATCH / 10` round trips (kernel switches are ~100x slower).
fn kernel_switch(cpu: usize, batches: usize) -> Result<Vec<f64>, BoxError> {
    let per_batch = (BATCH / 10) as u32;
    let total = per_batch * batches as u32;
    // turn: even = ping's turn, odd = pong's.
    let turn = Arc::new(AtomicU32::new(0));
    let t2 = turn.clone();
    let pong = std::thread::spawn(move || -> std::io::Result<()> {
        pin(cpu)?;
        for i in 0..total {
            let mine = 2 * i + 1;
            loop {
                let v = t2.load(Ordering::Acquire);
                if v == mine {
                    break;
                }
                futex_wait(&t2, v);
            }
            t2.store(mine + 1, Ordering::Release);
            futex_wake(&t2);
        }
        Ok(())
    });
    let t1 = turn.clone();
    let ping = std::thread::spawn(move || -> std::io::Result<Vec<f64>> {
        pin(cpu)?;
        let mut out = Vec::with_capacity(batches);
        let mut t0 = now_ns();
        for i in 0..total {
            let mine = 2 * i;
            loop {
                let v = t1.load(Ordering::Acquire);
                if v == mine {
                    break;
                }
                futex_wait(&t1, v);
            }
            t1.store(mine + 1, Ordering::Release);
            futex_wake(&t1);
            if (i + 1) % per_batch == 0 {
                let now = now_ns();
                out.push((now - t0) as f64 / (2 * per_batch) as f64);
                t0 = now;
            }
        }
        Ok(out)
    });
    let out = ping.join().map_err(|_| "ping thread panicked")??;
    pong.join().map_err(|_| "pong thread panicked")??;
    Ok(out)
}

/// Tick latency samples: (delivery, sigreturn, user) per preempting tick.
fn tick_latency(cpu: usize, run: Duration) -> Result<crate::TickStats, BoxError> {
    let mut p = Pulse::new(one_hart(cpu, Some(Duration::from_millis(1))), Grr::new(8))?;
    let stop = Arc::new(AtomicBool::new(false));
    for _ in 0..2 {
        let stop = stop.clone();
        p.spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        })?;
    }
    let s2 = stop.clone();
    let timer = std::thread::spawn(move || {
        std::thread::sleep(run);
        s2.store(true, Ordering::Relaxed);
    });
    let stats = p.run()?;
    timer.join().map_err(|_| "timer thread panicked")?;
    Ok(stats)
}

fn set_fifo(prio: i32) -> std::io::Result<()> {
    let param = libc::sched_param {
        sched_priority: prio,
    };
    // SAFETY: pid 0 = calling thread; valid param.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Kernel preemption latency between two SCHED_FIFO threads on one CPU: a high-priority
/// thread sleeps to absolute times 1 ms apart while a lower one spins; each sample is the
/// sleep's expiry to the high thread running.
fn fifo_preempt(cpu: usize, run: Duration) -> Result<Vec<u64>, BoxError> {
    let stop = Arc::new(AtomicBool::new(false));
    let s1 = stop.clone();
    let spinner = std::thread::spawn(move || -> std::io::Result<()> {
        pin(cpu)?;
        set_fifo(10)?;
        while !s1.load(Ordering::Relaxed) {
            std::hint::spin_loop();
        }
        Ok(())
    });
    let s2 = stop.clone();
    let waker = std::thread::spawn(move || -> std::io::Result<Vec<u64>> {
        pin(cpu)?;
        set_fifo(20)?;
        let mut samples = Vec::new();
        let end = now_ns() + crate::clock::ns(run);
        let mut at = now_ns() + 2_000_000;
        while at < end {
            let ts = crate::clock::timespec(at);
            // SAFETY: valid timespec; absolute sleep on CLOCK_MONOTONIC.
            unsafe {
                libc::clock_nanosleep(
                    libc::CLOCK_MONOTONIC,
                    libc::TIMER_ABSTIME,
                    &ts,
                    std::ptr::null_mut(),
                )
            };
            samples.push(now_ns().saturating_sub(at));
            at += 1_000_000;
        }
        s2.store(true, Ordering::Relaxed);
        Ok(samples)
    });
    let samples = waker.join().map_err(|_| "waker panicked");
    stop.store(true, Ordering::Relaxed);
    let spun = spinner.join().map_err(|_| "spinner panicked")?;
    let samples = samples??;
    spun?;
    Ok(samples)
}

/// Thread creation from a warm pool, ns per thread (median of batches).
fn thread_create(batches: usize, per_batch: usize) -> Result<Vec<f64>, BoxError> {
    crate::stack::POOL.reserve(per_batch, crate::DEFAULT_STACK)?;
    let mut out = Vec::new();
    let mut made = Vec::with_capacity(per_batch);
    for _ in 0..batches {
        let t0 = now_ns();
        for _ in 0..per_batch {
            let t = crate::ffi::pulse_thread_alloc(0);
            made.push(t);
            // SAFETY: t is a fresh thread from pulse_thread_alloc.
            unsafe { crate::ffi::pulse_ctx_make(t, Some(nothing), std::ptr::null_mut()) };
        }
        let took = now_ns() - t0;
        out.push(took as f64 / per_batch as f64);
        for t in made.drain(..) {
            // SAFETY: never started, referenced from nowhere else.
            unsafe { crate::thread::PulseThread::free(t.cast()) };
        }
    }
    // pulse_ctx_make counted these as pending threads of a future pulse_run: forget them.
    crate::ffi::forget_pending();
    Ok(out)
}

extern "C" fn nothing(_: *mut libc::c_void) {}

fn pthread_create(n: usize) -> Vec<f64> {
    (0..n)
        .map(|_| {
            let t0 = now_ns();
            let _ = std::thread::spawn(|| {}).join();
            (now_ns() - t0) as f64
        })
        .collect()
}

/// Adaptation latency: 2 -> 1 -> 2 harts `cycles` times under 4 spinning threads.
fn adapt_latency(cycles: usize) -> Result<Vec<u64>, BoxError> {
    let mut p = Pulse::new(
        Config {
            cell: CellMode::Standalone,
            harts: 2,
            ..Config::default()
        },
        Grr::new(8),
    )?;
    let stop = Arc::new(AtomicBool::new(false));
    for _ in 0..4 {
        let stop = stop.clone();
        p.spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        })?;
    }
    let h = p.handle();
    let s2 = stop.clone();
    let driver = std::thread::spawn(move || -> Result<(), String> {
        std::thread::sleep(Duration::from_millis(20));
        for _ in 0..cycles {
            for n in [1, 2] {
                h.resize(n).map_err(|e| e.to_string())?;
                if !h.wait_adapted(Duration::from_secs(5)) {
                    s2.store(true, Ordering::Relaxed);
                    return Err(format!("adaptation to {n} harts did not finish in 5 s"));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        s2.store(true, Ordering::Relaxed);
        Ok(())
    });
    let stats = p.run()?;
    driver.join().map_err(|_| "driver panicked")??;
    Ok(stats.adapt_ns)
}

/// Runs the benchmark.
pub fn run(o: &BenchOptions) -> Result<Report, BoxError> {
    let cpu = o.cpu.unwrap_or_else(default_cpu);
    let (batches, tick_run, create_batches, adapt_cycles) = if o.quick {
        (200, Duration::from_millis(300), 10, 3)
    } else {
        (2000, Duration::from_secs(3), 200, 20)
    };
    let mut r = Report::new("pulse");
    r.note(format!("measured on CPU {cpu}"));

    let mut coop = coop_switch(cpu, batches)?;
    let mut kern = kernel_switch(cpu, batches / 4)?;
    let coop_s = Summary::of(&coop);
    let kern_s = Summary::of(&kern);
    r.figure("coop_switch_ns", median(&mut coop));
    r.figure("kernel_switch_ns", median(&mut kern));

    let ticks = tick_latency(cpu, tick_run)?;
    let total: Vec<u64> = ticks
        .delivery_ns
        .iter()
        .zip(&ticks.sigreturn_ns)
        .zip(&ticks.user_ns)
        .map(|((a, b), c)| a + b + c)
        .collect();
    let tot = Summary::of_ns(&total);
    let del = Summary::of_ns(&ticks.delivery_ns);
    let sig = Summary::of_ns(&ticks.sigreturn_ns);
    let usr = Summary::of_ns(&ticks.user_ns);
    r.figure("tick_total_ns", tot.median);
    r.figure("tick_total_p99_ns", tot.p99);
    r.figure("tick_kernel_ns", del.median + sig.median);
    r.figure("tick_delivery_ns", del.median);
    r.figure("tick_sigreturn_ns", sig.median);
    r.figure("tick_user_ns", usr.median);
    r.figure("tick_samples", tot.count as f64);

    let fifo = match fifo_preempt(cpu, tick_run.min(Duration::from_secs(1))) {
        Ok(s) => {
            let f = Summary::of_ns(&s);
            r.figure("fifo_preempt_ns", f.median);
            r.figure("fifo_preempt_p99_ns", f.p99);
            Some(f)
        }
        Err(e) => {
            r.note(format!(
                "SCHED_FIFO baseline not measured: {e} (needs root)"
            ));
            None
        }
    };

    let mut create = thread_create(create_batches, 256)?;
    let mut pthread = pthread_create(if o.quick { 50 } else { 500 });
    let create_s = Summary::of(&create);
    r.figure("thread_create_ns", median(&mut create));
    r.figure("pthread_create_ns", median(&mut pthread));

    let adapt = adapt_latency(adapt_cycles)?;
    let ad = Summary::of_ns(&adapt);
    r.figure("adapt_ms", ad.median / 1e6);
    r.figure("adapt_max_ms", ad.max / 1e6);

    let mut t = Table::new(
        "Pulse vs the kernel (ns unless noted)",
        &[
            "quantity",
            "Pulse median",
            "Pulse p99",
            "baseline",
            "baseline median",
            "baseline p99",
        ],
    );
    let f = |x: f64| format!("{x:.0}");
    t.row(&[
        "switch to the next thread".to_string(),
        f(coop_s.median),
        f(coop_s.p99),
        "futex ping-pong, 1 CPU".into(),
        f(kern_s.median),
        f(kern_s.p99),
    ]);
    t.row(&[
        "tick: expiry -> next thread runs".to_string(),
        f(tot.median),
        f(tot.p99),
        "SCHED_FIFO preemption".into(),
        fifo.map_or("-".into(), |x| f(x.median)),
        fifo.map_or("-".into(), |x| f(x.p99)),
    ]);
    t.row(&[
        "  kernel: expiry -> handler".to_string(),
        f(del.median),
        f(del.p99),
        String::new(),
        String::new(),
        String::new(),
    ]);
    t.row(&[
        "  kernel: handler -> trampoline (sigreturn)".to_string(),
        f(sig.median),
        f(sig.p99),
        String::new(),
        String::new(),
        String::new(),
    ]);
    t.row(&[
        "  user: save, tick(), switch".to_string(),
        f(usr.median),
        f(usr.p99),
        String::new(),
        String::new(),
        String::new(),
    ]);
    t.row(&[
        "thread creation".to_string(),
        f(create_s.median),
        f(create_s.p99),
        "std::thread::spawn + join".into(),
        f(Summary::of(&pthread).median),
        f(Summary::of(&pthread).p99),
    ]);
    t.row(&[
        "adaptation 2<->1 harts (ms)".to_string(),
        format!("{:.3}", ad.median / 1e6),
        format!("max {:.3}", ad.max / 1e6),
        String::new(),
        String::new(),
        String::new(),
    ]);
    r.table(t);
    r.note(format!(
        "tick samples: {} preempting ticks ({} fired, {} masked, {} deferred in libc); paper Table 3: 1st level 1,452 ns + 2nd level 1,598 ns = 3,050 ns",
        tot.count, ticks.fired, ticks.masked, ticks.deferred
    ));
    r.target(
        "coop_switch_ns < 50",
        coop_s.median < 50.0,
        format!("{:.1} ns", coop_s.median),
    );
    r.target(
        "tick_total_ns median < 3000",
        tot.median < 3000.0 && tot.count > 0,
        format!("{:.0} ns", tot.median),
    );
    r.target(
        "thread_create_ns < 1000",
        create_s.median < 1000.0,
        format!("{:.0} ns", create_s.median),
    );
    r.target(
        "adapt_ms median < 2",
        ad.count > 0 && ad.median < 2e6,
        format!("{:.3} ms (max {:.3})", ad.median / 1e6, ad.max / 1e6),
    );
    r.compare(
        "user-level thread switch (ns)",
        Some("seed 004 section 4.5 (no figure for a yield)"),
        "coop_switch_ns",
        Some((
            "kernel_switch_ns",
            "futex ping-pong between two threads on one CPU",
        )),
    );
    r.compare(
        "tick: timer expiry to the next thread running, median (ns)",
        Some("seed 004 Table 3: 3,050"),
        "tick_total_ns",
        Some(("fifo_preempt_ns", "SCHED_FIFO preemption on one CPU")),
    );
    r.detail("tick_total_ns", tot);
    r.detail("tick_delivery_ns", del);
    r.detail("tick_sigreturn_ns", sig);
    r.detail("tick_user_ns", usr);
    r.detail("adapt_ns", ad);
    Ok(r)
}
