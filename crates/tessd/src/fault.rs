//! Fault injection for the crash tests, compiled only with the `fault-injection` feature (test
//! builds: the crate's own dev-dependency turns it on). Production builds get empty inline
//! functions and read no environment variable.
//!
//! A transaction passes these points, in order (see [`crate::engine`]):
//!
//! | point | where | the kernel | the journal |
//! |---|---|---|---|
//! | `after-plan` | placed, admitted, laid out | old layout | old state |
//! | `mid-apply` | between two steps of a convergence | half changed | old state |
//! | `before-commit` | the kernel holds the new layout | new layout | old state |
//! | `after-commit` | the journal holds it too | new layout | new state |
//!
//! `TESSD_FAULT=POINT[:N]` stops the daemon the N-th time (default 1) it reaches `POINT` after
//! start-up: it logs `fault point POINT reached` and sleeps, so that the test can `kill -9` it
//! there. `TESSD_FAULT_PAUSE_US=US` sleeps that long at every `mid-apply` point instead, so that
//! kills at random instants land with the kernel half changed.

/// A point in a transaction where a crash test may stop the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    /// Placement, admission and the layout are done; nothing is changed yet.
    AfterPlan,
    /// Between two steps of a convergence: the kernel is half changed.
    MidApply,
    /// The kernel holds the new layout; the journal does not yet.
    BeforeCommit,
    /// The journal has committed; the reply is not sent yet.
    AfterCommit,
}

impl Point {
    /// The point's name in `TESSD_FAULT`.
    pub fn name(self) -> &'static str {
        match self {
            Point::AfterPlan => "after-plan",
            Point::MidApply => "mid-apply",
            Point::BeforeCommit => "before-commit",
            Point::AfterCommit => "after-commit",
        }
    }

    /// Every point, in transaction order.
    pub const ALL: [Point; 4] = [
        Point::AfterPlan,
        Point::MidApply,
        Point::BeforeCommit,
        Point::AfterCommit,
    ];
}

#[cfg(feature = "fault-injection")]
mod imp {
    use super::Point;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::OnceLock;
    use std::time::Duration;

    static ARMED: AtomicBool = AtomicBool::new(false);
    static HITS: AtomicU64 = AtomicU64::new(0);

    struct Plan {
        stop_at: Option<(String, u64)>,
        pause: Option<Duration>,
    }

    fn plan() -> &'static Plan {
        static PLAN: OnceLock<Plan> = OnceLock::new();
        PLAN.get_or_init(|| {
            let stop_at = std::env::var("TESSD_FAULT").ok().map(|v| {
                let (name, n) = v.split_once(':').unwrap_or((&v, "1"));
                (name.to_string(), n.parse().unwrap_or(1))
            });
            let pause = std::env::var("TESSD_FAULT_PAUSE_US")
                .ok()
                .and_then(|v| v.parse().ok())
                .map(Duration::from_micros);
            Plan { stop_at, pause }
        })
    }

    pub fn arm() {
        let p = plan();
        if let Some((name, n)) = &p.stop_at {
            tracing::warn!("fault injection armed: stopping at {name} #{n}");
        }
        ARMED.store(true, Ordering::SeqCst);
    }

    pub fn reached(point: Point) {
        if !ARMED.load(Ordering::SeqCst) {
            return;
        }
        let p = plan();
        if let (Point::MidApply, Some(d)) = (point, p.pause) {
            std::thread::sleep(d);
        }
        let Some((name, n)) = &p.stop_at else {
            return;
        };
        if name != point.name() {
            return;
        }
        if HITS.fetch_add(1, Ordering::SeqCst) + 1 == *n {
            // Written straight to stderr (the test reads the log for it), then wait for the kill.
            eprintln!("tessd: fault point {name} reached");
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
    }
}

/// Starts honouring `TESSD_FAULT` (after start-up, so that restoring the committed state on
/// start is never interrupted by the hook meant for a transaction).
#[inline(always)]
pub fn arm() {
    #[cfg(feature = "fault-injection")]
    imp::arm();
}

/// A transaction reached `point`: with the feature, maybe stop here (module docs).
#[inline(always)]
pub fn reached(point: Point) {
    #[cfg(feature = "fault-injection")]
    imp::reached(point);
    #[cfg(not(feature = "fault-injection"))]
    let _ = point;
}

/// Whether this build has the hook (the crash test refuses to run without it).
pub const ENABLED: bool = cfg!(feature = "fault-injection");
