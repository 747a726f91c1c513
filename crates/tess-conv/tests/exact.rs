//! Every mode computes the same convolution as the textbook sum, sample for sample (to float
//! rounding), for several plans, including responses that end mid-partition.

use tess_conv::{ConvError, Convolver, LevelTask, Mode, Plan, Pool, PoolOptions, WhenLate};

/// A deterministic pseudo-random signal in [-1, 1).
fn noise(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 23) as f32) - 1.0
        })
        .collect()
}

fn direct(x: &[f32], h: &[f32]) -> Vec<f64> {
    (0..x.len())
        .map(|n| {
            let lo = n.saturating_sub(h.len() - 1);
            (lo..=n)
                .map(|m| f64::from(x[m]) * f64::from(h[n - m]))
                .sum()
        })
        .collect()
}

fn run(c: &mut Convolver, x: &[f32]) -> Vec<f32> {
    let b = c.plan().block;
    let mut y = vec![0.0; x.len()];
    for (xi, yi) in x.chunks_exact(b).zip(y.chunks_exact_mut(b)) {
        c.process(xi, yi);
    }
    y
}

/// Runs `c` over `x` block by block with its level tasks, as a host's scheduler would:
/// `before(t, tasks)` runs after callback `t - 1`'s `process` and before callback `t`'s.
fn run_with_tasks(
    c: &mut Convolver,
    x: &[f32],
    mut before: impl FnMut(usize, &mut [LevelTask]),
) -> Vec<f32> {
    let b = c.plan().block;
    let mut tasks = c.take_level_tasks();
    let mut y = vec![0.0; x.len()];
    for (t, (xi, yi)) in x.chunks_exact(b).zip(y.chunks_exact_mut(b)).enumerate() {
        before(t, &mut tasks);
        c.process(xi, yi);
    }
    y
}

fn assert_close(got: &[f32], want: &[f64], what: &str) {
    let peak = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (f64::from(*g) - w).abs() <= 2e-5 * peak.max(1.0),
            "{what}: sample {i}: got {g}, want {w} (peak {peak})"
        );
    }
}

const PLANS: &[(usize, usize, &[usize])] = &[
    (32, 3001, &[]),
    (32, 3001, &[64, 256]),
    (32, 5000, &[128, 1024]),
    (16, 777, &[32, 64, 128]),
    (64, 9000, &[512]),
];

#[test]
fn synchronous_and_time_distributed_match_the_direct_sum() {
    for &(block, len, sizes) in PLANS {
        let h = noise(len, len as u64);
        let x = noise(block * 600, 7);
        let want = direct(&x, &h);
        let plan = Plan::with_sizes(block, len, sizes).unwrap();
        for mode in [Mode::Synchronous, Mode::TimeDistributed] {
            let mut c = Convolver::new(&h, &plan, mode.clone(), WhenLate::Drop).unwrap();
            assert_close(&run(&mut c, &x), &want, &format!("{mode:?} {plan}"));
            assert_eq!(c.late(), 0);
        }
    }
}

/// The level tasks run on another thread, each block's before that block's `process` (as a
/// graph engine's worker runs them before the convolver's node), and the output is exact;
/// the same output as time-distributed in the callback, bit for bit (the same sub-tasks in the
/// same order per level).
#[test]
fn scheduled_level_tasks_on_another_thread_match_the_direct_sum() {
    for &(block, len, sizes) in PLANS {
        let h = noise(len, len as u64 + 2);
        let x = noise(block * 600, 11);
        let want = direct(&x, &h);
        let plan = Plan::with_sizes(block, len, sizes).unwrap();
        let mut c = Convolver::new(&h, &plan, Mode::Scheduled, WhenLate::Drop).unwrap();
        let y = run_with_tasks(&mut c, &x, |_, tasks| {
            assert_eq!(tasks.len(), sizes.len(), "one task per long level");
            std::thread::scope(|s| {
                s.spawn(|| tasks.iter_mut().for_each(|t| t.run()));
            });
        });
        assert!(c.take_level_tasks().is_empty(), "handed out once");
        assert_close(&y, &want, &format!("scheduled {plan}"));
        assert_eq!(c.late(), 0);
        let mut td = Convolver::new(&h, &plan, Mode::TimeDistributed, WhenLate::Drop).unwrap();
        assert_eq!(
            run(&mut td, &x),
            y,
            "time-distributed in the callback, {plan}"
        );
    }
}

/// Background pieces run by another thread whenever it likes, concurrently with `process`
/// (which waits for a step not done when it is due): exact.
#[test]
fn background_pieces_on_another_thread_match_the_direct_sum() {
    use std::sync::atomic::{AtomicBool, Ordering};
    for &(block, len, sizes) in PLANS {
        let h = noise(len, len as u64 + 3);
        let x = noise(block * 600, 17);
        let want = direct(&x, &h);
        let plan = Plan::with_sizes(block, len, sizes).unwrap();
        let mut c = Convolver::new(&h, &plan, Mode::Background, WhenLate::Wait).unwrap();
        let mut tasks = c.take_level_tasks();
        assert_eq!(tasks.len(), sizes.len());
        let stop = AtomicBool::new(false);
        let y = std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    if !tasks.iter_mut().any(|t| t.run_piece()) {
                        std::thread::yield_now();
                    }
                }
            });
            let y = run(&mut c, &x);
            stop.store(true, Ordering::Relaxed);
            y
        });
        // (told to wait, so never late: exactness is the check)
        assert_close(&y, &want, &format!("background {plan}"));
    }
}

/// Pieces run on the callback's own thread between callbacks, all there are (as an offline
/// render does): never late, exact.
#[test]
fn background_pieces_between_callbacks_are_never_late() {
    let (block, len, sizes) = (32, 5000, &[128usize, 1024][..]);
    let h = noise(len, 21);
    let x = noise(block * 600, 23);
    let want = direct(&x, &h);
    let plan = Plan::with_sizes(block, len, sizes).unwrap();
    let mut c = Convolver::new(&h, &plan, Mode::Background, WhenLate::Drop).unwrap();
    let mut pieces = 0;
    let y = run_with_tasks(&mut c, &x, |_, tasks| {
        for t in tasks.iter_mut() {
            while t.run_piece() {
                pieces += 1;
            }
        }
    });
    assert_close(&y, &want, "background between callbacks");
    assert_eq!(c.late(), 0);
    assert!(pieces > 0);
}

/// A host that skips a level's task for a while: its steps are counted late, the level is
/// silent while they are, and it comes back exact (the job was handed back, not lost).
#[test]
fn a_skipped_level_task_is_late_and_the_level_recovers() {
    let (block, len, sizes) = (32, 3001, &[64usize, 256][..]);
    let h = noise(len, 5);
    let x = noise(block * 800, 13);
    let want = direct(&x, &h);
    let plan = Plan::with_sizes(block, len, sizes).unwrap();
    let mut c = Convolver::new(&h, &plan, Mode::Scheduled, WhenLate::Drop).unwrap();
    let y = run_with_tasks(&mut c, &x, |t, tasks| {
        if !(100..140).contains(&t) {
            tasks.iter_mut().for_each(|t| t.run());
        }
    });
    assert!(c.late() > 0, "skipped shares make late steps");
    // Well after the gap every level is exact again.
    let tail = 400 * block;
    assert_close(&y[tail..], &want[tail..], "after the gap");
}

/// One share skipped, at every slot of the long level's period in turn: the step that lost
/// it is always counted late, once (never played as if complete), and the output is exact
/// again afterwards. (One long level only: a shorter one would be late on its own at every
/// skip, and hide whether this one was.)
#[test]
fn one_skipped_share_at_any_slot_makes_its_step_late() {
    let (block, len, sizes) = (32, 3001, &[256usize][..]);
    let h = noise(len, 5);
    let x = noise(block * 400, 19);
    let want = direct(&x, &h);
    let plan = Plan::with_sizes(block, len, sizes).unwrap();
    let slots = 256 / block;
    for skip in 96..96 + slots {
        let mut c = Convolver::new(&h, &plan, Mode::Scheduled, WhenLate::Drop).unwrap();
        let y = run_with_tasks(&mut c, &x, |t, tasks| {
            if t != skip {
                tasks.iter_mut().for_each(|t| t.run());
            }
        });
        assert_eq!(c.late(), 1, "skipping callback {skip}");
        let tail = 300 * block;
        assert_close(&y[tail..], &want[tail..], &format!("after skipping {skip}"));
    }
}

#[test]
fn preemptive_matches_the_direct_sum_when_it_waits_for_its_workers() {
    let pool = std::sync::Arc::new(
        Pool::new(PoolOptions {
            hart: None,
            top_priority: None,
            levels: 3,
        })
        .unwrap(),
    );
    for &(block, len, sizes) in PLANS {
        let h = noise(len, len as u64 + 1);
        let x = noise(block * 600, 9);
        let want = direct(&x, &h);
        let plan = Plan::with_sizes(block, len, sizes).unwrap();
        // Two instances share the pool's workers, as instances on one hart do.
        let mut a =
            Convolver::new(&h, &plan, Mode::Preemptive(pool.clone()), WhenLate::Wait).unwrap();
        let mut b =
            Convolver::new(&h, &plan, Mode::Preemptive(pool.clone()), WhenLate::Wait).unwrap();
        let (ya, yb) = (run(&mut a, &x), run(&mut b, &x));
        assert_close(&ya, &want, &format!("preemptive {plan}"));
        assert_eq!(ya, yb);
        assert_eq!(a.late(), 0);
    }
}

#[test]
fn mismatches_are_errors_not_panics() {
    let h = noise(1000, 1);
    let plan = Plan::with_sizes(32, 999, &[]).unwrap();
    assert!(matches!(
        Convolver::new(&h, &plan, Mode::Synchronous, WhenLate::Drop),
        Err(ConvError::Length {
            plan: 999,
            ir: 1000
        })
    ));
    let mut bent = Plan::with_sizes(32, 1000, &[64]).unwrap();
    bent.levels[1].offset += 32;
    assert!(matches!(
        Convolver::new(&h, &bent, Mode::Synchronous, WhenLate::Drop),
        Err(ConvError::Layout(_))
    ));
    let pool = std::sync::Arc::new(
        Pool::new(PoolOptions {
            hart: None,
            top_priority: None,
            levels: 1,
        })
        .unwrap(),
    );
    let plan = Plan::with_sizes(32, 1000, &[64, 128]).unwrap();
    let err =
        Convolver::new(&h, &plan, Mode::Preemptive(pool.clone()), WhenLate::Drop).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the plan has 2 long levels, the worker pool serves 1"
    );
}

#[test]
fn a_pool_that_cannot_get_its_priorities_says_so() {
    let err = Pool::new(PoolOptions {
        hart: None,
        top_priority: Some(2),
        levels: 3,
    })
    .unwrap_err();
    assert!(err.to_string().contains("leaves no room"), "{err}");
}
