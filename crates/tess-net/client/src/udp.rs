//! UDP sockets owned by the service, used like `std::net::UdpSocket`.

use crate::conn::{Conn, Seen, SentStamp};
use crate::wire::{Header, Op, FLAG_KERNEL_STAMP, FLAG_TRUNCATED, FLAG_WANT_SENT, MAX_PAYLOAD};
use crate::Net;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;
use tess_channel::Wait;

/// A received datagram, lent in place from the channel by [`UdpSocket::recv_with`].
#[derive(Debug, Clone, Copy)]
pub struct Datagram<'a> {
    /// The bytes (in the channel's shared memory: copy what you keep).
    pub payload: &'a [u8],
    /// Sender.
    pub from: SocketAddr,
    /// Receive time, `CLOCK_REALTIME` ns: the kernel's timestamp when `kernel_stamp`.
    pub rx_ns: u64,
    /// Whether `rx_ns` is the kernel's receive timestamp (`SO_TIMESTAMPNS`) rather than the
    /// service's clock when it read the datagram.
    pub kernel_stamp: bool,
    /// The datagram was longer than the service's maximum and was cut.
    pub truncated: bool,
}

/// A UDP socket in the network service.
///
/// Operations take `&mut self` (the channel has one reader and one writer); move the socket to
/// the thread that uses it. Blocking by default; see [`set_nonblocking`](Self::set_nonblocking).
#[derive(Debug)]
pub struct UdpSocket {
    conn: Conn,
    local: SocketAddr,
    peer: Option<SocketAddr>,
}

impl UdpSocket {
    /// Opens a socket bound to `addr` in the service named by `TESS_NET_SERVICE` (default
    /// `net`), reached through tessd's nameserver.
    pub fn bind(addr: SocketAddr) -> io::Result<UdpSocket> {
        Net::from_env().udp_bind(addr)
    }

    pub(crate) fn open(mut conn: Conn, addr: SocketAddr) -> io::Result<UdpSocket> {
        let reply = conn.request(&Header::new(Op::UdpBind).with_addr(addr), &[])?;
        Ok(UdpSocket {
            conn,
            local: reply.addr.unwrap_or(addr),
            peer: None,
        })
    }

    /// The address the service bound the socket to.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }

    /// The connected peer.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.peer
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotConnected))
    }

    /// Sets the default destination of [`send`](Self::send) and accepts datagrams only from
    /// `addr` in [`recv`](Self::recv) and [`recv_from`](Self::recv_from) (others are dropped).
    pub fn connect(&mut self, addr: SocketAddr) -> io::Result<()> {
        self.peer = Some(addr);
        Ok(())
    }

    /// In non-blocking mode sends fail with `WouldBlock` when the channel is full and receives
    /// when nothing is waiting.
    pub fn set_nonblocking(&mut self, on: bool) -> io::Result<()> {
        self.conn.nonblocking = on;
        Ok(())
    }

    /// Longest wait of a blocking receive (`None`: forever); it then fails with `WouldBlock`.
    pub fn set_read_timeout(&mut self, t: Option<Duration>) -> io::Result<()> {
        self.conn.read_timeout = t;
        Ok(())
    }

    /// Longest wait of a blocking send for room in the channel.
    pub fn set_write_timeout(&mut self, t: Option<Duration>) -> io::Result<()> {
        self.conn.write_timeout = t;
        Ok(())
    }

    /// How blocking operations wait: spin ([`Wait::BusyPoll`], for a cell that owns its hart),
    /// spin then sleep (default), or sleep.
    pub fn set_wait(&mut self, wait: Wait) {
        self.conn.set_wait(wait);
    }

    /// A pending asynchronous error reported by the service (e.g. `ECONNREFUSED`), cleared.
    pub fn take_error(&mut self) -> io::Result<Option<io::Error>> {
        Ok(self.conn.take_error())
    }

    fn check_len(len: usize) -> io::Result<()> {
        if len > MAX_PAYLOAD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("datagram of {len} bytes exceeds the service's maximum of {MAX_PAYLOAD}"),
            ));
        }
        Ok(())
    }

    fn send_header(to: SocketAddr, cookie: Option<u64>) -> Header {
        let mut h = Header::new(Op::Send).with_addr(to);
        h.stamp = tess_sched::clock::now_ns();
        if let Some(c) = cookie {
            h.flags |= FLAG_WANT_SENT;
            h.value = c;
        }
        h
    }

    /// Sends `buf` to `to`. Returns when the datagram is in the channel, not on the wire.
    pub fn send_to(&mut self, buf: &[u8], to: SocketAddr) -> io::Result<usize> {
        Self::check_len(buf.len())?;
        self.conn.send(&Self::send_header(to, None), buf)?;
        Ok(buf.len())
    }

    /// Sends `buf` to the connected peer.
    pub fn send(&mut self, buf: &[u8]) -> io::Result<usize> {
        let to = self.peer_addr()?;
        self.send_to(buf, to)
    }

    /// Like [`send_to`](Self::send_to), and asks the service to report when the datagram left
    /// the host: read it with [`take_sent`](Self::take_sent) after later receives.
    pub fn send_to_stamped(
        &mut self,
        buf: &[u8],
        to: SocketAddr,
        cookie: u64,
    ) -> io::Result<usize> {
        Self::check_len(buf.len())?;
        self.conn.send(&Self::send_header(to, Some(cookie)), buf)?;
        Ok(buf.len())
    }

    /// Sends a datagram of `len` bytes that `fill` writes in place in the channel (no copy).
    pub fn send_to_with(
        &mut self,
        len: usize,
        to: SocketAddr,
        fill: impl FnOnce(&mut [u8]),
    ) -> io::Result<usize> {
        Self::check_len(len)?;
        self.conn
            .send_with(&Self::send_header(to, None), len, fill)?;
        Ok(len)
    }

    /// The next transmit report of a [`send_to_stamped`](Self::send_to_stamped), if one came
    /// (reports arrive with received datagrams and are kept, the latest 64, until taken).
    pub fn take_sent(&mut self) -> Option<SentStamp> {
        self.conn.take_sent()
    }

    /// Transmit reports lost because 64 were waiting.
    pub fn sent_overwritten(&self) -> u64 {
        self.conn.sent_overwritten()
    }

    /// Hands the next datagram to `f` in place, without copying it. Polls for transmit reports
    /// too: in non-blocking mode a `WouldBlock` may still have queued some.
    pub fn recv_with<R>(&mut self, f: impl FnOnce(Datagram<'_>) -> R) -> io::Result<R> {
        let peer = self.peer;
        let mut f = Some(f);
        self.conn.next(None, |h, payload| {
            let (Op::Datagram, Some(from)) = (h.op, h.addr) else {
                return Seen::Skip;
            };
            if peer.is_some_and(|p| p != from) {
                return Seen::Skip;
            }
            let d = Datagram {
                payload,
                from,
                rx_ns: h.value,
                kernel_stamp: h.flags & FLAG_KERNEL_STAMP != 0,
                truncated: h.flags & FLAG_TRUNCATED != 0,
            };
            match f.take() {
                Some(f) => Seen::Take(f(d)),
                None => Seen::Skip,
            }
        })
    }

    /// Receives a datagram into `buf` (cut to fit, as with `std`); returns its length and
    /// sender.
    pub fn recv_from(&mut self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        self.recv_with(|d| {
            let n = d.payload.len().min(buf.len());
            buf[..n].copy_from_slice(&d.payload[..n]);
            (n, d.from)
        })
    }

    /// Receives a datagram from the connected peer.
    pub fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.peer_addr()?;
        self.recv_from(buf).map(|(n, _)| n)
    }
}
