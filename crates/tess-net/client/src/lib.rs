//! Client library of the tess network service (issue 6; seed 000 section 2.2 "Network Service",
//! seed 004 section 2.3).
//!
//! The service (`tess-netd`, crate `tess-net`) runs in a cell of its own and owns the sockets;
//! a client cell reaches it over a lock-free shared-memory channel that tessd's nameserver hands
//! out. This library hides the channel behind a socket-like API:
//!
//! ```no_run
//! use tess_net_client::{UdpSocket, TcpStream};
//! use std::io::{Read, Write};
//! # fn main() -> std::io::Result<()> {
//! let mut s = UdpSocket::bind("0.0.0.0:9701".parse().unwrap())?;   // service `net`
//! let mut buf = [0u8; 2048];
//! let (n, from) = s.recv_from(&mut buf)?;
//! s.send_to(&buf[..n], from)?;
//!
//! let mut t = TcpStream::connect("10.0.0.2:80".parse().unwrap())?;
//! t.write_all(b"GET / HTTP/1.0\r\n\r\n")?;
//! let mut page = Vec::new();
//! t.read_to_end(&mut page)?;
//! # Ok(()) }
//! ```
//!
//! Every socket has a channel of its own (one `ns::connect` when it is opened). The data path
//! allocates nothing: a send writes the header and the payload straight into the channel's
//! ring ([`UdpSocket::send_to_with`] lets the caller write the payload in place), a receive
//! reads them in place ([`UdpSocket::recv_with`]). Operations are blocking unless
//! `set_nonblocking(true)`; blocking ones wait as [`Wait`] says.
//!
//! [`Control`] is the QoS specification interface (see [`qos`]): what tessd, the broker or an
//! administrator (`tess net`) uses to give a cell's flow a reservation, a weight, a limit and a
//! latency bound, and to read the flow table.
//!
//! Wire format: [`wire`].
#![warn(missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod conn;
pub mod qos;
mod tcp;
mod udp;
pub mod wire;

pub use conn::SentStamp;
pub use qos::{ControlReply, ControlRequest, FlowInfo, FlowTable, QosSpec, Throughput};
pub use tcp::{TcpListener, TcpStream};
pub use tess_channel::Wait;
pub use udp::{Datagram, UdpSocket};

use conn::Conn;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tess_channel::Endpoint;

/// The service name clients use unless told otherwise.
pub const DEFAULT_SERVICE: &str = "net";
/// Environment variable naming the service ([`Net::from_env`]).
pub const SERVICE_ENV: &str = "TESS_NET_SERVICE";
/// Environment variable naming the flow label of the process's sockets ([`Net::from_env`]).
pub const FLOW_ENV: &str = "TESS_NET_FLOW";
/// Listen backlog of [`TcpListener::bind`].
pub const DEFAULT_BACKLOG: u16 = 128;

type ConnectFn = dyn Fn() -> io::Result<Endpoint> + Send + Sync;

/// How to reach a network service: its name at tessd's nameserver, or a function that returns
/// a fresh channel end (tests, or a process handed channels another way); and the flow the
/// sockets opened through it belong to.
#[derive(Clone)]
pub struct Net {
    connector: Connector,
    /// The flow label of the sockets ([`Net::flow`]); `None`: the cell's own flow.
    label: Option<String>,
}

#[derive(Clone)]
enum Connector {
    Nameserver(String),
    Custom(Arc<ConnectFn>),
}

impl std::fmt::Debug for Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.connector {
            Connector::Nameserver(n) => write!(f, "Net({n:?} via tessd")?,
            Connector::Custom(_) => write!(f, "Net(custom connector")?,
        }
        match &self.label {
            Some(l) => write!(f, ", flow {l:?})"),
            None => write!(f, ")"),
        }
    }
}

impl Net {
    /// The service named `name` at tessd's nameserver.
    pub fn named(name: &str) -> Net {
        Net {
            connector: Connector::Nameserver(name.to_string()),
            label: None,
        }
    }

    /// The service named by `TESS_NET_SERVICE`, default [`DEFAULT_SERVICE`]; its sockets in
    /// the flow labelled by `TESS_NET_FLOW`, if set ([`Net::flow`]).
    pub fn from_env() -> Net {
        let net =
            Net::named(&std::env::var(SERVICE_ENV).unwrap_or_else(|_| DEFAULT_SERVICE.to_string()));
        match std::env::var(FLOW_ENV) {
            Ok(l) if !l.is_empty() => net.flow(&l),
            _ => net,
        }
    }

    /// The same service, with the sockets opened through the returned handle in the flow
    /// labelled `label` of the caller's cell: flow `cell:NAME/LABEL` at the service (or
    /// `pid:N/LABEL` outside any cell), with a QoS spec of its own, instead of the cell's
    /// flow `cell:NAME` that all its unlabelled sockets share. A label is 1 to
    /// [`qos::MAX_FLOW_LABEL`] characters of `A-Z a-z 0-9 _ . -`; a bad one fails the first
    /// open with `InvalidInput`. Accepted connections of a labelled listener join its flow.
    pub fn flow(mut self, label: &str) -> Net {
        self.label = Some(label.to_string());
        self
    }

    /// The flow label of the sockets, if any.
    pub fn flow_label(&self) -> Option<&str> {
        self.label.as_deref()
    }

    /// A service reached by calling `connect` for each new channel.
    pub fn with_connector(
        connect: impl Fn() -> io::Result<Endpoint> + Send + Sync + 'static,
    ) -> Net {
        Net {
            connector: Connector::Custom(Arc::new(connect)),
            label: None,
        }
    }

    /// The service's name, when reached through the nameserver.
    pub fn name(&self) -> Option<&str> {
        match &self.connector {
            Connector::Nameserver(n) => Some(n),
            Connector::Custom(_) => None,
        }
    }

    /// A channel for a socket: in the labelled flow, if there is a label.
    fn open(&self) -> io::Result<Conn> {
        if let Some(label) = self.label.as_ref().filter(|l| !qos::valid_flow_label(l)) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "flow label {label:?} must be 1 to {} characters of A-Z a-z 0-9 _ . -",
                    qos::MAX_FLOW_LABEL
                ),
            ));
        }
        let mut conn = self.channel()?;
        if let Some(label) = &self.label {
            conn.request(&wire::Header::new(wire::Op::Label), label.as_bytes())
                .map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!("putting the channel in flow {label:?}: {e}"),
                    )
                })?;
        }
        Ok(conn)
    }

    /// A bare channel to the service.
    fn channel(&self) -> io::Result<Conn> {
        let ep = match &self.connector {
            Connector::Nameserver(name) => {
                tess_proto::ns::connect(name)
                    .map_err(|e| {
                        io::Error::new(
                            io::ErrorKind::ConnectionRefused,
                            format!("cannot reach network service {name:?} through tessd: {e}"),
                        )
                    })?
                    .0
            }
            Connector::Custom(f) => f()?,
        };
        Ok(Conn::new(ep))
    }

    /// Opens a UDP socket bound to `addr` (port 0: the kernel picks one).
    pub fn udp_bind(&self, addr: SocketAddr) -> io::Result<UdpSocket> {
        UdpSocket::open(self.open()?, addr)
    }

    /// Opens a TCP connection to `addr`.
    pub fn tcp_connect(&self, addr: SocketAddr) -> io::Result<TcpStream> {
        TcpStream::open(self.open()?, addr)
    }

    /// Opens a TCP listener on `addr`.
    pub fn tcp_listen(&self, addr: SocketAddr) -> io::Result<TcpListener> {
        TcpListener::open(self.open()?, addr, DEFAULT_BACKLOG, self.clone())
    }

    /// Opens the QoS specification interface (its channel belongs to no labelled flow).
    pub fn control(&self) -> io::Result<Control> {
        Ok(Control {
            conn: self.channel()?,
        })
    }
}

/// Error of a QoS-interface call.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The channel failed.
    #[error("network service: {0}")]
    Io(#[from] io::Error),
    /// The service refused the request.
    #[error("network service refused: {0}")]
    Refused(String),
    /// The reply was not what was asked for.
    #[error("network service sent an unexpected reply: {0}")]
    Unexpected(String),
}

/// The QoS specification interface of a service (an admin channel; setting specs needs root or
/// the service's own user).
#[derive(Debug)]
pub struct Control {
    conn: Conn,
}

impl Control {
    /// Opens the interface of the service named by `TESS_NET_SERVICE` (default `net`).
    pub fn connect() -> io::Result<Control> {
        Net::from_env().control()
    }

    /// How long a request waits for the service's answer (default 15 s); a caller that must
    /// not stall with the service (the broker's loop) sets less.
    pub fn set_reply_timeout(&mut self, t: Duration) {
        self.conn.reply_timeout = t;
    }

    /// Sends one request and returns the reply (refusals become [`ControlError::Refused`]).
    pub fn call(&mut self, req: &ControlRequest) -> Result<ControlReply, ControlError> {
        let json = serde_json::to_vec(req).map_err(|e| ControlError::Unexpected(e.to_string()))?;
        let reply = self.conn.control(&json)?;
        match serde_json::from_slice::<ControlReply>(&reply) {
            Ok(ControlReply::Error { message }) => Err(ControlError::Refused(message)),
            Ok(r) => Ok(r),
            Err(e) => Err(ControlError::Unexpected(format!(
                "{e}: {}",
                String::from_utf8_lossy(&reply)
            ))),
        }
    }

    /// The flow table.
    pub fn flows(&mut self) -> Result<FlowTable, ControlError> {
        match self.call(&ControlRequest::Flows)? {
            ControlReply::Flows(t) => Ok(t),
            other => Err(ControlError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Sets the spec of flow `key` (`cell:NAME` or `pid:N`).
    pub fn set(&mut self, key: &str, spec: QosSpec) -> Result<(), ControlError> {
        self.call(&ControlRequest::Set {
            flow: key.to_string(),
            spec,
        })
        .map(|_| ())
    }

    /// Makes flow `key` best effort again.
    pub fn clear(&mut self, key: &str) -> Result<(), ControlError> {
        self.call(&ControlRequest::Clear {
            flow: key.to_string(),
        })
        .map(|_| ())
    }

    /// Removes every spec.
    pub fn clear_all(&mut self) -> Result<(), ControlError> {
        self.call(&ControlRequest::ClearAll).map(|_| ())
    }
}
