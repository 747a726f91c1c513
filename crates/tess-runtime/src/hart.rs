//! One hart: the loop each hart thread runs (Pulse's per-hart dispatcher), and the [`Hart`]
//! context handed to schedulers and tasks.
//!
//! ```text
//!   start: wait until tessd has placed the thread (a deadline thread on its own hart)
//!   loop:
//!     time-triggered and the window is over -> gang wait (crate::window), then tick(current)
//!     checkpoint: stop? retire (vhart >= target)? control message? adaptation to complete?
//!     window's work done but an adaptation in flight -> idle on the doorbell until the window end
//!     nothing current -> enter(), or idle on the doorbell until work, a ring or the window end
//!     run one slice of the current task -> yield(task) / done() / next window
//! ```

use crate::runtime::{Shared, Timing};
use crate::window::{self, Release, WindowInfo, WindowSpec};
use crate::{Step, Task};
use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tess_sched::{attr, clock, Policy};

thread_local! {
    static VHART: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The virtual hart id of the calling thread, if it is a hart thread of a running runtime.
///
/// Stable for the life of the thread: tessd may move the thread to another physical hart (see
/// [`Hart::cpu`]), the id stays. After a shrink and a grow, a new thread may take the id of a
/// retired one (ids are always `0..n`).
pub fn vhart_id() -> Option<usize> {
    VHART.with(Cell::get)
}

/// The hart a callback or task runs on.
#[derive(Debug)]
pub struct Hart<'a> {
    shared: &'a Arc<Shared>,
    vhart: usize,
    window: Option<WindowInfo>,
}

impl Hart<'_> {
    /// The virtual hart id (`0..harts()`), stable while the thread lives.
    pub fn vhart_id(&self) -> usize {
        self.vhart
    }

    /// The physical hart this thread runs on right now (`sched_getcpu`).
    pub fn cpu(&self) -> usize {
        tess_sched::current_hart()
    }

    /// Virtual harts the cell has now.
    pub fn harts(&self) -> usize {
        self.shared.roster.target()
    }

    /// The current window (time-triggered cells).
    pub fn window(&self) -> Option<&WindowInfo> {
        self.window.as_ref()
    }

    /// Time left in the current window (`None`: no windows, the budget is the kernel's).
    pub fn time_left(&self) -> Option<Duration> {
        self.window
            .map(|w| Duration::from_nanos(w.end_ns.saturating_sub(clock::now_ns())))
    }

    /// Whether the current slice should end now: the window is over, the runtime is stopping,
    /// or this hart is retiring.
    pub fn should_yield(&self) -> bool {
        self.window.is_some_and(|w| clock::now_ns() >= w.end_ns)
            || self.shared.stopping()
            || self.shared.roster.must_retire(self.vhart)
    }

    /// A handle to the runtime.
    pub fn handle(&self) -> crate::Handle {
        crate::Handle(self.shared.clone())
    }
}

pub(crate) fn trace() -> bool {
    static TRACE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *TRACE.get_or_init(|| std::env::var_os("TESS_RUNTIME_TRACE").is_some())
}

/// One trace line on stderr, stamped with the monotonic clock (seconds) so that it lines up
/// with tessd's log and the benchmark's timestamps.
pub(crate) fn trace_line(msg: std::fmt::Arguments<'_>) {
    let now = clock::now_ns();
    eprintln!(
        "[{}.{:06}] tess-runtime: {msg}",
        now / 1_000_000_000,
        now % 1_000_000_000 / 1000
    );
}

/// Per-hart state of the window machinery.
struct Windows {
    window: Option<WindowInfo>,
    /// Windows observed in the current evaluation span, and the earliest release among them.
    seen: u32,
    min_late_ns: u64,
    /// Windows per evaluation span (doubles when a re-anchor did not help).
    span: u32,
    /// Re-anchor at the end of the current window.
    reanchor: bool,
}

/// Windows over which the earliest release is judged, at first and at most.
const MIN_SPAN: u32 = 8;
const MAX_SPAN: u32 = 1024;

/// Publishes a vhart's entry into window `index` (crate `tess-stats`): how late it entered
/// (`gang-window`), and how long after the gang's first vhart (`gang-skew`, from the second
/// vhart of a window on). Two vharts that both see themselves first record no skew, which can
/// only happen when they entered together.
fn publish_entry(shared: &Shared, index: u64, late_ns: u64, late: bool, entered: u64) {
    let pages = shared.windows_published.get_or_init(|| {
        (
            tess_stats::Publisher::try_create("gang-window", None),
            tess_stats::Publisher::try_create("gang-skew", None),
        )
    });
    if let Some(p) = &pages.0 {
        p.record_judged(late_ns, late);
    }
    let first = &shared.window_first;
    if first.index.load(Ordering::Acquire) == index {
        if let Some(p) = &pages.1 {
            p.record(entered.saturating_sub(first.entered_ns.load(Ordering::Relaxed)));
        }
    } else {
        first.entered_ns.store(entered, Ordering::Relaxed);
        first.index.store(index, Ordering::Release);
    }
}

/// This thread's `SCHED_DEADLINE` budget, if it is a deadline thread.
fn deadline_budget() -> Option<u64> {
    match attr::get_policy(0) {
        Ok((Policy::Deadline { runtime, .. }, _)) => Some(clock::ns(runtime)),
        _ => None,
    }
}

/// Waits until tessd has placed this thread under its cell's reservation
/// ([`tess_proto::runtime::wait_placed`]).
fn wait_placed(shared: &Shared) {
    if !tess_proto::runtime::wait_placed(shared.placement_timeout, || shared.stopping())
        && !shared.stopping()
    {
        eprintln!(
            "tess-runtime: virtual hart {} was not placed under its cell's reservation by tessd within {:?}; running without it",
            vhart_id().unwrap_or(0),
            shared.placement_timeout
        );
    }
}

impl Windows {
    fn new() -> Windows {
        Windows {
            window: None,
            seen: 0,
            min_late_ns: u64::MAX,
            span: MIN_SPAN,
            reanchor: false,
        }
    }

    /// Decides whether the kernel period is off the grid: timer noise makes single releases
    /// late, but if even the earliest release of a whole span missed the lead-in, the phase is
    /// wrong. A re-anchor that did not help (the wake-up it relies on was late too) doubles the
    /// span, so a noisy machine does not re-anchor over and over.
    fn judge_phase(&mut self, late_ns: u64, lead_ns: u64, deadline: bool) {
        self.min_late_ns = self.min_late_ns.min(late_ns);
        self.seen += 1;
        if self.seen < self.span {
            return;
        }
        if self.min_late_ns > lead_ns && deadline {
            self.reanchor = true;
            self.span = (self.span * 2).min(MAX_SPAN);
        } else if self.min_late_ns <= lead_ns {
            self.span = MIN_SPAN;
        }
        self.seen = 0;
        self.min_late_ns = u64::MAX;
    }

    /// Gives the hart back at the end of the current window and waits for the next one; the
    /// gang wait of the module docs of [`crate::window`].
    fn next(&mut self, shared: &Shared, spec: &WindowSpec) -> WindowInfo {
        let tuning = shared.tuning;
        let mut budget = deadline_budget();
        let mut released = clock::now_ns();
        if let Some(prev) = self.window {
            if budget.is_some() {
                if self.reanchor {
                    self.reanchor = false;
                    shared.counters.reanchors.fetch_add(1, Ordering::Relaxed);
                    let to = window::reanchor_target(spec, prev.released_ns);
                    clock::sleep_until_ns(to);
                    if trace() {
                        crate::hart::trace_line(format_args!(
                            "vhart {:?} re-anchored: woke {} ns after {to}",
                            vhart_id(),
                            clock::now_ns() - to
                        ));
                    }
                } else {
                    // Done for this period: the kernel throttles us until the next one.
                    tess_sched::attr::yield_now();
                }
            } else {
                let (_, g) = spec.grid_at_or_after(released.max(prev.grid_ns + 1));
                clock::sleep_until_ns(g.saturating_sub(clock::ns(tuning.wake_margin)));
            }
            released = clock::now_ns();
            budget = deadline_budget().or(budget);
        }
        loop {
            let (index, grid) = match window::classify(spec, released) {
                Release::InGap { index, grid } => {
                    if budget.is_some() {
                        // A deadline thread released between windows is off the grid.
                        shared.counters.reanchors.fetch_add(1, Ordering::Relaxed);
                        clock::sleep_until_ns(window::reanchor_target(spec, released));
                        released = clock::now_ns();
                        continue;
                    }
                    (index, grid)
                }
                Release::InWindow {
                    index,
                    grid,
                    late_ns,
                } => {
                    let used = self.window.is_some_and(|w| w.index >= index);
                    if used {
                        // Woke again in a window we already ran (not throttled): sleep on.
                        let (_, g) = spec.grid_at_or_after(grid + 1);
                        clock::sleep_until_ns(g.saturating_sub(clock::ns(tuning.wake_margin)));
                        released = clock::now_ns();
                        continue;
                    }
                    if trace() && late_ns > clock::ns(tuning.lead_in) {
                        crate::hart::trace_line(format_args!(
                            "vhart {:?} late {late_ns} ns in window {index}",
                            vhart_id()
                        ));
                    }
                    self.judge_phase(late_ns, clock::ns(tuning.lead_in), budget.is_some());
                    (index, grid)
                }
            };
            let mut w = window::app_window(spec, &tuning, index, grid, released, budget);
            let entered = if clock::now_ns() < w.start_ns {
                clock::spin_until_ns(w.start_ns)
            } else {
                clock::now_ns()
            };
            w.entered_ns = entered;
            let late = w.start_ns <= released;
            if !late {
                w.spin_ns = entered - released;
            } else {
                w.spin_ns = 0;
                shared.counters.late_windows.fetch_add(1, Ordering::Relaxed);
            }
            publish_entry(
                shared,
                index,
                entered.saturating_sub(w.start_ns),
                late,
                entered,
            );
            if entered >= w.end_ns {
                // No room left in this window: give it back and take the next.
                self.window = Some(w);
                if budget.is_some() {
                    tess_sched::attr::yield_now();
                } else {
                    let (_, g) = spec.grid_at_or_after(grid + 1);
                    clock::sleep_until_ns(g.saturating_sub(clock::ns(tuning.wake_margin)));
                }
                released = clock::now_ns();
                continue;
            }
            shared.counters.windows.fetch_add(1, Ordering::Relaxed);
            shared
                .counters
                .spin_ns
                .fetch_add(w.spin_ns, Ordering::Relaxed);
            self.window = Some(w);
            return w;
        }
    }
}

/// Between two budgets of an event-triggered cell (or two rounds of an untimed one).
fn next_budget(shared: &Shared, timing: &Timing) {
    if deadline_budget().is_some() {
        // For a constant-bandwidth server, yielding gives up the rest of this budget.
        tess_sched::attr::yield_now();
    } else {
        let period = match timing {
            Timing::Budget { period } => *period,
            _ => Duration::from_millis(1),
        };
        let until = clock::now_ns() + clock::ns(period);
        while !shared.stopping() && clock::now_ns() < until {
            let seen = shared.doorbell.count();
            if shared.stopping() {
                break;
            }
            shared.doorbell.wait(seen, until);
        }
    }
}

/// The hart loop (module docs).
pub(crate) fn run(shared: &Arc<Shared>, vhart: usize, fresh: bool) {
    VHART.with(|v| v.set(Some(vhart)));
    if shared.reserved {
        wait_placed(shared);
    }
    if fresh {
        if trace() {
            crate::hart::trace_line(format_args!(
                "vhart {vhart} started on hart {} (deadline budget {:?})",
                tess_sched::current_hart(),
                deadline_budget()
            ));
        }
        shared.roster.arrive();
        shared.doorbell.ring();
    }
    let mut wins = Windows::new();
    let mut window_over = true;
    let mut entered = false;
    let mut idle = false;
    let mut current: Option<Task> = None;
    let mut last_poll = 0u64;
    let mut contended = false;
    loop {
        let timing = shared.timing();
        let spec = match timing {
            Timing::TimeTriggered(s) => Some(s),
            _ => None,
        };
        let mut hart = Hart {
            shared,
            vhart,
            window: wins.window,
        };
        // A hart that has done its window's work stays at the checkpoint for the rest of the
        // window while an adaptation is in flight, or may be (another hart held the control
        // channel when this one polled), idling on the doorbell: the adaptation then completes
        // in the window it began in instead of a period or two later.
        let mut linger = false;
        if let Some(spec) = &spec {
            let in_window = wins.window.is_some_and(|w| clock::now_ns() < w.end_ns);
            linger = window_over && in_window && entered && (shared.roster.pending() || contended);
            if !linger && (window_over || !in_window) {
                let w = wins.next(shared, spec);
                hart.window = Some(w);
                window_over = false;
                idle = false;
                last_poll = 0;
                contended = false;
                if entered {
                    if let Some(t) = current.take() {
                        current = shared.sched.tick(&hart, t);
                    }
                }
            }
        }
        // Checkpoint.
        if shared.stopping() {
            break;
        }
        if vhart != 0 && shared.roster.must_retire(vhart) {
            if trace() {
                trace_line(format_args!("vhart {vhart} retires"));
            }
            if let Some(t) = current.take() {
                shared.orphan(t);
            }
            shared
                .retired_tids
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(tess_sched::gettid());
            shared.roster.arrive();
            shared.doorbell.ring();
            VHART.with(|v| v.set(None));
            return;
        }
        let now = clock::now_ns();
        if now.saturating_sub(last_poll) >= shared.poll_interval_ns {
            last_poll = now;
            // Another hart was polling and may be starting an adaptation that this one must
            // take part in: stay for the rest of the window rather than risk sleeping past it.
            contended |= !shared.poll_control();
        } else if shared.roster.pending() {
            shared.try_complete();
        }
        if linger {
            idle_wait(shared, &hart);
            continue;
        }
        if !entered {
            if fresh && shared.roster.pending() {
                // A new hart runs nothing until `adapt` has returned.
                idle_wait(shared, &hart);
                continue;
            }
            entered = true;
        }
        if current.is_none() {
            if idle {
                idle = false;
                idle_wait(shared, &hart);
                continue;
            }
            current = shared.sched.enter(&hart);
            if current.is_none() {
                idle = true;
                continue;
            }
        }
        let Some(mut task) = current.take() else {
            continue;
        };
        match task.run(&hart) {
            Step::Yield => current = shared.sched.r#yield(&hart, task),
            Step::Done => current = shared.sched.done(&hart),
            Step::NextWindow => {
                current = Some(task);
                if spec.is_some() {
                    window_over = true;
                } else {
                    next_budget(shared, &timing);
                    if let Some(t) = current.take() {
                        current = shared.sched.tick(&hart, t);
                    }
                }
            }
        }
    }
    drop(current);
    VHART.with(|v| v.set(None));
}

/// Sleeps until the doorbell rings, the window ends, or the next control poll is due.
fn idle_wait(shared: &Shared, hart: &Hart<'_>) {
    let seen = shared.doorbell.count();
    if shared.stopping() {
        return;
    }
    let now = clock::now_ns();
    let mut until = now + shared.poll_interval_ns;
    if let Some(w) = hart.window {
        until = until.min(w.end_ns);
    }
    if until > now {
        shared.doorbell.wait(seen, until);
    }
}
