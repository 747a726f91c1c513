//! UDP endpoints with kernel receive timestamps, allocation-free on the hot path.
//!
//! # Timestamps
//! Section 4 of seed 000 measures `t1` when the network driver sees the first packet of a package
//! and `t2` when it hands the answer to the adapter. The closest a Linux process gets is:
//!
//! - `t1`: the kernel's software receive timestamp (`SO_TIMESTAMPNS`, delivered as an
//!   `SCM_TIMESTAMPNS` control message with `recvmsg`). The kernel takes it with
//!   `ktime_get_real()` when the packet enters the network stack (`__netif_receive_skb`; for
//!   loopback and veth, right after the sender's `sendto` queued it), so it is a
//!   `CLOCK_REALTIME` instant and excludes every scheduling delay of the receiving thread.
//! - `t2`: `clock_gettime(CLOCK_REALTIME)` (vDSO, no system call) right after `sendto` returns.
//!
//! Both are on `CLOCK_REALTIME`, so `t2 - t1` needs no conversion. `CLOCK_REALTIME` can be
//! stepped by an administrator or NTP; a step inside one 1.4 ms interval spoils that one
//! sample, and slewing changes rates by at most 500 ppm (0.7 us over a deadline). When the
//! kernel provides no timestamp (never seen on Linux >= 2.6.22) the userspace time after
//! `recvmsg` returns is used and [`Received::kernel_stamp`] says so.
//!
//! # Glossary
//! - **spin / block**: `recvmsg` with `MSG_DONTWAIT` in a loop, or a blocking `recvmsg` that
//!   wakes the thread when a datagram arrives (bounded by a receive timeout so that stop requests
//!   are seen).
//!
//! # Worked example
//! A packet stamped by the kernel at `1_700_000_000.000_100_000` s and an answer sent at
//! `1_700_000_000.001_100_500` s give `t2 - t1 = 1_000_500` ns = 1000.5 us.

use nix::sys::socket::{SockaddrLike, SockaddrStorage};
use std::io;
use std::mem::{size_of, MaybeUninit};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::Duration;

pub use tess_sched::clock::realtime_ns;

/// How a receive call waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Return at once when nothing is queued (`MSG_DONTWAIT`); the caller spins.
    Poll,
    /// Sleep in the kernel until a datagram arrives or the socket's receive timeout passes.
    Block,
}

/// A socket address kept in kernel form (nix's [`SockaddrStorage`]), so sending to it needs no
/// conversion. `Copy`.
#[derive(Clone, Copy)]
pub struct Peer {
    addr: SockaddrStorage,
}

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.to_socket_addr() {
            Some(a) => write!(f, "Peer({a})"),
            None => write!(f, "Peer(<family {:?}>)", self.addr.family()),
        }
    }
}

impl Peer {
    /// The kernel form of `addr`.
    pub fn from_socket_addr(addr: SocketAddr) -> Peer {
        Peer {
            addr: SockaddrStorage::from(addr),
        }
    }

    /// The address, if it is IPv4 or IPv6.
    pub fn to_socket_addr(&self) -> Option<SocketAddr> {
        if let Some(v4) = self.addr.as_sockaddr_in() {
            return Some(SocketAddr::V4((*v4).into()));
        }
        self.addr
            .as_sockaddr_in6()
            .map(|v6| SocketAddr::V6((*v6).into()))
    }

    /// Whether two peers are the same address.
    pub fn same_as(&self, other: &Peer) -> bool {
        self.addr == other.addr
    }
}

/// One received datagram.
#[derive(Debug, Clone, Copy)]
pub struct Received {
    /// Bytes written into the buffer.
    pub len: usize,
    /// Receive time, `CLOCK_REALTIME` ns: the kernel's timestamp when available.
    pub rx_ns: u64,
    /// Whether `rx_ns` is the kernel's timestamp (true) or userspace time after `recvmsg`.
    pub kernel_stamp: bool,
    /// Sender.
    pub peer: Peer,
    /// The datagram was longer than the buffer and was cut.
    pub truncated: bool,
}

/// Error setting up an endpoint.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// Binding failed.
    #[error("cannot bind UDP socket to {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// A socket option failed.
    #[error("cannot set {option} on UDP socket {addr}: {source}")]
    Option {
        /// Option name.
        option: &'static str,
        /// Local address.
        addr: SocketAddr,
        /// Cause.
        #[source]
        source: io::Error,
    },
}

/// One message of a socket's error queue.
enum ErrorMessage {
    /// The queue is empty.
    Empty,
    /// A transmit timestamp: its number and `CLOCK_REALTIME` ns.
    TxStamp(u32, u64),
    /// Something else (an ICMP error, say).
    Other,
}

/// A UDP endpoint that timestamps what it receives.
#[derive(Debug)]
pub struct Endpoint {
    sock: UdpSocket,
    local: SocketAddr,
}

fn setsockopt_int(fd: i32, level: i32, name: i32, value: i32) -> io::Result<()> {
    // SAFETY: `value` lives across the call and we pass its exact size.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            &value as *const i32 as *const libc::c_void,
            size_of::<i32>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

impl Endpoint {
    /// Binds to `addr` with kernel receive timestamps on, 4 MiB socket buffers (forced when
    /// root, so the system limit needs no sysctl), and a receive timeout of 50 ms for
    /// [`Wait::Block`].
    pub fn bind(addr: SocketAddr) -> Result<Endpoint, NetError> {
        let sock = UdpSocket::bind(addr).map_err(|source| NetError::Bind { addr, source })?;
        let local = sock.local_addr().unwrap_or(addr);
        let fd = sock.as_raw_fd();
        setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1).map_err(|source| {
            NetError::Option {
                option: "SO_TIMESTAMPNS",
                addr: local,
                source,
            }
        })?;
        for (force, plain) in [
            (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
            (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
        ] {
            let size = 4 << 20;
            if setsockopt_int(fd, libc::SOL_SOCKET, force, size).is_err() {
                // Not root: take what the system limit allows.
                let _ = setsockopt_int(fd, libc::SOL_SOCKET, plain, size);
            }
        }
        sock.set_read_timeout(Some(Duration::from_millis(50)))
            .map_err(|source| NetError::Option {
                option: "SO_RCVTIMEO",
                addr: local,
                source,
            })?;
        Ok(Endpoint { sock, local })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Receives one datagram into `buf` with its receive timestamp. `Ok(None)` when nothing
    /// arrived ([`Wait::Poll`]) or the receive timeout passed ([`Wait::Block`]).
    /// Allocation-free.
    pub fn recv(&self, buf: &mut [u8], wait: Wait) -> io::Result<Option<Received>> {
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr() as *mut libc::c_void,
            iov_len: buf.len(),
        };
        // 128 bytes of u64-aligned control space: one SCM_TIMESTAMPNS needs 32, and with
        // transmit timestamps on, the kernel adds an SCM_TIMESTAMPING (64).
        let mut control = [0u64; 16];
        // SAFETY: SockaddrStorage is a C union of plain old data; all-zero is valid.
        let mut storage: SockaddrStorage = unsafe { std::mem::zeroed() };
        // SAFETY: msghdr is plain old data; we set every field the kernel reads below.
        let mut msg: libc::msghdr = unsafe { MaybeUninit::zeroed().assume_init() };
        msg.msg_name = &mut storage as *mut _ as *mut libc::c_void;
        msg.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = size_of::<[u64; 16]>();
        let flags = match wait {
            Wait::Poll => libc::MSG_DONTWAIT,
            Wait::Block => 0,
        };
        // SAFETY: `msg` points at live buffers (iov -> buf, name -> storage, control) whose
        // lengths are given; the kernel writes only within them.
        let n = unsafe { libc::recvmsg(self.sock.as_raw_fd(), &mut msg, flags) };
        if n < 0 {
            let err = io::Error::last_os_error();
            return match err.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(None),
                _ => Err(err),
            };
        }
        // SAFETY: `msg` was filled by a successful recvmsg; `control` is alive.
        let rx_ns = unsafe { tess_sched::clock::rx_timestamp_ns(&msg) };
        let (rx_ns, kernel_stamp) = match rx_ns {
            Some(t) => (t, true),
            None => (realtime_ns(), false),
        };
        Ok(Some(Received {
            len: n as usize,
            rx_ns,
            kernel_stamp,
            peer: Peer { addr: storage },
            truncated: msg.msg_flags & libc::MSG_TRUNC != 0,
        }))
    }

    /// Turns on kernel transmit timestamps for the datagrams sent with
    /// [`send_to_stamped`](Self::send_to_stamped) (`SO_TIMESTAMPING`: software stamps,
    /// numbered, without the payload); read them with [`recv_tx_stamp`](Self::recv_tx_stamp).
    pub fn enable_tx_stamps(&self) -> io::Result<()> {
        let flags = libc::SOF_TIMESTAMPING_SOFTWARE
            | libc::SOF_TIMESTAMPING_OPT_ID
            | libc::SOF_TIMESTAMPING_OPT_TSONLY;
        setsockopt_int(
            self.sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPING,
            flags as i32,
        )
    }

    /// Sends `buf` to `peer` asking the kernel for a software transmit timestamp (taken when
    /// the packet reaches the device: `veth_xmit`, or the driver of a real adapter). The n-th
    /// stamped send since [`enable_tx_stamps`](Self::enable_tx_stamps) gets stamp number n.
    /// Allocation-free.
    pub fn send_to_stamped(&self, buf: &[u8], peer: &Peer) -> io::Result<usize> {
        let mut iov = libc::iovec {
            iov_base: buf.as_ptr() as *mut libc::c_void,
            iov_len: buf.len(),
        };
        // CMSG_SPACE(4) = 24 bytes, u64-aligned.
        let mut control = [0u64; 3];
        // SAFETY: msghdr is plain old data; we set every field the kernel reads below.
        let mut msg: libc::msghdr = unsafe { MaybeUninit::zeroed().assume_init() };
        msg.msg_name = peer.addr.as_ptr() as *mut libc::c_void;
        msg.msg_namelen = peer.addr.len();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
        // SAFETY: CMSG_SPACE is arithmetic.
        msg.msg_controllen = unsafe { libc::CMSG_SPACE(size_of::<u32>() as u32) } as usize;
        // SAFETY: the control buffer holds one header and a u32 (CMSG_SPACE(4) <= 24 bytes);
        // CMSG_FIRSTHDR returns its start, CMSG_DATA the payload within it.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SO_TIMESTAMPING;
            (*cmsg).cmsg_len = libc::CMSG_LEN(size_of::<u32>() as u32) as usize;
            std::ptr::write_unaligned(
                libc::CMSG_DATA(cmsg) as *mut u32,
                libc::SOF_TIMESTAMPING_TX_SOFTWARE,
            );
        }
        // SAFETY: `msg` points at live buffers (iov -> buf, name -> peer, control) whose
        // lengths are given; the kernel only reads them.
        let n = unsafe { libc::sendmsg(self.sock.as_raw_fd(), &msg, 0) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }

    /// Takes one transmit timestamp from the socket's error queue: `(number, CLOCK_REALTIME
    /// ns)`, numbered as the stamped sends were. `Ok(None)` when none is queued.
    /// Allocation-free.
    pub fn recv_tx_stamp(&self) -> io::Result<Option<(u32, u64)>> {
        loop {
            match self.recv_error_message()? {
                ErrorMessage::Empty => return Ok(None),
                ErrorMessage::TxStamp(id, ns) => return Ok(Some((id, ns))),
                ErrorMessage::Other => continue,
            }
        }
    }

    /// Reads one message of the socket's error queue.
    fn recv_error_message(&self) -> io::Result<ErrorMessage> {
        let mut control = [0u64; 16];
        // SAFETY: msghdr is plain old data; we set every field the kernel reads below.
        let mut msg: libc::msghdr = unsafe { MaybeUninit::zeroed().assume_init() };
        msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = size_of::<[u64; 16]>();
        // SAFETY: `msg` points at the live control buffer of the given length (no data: the
        // stamps carry no payload).
        let n = unsafe {
            libc::recvmsg(
                self.sock.as_raw_fd(),
                &mut msg,
                libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT,
            )
        };
        if n < 0 {
            let err = io::Error::last_os_error();
            return match err.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(ErrorMessage::Empty),
                _ => Err(err),
            };
        }
        let (mut id, mut ns) = (None, None);
        // SAFETY: `msg` was filled by a successful recvmsg; the CMSG_* macros walk the control
        // buffer within `msg_controllen`; an SCM_TIMESTAMPING payload is three timespecs and
        // an IP(V6)_RECVERR payload starts with a sock_extended_err.
        unsafe {
            let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
            while !cmsg.is_null() {
                let (level, kind) = ((*cmsg).cmsg_level, (*cmsg).cmsg_type);
                if level == libc::SOL_SOCKET && kind == libc::SO_TIMESTAMPING {
                    let ts =
                        std::ptr::read_unaligned(libc::CMSG_DATA(cmsg) as *const libc::timespec);
                    ns = Some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64);
                } else if (level == libc::SOL_IP && kind == libc::IP_RECVERR)
                    || (level == libc::SOL_IPV6 && kind == libc::IPV6_RECVERR)
                {
                    let err = std::ptr::read_unaligned(
                        libc::CMSG_DATA(cmsg) as *const libc::sock_extended_err
                    );
                    if err.ee_errno == libc::ENOMSG as u32
                        && err.ee_origin == libc::SO_EE_ORIGIN_TIMESTAMPING
                    {
                        id = Some(err.ee_data);
                    }
                }
                cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
            }
        }
        Ok(match id.zip(ns) {
            Some((id, ns)) => ErrorMessage::TxStamp(id, ns),
            None => ErrorMessage::Other,
        })
    }

    /// Sends `buf` to `peer`. Allocation-free.
    #[inline]
    pub fn send_to(&self, buf: &[u8], peer: &Peer) -> io::Result<usize> {
        // SAFETY: `buf` is valid for its length and `peer.addr` for its own.
        let n = unsafe {
            libc::sendto(
                self.sock.as_raw_fd(),
                buf.as_ptr() as *const libc::c_void,
                buf.len(),
                0,
                peer.addr.as_ptr(),
                peer.addr.len(),
            )
        };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }
}

/// A tap on the cable between the SLABS and the host: a packet socket on the wire's
/// host-facing interface (`netns::NetnsPair`) that sees packets 0 and 15 of every input package
/// as they leave for the host, each with the kernel's time of its departure (taken as the
/// packet is handed to the interface, after the cable's queue released it). A classic BPF
/// filter in the kernel drops everything else before it is copied, so the tap costs the hart
/// that runs the wire one filter run per packet and a 66-byte copy per stamped one.
#[derive(Debug)]
pub struct WireTap {
    fd: std::os::fd::OwnedFd,
}

/// One departure seen by a [`WireTap`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Departure {
    /// Package sequence number.
    pub seq: u32,
    /// Packet index within the package (0 or 15).
    pub index: u16,
    /// When the packet left, `CLOCK_REALTIME` ns (the kernel's stamp).
    pub ns: u64,
}

/// Bytes of the frame before the SLABS header: Ethernet (14), IPv4 without options (20), UDP (8).
const TAP_PAYLOAD: usize = 42;

/// The tap's filter: IPv4, UDP, SLABS input magic, packet index 0 or 15 (a little-endian u16,
/// which a BPF half-word load reads byte-swapped); keeps the headers and the SLABS header.
fn tap_filter() -> [libc::sock_filter; 11] {
    let op = |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    let (ld_h, ld_b, ld_w) = (
        libc::BPF_LD | libc::BPF_H | libc::BPF_ABS,
        libc::BPF_LD | libc::BPF_B | libc::BPF_ABS,
        libc::BPF_LD | libc::BPF_W | libc::BPF_ABS,
    );
    let jeq = libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K;
    let ret = libc::BPF_RET | libc::BPF_K;
    let magic = u32::from_be_bytes(crate::slabs::INPUT_MAGIC);
    let keep = (TAP_PAYLOAD + crate::slabs::HEADER_BYTES) as u32;
    [
        op(ld_h, 0, 0, 12),                      // 0: ethertype
        op(jeq, 0, 8, 0x0800),                   // 1: IPv4, else drop (10)
        op(ld_b, 0, 0, 23),                      // 2: IP protocol
        op(jeq, 0, 6, libc::IPPROTO_UDP as u32), // 3: UDP, else drop
        op(ld_w, 0, 0, TAP_PAYLOAD as u32),      // 4: SLABS magic
        op(jeq, 0, 4, magic),                    // 5: input packet, else drop
        op(ld_h, 0, 0, TAP_PAYLOAD as u32 + 8),  // 6: packet index, byte-swapped
        op(jeq, 1, 0, 0),                        // 7: index 0: keep (9)
        op(jeq, 0, 1, 15 << 8),                  // 8: index 15: keep, else drop
        op(ret, 0, 0, keep),                     // 9: keep the headers
        op(ret, 0, 0, 0),                        // 10: drop
    ]
}

impl WireTap {
    /// Opens a tap on interface `ifname` of the calling thread's network namespace (root:
    /// `CAP_NET_RAW`). The filter is attached before the socket is bound, so no other packet is
    /// ever queued on it.
    pub fn open(ifname: &str) -> io::Result<WireTap> {
        use std::os::fd::FromRawFd;
        let name = std::ffi::CString::new(ifname)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "interface name with NUL"))?;
        // SAFETY: a NUL-terminated string that lives across the call.
        let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if index == 0 {
            return Err(io::Error::last_os_error());
        }
        // Protocol 0: the socket receives nothing until it is bound below.
        // SAFETY: socket(2) takes plain integers.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor that nothing else owns.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
        let mut filter = tap_filter();
        let prog = libc::sock_fprog {
            len: filter.len() as u16,
            filter: filter.as_mut_ptr(),
        };
        // SAFETY: `prog` points at `filter`, alive across the call; the kernel copies it.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_ATTACH_FILTER,
                &prog as *const libc::sock_fprog as *const libc::c_void,
                size_of::<libc::sock_fprog>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        setsockopt_int(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1)?;
        if setsockopt_int(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            4 << 20,
        )
        .is_err()
        {
            let _ = setsockopt_int(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, 4 << 20);
        }
        // SAFETY: sockaddr_ll is plain old data; all-zero is valid before we fill it.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
        sll.sll_ifindex = index as i32;
        // SAFETY: `sll` is a valid sockaddr_ll of the size given.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                &sll as *const libc::sockaddr_ll as *const libc::sockaddr,
                size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(WireTap { fd })
    }

    /// The next departure the tap saw, `None` when nothing is queued. Allocation-free.
    pub fn next(&self) -> io::Result<Option<Departure>> {
        let mut buf = [0u8; 128];
        loop {
            let mut iov = libc::iovec {
                iov_base: buf.as_mut_ptr() as *mut libc::c_void,
                iov_len: buf.len(),
            };
            let mut control = [0u64; 8];
            // SAFETY: sockaddr_ll and msghdr are plain old data; all-zero is valid.
            let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            let mut msg: libc::msghdr = unsafe { MaybeUninit::zeroed().assume_init() };
            msg.msg_name = &mut from as *mut libc::sockaddr_ll as *mut libc::c_void;
            msg.msg_namelen = size_of::<libc::sockaddr_ll>() as libc::socklen_t;
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
            msg.msg_controllen = size_of::<[u64; 8]>();
            // SAFETY: `msg` points at live buffers of the given lengths.
            let n = unsafe { libc::recvmsg(self.fd.as_raw_fd(), &mut msg, libc::MSG_DONTWAIT) };
            if n < 0 {
                let err = io::Error::last_os_error();
                return match err.raw_os_error() {
                    Some(libc::EAGAIN) => Ok(None),
                    Some(libc::EINTR) => continue,
                    _ => Err(err),
                };
            }
            let n = n as usize;
            if from.sll_pkttype != libc::PACKET_OUTGOING
                || n < TAP_PAYLOAD + crate::slabs::HEADER_BYTES
            {
                continue;
            }
            let h = crate::slabs::Header::read(&buf[TAP_PAYLOAD..n]);
            // SAFETY: `msg` was filled by the successful recvmsg above; `control` is alive.
            let Some(ns) = (unsafe { tess_sched::clock::rx_timestamp_ns(&msg) }) else {
                continue;
            };
            return Ok(Some(Departure {
                seq: h.seq,
                index: h.index,
                ns,
            }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_datagrams_carry_kernel_timestamps() {
        let a = Endpoint::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let b = Endpoint::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let to_b = Peer::from_socket_addr(b.local_addr());
        assert_eq!(to_b.to_socket_addr(), Some(b.local_addr()));
        let before = realtime_ns();
        a.send_to(b"hello", &to_b).unwrap();
        let mut buf = [0u8; 64];
        let r = loop {
            if let Some(r) = b.recv(&mut buf, Wait::Block).unwrap() {
                break r;
            }
        };
        let after = realtime_ns();
        assert_eq!(&buf[..r.len], b"hello");
        assert!(r.kernel_stamp);
        assert!(
            r.rx_ns >= before && r.rx_ns <= after,
            "{before} {} {after}",
            r.rx_ns
        );
        assert_eq!(r.peer.to_socket_addr(), Some(a.local_addr()));
        assert!(r.peer.same_as(&Peer::from_socket_addr(a.local_addr())));
        assert!(b.recv(&mut buf, Wait::Poll).unwrap().is_none());
    }

    #[test]
    fn stamped_sends_get_numbered_kernel_transmit_stamps() {
        let a = Endpoint::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let b = Endpoint::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        a.enable_tx_stamps().unwrap();
        let peer = Peer::from_socket_addr(b.local_addr());
        assert_eq!(a.recv_tx_stamp().unwrap(), None);
        let before = realtime_ns();
        a.send_to(b"plain", &peer).unwrap();
        a.send_to_stamped(b"first", &peer).unwrap();
        a.send_to_stamped(b"second", &peer).unwrap();
        let after = realtime_ns();
        let (id0, t0) = a.recv_tx_stamp().unwrap().expect("first stamp");
        let (id1, t1) = a.recv_tx_stamp().unwrap().expect("second stamp");
        assert_eq!((id0, id1), (0, 1), "unstamped sends take no number");
        assert!(
            before <= t0 && t0 <= t1 && t1 <= after,
            "{before} {t0} {t1} {after}"
        );
        assert_eq!(a.recv_tx_stamp().unwrap(), None);
        // The datagrams arrive as usual, with receive stamps.
        let mut buf = [0u8; 16];
        for want in [&b"plain"[..], b"first", b"second"] {
            let r = b.recv(&mut buf, Wait::Block).unwrap().unwrap();
            assert_eq!(&buf[..r.len], want);
            assert!(r.kernel_stamp);
        }
    }

    #[test]
    fn ipv6_peers_round_trip() {
        let addr: SocketAddr = "[::1]:9000".parse().unwrap();
        assert_eq!(Peer::from_socket_addr(addr).to_socket_addr(), Some(addr));
    }
}
