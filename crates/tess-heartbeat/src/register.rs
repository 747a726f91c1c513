//! Handing a heartbeat to the broker: one Unix socket, one message with the memfd attached.
//!
//! ```text
//!   cell                                        broker (tess-broker)
//!   connect($TESS_BROKER_SOCKET)          ->    accept; SO_PEERCRED gives pid and uid,
//!   sendmsg("{\"name\":\"enc\"}", memfd)  ->    the pid's cgroup gives the cell
//!                                         <-    "ok\n" or "error: WHY\n"
//!   (the connection stays open)                 the heartbeat lives until it closes
//! ```
//!
//! The cell's side runs on a helper thread ([`Link`]) that retries every second while no
//! broker listens, and registers again when a broker restarts (its connection closes), so a
//! program never waits for the broker and a restarted broker finds every heartbeat again.

use crate::error::HeartbeatError;
use nix::sys::socket::{self, ControlMessage, ControlMessageOwned, MsgFlags};
use std::io::{IoSlice, IoSliceMut, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Default broker socket.
pub const DEFAULT_SOCKET: &str = "/run/tess/broker.sock";
/// Largest registration message.
pub const MAX_MESSAGE: usize = 512;

/// The broker socket: `$TESS_BROKER_SOCKET`, or [`DEFAULT_SOCKET`].
pub fn socket_path() -> PathBuf {
    std::env::var_os("TESS_BROKER_SOCKET")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET))
}

/// The registration message.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct Hello {
    /// The heartbeat's name (must match the header).
    pub name: String,
}

/// The cell's end: a thread that keeps the heartbeat registered.
#[derive(Debug)]
pub struct Link {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Link {
    /// Starts the registration thread.
    pub(crate) fn start(
        socket: PathBuf,
        name: String,
        fd: OwnedFd,
    ) -> Result<Link, HeartbeatError> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("tess-heartbeat".into())
            .spawn(move || keep_registered(&socket, &name, &fd, &flag))
            .map_err(|e| HeartbeatError::Os {
                what: "starting the heartbeat registration thread".into(),
                source: e,
            })?;
        Ok(Link {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

const POLL_MS: u64 = 100;
const RETRY_MS: u64 = 1000;

fn keep_registered(socket: &Path, name: &str, fd: &OwnedFd, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        if let Ok(conn) = register_once(socket, name, fd) {
            // Wait for the broker to go away (or for our owner to drop the heartbeat).
            let _ = conn.set_read_timeout(Some(Duration::from_millis(POLL_MS)));
            let mut buf = [0u8; 64];
            while !stop.load(Ordering::Relaxed) {
                match (&conn).read(&mut buf) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) => {}
                    Err(_) => break,
                }
            }
        }
        let mut waited = 0;
        while waited < RETRY_MS && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(POLL_MS));
            waited += POLL_MS;
        }
    }
}

/// Connects to the broker at `socket` and registers the heartbeat `fd` called `name`; returns
/// the connection, which must stay open as long as the heartbeat should be read.
pub fn register_once(
    socket: &Path,
    name: &str,
    fd: &OwnedFd,
) -> Result<UnixStream, HeartbeatError> {
    let conn = UnixStream::connect(socket).map_err(|e| HeartbeatError::Os {
        what: format!("connecting to the broker at {}", socket.display()),
        source: e,
    })?;
    let msg = serde_json::to_vec(&Hello { name: name.into() }).expect("serializes");
    let fds = [fd.as_raw_fd()];
    let cmsg = [ControlMessage::ScmRights(&fds)];
    socket::sendmsg::<()>(
        conn.as_raw_fd(),
        &[IoSlice::new(&msg)],
        &cmsg,
        MsgFlags::empty(),
        None,
    )
    .map_err(|e| HeartbeatError::Os {
        what: "sending the heartbeat to the broker".into(),
        source: e.into(),
    })?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| HeartbeatError::Os {
            what: "setting a timeout on the broker connection".into(),
            source: e,
        })?;
    let mut reply = [0u8; 256];
    let n = (&conn).read(&mut reply).map_err(|e| HeartbeatError::Os {
        what: "reading the broker's reply".into(),
        source: e,
    })?;
    let reply = String::from_utf8_lossy(&reply[..n]);
    if reply.trim_end() == "ok" {
        Ok(conn)
    } else {
        Err(HeartbeatError::Refused(
            reply.trim_end().trim_start_matches("error: ").to_string(),
        ))
    }
}

/// The broker's end: the listening socket.
#[derive(Debug)]
pub struct Listener {
    inner: UnixListener,
    path: PathBuf,
}

/// A registration as the broker received it.
#[derive(Debug)]
pub struct Incoming {
    /// The connection (reply on it with [`Incoming::accept`] or [`Incoming::refuse`]; keep it
    /// to notice when the cell goes away).
    pub conn: UnixStream,
    /// The registering process, as the kernel vouches for it.
    pub pid: i32,
    /// Its user.
    pub uid: u32,
    /// What it sent.
    pub hello: Hello,
    /// The heartbeat memfd.
    pub fd: OwnedFd,
}

impl Listener {
    /// Listens at `path` (a stale socket file there is replaced).
    pub fn bind(path: &Path) -> Result<Listener, HeartbeatError> {
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let _ = std::fs::remove_file(path);
        let inner = UnixListener::bind(path).map_err(|e| HeartbeatError::Os {
            what: format!("listening at {}", path.display()),
            source: e,
        })?;
        Ok(Listener {
            inner,
            path: path.to_path_buf(),
        })
    }

    /// The socket's descriptor (to poll it).
    pub fn as_raw_fd(&self) -> RawFd {
        self.inner.as_raw_fd()
    }

    /// Makes `accept` non-blocking.
    pub fn set_nonblocking(&self, yes: bool) -> std::io::Result<()> {
        self.inner.set_nonblocking(yes)
    }

    /// Accepts one connection and reads its registration. `Ok(None)`: nothing pending (in
    /// non-blocking mode). A malformed registration is answered with an error and reported.
    pub fn accept(&self) -> Result<Option<Incoming>, HeartbeatError> {
        let conn = match self.inner.accept() {
            Ok((c, _)) => c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) => {
                return Err(HeartbeatError::Os {
                    what: "accepting a heartbeat registration".into(),
                    source: e,
                })
            }
        };
        conn.set_nonblocking(false).ok();
        conn.set_read_timeout(Some(Duration::from_secs(1))).ok();
        let cred = socket::getsockopt(&conn, socket::sockopt::PeerCredentials).map_err(|e| {
            HeartbeatError::Os {
                what: "reading the registering process's credentials".into(),
                source: e.into(),
            }
        })?;
        let mut buf = [0u8; MAX_MESSAGE];
        let mut space = nix::cmsg_space!([RawFd; 1]);
        let (n, fd) = {
            let mut iov = [IoSliceMut::new(&mut buf)];
            let msg = socket::recvmsg::<()>(
                conn.as_raw_fd(),
                &mut iov,
                Some(&mut space),
                MsgFlags::MSG_CMSG_CLOEXEC,
            )
            .map_err(|e| HeartbeatError::Os {
                what: "reading a heartbeat registration".into(),
                source: e.into(),
            })?;
            let mut fd = None;
            for c in msg.cmsgs().map_err(|e| HeartbeatError::Os {
                what: "reading the registration's descriptors".into(),
                source: e.into(),
            })? {
                if let ControlMessageOwned::ScmRights(fds) = c {
                    for raw in fds {
                        // SAFETY: the kernel just installed this descriptor in our table for
                        // us; nobody else owns it. Extra ones are wrapped and closed.
                        let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                        if fd.is_none() {
                            fd = Some(owned);
                        }
                    }
                }
            }
            (msg.bytes, fd)
        };
        let refuse = |conn: &UnixStream, why: String| {
            let _ = conn.write_all_str(&format!("error: {why}\n"));
            HeartbeatError::Refused(why)
        };
        let hello: Hello = match serde_json::from_slice(&buf[..n]) {
            Ok(h) => h,
            Err(e) => return Err(refuse(&conn, format!("malformed registration: {e}"))),
        };
        let Some(fd) = fd else {
            return Err(refuse(&conn, "no memfd attached".into()));
        };
        Ok(Some(Incoming {
            pid: cred.pid(),
            uid: cred.uid(),
            conn,
            hello,
            fd,
        }))
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Incoming {
    /// Tells the cell its heartbeat is being read; returns the connection to keep.
    pub fn accept(conn: &UnixStream) {
        let _ = conn.write_all_str("ok\n");
    }

    /// Tells the cell why its heartbeat is refused.
    pub fn refuse(conn: &UnixStream, why: &str) {
        let _ = conn.write_all_str(&format!("error: {why}\n"));
    }
}

trait WriteStr {
    fn write_all_str(&self, s: &str) -> std::io::Result<()>;
}

impl WriteStr for UnixStream {
    fn write_all_str(&self, s: &str) -> std::io::Result<()> {
        use std::io::Write;
        let mut w = self;
        w.write_all(s.as_bytes())
    }
}
