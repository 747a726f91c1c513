//! The nameserver: services register under a name, clients ask tessd for a channel to it.
//!
//! ```text
//!   service                    tessd                        client
//!   Register{name, access} ->  holds the connection
//!                              <- Connect{name}             checks access (cell, uid)
//!                              creates a channel (memfd)
//!   <- Push::Incoming + end B                               end A + Connected ->
//! ```
//!
//! After the hand-off tessd is not on the data path: the two processes talk over the channel's
//! shared memory. A service may accept many clients, each with its own channel. A name is freed
//! when the service's registration connection closes, which happens when it exits.

use crate::client::{socket_path, ApiError};
use crate::frame::{self, FrameError};
use crate::{Body, ErrorKind, Request, Response, PROTOCOL_VERSION};
use serde::{Deserialize, Serialize};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use tess_channel::{ChannelOptions, Endpoint};

/// Who may connect to a service.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Access {
    /// Processes running in these cells.
    #[serde(default)]
    pub cells: Vec<String>,
    /// Processes of these users.
    #[serde(default)]
    pub uids: Vec<u32>,
    /// Anyone (the other lists are then ignored).
    #[serde(default)]
    pub anyone: bool,
}

impl Access {
    /// Anyone may connect.
    pub fn anyone() -> Access {
        Access {
            anyone: true,
            ..Default::default()
        }
    }

    /// Whether a client is admitted. The service's own user and root always are.
    pub fn admits(&self, service_uid: u32, client: &PeerInfo) -> bool {
        self.anyone
            || client.uid == 0
            || client.uid == service_uid
            || self.uids.contains(&client.uid)
            || client.cell.as_ref().is_some_and(|c| self.cells.contains(c))
    }
}

/// Shape of the channels a service hands out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChannelShape {
    /// Ring capacity per direction, bytes.
    pub capacity: usize,
    /// Largest message, bytes.
    pub max_message: usize,
}

impl From<&ChannelOptions> for ChannelShape {
    fn from(o: &ChannelOptions) -> Self {
        ChannelShape {
            capacity: o.capacity,
            max_message: o.max_message_size,
        }
    }
}

impl From<ChannelShape> for ChannelOptions {
    fn from(s: ChannelShape) -> Self {
        ChannelOptions {
            capacity: s.capacity,
            max_message_size: s.max_message,
        }
    }
}

/// A process at the other end, as tessd vouches for it (`SO_PEERCRED`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerInfo {
    /// User.
    pub uid: u32,
    /// Process.
    pub pid: i32,
    /// The cell it runs in, if any.
    pub cell: Option<String>,
}

/// A registered service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NameInfo {
    /// Name.
    pub name: String,
    /// The service process.
    pub service: PeerInfo,
    /// Channels handed out so far.
    pub clients: u64,
}

/// What tessd pushes on a service's registration connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "push", rename_all = "kebab-case")]
pub enum Push {
    /// A client connected; its channel end follows.
    Incoming {
        /// The client.
        client: PeerInfo,
    },
}

/// Checks a service name: 1-64 of `a-z 0-9 - _ . /`, starting with a letter or digit.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-_./".contains(c))
        && !name.contains("..")
}

/// A new client of a service.
#[derive(Debug)]
pub struct Incoming {
    /// Who connected.
    pub client: PeerInfo,
    /// The service's end of the client's channel.
    pub endpoint: Endpoint,
}

/// A registered service.
#[derive(Debug)]
pub struct Service {
    stream: UnixStream,
    name: String,
}

fn handshake(stream: &mut UnixStream) -> Result<(), ApiError> {
    frame::write(
        stream,
        &Request::Hello {
            version: PROTOCOL_VERSION,
        },
    )?;
    match frame::read_response(stream)? {
        Response::Ok { .. } => Ok(()),
        Response::Error { kind, message } => Err(ApiError::Daemon { kind, message }),
    }
}

fn call(stream: &mut UnixStream, req: &Request) -> Result<Body, ApiError> {
    frame::write(stream, req)?;
    match frame::read_response(stream)? {
        Response::Ok { body } => Ok(body),
        Response::Error { kind, message } => Err(ApiError::Daemon { kind, message }),
    }
}

fn connect_daemon(path: &std::path::Path) -> Result<UnixStream, ApiError> {
    let mut s = UnixStream::connect(path).map_err(|cause| ApiError::Unreachable {
        path: path.to_path_buf(),
        cause,
    })?;
    handshake(&mut s)?;
    Ok(s)
}

fn channel_error(e: tess_channel::OpenError) -> ApiError {
    ApiError::Daemon {
        kind: ErrorKind::Internal,
        message: format!("receiving a channel end: {e}"),
    }
}

impl Service {
    /// Registers the calling process as service `name`.
    pub fn register(
        name: &str,
        access: Access,
        channel: &ChannelOptions,
    ) -> Result<Service, ApiError> {
        let mut stream = connect_daemon(&socket_path())?;
        call(
            &mut stream,
            &Request::Register {
                name: name.into(),
                access,
                channel: channel.into(),
            },
        )?;
        Ok(Service {
            stream,
            name: name.into(),
        })
    }

    /// The registered name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Waits for the next client.
    pub fn accept(&mut self) -> Result<Incoming, ApiError> {
        let push: Push = frame::read(&mut self.stream)?;
        let Push::Incoming { client } = push;
        let endpoint = Endpoint::recv_from(self.stream.as_fd()).map_err(channel_error)?;
        Ok(Incoming { client, endpoint })
    }

    /// Whether a client is waiting, without blocking: [`accept`](Self::accept) will then not
    /// wait. An error if tessd closed the registration (it stopped, or dropped the service):
    /// the name is no longer this service's.
    pub fn client_waiting(&self) -> std::io::Result<bool> {
        use std::os::fd::AsRawFd;
        let mut pfd = libc::pollfd {
            fd: self.stream.as_raw_fd(),
            events: libc::POLLIN | libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: `pfd` is one valid pollfd for the duration of the call; timeout 0 never
        // blocks.
        if unsafe { libc::poll(&mut pfd, 1, 0) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if pfd.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLRDHUP) != 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                "tessd closed the service's registration",
            ));
        }
        Ok(pfd.revents & libc::POLLIN != 0)
    }

    /// The registration connection, to poll for readability (a client is waiting).
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.stream.as_fd()
    }
}

/// Connects to service `name`; returns the client's channel end and who serves it.
pub fn connect(name: &str) -> Result<(Endpoint, NameInfo), ApiError> {
    connect_via(&socket_path(), name)
}

/// [`connect`] through the tessd listening at `socket` (instead of `$TESS_SOCKET` or the
/// default).
pub fn connect_via(socket: &std::path::Path, name: &str) -> Result<(Endpoint, NameInfo), ApiError> {
    let mut stream = connect_daemon(socket)?;
    let body = call(&mut stream, &Request::Connect { name: name.into() })?;
    let Body::Connected { service } = body else {
        return Err(ApiError::Unexpected(format!("{body:?}")));
    };
    let endpoint = Endpoint::recv_from(stream.as_fd()).map_err(channel_error)?;
    Ok((endpoint, service))
}

impl From<tess_channel::OpenError> for FrameError {
    fn from(e: tess_channel::OpenError) -> Self {
        FrameError::Io(std::io::Error::other(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for good in ["net", "console", "audio/engine", "a.b_c-d"] {
            assert!(valid_name(good), "{good}");
        }
        for bad in ["", "/net", "Net", "a b", "a/../b", &"x".repeat(65)] {
            assert!(!valid_name(bad), "{bad}");
        }
    }

    #[test]
    fn access_rules() {
        let p = |uid, cell: Option<&str>| PeerInfo {
            uid,
            pid: 1,
            cell: cell.map(String::from),
        };
        let a = Access {
            cells: vec!["synth".into()],
            uids: vec![1001],
            anyone: false,
        };
        assert!(a.admits(1000, &p(1000, None)), "own user");
        assert!(a.admits(1000, &p(0, None)), "root");
        assert!(a.admits(1000, &p(1001, None)), "listed user");
        assert!(a.admits(1000, &p(1002, Some("synth"))), "listed cell");
        assert!(!a.admits(1000, &p(1002, Some("other"))));
        assert!(!a.admits(1000, &p(1002, None)));
        assert!(Access::anyone().admits(1000, &p(4242, None)));
    }
}
