//! The system calls of the service's data path: batched UDP I/O with kernel receive timestamps
//! (`recvmmsg`, `sendmmsg`), non-blocking TCP, epoll. Buffers are preallocated once.

use nix::sys::socket::{SockaddrLike, SockaddrStorage};
use std::io;
use std::mem::{size_of, zeroed};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

pub use tess_sched::clock::realtime_ns;

fn cvt(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn setsockopt_int(fd: RawFd, level: i32, name: i32, value: i32) -> io::Result<()> {
    // SAFETY: `value` lives across the call and its exact size is passed.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            &value as *const i32 as *const libc::c_void,
            size_of::<i32>() as libc::socklen_t,
        )
    })
    .map(|_| ())
}

/// Reads an IPv4 or IPv6 address from kernel form.
pub fn read_sockaddr(addr: &SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = addr.as_sockaddr_in() {
        return Some(SocketAddr::V4((*v4).into()));
    }
    addr.as_sockaddr_in6()
        .map(|v6| SocketAddr::V6((*v6).into()))
}

/// A non-blocking UDP socket with kernel receive timestamps and 4 MiB buffers.
pub fn udp_socket(addr: SocketAddr) -> io::Result<(UdpSocket, SocketAddr)> {
    let s = UdpSocket::bind(addr)?;
    s.set_nonblocking(true)?;
    let fd = s.as_raw_fd();
    setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1)?;
    for (force, plain) in [
        (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
        (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
    ] {
        if setsockopt_int(fd, libc::SOL_SOCKET, force, 4 << 20).is_err() {
            // Not root: what the system limit allows.
            let _ = setsockopt_int(fd, libc::SOL_SOCKET, plain, 4 << 20);
        }
    }
    let local = s.local_addr()?;
    Ok((s, local))
}

/// A non-blocking TCP listener.
pub fn tcp_listener(addr: SocketAddr) -> io::Result<(TcpListener, SocketAddr)> {
    let l = TcpListener::bind(addr)?;
    l.set_nonblocking(true)?;
    let local = l.local_addr()?;
    Ok((l, local))
}

/// Starts a non-blocking TCP connection, with a receive buffer of `rcvbuf` bytes if given (set
/// before connecting, so that the window it announces fits); it completes when the socket
/// becomes writable (then check [`take_socket_error`]).
pub fn tcp_connect_start(addr: SocketAddr, rcvbuf: Option<usize>) -> io::Result<TcpStream> {
    let family = match addr {
        SocketAddr::V4(_) => libc::AF_INET,
        SocketAddr::V6(_) => libc::AF_INET6,
    };
    // SAFETY: plain socket(2); the result is checked.
    let fd = cvt(unsafe {
        libc::socket(
            family,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    })?;
    // SAFETY: `fd` is a fresh descriptor we own.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    if let Some(bytes) = rcvbuf {
        let bytes = i32::try_from(bytes).unwrap_or(i32::MAX);
        setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, bytes)?;
    }
    let to = SockaddrStorage::from(addr);
    // SAFETY: `to` holds a valid address of `to.len()` bytes.
    let rc = unsafe { libc::connect(fd, to.as_ptr(), to.len()) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINPROGRESS) {
            return Err(e);
        }
    }
    let _ = setsockopt_int(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, 1);
    Ok(TcpStream::from(owned))
}

/// `SO_ERROR` of a socket (cleared by reading).
pub fn take_socket_error(fd: RawFd) -> io::Result<i32> {
    let mut v: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `v` and `len` are valid for the kernel to write.
    cvt(unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ERROR,
            &mut v as *mut _ as *mut libc::c_void,
            &mut len,
        )
    })?;
    Ok(v)
}

/// An epoll instance (level-triggered).
#[derive(Debug)]
pub struct Epoll {
    fd: OwnedFd,
    events: Vec<libc::epoll_event>,
    ready: usize,
}

impl Epoll {
    /// A new instance returning up to `max_events` per wait.
    pub fn new(max_events: usize) -> io::Result<Epoll> {
        // SAFETY: plain epoll_create1; the result is checked.
        let fd = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        Ok(Epoll {
            // SAFETY: a fresh descriptor we own.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            events: vec![libc::epoll_event { events: 0, u64: 0 }; max_events.max(1)],
            ready: 0,
        })
    }

    fn ctl(&self, op: i32, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event { events, u64: token };
        // SAFETY: `ev` is a valid event for the duration of the call.
        cvt(unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), op, fd, &mut ev) }).map(|_| ())
    }

    /// Watches `fd` for `events` (`EPOLLIN`, `EPOLLOUT`), reporting `token`.
    pub fn add(&self, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, events, token)
    }

    /// Changes the events of `fd`.
    pub fn modify(&self, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_MOD, fd, events, token)
    }

    /// Stops watching `fd`.
    pub fn delete(&self, fd: RawFd) {
        let _ = self.ctl(libc::EPOLL_CTL_DEL, fd, 0, 0);
    }

    /// Waits up to `timeout` (zero: poll) and returns how many events are ready.
    pub fn wait(&mut self, timeout: Duration) -> io::Result<usize> {
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: `events` has `len` writable entries; `ts` is a valid timespec; no sigmask.
        let n = unsafe {
            libc::epoll_pwait2(
                self.fd.as_raw_fd(),
                self.events.as_mut_ptr(),
                self.events.len() as libc::c_int,
                &ts,
                std::ptr::null(),
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            self.ready = 0;
            return if e.raw_os_error() == Some(libc::EINTR) {
                Ok(0)
            } else {
                Err(e)
            };
        }
        self.ready = n as usize;
        Ok(self.ready)
    }

    /// The events of the last wait, as (token, events).
    pub fn ready(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.events[..self.ready].iter().map(|e| (e.u64, e.events))
    }
}

/// Preallocated state of batched datagram I/O: `batch` buffers of `buf_len` bytes, each
/// starting `headroom` bytes in (room for a record header written in front of the datagram).
pub struct Mmsg {
    bufs: Vec<u8>,
    buf_len: usize,
    headroom: usize,
    iov: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
    addrs: Vec<SockaddrStorage>,
    cmsg: Vec<[u64; 8]>,
    /// Length of each slot's datagram (after a receive, or as set before a send).
    pub lens: Vec<usize>,
}

// SAFETY: the raw pointers inside the headers and iovecs point only into this value's own
// buffers (heap allocations that move with it) and are rewritten before every call; nothing
// else holds them.
unsafe impl Send for Mmsg {}

impl std::fmt::Debug for Mmsg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mmsg")
            .field("batch", &self.lens.len())
            .field("buf_len", &self.buf_len)
            .finish()
    }
}

/// One datagram of a receive batch.
#[derive(Debug, Clone, Copy)]
pub struct RxMeta {
    /// Bytes received (cut at the buffer length).
    pub len: usize,
    /// Sender.
    pub from: Option<SocketAddr>,
    /// Kernel receive timestamp (realtime ns), if the kernel gave one.
    pub kernel_ns: Option<u64>,
    /// The datagram was cut.
    pub truncated: bool,
}

impl Mmsg {
    /// `batch` slots of `headroom + payload` bytes.
    pub fn new(batch: usize, headroom: usize, payload: usize) -> Mmsg {
        let batch = batch.max(1);
        let buf_len = headroom + payload;
        Mmsg {
            bufs: vec![0; batch * buf_len],
            buf_len,
            headroom,
            // SAFETY (zeroed): iovec, mmsghdr and sockaddr_storage are plain old data; all-zero
            // values are valid and every pointer is set before each call.
            iov: vec![
                libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0
                };
                batch
            ],
            // SAFETY: mmsghdr is plain old data; all-zero is valid (null pointers, zero lengths).
            hdrs: vec![unsafe { zeroed::<libc::mmsghdr>() }; batch],
            // SAFETY: SockaddrStorage is a C union of plain old data; all-zero is valid.
            addrs: vec![unsafe { zeroed::<SockaddrStorage>() }; batch],
            cmsg: vec![[0u64; 8]; batch],
            lens: vec![0; batch],
        }
    }

    /// Slots.
    pub fn batch(&self) -> usize {
        self.lens.len()
    }

    /// Payload capacity of a slot.
    pub fn payload_capacity(&self) -> usize {
        self.buf_len - self.headroom
    }

    /// Slot `i` including its headroom.
    pub fn slot(&self, i: usize) -> &[u8] {
        &self.bufs[i * self.buf_len..(i + 1) * self.buf_len]
    }

    /// Slot `i` including its headroom, writable.
    pub fn slot_mut(&mut self, i: usize) -> &mut [u8] {
        &mut self.bufs[i * self.buf_len..(i + 1) * self.buf_len]
    }

    /// Receives up to `max` datagrams from `fd` without waiting. Returns how many; their
    /// payloads are at `slot(i)[headroom..headroom + len]`.
    pub fn recv(&mut self, fd: RawFd, max: usize, meta: &mut [RxMeta]) -> io::Result<usize> {
        let n = max.min(self.batch()).min(meta.len());
        if n == 0 {
            return Ok(0);
        }
        let base = self.bufs.as_mut_ptr();
        for i in 0..n {
            // SAFETY: slot i lies within `bufs` (batch * buf_len bytes).
            let p = unsafe { base.add(i * self.buf_len + self.headroom) };
            self.iov[i] = libc::iovec {
                iov_base: p as *mut libc::c_void,
                iov_len: self.buf_len - self.headroom,
            };
            let h = &mut self.hdrs[i];
            h.msg_hdr.msg_name = &mut self.addrs[i] as *mut _ as *mut libc::c_void;
            h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_hdr.msg_iov = &mut self.iov[i];
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = self.cmsg[i].as_mut_ptr() as *mut libc::c_void;
            h.msg_hdr.msg_controllen = size_of::<[u64; 8]>();
            h.msg_hdr.msg_flags = 0;
            h.msg_len = 0;
        }
        // SAFETY: the first `n` headers point at live buffers (iov -> bufs, name -> addrs,
        // control -> cmsg) of the lengths given; the kernel writes only within them.
        let got = unsafe {
            libc::recvmmsg(
                fd,
                self.hdrs.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if got < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(0),
                _ => Err(e),
            };
        }
        let got = got as usize;
        for (i, m) in meta.iter_mut().enumerate().take(got) {
            let h = &self.hdrs[i];
            // SAFETY: the header was filled by a successful recvmmsg and its control buffer
            // (self.cmsg[i]) is alive.
            let kernel_ns = unsafe { tess_sched::clock::rx_timestamp_ns(&h.msg_hdr) };
            let len = h.msg_len as usize;
            self.lens[i] = len;
            *m = RxMeta {
                len,
                from: read_sockaddr(&self.addrs[i]),
                kernel_ns,
                truncated: h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
            };
        }
        Ok(got)
    }

    /// Sets slot `i`'s destination for [`send`](Self::send).
    pub fn set_dest(&mut self, i: usize, to: &SocketAddr) {
        self.addrs[i] = SockaddrStorage::from(*to);
        self.hdrs[i].msg_hdr.msg_namelen = self.addrs[i].len();
    }

    /// Sends slots `0..n` (payload at `headroom`, `lens[i]` bytes, destination from
    /// [`set_dest`](Self::set_dest)) with one `sendmmsg`. Returns how many the kernel took;
    /// `Ok(0)` when it would block.
    pub fn send(&mut self, fd: RawFd, n: usize) -> io::Result<usize> {
        let n = n.min(self.batch());
        if n == 0 {
            return Ok(0);
        }
        let base = self.bufs.as_mut_ptr();
        for i in 0..n {
            // SAFETY: slot i lies within `bufs`.
            let p = unsafe { base.add(i * self.buf_len + self.headroom) };
            self.iov[i] = libc::iovec {
                iov_base: p as *mut libc::c_void,
                iov_len: self.lens[i].min(self.buf_len - self.headroom),
            };
            let h = &mut self.hdrs[i];
            h.msg_hdr.msg_name = &mut self.addrs[i] as *mut _ as *mut libc::c_void;
            h.msg_hdr.msg_iov = &mut self.iov[i];
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = std::ptr::null_mut();
            h.msg_hdr.msg_controllen = 0;
            h.msg_hdr.msg_flags = 0;
        }
        // SAFETY: the first `n` headers point at live buffers of the lengths given; the kernel
        // only reads them.
        let sent = unsafe {
            libc::sendmmsg(
                fd,
                self.hdrs.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT,
            )
        };
        if sent < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::ENOBUFS) | Some(libc::EINTR) => Ok(0),
                _ => Err(e),
            };
        }
        Ok(sent as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_cross_loopback_with_timestamps() {
        let (a, a_addr) = udp_socket("127.0.0.1:0".parse().unwrap()).unwrap();
        let (b, b_addr) = udp_socket("127.0.0.1:0".parse().unwrap()).unwrap();
        let mut tx = Mmsg::new(4, 8, 64);
        for i in 0..3 {
            let s = tx.slot_mut(i);
            s[8..13].copy_from_slice(b"hello");
            s[12] = b'0' + i as u8;
            tx.lens[i] = 5;
            tx.set_dest(i, &b_addr);
        }
        assert_eq!(tx.send(a.as_raw_fd(), 3).unwrap(), 3);
        let mut rx = Mmsg::new(8, 8, 64);
        let mut meta = [RxMeta {
            len: 0,
            from: None,
            kernel_ns: None,
            truncated: false,
        }; 8];
        let mut got = 0;
        for _ in 0..1000 {
            got += rx.recv(b.as_raw_fd(), 8 - got, &mut meta[got..]).unwrap();
            if got == 3 {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(got, 3);
        for (i, m) in meta.iter().enumerate().take(3) {
            assert_eq!(m.from, Some(a_addr));
            assert!(m.kernel_ns.is_some());
            assert_eq!(&rx.slot(i)[8..8 + m.len], format!("hell{i}").as_bytes());
        }
        assert_eq!(rx.recv(b.as_raw_fd(), 8, &mut meta).unwrap(), 0);
    }

    #[test]
    fn addresses_round_trip() {
        for s in ["10.0.0.1:80", "[::1]:9000"] {
            let a: SocketAddr = s.parse().unwrap();
            assert_eq!(read_sockaddr(&SockaddrStorage::from(a)), Some(a));
        }
    }
}
