//! The API socket: one thread per connection, callers identified by `SO_PEERCRED`.

use crate::engine::{Caller, Engine};
use anyhow::{Context, Result};
use std::io::ErrorKind as IoKind;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tess_proto::frame::{self, FrameError};
use tess_proto::{ErrorKind, Request, Response};

/// Most connections served at once; more are refused with a message.
const MAX_CONNECTIONS: usize = 128;
/// `SO_PEERPIDFD` (Linux 6.5).
const SO_PEERPIDFD: libc::c_int = 77;

/// Binds the socket (replacing a stale one), readable and writable by everyone: authorization
/// is by the caller's credentials, not by file permissions.
pub fn bind(path: &Path) -> Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == IoKind::NotFound => {}
        Err(e) => {
            return Err(e).with_context(|| format!("removing stale socket {}", path.display()))
        }
    }
    let l = UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
    Ok(l)
}

fn peer(stream: &UnixStream) -> std::io::Result<Caller> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: u32::MAX,
        gid: u32::MAX,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is a valid ucred buffer and `len` its size.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut _ as *mut libc::c_void,
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut pidfd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `pidfd` is a valid int buffer and `len` its size; failure leaves it -1.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            &mut pidfd as *mut _ as *mut libc::c_void,
            &mut len,
        )
    };
    // SAFETY: on success the kernel handed us a new descriptor that we now own.
    let pidfd = (rc == 0 && pidfd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(pidfd) });
    Ok(Caller {
        uid: cred.uid,
        pid: cred.pid,
        pidfd,
    })
}

/// Serves connections until the listener fails.
pub fn serve(listener: UnixListener, engine: Arc<Mutex<Engine>>) {
    let live = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        let mut stream = match conn {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("accept: {e}");
                continue;
            }
        };
        if live.load(Ordering::Relaxed) >= MAX_CONNECTIONS {
            let _ = frame::write(
                &mut stream,
                &Response::Error {
                    kind: ErrorKind::Internal,
                    message: "tessd is busy: too many connections".into(),
                },
            );
            continue;
        }
        live.fetch_add(1, Ordering::Relaxed);
        let engine = engine.clone();
        let live = live.clone();
        let spawned = std::thread::Builder::new()
            .name("tessd-conn".into())
            .spawn(move || {
                if let Err(e) = connection(stream, &engine) {
                    tracing::debug!("connection ended: {e:#}");
                }
                live.fetch_sub(1, Ordering::Relaxed);
            });
        if let Err(e) = spawned {
            tracing::warn!("cannot start a connection thread: {e}");
        }
    }
}

fn connection(mut stream: UnixStream, engine: &Mutex<Engine>) -> Result<()> {
    let caller = peer(&stream)?;
    let mut greeted = false;
    loop {
        let req: Request = match frame::read(&mut stream) {
            Ok(r) => r,
            Err(FrameError::Closed) => return Ok(()),
            Err(FrameError::Json(e)) => {
                frame::write(
                    &mut stream,
                    &Response::Error {
                        kind: ErrorKind::Usage,
                        message: format!("malformed request: {e}"),
                    },
                )?;
                continue;
            }
            Err(e) => {
                let _ = frame::write(
                    &mut stream,
                    &Response::Error {
                        kind: ErrorKind::Usage,
                        message: e.to_string(),
                    },
                );
                return Err(e.into());
            }
        };
        let is_hello = matches!(req, Request::Hello { .. });
        let resp = if !greeted && !is_hello {
            Response::Error {
                kind: ErrorKind::Usage,
                message: "the first request must be hello".into(),
            }
        } else {
            let mut e = engine.lock().unwrap_or_else(|p| p.into_inner());
            e.handle(&caller, req)
        };
        if is_hello && matches!(resp, Response::Ok { .. }) {
            greeted = true;
        }
        frame::write(&mut stream, &resp)?;
    }
}
