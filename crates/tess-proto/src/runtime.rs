//! The control protocol between tessd and a cell's runtime (`tess-runtime`, Pulse).
//!
//! A runtime asks tessd for its cell's control channel ([`crate::Request::RuntimeAttach`]) and
//! receives one end of a `tess-channel`. Messages are small JSON records, one per channel
//! message. tessd sends [`Control`]; the runtime answers with [`Report`]. The runtime's side
//! (attaching, polling, acknowledging, waiting to be placed) is [`link`], shared by every
//! runtime.
//!
//! Adaptation (seed 004 section 4.4, adapted to Linux): when `tess cell resize` changes how many
//! harts a cell has,
//! - **shrinking**: tessd first sends `Adapt { seq, harts }` with the smaller set and waits (up
//!   to [`ADAPT_ACK_TIMEOUT`]) for `Adapted { seq }`. The runtime retires its highest virtual
//!   harts: their threads finish what they are doing and *exit* (a retired thread that merely
//!   slept would still hold a share of the cell's budget), and `adapt(old_n, new_n)` runs once.
//!   Only then does tessd shrink the cpuset, so no hart ever runs two of the cell's threads.
//! - **growing**: tessd first grows the cell in the kernel, then sends `Adapt` with the larger
//!   set. The runtime starts one thread per new virtual hart; tessd places each new thread on an
//!   empty hart of the cell (and under the cell's reservation), and the runtime calls
//!   `adapt(old_n, new_n)` once they run.
//!
//! Threads never pin themselves: a `SCHED_DEADLINE` thread may not change its own affinity.
//! tessd places one thread per hart; a thread learns its hart with `sched_getcpu`.

pub mod link;

pub use link::{
    attach, current_cell, is_placed, join_cell, wait_gone, wait_placed, AttachError,
    ControlChannel, PLACEMENT_TIMEOUT,
};

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// How long tessd waits for a runtime to retire threads before shrinking its cell anyway.
pub const ADAPT_ACK_TIMEOUT: Duration = Duration::from_millis(250);

/// The cell's reservation on each hart, as the runtime needs it to lay out windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Window {
    /// Budget (active time) per period, ns.
    pub runtime_ns: u64,
    /// Relative deadline, ns.
    pub deadline_ns: u64,
    /// Period, ns.
    pub period_ns: u64,
    /// Window start on the `CLOCK_MONOTONIC` grid `k * period + offset` (time-triggered cells).
    pub offset_ns: Option<u64>,
}

/// tessd to runtime.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "kebab-case")]
pub enum Control {
    /// The cell now has (or, when shrinking, is about to have) these harts.
    Adapt {
        /// Sequence number, echoed in `Report::Adapted`.
        seq: u64,
        /// The cell's harts after the change.
        harts: Vec<usize>,
        /// The reservation per hart after the change (reserved cells).
        window: Option<Window>,
    },
    /// The cell is being deleted.
    Shutdown,
}

/// Runtime to tessd.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "kebab-case")]
pub enum Report {
    /// An adaptation completed: `adapt` returned, with `vharts` threads running.
    Adapted {
        /// The `Adapt` it answers.
        seq: u64,
        /// Virtual harts now running.
        vharts: usize,
    },
}

/// Encodes a message for the channel.
pub fn encode<T: Serialize>(m: &T) -> Vec<u8> {
    serde_json::to_vec(m).expect("control messages serialise")
}

/// Decodes a message from the channel; `None` if malformed (a hostile peer is not trusted).
pub fn decode<T: for<'de> Deserialize<'de>>(b: &[u8]) -> Option<T> {
    serde_json::from_slice(b).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let c = Control::Adapt {
            seq: 3,
            harts: vec![0, 1],
            window: Some(Window {
                runtime_ns: 2_000_000,
                deadline_ns: 2_000_000,
                period_ns: 10_000_000,
                offset_ns: Some(0),
            }),
        };
        assert_eq!(decode::<Control>(&encode(&c)), Some(c));
        let r = Report::Adapted { seq: 3, vharts: 2 };
        assert_eq!(decode::<Report>(&encode(&r)), Some(r));
        assert_eq!(decode::<Report>(b"\\xff garbage"), None);
    }
}
