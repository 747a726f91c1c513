//! Proves that the audio path does not allocate: a counting global allocator counts every
//! allocation made by threads marked as audio threads (the communication thread running
//! `Host::run` and the worker threads), while a device thread (unmarked) plays packets to it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tess_music::emulator::{self, EmulatorConfig, Pace};
use tess_music::gesture::Gesture;
use tess_music::host::{Host, HostConfig};
use tess_music::net::Wait;
use tess_music::slabs::{PadSample, PADS};
use tess_music::synth::{AudioBlock, Engine, SynthParams};

struct Counting;

/// One counter per test (tests run in parallel), indexed by the thread's mark.
static ALLOCATIONS: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];
const UNMARKED: usize = 0;
const ENGINE: usize = 1;
const HOST: usize = 2;
const SANITY: usize = 3;

thread_local! {
    // Const-initialised and without destructor: reading it never allocates.
    static MARK: Cell<usize> = const { Cell::new(UNMARKED) };
}

fn mark_thread(counter: usize) {
    MARK.with(|c| c.set(counter));
}

fn count(counter: usize) -> u64 {
    ALLOCATIONS[counter].load(Ordering::Relaxed)
}

fn note_allocation() {
    let m = MARK.with(Cell::get);
    if m != UNMARKED {
        ALLOCATIONS[m].fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards to the system allocator with the caller's arguments unchanged;
// the counter is a side effect that touches no allocator state.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        // SAFETY: forwarded with the caller's layout, which satisfies alloc's contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by System with this layout (every alloc goes there).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_allocation();
        // SAFETY: forwarded unchanged; `ptr` came from System with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[test]
fn the_counter_sees_allocations() {
    mark_thread(SANITY);
    let v: Vec<u64> = std::hint::black_box(vec![1, 2, 3]);
    mark_thread(UNMARKED);
    assert_eq!(v.len(), 3);
    assert!(count(SANITY) >= 1);
}

#[test]
fn engine_process_does_not_allocate() {
    let mut engine = Engine::new(&SynthParams::default());
    let mut out: AudioBlock = [[0.0; 8]; 32];
    let mut controls = [PadSample::default(); PADS];
    mark_thread(ENGINE);
    let before = count(ENGINE);
    // 2.2 s of packages: voices activate, migrate, glide, change tables and release.
    for k in 0..3_000u32 {
        for (p, c) in controls.iter_mut().enumerate() {
            // Every third pad-and-time slot is released.
            let on = (k / 300 + p as u32) % 3 != 1;
            *c = PadSample {
                x: ((k + p as u32) % 100) as f32 / 100.0,
                y: ((k / 200 + p as u32) % 4) as f32 / 4.0,
                pressure: if on { 0.7 } else { 0.0 },
            };
        }
        engine.process(&controls, &mut out);
    }
    let after = count(ENGINE);
    mark_thread(UNMARKED);
    assert_eq!(after - before, 0, "Engine::process allocated");
}

#[test]
fn host_loop_with_a_worker_does_not_allocate() {
    let cfg = HostConfig {
        bind: "127.0.0.1:0".parse().unwrap(),
        // Blocking waits leave the two cores to the spinning worker and the device.
        wait: Wait::Block,
        workers: 1,
        worker_setup: Some(Arc::new(|_| mark_thread(HOST))),
        max_packages: Some(1_500),
        duration: Some(Duration::from_secs(4)),
        warmup: Duration::from_millis(100),
        record_seconds: 1.0,
        ..HostConfig::default()
    };
    let mut host = Host::new(cfg).unwrap();
    let target = host.local_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let device_stop = Arc::clone(&stop);
    let device = std::thread::spawn(move || {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("gestures");
        let gesture = Gesture::load(&dir.join("default.toml")).unwrap();
        let mut cfg = EmulatorConfig::new(target, gesture);
        cfg.duration = Duration::from_millis(1_300);
        cfg.warmup = Duration::from_millis(100);
        cfg.pace = Pace::Spin;
        emulator::run(&cfg, &device_stop).unwrap()
    });
    mark_thread(HOST);
    let before = count(HOST);
    host.run(&AtomicBool::new(false)).unwrap();
    let after = count(HOST);
    mark_thread(UNMARKED);
    stop.store(true, Ordering::Relaxed);
    let run = device.join().unwrap();
    assert!(host.counters().answered > 0, "{:?}", host.counters());
    assert!(run.report.answered > 0);
    assert_eq!(
        after - before,
        0,
        "the communication or worker thread allocated on the audio path"
    );
}
