//! The synthesizer's socket: its own ([`net::Endpoint`](crate::net::Endpoint)), or one owned by
//! the tess network service (issue 6), reached over a shared-memory channel with
//! `tess-net-client`.
//!
//! Through the service, `t1` is still the kernel's receive timestamp (the service reads it with
//! `recvmmsg` and passes it along), and `t2` is taken by the service right after its `sendmmsg`
//! returns, reported back in a transmit stamp: both are measured next to the socket, as the
//! paper's network driver did (seed 000 section 4), so `t2 - t1` includes every delay the
//! service adds.

use crate::net::{realtime_ns, Endpoint, NetError, Peer, Received, Wait};
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

/// Where the synthesizer's datagrams go.
#[derive(Debug)]
pub enum Transport {
    /// A socket of its own.
    Direct(Endpoint),
    /// A socket in the network service (boxed: it carries a ring of transmit stamps).
    Service(Box<tess_net_client::UdpSocket>),
}

impl Transport {
    /// Binds `addr` directly, or in network service `service`.
    pub fn open(addr: SocketAddr, service: Option<&str>) -> Result<Transport, NetError> {
        let Some(name) = service else {
            return Endpoint::bind(addr).map(Transport::Direct);
        };
        let mut s = tess_net_client::Net::named(name)
            .udp_bind(addr)
            .map_err(|source| NetError::Bind { addr, source })?;
        // Like the direct socket's SO_RCVTIMEO, so that a blocked host sees stop requests; a
        // blocking receive sleeps at once, as recvmsg does (spinning would spend the cell's
        // budget).
        let _ = s.set_read_timeout(Some(Duration::from_millis(50)));
        s.set_wait(tess_net_client::Wait::Sleep);
        Ok(Transport::Service(Box::new(s)))
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        match self {
            Transport::Direct(e) => e.local_addr(),
            Transport::Service(s) => s.local_addr().expect("bound"),
        }
    }

    /// Receives one datagram (see [`Endpoint::recv`]). Allocation-free.
    pub fn recv(&mut self, buf: &mut [u8], wait: Wait) -> io::Result<Option<Received>> {
        let s = match self {
            Transport::Direct(e) => return e.recv(buf, wait),
            Transport::Service(s) => s,
        };
        s.set_nonblocking(wait == Wait::Poll)?;
        let r = s.recv_with(|d| {
            let len = d.payload.len().min(buf.len());
            buf[..len].copy_from_slice(&d.payload[..len]);
            Received {
                len,
                rx_ns: d.rx_ns,
                kernel_stamp: d.kernel_stamp,
                peer: Peer::from_socket_addr(d.from),
                truncated: d.truncated || d.payload.len() > buf.len(),
            }
        });
        match r {
            Ok(r) => Ok(Some(r)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Sends `buf` to `peer`. Returns `t2` when it is known at once (direct), `None` when the
    /// service will report it with `cookie` ([`take_sent`](Self::take_sent)).
    pub fn send_to(&mut self, buf: &[u8], peer: &Peer, cookie: u64) -> io::Result<Option<u64>> {
        match self {
            Transport::Direct(e) => {
                e.send_to(buf, peer)?;
                Ok(Some(realtime_ns()))
            }
            Transport::Service(s) => {
                let to = peer.to_socket_addr().ok_or_else(|| {
                    io::Error::new(io::ErrorKind::InvalidInput, "peer is not IPv4/IPv6")
                })?;
                s.send_to_stamped(buf, to, cookie)?;
                Ok(None)
            }
        }
    }

    /// The next `(cookie, t2)` the service reported.
    pub fn take_sent(&mut self) -> Option<(u64, u64)> {
        match self {
            Transport::Direct(_) => None,
            Transport::Service(s) => s.take_sent().map(|x| (x.cookie, x.sent_ns)),
        }
    }
}
