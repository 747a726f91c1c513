//! Linux scheduling primitives used by every part of tess.
//!
//! - [`HartSet`]: a set of hardware threads (harts), parsed from and printed in the kernel's list
//!   format (`0-3,8`), as used by `cpuset.cpus` and `/proc/irq/*/smp_affinity_list`.
//! - [`attr`]: `sched_setattr(2)` / `sched_getattr(2)` for `SCHED_DEADLINE`, `SCHED_FIFO` and
//!   `SCHED_OTHER`, with the flags tess needs (`SCHED_FLAG_RESET_ON_FORK`).
//! - [`affinity`]: per-thread CPU affinity.
//! - [`clock`]: `CLOCK_MONOTONIC` time in nanoseconds and absolute-time sleeps, the common time
//!   grid on which time-triggered windows are laid out.
//! - [`proc`]: threads of a process, from `/proc`.
//! - [`rt`]: real-time setup of a program's threads (pinning, policy, stop/report signals).
#![warn(missing_docs)]

pub mod affinity;
pub mod attr;
pub mod clock;
mod hartset;
pub mod proc;
pub mod rt;

pub use attr::{Policy, SchedError};
pub use hartset::{HartSet, ParseHartSetError};

/// Number of harts the kernel reports as configured (online or not), the upper bound on hart ids.
pub fn configured_harts() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
    if n < 1 {
        1
    } else {
        n as usize
    }
}

/// The harts that are online now, read from `/sys/devices/system/cpu/online`.
pub fn online_harts() -> std::io::Result<HartSet> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online")?;
    text.trim()
        .parse()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// The id of the hart the calling thread runs on right now.
pub fn current_hart() -> usize {
    // SAFETY: sched_getcpu has no preconditions.
    let c = unsafe { libc::sched_getcpu() };
    c.max(0) as usize
}

/// The kernel thread id of the calling thread.
pub fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions and cannot fail.
    unsafe { libc::gettid() }
}

/// Locks all current and future pages in memory (`mlockall(MCL_CURRENT|MCL_FUTURE)`), so that a
/// real-time thread never takes a major page fault.
pub fn lock_memory() -> std::io::Result<()> {
    // SAFETY: mlockall takes flags only.
    let rc = unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
