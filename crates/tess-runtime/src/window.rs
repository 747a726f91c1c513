//! Gang-scheduled windows: every hart of a time-triggered cell starts its window at the same
//! instant of the common `CLOCK_MONOTONIC` grid and gives the hart back at the same instant.
//!
//! # The kernel window and the application window
//!
//! tessd makes each hart thread `SCHED_DEADLINE (A, A, P)`: the kernel releases it at the start
//! of its reservation period (the replenishment timer) and it may run for `A`. Window `k` of the
//! cell is `[T_k, T_k + A)` with `T_k = k * P + O` (seed 004 section 3.1). The kernel releases
//! each hart late by its timer latency (10-40 us on this virtual machine, with millisecond
//! outliers) and, independently on each hart, by the phase error of its reservation (when tessd
//! promoted the thread). Seed 004's muxers align harts to 0.8 us on average (Table 1) because
//! they share a global time base and activate cells from the same timer interrupt.
//!
//! The runtime cannot run a deadline thread before the kernel releases it, so it starts the
//! *application window* a little later: at `T_k + L` (the lead-in), every hart spins on the
//! shared clock (the TSC through the vDSO) from its release to exactly `T_k + L`, and all start
//! within the clock's resolution of each other. The application window ends at
//! `min(T_k + A, release + budget) - G` (the guard), where each hart stops at a task boundary
//! and calls `sched_yield`, which for `SCHED_DEADLINE` means "done for this period": the kernel
//! throttles the thread until its next period, keeping the phase exactly (no timer of ours, so
//! no wake-up that could come late and shift the period).
//!
//! ```text
//!   T_k          release   T_k+L                           T_k+A-G   T_k+A      T_k+P
//!   |--- timer ----|-spin--|======== application ============|  guard |  other cells ...|
//! ```
//!
//! Worked example (the bench cell): P = 1 ms, A = 400 us, L = 100 us, G = 20 us; a hart released
//! 30 us late spins 70 us, runs application code for 280 us, and gives back the hart 380 us
//! after the grid point; the kernel's budget (400 us, from the release) is never exhausted, so
//! tick-granular budget enforcement never has to step in.
//!
//! # Keeping the phase
//!
//! A hart whose kernel period is off the grid (tessd promoted it late, or it was moved) is
//! released late every window. When two consecutive releases miss the lead-in (or one falls
//! outside any window), the hart *re-anchors*: it sleeps to the first grid point at least one
//! period after its release, so it wakes after its kernel period has ended; the kernel then
//! starts a new period at the wake-up (the constrained-deadline wake-up rule), on the grid up to
//! the wake-up latency. It loses one or two windows once.
//!
//! A hart that is not (yet) a deadline thread (standalone mode, or before tessd promotes it)
//! sleeps to just before the window (`clock_nanosleep`-equivalent futex wait with an absolute
//! deadline) and spins the last stretch.

use std::time::Duration;
use tess_sched::clock;

/// The timing of a time-triggered cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowSpec {
    /// P.
    pub period: Duration,
    /// A: the window length on each hart (the kernel budget per period).
    pub active: Duration,
    /// O: window start within the period.
    pub offset: Duration,
}

/// How the runtime positions its application window inside the kernel's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuning {
    /// L: application windows start this long after the grid point.
    pub lead_in: Duration,
    /// G: application windows end this long before the kernel window (or budget) does.
    pub guard: Duration,
    /// A thread that is not a deadline thread wakes this long before the window and spins.
    pub wake_margin: Duration,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            lead_in: Duration::from_micros(100),
            guard: Duration::from_micros(20),
            wake_margin: Duration::from_micros(200),
        }
    }
}

/// One window of one hart, as the application sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(C)]
pub struct WindowInfo {
    /// k: the window's index on the grid.
    pub index: u64,
    /// T_k: the grid point (the kernel window's start), ns of `CLOCK_MONOTONIC`.
    pub grid_ns: u64,
    /// T_k + L: the scheduled start of the application window.
    pub start_ns: u64,
    /// When this hart actually started it.
    pub entered_ns: u64,
    /// When the kernel released this hart (or it woke up).
    pub released_ns: u64,
    /// The application window ends here: give the hart back (return from the work) by then.
    pub end_ns: u64,
    /// Time spent spinning to the start, ns.
    pub spin_ns: u64,
}

impl WindowSpec {
    fn ns(&self) -> (u64, u64, u64) {
        (
            clock::ns(self.period),
            clock::ns(self.active),
            clock::ns(self.offset) % clock::ns(self.period).max(1),
        )
    }

    /// The grid point `T_k` at or before `t` and `k`.
    pub fn grid_at_or_before(&self, t: u64) -> (u64, u64) {
        let (p, _, o) = self.ns();
        if t < o {
            return (0, o);
        }
        let k = (t - o) / p;
        (k, k * p + o)
    }

    /// The first grid point at or after `t` and its index.
    pub fn grid_at_or_after(&self, t: u64) -> (u64, u64) {
        let (p, _, o) = self.ns();
        let g = clock::next_grid_point(t, p, o);
        ((g - o) / p, g)
    }
}

/// Where a release fell relative to the grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Release {
    /// Inside window `index` (grid point `grid`), `late_ns` after the grid point.
    InWindow { index: u64, grid: u64, late_ns: u64 },
    /// Between two windows: before window `index` at `grid`.
    InGap { index: u64, grid: u64 },
}

/// Classifies a release time.
pub(crate) fn classify(spec: &WindowSpec, released: u64) -> Release {
    let (_, a, _) = spec.ns();
    let (k, t) = spec.grid_at_or_before(released);
    if released >= t && released - t < a {
        Release::InWindow {
            index: k,
            grid: t,
            late_ns: released - t,
        }
    } else {
        let (k, g) = spec.grid_at_or_after(released);
        Release::InGap { index: k, grid: g }
    }
}

/// The application window for a release in window `(index, grid)`.
pub(crate) fn app_window(
    spec: &WindowSpec,
    tuning: &Tuning,
    index: u64,
    grid: u64,
    released: u64,
    budget_ns: Option<u64>,
) -> WindowInfo {
    let (_, a, _) = spec.ns();
    let kernel_end = match budget_ns {
        Some(b) => (grid + a).min(released.max(grid) + b),
        None => grid + a,
    };
    WindowInfo {
        index,
        grid_ns: grid,
        start_ns: grid + clock::ns(tuning.lead_in),
        entered_ns: 0,
        released_ns: released,
        end_ns: kernel_end.saturating_sub(clock::ns(tuning.guard)),
        spin_ns: 0,
    }
}

/// The grid point a re-anchoring hart sleeps to: the first at least one period after its
/// release, so that its kernel period has ended when it wakes (module docs).
pub(crate) fn reanchor_target(spec: &WindowSpec, released: u64) -> u64 {
    let (p, _, _) = spec.ns();
    spec.grid_at_or_after(released + p).1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> WindowSpec {
        WindowSpec {
            period: Duration::from_millis(1),
            active: Duration::from_micros(400),
            offset: Duration::from_micros(250),
        }
    }

    #[test]
    fn releases_are_classified_against_the_grid() {
        let s = spec();
        // Window 7 starts at 7.25 ms.
        assert_eq!(
            classify(&s, 7_250_000 + 30_000),
            Release::InWindow {
                index: 7,
                grid: 7_250_000,
                late_ns: 30_000
            }
        );
        assert_eq!(
            classify(&s, 7_250_000 + 500_000),
            Release::InGap {
                index: 8,
                grid: 8_250_000
            }
        );
        assert_eq!(
            classify(&s, 100),
            Release::InGap {
                index: 0,
                grid: 250_000
            }
        );
    }

    #[test]
    fn application_window_respects_lead_in_guard_and_budget() {
        let s = spec();
        let t = Tuning::default();
        let w = app_window(&s, &t, 7, 7_250_000, 7_280_000, None);
        assert_eq!(w.start_ns, 7_350_000);
        assert_eq!(w.end_ns, 7_250_000 + 400_000 - 20_000);
        // Half the budget (two threads share the hart): the window ends when it runs out.
        let w = app_window(&s, &t, 7, 7_250_000, 7_280_000, Some(200_000));
        assert_eq!(w.end_ns, 7_280_000 + 200_000 - 20_000);
    }

    #[test]
    fn reanchoring_skips_past_the_kernel_period() {
        let s = spec();
        // Released 300 us into window 7: its kernel period ends before 8.55 ms; wake at 9.25.
        assert_eq!(reanchor_target(&s, 7_550_000), 9_250_000);
        // Released right at a grid point: one period later is the next grid point.
        assert_eq!(reanchor_target(&s, 7_250_000), 8_250_000);
    }
}
