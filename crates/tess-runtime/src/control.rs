//! The runtime's side of the control channel from tessd (`tess_proto::runtime`).
//!
//! The runtime asks tessd for its cell's channel (`RuntimeAttach`), and from then on tessd sends
//! `Adapt` and `Shutdown` on it. No thread of the cell is dedicated to listening (an extra thread
//! in the cell would take a share of every hart's budget): the harts poll the channel at their
//! checkpoints (window starts, between task slices, idle wake-ups); whichever gets the lock first
//! reads it. Polling is a few loads of shared memory, no system call.
//!
//! Without tessd ([`crate::Builder::standalone`]) the same messages come from a local queue
//! ([`crate::Handle::resize`]), so the adaptation logic is the same in tests and in cells.

use std::collections::VecDeque;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use tess_channel::Endpoint;
use tess_proto::runtime::{decode, encode, Control, Report};
use tess_proto::{frame, Body, CellInfo, Request, Response, PROTOCOL_VERSION};

/// Where control messages come from and acknowledgements go.
#[derive(Debug)]
pub(crate) enum Link {
    /// The channel from tessd.
    Tessd(Box<Endpoint>),
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
            Link::Tessd(ep) => {
                let mut buf = [0u8; 4096];
                loop {
                    match ep.try_recv(&mut buf) {
                        Ok(n) => {
                            if let Some(c) = decode::<Control>(&buf[..n]) {
                                return Some(c);
                            }
                            // A malformed message is skipped (tessd is trusted, but not blindly).
                        }
                        Err(tess_channel::TryRecvError::Disconnected) => {
                            return Some(Control::Shutdown)
                        }
                        Err(_) => return None,
                    }
                }
            }
            Link::Local { inbox, .. } => inbox.pop_front(),
        }
    }

    /// Acknowledges adaptation `seq`.
    pub(crate) fn ack(&mut self, seq: u64, vharts: usize) {
        match self {
            Link::Tessd(ep) => {
                // If tessd is gone or the ring is full there is nobody to tell; tessd times out.
                let _ = ep.try_send(&encode(&Report::Adapted { seq, vharts }));
            }
            Link::Local { acks, .. } => acks.push((seq, vharts)),
        }
    }
}

/// Errors attaching to tessd.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// tessd refused or could not be reached.
    #[error("asking tessd for the control channel of cell '{cell}': {source}")]
    Api {
        /// The cell.
        cell: String,
        /// Cause.
        #[source]
        source: tess_proto::ApiError,
    },
    /// The channel end could not be received or opened.
    #[error("receiving the control channel of cell '{cell}': {source}")]
    Channel {
        /// The cell.
        cell: String,
        /// Cause.
        #[source]
        source: tess_channel::OpenError,
    },
}

fn call(stream: &mut UnixStream, req: &Request) -> Result<Body, tess_proto::ApiError> {
    frame::write(stream, req)?;
    match frame::read::<_, Response>(stream)? {
        Response::Ok { body } => Ok(body),
        Response::Error { kind, message } => Err(tess_proto::ApiError::Daemon { kind, message }),
    }
}

/// Asks tessd for `cell`'s control channel; returns the cell as tessd sees it and our end.
pub(crate) fn attach(cell: &str) -> Result<(CellInfo, Endpoint), AttachError> {
    let api = |source| AttachError::Api {
        cell: cell.into(),
        source,
    };
    let path = tess_proto::client::socket_path();
    let mut stream = UnixStream::connect(&path).map_err(|cause| {
        api(tess_proto::ApiError::Unreachable {
            path: path.clone(),
            cause,
        })
    })?;
    call(
        &mut stream,
        &Request::Hello {
            version: PROTOCOL_VERSION,
        },
    )
    .map_err(api)?;
    let body = call(&mut stream, &Request::RuntimeAttach { cell: cell.into() }).map_err(api)?;
    let Body::Cell(info) = body else {
        return Err(api(tess_proto::ApiError::Unexpected(format!("{body:?}"))));
    };
    let ep = Endpoint::recv_from(stream.as_fd()).map_err(|source| AttachError::Channel {
        cell: cell.into(),
        source,
    })?;
    Ok((*info, ep))
}

/// Moves the calling process into `cell` (what `tess run --cell` does), for programs that start
/// outside their cell. Call it before starting threads.
pub fn join_cell(cell: &str) -> Result<(), tess_proto::ApiError> {
    let mut c = tess_proto::Client::connect_default()?;
    // The second attach completes the move from the cell's hart (see `tess run`).
    c.call(&Request::Attach { cell: cell.into() })?;
    c.call(&Request::Attach { cell: cell.into() })?;
    Ok(())
}

/// The cell the calling process runs in, from its cpuset cgroup (`.../cells/NAME` or
/// `.../GROUP.part-HARTS/NAME`), if any.
pub fn current_cell() -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines().find_map(|l| {
        let path = l.splitn(3, ':').nth(2)?;
        let mut parts = path.rsplit('/');
        let name = parts.next()?;
        let parent = parts.next()?;
        // `GROUP/cells/NAME`, or `GROUP.part-HARTS/NAME` (cgroup v2 partitions).
        (parent == "cells" || parent.contains(".part-"))
            .then(|| name.to_string())
            .filter(|n| !n.is_empty())
    })
}
