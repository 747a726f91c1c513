//! A TCP connection that is either the network service's (its cell owns the socket, and the
//! service shapes it in the caller's flow) or a kernel socket of this process (the Linux
//! baseline). `tess net fetch` and the conference bench's receivers read through it.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;
use tess_net::client::{Net, TcpStream as ServiceStream, Wait};

/// A TCP connection through the network service or the kernel.
pub enum NetStream {
    /// Through the network service.
    Service(Box<ServiceStream>),
    /// A kernel socket of this process.
    Kernel(std::net::TcpStream),
}

impl NetStream {
    /// Connects with a kernel socket (no Nagle: requests and answers are small and timed).
    pub fn kernel(to: SocketAddr) -> std::io::Result<NetStream> {
        let s = std::net::TcpStream::connect(to)?;
        let _ = s.set_nodelay(true);
        Ok(NetStream::Kernel(s))
    }

    /// Connects through `net`. Waiting for data sleeps, as on a kernel socket: the reader's
    /// CPU is its cell's to compute with, not to spin on.
    pub fn through(net: &Net, to: SocketAddr) -> std::io::Result<NetStream> {
        let mut s = net.tcp_connect(to)?;
        s.set_wait(Wait::Sleep);
        Ok(NetStream::Service(Box::new(s)))
    }

    /// Makes reads give up after `t` (`WouldBlock` or `TimedOut`).
    pub fn set_read_timeout(&mut self, t: Duration) -> std::io::Result<()> {
        match self {
            NetStream::Service(s) => s.set_read_timeout(Some(t)),
            NetStream::Kernel(s) => s.set_read_timeout(Some(t)),
        }
    }

    /// Makes reads return `WouldBlock` instead of waiting.
    pub fn set_nonblocking(&mut self) -> std::io::Result<()> {
        match self {
            NetStream::Service(s) => s.set_nonblocking(true),
            NetStream::Kernel(s) => s.set_nonblocking(true),
        }
    }
}

impl Read for NetStream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            NetStream::Service(s) => s.read(buf),
            NetStream::Kernel(s) => s.read(buf),
        }
    }
}

impl Write for NetStream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            NetStream::Service(s) => s.write(buf),
            NetStream::Kernel(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            NetStream::Service(s) => s.flush(),
            NetStream::Kernel(s) => s.flush(),
        }
    }
}
