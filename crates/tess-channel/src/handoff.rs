//! Handing a channel end to another process over a Unix socket (`SCM_RIGHTS`).
//!
//! One hand-off is one message: 16 bytes of payload (`b"TESSEPFD"`, a version, the side) with
//! exactly two descriptors attached, the memfd and the liveness socket, in that order. It works
//! over `SOCK_STREAM`, `SOCK_SEQPACKET` and `SOCK_DGRAM` Unix sockets. The receiver gets the
//! descriptors with `O_CLOEXEC` set.
//!
//! After sending, the sender must close its own copies (drop the [`EndpointFds`]): peer-death
//! detection relies on the receiving process holding the only copy of its liveness end.

use crate::endpoint::{EndpointFds, Side};
use crate::error::OpenError;
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

const HANDOFF_MAGIC: u64 = u64::from_le_bytes(*b"TESSEPFD");
const HANDOFF_VERSION: u32 = 1;
const HANDOFF_LEN: usize = 16;

fn encode(side: Side) -> [u8; HANDOFF_LEN] {
    let mut b = [0u8; HANDOFF_LEN];
    b[..8].copy_from_slice(&HANDOFF_MAGIC.to_le_bytes());
    b[8..12].copy_from_slice(&HANDOFF_VERSION.to_le_bytes());
    b[12..16].copy_from_slice(&(side as u32).to_le_bytes());
    b
}

/// Sends one channel end over the Unix socket `sock`. The caller then drops `fds`.
pub fn send_endpoint(sock: BorrowedFd<'_>, fds: &EndpointFds) -> Result<(), OpenError> {
    let payload = encode(fds.side);
    let raw = [fds.memfd.as_raw_fd(), fds.liveness.as_raw_fd()];
    let cmsg = [ControlMessage::ScmRights(&raw)];
    let iov = [IoSlice::new(&payload)];
    let n = loop {
        match sendmsg::<()>(sock.as_raw_fd(), &iov, &cmsg, MsgFlags::MSG_NOSIGNAL, None) {
            Err(nix::errno::Errno::EINTR) => continue,
            other => break other,
        }
    }
    .map_err(|e| OpenError::io("sendmsg of a channel end", e.into()))?;
    if n != HANDOFF_LEN {
        // With the descriptors attached to the first byte, finish the payload without them.
        write_all(sock, &payload[n..])?;
    }
    Ok(())
}

fn write_all(sock: BorrowedFd<'_>, mut buf: &[u8]) -> Result<(), OpenError> {
    while !buf.is_empty() {
        match nix::sys::socket::send(sock.as_raw_fd(), buf, MsgFlags::MSG_NOSIGNAL) {
            Ok(n) => buf = &buf[n..],
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(OpenError::io("send of a channel hand-off", e.into())),
        }
    }
    Ok(())
}

/// Receives one channel end from the Unix socket `sock` (blocking).
pub fn recv_endpoint(sock: BorrowedFd<'_>) -> Result<EndpointFds, OpenError> {
    let mut payload = [0u8; HANDOFF_LEN];
    let mut got: Vec<OwnedFd> = Vec::new();
    let mut cmsg_buf = nix::cmsg_space!([RawFd; 4]);
    let (n, truncated) = loop {
        let mut iov = [IoSliceMut::new(&mut payload)];
        match recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg_buf),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(OpenError::io("recvmsg of a channel end", e.into())),
            Ok(msg) => {
                for c in msg
                    .cmsgs()
                    .map_err(|e| OpenError::io("recvmsg", e.into()))?
                {
                    if let ControlMessageOwned::ScmRights(fds) = c {
                        for fd in fds {
                            // SAFETY: SCM_RIGHTS installed `fd` in our table just now; nothing
                            // else owns it.
                            got.push(unsafe { OwnedFd::from_raw_fd(fd) });
                        }
                    }
                }
                break (msg.bytes, msg.flags.contains(MsgFlags::MSG_CTRUNC));
            }
        }
    };
    if n == 0 {
        return Err(OpenError::Handoff {
            what: "the socket was closed before a channel end arrived".into(),
        });
    }
    let mut have = n;
    while have < HANDOFF_LEN {
        match nix::sys::socket::recv(sock.as_raw_fd(), &mut payload[have..], MsgFlags::empty()) {
            Ok(0) => {
                return Err(OpenError::Handoff {
                    what: format!("the socket closed after {have} of {HANDOFF_LEN} bytes"),
                })
            }
            Ok(k) => have += k,
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(OpenError::io("recv of a channel hand-off", e.into())),
        }
    }
    if truncated {
        return Err(OpenError::Handoff {
            what: "descriptors were truncated (MSG_CTRUNC)".into(),
        });
    }
    let magic = u64::from_le_bytes(payload[..8].try_into().expect("8 bytes"));
    let version = u32::from_le_bytes(payload[8..12].try_into().expect("4 bytes"));
    let side = u32::from_le_bytes(payload[12..16].try_into().expect("4 bytes"));
    if magic != HANDOFF_MAGIC || version != HANDOFF_VERSION {
        return Err(OpenError::Handoff {
            what: format!("magic {magic:#x} version {version}, expected a tess channel end v1"),
        });
    }
    let side = match side {
        0 => Side::A,
        1 => Side::B,
        s => {
            return Err(OpenError::Handoff {
                what: format!("side {s} is neither 0 (A) nor 1 (B)"),
            })
        }
    };
    if got.len() != 2 {
        return Err(OpenError::Handoff {
            what: format!("{} descriptors attached, expected 2", got.len()),
        });
    }
    let liveness = got.pop().expect("two fds");
    let memfd = got.pop().expect("two fds");
    Ok(EndpointFds {
        memfd,
        liveness,
        side,
    })
}

/// A connected pair of `SOCK_SEQPACKET` Unix sockets with `SOCK_CLOEXEC`, for handing channel
/// ends to a child process (tests, examples, the benchmark).
pub fn socket_pair() -> Result<(OwnedFd, OwnedFd), OpenError> {
    crate::shm::liveness_pair()
}

impl EndpointFds {
    /// Sends this end over `sock` (see [`send_endpoint`]) and closes our copies.
    pub fn send_over(self, sock: impl AsFd) -> Result<(), OpenError> {
        send_endpoint(sock.as_fd(), &self)
    }
}
