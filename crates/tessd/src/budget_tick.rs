//! Budget ticks: `SCHED_DEADLINE` budgets ended on time where the kernel cannot do it alone.
//!
//! The kernel learns that a deadline task has used its budget only when it accounts the task's
//! time: when the task blocks, when something preempts it, or at the scheduler tick. With the
//! scheduler feature `HRTICK_DL` it also arms a timer for the exact end of the budget, but that
//! feature lives in debugfs, which kernel lockdown closes (and most distribution kernels run
//! locked down). Without it a reserved cell that computes continuously overruns its slice by up
//! to a tick (4 ms at `HZ=250`) and repays the debt later: measured in the music bench, a video
//! cell with a 200 us slice held hart 0 for 3.9 ms, and everything on that hart waited, other
//! reservations included.
//!
//! A budget tick is one small `SCHED_DEADLINE` thread of tessd per hart that holds reservations,
//! with `runtime` [`TICK_RUNTIME`], a relative deadline of [`TICK_DEADLINE`] (20 us) and a
//! period of `budget-tick-us`. It sleeps until the next multiple of its period and goes back to
//! sleep at once. Its deadline is shorter than that of any reservation tess admits, so its
//! wake-up preempts the running deadline task; preemption accounts that task's time, and a task past its
//! budget is throttled right there. An overrun is thus bounded by one tick period (default
//! 200 us) instead of a scheduler tick.
//!
//! Two details make that hold (both found with the kernel's `sched_switch` trace, a busy loop
//! in a 200 us / 3 ms cell):
//!
//! - **The tick reclaims** (`SCHED_FLAG_RECLAIM`, the kernel's GRUB accounting). Interrupts
//!   and a hypervisor's exits are charged to whatever runs, so a tick's wake-up costs 8 us at
//!   the median and up to 40 us on a virtual machine, more than its 5 us budget. Without
//!   reclaiming, the tick overran, owed its overrun, and was silenced until it had repaid it at
//!   5 us a period: the loop ran for up to 1.9 ms at a stretch (p99 1.2 ms), and the tick woke
//!   2,500 times a second instead of 5,000. Reclaiming charges the tick only its share of the
//!   hart's active reserved bandwidth, so ordinary wake-ups no longer throttle it while the
//!   hart has unreserved time; the busy loop then ran at most 361 us (p99 200 us). Admission
//!   still counts the tick's 2.5%. A stall of the whole vCPU while the tick runs (hundreds of
//!   microseconds, a few times a minute here) is still charged to it and still silences it
//!   for that many periods (docs/architecture.md, "A tick that owes time stops enforcing").
//! - **Time-triggered windows get slack** ([`BudgetTicks::widen_windows`]). A window's deadline
//!   is its end, which has passed by the time its budget runs out, and no wake-up preempts a
//!   thread whose deadline has passed: the busy loop in a 200 us window ran 3.8 ms, to the
//!   scheduler tick. tessd gives such threads a deadline of `active + tick period + 20 us`
//!   (never past the period), so a tick always comes while the deadline is still ahead.
//!   Admission keeps checking the windows at `active`, which is stricter: a set that meets the
//!   shorter deadlines meets the longer ones. What the window's program sees: it still gets
//!   `active` of CPU time per period, released on the grid, but may finish up to one tick
//!   period later when a neighbour's earlier deadline preempts it.
//!
//! And a tick must run before any thread is promoted on its hart: `Enforcer::converge` starts
//! the ticks a new layout wants and waits for them ([`BudgetTicks::wait_started`]) before it
//! places reservations. Started last, as it once was, a hart that rejoined a cell had no tick
//! for several milliseconds, and a Pulse hart promoted there ran 8 ms of a 400 us window.
//!
//! What it costs: one wake-up per period per such hart (5,000 a second at 200 us; about 1-2% of
//! the hart on this virtual machine, where each timer costs a hypervisor exit), and admission
//! sets its bandwidth aside (`TICK_RUNTIME / tick`, 2.5% at 200 us) on every hart, because the
//! kernel counts it like any deadline task. A hart without reservations gets no tick; a machine
//! where `HRTICK_DL` is on gets none; `budget-tick-us = 0` in tessd.toml turns them off.
//!
//! The ticks are threads of tessd, so they stop while tessd is down (reservations keep running,
//! with tick-granular enforcement, until it is back). On cgroup v1 each tick joins the anchor
//! cpuset of its root domain (`Backend::attach_thread_to_domain`); on v2 a thread stays in its
//! process's cgroup, so a tick runs only on harts tessd's own group may use, and for any other
//! reserved hart the log says once that there is none.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use tess_cgroup::Backend;
use tess_core::layout::Layout;
use tess_sched::{HartSet, Policy};

/// CPU time a tick may use per period: a wake-up and a `clock_nanosleep` take about 2 us here;
/// the rest covers a timer interrupt charged to the tick. A tick that runs out is throttled
/// until its next period, which only skips one tick.
pub const TICK_RUNTIME: Duration = Duration::from_micros(5);

/// Relative deadline of a tick: shorter than any reservation's (a time-triggered window's
/// deadline is its active time, at least `tess_core::spec::MIN_BUDGET` = 50 us), so the tick
/// preempts every reserved task, even one whose window just opened.
pub const TICK_DEADLINE: Duration = Duration::from_micros(20);

/// Default period (`budget-tick-us`).
pub const DEFAULT_TICK: Duration = Duration::from_micros(200);

/// Shortest period: the kernel's default `sched_deadline_period_min_us`.
pub const MIN_TICK: Duration = Duration::from_micros(100);

/// Fraction of each hart the ticks set aside in admission.
pub fn bandwidth(tick: Duration) -> f64 {
    TICK_RUNTIME.as_secs_f64() / tick.as_secs_f64()
}

/// What the layout wants: for every hart that holds reservations, the affinity its tick gets
/// (the hart's root domain: the kernel lets a thread become a deadline task only if its affinity
/// spans its root domain).
pub fn wanted(layout: &Layout) -> BTreeMap<usize, HartSet> {
    let mut want = BTreeMap::new();
    for h in layout.reserved.iter() {
        let domain = layout
            .domains
            .iter()
            .find(|d| d.contains(h))
            .cloned()
            .unwrap_or_else(|| HartSet::single(h));
        want.insert(h, domain);
    }
    want
}

/// One running tick.
#[derive(Debug)]
struct Tick {
    affinity: HartSet,
    stop: Arc<AtomicBool>,
    /// Kernel thread id once the thread runs; -1 when it gave up (see `failed`).
    tid: Arc<AtomicI32>,
    handle: Option<JoinHandle<()>>,
}

/// The budget ticks of the harts that hold reservations.
#[derive(Debug)]
pub struct BudgetTicks {
    period: Duration,
    running: BTreeMap<usize, Tick>,
}

impl BudgetTicks {
    /// Ticks with this period (at least [`MIN_TICK`]).
    pub fn new(period: Duration) -> BudgetTicks {
        BudgetTicks {
            period: period.max(MIN_TICK),
            running: BTreeMap::new(),
        }
    }

    /// The tick period.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// How far past the end of its window a time-triggered thread's deadline is set, so that a
    /// tick always comes before that deadline: one period and the tick's own deadline.
    pub fn window_slack(&self) -> Duration {
        self.period + TICK_DEADLINE
    }

    /// Moves the deadline of every reservation whose deadline is shorter than its period (a
    /// time-triggered window) [`window_slack`](Self::window_slack) later, never past the
    /// period (module docs).
    pub fn widen_windows(&self, layout: &mut Layout) {
        for cell in layout.cells.values_mut() {
            if let Some(r) = cell.reservation.as_mut() {
                if r.deadline < r.period {
                    r.deadline = (r.deadline + self.window_slack()).min(r.period);
                }
            }
        }
    }

    /// Starts the ticks `layout` wants and stops the others. With `verify`, also restarts a tick
    /// whose thread lost its pinning or its policy (moving a v1 cpuset resets affinities).
    /// A tick that failed to start is retried only when its hart's wanted affinity changes.
    pub fn reconcile(&mut self, backend: &Arc<dyn Backend>, layout: &Layout, verify: bool) {
        let want = wanted(layout);
        self.stop_where(|h, t| {
            want.get(&h) != Some(&t.affinity) || (verify && !t.failed() && !t.healthy())
        });
        for (h, affinity) in want {
            if !self.running.contains_key(&h) {
                let tick = start(backend.clone(), h, affinity, self.period);
                self.running.insert(h, tick);
            }
        }
    }

    /// Waits until every tick has either become a deadline task or given up, for at most
    /// `limit`; returns the harts whose ticks had not (empty when all did). A tick is a thread
    /// that must first run to place itself, and until it has, a reservation promoted on its
    /// hart is ended only by the scheduler tick (module docs): a Pulse hart promoted on a hart
    /// whose tick was still starting ran 8 ms of a 400 us window and then sat throttled for as
    /// long. A tick thread that ended without placing itself counts as given up.
    pub fn wait_started(&self, limit: Duration) -> HartSet {
        let give_up = std::time::Instant::now() + limit;
        loop {
            let mut late = HartSet::new();
            for (&h, t) in &self.running {
                if t.tid.load(Ordering::Acquire) != 0 {
                    continue;
                }
                if t.handle.as_ref().is_none_or(|j| j.is_finished()) {
                    // Died before it said how it fared (a panic in `become_tick`): given up.
                    t.tid.store(-1, Ordering::Release);
                } else {
                    late.insert(h);
                }
            }
            if late.is_empty() || std::time::Instant::now() >= give_up {
                return late;
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// Stops the ticks `layout` does not want as they run (before a convergence changes the
    /// root domains under them).
    pub fn stop_unwanted(&mut self, layout: &Layout) {
        let want = wanted(layout);
        self.stop_where(|h, t| want.get(&h) != Some(&t.affinity));
    }

    fn stop_where(&mut self, stale: impl Fn(usize, &Tick) -> bool) {
        let (gone, keep) = std::mem::take(&mut self.running)
            .into_iter()
            .partition(|(h, t)| stale(*h, t));
        self.running = keep;
        for (_, t) in gone {
            t.stop();
        }
    }

    /// Stops every tick (teardown).
    pub fn stop_all(&mut self) {
        for (_, t) in std::mem::take(&mut self.running) {
            t.stop();
        }
    }
}

impl Drop for BudgetTicks {
    fn drop(&mut self) {
        self.stop_all();
    }
}

impl Tick {
    fn failed(&self) -> bool {
        self.tid.load(Ordering::Acquire) == -1
    }

    fn healthy(&self) -> bool {
        let tid = self.tid.load(Ordering::Acquire);
        if tid <= 0 {
            // Still starting.
            return true;
        }
        let pinned = tess_sched::affinity::get_affinity(tid).is_ok_and(|a| a == self.affinity);
        let deadline = tess_sched::attr::get_policy(tid)
            .is_ok_and(|(p, _)| matches!(p, Policy::Deadline { .. }));
        pinned && deadline
    }

    fn stop(mut self) {
        self.stop.store(true, Ordering::Release);
        // The thread sleeps at most one period; joining keeps a restarted tick from ever
        // running beside the old one.
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn start(backend: Arc<dyn Backend>, hart: usize, affinity: HartSet, period: Duration) -> Tick {
    let stop = Arc::new(AtomicBool::new(false));
    let tid = Arc::new(AtomicI32::new(0));
    let (s, t, a) = (stop.clone(), tid.clone(), affinity.clone());
    let handle = std::thread::Builder::new()
        .name(format!("budget-tick-{hart}"))
        .spawn(move || {
            if let Err(e) = become_tick(backend.as_ref(), &a, period) {
                tracing::warn!(
                    "no budget tick on hart {hart}: {e}; reservations there may overrun their budgets by up to a scheduler tick"
                );
                t.store(-1, Ordering::Release);
                return;
            }
            // SAFETY: gettid has no preconditions.
            t.store(unsafe { libc::gettid() }, Ordering::Release);
            run(&s, period);
        });
    match handle {
        Ok(h) => Tick {
            affinity,
            stop,
            tid,
            handle: Some(h),
        },
        Err(e) => {
            tracing::warn!("cannot start the budget tick of hart {hart}: {e}");
            tid.store(-1, Ordering::Release);
            Tick {
                affinity,
                stop,
                tid,
                handle: None,
            }
        }
    }
}

/// Moves the calling thread into its root domain, pins it there and makes it a deadline task.
fn become_tick(backend: &dyn Backend, affinity: &HartSet, period: Duration) -> Result<(), String> {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    backend
        .attach_thread_to_domain(tid, affinity)
        .map_err(|e| format!("cannot place it in the root domain of harts {affinity}: {e}"))?;
    tess_sched::affinity::set_affinity(0, affinity).map_err(|e| {
        format!("cannot pin it to harts {affinity} (outside tessd's own group?): {e}")
    })?;
    tess_sched::attr::set_policy(
        0,
        Policy::Deadline {
            runtime: TICK_RUNTIME,
            deadline: TICK_DEADLINE,
            period,
        },
        // Reclaiming: a wake-up costs more than 5 us here (module docs).
        tess_sched::attr::FLAG_RECLAIM,
    )
    .map_err(|e| {
        format!("SCHED_DEADLINE {TICK_RUNTIME:?}/{TICK_DEADLINE:?}/{period:?} refused: {e}")
    })
}

/// Wakes at every multiple of `period` until told to stop. Waking is all a tick does.
fn run(stop: &AtomicBool, period: Duration) {
    let p = tess_sched::clock::ns(period);
    let mut next = tess_sched::clock::next_grid_point(tess_sched::clock::now_ns(), p, 0);
    while !stop.load(Ordering::Acquire) {
        tess_sched::clock::sleep_until_ns(next);
        let now = tess_sched::clock::now_ns();
        next += p;
        if next <= now {
            // Throttled or preempted past a period: skip, never catch up in a burst.
            next = tess_sched::clock::next_grid_point(now, p, 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tess_core::layout::Layout;

    fn layout(reserved: &str, domains: &[&str]) -> Layout {
        let all: HartSet = "0-7".parse().unwrap();
        Layout {
            all: all.clone(),
            managed: all.clone(),
            dedicated: HartSet::new(),
            reserved: reserved.parse().unwrap(),
            pool: HartSet::new(),
            system: all,
            domains: domains.iter().map(|d| d.parse().unwrap()).collect(),
            cells: Default::default(),
        }
    }

    #[test]
    fn a_tick_per_reserved_hart_pinned_to_its_root_domain() {
        let l = layout("0,2-3", &["0", "2-3", "4-7"]);
        let w = wanted(&l);
        assert_eq!(w.keys().copied().collect::<Vec<_>>(), vec![0, 2, 3]);
        assert_eq!(w[&0], "0".parse().unwrap());
        assert_eq!(w[&2], "2-3".parse().unwrap());
        assert_eq!(w[&3], "2-3".parse().unwrap());
    }

    #[test]
    fn windows_get_a_tick_of_slack_within_their_period() {
        use tess_core::layout::{CellLayout, Reservation};
        let window = |active_us: u64, period_us: u64| CellLayout {
            class: tess_core::layout::CellClass::Reserved,
            cpus: HartSet::single(0),
            reservation: Some(Reservation {
                runtime: Duration::from_micros(active_us),
                deadline: Duration::from_micros(active_us),
                period: Duration::from_micros(period_us),
                offset: Some(Duration::ZERO),
            }),
            thread_slots: vec![HartSet::single(0)],
            cpu_weight: None,
            cfs_limit: None,
            memory_max: None,
            pids_max: None,
            idle_spin: false,
            group_server: false,
        };
        let mut l = layout("0", &["0", "1-7"]);
        l.cells.insert("tt".into(), window(200, 3000));
        l.cells.insert("tight".into(), window(900, 1000));
        let mut et = window(200, 3000);
        et.reservation.as_mut().unwrap().deadline = Duration::from_micros(3000);
        l.cells.insert("et".into(), et);
        let ticks = BudgetTicks::new(DEFAULT_TICK);
        assert_eq!(ticks.window_slack(), Duration::from_micros(220));
        ticks.widen_windows(&mut l);
        let deadline = |c: &str| l.cells[c].reservation.unwrap().deadline.as_micros();
        assert_eq!(deadline("tt"), 420);
        assert_eq!(deadline("tight"), 1000, "never past the period");
        assert_eq!(deadline("et"), 3000, "implicit deadlines stay");
    }

    #[test]
    fn no_reservations_no_ticks() {
        assert!(wanted(&layout("", &["0-7"])).is_empty());
    }

    #[test]
    fn bandwidth_is_runtime_over_period() {
        assert!((bandwidth(DEFAULT_TICK) - 0.025).abs() < 1e-12);
        assert_eq!(BudgetTicks::new(Duration::from_micros(10)).period, MIN_TICK);
    }
}
