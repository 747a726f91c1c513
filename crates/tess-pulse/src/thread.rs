//! User-level threads: a stack, a saved context, a name, and the attributes schedulers read.
//!
//! A [`Thread`] is the owning handle of a runnable (not running) thread: whoever holds it (a
//! scheduler's queue, a lock's wait list, the sleep list) is the only one that may resume it.
//! Pulse hands it to the scheduler (`tick`, `yield`, `wake`, `adapt`) and takes it back when the
//! scheduler returns it to run.

use crate::arch;
use crate::stack::{Stack, StackError, POOL};
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicU8, Ordering};
use std::time::Duration;

/// A saved application context (the paper's `ctx`): where a suspended thread resumes, and which
/// thread it is. It may be copied (`pulse_ctx_copy`); a copy may be resumed once, in place of
/// the original.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PulseCtx {
    /// Stack pointer of the suspended context (opaque).
    pub sp: *mut u8,
    /// The thread this context belongs to.
    pub thread: *mut PulseThread,
}

/// What runs when a fresh thread starts.
pub(crate) enum Entry {
    Rust(Box<dyn FnOnce() + Send + 'static>),
    C(extern "C" fn(*mut libc::c_void), *mut libc::c_void),
    Started,
}

/// Lifecycle of a thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ThreadState {
    /// Allocated, no entry function yet.
    Allocated = 0,
    /// Can run.
    Runnable = 1,
    /// Blocked on a Pulse lock or asleep.
    Blocked = 2,
    /// Finished.
    Done = 3,
}

/// No deadline.
pub const NO_DEADLINE: u64 = u64::MAX;

/// A user-level thread (C: `pulse_thread_t`, opaque).
pub struct PulseThread {
    /// The saved context; Pulse saves into it whenever the thread stops running.
    pub(crate) ctx: PulseCtx,
    pub(crate) stack: Option<Stack>,
    pub(crate) entry: Entry,
    pub(crate) id: u64,
    name: [u8; 32],
    name_len: u8,
    pub(crate) state: AtomicU8,
    /// Relative deadline (EDF), ns; `NO_DEADLINE` if none.
    pub(crate) rel_deadline_ns: AtomicU64,
    /// Period (EDF), ns; 0 if aperiodic.
    pub(crate) period_ns: AtomicU64,
    /// Absolute deadline of the current job (EDF), ns of CLOCK_MONOTONIC.
    pub(crate) abs_deadline_ns: AtomicU64,
    /// Release time of the current job, ns of CLOCK_MONOTONIC.
    pub(crate) release_ns: AtomicU64,
    /// Deadline inherited from threads waiting on locks this thread holds (priority
    /// inheritance); `NO_DEADLINE` if none.
    pub(crate) inherited_ns: AtomicU64,
    /// The Pulse lock this thread waits for, if blocked on one.
    pub(crate) waiting_on: AtomicPtr<crate::lock::RawLock>,
    /// Next in a lock's wait list or the sleep list (intrusive, so blocking never allocates).
    pub(crate) next: *mut PulseThread,
    /// Wake-up time when asleep.
    pub(crate) wake_at_ns: u64,
    /// Locks held (for recomputing inheritance on release); only the thread itself edits it.
    pub(crate) held: [*const crate::lock::RawLock; 8],
    /// Scheduler-private word (C schedulers may use it freely).
    pub user: *mut libc::c_void,
}

// SAFETY: a PulseThread moves between harts (kernel threads) by design; the raw pointers it holds
// are to its own stack, to locks (which are Sync) and to other threads in intrusive lists, each
// list guarded by its owner's lock.
unsafe impl Send for PulseThread {}

impl fmt::Debug for PulseThread {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PulseThread")
            .field("id", &self.id)
            .field("name", &self.name())
            .field("state", &self.state())
            .finish_non_exhaustive()
    }
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl PulseThread {
    /// Allocates a thread with a stack of `stack_size` bytes (the paper's `pulse_thread_alloc`):
    /// from the stack pool when one is free, so without a system call.
    pub(crate) fn alloc(stack_size: usize) -> Result<NonNull<PulseThread>, StackError> {
        let stack = POOL.take(stack_size)?;
        let t = Box::new(PulseThread {
            ctx: PulseCtx {
                sp: std::ptr::null_mut(),
                thread: std::ptr::null_mut(),
            },
            stack: Some(stack),
            entry: Entry::Started,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            name: [0; 32],
            name_len: 0,
            state: AtomicU8::new(ThreadState::Allocated as u8),
            rel_deadline_ns: AtomicU64::new(NO_DEADLINE),
            period_ns: AtomicU64::new(0),
            abs_deadline_ns: AtomicU64::new(NO_DEADLINE),
            release_ns: AtomicU64::new(0),
            inherited_ns: AtomicU64::new(NO_DEADLINE),
            waiting_on: AtomicPtr::new(std::ptr::null_mut()),
            next: std::ptr::null_mut(),
            wake_at_ns: 0,
            held: [std::ptr::null(); 8],
            user: std::ptr::null_mut(),
        });
        let p = NonNull::from(Box::leak(t));
        // SAFETY: p was just leaked from a Box and is exclusively ours.
        unsafe { (*p.as_ptr()).ctx.thread = p.as_ptr() };
        Ok(p)
    }

    /// Prepares the thread to start at `entry` when first resumed (`pulse_ctx_make`).
    pub(crate) fn make(&mut self, entry: Entry) {
        let top = self
            .stack
            .as_ref()
            .expect("an allocated thread has a stack")
            .top();
        self.entry = entry;
        // SAFETY: the stack is this thread's and nothing runs on it (it is not started);
        // thread_main never returns (it ends in `exit_current`).
        self.ctx.sp = unsafe { arch::make_context(top, thread_main, self as *mut _ as usize, 0) };
        self.ctx.thread = self as *mut _;
        self.state
            .store(ThreadState::Runnable as u8, Ordering::Release);
    }

    /// Sets the name (at most 31 bytes are kept) used in reports.
    pub fn set_name(&mut self, name: &str) {
        let b = name.as_bytes();
        let n = b.len().min(31);
        self.name[..n].copy_from_slice(&b[..n]);
        self.name_len = n as u8;
    }

    /// The name given at creation (empty if none).
    pub fn name(&self) -> &str {
        std::str::from_utf8(&self.name[..self.name_len as usize]).unwrap_or("?")
    }

    pub(crate) fn name_bytes(&self) -> &[u8] {
        &self.name[..self.name_len as usize]
    }

    /// Unique id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Lifecycle state.
    pub fn state(&self) -> ThreadState {
        match self.state.load(Ordering::Acquire) {
            0 => ThreadState::Allocated,
            1 => ThreadState::Runnable,
            2 => ThreadState::Blocked,
            _ => ThreadState::Done,
        }
    }

    /// The deadline EDF orders by: the job's own, or an earlier one inherited through a lock.
    pub fn effective_deadline_ns(&self) -> u64 {
        self.abs_deadline_ns
            .load(Ordering::Acquire)
            .min(self.inherited_ns.load(Ordering::Acquire))
    }

    /// The absolute deadline of the current job (without inheritance).
    pub fn deadline_ns(&self) -> u64 {
        self.abs_deadline_ns.load(Ordering::Acquire)
    }

    /// Sets period and relative deadline (EDF); the current job's deadline becomes its release
    /// plus `deadline`.
    pub fn set_timing(&self, period: Duration, deadline: Duration) {
        let d = crate::clock::ns(deadline);
        self.period_ns
            .store(crate::clock::ns(period), Ordering::Release);
        self.rel_deadline_ns.store(d, Ordering::Release);
        let mut release = self.release_ns.load(Ordering::Acquire);
        if release == 0 {
            release = crate::clock::now_ns();
            self.release_ns.store(release, Ordering::Release);
        }
        self.abs_deadline_ns
            .store(release.saturating_add(d), Ordering::Release);
    }

    /// The guard page of this thread's stack.
    pub(crate) fn guard_range(&self) -> Option<std::ops::Range<usize>> {
        self.stack.as_ref().map(|s| s.guard_range())
    }

    /// Frees the thread and returns its stack to the pool (`pulse_thread_free`).
    ///
    /// # Safety
    /// `p` came from [`PulseThread::alloc`], is not running and is referenced from nowhere else.
    pub(crate) unsafe fn free(p: *mut PulseThread) {
        // SAFETY: the caller passes ownership of the leaked Box back.
        let mut t = unsafe { Box::from_raw(p) };
        if let Some(s) = t.stack.take() {
            POOL.give(s);
        }
        drop(t);
    }
}

/// First code of every thread, on its own stack.
unsafe extern "C" fn thread_main(this: usize, _: usize) -> ! {
    // A fresh thread is entered from `restore` with ticks on.
    let t = this as *mut PulseThread;
    // SAFETY: `t` is the running thread (Pulse only resumes live threads) and only the running
    // thread touches its entry.
    let entry = unsafe { std::mem::replace(&mut (*t).entry, Entry::Started) };
    match entry {
        Entry::Rust(f) => {
            if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
                crate::fault::report_thread_panic(t, &p);
            }
        }
        Entry::C(f, arg) => f(arg),
        Entry::Started => {}
    }
    crate::hart::exit_current()
}

/// The owning handle of a runnable thread (module docs).
pub struct Thread(NonNull<PulseThread>);

// SAFETY: see PulseThread; the handle is the unique owner.
unsafe impl Send for Thread {}

impl fmt::Debug for Thread {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.info().fmt(f)
    }
}

impl Thread {
    /// Takes ownership of a raw thread.
    ///
    /// # Safety
    /// `p` is a live thread nobody else owns.
    pub(crate) unsafe fn from_raw(p: *mut PulseThread) -> Thread {
        Thread(NonNull::new(p).expect("a live thread is not null"))
    }

    /// Gives up ownership.
    pub(crate) fn into_raw(self) -> *mut PulseThread {
        let p = self.0.as_ptr();
        std::mem::forget(self);
        p
    }

    /// The thread's attributes (id, name, deadlines).
    pub fn info(&self) -> &PulseThread {
        // SAFETY: we own a live thread.
        unsafe { self.0.as_ref() }
    }
}

impl Drop for Thread {
    /// A scheduler that drops a runnable thread abandons it: its stack is unmapped or pooled
    /// (values on it are leaked, never dropped) and it no longer counts as live.
    fn drop(&mut self) {
        crate::runtime::thread_abandoned();
        // SAFETY: we own it and it is not running (a running thread has no Thread handle).
        unsafe { PulseThread::free(self.0.as_ptr()) };
    }
}
