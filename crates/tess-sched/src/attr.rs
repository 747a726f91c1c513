//! `sched_setattr(2)` and `sched_getattr(2)`.
//!
//! tess maps cell policies onto the kernel's scheduling classes: time-triggered and
//! event-triggered cells become `SCHED_DEADLINE` reservations (the kernel's EDF + CBS, the same
//! algorithms as Tessellation's muxers), best-effort cells stay `SCHED_OTHER`, and benchmarks use
//! `SCHED_FIFO` for the "best Linux can do" baselines.

use std::time::Duration;

const SCHED_OTHER: u32 = 0;
const SCHED_FIFO: u32 = 1;
const SCHED_RR: u32 = 2;
const SCHED_BATCH: u32 = 3;
const SCHED_IDLE: u32 = 5;
const SCHED_DEADLINE: u32 = 6;

/// Children created by `fork`/`clone` start as `SCHED_OTHER` (required for `SCHED_DEADLINE`
/// tasks to be allowed to fork at all).
pub const FLAG_RESET_ON_FORK: u64 = 0x01;
/// GRUB reclaiming of unused bandwidth by `SCHED_DEADLINE` tasks.
pub const FLAG_RECLAIM: u64 = 0x02;

/// The kernel's `struct sched_attr` (version 1, 56 bytes).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct SchedAttr {
    size: u32,
    sched_policy: u32,
    sched_flags: u64,
    sched_nice: i32,
    sched_priority: u32,
    sched_runtime: u64,
    sched_deadline: u64,
    sched_period: u64,
    sched_util_min: u32,
    sched_util_max: u32,
}

/// A scheduling policy with its parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// `SCHED_OTHER` (CFS/EEVDF) with a nice value.
    Other {
        /// Nice value, -20..=19.
        nice: i32,
    },
    /// `SCHED_BATCH`.
    Batch,
    /// `SCHED_IDLE`.
    Idle,
    /// `SCHED_FIFO` at a priority 1..=99.
    Fifo {
        /// Real-time priority, 1..=99.
        priority: u32,
    },
    /// `SCHED_RR` at a priority 1..=99.
    RoundRobin {
        /// Real-time priority, 1..=99.
        priority: u32,
    },
    /// `SCHED_DEADLINE`: `runtime` of CPU time every `period`, to be received within `deadline`
    /// of each activation (runtime <= deadline <= period).
    Deadline {
        /// Budget per period.
        runtime: Duration,
        /// Relative deadline.
        deadline: Duration,
        /// Reservation period.
        period: Duration,
    },
}

impl Policy {
    /// The default time-sharing policy.
    pub const OTHER: Policy = Policy::Other { nice: 0 };

    /// Whether this is `SCHED_DEADLINE`.
    pub fn is_deadline(&self) -> bool {
        matches!(self, Policy::Deadline { .. })
    }

    /// Short kernel-style name (`SCHED_DEADLINE`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            Policy::Other { .. } => "SCHED_OTHER",
            Policy::Batch => "SCHED_BATCH",
            Policy::Idle => "SCHED_IDLE",
            Policy::Fifo { .. } => "SCHED_FIFO",
            Policy::RoundRobin { .. } => "SCHED_RR",
            Policy::Deadline { .. } => "SCHED_DEADLINE",
        }
    }
}

/// Failure of a scheduling syscall, with the thread and the request that failed.
#[derive(Debug, thiserror::Error)]
pub enum SchedError {
    /// `EBUSY` from `sched_setattr` with `SCHED_DEADLINE`: the kernel's own admission control
    /// refused the bandwidth on this thread's root domain (or freed bandwidth has not yet reached
    /// its 0-lag time).
    #[error("kernel refused {policy:?} for thread {tid}: SCHED_DEADLINE bandwidth exhausted on its root domain")]
    DeadlineBandwidth {
        /// Thread id.
        tid: i32,
        /// What was asked.
        policy: Policy,
    },
    /// `EPERM` for `SCHED_DEADLINE`: the thread's affinity does not cover its whole root domain,
    /// or the caller lacks `CAP_SYS_NICE`.
    #[error("kernel refused {policy:?} for thread {tid}: not permitted (needs CAP_SYS_NICE, and a SCHED_DEADLINE thread's affinity must span its whole root domain)")]
    NotPermitted {
        /// Thread id.
        tid: i32,
        /// What was asked.
        policy: Policy,
    },
    /// The thread does not exist (any more).
    #[error("thread {tid} does not exist")]
    NoSuchThread {
        /// Thread id.
        tid: i32,
    },
    /// Any other error.
    #[error("{call} for thread {tid} failed: {source}")]
    Os {
        /// The syscall.
        call: &'static str,
        /// Thread id.
        tid: i32,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl SchedError {
    /// Whether the thread has exited (callers tracking many threads treat this as benign).
    pub fn is_gone(&self) -> bool {
        matches!(self, SchedError::NoSuchThread { .. })
    }
}

fn dur_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Sets the scheduling policy of thread `tid` (0 = the calling thread) with extra `flags`
/// (for example [`FLAG_RESET_ON_FORK`]).
pub fn set_policy(tid: i32, policy: Policy, flags: u64) -> Result<(), SchedError> {
    let mut attr = SchedAttr {
        size: std::mem::size_of::<SchedAttr>() as u32,
        sched_flags: flags,
        ..Default::default()
    };
    match policy {
        Policy::Other { nice } => {
            attr.sched_policy = SCHED_OTHER;
            attr.sched_nice = nice;
        }
        Policy::Batch => attr.sched_policy = SCHED_BATCH,
        Policy::Idle => attr.sched_policy = SCHED_IDLE,
        Policy::Fifo { priority } => {
            attr.sched_policy = SCHED_FIFO;
            attr.sched_priority = priority;
        }
        Policy::RoundRobin { priority } => {
            attr.sched_policy = SCHED_RR;
            attr.sched_priority = priority;
        }
        Policy::Deadline {
            runtime,
            deadline,
            period,
        } => {
            attr.sched_policy = SCHED_DEADLINE;
            attr.sched_runtime = dur_ns(runtime);
            attr.sched_deadline = dur_ns(deadline);
            attr.sched_period = dur_ns(period);
        }
    }
    // SAFETY: `attr` is a fully initialised `struct sched_attr` whose `size` field tells the
    // kernel how many bytes it may read; the pointer is valid for the duration of the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_sched_setattr,
            tid,
            &attr as *const SchedAttr,
            0u32,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    Err(match err.raw_os_error() {
        Some(libc::ESRCH) => SchedError::NoSuchThread { tid },
        Some(libc::EBUSY) if policy.is_deadline() => SchedError::DeadlineBandwidth { tid, policy },
        Some(libc::EPERM) => SchedError::NotPermitted { tid, policy },
        _ => SchedError::Os {
            call: "sched_setattr",
            tid,
            source: err,
        },
    })
}

/// Reads the scheduling policy of thread `tid` (0 = the calling thread) and its flags.
pub fn get_policy(tid: i32) -> Result<(Policy, u64), SchedError> {
    let mut attr = SchedAttr::default();
    // SAFETY: the kernel writes at most `size` (third argument) bytes into `attr`, which is a
    // properly aligned, writable `struct sched_attr` of exactly that size.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_sched_getattr,
            tid,
            &mut attr as *mut SchedAttr,
            std::mem::size_of::<SchedAttr>() as u32,
            0u32,
        )
    };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        return Err(match err.raw_os_error() {
            Some(libc::ESRCH) => SchedError::NoSuchThread { tid },
            _ => SchedError::Os {
                call: "sched_getattr",
                tid,
                source: err,
            },
        });
    }
    let policy = match attr.sched_policy {
        SCHED_FIFO => Policy::Fifo {
            priority: attr.sched_priority,
        },
        SCHED_RR => Policy::RoundRobin {
            priority: attr.sched_priority,
        },
        SCHED_BATCH => Policy::Batch,
        SCHED_IDLE => Policy::Idle,
        SCHED_DEADLINE => Policy::Deadline {
            runtime: Duration::from_nanos(attr.sched_runtime),
            deadline: Duration::from_nanos(attr.sched_deadline),
            period: Duration::from_nanos(attr.sched_period),
        },
        _ => Policy::Other {
            nice: attr.sched_nice,
        },
    };
    Ok((policy, attr.sched_flags))
}

/// Yields the CPU. For a `SCHED_DEADLINE` thread this gives up the rest of the current budget
/// and sleeps until the next period.
pub fn yield_now() {
    // SAFETY: sched_yield has no preconditions.
    unsafe {
        libc::sched_yield();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_policy() {
        let (p, _) = get_policy(0).unwrap();
        // Test runners may run under any policy; reading must simply work and be consistent.
        assert!(!p.name().is_empty());
    }

    #[test]
    fn missing_thread_is_reported_as_gone() {
        // pid_max is at most 2^22, so this id cannot exist.
        let err = set_policy(1 << 23, Policy::OTHER, 0).unwrap_err();
        assert!(err.is_gone(), "{err}");
    }
}
