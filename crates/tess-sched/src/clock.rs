//! `CLOCK_MONOTONIC` time and absolute-time sleeps.
//!
//! Every time-triggered window in tess is placed on one grid: window `k` of a cell with period
//! `P` and offset `O` starts at `k * P + O` nanoseconds of `CLOCK_MONOTONIC`. Using one clock for
//! the daemon, the runtime and the benchmarks is what lets harts agree on "now" without talking.

use std::time::Duration;

/// Reads `clock` in nanoseconds.
#[inline]
fn read_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clocks read here always exist.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Nanoseconds of `CLOCK_MONOTONIC`.
#[inline]
pub fn now_ns() -> u64 {
    read_ns(libc::CLOCK_MONOTONIC)
}

/// Nanoseconds of `CLOCK_REALTIME` (the clock of kernel receive timestamps, `SO_TIMESTAMPNS`).
#[inline]
pub fn realtime_ns() -> u64 {
    read_ns(libc::CLOCK_REALTIME)
}

/// The kernel's receive timestamp of a datagram (`SO_TIMESTAMPNS`: an `SCM_TIMESTAMPNS` control
/// message, `CLOCK_REALTIME` ns), found in the control buffer of `msg`; `None` if absent.
/// Allocation-free, for receive paths that must not allocate.
///
/// # Safety
/// `msg` must have been filled by a successful `recvmsg` or `recvmmsg`, and its control buffer
/// (`msg_control`, `msg_controllen`) must still be alive.
pub unsafe fn rx_timestamp_ns(msg: &libc::msghdr) -> Option<u64> {
    let mut stamp = None;
    // SAFETY: by the caller's contract the CMSG macros walk a control buffer the kernel filled,
    // within `msg_controllen`; an SCM_TIMESTAMPNS payload is a timespec (read unaligned).
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                let ts = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::timespec);
                stamp = Some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64);
            }
            c = libc::CMSG_NXTHDR(msg, c);
        }
    }
    stamp
}

/// CPU time the calling thread has consumed, ns (`CLOCK_THREAD_CPUTIME_ID`: the scheduler's
/// runtime of the thread, which excludes time the hart spent elsewhere, on interrupts when the
/// kernel accounts them, or stolen by a hypervisor).
#[inline]
pub fn thread_cpu_ns() -> u64 {
    read_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// Sleeps until `CLOCK_MONOTONIC` reaches `deadline_ns` (`clock_nanosleep` with
/// `TIMER_ABSTIME`), retrying after signals. Returns immediately if the time has passed.
pub fn sleep_until_ns(deadline_ns: u64) {
    let ts = libc::timespec {
        tv_sec: (deadline_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (deadline_ns % 1_000_000_000) as libc::c_long,
    };
    loop {
        // SAFETY: `ts` is a valid timespec; the remaining-time pointer may be null with
        // TIMER_ABSTIME.
        let rc = unsafe {
            libc::clock_nanosleep(
                libc::CLOCK_MONOTONIC,
                libc::TIMER_ABSTIME,
                &ts,
                std::ptr::null_mut(),
            )
        };
        if rc != libc::EINTR {
            return;
        }
    }
}

/// Busy-waits until `CLOCK_MONOTONIC` reaches `deadline_ns`; returns the time observed when it
/// did. Precise to the cost of one `clock_gettime` (tens of nanoseconds via the vDSO).
#[inline]
pub fn spin_until_ns(deadline_ns: u64) -> u64 {
    loop {
        let now = now_ns();
        if now >= deadline_ns {
            return now;
        }
        std::hint::spin_loop();
    }
}

/// Converts a duration to nanoseconds, saturating.
pub fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The first instant on the grid `k * period + offset` that is at or after `now_ns`.
pub fn next_grid_point(now_ns: u64, period_ns: u64, offset_ns: u64) -> u64 {
    assert!(period_ns > 0, "period must be positive");
    let offset = offset_ns % period_ns;
    if now_ns <= offset {
        return offset;
    }
    let k = (now_ns - offset).div_ceil(period_ns);
    k * period_ns + offset
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_points() {
        assert_eq!(next_grid_point(0, 10, 3), 3);
        assert_eq!(next_grid_point(3, 10, 3), 3);
        assert_eq!(next_grid_point(4, 10, 3), 13);
        assert_eq!(next_grid_point(25, 10, 13), 33);
    }

    #[test]
    fn absolute_sleep_does_not_return_early() {
        let t0 = now_ns();
        sleep_until_ns(t0 + 2_000_000);
        assert!(now_ns() >= t0 + 2_000_000);
        let t1 = now_ns();
        assert!(spin_until_ns(t1 + 10_000) >= t1 + 10_000);
    }
}
