//! Starting Pulse: one pinned kernel thread per hart (in a cell: one per hart of the cell,
//! placed as `cell.rs` says), the shared state, the sleep list, adaptation, and the [`Pulse`]
//! handle applications hold.

use crate::adapt::AdaptState;
use crate::cell::{CellLink, CellMode};
use crate::clock::{self, now_ns};
use crate::hart::{self, HartState};
use crate::lock::SpinLock;
use crate::sched::{Callbacks, Scheduler};
use crate::thread::{Entry, PulseThread};
use crate::{tick, StackError};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Most harts one Pulse instance can have.
pub const MAX_HARTS: usize = 64;

/// The longest an idle standalone hart waits before looking again (it is woken earlier by
/// the doorbell, a kick or its next sleeper's time).
const IDLE_MAX_NS: u64 = 1_000_000_000;

/// Errors starting or driving Pulse.
#[derive(Debug, thiserror::Error)]
pub enum PulseError {
    /// A stack could not be mapped.
    #[error(transparent)]
    Stack(#[from] StackError),
    /// A hart's kernel thread, timer or signal set-up failed.
    #[error("cannot start vhart {vhart}: {what}: {source}")]
    Hart {
        /// The virtual hart.
        vhart: usize,
        /// What failed.
        what: &'static str,
        /// The kernel's answer.
        #[source]
        source: std::io::Error,
    },
    /// Bad configuration.
    #[error("invalid pulse configuration: {0}")]
    Config(String),
    /// An adaptation was requested while another was in progress (seed 004 section 4.4: one
    /// at a time).
    #[error("an adaptation ({old} -> {new} harts) is still in progress; wait for it to finish before resizing again")]
    AdaptInProgress {
        /// Harts before the running adaptation.
        old: usize,
        /// Harts after it.
        new: usize,
    },
    /// [`PulseHandle::resize`] in a cell, whose size is tessd's to change.
    #[error("Pulse follows cell '{cell}': resize the cell (`tess cell resize {cell} --harts N`), not Pulse")]
    InCell {
        /// The cell.
        cell: String,
    },
    /// tessd refused or could not be reached (in a cell).
    #[error("{0} (outside a cell, or to ignore it, run standalone: Config::cell = CellMode::Standalone)")]
    Attach(#[from] tess_proto::runtime::AttachError),
    /// tessd says the cell has no harts.
    #[error("cell '{cell}' has no harts")]
    NoHarts {
        /// The cell.
        cell: String,
    },
}

/// Pulse's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Which cell to follow (default [`CellMode::Auto`]: the one the process runs in, if any).
    /// In a cell Pulse runs as many harts as the cell has and follows its resizes; `harts` and
    /// `cpus` then do not apply (module `cell`).
    pub cell: CellMode,
    /// Harts to start with (standalone; in a cell, the cell's count instead).
    pub harts: usize,
    /// The CPUs harts are pinned to, by vhart (vhart `i` on `cpus[i % len]`); empty: the CPUs
    /// the process may run on, in order. Standalone only: in a cell, tessd places the harts.
    pub cpus: Vec<usize>,
    /// Tick period (default 1 ms); `None` disables ticks (a cooperative cell).
    pub tick: Option<Duration>,
    /// A scheduler callback running longer than this is reported on stderr (default 1 s).
    pub watchdog: Duration,
    /// Stacks mapped ahead into the pool (default 64 of [`crate::stack::DEFAULT_STACK`]).
    pub prealloc_stacks: usize,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            cell: CellMode::Auto,
            harts: 1,
            cpus: Vec::new(),
            tick: Some(Duration::from_millis(1)),
            watchdog: Duration::from_secs(1),
            prealloc_stacks: 64,
        }
    }
}

/// State shared by the harts of one Pulse instance.
pub(crate) struct Shared {
    pub(crate) callbacks: Callbacks,
    pub(crate) config: Config,
    cpus: Vec<usize>,
    live: AtomicUsize,
    stop: AtomicBool,
    n_harts: AtomicUsize,
    pub(crate) harts: [AtomicPtr<HartState>; MAX_HARTS],
    // Boxed: harts hold raw pointers to their HartState, which must not move when the Vec grows.
    #[allow(clippy::vec_box)]
    all_harts: Mutex<Vec<Box<HartState>>>,
    /// Kernel threads of the harts, by vhart.
    threads: Mutex<Vec<(usize, HartThread)>>,
    doorbell: AtomicU32,
    idle_harts: AtomicUsize,
    sleepers: SpinLock<SleepList>,
    /// Threads in the sleep list (checked on every scheduler entry without the lock).
    sleeping: AtomicUsize,
    pub(crate) adapt: AdaptState,
    pub(crate) watchdog_ns: u64,
    /// The cell Pulse follows, if any (`cell.rs`).
    pub(crate) cell: Option<CellLink>,
    /// tessd shut the cell down: harts leave at their next scheduler entry.
    abandon: AtomicBool,
    me: std::sync::Weak<Shared>,
}

type HartThread = std::thread::JoinHandle<Result<(), PulseError>>;

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("harts", &self.harts())
            .field("live", &self.live.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Sleeping threads, sorted by wake-up time (intrusive through `PulseThread::next`).
#[derive(Debug)]
pub(crate) struct SleepList {
    head: *mut PulseThread,
}

// SAFETY: the list is only touched under its SpinLock; the threads in it are owned by it.
unsafe impl Send for SleepList {}

impl Shared {
    /// The `Arc` this `Shared` lives in (for starting harts from a hart).
    pub(crate) fn arc_of(&self) -> Option<Arc<Shared>> {
        self.me.upgrade()
    }

    pub(crate) fn harts(&self) -> usize {
        self.n_harts.load(Ordering::Acquire)
    }

    pub(crate) fn finished(&self) -> bool {
        self.stop.load(Ordering::Acquire) || self.live.load(Ordering::Acquire) == 0
    }

    /// tessd deleted the cell (or closed the channel): every hart leaves at its next scheduler
    /// entry, abandoning the thread it ran; [`Pulse::run`] returns.
    pub(crate) fn shut_down(&self) {
        self.abandon.store(true, Ordering::Release);
        self.stop.store(true, Ordering::Release);
        for v in 0..MAX_HARTS {
            let h = self.harts[v].load(Ordering::Acquire);
            if !h.is_null() {
                // SAFETY: a registered HartState is live for the runtime's life.
                tick::kick(unsafe { &*h });
            }
        }
        self.ring();
    }

    /// Whether the harts are to leave now ([`Shared::shut_down`]).
    pub(crate) fn abandoned(&self) -> bool {
        self.abandon.load(Ordering::Acquire)
    }

    /// Joins the kernel threads of `vharts` (retired harts, which have left or are leaving).
    pub(crate) fn join_harts(&self, vharts: impl Iterator<Item = usize>) {
        let vharts: Vec<usize> = vharts.collect();
        let gone: Vec<HartThread> = {
            let mut threads = self.threads.lock().unwrap_or_else(|p| p.into_inner());
            let (gone, keep) = threads.drain(..).partition(|(v, _)| vharts.contains(v));
            *threads = keep;
            gone.into_iter().map(|(_, h)| h).collect()
        };
        for h in gone {
            if let Ok(Err(e)) = h.join() {
                eprintln!("tess-pulse: a retired hart: {e}");
            }
        }
    }

    pub(crate) fn thread_started(&self) {
        self.live.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn thread_finished(&self) {
        if self.live.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.ring();
        }
    }

    /// Wakes harts waiting for work.
    pub(crate) fn ring(&self) {
        self.doorbell.fetch_add(1, Ordering::Release);
        if self.idle_harts.load(Ordering::Acquire) > 0 {
            // SAFETY: FUTEX_WAKE on our own word; no memory is touched by the kernel.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    self.doorbell.as_ptr(),
                    libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
                    i32::MAX,
                )
            };
        }
    }

    /// Takes the doorbell's value before the scheduler looks for work ([`Self::idle_wait`]).
    pub(crate) fn note_doorbell(&self, h: &HartState) {
        h.doorbell_seen
            .store(self.doorbell.load(Ordering::Acquire), Ordering::Relaxed);
    }

    /// Waits until the doorbell rings (or rang since the scheduler last looked for work), the
    /// next sleeper is due, a kick comes, or the longest idle wait (one tick in a cell) passes.
    pub(crate) fn idle_wait(&self, h: &HartState) {
        let seen = h.doorbell_seen.load(Ordering::Relaxed);
        if self.finished() {
            return;
        }
        // In a cell the hart polls tessd's control channel at least once a tick period;
        // standalone, everything that can give it work rings the doorbell or kicks it.
        let mut wait_ns = if self.cell.is_some() {
            h.period_ns.max(100_000)
        } else {
            IDLE_MAX_NS
        };
        let next = self.next_wake_ns();
        let now = now_ns();
        if next != u64::MAX {
            wait_ns = wait_ns.min(next.saturating_sub(now));
        }
        if wait_ns == 0 {
            return;
        }
        // Tickless idle (standalone harts; in a cell the wait is at most a tick): a wait
        // longer than a tick stops the periodic timer, so an idle hart is
        // not woken every period for nothing. That matters beyond the CPU it saves: a hart
        // that is a SCHED_DEADLINE reservation is re-judged by the kernel's wake-up rule at
        // every wake-up, which drifts the reservation's period away from the releases that
        // wake it.
        let _paused = (wait_ns > h.period_ns).then(|| tick::TicksPaused::new(h));
        let ts = clock::timespec(wait_ns);
        self.idle_harts.fetch_add(1, Ordering::AcqRel);
        // SAFETY: FUTEX_WAIT on our own word with a valid relative timeout.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.doorbell.as_ptr(),
                libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                seen,
                &ts as *const libc::timespec,
            )
        };
        self.idle_harts.fetch_sub(1, Ordering::AcqRel);
    }

    /// Hands a runnable thread to the scheduler (ticks off). Returns the scheduler's wish that
    /// the caller yield.
    pub(crate) fn make_runnable(&self, t: *mut PulseThread) -> bool {
        let preempt = self.callbacks.wake(t);
        self.ring();
        preempt
    }

    fn next_wake_ns(&self) -> u64 {
        match self.sleepers.try_lock() {
            // SAFETY: the list's head is live while we hold the lock.
            Some(l) if !l.head.is_null() => unsafe { (*l.head).wake_at_ns },
            Some(_) => u64::MAX,
            None => 0,
        }
    }

    /// Puts the running thread `t` to sleep until `at_ns` and suspends it (ticks off).
    pub(crate) fn sleep_until(&self, h: &HartState, t: *mut PulseThread, at_ns: u64) {
        let mut l = self.sleepers.lock();
        // SAFETY: t is the running thread; the list and its members are ours under the lock.
        unsafe {
            (*t).wake_at_ns = at_ns;
            (*t).state
                .store(crate::ThreadState::Blocked as u8, Ordering::Relaxed);
            let mut link: *mut *mut PulseThread = &mut l.head;
            while !(*link).is_null() && (**link).wake_at_ns <= at_ns {
                link = std::ptr::addr_of_mut!((**link).next);
            }
            (*t).next = *link;
            *link = t;
        }
        let new_head = l.head == t;
        self.sleeping.fetch_add(1, Ordering::AcqRel);
        if new_head {
            // An idle hart waits until the old first sleeper's time: have it look again.
            self.ring();
        }
        let word = l.into_raw();
        // SAFETY: ticks are off (caller); the sleep list lock is released once t is saved.
        unsafe { hart::suspend_current(h, hart::Reason::Block, Some(word)) };
    }

    /// Whether any thread sleeps (one load; the scheduler entry's fast check).
    pub(crate) fn has_sleepers(&self) -> bool {
        self.sleeping.load(Ordering::Acquire) > 0
    }

    /// Gives every sleeper whose time came to the scheduler; returns how many.
    pub(crate) fn release_sleepers(&self, _h: Option<&HartState>) -> usize {
        if !self.has_sleepers() {
            return 0;
        }
        let now = now_ns();
        let mut due;
        {
            let Some(mut l) = self.sleepers.try_lock() else {
                return 0;
            };
            // SAFETY: under the lock; detach the due prefix.
            unsafe {
                if l.head.is_null() || (*l.head).wake_at_ns > now {
                    return 0;
                }
                due = l.head;
                let mut last = l.head;
                while !(*last).next.is_null() && (*(*last).next).wake_at_ns <= now {
                    last = (*last).next;
                }
                l.head = (*last).next;
                (*last).next = std::ptr::null_mut();
            }
        }
        let mut n = 0;
        while !due.is_null() {
            // SAFETY: the detached threads are ours alone.
            let next = unsafe { (*due).next };
            // SAFETY: as above.
            unsafe { (*due).next = std::ptr::null_mut() };
            self.sleeping.fetch_sub(1, Ordering::AcqRel);
            self.make_runnable(due);
            due = next;
            n += 1;
        }
        n
    }

    /// Makes and registers the state of `vhart` (pinned to its CPU standalone; in a cell,
    /// placed by `cell.rs`, so its CPU is not fixed).
    fn register_hart(self: &Arc<Self>, vhart: usize) -> Result<*mut HartState, PulseError> {
        let cpu = match self.cell {
            Some(_) => hart::UNPINNED,
            None => self.cpus[vhart % self.cpus.len()],
        };
        let period_ns = self.config.tick.map_or(0, clock::ns);
        let state = HartState::new(Arc::as_ptr(self), vhart, cpu, period_ns)?;
        let ptr = &*state as *const HartState as *mut HartState;
        self.harts[vhart].store(ptr, Ordering::Release);
        self.all_harts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(state);
        Ok(ptr)
    }

    /// Starts the kernel thread of `vhart`.
    pub(crate) fn spawn_hart(self: &Arc<Self>, vhart: usize) -> Result<(), PulseError> {
        let ptr = self.register_hart(vhart)?;
        let shared = self.clone();
        let epoch = self.adapt.epoch();
        let addr = ptr as usize;
        let handle = std::thread::Builder::new()
            .name(format!("pulse-hart-{vhart}"))
            .spawn(move || hart_thread(shared, addr as *mut HartState, epoch))
            .map_err(|source| PulseError::Hart {
                vhart,
                what: "spawning its kernel thread",
                source,
            })?;
        self.threads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((vhart, handle));
        Ok(())
    }

    pub(crate) fn set_harts(&self, n: usize) {
        self.n_harts.store(n, Ordering::Release);
    }
}

/// The kernel thread of one hart.
fn hart_thread(shared: Arc<Shared>, h: *mut HartState, epoch: u64) -> Result<(), PulseError> {
    // SAFETY: the HartState is kept in all_harts until the runtime is dropped.
    let h = unsafe { &*h };
    let vhart = h.vhart;
    match &shared.cell {
        Some(cell) => cell.place(&shared, vhart),
        None => pin_to(h.cpu).map_err(|source| PulseError::Hart {
            vhart,
            what: "pinning to its CPU",
            source,
        })?,
    }
    let _alt = crate::fault::AltStack::install().map_err(|source| PulseError::Hart {
        vhart,
        what: "installing its alternate signal stack",
        source,
    })?;
    // SAFETY: gettid has no preconditions.
    h.tid.store(unsafe { libc::gettid() }, Ordering::Release);
    h.adapt_epoch_seen.store(epoch, Ordering::Release);
    // SAFETY: the HartState outlives this kernel thread's use of it; cleared below.
    unsafe { crate::arch::pulse_set_current_hart(h as *const _ as *mut _) };
    let timer = if h.period_ns > 0 {
        Some(tick::HartTimer::arm(h).map_err(|source| PulseError::Hart {
            vhart,
            what: "arming its tick timer",
            source,
        })?)
    } else {
        None
    };
    // A hart started by an adaptation runs nothing before `adapt` has returned.
    shared.adapt.wait_done(
        epoch,
        || shared.finished(),
        crate::adapt::Pause::new(&shared),
    );
    h.run_from_base();
    drop(timer);
    // SAFETY: clearing this kernel thread's hart pointer.
    unsafe { crate::arch::pulse_set_current_hart(std::ptr::null_mut()) };
    shared.harts[vhart].store(std::ptr::null_mut(), Ordering::Release);
    drop(shared);
    Ok(())
}

pub(crate) fn pin_to(cpu: usize) -> std::io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes inside it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: cpu is checked by the caller's configuration against the allowed set.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: pid 0 is the calling thread; set is valid.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is valid; sched_getaffinity fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is the calling thread; set is a valid out-buffer.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        return vec![0];
    }
    // SAFETY: CPU_ISSET reads the set.
    (0..libc::CPU_SETSIZE as usize)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

/// A Pulse instance: configure, add threads, run.
#[derive(Debug)]
pub struct Pulse {
    shared: Arc<Shared>,
    initial: Vec<*mut PulseThread>,
}

/// A handle to a running Pulse instance, usable from any thread.
#[derive(Debug, Clone)]
pub struct PulseHandle {
    shared: Arc<Shared>,
}

/// Tick statistics of a run (all harts).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct TickStats {
    /// Timer expirations delivered.
    pub fired: u64,
    /// Ticks that preempted an application thread.
    pub preempted: u64,
    /// Ticks that came with ticks off (scheduler or Pulse code running).
    pub masked: u64,
    /// Ticks deferred because the thread was inside the C library (see `tick.rs`).
    pub deferred: u64,
    /// Context restores.
    pub switches: u64,
    /// Per preempting tick: ns from expiry to handler entry (kernel delivery).
    pub delivery_ns: Vec<u64>,
    /// Per preempting tick: ns from handler entry to the trampoline (sigreturn).
    pub sigreturn_ns: Vec<u64>,
    /// Per preempting tick: ns from the trampoline to the next application context running.
    pub user_ns: Vec<u64>,
    /// Adaptation latencies (ns), from the adaptation's start (standalone: the
    /// [`PulseHandle::resize`] call; in a cell: the hart reading tessd's `Adapt`) to `adapt`
    /// returned.
    pub adapt_ns: Vec<u64>,
}

impl Pulse {
    /// Pulse with scheduler `sched` (Rust).
    pub fn new(config: Config, sched: impl Scheduler) -> Result<Pulse, PulseError> {
        Pulse::with_callbacks(config, Callbacks::Rust(Box::new(sched)))
    }

    pub(crate) fn with_callbacks(
        mut config: Config,
        callbacks: Callbacks,
    ) -> Result<Pulse, PulseError> {
        let cell = CellLink::attach(&config.cell)?.map(|(link, harts)| {
            // The cell's count wins: its size is tessd's, and changes under the program anyway.
            config.harts = harts;
            link
        });
        if config.harts == 0 || config.harts > MAX_HARTS {
            return Err(PulseError::Config(format!(
                "harts must be 1..={MAX_HARTS}, not {}",
                config.harts
            )));
        }
        if let Some(t) = config.tick {
            if t < Duration::from_micros(50) {
                return Err(PulseError::Config(format!(
                    "tick period {t:?} is below 50 us: the tick would cost more than it buys"
                )));
            }
        }
        let allowed = allowed_cpus();
        let cpus = if config.cpus.is_empty() || cell.is_some() {
            allowed
        } else {
            if let Some(c) = config.cpus.iter().find(|c| !allowed.contains(c)) {
                return Err(PulseError::Config(format!(
                    "CPU {c} is not in this process's affinity mask {allowed:?}"
                )));
            }
            config.cpus.clone()
        };
        crate::arch::init_xsave();
        tick::install_handlers().map_err(|source| PulseError::Hart {
            vhart: 0,
            what: "installing the tick and fault handlers",
            source,
        })?;
        crate::stack::POOL.reserve(config.prealloc_stacks, crate::stack::DEFAULT_STACK)?;
        let watchdog_ns = clock::ns(config.watchdog);
        let shared = Arc::new_cyclic(|me| Shared {
            me: me.clone(),
            callbacks,
            cpus,
            live: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            n_harts: AtomicUsize::new(config.harts),
            harts: std::array::from_fn(|_| AtomicPtr::new(std::ptr::null_mut())),
            all_harts: Mutex::new(Vec::new()),
            threads: Mutex::new(Vec::new()),
            doorbell: AtomicU32::new(0),
            idle_harts: AtomicUsize::new(0),
            sleepers: SpinLock::new(SleepList {
                head: std::ptr::null_mut(),
            }),
            sleeping: AtomicUsize::new(0),
            adapt: AdaptState::new(),
            watchdog_ns,
            cell,
            abandon: AtomicBool::new(false),
            config,
        });
        Ok(Pulse {
            shared,
            initial: Vec::new(),
        })
    }

    /// Creates a thread that runs `f`; it is handed to the scheduler (`wake`) when
    /// [`Pulse::run`] starts. Returns its id.
    pub fn spawn(&mut self, f: impl FnOnce() + Send + 'static) -> Result<u64, PulseError> {
        self.spawn_with(crate::ThreadOptions::default(), f)
    }

    /// [`Pulse::spawn`] with options (name, stack size, EDF timing).
    pub fn spawn_with(
        &mut self,
        opts: crate::ThreadOptions,
        f: impl FnOnce() + Send + 'static,
    ) -> Result<u64, PulseError> {
        let t = crate::thread_api::build(opts, Entry::Rust(Box::new(f)))?;
        self.shared.thread_started();
        // SAFETY: t is new and ours.
        let id = unsafe { (*t).id };
        self.initial.push(t);
        Ok(id)
    }

    pub(crate) fn push_initial_raw(&mut self, t: *mut PulseThread) {
        self.shared.thread_started();
        self.initial.push(t);
    }

    /// Harts Pulse will start with: [`Config::harts`], or in a cell the cell's count.
    pub fn harts(&self) -> usize {
        self.shared.harts()
    }

    /// The cell Pulse follows, if any ([`Config::cell`]).
    pub fn cell(&self) -> Option<&str> {
        self.shared.cell.as_ref().map(CellLink::name)
    }

    /// A handle for resizing or stopping from another thread.
    pub fn handle(&self) -> PulseHandle {
        PulseHandle {
            shared: self.shared.clone(),
        }
    }

    /// Starts the harts and blocks until every thread has finished (or [`PulseHandle::stop`]).
    ///
    /// In a cell the calling thread becomes vhart 0 (the process then leaves no idle thread in
    /// the cell), and `run` also returns when tessd deletes the cell or goes away: the harts
    /// leave at their next scheduler entry and threads that had not finished are abandoned,
    /// never resumed ([`PulseHandle::live_threads`] counts them).
    pub fn run(mut self) -> Result<TickStats, PulseError> {
        let initial = std::mem::take(&mut self.initial);
        let c_threads = !matches!(self.shared.callbacks, Callbacks::Rust(_));
        for t in initial {
            if c_threads {
                // C programs queue their own threads in init (Listing 2).
                continue;
            }
            self.shared.callbacks.wake(t);
        }
        if self.shared.live.load(Ordering::Acquire) == 0 {
            return Ok(TickStats::default());
        }
        let n = self.shared.harts();
        let mut first_err = None;
        if self.shared.cell.is_some() {
            for v in 1..n {
                self.shared.spawn_hart(v)?;
            }
            if let Err(e) = self.run_vhart0_here() {
                self.shared.stop.store(true, Ordering::Release);
                self.shared.ring();
                first_err = Some(e);
            }
        } else {
            for v in 0..n {
                self.shared.spawn_hart(v)?;
            }
        }
        loop {
            let next = self
                .shared
                .threads
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .pop();
            let Some((_, h)) = next else { break };
            match h.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    self.shared.stop.store(true, Ordering::Release);
                    self.shared.ring();
                    first_err.get_or_insert(e);
                }
                Err(_) => {
                    first_err.get_or_insert(PulseError::Config("a hart thread panicked".into()));
                }
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        Ok(self.handle().stats())
    }

    /// In a cell: the calling thread serves as vhart 0 until the run ends. A thread that pins
    /// itself (cells without a reservation) gets its affinity back afterwards.
    fn run_vhart0_here(&self) -> Result<(), PulseError> {
        let h = self.shared.register_hart(0)?;
        let saved = affinity();
        let r = hart_thread(self.shared.clone(), h, self.shared.adapt.epoch());
        if let Some(set) = saved {
            if self.shared.cell.as_ref().is_some_and(|c| !c.reserved()) {
                // SAFETY: pid 0 is the calling thread; set came from sched_getaffinity.
                unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
            }
        }
        r
    }
}

/// The calling thread's affinity.
fn affinity() -> Option<libc::cpu_set_t> {
    // SAFETY: a zeroed cpu_set_t is valid; sched_getaffinity fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is the calling thread; set is a valid out-buffer.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    (r == 0).then_some(set)
}

impl PulseHandle {
    /// Asks every hart to exit at its next idle point (running threads are not killed).
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.ring();
    }

    /// Harts now.
    pub fn harts(&self) -> usize {
        self.shared.harts()
    }

    /// The cell Pulse follows, if any.
    pub fn cell(&self) -> Option<&str> {
        self.shared.cell.as_ref().map(CellLink::name)
    }

    /// Threads not yet finished.
    pub fn live_threads(&self) -> usize {
        self.shared.live.load(Ordering::Acquire)
    }

    /// Changes the number of harts (seed 004 section 4.4): every hart hands over the thread it
    /// runs, `adapt(old, new, running)` is called once on vhart 0, retired harts exit, new
    /// ones start. Returns when the adaptation is under way; a second request before it
    /// finished is [`PulseError::AdaptInProgress`]. Standalone only: in a cell it is
    /// [`PulseError::InCell`] (`tess cell resize` resizes the cell, and Pulse follows).
    pub fn resize(&self, harts: usize) -> Result<(), PulseError> {
        if let Some(cell) = &self.shared.cell {
            return Err(PulseError::InCell {
                cell: cell.name().to_string(),
            });
        }
        crate::adapt::begin(&self.shared, harts)
    }

    /// Waits until no adaptation is in progress (or `timeout`); true if none is.
    pub fn wait_adapted(&self, timeout: Duration) -> bool {
        let until = now_ns() + clock::ns(timeout);
        while self.shared.adapt.in_progress() {
            if now_ns() > until {
                return false;
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        true
    }

    /// Counters and tick-latency samples so far.
    pub fn stats(&self) -> TickStats {
        let mut s = TickStats::default();
        for h in self
            .shared
            .all_harts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            s.fired += h.stats.fired.load(Ordering::Relaxed);
            s.preempted += h.stats.preempted.load(Ordering::Relaxed);
            s.masked += h.stats.masked.load(Ordering::Relaxed);
            s.deferred += h.stats.deferred.load(Ordering::Relaxed);
            s.switches += h.stats.switches.load(Ordering::Relaxed);
            let n = (h.sample_count.load(Ordering::Relaxed) as usize).min(hart::SAMPLES);
            for row in &h.samples[..n] {
                s.delivery_ns.push(row[0].load(Ordering::Relaxed));
                s.sigreturn_ns.push(row[1].load(Ordering::Relaxed));
                s.user_ns.push(row[2].load(Ordering::Relaxed));
            }
        }
        s.adapt_ns = self.shared.adapt.latencies();
        s
    }
}

/// A scheduler dropped a runnable thread: it no longer counts as live.
pub(crate) fn thread_abandoned() {
    if let Some(h) = hart::current() {
        h.shared().thread_finished();
    }
}

/// Creates a thread from inside a running Pulse thread and hands it to the scheduler.
pub fn spawn(
    opts: crate::ThreadOptions,
    f: impl FnOnce() + Send + 'static,
) -> Result<u64, PulseError> {
    let t = crate::thread_api::build(opts, Entry::Rust(Box::new(f)))?;
    // SAFETY: only touches this kernel thread's hart.
    let h = unsafe { crate::arch::pulse_ticks_off().as_ref() };
    let Some(h) = h else {
        // SAFETY: t is new and ours; nobody runs it.
        unsafe { PulseThread::free(t) };
        return Err(PulseError::Config(
            "tess_pulse::spawn is for Pulse threads; use Pulse::spawn before run".into(),
        ));
    };
    let shared = h.shared();
    shared.thread_started();
    // SAFETY: t is new.
    let id = unsafe { (*t).id };
    let preempt = shared.make_runnable(t);
    hart::ticks_on();
    if preempt {
        hart::yield_now();
    }
    Ok(id)
}

/// Sleeps the calling Pulse thread for `d` without blocking its hart (other threads run).
/// Outside Pulse it is `std::thread::sleep`.
pub fn sleep(d: Duration) {
    sleep_until_ns(now_ns().saturating_add(clock::ns(d)));
}

/// Sleeps the calling Pulse thread until `at_ns` of `CLOCK_MONOTONIC` (see [`sleep`]).
/// Precision: the wake-up is noticed at the next tick or idle point of any hart.
pub fn sleep_until_ns(at_ns: u64) {
    // SAFETY: only touches this kernel thread's hart.
    let h = unsafe { crate::arch::pulse_ticks_off().as_ref() };
    let Some(h) = h else {
        let now = now_ns();
        if at_ns > now {
            std::thread::sleep(Duration::from_nanos(at_ns - now));
        }
        return;
    };
    let shared = h.shared();
    if !shared.callbacks.wakes() {
        // The scheduler cannot take blocked threads back: wait by yielding.
        hart::ticks_on();
        while now_ns() < at_ns {
            hart::yield_now();
        }
        return;
    }
    let t = h.current.load(Ordering::Relaxed);
    if t.is_null() || now_ns() >= at_ns {
        hart::ticks_on();
        return;
    }
    shared.sleep_until(h, t, at_ns);
}
