//! The API socket, callers identified by `SO_PEERCRED`. One thread answers greetings, `status`
//! and quota lists for every connection ([`reads`]); a connection that asks for anything else (a
//! change, a cell list, a runtime, a service name, a channel) gets a thread of its own from then
//! on.
//!
//! Neither ever holds the engine: reads go to the published snapshot and writes to
//! [`Daemon::transact`] (see [`crate::daemon`] for the concurrency model).

mod reads;

use crate::daemon::Daemon;
use crate::engine::Caller;
use anyhow::{Context, Result};
use std::collections::BTreeMap;
use std::io::ErrorKind as IoKind;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tess_proto::frame::{self, FrameError};
use tess_proto::ns::{Access, ChannelShape, NameInfo, PeerInfo, Push};
use tess_proto::{Body, ErrorKind, Request, Response};

/// Most connections served at once; more are refused with a message. Most are entries in the
/// read loop, and those that asked for a change a mostly sleeping thread each; `tess bench
/// daemon` runs 200 clients at once.
const MAX_CONNECTIONS: usize = 512;
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

/// A registered service (the nameserver's table entry).
#[derive(Debug)]
struct Registration {
    id: u64,
    service: PeerInfo,
    access: Access,
    shape: ChannelShape,
    clients: AtomicU64,
    /// The service's connection, written only to push new clients.
    push: Mutex<UnixStream>,
}

/// The nameserver: service name -> registration.
#[derive(Debug, Default)]
pub struct Names {
    map: Mutex<BTreeMap<String, Arc<Registration>>>,
    next_id: AtomicU64,
}

impl Names {
    fn list(&self) -> Vec<NameInfo> {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.iter()
            .map(|(name, r)| NameInfo {
                name: name.clone(),
                service: r.service.clone(),
                clients: r.clients.load(Ordering::Relaxed),
            })
            .collect()
    }

    fn remove_if(&self, name: &str, id: u64) {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if map.get(name).is_some_and(|r| r.id == id) {
            map.remove(name);
            tracing::info!(name, "service left; name freed");
        }
    }
}

fn err(kind: ErrorKind, message: impl Into<String>) -> Response {
    Response::Error {
        kind,
        message: message.into(),
    }
}

/// Serves connections: reads in the read loop ([`reads`]), everything else on a thread per
/// connection. Never returns: if the loop fails, tessd exits, so that its supervisor starts it
/// again rather than leave a daemon that no longer answers (the cells stay in place, and a
/// restarted tessd adopts them).
pub fn serve(listener: UnixListener, daemon: Arc<Daemon>) -> ! {
    let shared = reads::Shared {
        daemon,
        names: Arc::new(Names::default()),
        status: Arc::new(StatusCache::default()),
        live: Arc::new(AtomicUsize::new(0)),
        max_connections: MAX_CONNECTIONS,
    };
    let why = match std::panic::catch_unwind(|| reads::run(listener, shared)) {
        Ok(Err(e)) => e.to_string(),
        Ok(Ok(never)) => match never {},
        Err(_) => "it panicked".to_string(),
    };
    tracing::error!("the API socket's read loop stopped ({why}); tessd exits");
    std::process::exit(1);
}

/// A `status` reply, as the bytes of its frame: sent again while the published snapshot is the
/// same one and the reply is younger than [`STATUS_REUSE`] (its uptime and load figures are then
/// at most that old). A client asking for status in a loop costs tessd a frame write instead of
/// building and serialising the reply each time.
struct StatusReply {
    snapshot: Arc<crate::engine::view::Snapshot>,
    built: std::time::Instant,
    frame: Vec<u8>,
}

impl StatusReply {
    fn fresh_for(&self, snapshot: &Arc<crate::engine::view::Snapshot>) -> bool {
        Arc::ptr_eq(&self.snapshot, snapshot) && self.built.elapsed() < STATUS_REUSE
    }
}

/// How long a `status` reply is reused (see [`StatusReply`]).
const STATUS_REUSE: std::time::Duration = std::time::Duration::from_millis(100);

/// The newest `status` reply, shared by every connection (the reply does not depend on the
/// caller). Without it each connection built its own whenever the state changed or its reply
/// aged: with 200 clients polling, one transaction cost 200 builds of the same reply, on the
/// harts the clients were waiting for.
#[derive(Default)]
struct StatusCache(Mutex<Option<Arc<StatusReply>>>);

/// The frame answering `status` on this connection: its last one while fresh, else the shared
/// one while fresh, else a new one (which becomes the shared one).
fn status_frame<'a>(
    last: &'a mut Option<Arc<StatusReply>>,
    shared: &StatusCache,
    daemon: &Daemon,
    caller: &crate::engine::Caller,
) -> Result<&'a [u8]> {
    let snapshot = daemon.snapshot();
    if !last.as_ref().is_some_and(|r| r.fresh_for(&snapshot)) {
        let newest = lock(&shared.0).clone();
        *last = match newest {
            Some(r) if r.fresh_for(&snapshot) => Some(r),
            _ => {
                // built outside the lock: the others keep answering from theirs meanwhile
                let resp = snapshot
                    .handle(caller, &Request::Status)
                    .expect("status is answered by snapshots");
                let mut frame = Vec::new();
                frame::write(&mut frame, &resp)?;
                let reply = Arc::new(StatusReply {
                    snapshot,
                    built: std::time::Instant::now(),
                    frame,
                });
                *lock(&shared.0) = Some(reply.clone());
                Some(reply)
            }
        };
    }
    Ok(&last.as_ref().expect("set above").frame)
}

/// Locks a mutex, ignoring poisoning (the cache holds no invariant a panic could break).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Serves a connection the read loop handed over, from the request it could not answer
/// (`pending` holds it and anything the client sent after it) to the end. The loop hands over
/// only connections that have been greeted, so the greeting rule is the loop's alone.
fn connection(
    mut stream: UnixStream,
    caller: Caller,
    pending: Vec<u8>,
    shared: &reads::Shared,
) -> Result<()> {
    let (daemon, names, status) = (&shared.daemon, &shared.names, &shared.status);
    // Requests are read through a buffer (a frame's length and body in one system call); replies
    // go to the stream itself. A connection that hands its stream over (a registering service)
    // has sent nothing after its request, so nothing is left in the buffer then.
    let mut reader = std::io::BufReader::with_capacity(
        16 << 10,
        std::io::Cursor::new(pending).chain(stream.try_clone()?),
    );
    let mut last_status: Option<Arc<StatusReply>> = None;
    loop {
        let req: Request = match frame::read(&mut reader) {
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
        match req {
            Request::Register {
                name,
                access,
                channel,
            } => {
                let me = daemon.snapshot().peer_info(&caller);
                return serve_service(stream, &caller, me, names, name, access, channel);
            }
            Request::Connect { name } => {
                let client = daemon.snapshot().peer_info(&caller);
                connect_client(&mut stream, client, names, &name)?;
                continue;
            }
            Request::ListNames => {
                frame::write(
                    &mut stream,
                    &Response::Ok {
                        body: Body::Names {
                            names: names.list(),
                        },
                    },
                )?;
                continue;
            }
            Request::RuntimeAttach { cell } => {
                let res = daemon.transact(|e| e.runtime_attach(&caller, &cell));
                match res {
                    Ok(Ok((body, fds))) => {
                        frame::write(&mut stream, &Response::Ok { body })?;
                        tess_channel::handoff::send_endpoint(stream.as_fd(), &fds)?;
                    }
                    Ok(Err(e)) => frame::write(&mut stream, &err(e.kind, e.message))?,
                    Err(busy) => {
                        frame::write(&mut stream, &err(ErrorKind::Internal, busy.to_string()))?
                    }
                }
                continue;
            }
            _ => {}
        }
        let (op, started) = (crate::metrics::op_name(&req), std::time::Instant::now());
        if matches!(req, Request::Status) {
            let frame = status_frame(&mut last_status, status, daemon, &caller)?;
            crate::metrics::TRANSACTIONS.record(op, true, started.elapsed());
            stream.write_all(frame)?;
            continue;
        }
        let resp = daemon.handle(&caller, req);
        crate::metrics::record(op, &resp, started.elapsed());
        frame::write(&mut stream, &resp)?;
    }
}

/// A service registers: its connection is kept to push clients to it, and its name lives as long
/// as the connection does.
fn serve_service(
    mut stream: UnixStream,
    caller: &crate::engine::Caller,
    me: PeerInfo,
    names: &Names,
    name: String,
    access: Access,
    shape: ChannelShape,
) -> Result<()> {
    if !tess_proto::ns::valid_name(&name) {
        frame::write(&mut stream, &err(ErrorKind::Usage, format!("invalid service name {name:?}: use 1-64 of a-z 0-9 - _ . / starting with a letter or digit")))?;
        return Ok(());
    }
    let opts: tess_channel::ChannelOptions = shape.into();
    if let Err(e) = tess_channel::Channel::create(&opts) {
        frame::write(
            &mut stream,
            &err(ErrorKind::Usage, format!("invalid channel shape: {e}")),
        )?;
        return Ok(());
    }
    let id = names.next_id.fetch_add(1, Ordering::Relaxed);
    {
        let mut map = names.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = map.get(&name) {
            let msg = format!(
                "service name '{name}' is taken by process {} (uid {})",
                r.service.pid, r.service.uid
            );
            drop(map);
            frame::write(&mut stream, &err(ErrorKind::Exists, msg))?;
            return Ok(());
        }
        let reg = Registration {
            id,
            service: me,
            access,
            shape,
            clients: AtomicU64::new(0),
            push: Mutex::new(stream.try_clone()?),
        };
        map.insert(name.clone(), Arc::new(reg));
    }
    tracing::info!(
        name,
        pid = caller.pid,
        uid = caller.uid,
        "service registered"
    );
    {
        let reg = names
            .map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&name)
            .cloned();
        if let Some(reg) = reg {
            let mut push = reg.push.lock().unwrap_or_else(|p| p.into_inner());
            frame::write(
                &mut *push,
                &Response::Ok {
                    body: Body::Registered { name: name.clone() },
                },
            )?;
        }
    }
    // The service sends nothing more; end of file means it exited.
    let mut byte = [0u8; 1];
    loop {
        match stream.read(&mut byte) {
            Ok(0) | Err(_) => break,
            Ok(_) => continue,
        }
    }
    names.remove_if(&name, id);
    Ok(())
}

/// A client asks for a channel to a service.
fn connect_client(
    stream: &mut UnixStream,
    client: PeerInfo,
    names: &Names,
    name: &str,
) -> Result<()> {
    let reg = names
        .map
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(name)
        .cloned();
    let Some(reg) = reg else {
        frame::write(
            stream,
            &err(
                ErrorKind::NotFound,
                format!("no service named '{name}' is registered"),
            ),
        )?;
        return Ok(());
    };
    if !reg.access.admits(reg.service.uid, &client) {
        let who = match &client.cell {
            Some(c) => format!("cell '{c}' (uid {})", client.uid),
            None => format!("uid {} outside any cell", client.uid),
        };
        frame::write(
            stream,
            &err(
                ErrorKind::Permission,
                format!("service '{name}' does not admit {who}"),
            ),
        )?;
        return Ok(());
    }
    let (service_end, client_end) = match tess_channel::Channel::create(&reg.shape.into()) {
        Ok(p) => p,
        Err(e) => {
            frame::write(
                stream,
                &err(ErrorKind::Internal, format!("creating a channel: {e}")),
            )?;
            return Ok(());
        }
    };
    let pushed = {
        let mut push = reg.push.lock().unwrap_or_else(|p| p.into_inner());
        frame::write(
            &mut *push,
            &Push::Incoming {
                client: client.clone(),
            },
        )
        .map_err(anyhow::Error::from)
        .and_then(|_| {
            tess_channel::handoff::send_endpoint(push.as_fd(), &service_end)
                .map_err(anyhow::Error::from)
        })
    };
    drop(service_end);
    if let Err(e) = pushed {
        names.remove_if(name, reg.id);
        frame::write(
            stream,
            &err(
                ErrorKind::NotFound,
                format!("service '{name}' went away ({e:#})"),
            ),
        )?;
        return Ok(());
    }
    reg.clients.fetch_add(1, Ordering::Relaxed);
    let info = NameInfo {
        name: name.into(),
        service: reg.service.clone(),
        clients: reg.clients.load(Ordering::Relaxed),
    };
    frame::write(
        stream,
        &Response::Ok {
            body: Body::Connected { service: info },
        },
    )?;
    tess_channel::handoff::send_endpoint(stream.as_fd(), &client_end)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::tests::{create, engine, root};
    use tess_core::spec::Policy;

    fn cells_in(frame: &[u8]) -> usize {
        match frame::read_response(&mut &frame[..]).unwrap() {
            Response::Ok {
                body: Body::Status(s),
            } => s.cells,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_connection_resends_its_status_reply_until_the_state_changes() {
        let (e, _rig) = engine(None);
        let d = Daemon::new(e);
        let shared = StatusCache::default();
        let mut last = None;
        assert_eq!(
            cells_in(status_frame(&mut last, &shared, &d, &root()).unwrap()),
            0
        );
        let built = last.as_ref().unwrap().built;
        status_frame(&mut last, &shared, &d, &root()).unwrap();
        let reused = last.as_ref().unwrap().built == built;
        // Reused unless this thread was held off the CPU for longer than the reuse window.
        assert!(reused || built.elapsed() >= STATUS_REUSE);
        let r = d.transact(|e| e.handle(&root(), create("a", Policy::Dedicated)));
        assert!(matches!(r, Ok(Response::Ok { .. })), "{r:?}");
        assert_eq!(
            cells_in(status_frame(&mut last, &shared, &d, &root()).unwrap()),
            1,
            "a committed change shows at once"
        );
        assert!(last.as_ref().unwrap().built > built);
    }

    #[test]
    fn connections_share_one_status_reply_per_state() {
        let (e, _rig) = engine(None);
        let d = Daemon::new(e);
        let shared = StatusCache::default();
        let (mut a, mut b) = (None, None);
        status_frame(&mut a, &shared, &d, &root()).unwrap();
        status_frame(&mut b, &shared, &d, &root()).unwrap();
        let (ra, rb) = (a.clone().unwrap(), b.clone().unwrap());
        // the second connection took the first one's reply, unless it had aged out meanwhile
        assert!(Arc::ptr_eq(&ra, &rb) || ra.built.elapsed() >= STATUS_REUSE);
        let r = d.transact(|e| e.handle(&root(), create("a", Policy::Dedicated)));
        assert!(matches!(r, Ok(Response::Ok { .. })), "{r:?}");
        assert_eq!(
            cells_in(status_frame(&mut b, &shared, &d, &root()).unwrap()),
            1,
            "the shared reply is not used for a newer state"
        );
        assert_eq!(
            cells_in(status_frame(&mut a, &shared, &d, &root()).unwrap()),
            1
        );
        let (ra, rb) = (a.unwrap(), b.unwrap());
        assert!(Arc::ptr_eq(&ra, &rb) || rb.built.elapsed() >= STATUS_REUSE);
    }
}
