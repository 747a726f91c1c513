//! Ticks: a per-hart POSIX timer that signals the hart's own kernel thread, and the handler
//! that turns a tick into a user-level preemption (seed 004 section 4.3).
//!
//! # Linux mechanism
//!
//! Each hart's kernel thread creates a `CLOCK_MONOTONIC` timer with `timer_create` and
//! `SIGEV_THREAD_ID` (the expiry is delivered to that thread, not to the process), armed
//! periodically at the cell's tick period. The signal is a real-time signal
//! ([`tick_signal`]) handled on the hart's alternate signal stack.
//!
//! # The handler (async-signal safety)
//!
//! The handler only reads the clock (vDSO), loads and stores atomics in the hart's own
//! [`HartState`], and edits the interrupted `ucontext`; it takes no lock, allocates nothing
//! and calls no non-reentrant function (the one system call it may make, `timer_settime`, is
//! async-signal-safe). It preempts only if
//!
//! - the hart's TICKS_ENABLED word is set (an application thread runs; scheduler code and
//!   Pulse calls run with it clear), and
//! - the interrupted instruction is not in Pulse's assembly (`arch.rs`, made atomic that way),
//!   and
//! - the interrupted instruction is not in the C library, the dynamic loader or libgcc:
//!   a thread preempted inside `malloc` would leave that kernel thread's malloc state (its
//!   tcache, an arena lock) half-updated for the next thread on the hart, and the scheduler
//!   itself may allocate. Such a tick is *deferred*: the timer is re-armed to fire again in
//!   [`RETRY_NS`], until the thread is back in its own code.
//!
//! Otherwise it marks the tick pending (delivered when a Pulse call turns ticks back on) and
//! returns. To preempt, it clears TICKS_ENABLED and redirects the saved context: it pushes the
//! interrupted `rip` below the interrupted stack's red zone and sets `rip` to the trampoline
//! (`pulse_preempt_entry`). When the handler returns, `rt_sigreturn` "resumes" the thread in
//! the trampoline, which saves every register and the extended state on the thread's stack and
//! switches to the hart's scheduler context, where `tick(ctx)` runs as ordinary code, not in
//! a signal handler. Resuming the thread later unwinds the trampoline (`xrstor`, pops,
//! `ret 128`) back to the interrupted instruction.
//!
//! What a tick costs therefore splits as in the paper's Table 3: kernel delivery (timer
//! expiry to the handler), then `rt_sigreturn` into the trampoline, then the user-level part
//! (save, scheduler, switch to the next thread).

use crate::arch;
use crate::clock::{now_ns, timespec};
use crate::hart::HartState;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::Once;

/// A deferred tick fires again this much later.
pub(crate) const RETRY_NS: u64 = 20_000;

static TICK_SIGNAL: AtomicI32 = AtomicI32::new(0);

/// The real-time signal Pulse uses for ticks (`SIGRTMIN + 5`).
pub fn tick_signal() -> i32 {
    let s = TICK_SIGNAL.load(Ordering::Relaxed);
    if s != 0 {
        return s;
    }
    let s = libc::SIGRTMIN() + 5;
    TICK_SIGNAL.store(s, Ordering::Relaxed);
    s
}

/// Text ranges of libraries whose code is never preempted (module docs).
const MAX_RANGES: usize = 16;
static NO_PREEMPT: [(AtomicUsize, AtomicUsize); MAX_RANGES] =
    [const { (AtomicUsize::new(0), AtomicUsize::new(0)) }; MAX_RANGES];
static NO_PREEMPT_LEN: AtomicUsize = AtomicUsize::new(0);

fn is_unpreemptible_library(name: &[u8]) -> bool {
    let base = name.rsplit(|&b| b == b'/').next().unwrap_or(name);
    [
        &b"libc.so"[..],
        b"ld-linux",
        b"libgcc_s",
        b"libpthread",
        b"libstdc++",
    ]
    .iter()
    .any(|p| base.starts_with(p))
}

unsafe extern "C" fn collect_ranges(
    info: *mut libc::dl_phdr_info,
    _size: libc::size_t,
    _data: *mut libc::c_void,
) -> libc::c_int {
    // SAFETY: the loader passes a valid dl_phdr_info for each object.
    let info = unsafe { &*info };
    if info.dlpi_name.is_null() {
        return 0;
    }
    // SAFETY: dlpi_name is a NUL-terminated string owned by the loader.
    let name = unsafe { std::ffi::CStr::from_ptr(info.dlpi_name) }.to_bytes();
    if !is_unpreemptible_library(name) {
        return 0;
    }
    for i in 0..info.dlpi_phnum as usize {
        // SAFETY: dlpi_phdr has dlpi_phnum entries.
        let ph = unsafe { &*info.dlpi_phdr.add(i) };
        if ph.p_type == libc::PT_LOAD && ph.p_flags & libc::PF_X != 0 {
            let start = info.dlpi_addr as usize + ph.p_vaddr as usize;
            let n = NO_PREEMPT_LEN.load(Ordering::Relaxed);
            if n < MAX_RANGES {
                NO_PREEMPT[n].0.store(start, Ordering::Relaxed);
                NO_PREEMPT[n]
                    .1
                    .store(start + ph.p_memsz as usize, Ordering::Relaxed);
                NO_PREEMPT_LEN.store(n + 1, Ordering::Release);
            }
        }
    }
    0
}

fn in_unpreemptible_library(rip: usize) -> bool {
    let n = NO_PREEMPT_LEN.load(Ordering::Acquire);
    NO_PREEMPT[..n]
        .iter()
        .any(|(s, e)| rip >= s.load(Ordering::Relaxed) && rip < e.load(Ordering::Relaxed))
}

static INSTALL: Once = Once::new();
static INSTALL_ERR: AtomicI32 = AtomicI32::new(0);

/// Installs the tick and fault handlers (once per process) and records the library ranges.
pub(crate) fn install_handlers() -> std::io::Result<()> {
    INSTALL.call_once(|| {
        // SAFETY: dl_iterate_phdr calls collect_ranges synchronously with valid arguments.
        unsafe { libc::dl_iterate_phdr(Some(collect_ranges), std::ptr::null_mut()) };
        // SAFETY: installing handlers with valid sigaction structs; the handlers are
        // async-signal-safe (module docs, fault.rs).
        let r = unsafe {
            install(tick_signal(), on_tick as *const () as usize).and_then(|_| {
                install(libc::SIGSEGV, crate::fault::on_segv as *const () as usize)?;
                install(libc::SIGBUS, crate::fault::on_segv as *const () as usize)
            })
        };
        if let Err(e) = r {
            INSTALL_ERR.store(e.raw_os_error().unwrap_or(libc::EINVAL), Ordering::Relaxed);
        }
    });
    match INSTALL_ERR.load(Ordering::Relaxed) {
        0 => Ok(()),
        e => Err(std::io::Error::from_raw_os_error(e)),
    }
}

/// # Safety
/// `handler` is an `extern "C" fn(c_int, *mut siginfo_t, *mut c_void)` safe to run as a
/// signal handler.
unsafe fn install(sig: i32, handler: usize) -> std::io::Result<()> {
    // SAFETY: zeroed sigaction is valid; we fill the fields we use.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = handler;
    sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
    // SAFETY: sa_mask is a valid sigset_t.
    unsafe { libc::sigemptyset(&mut sa.sa_mask) };
    // SAFETY: valid arguments.
    if unsafe { libc::sigaction(sig, &sa, std::ptr::null_mut()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A hart's timer; deleted on drop.
#[derive(Debug)]
pub(crate) struct HartTimer<'a> {
    id: libc::timer_t,
    armed: &'a std::sync::atomic::AtomicBool,
}

impl<'a> HartTimer<'a> {
    /// Creates the calling kernel thread's timer and arms it at `h.period_ns`.
    pub(crate) fn arm(h: &'a HartState) -> std::io::Result<HartTimer<'a>> {
        // SAFETY: a zeroed sigevent is valid; we fill the fields SIGEV_THREAD_ID reads.
        let mut sev: libc::sigevent = unsafe { std::mem::zeroed() };
        sev.sigev_notify = libc::SIGEV_THREAD_ID;
        sev.sigev_signo = tick_signal();
        // SAFETY: gettid has no preconditions.
        sev.sigev_notify_thread_id = unsafe { libc::gettid() };
        let mut id: libc::timer_t = std::ptr::null_mut();
        // SAFETY: valid pointers to sev and id.
        if unsafe { libc::timer_create(libc::CLOCK_MONOTONIC, &mut sev, &mut id) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        h.timer.store(id, Ordering::Release);
        let first = now_ns() + h.period_ns;
        h.next_expiry_ns.store(first, Ordering::Release);
        if !set_timer(id, first, h.period_ns) {
            let e = std::io::Error::last_os_error();
            // SAFETY: deleting the timer we created.
            unsafe { libc::timer_delete(id) };
            return Err(e);
        }
        h.timer_armed.store(true, Ordering::Release);
        Ok(HartTimer {
            id,
            armed: &h.timer_armed,
        })
    }
}

impl Drop for HartTimer<'_> {
    fn drop(&mut self) {
        // First, so that a late tick signal (a kick) cannot re-arm the id once the kernel may
        // have given it to another hart's timer.
        self.armed.store(false, Ordering::Release);
        // SAFETY: deleting our own timer; after this no tick reaches this kernel thread.
        unsafe { libc::timer_delete(self.id) };
    }
}

/// `h`'s periodic ticks stopped while its hart idles; re-armed, one period from then, when
/// dropped. Made and dropped on `h`'s own kernel thread, in its scheduler context (ticks off).
pub(crate) struct TicksPaused<'a> {
    h: &'a HartState,
    paused: bool,
}

impl<'a> TicksPaused<'a> {
    pub(crate) fn new(h: &'a HartState) -> TicksPaused<'a> {
        // Not `timer.is_null()`: the kernel numbers a process's timers from 0, and glibc's
        // timer_t is that number, so the first timer is a null pointer.
        let paused = h.timer_armed.load(Ordering::Acquire)
            && set_timer(h.timer.load(Ordering::Acquire), 0, 0);
        TicksPaused { h, paused }
    }
}

impl Drop for TicksPaused<'_> {
    fn drop(&mut self) {
        if !self.paused {
            return;
        }
        let at = now_ns() + self.h.period_ns;
        if set_timer(self.h.timer.load(Ordering::Acquire), at, self.h.period_ns) {
            self.h.next_expiry_ns.store(at, Ordering::Relaxed);
        }
    }
}

/// Arms timer `id` to expire at `at_ns` (absolute; 0 disarms), then every `period_ns`.
/// Async-signal-safe.
fn set_timer(id: libc::timer_t, at_ns: u64, period_ns: u64) -> bool {
    let spec = libc::itimerspec {
        it_interval: timespec(period_ns),
        it_value: timespec(at_ns),
    };
    // SAFETY: timer_settime is async-signal-safe; id is a live timer of this process.
    unsafe { libc::timer_settime(id, libc::TIMER_ABSTIME, &spec, std::ptr::null_mut()) == 0 }
}

/// Sends `h` an immediate tick (adaptation), unless its kernel thread is gone.
pub(crate) fn kick(h: &HartState) {
    let tid = h.tid.load(Ordering::Acquire);
    if tid > 0 {
        // SAFETY: tgkill to a thread of our own process with our tick signal, which the
        // handler tolerates at any time.
        unsafe {
            libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, tick_signal());
        }
    }
}

/// Re-arms `h`'s timer to fire after `RETRY_NS`, then periodically again.
fn rearm_soon(h: &HartState, now: u64) {
    if !h.timer_armed.load(Ordering::Acquire) {
        return;
    }
    let at = now + RETRY_NS;
    if set_timer(h.timer.load(Ordering::Acquire), at, h.period_ns) {
        h.next_expiry_ns.store(at, Ordering::Relaxed);
    }
}

/// The tick handler (module docs).
extern "C" fn on_tick(_sig: libc::c_int, info: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    // SAFETY: __errno_location is async-signal-safe; we restore errno before returning.
    let errno = unsafe { *libc::__errno_location() };
    handle_tick(info, uc);
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

fn handle_tick(info: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    let Some(h) = crate::hart::current() else {
        return;
    };
    let now = now_ns();
    // SAFETY: the kernel passes a valid siginfo_t.
    let from_timer = unsafe { (*info).si_code } == libc::SI_TIMER;
    let mut expiry = 0;
    if from_timer {
        h.stats.fired.fetch_add(1, Ordering::Relaxed);
        let e = h.next_expiry_ns.load(Ordering::Relaxed);
        if now >= e && h.period_ns > 0 {
            let k = (now - e) / h.period_ns;
            expiry = e + k * h.period_ns;
            h.next_expiry_ns
                .store(expiry + h.period_ns, Ordering::Relaxed);
        }
    }
    crate::fault::watchdog(h);
    // SAFETY: the kernel passes a valid ucontext_t for SA_SIGINFO handlers.
    let uc = unsafe { &mut *(uc as *mut libc::ucontext_t) };
    let gregs = &mut uc.uc_mcontext.gregs;
    let rip = gregs[libc::REG_RIP as usize] as usize;
    if h.ticks_enabled.load(Ordering::Relaxed) == 0 || arch::in_immune_range(rip) {
        if arch::in_immune_range(rip) {
            arch::note_immune_hit();
        }
        h.tick_pending.store(1, Ordering::Relaxed);
        h.stats.masked.fetch_add(1, Ordering::Relaxed);
        return;
    }
    if in_unpreemptible_library(rip) {
        h.tick_pending.store(1, Ordering::Relaxed);
        h.stats.deferred.fetch_add(1, Ordering::Relaxed);
        rearm_soon(h, now);
        return;
    }
    h.ticks_enabled.store(0, Ordering::Relaxed);
    h.stats.preempted.fetch_add(1, Ordering::Relaxed);
    if expiry != 0 {
        h.tick_expiry_ns.store(expiry, Ordering::Relaxed);
        h.tick_handler_ns.store(now, Ordering::Relaxed);
    } else {
        h.tick_handler_ns.store(0, Ordering::Relaxed);
    }
    let rsp = gregs[libc::REG_RSP as usize] as usize;
    let sp = rsp - 136;
    // SAFETY: the interrupted thread's stack below its red zone is free for it to use (a
    // signal frame would go there without SA_ONSTACK); a write into the guard page faults
    // and is reported as that thread's overflow.
    unsafe { (sp as *mut u64).write(rip as u64) };
    gregs[libc::REG_RSP as usize] = sp as i64;
    gregs[libc::REG_RIP as usize] = arch::preempt_entry() as i64;
}
