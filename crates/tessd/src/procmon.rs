//! Fork events from the kernel's process connector (netlink `NETLINK_CONNECTOR`, `CN_IDX_PROC`).
//!
//! A thread created inside a reserved cell starts under CFS (its parent's deadline policy is
//! reset on fork); this watcher lets the daemon place it under the cell's reservation within
//! microseconds instead of at the next periodic sweep.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const NETLINK_CONNECTOR: libc::c_int = 11;
const CN_IDX_PROC: u32 = 1;
const CN_VAL_PROC: u32 = 1;
const PROC_CN_MCAST_LISTEN: u32 = 1;
const PROC_EVENT_FORK: u32 = 0x0000_0001;
const NLMSG_HDRLEN: usize = 16;
const CN_MSG_LEN: usize = 20;

/// A fork (process or thread creation).
///
/// The kernel fills `parent_*` from the new task's `real_parent`: for a new process that is the
/// thread that forked, but for a new thread it is the *process's* parent (threads share it), not
/// the thread that called `clone`. [`Fork::creator_process`] says where to look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fork {
    /// The new task's parent (see above).
    pub parent_tid: i32,
    /// Its process.
    pub parent_tgid: i32,
    /// The new thread.
    pub child_tid: i32,
    /// The new thread's process.
    pub child_tgid: i32,
}

impl Fork {
    /// Whether this created a thread in an existing process rather than a new process.
    pub fn is_thread(&self) -> bool {
        self.child_tid != self.child_tgid
    }

    /// A task whose cell the new task starts in: the process it joined (a new thread), else the
    /// thread that forked (a new process).
    pub fn creator(&self) -> i32 {
        if self.is_thread() {
            self.child_tgid
        } else {
            self.parent_tid
        }
    }
}

/// A subscription to process events.
#[derive(Debug)]
pub struct ProcMonitor {
    fd: OwnedFd,
}

impl ProcMonitor {
    /// Subscribes (needs `CAP_NET_ADMIN`).
    pub fn open() -> std::io::Result<ProcMonitor> {
        // SAFETY: plain socket(2) call; the result is checked before use.
        let raw = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                NETLINK_CONNECTOR,
            )
        };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: sockaddr_nl is plain data; zeroed is a valid starting value.
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as u16;
        addr.nl_groups = CN_IDX_PROC;
        // SAFETY: `addr` is a valid sockaddr_nl and its size is passed.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                &addr as *const _ as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_nl>() as u32,
            )
        };
        if rc < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // nlmsghdr + cn_msg + op.
        let total = NLMSG_HDRLEN + CN_MSG_LEN + 4;
        let mut msg = Vec::with_capacity(total);
        msg.extend_from_slice(&(total as u32).to_ne_bytes()); // nlmsg_len
        msg.extend_from_slice(&(libc::NLMSG_DONE as u16).to_ne_bytes()); // nlmsg_type
        msg.extend_from_slice(&0u16.to_ne_bytes()); // nlmsg_flags
        msg.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_seq
        msg.extend_from_slice(&std::process::id().to_ne_bytes()); // nlmsg_pid
        msg.extend_from_slice(&CN_IDX_PROC.to_ne_bytes());
        msg.extend_from_slice(&CN_VAL_PROC.to_ne_bytes());
        msg.extend_from_slice(&0u32.to_ne_bytes()); // seq
        msg.extend_from_slice(&0u32.to_ne_bytes()); // ack
        msg.extend_from_slice(&4u16.to_ne_bytes()); // len
        msg.extend_from_slice(&0u16.to_ne_bytes()); // flags
        msg.extend_from_slice(&PROC_CN_MCAST_LISTEN.to_ne_bytes());
        // SAFETY: `msg` is a valid buffer of `msg.len()` bytes.
        let n = unsafe { libc::send(fd.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(ProcMonitor { fd })
    }

    /// Blocks for the next batch of events and returns the forks among them. Lost events
    /// (`ENOBUFS` under a fork storm) are not an error: the periodic sweep catches up.
    pub fn next_forks(&self) -> std::io::Result<Vec<Fork>> {
        let mut buf = [0u8; 8192];
        // SAFETY: `buf` is writable for its full length.
        let n = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENOBUFS) || e.raw_os_error() == Some(libc::EINTR) {
                return Ok(Vec::new());
            }
            return Err(e);
        }
        Ok(parse(&buf[..n as usize]))
    }
}

fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(off..off + 4)?.try_into().ok()?))
}

/// Parses one datagram of netlink messages carrying `proc_event`s.
pub fn parse(buf: &[u8]) -> Vec<Fork> {
    let mut out = Vec::new();
    let mut off = 0;
    while off + NLMSG_HDRLEN <= buf.len() {
        let Some(len) = u32_at(buf, off).map(|l| l as usize) else {
            break;
        };
        if len < NLMSG_HDRLEN || off + len > buf.len() {
            break;
        }
        // proc_event: what (u32), cpu (u32), timestamp (u64), then the union.
        let ev = off + NLMSG_HDRLEN + CN_MSG_LEN;
        if u32_at(buf, ev) == Some(PROC_EVENT_FORK) {
            let d = ev + 16;
            if let (Some(a), Some(b), Some(c), Some(e)) = (
                u32_at(buf, d),
                u32_at(buf, d + 4),
                u32_at(buf, d + 8),
                u32_at(buf, d + 12),
            ) {
                out.push(Fork {
                    parent_tid: a as i32,
                    parent_tgid: b as i32,
                    child_tid: c as i32,
                    child_tgid: e as i32,
                });
            }
        }
        off += (len + 3) & !3;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_fork_event_and_ignores_garbage() {
        let mut m = Vec::new();
        let total = NLMSG_HDRLEN + CN_MSG_LEN + 16 + 16;
        m.extend_from_slice(&(total as u32).to_ne_bytes());
        m.extend_from_slice(&[0u8; 12]);
        m.extend_from_slice(&[0u8; CN_MSG_LEN]);
        m.extend_from_slice(&PROC_EVENT_FORK.to_ne_bytes());
        m.extend_from_slice(&[0u8; 12]);
        for v in [10u32, 10, 11, 10] {
            m.extend_from_slice(&v.to_ne_bytes());
        }
        assert_eq!(
            parse(&m),
            vec![Fork {
                parent_tid: 10,
                parent_tgid: 10,
                child_tid: 11,
                child_tgid: 10
            }]
        );
        assert_eq!(
            parse(&m)[0].creator(),
            10,
            "a new thread belongs to its process"
        );
        let process = Fork {
            parent_tid: 12,
            parent_tgid: 10,
            child_tid: 13,
            child_tgid: 13,
        };
        assert_eq!(
            process.creator(),
            12,
            "a new process starts where its forker is"
        );
        assert!(parse(&m[..20]).is_empty());
        assert!(parse(&[0xff; 64]).is_empty());
    }

    #[test]
    #[ignore = "needs root: the kernel's process connector"]
    fn sees_our_own_thread_creation() {
        tess_testkit::require_root();
        let mon = ProcMonitor::open().unwrap();
        let me = std::process::id() as i32;
        let child = std::thread::spawn(tess_sched::gettid).join().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let forks = mon.next_forks().unwrap();
            if let Some(f) = forks
                .iter()
                .find(|f| f.child_tid == child && f.child_tgid == me)
            {
                // The reported parent is our process's parent, not this thread: the new thread
                // must be traced to its process.
                assert!(f.is_thread());
                assert_eq!(f.creator(), me);
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "fork event never arrived"
            );
        }
    }
}
