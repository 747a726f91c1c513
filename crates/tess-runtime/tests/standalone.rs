//! The runtime without tessd (`Builder::standalone`): harts, windows, schedulers and the
//! adaptation handshake, driven by `Handle::resize` exactly as by tessd's `Adapt`. No timing
//! is asserted; these tests check who ran what, and how often.
#![cfg(not(loom))]

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tess_runtime::{vhart_id, PerWindow, QueuePolicy, Runtime, Step, Task, WindowSpec, WorkQueue};

fn spec() -> WindowSpec {
    WindowSpec {
        period: Duration::from_millis(2),
        active: Duration::from_micros(800),
        offset: Duration::ZERO,
    }
}

#[test]
fn per_window_runs_every_hart_and_adapts_on_resize() {
    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    let windows = Arc::new(AtomicUsize::new(0));
    let adapts = Arc::new(Mutex::new(Vec::new()));
    let stage = Arc::new(AtomicUsize::new(0));
    let (s, w, a, st) = (seen.clone(), windows.clone(), adapts.clone(), stage.clone());
    let work = PerWindow::new(move |h| {
        assert_eq!(vhart_id(), Some(h.vhart_id()));
        let win = h.window().expect("windows in a time-triggered runtime");
        assert!(win.entered_ns >= win.released_ns);
        assert!(win.end_ns > win.start_ns);
        s.lock().unwrap().insert(h.vhart_id());
        let n = w.fetch_add(1, Ordering::SeqCst) + 1;
        let handle = h.handle();
        if h.vhart_id() == 0 {
            // Drive the script from vhart 0: shrink, grow, stop, each after some windows.
            let stage = st.load(Ordering::SeqCst);
            let adapted = handle.stats().adaptations as usize;
            if n > 40 * (stage + 1) && adapted == stage {
                st.fetch_add(1, Ordering::SeqCst);
                match stage {
                    0 => assert!(handle.resize(1)),
                    1 => assert!(handle.resize(2)),
                    _ => handle.stop(),
                }
            }
        }
    })
    .on_adapt(move |old, new| a.lock().unwrap().push((old, new)));
    let rt = Runtime::builder()
        .standalone(2, Some(spec()))
        .build(work)
        .unwrap();
    let handle = rt.handle();
    let stats = rt.run().unwrap();
    assert_eq!(*seen.lock().unwrap(), BTreeSet::from([0, 1]));
    assert_eq!(*adapts.lock().unwrap(), vec![(2, 1), (1, 2)]);
    assert_eq!(handle.acknowledged(), vec![(1, 1), (2, 2)]);
    assert_eq!(stats.adaptations, 2);
    assert!(stats.windows >= 120);
    assert_eq!(vhart_id(), None, "the caller is vhart 0 only while it runs");
}

#[test]
fn work_queue_loses_no_task_across_resizes() {
    const TASKS: usize = 400;
    let runs = Arc::new((0..TASKS).map(|_| AtomicUsize::new(0)).collect::<Vec<_>>());
    let slices = Arc::new(AtomicUsize::new(0));
    let queue = WorkQueue::new(QueuePolicy::RoundRobin);
    for i in 0..TASKS {
        let (r, sl) = (runs.clone(), slices.clone());
        let mut left = 3;
        queue.push(
            Task::new(move |_h| {
                sl.fetch_add(1, Ordering::SeqCst);
                std::hint::black_box((0..2000).sum::<u64>());
                left -= 1;
                if left == 0 {
                    r[i].fetch_add(1, Ordering::SeqCst);
                    Step::Done
                } else {
                    Step::Yield
                }
            })
            .with_id(i as u64),
        );
    }
    let adapts = Arc::new(Mutex::new(Vec::new()));
    let a = adapts.clone();
    let queue = queue
        .on_adapt(move |old, new| a.lock().unwrap().push((old, new)))
        .stop_when_drained();
    let rt = Runtime::builder().standalone(3, None).build(queue).unwrap();
    let handle = rt.handle();
    let driver = std::thread::spawn(move || {
        for n in [1, 3, 2, 3] {
            std::thread::sleep(Duration::from_millis(3));
            handle.resize(n);
        }
    });
    rt.run().unwrap();
    driver.join().unwrap();
    for (i, r) in runs.iter().enumerate() {
        assert_eq!(r.load(Ordering::SeqCst), 1, "task {i} completed once");
    }
    assert_eq!(slices.load(Ordering::SeqCst), 3 * TASKS);
    for (old, new) in adapts.lock().unwrap().iter() {
        assert_ne!(old, new);
    }
}

#[test]
fn edf_runs_the_earliest_deadline_first() {
    let order = Arc::new(Mutex::new(Vec::new()));
    let queue = WorkQueue::new(QueuePolicy::Edf);
    for (id, deadline) in [(0u64, 500u64), (1, 100), (2, 300), (3, 100), (4, 200)] {
        let o = order.clone();
        queue.push(
            Task::once(move |_| o.lock().unwrap().push(id))
                .with_deadline_ns(deadline)
                .with_id(id),
        );
    }
    let rt = Runtime::builder()
        .standalone(1, None)
        .build(queue.stop_when_drained())
        .unwrap();
    rt.run().unwrap();
    assert_eq!(*order.lock().unwrap(), vec![1, 3, 4, 2, 0]);
}
