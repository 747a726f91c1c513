//! Reports instead of silent failure: stack overflow (on the alternate signal stack, naming
//! the thread), a scheduler callback that panics, one that never returns (the watchdog), and a
//! thread that panics.
//!
//! Reports are formatted into a stack buffer with `core::fmt` (no allocation, no lock) and
//! written with `write(2)`, so they are safe from a signal handler.

use crate::hart::HartState;
use std::fmt::Write as _;
use std::sync::atomic::Ordering;

/// Size of each hart's alternate signal stack.
const ALT_STACK: usize = 64 * 1024;

/// A fixed buffer that formats without allocating.
struct Msg {
    buf: [u8; 512],
    len: usize,
}

impl Msg {
    fn new() -> Msg {
        Msg {
            buf: [0; 512],
            len: 0,
        }
    }

    fn emit(&self) {
        // SAFETY: write(2) on stderr with a valid buffer is async-signal-safe.
        unsafe { libc::write(2, self.buf.as_ptr().cast(), self.len) };
    }
}

impl std::fmt::Write for Msg {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let n = s.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

/// The calling kernel thread's alternate signal stack; on drop the one it replaced (Rust's
/// own guard-page stack, or none) is put back, so a thread that served as a hart (in a cell,
/// the thread that called `Pulse::run`) keeps its stack-overflow report afterwards.
#[derive(Debug)]
pub(crate) struct AltStack {
    stack: crate::stack::Stack,
    previous: libc::stack_t,
}

impl AltStack {
    pub(crate) fn install() -> std::io::Result<AltStack> {
        let stack = crate::stack::Stack::map(ALT_STACK)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let ss = libc::stack_t {
            ss_sp: (stack.top() as usize - stack.usable()) as *mut libc::c_void,
            ss_flags: 0,
            ss_size: stack.usable(),
        };
        // SAFETY: a zeroed stack_t is valid; sigaltstack fills it.
        let mut previous: libc::stack_t = unsafe { std::mem::zeroed() };
        // SAFETY: ss describes memory we own for as long as the AltStack lives; previous is a
        // valid out-buffer.
        if unsafe { libc::sigaltstack(&ss, &mut previous) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(AltStack { stack, previous })
    }
}

impl Drop for AltStack {
    fn drop(&mut self) {
        let mut restore = self.previous;
        if restore.ss_flags & libc::SS_DISABLE != 0 || restore.ss_sp.is_null() {
            restore = libc::stack_t {
                ss_sp: std::ptr::null_mut(),
                ss_flags: libc::SS_DISABLE,
                ss_size: 0,
            };
        } else {
            // SS_ONSTACK is reported, never set.
            restore.ss_flags = 0;
        }
        // SAFETY: replacing this thread's alternate stack (ours) by the one it had before,
        // which its owner keeps mapped for the thread's life, before our memory is unmapped.
        unsafe { libc::sigaltstack(&restore, std::ptr::null_mut()) };
        let _ = &self.stack;
    }
}

/// SIGSEGV/SIGBUS handler: names the thread whose guard page was hit, then lets the default
/// action (core dump) happen by restoring it and returning to the faulting instruction.
pub(crate) extern "C" fn on_segv(
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    _uc: *mut libc::c_void,
) {
    // SAFETY: the kernel passes a valid siginfo_t for SIGSEGV.
    let addr = unsafe { (*info).si_addr() } as usize;
    let mut m = Msg::new();
    match crate::hart::current() {
        Some(h) => {
            let t = h.current.load(Ordering::Relaxed);
            // SAFETY: the running thread of this hart is live.
            let thread = unsafe { t.as_ref() };
            match thread {
                Some(t) if t.guard_range().is_some_and(|g| g.contains(&addr)) => {
                    let name = std::str::from_utf8(t.name_bytes()).unwrap_or("?");
                    let _ = writeln!(
                        m,
                        "tess-pulse: stack overflow: thread '{name}' (id {}) on vhart {} hit its guard page at {addr:#x}",
                        t.id, h.vhart
                    );
                }
                _ if h.sched_guard().contains(&addr) => {
                    let _ = writeln!(
                        m,
                        "tess-pulse: stack overflow: the scheduler context of vhart {} hit its guard page at {addr:#x}",
                        h.vhart
                    );
                }
                Some(t) => {
                    let name = std::str::from_utf8(t.name_bytes()).unwrap_or("?");
                    let _ = writeln!(
                        m,
                        "tess-pulse: signal {sig} at {addr:#x} in thread '{name}' (id {}) on vhart {}",
                        t.id, h.vhart
                    );
                }
                None => {
                    let _ = writeln!(
                        m,
                        "tess-pulse: signal {sig} at {addr:#x} in the scheduler context of vhart {}",
                        h.vhart
                    );
                }
            }
        }
        None => {
            let _ = writeln!(m, "tess-pulse: signal {sig} at {addr:#x} outside Pulse");
        }
    }
    m.emit();
    // SAFETY: resetting to the default action is async-signal-safe; returning re-executes the
    // faulting access, which now kills the process with the original signal.
    unsafe { libc::signal(sig, libc::SIG_DFL) };
}

/// Called from the tick handler: reports once when a scheduler callback has been running
/// longer than the watchdog allows (it never returned and never restored a thread).
pub(crate) fn watchdog(h: &HartState) {
    let since = h.sched_since_tick.load(Ordering::Relaxed);
    let period = h.period_ns.max(1);
    let limit_ticks = h.shared().watchdog_ns / period;
    let ticks = (h.stats.fired.load(Ordering::Relaxed) + 1).saturating_sub(since);
    if since == 0 || limit_ticks == 0 || ticks < limit_ticks {
        h.watchdog_reported.store(false, Ordering::Relaxed);
        return;
    }
    if h.watchdog_reported.swap(true, Ordering::Relaxed) {
        return;
    }
    let mut m = Msg::new();
    let _ = writeln!(
        m,
        "tess-pulse: the scheduler callback on vhart {} has run for {} ms without returning or restoring a thread (scheduler code must not block or spin; call pulse_sched_ctx_done)",
        h.vhart,
        ticks * period / 1_000_000
    );
    m.emit();
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> &str {
    p.downcast_ref::<&str>()
        .copied()
        .or_else(|| p.downcast_ref::<String>().map(|s| s.as_str()))
        .unwrap_or("(non-string panic)")
}

/// A scheduler callback panicked: report and abort.
pub(crate) fn scheduler_panicked(name: &str, vhart: usize, p: &(dyn std::any::Any + Send)) -> ! {
    eprintln!(
        "tess-pulse: scheduler callback `{name}` panicked on vhart {vhart}: {}; aborting (the scheduler's state is unknown)",
        panic_text(p)
    );
    std::process::abort()
}

/// A Pulse thread's function panicked: report; the thread ends as if it returned.
pub(crate) fn report_thread_panic(
    t: *mut crate::thread::PulseThread,
    p: &(dyn std::any::Any + Send),
) {
    // SAFETY: t is the running thread.
    let (id, name) = unsafe { ((*t).id, (*t).name().to_string()) };
    // Ticks off while stderr's lock is held: a thread preempted inside it would let the next
    // thread on this kernel thread re-enter the (re-entrant, per kernel thread) lock.
    // SAFETY: only touches this kernel thread's hart.
    unsafe { crate::arch::pulse_ticks_off() };
    eprintln!(
        "tess-pulse: thread '{name}' (id {id}) panicked: {}",
        panic_text(p)
    );
    crate::hart::ticks_on();
}
