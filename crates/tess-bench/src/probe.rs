//! The noise floor: how late a `SCHED_FIFO` 99 thread wakes from an absolute-time sleep on an
//! otherwise idle hart.
//!
//! This is the best any Linux scheduling arrangement can do on this machine; on a virtual machine
//! it also exposes the hypervisor's own latency spikes. Every latency benchmark prints it from
//! the same run so that its figures can be read against it.

use crate::Summary;
use std::time::Duration;
use tess_sched::{affinity, attr, clock, HartSet, Policy};

/// Result of a wake-up latency probe.
#[derive(Debug, Clone, serde::Serialize)]
pub struct WakeupProbe {
    /// Hart the probe ran on.
    pub hart: usize,
    /// Policy the probe ran under (`SCHED_FIFO` 99 for the noise floor).
    pub policy: String,
    /// Lateness of each wake-up, in microseconds.
    #[serde(skip)]
    pub samples_us: Vec<f64>,
    /// Summary of `samples_us`.
    pub summary_us: Summary,
}

/// Error running a probe.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The policy could not be set (needs root / CAP_SYS_NICE).
    #[error("cannot run the probe as {policy}: {source}")]
    Policy {
        /// Policy name.
        policy: &'static str,
        /// Cause.
        #[source]
        source: tess_sched::SchedError,
    },
    /// Pinning failed.
    #[error("cannot pin the probe to hart {hart}: {source}")]
    Affinity {
        /// Target hart.
        hart: usize,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// Measures wake-up lateness of a thread pinned to `hart` running `policy`, waking every
/// `period` for `samples` wake-ups, on a fresh thread (so the caller's scheduling is untouched).
pub fn wakeup_latency(
    hart: usize,
    policy: Policy,
    period: Duration,
    samples: usize,
) -> Result<WakeupProbe, ProbeError> {
    let handle = std::thread::spawn(move || -> Result<WakeupProbe, ProbeError> {
        affinity::set_affinity(0, &HartSet::single(hart))
            .map_err(|source| ProbeError::Affinity { hart, source })?;
        attr::set_policy(0, policy, 0).map_err(|source| ProbeError::Policy {
            policy: policy.name(),
            source,
        })?;
        let period_ns = clock::ns(period);
        let mut out = Vec::with_capacity(samples);
        let mut next = clock::now_ns() + period_ns;
        for _ in 0..samples {
            clock::sleep_until_ns(next);
            let late = clock::now_ns().saturating_sub(next);
            out.push(late as f64 / 1000.0);
            next += period_ns;
            // If we fell more than a period behind, re-anchor instead of bursting.
            let now = clock::now_ns();
            if next < now {
                next = now + period_ns;
            }
        }
        let summary_us = Summary::of(&out);
        Ok(WakeupProbe {
            hart,
            policy: policy.name().into(),
            samples_us: out,
            summary_us,
        })
    });
    handle.join().expect("probe thread panicked")
}

/// The noise floor: FIFO-99 absolute-time wake-up latency on `hart`, every 1 ms, for `samples`
/// wake-ups.
pub fn noise_floor(hart: usize, samples: usize) -> Result<WakeupProbe, ProbeError> {
    wakeup_latency(
        hart,
        Policy::Fifo { priority: 99 },
        Duration::from_millis(1),
        samples,
    )
}
