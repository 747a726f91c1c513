//! A client channel and the socket it owns.

use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use tess_channel::Endpoint;
use tess_proto::ns::PeerInfo;

/// The socket a session owns.
#[derive(Debug)]
pub enum Sock {
    /// Nothing opened yet (or a control channel).
    None,
    /// A UDP socket.
    Udp {
        /// The socket (non-blocking, timestamping).
        sock: UdpSocket,
    },
    /// A TCP connection.
    Stream {
        /// The socket (non-blocking).
        sock: TcpStream,
        /// Connecting: the reply is sent when it becomes writable.
        connecting: bool,
        /// End of stream was delivered; stop reading.
        eof: bool,
        /// Bytes of the `WRITE` record at the head of the channel already written.
        tx_offset: usize,
    },
    /// A TCP listener.
    Listener {
        /// The socket (non-blocking).
        sock: TcpListener,
        /// Accepted connections not yet adopted, at most this many.
        backlog: usize,
    },
}

impl Sock {
    /// The descriptor, if any.
    pub fn fd(&self) -> Option<RawFd> {
        match self {
            Sock::None => None,
            Sock::Udp { sock } => Some(sock.as_raw_fd()),
            Sock::Stream { sock, .. } => Some(sock.as_raw_fd()),
            Sock::Listener { sock, .. } => Some(sock.as_raw_fd()),
        }
    }

    /// Short kind name.
    pub fn kind(&self) -> &'static str {
        match self {
            Sock::None => "none",
            Sock::Udp { .. } => "udp",
            Sock::Stream { .. } => "tcp",
            Sock::Listener { .. } => "tcp-listen",
        }
    }
}

/// One client channel.
#[derive(Debug)]
pub struct Session {
    /// The service's end of the channel.
    pub ep: Endpoint,
    /// Who is at the other end.
    pub client: PeerInfo,
    /// Row in the flow table.
    pub flow: usize,
    /// The socket.
    pub sock: Sock,
    /// Local address of the socket.
    pub local: Option<SocketAddr>,
    /// When the channel was opened (monotonic ns): the earliest arrival a send may claim.
    pub opened_ns: u64,
    /// Arrival of the `SEND`/`WRITE` at the head of the channel, if one waits.
    pub tx_head: Option<u64>,
    /// When the socket was first seen readable with room in the channel (monotonic ns).
    pub rx_seen: Option<u64>,
    /// The socket was reported readable by the last epoll round.
    pub readable: bool,
    /// The socket was reported writable by the last epoll round.
    pub writable: bool,
    /// A send would block: wait for writability.
    pub tx_blocked: bool,
    /// Epoll interest currently registered.
    pub interest: u32,
    /// The client hung up or misbehaved: remove the session.
    pub closing: bool,
    /// Records the client sent that were not understood.
    pub malformed: u64,
}

impl Session {
    /// A fresh session.
    pub fn new(ep: Endpoint, client: PeerInfo, flow: usize, now_ns: u64) -> Session {
        Session {
            ep,
            client,
            flow,
            sock: Sock::None,
            local: None,
            opened_ns: now_ns,
            tx_head: None,
            rx_seen: None,
            readable: false,
            writable: false,
            tx_blocked: false,
            interest: 0,
            closing: false,
            malformed: 0,
        }
    }

    /// Arrival of the oldest packet this session could send or deliver now, and whether it is
    /// a send.
    pub fn head(&self) -> Option<(u64, bool)> {
        let tx = self.tx_head.filter(|_| !self.tx_blocked);
        match (tx, self.rx_seen) {
            (Some(t), Some(r)) if r < t => Some((r, false)),
            (Some(t), _) => Some((t, true)),
            (None, Some(r)) => Some((r, false)),
            (None, None) => None,
        }
    }
}
