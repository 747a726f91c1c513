//! A runtime's side of the control channel: what every user-level runtime in a cell does to
//! follow tessd (`tess-runtime`'s harts, Pulse's harts). Shared so that both speak the protocol
//! of [`super`] the same way.
//!
//! ```text
//!   runtime                                   tessd
//!   Hello, RuntimeAttach{cell}          ->    checks the caller runs in the cell
//!                                       <-    Body::Cell(info) + one end of a tess-channel
//!   harts poll ControlChannel::poll     <-    Control::Adapt{seq, harts, window} / Shutdown
//!   ControlChannel::ack(seq, vharts)    ->    Report::Adapted (tessd waits for it on a shrink)
//! ```
//!
//! No thread of the cell is dedicated to listening (an extra thread in the cell would take a
//! share of every hart's budget): the runtime's harts poll the channel at their checkpoints.
//! [`ControlChannel::poll`] never blocks; on an empty channel it is a few loads of shared
//! memory, no system call.
//!
//! Placement: a runtime's threads never pin themselves in a reserved cell (a `SCHED_DEADLINE`
//! thread may not change its own affinity). tessd places each thread of the cell on the least
//! populated hart and makes it a deadline thread; a thread that must run under the cell's
//! reservation waits for that with [`wait_placed`]. Before acknowledging a shrink, a runtime
//! makes sure its retired threads are gone ([`wait_gone`]): tessd takes the harts away as soon
//! as it has the acknowledgement, and must not find a half-dead thread there to re-place.

use super::{decode, encode, Control, Report};
use crate::{frame, ApiError, Body, CellInfo, Request, Response, PROTOCOL_VERSION};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};
use tess_channel::Endpoint;
use tess_sched::{attr, Policy};

/// How long a runtime's thread waits to be placed under its cell's reservation before it runs
/// without (tessd places new threads on fork events and every few hundred milliseconds).
pub const PLACEMENT_TIMEOUT: Duration = Duration::from_secs(2);

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
        source: ApiError,
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

/// The runtime's end of its cell's control channel.
#[derive(Debug)]
pub struct ControlChannel {
    ep: Endpoint,
}

impl ControlChannel {
    /// The next message from tessd, if any; never blocks. A closed channel (tessd exited or
    /// dropped the cell) reads as [`Control::Shutdown`]. Malformed messages are skipped: tessd
    /// is trusted, but not blindly.
    pub fn poll(&mut self) -> Option<Control> {
        let mut buf = [0u8; 4096];
        loop {
            match self.ep.try_recv(&mut buf) {
                Ok(n) => {
                    if let Some(c) = decode::<Control>(&buf[..n]) {
                        return Some(c);
                    }
                }
                Err(tess_channel::TryRecvError::Disconnected) => return Some(Control::Shutdown),
                Err(_) => return None,
            }
        }
    }

    /// Acknowledges adaptation `seq`: `adapt` returned and `vharts` harts run. If tessd is gone
    /// or the ring is full there is nobody to tell; tessd times out
    /// ([`super::ADAPT_ACK_TIMEOUT`]).
    pub fn ack(&mut self, seq: u64, vharts: usize) {
        let _ = self.ep.try_send(&encode(&Report::Adapted { seq, vharts }));
    }
}

fn call(stream: &mut UnixStream, req: &Request) -> Result<Body, ApiError> {
    frame::write(stream, req)?;
    match frame::read_response(stream)? {
        Response::Ok { body } => Ok(body),
        Response::Error { kind, message } => Err(ApiError::Daemon { kind, message }),
    }
}

/// Asks tessd (at `$TESS_SOCKET` or the default socket) for `cell`'s control channel; returns
/// the cell as tessd sees it and the runtime's end. The calling process must run in `cell`.
pub fn attach(cell: &str) -> Result<(CellInfo, ControlChannel), AttachError> {
    let api = |source| AttachError::Api {
        cell: cell.into(),
        source,
    };
    let path = crate::client::socket_path();
    let mut stream = UnixStream::connect(&path).map_err(|cause| {
        api(ApiError::Unreachable {
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
        return Err(api(ApiError::Unexpected(format!("{body:?}"))));
    };
    let ep = Endpoint::recv_from(stream.as_fd()).map_err(|source| AttachError::Channel {
        cell: cell.into(),
        source,
    })?;
    Ok((*info, ControlChannel { ep }))
}

/// Moves the calling process into `cell` (what `tess run --cell` does), for programs that start
/// outside their cell. Call it before starting threads.
pub fn join_cell(cell: &str) -> Result<(), ApiError> {
    let mut c = crate::Client::connect_default()?;
    // The second attach completes the move from the cell's hart (see `tess run`).
    c.call(&Request::Attach { cell: cell.into() })?;
    c.call(&Request::Attach { cell: cell.into() })?;
    Ok(())
}

/// The cell the calling process runs in, from its cpuset cgroup (`.../cells/NAME` or
/// `.../GROUP.part-HARTS/NAME`), if any.
pub fn current_cell() -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    cell_of_cgroup(&text)
}

fn cell_of_cgroup(text: &str) -> Option<String> {
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

/// Whether tessd has placed the calling thread under its cell's reservation: a deadline
/// thread, or (event-triggered cells on cgroup v1, one RT group server for the whole cell)
/// `SCHED_RR`.
pub fn is_placed() -> bool {
    matches!(
        attr::get_policy(0),
        Ok((Policy::Deadline { .. } | Policy::RoundRobin { .. }, _))
    )
}

/// Waits until tessd has placed the calling thread under its cell's reservation
/// ([`is_placed`]), `timeout` passes or `give_up()` says so; returns whether it was placed. The
/// thread keeps running (`sched_yield`) rather than sleeping: tessd moves it to its hart with an
/// affinity change, and the kernel accepts the promotion only once the thread is on that hart,
/// which a sleeping thread reaches only when it wakes.
pub fn wait_placed(timeout: Duration, give_up: impl Fn() -> bool) -> bool {
    let until = Instant::now() + timeout;
    while !is_placed() {
        if Instant::now() > until || give_up() {
            return false;
        }
        attr::yield_now();
    }
    true
}

/// Waits (up to `limit`) until the kernel has reaped the threads `tids` of this process:
/// `pthread_join` returns when a thread has released its user-level resources, a moment before
/// the kernel task leaves the cell's cgroup, and tessd, acting on an acknowledgement, must not
/// find it there half-dead (it would try to re-place it).
pub fn wait_gone(tids: &[i32], limit: Duration) {
    let give_up = Instant::now() + limit;
    for tid in tids {
        let path = format!("/proc/self/task/{tid}");
        while std::path::Path::new(&path).exists() && Instant::now() < give_up {
            std::thread::yield_now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cell_of_cgroup_finds_v1_and_v2_cells() {
        let v1 = "12:cpuset:/tess/cells/synth\n11:cpu,cpuacct:/tess/cells/synth\n";
        assert_eq!(cell_of_cgroup(v1).as_deref(), Some("synth"));
        let v2 = "0::/tess.part-1/synth\n";
        assert_eq!(cell_of_cgroup(v2).as_deref(), Some("synth"));
        assert_eq!(cell_of_cgroup("0::/user.slice/session-1.scope\n"), None);
        assert_eq!(cell_of_cgroup("12:cpuset:/tess/system\n"), None);
    }

    #[test]
    fn a_thread_outside_any_cell_is_not_placed() {
        // Test threads run under SCHED_OTHER: not placed, and waiting gives up at once.
        assert!(!is_placed());
        assert!(!wait_placed(Duration::from_secs(5), || true));
    }
}
