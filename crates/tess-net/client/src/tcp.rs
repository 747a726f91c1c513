//! TCP streams and listeners owned by the service, used like `std::net`'s.
//!
//! Each stream has its own channel. A listener's channel carries `ACCEPTED` notices; accepting
//! opens a fresh channel to the service and adopts the connection onto it with the notice's
//! token, so that streams never share a channel (no head-of-line blocking between them).

use crate::conn::{Conn, Seen};
use crate::wire::{Header, Op, MAX_PAYLOAD};
use crate::Net;
use std::io;
use std::net::{Shutdown, SocketAddr};
use std::time::Duration;
use tess_channel::Wait;

/// A TCP connection in the network service.
#[derive(Debug)]
pub struct TcpStream {
    conn: Conn,
    local: SocketAddr,
    peer: SocketAddr,
    /// Bytes of the `DATA` record at the head of the channel already read.
    rx_offset: usize,
    eof: bool,
}

impl TcpStream {
    /// Connects to `addr` through the service named by `TESS_NET_SERVICE` (default `net`).
    pub fn connect(addr: SocketAddr) -> io::Result<TcpStream> {
        Net::from_env().tcp_connect(addr)
    }

    pub(crate) fn open(mut conn: Conn, addr: SocketAddr) -> io::Result<TcpStream> {
        let reply = conn.request(&Header::new(Op::TcpConnect).with_addr(addr), &[])?;
        Ok(TcpStream::from_conn(conn, reply.addr.unwrap_or(addr), addr))
    }

    fn from_conn(conn: Conn, local: SocketAddr, peer: SocketAddr) -> TcpStream {
        TcpStream {
            conn,
            local,
            peer,
            rx_offset: 0,
            eof: false,
        }
    }

    /// Local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }

    /// Remote address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.peer)
    }

    /// Non-blocking reads and writes fail with `WouldBlock` instead of waiting.
    pub fn set_nonblocking(&mut self, on: bool) -> io::Result<()> {
        self.conn.nonblocking = on;
        Ok(())
    }

    /// Longest wait of a blocking read.
    pub fn set_read_timeout(&mut self, t: Option<Duration>) -> io::Result<()> {
        self.conn.read_timeout = t;
        Ok(())
    }

    /// Longest wait of a blocking write for room in the channel.
    pub fn set_write_timeout(&mut self, t: Option<Duration>) -> io::Result<()> {
        self.conn.write_timeout = t;
        Ok(())
    }

    /// How blocking operations wait (see [`tess_channel::Wait`]).
    pub fn set_wait(&mut self, wait: Wait) {
        self.conn.set_wait(wait);
    }

    /// Shuts down the writing side (the peer reads end of stream). Reading is unaffected; the
    /// connection closes when the stream is dropped.
    pub fn shutdown(&mut self, how: Shutdown) -> io::Result<()> {
        match how {
            Shutdown::Read => Ok(()),
            Shutdown::Write | Shutdown::Both => {
                self.conn.send(&Header::new(Op::Shutdown), &[]).map(|_| ())
            }
        }
    }
}

impl io::Read for TcpStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.eof || buf.is_empty() {
            return Ok(0);
        }
        let off = &mut self.rx_offset;
        let eof = &mut self.eof;
        self.conn.next(None, |h, payload| match h.op {
            Op::Data => {
                let rest = payload.get(*off..).unwrap_or(&[]);
                let n = rest.len().min(buf.len());
                buf[..n].copy_from_slice(&rest[..n]);
                if n == rest.len() {
                    *off = 0;
                    Seen::Take(n)
                } else {
                    *off += n;
                    Seen::Keep(n)
                }
            }
            Op::Eof => {
                *eof = true;
                Seen::Take(0)
            }
            _ => Seen::Skip,
        })
    }
}

impl io::Write for TcpStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut written = 0;
        for chunk in buf.chunks(MAX_PAYLOAD) {
            let mut h = Header::new(Op::Write);
            h.stamp = tess_sched::clock::now_ns();
            match self.conn.send(&h, chunk) {
                Ok(()) => written += chunk.len(),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && written > 0 => break,
                Err(e) => return Err(e),
            }
        }
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A TCP listener in the network service.
#[derive(Debug)]
pub struct TcpListener {
    conn: Conn,
    local: SocketAddr,
    net: Net,
}

impl TcpListener {
    /// Listens on `addr` through the service named by `TESS_NET_SERVICE` (default `net`).
    pub fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
        Net::from_env().tcp_listen(addr)
    }

    pub(crate) fn open(
        mut conn: Conn,
        addr: SocketAddr,
        backlog: u16,
        net: Net,
    ) -> io::Result<TcpListener> {
        let mut h = Header::new(Op::TcpListen).with_addr(addr);
        h.status = backlog;
        let reply = conn.request(&h, &[])?;
        Ok(TcpListener {
            conn,
            local: reply.addr.unwrap_or(addr),
            net,
        })
    }

    /// Local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }

    /// Non-blocking accepts fail with `WouldBlock` when no connection waits.
    pub fn set_nonblocking(&mut self, on: bool) -> io::Result<()> {
        self.conn.nonblocking = on;
        Ok(())
    }

    /// Waits for a connection and adopts it onto a channel of its own.
    pub fn accept(&mut self) -> io::Result<(TcpStream, SocketAddr)> {
        let (token, peer) = self.conn.next(None, |h, _| match (h.op, h.addr) {
            (Op::Accepted, Some(peer)) => Seen::Take((h.value, peer)),
            _ => Seen::Skip,
        })?;
        let mut conn = self.net.open()?;
        let mut h = Header::new(Op::Adopt);
        h.value = token;
        let reply = conn.request(&h, &[])?;
        let local = reply.addr.unwrap_or(self.local);
        Ok((TcpStream::from_conn(conn, local, peer), peer))
    }
}
