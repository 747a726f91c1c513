//! Real-time setup shared by the programs that run in cells (the music host, the network
//! service, load generators): pinning, scheduling policy, and the signals that stop a run or
//! ask for its statistics. It lives here, below every service and application, so that a
//! service (`tess-net`) need not depend on an application (`tess-music`) for it.
//!
//! Signal handlers only store to atomics (async-signal-safe); the threads that care poll them.

use crate::{affinity, attr, HartSet, Policy};
use std::sync::atomic::{AtomicBool, Ordering};

/// Set by SIGINT or SIGTERM.
pub static STOP: AtomicBool = AtomicBool::new(false);
/// Set by SIGUSR1 (cleared by whoever prints the statistics).
pub static REPORT: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

extern "C" fn on_report(_: libc::c_int) {
    REPORT.store(true, Ordering::Relaxed);
}

/// Installs SIGINT/SIGTERM -> [`STOP`] and SIGUSR1 -> [`REPORT`].
pub fn install_signal_handlers() -> std::io::Result<()> {
    let handlers: [(libc::c_int, extern "C" fn(libc::c_int)); 3] = [
        (libc::SIGINT, on_stop),
        (libc::SIGTERM, on_stop),
        (libc::SIGUSR1, on_report),
    ];
    for (sig, handler) in handlers {
        // SAFETY: sigaction is plain old data; all-zero is an empty mask and no flags.
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = handler as usize;
        // SAFETY: `sa` is initialised; the handler only stores to an atomic, which is
        // async-signal-safe.
        let rc = unsafe { libc::sigaction(sig, &sa, std::ptr::null_mut()) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Error applying a placement.
#[derive(Debug, thiserror::Error)]
pub enum PlacementError {
    /// Pinning failed (EINVAL: the hart is outside the cpuset of this process's cgroup).
    #[error("cannot pin thread to hart {hart} (this thread may use harts {allowed}): {source}")]
    Affinity {
        /// The hart.
        hart: usize,
        /// The harts the thread was allowed before the attempt.
        allowed: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The policy could not be set.
    #[error("cannot run thread as {policy:?}: {source}")]
    Policy {
        /// The policy.
        policy: Policy,
        /// Cause.
        #[source]
        source: crate::SchedError,
    },
}

/// Pins the calling thread to `hart` (if any) and sets `policy` (if any).
pub fn place_current_thread(
    hart: Option<usize>,
    policy: Option<Policy>,
) -> Result<(), PlacementError> {
    if let Some(h) = hart {
        affinity::set_affinity(0, &HartSet::single(h)).map_err(|source| {
            PlacementError::Affinity {
                hart: h,
                allowed: affinity::get_affinity(0)
                    .map_or_else(|e| format!("unknown ({e})"), |s| s.to_string()),
                source,
            }
        })?;
    }
    if let Some(p) = policy {
        attr::set_policy(0, p, 0).map_err(|source| PlacementError::Policy { policy: p, source })?;
    }
    Ok(())
}

/// Parses a comma/range hart list (`1`, `1,2`, `0-3`) into an ordered list.
pub fn parse_harts(s: &str) -> Result<Vec<usize>, crate::ParseHartSetError> {
    // HartSet sorts; keep the user's order so that the first listed hart is the
    // communication hart even in `2,1`.
    let mut out = Vec::new();
    for part in s.split(',') {
        let set: HartSet = part.parse()?;
        out.extend(set.iter());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hart_lists_keep_their_order() {
        assert_eq!(parse_harts("2,1").unwrap(), vec![2, 1]);
        assert_eq!(parse_harts("0-2,5").unwrap(), vec![0, 1, 2, 5]);
        assert!(parse_harts("x").is_err());
    }
}
