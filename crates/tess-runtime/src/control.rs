//! The runtime's side of the control channel from tessd (`tess_proto::runtime`).
//!
//! The runtime asks tessd for its cell's channel (`RuntimeAttach`, [`tess_proto::runtime::attach`],
//! shared with Pulse), and from then on tessd sends `Adapt` and `Shutdown` on it. No thread of
//! the cell is dedicated to listening (an extra thread in the cell would take a share of every
//! hart's budget): the harts poll the channel at their checkpoints (window starts, between task
//! slices, idle wake-ups); whichever gets the lock first reads it. Polling is a few loads of
//! shared memory, no system call.
//!
//! Without tessd ([`crate::Builder::standalone`]) the same messages come from a local queue
//! ([`crate::Handle::resize`]), so the adaptation logic is the same in tests and in cells.

use std::collections::VecDeque;
use tess_proto::runtime::{Control, ControlChannel};

pub use tess_proto::runtime::{current_cell, join_cell, AttachError};

/// Where control messages come from and acknowledgements go.
#[derive(Debug)]
pub(crate) enum Link {
    /// The channel from tessd.
    Tessd(Box<ControlChannel>),
    /// Standalone: messages queued by [`crate::Handle::resize`], acknowledgements recorded.
    Local {
        inbox: VecDeque<Control>,
        acks: Vec<(u64, usize)>,
    },
}

impl Link {
    /// The next message, if any (never blocks).
    pub(crate) fn poll(&mut self) -> Option<Control> {
        match self {
            Link::Tessd(ch) => ch.poll(),
            Link::Local { inbox, .. } => inbox.pop_front(),
        }
    }

    /// Acknowledges adaptation `seq`.
    pub(crate) fn ack(&mut self, seq: u64, vharts: usize) {
        match self {
            Link::Tessd(ch) => ch.ack(seq, vharts),
            Link::Local { acks, .. } => acks.push((seq, vharts)),
        }
    }
}
