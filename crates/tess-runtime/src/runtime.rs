//! Starting the harts, the shared state, adaptation, and the handle applications hold.

use crate::control::{AttachError, Link};
use crate::hart;
use crate::roster::Roster;
use crate::sync::Doorbell;
use crate::window::{Tuning, WindowSpec};
use crate::{Scheduler, Task};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;
use tess_core::spec::Policy as CellPolicy;
use tess_proto::runtime::Control;

/// How the cell's harts are timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timing {
    /// A time-triggered cell: gang-scheduled windows.
    TimeTriggered(WindowSpec),
    /// An event-triggered cell: a budget per `period` on each hart, nothing to align.
    Budget {
        /// Replenishment period.
        period: Duration,
    },
    /// No reservation (dedicated, best-effort, or standalone without a window).
    Untimed,
}

/// Errors starting the runtime.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// Not in a cell and not told which one.
    #[error("this process is not in a cell: start it with `tess run --cell NAME -- PROGRAM`, name the cell with Builder::cell, or run standalone with Builder::standalone")]
    NotInCell,
    /// tessd refused or could not be reached.
    #[error(transparent)]
    Attach(#[from] AttachError),
    /// A hart thread could not be created.
    #[error("cannot start the thread of virtual hart {vhart}: {source}")]
    Spawn {
        /// The virtual hart.
        vhart: usize,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The cell has no harts.
    #[error("cell '{cell}' has no harts")]
    NoHarts {
        /// The cell.
        cell: String,
    },
}

/// Counters of a running runtime (all harts together).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Windows started.
    pub windows: u64,
    /// Windows started after their scheduled start (the kernel released the hart too late).
    pub late_windows: u64,
    /// Times a hart re-anchored its kernel period on the grid.
    pub reanchors: u64,
    /// Adaptations completed (`adapt` called, or a same-size change acknowledged).
    pub adaptations: u64,
    /// Nanoseconds spent spinning to window starts.
    pub spin_ns: u64,
}

/// The gang's pages: entry lateness, and skew behind the window's first vhart.
pub(crate) type GangPages = (Option<tess_stats::Publisher>, Option<tess_stats::Publisher>);

/// Window `index` was first entered at `entered_ns` (the index is stored last, with Release,
/// so that a vhart that reads it with Acquire also reads the matching time).
#[derive(Debug)]
pub(crate) struct WindowFirst {
    pub(crate) index: AtomicU64,
    pub(crate) entered_ns: AtomicU64,
}

impl Default for WindowFirst {
    fn default() -> Self {
        WindowFirst {
            index: AtomicU64::new(u64::MAX),
            entered_ns: AtomicU64::new(0),
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) windows: AtomicU64,
    pub(crate) late_windows: AtomicU64,
    pub(crate) reanchors: AtomicU64,
    pub(crate) adaptations: AtomicU64,
    pub(crate) spin_ns: AtomicU64,
}

/// An adaptation in progress (the roster holds its lock-free part).
#[derive(Debug)]
pub(crate) struct Pending {
    seq: Option<u64>,
    old: usize,
    new: usize,
    retiring: Vec<JoinHandle<()>>,
}

/// State shared by the harts.
pub(crate) struct Shared {
    pub(crate) sched: Box<dyn Scheduler>,
    timing: Mutex<Timing>,
    pub(crate) tuning: Tuning,
    pub(crate) roster: Roster,
    pub(crate) doorbell: Doorbell,
    stop: AtomicBool,
    control: Mutex<Link>,
    pending: Mutex<Option<Pending>>,
    orphans: Mutex<Vec<Task>>,
    threads: Mutex<Vec<(usize, JoinHandle<()>)>>,
    /// Hart threads wait for tessd to make them deadline threads before running.
    pub(crate) reserved: bool,
    pub(crate) poll_interval_ns: u64,
    pub(crate) placement_timeout: Duration,
    pub(crate) counters: Counters,
    /// The `gang-window` and `gang-skew` pages (crate `tess-stats`): how late each vhart
    /// entered each window, and how long after the window's first vhart; made at the first
    /// window so that runtimes without windows publish nothing.
    pub(crate) windows_published: std::sync::OnceLock<GangPages>,
    /// The latest window a vhart entered, and when the first one did.
    pub(crate) window_first: WindowFirst,
    local_seq: AtomicU64,
    /// Kernel thread ids of hart threads that retired and may still be exiting.
    pub(crate) retired_tids: Mutex<Vec<i32>>,
    /// The physical harts tessd last reported (for information only).
    harts: Mutex<Vec<usize>>,
    cell: Option<String>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("cell", &self.cell)
            .field("harts", &self.roster.target())
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A handle to a running runtime: stop it, announce work, resize it (standalone).
#[derive(Clone, Debug)]
pub struct Handle(pub(crate) Arc<Shared>);

impl Handle {
    /// Asks every hart to stop at its next checkpoint; [`Runtime::run`] then returns.
    pub fn stop(&self) {
        self.0.stop.store(true, Ordering::Release);
        self.0.doorbell.ring();
    }

    /// Whether a stop was requested.
    pub fn is_stopping(&self) -> bool {
        self.0.stopping()
    }

    /// Wakes idle harts: new work may be available.
    pub fn notify(&self) {
        self.0.doorbell.ring();
    }

    /// Virtual harts the cell has now (during an adaptation: after it).
    pub fn harts(&self) -> usize {
        self.0.roster.target()
    }

    /// The cell's timing.
    pub fn timing(&self) -> Timing {
        self.0.timing()
    }

    /// The cell, unless standalone.
    pub fn cell(&self) -> Option<&str> {
        self.0.cell.as_deref()
    }

    /// The physical harts tessd gave the cell (standalone: `0..n`).
    pub fn physical_harts(&self) -> Vec<usize> {
        lock(&self.0.harts).clone()
    }

    /// Counters so far.
    pub fn stats(&self) -> Stats {
        let c = &self.0.counters;
        Stats {
            windows: c.windows.load(Ordering::Relaxed),
            late_windows: c.late_windows.load(Ordering::Relaxed),
            reanchors: c.reanchors.load(Ordering::Relaxed),
            adaptations: c.adaptations.load(Ordering::Relaxed),
            spin_ns: c.spin_ns.load(Ordering::Relaxed),
        }
    }

    /// Lets the runtime read its control channel and complete an adaptation from inside a long
    /// slice of virtual hart 0, which never retires: an application whose whole life is one
    /// slice on vhart 0 (an audio loop) calls it between iterations, e.g. once per block, so
    /// that a shrink to one hart, which only vhart 0 can complete, is not held up for the
    /// slice's life. Reading the channel is a few loads of shared memory. On any other thread
    /// it does nothing: a hart that may retire ends its slice instead
    /// ([`crate::Hart::should_yield`]).
    pub fn checkpoint(&self) {
        if crate::hart::vhart_id() != Some(0) || self.0.stopping() {
            return;
        }
        self.0.poll_control();
    }

    /// Standalone runtimes only: changes the number of harts as tessd would (`Adapt`), to test
    /// an application's adaptation without a cell. Returns false in a cell (use
    /// `tess cell resize` there).
    pub fn resize(&self, harts: usize) -> bool {
        let mut link = lock(&self.0.control);
        let Link::Local { inbox, .. } = &mut *link else {
            return false;
        };
        let seq = self.0.local_seq.fetch_add(1, Ordering::Relaxed) + 1;
        inbox.push_back(Control::Adapt {
            seq,
            harts: (0..harts.max(1)).collect(),
            window: None,
        });
        drop(link);
        self.0.doorbell.ring();
        true
    }

    /// Standalone runtimes only: the adaptations acknowledged so far, as `(seq, vharts)`.
    pub fn acknowledged(&self) -> Vec<(u64, usize)> {
        match &*lock(&self.0.control) {
            Link::Local { acks, .. } => acks.clone(),
            Link::Tessd(_) => Vec::new(),
        }
    }
}

impl Shared {
    pub(crate) fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    pub(crate) fn timing(&self) -> Timing {
        *lock(&self.timing)
    }

    /// Stashes the task of a retiring hart for `adapt`.
    pub(crate) fn orphan(&self, task: Task) {
        lock(&self.orphans).push(task);
    }

    /// Reads one control message if no adaptation is pending and nobody else is reading.
    /// Polls the control channel (or completes the pending adaptation). Returns false if
    /// another hart was polling: it may be starting an adaptation this hart should wait for.
    pub(crate) fn poll_control(self: &Arc<Self>) -> bool {
        if self.roster.pending() {
            self.try_complete();
            return true;
        }
        let msg = match self.control.try_lock() {
            Ok(mut link) => link.poll(),
            Err(_) => return false,
        };
        match msg {
            Some(Control::Adapt { seq, harts, window }) => {
                if let Some(w) = window {
                    let mut t = lock(&self.timing);
                    if !matches!(*t, Timing::Untimed) {
                        *t = timing_of_window(&w);
                    }
                }
                let new = harts.len().max(1);
                *lock(&self.harts) = harts;
                self.begin(Some(seq), new);
            }
            Some(Control::Shutdown) => {
                self.stop.store(true, Ordering::Release);
                self.doorbell.ring();
            }
            None => {}
        }
        true
    }

    /// Starts an adaptation to `new` harts (module docs of `roster`).
    fn begin(self: &Arc<Self>, seq: Option<u64>, new: usize) {
        let old = self.roster.target();
        if crate::hart::trace() {
            crate::hart::trace_line(format_args!(
                "vhart {:?} begins adaptation {seq:?}: {old} -> {new}",
                crate::vhart_id()
            ));
        }
        let retiring = if new < old {
            let mut threads = lock(&self.threads);
            let (gone, keep): (Vec<_>, Vec<_>) = threads.drain(..).partition(|(v, _)| *v >= new);
            *threads = keep;
            gone.into_iter().map(|(_, h)| h).collect()
        } else {
            Vec::new()
        };
        *lock(&self.pending) = Some(Pending {
            seq,
            old,
            new,
            retiring,
        });
        self.roster.begin(old, new);
        for vhart in old..new {
            if let Err(e) = self.spawn(vhart, true) {
                // The cell keeps fewer harts than tessd gave it; count the missing hart as
                // arrived so the adaptation completes, and say so.
                eprintln!("tess-runtime: {e}");
                self.roster.arrive();
            }
        }
        self.doorbell.ring();
        self.try_complete();
    }

    /// Completes the pending adaptation if every hart it waits for has arrived: runs `adapt`
    /// once and acknowledges it. Never called by a retiring hart.
    pub(crate) fn try_complete(&self) {
        let Some(claim) = self.roster.try_claim() else {
            return;
        };
        let p = lock(&self.pending).take();
        if crate::hart::trace() {
            crate::hart::trace_line(format_args!(
                "vhart {:?} completes adaptation {:?}",
                crate::vhart_id(),
                p.as_ref().map(|p| (p.seq, p.old, p.new))
            ));
        }
        if let Some(p) = p {
            for h in p.retiring {
                // They have arrived, so they run no more application code; wait for the kernel
                // threads to be gone before telling tessd it may take the harts.
                let _ = h.join();
            }
            wait_gone(&self.retired_tids);
            let orphans = std::mem::take(&mut *lock(&self.orphans));
            if p.old != p.new {
                self.sched.adapt(p.old, p.new, orphans);
            }
            self.counters.adaptations.fetch_add(1, Ordering::Relaxed);
            if let Some(seq) = p.seq {
                lock(&self.control).ack(seq, p.new);
            }
            if crate::hart::trace() {
                crate::hart::trace_line(format_args!("adaptation {:?} done", p.seq));
            }
        }
        self.roster.finish(claim);
        self.doorbell.ring();
    }

    pub(crate) fn spawn(self: &Arc<Self>, vhart: usize, fresh: bool) -> Result<(), RuntimeError> {
        let shared = self.clone();
        let h = std::thread::Builder::new()
            .name(format!("vhart-{vhart}"))
            .spawn(move || hart::run(&shared, vhart, fresh))
            .map_err(|source| RuntimeError::Spawn { vhart, source })?;
        lock(&self.threads).push((vhart, h));
        Ok(())
    }
}

/// Waits (up to 5 ms) until the kernel has reaped the retired hart threads (see
/// [`tess_proto::runtime::wait_gone`]).
fn wait_gone(tids: &Mutex<Vec<i32>>) {
    let tids = std::mem::take(&mut *lock(tids));
    tess_proto::runtime::wait_gone(&tids, Duration::from_millis(5));
}

fn timing_of_window(w: &tess_proto::runtime::Window) -> Timing {
    match w.offset_ns {
        Some(o) => Timing::TimeTriggered(WindowSpec {
            period: Duration::from_nanos(w.period_ns),
            active: Duration::from_nanos(w.runtime_ns),
            offset: Duration::from_nanos(o),
        }),
        None => Timing::Budget {
            period: Duration::from_nanos(w.period_ns),
        },
    }
}

fn timing_of_cell(policy: &CellPolicy, offset: Option<Duration>) -> Timing {
    match *policy {
        CellPolicy::TimeTriggered {
            period,
            active,
            offset: o,
        } => Timing::TimeTriggered(WindowSpec {
            period,
            active,
            offset: offset.or(o).unwrap_or_default(),
        }),
        CellPolicy::EventTriggered { period, .. } => Timing::Budget { period },
        _ => Timing::Untimed,
    }
}

/// Configures a runtime.
#[derive(Debug, Clone)]
pub struct Builder {
    cell: Option<String>,
    standalone: Option<(usize, Option<WindowSpec>)>,
    tuning: Tuning,
    poll_interval: Duration,
    placement_timeout: Duration,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            cell: None,
            standalone: None,
            tuning: Tuning::default(),
            poll_interval: Duration::from_micros(200),
            placement_timeout: tess_proto::runtime::PLACEMENT_TIMEOUT,
        }
    }
}

impl Builder {
    /// Runs in this cell (default: the cell the process is in).
    pub fn cell(mut self, name: impl Into<String>) -> Builder {
        self.cell = Some(name.into());
        self
    }

    /// Runs without tessd: `harts` threads, windows on `window`'s grid if given (with
    /// `clock_nanosleep` and spinning instead of the kernel's reservations), resizable with
    /// [`Handle::resize`]. For tests and for running a cell program outside a cell.
    pub fn standalone(mut self, harts: usize, window: Option<WindowSpec>) -> Builder {
        self.standalone = Some((harts.max(1), window));
        self
    }

    /// How the application window sits in the kernel window (see [`crate::window`]).
    pub fn tuning(mut self, tuning: Tuning) -> Builder {
        self.tuning = tuning;
        self
    }

    /// How often a busy or idle hart looks at the control channel (default 200 us).
    pub fn poll_interval(mut self, d: Duration) -> Builder {
        self.poll_interval = d;
        self
    }

    /// Attaches to tessd (or sets up the standalone runtime) with scheduler `sched`.
    pub fn build(self, sched: impl Scheduler) -> Result<Runtime, RuntimeError> {
        let (cell, harts, timing, reserved, link) = match self.standalone {
            Some((n, window)) => (
                None,
                (0..n).collect::<Vec<_>>(),
                window.map_or(Timing::Untimed, Timing::TimeTriggered),
                false,
                Link::Local {
                    inbox: Default::default(),
                    acks: Vec::new(),
                },
            ),
            None => {
                let cell = self
                    .cell
                    .or_else(tess_proto::runtime::current_cell)
                    .ok_or(RuntimeError::NotInCell)?;
                let (info, ch) = tess_proto::runtime::attach(&cell)?;
                let harts: Vec<usize> = info.harts.iter().collect();
                if harts.is_empty() {
                    return Err(RuntimeError::NoHarts { cell });
                }
                let timing = timing_of_cell(&info.policy, info.window_offset);
                let reserved = info.policy.is_reservation();
                (
                    Some(cell),
                    harts,
                    timing,
                    reserved,
                    Link::Tessd(Box::new(ch)),
                )
            }
        };
        let shared = Arc::new(Shared {
            sched: Box::new(sched),
            timing: Mutex::new(timing),
            tuning: self.tuning,
            roster: Roster::new(harts.len()),
            doorbell: Doorbell::default(),
            stop: AtomicBool::new(false),
            control: Mutex::new(link),
            pending: Mutex::new(None),
            orphans: Mutex::new(Vec::new()),
            threads: Mutex::new(Vec::new()),
            reserved,
            poll_interval_ns: tess_sched::clock::ns(self.poll_interval),
            placement_timeout: self.placement_timeout,
            counters: Counters::default(),
            windows_published: std::sync::OnceLock::new(),
            window_first: WindowFirst::default(),
            local_seq: AtomicU64::new(0),
            retired_tids: Mutex::new(Vec::new()),
            harts: Mutex::new(harts),
            cell,
        });
        Ok(Runtime { shared })
    }
}

/// A runtime ready to run: [`Runtime::run`] turns the calling thread into virtual hart 0 and
/// starts one thread per other hart of the cell.
#[derive(Debug)]
pub struct Runtime {
    shared: Arc<Shared>,
}

impl Runtime {
    /// A builder with the defaults: the cell the process runs in, default tuning.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// A handle to stop, notify or (standalone) resize the runtime; valid before and during
    /// [`Runtime::run`].
    pub fn handle(&self) -> Handle {
        Handle(self.shared.clone())
    }

    /// Runs until [`Handle::stop`] or until tessd deletes the cell. The calling thread becomes
    /// virtual hart 0 (so no thread of the process is left idle in the cell, holding a share of
    /// a hart's budget); returns when every hart has stopped.
    pub fn run(self) -> Result<Stats, RuntimeError> {
        let s = self.shared;
        s.sched.start(&Handle(s.clone()));
        for vhart in 1..s.roster.target() {
            s.spawn(vhart, false)?;
        }
        hart::run(&s, 0, false);
        // Every hart stops at its next checkpoint; collect them (and any retiring ones).
        s.doorbell.ring();
        loop {
            let next = lock(&s.threads).pop();
            match next {
                Some((_, h)) => {
                    let _ = h.join();
                }
                None => break,
            }
        }
        if let Some(p) = lock(&s.pending).take() {
            for h in p.retiring {
                let _ = h.join();
            }
        }
        Ok(Handle(s).stats())
    }
}
