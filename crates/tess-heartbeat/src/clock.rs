//! `CLOCK_MONOTONIC` in nanoseconds: the vDSO answers without entering the kernel when the
//! clock source allows it (here `tsc`), which is what keeps a beat free of system calls.

/// `CLOCK_MONOTONIC` now, ns.
#[inline(always)]
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec on our stack; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
