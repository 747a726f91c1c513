//! The read loop: one thread, woken by epoll, accepts every connection and answers what it can
//! from memory in microseconds (`hello`, `status`, `quota list`; see [`answered_here`]), from the
//! published snapshot. A connection that asks for anything else (a transaction, `cell list` or
//! `cell show`, which read the kernel's files, a runtime, a service name, a channel) is handed to
//! a thread of its own, which serves it from then on (see [`super::connection`]).
//!
//! Why one thread: a `status` used to cost a wake-up of its connection's thread as well as one of
//! the caller. With many clients polling (`tess top`, monitors, `tess bench daemon`'s 200), the
//! loop answers the connections that are ready, up to [`EVENTS`] a pass, so a reply costs a read
//! and a write and no thread switch in tessd, and the clients are served in the order they became
//! ready (epoll's ready list) rather than in whatever order the kernel woke 200 threads.
//!
//! Nothing here waits on a client: sockets are non-blocking, a partial request waits in its
//! connection's buffer, and a reply the client does not read waits in the connection's output
//! while the loop stops reading from it, so one stalled or hostile client holds nothing but its
//! own buffers.

use super::{peer, status_frame, Names, StatusCache, StatusReply};
use crate::daemon::Daemon;
use crate::engine::Caller;
use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use std::collections::HashMap;
use std::io::{ErrorKind as IoKind, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tess_proto::frame;
use tess_proto::{ErrorKind, Request, Response};

/// What every connection shares, in the loop and in the threads it hands connections to.
#[derive(Clone)]
pub(super) struct Shared {
    pub daemon: Arc<Daemon>,
    pub names: Arc<Names>,
    pub status: Arc<StatusCache>,
    /// Open connections, in the loop or in threads.
    pub live: Arc<AtomicUsize>,
    /// Most connections open at once; more are refused with a message.
    pub max_connections: usize,
}

/// The listener's epoll token; connections get 1, 2, ...
const LISTENER: u64 = 0;
/// Bytes read from a connection per wake-up: a client sends one request and waits for its
/// reply, so this bounds what one client can make the loop parse in a pass.
const READ_CHUNK: usize = 16 << 10;
/// Events taken per `epoll_wait`.
const EVENTS: usize = 64;
/// Connections accepted per wake-up: the listener is level-triggered, so any left wait for the
/// next pass, behind the reads already ready, and a flood of connects cannot hold up the reads.
const ACCEPTS_PER_PASS: usize = 64;
/// How long accepting pauses when it fails (out of descriptors, most likely): the pending
/// connection stays queued, and a level-triggered listener would wake the loop at once.
const ACCEPT_PAUSE: Duration = Duration::from_millis(50);

/// Whether the loop answers `req` itself: only what it answers from memory in microseconds.
/// `list-cells` and `show-cell` read each member thread's cgroup, `/proc` and scheduling
/// attributes, so a connection asking for them gets a thread like a writer does.
fn answered_here(req: &Request) -> bool {
    matches!(
        req,
        Request::Hello { .. } | Request::Status | Request::ListQuotas
    )
}

/// A connection the loop serves.
struct Conn {
    stream: UnixStream,
    caller: Caller,
    greeted: bool,
    /// Received bytes not yet answered: a partial frame, or frames behind one being handed off.
    input: Vec<u8>,
    /// Reply bytes the socket did not take yet; while any are left, nothing more is read.
    output: Vec<u8>,
    /// Whether epoll watches for room to write (else for requests).
    watching_out: bool,
    last_status: Option<Arc<StatusReply>>,
}

/// What becomes of a connection after a wake-up.
enum Next {
    Keep,
    Close,
    /// It asked for something only a thread serves; the request is still in its input.
    HandOff,
}

/// The loop's state.
struct ReadLoop {
    epoll: Epoll,
    listener: UnixListener,
    shared: Shared,
    conns: HashMap<u64, Conn>,
    next_token: u64,
    /// Where each read lands before it joins a connection's input.
    scratch: Vec<u8>,
    /// Accepting is paused (the listener out of epoll) until then.
    accept_paused_until: Option<Instant>,
}

/// Accepts and serves connections; returns only if epoll fails.
pub(super) fn run(
    listener: UnixListener,
    shared: Shared,
) -> std::io::Result<std::convert::Infallible> {
    listener.set_nonblocking(true)?;
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
    epoll.add(&listener, EpollEvent::new(EpollFlags::EPOLLIN, LISTENER))?;
    let mut l = ReadLoop {
        epoll,
        listener,
        shared,
        conns: HashMap::new(),
        next_token: LISTENER + 1,
        scratch: vec![0; READ_CHUNK],
        accept_paused_until: None,
    };
    let mut events = vec![EpollEvent::empty(); EVENTS];
    loop {
        let timeout = match l.accept_paused_until {
            Some(until) => {
                let left = until.saturating_duration_since(Instant::now());
                EpollTimeout::from(left.as_millis().clamp(1, 1000) as u16)
            }
            None => EpollTimeout::NONE,
        };
        let n = match l.epoll.wait(&mut events, timeout) {
            Ok(n) => n,
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        };
        if l.accept_paused_until.is_some_and(|t| Instant::now() >= t) {
            l.accept_paused_until = None;
            l.epoll
                .add(&l.listener, EpollEvent::new(EpollFlags::EPOLLIN, LISTENER))?;
        }
        for ev in &events[..n] {
            match ev.data() {
                LISTENER => l.accept_ready(),
                token => l.serve(token),
            }
        }
    }
}

impl ReadLoop {
    /// Takes up to [`ACCEPTS_PER_PASS`] pending connections.
    fn accept_ready(&mut self) {
        for _ in 0..ACCEPTS_PER_PASS {
            let mut stream = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == IoKind::WouldBlock => return,
                Err(e) if e.kind() == IoKind::Interrupted => continue,
                Err(e) => {
                    tracing::warn!(
                        "accept: {e}; not accepting for {} ms",
                        ACCEPT_PAUSE.as_millis()
                    );
                    if self.epoll.delete(&self.listener).is_ok() {
                        self.accept_paused_until = Some(Instant::now() + ACCEPT_PAUSE);
                    }
                    return;
                }
            };
            if self.shared.live.load(Ordering::Relaxed) >= self.shared.max_connections {
                // A fresh socket's buffer takes this short reply without blocking.
                let _ = frame::write(
                    &mut stream,
                    &Response::Error {
                        kind: ErrorKind::Internal,
                        message: "tessd is busy: too many connections".into(),
                    },
                );
                continue;
            }
            let caller = match peer(&stream) {
                Ok(c) => c,
                Err(e) => {
                    tracing::debug!("a connection's credentials: {e}");
                    continue;
                }
            };
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            let token = self.next_token;
            self.next_token += 1;
            if let Err(e) = self
                .epoll
                .add(&stream, EpollEvent::new(EpollFlags::EPOLLIN, token))
            {
                tracing::warn!("watching a connection: {e}");
                continue;
            }
            self.shared.live.fetch_add(1, Ordering::Relaxed);
            self.conns.insert(
                token,
                Conn {
                    stream,
                    caller,
                    greeted: false,
                    input: Vec::new(),
                    output: Vec::new(),
                    watching_out: false,
                    last_status: None,
                },
            );
        }
    }

    /// Serves the connection `token` after epoll reported it ready.
    fn serve(&mut self, token: u64) {
        let Some(conn) = self.conns.get_mut(&token) else {
            return; // closed earlier in this pass
        };
        // A panic answering one connection closes that connection, not the API: before this
        // loop a panic ended one connection's thread, and it should cost no more now.
        let (shared, scratch) = (&self.shared, &mut self.scratch);
        let next = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            conn.on_ready(shared, scratch)
        }))
        .unwrap_or_else(|_| {
            tracing::error!("answering a request panicked; its connection is closed");
            Next::Close
        });
        match next {
            Next::Keep => {
                let want_out = !conn.output.is_empty();
                if want_out != conn.watching_out {
                    let flags = if want_out {
                        EpollFlags::EPOLLOUT
                    } else {
                        EpollFlags::EPOLLIN
                    };
                    let mut ev = EpollEvent::new(flags, token);
                    if self.epoll.modify(&conn.stream, &mut ev).is_err() {
                        self.close(token);
                        return;
                    }
                    conn.watching_out = want_out;
                }
            }
            Next::Close => self.close(token),
            Next::HandOff => {
                let conn = self.conns.remove(&token).expect("looked up above");
                let _ = self.epoll.delete(&conn.stream);
                hand_off(conn, &self.shared);
            }
        }
    }

    fn close(&mut self, token: u64) {
        if let Some(conn) = self.conns.remove(&token) {
            let _ = self.epoll.delete(&conn.stream);
            self.shared.live.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Counts a connection as open until dropped, whichever way its thread ends.
struct LiveGuard(Arc<AtomicUsize>);

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Gives the connection a thread of its own, with what it sent so far.
fn hand_off(conn: Conn, shared: &Shared) {
    let Conn {
        stream,
        caller,
        input,
        ..
    } = conn;
    let live = LiveGuard(shared.live.clone());
    let shared = shared.clone();
    let spawned = stream.set_nonblocking(false).and_then(|()| {
        std::thread::Builder::new()
            .name("tessd-conn".into())
            .spawn(move || {
                let _live = live;
                if let Err(e) = super::connection(stream, caller, input, &shared) {
                    tracing::debug!("connection ended: {e:#}");
                }
            })
    });
    if let Err(e) = spawned {
        // The closure that failed to start is dropped: the connection is closed and the guard
        // in it counts it out.
        tracing::warn!("cannot start a connection thread: {e}");
    }
}

impl Conn {
    fn on_ready(&mut self, shared: &Shared, scratch: &mut [u8]) -> Next {
        if !self.output.is_empty() {
            match self.flush() {
                Ok(()) if self.output.is_empty() => {}
                Ok(()) => return Next::Keep,
                Err(_) => return Next::Close,
            }
        } else {
            match self.read_some(scratch) {
                Ok(true) => {}
                Ok(false) => return Next::Close,
                Err(_) => return Next::Close,
            }
        }
        self.answer_buffered(shared)
    }

    /// Reads what the socket holds, up to a scratch buffer's length; false at end of file.
    fn read_some(&mut self, scratch: &mut [u8]) -> std::io::Result<bool> {
        loop {
            match self.stream.read(scratch) {
                Ok(0) => return Ok(false),
                Ok(n) => {
                    self.input.extend_from_slice(&scratch[..n]);
                    return Ok(true);
                }
                Err(e) if e.kind() == IoKind::Interrupted => continue,
                Err(e) if e.kind() == IoKind::WouldBlock => return Ok(true),
                Err(e) => return Err(e),
            }
        }
    }

    /// Answers the complete requests in the input, in order, until one must be handed off,
    /// the socket stops taking replies, or the input holds no complete frame.
    fn answer_buffered(&mut self, shared: &Shared) -> Next {
        while self.output.is_empty() {
            let len = match frame::complete_len(&self.input) {
                Ok(Some(len)) => len,
                Ok(None) => break,
                Err(e) => {
                    // What follows an impossible length cannot be framed: say why and close.
                    let _ = self.send_response(&usage(e.to_string()));
                    return Next::Close;
                }
            };
            let req: Request = match serde_json::from_slice(&self.input[4..len]) {
                Ok(r) => r,
                Err(e) => {
                    self.input.drain(..len);
                    let resp = usage(format!("malformed request: {e}"));
                    if self.send_response(&resp).is_err() {
                        return Next::Close;
                    }
                    continue;
                }
            };
            if self.greeted && !answered_here(&req) {
                return Next::HandOff;
            }
            self.input.drain(..len);
            if self.answer(req, shared).is_err() {
                return Next::Close;
            }
        }
        Next::Keep
    }

    /// Answers a read, or the first request (which must be `hello`).
    fn answer(&mut self, req: Request, shared: &Shared) -> std::io::Result<()> {
        let (op, started) = (crate::metrics::op_name(&req), std::time::Instant::now());
        if self.greeted && matches!(req, Request::Status) {
            status_frame(
                &mut self.last_status,
                &shared.status,
                &shared.daemon,
                &self.caller,
            )
            .map_err(std::io::Error::other)?;
            let reply = self.last_status.clone().expect("status_frame sets it");
            crate::metrics::TRANSACTIONS.record(op, true, started.elapsed());
            return self.send(&reply.frame);
        }
        let is_hello = matches!(req, Request::Hello { .. });
        let resp = if !self.greeted && !is_hello {
            usage("the first request must be hello")
        } else {
            shared.daemon.handle(&self.caller, req)
        };
        crate::metrics::record(op, &resp, started.elapsed());
        if is_hello && matches!(resp, Response::Ok { .. }) {
            self.greeted = true;
        }
        self.send_response(&resp)
    }

    fn send_response(&mut self, resp: &Response) -> std::io::Result<()> {
        let bytes = frame::encode(resp).map_err(std::io::Error::other)?;
        self.send(&bytes)
    }

    /// Writes what the socket takes now and keeps the rest for when it has room.
    fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        debug_assert!(
            self.output.is_empty(),
            "a reply is sent after the last one left"
        );
        let mut at = 0;
        while at < bytes.len() {
            match self.stream.write(&bytes[at..]) {
                Ok(0) => return Err(IoKind::WriteZero.into()),
                Ok(n) => at += n,
                Err(e) if e.kind() == IoKind::Interrupted => continue,
                Err(e) if e.kind() == IoKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        self.output.extend_from_slice(&bytes[at..]);
        Ok(())
    }

    /// Writes out what is left of a reply.
    fn flush(&mut self) -> std::io::Result<()> {
        let pending = std::mem::take(&mut self.output);
        self.send(&pending)
    }
}

fn usage(message: impl Into<String>) -> Response {
    Response::Error {
        kind: ErrorKind::Usage,
        message: message.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::tests::{engine, Rig};
    use std::path::PathBuf;
    use std::time::Duration;
    use tess_proto::frame::FrameError;
    use tess_proto::{Body, Client, PROTOCOL_VERSION};

    /// A read loop serving an engine on a fake kernel, at a socket of its own.
    struct Server {
        socket: PathBuf,
        live: Arc<AtomicUsize>,
        _dir: tempfile::TempDir,
        _rig: Rig,
    }

    fn start() -> Server {
        start_with_limit(100)
    }

    fn start_with_limit(max_connections: usize) -> Server {
        let (e, rig) = engine(None);
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("tessd.sock");
        let listener = super::super::bind(&socket).unwrap();
        let live: Arc<AtomicUsize> = Arc::default();
        let shared = Shared {
            daemon: Arc::new(Daemon::new(e)),
            names: Arc::default(),
            status: Arc::default(),
            live: live.clone(),
            max_connections,
        };
        // The loop runs until the test process ends.
        std::thread::spawn(move || run(listener, shared));
        Server {
            socket,
            live,
            _dir: dir,
            _rig: rig,
        }
    }

    fn raw(server: &Server) -> UnixStream {
        let s = UnixStream::connect(&server.socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    }

    fn client(server: &Server) -> Client {
        let c = Client::connect(&server.socket).unwrap();
        c.set_timeout(Some(Duration::from_secs(10))).unwrap();
        c
    }

    fn hello() -> Vec<u8> {
        frame::encode(&Request::Hello {
            version: PROTOCOL_VERSION,
        })
        .unwrap()
    }

    fn status_request() -> Vec<u8> {
        frame::encode(&Request::Status).unwrap()
    }

    fn reply(s: &mut UnixStream) -> Response {
        frame::read(s).unwrap()
    }

    /// The body of a successful reply.
    fn body(r: Response) -> Body {
        match r {
            Response::Ok { body } => body,
            r => panic!("{r:?}"),
        }
    }

    fn is_status(r: &Response) -> bool {
        matches!(
            r,
            Response::Ok {
                body: Body::Status(_)
            }
        )
    }

    #[test]
    fn pipelined_requests_are_answered_in_order_and_a_handed_off_connection_goes_on() {
        let server = start();
        let mut s = raw(&server);
        let mut burst = hello();
        for req in [
            Request::Status,
            Request::ListCells,
            Request::ListNames,
            Request::Status,
        ] {
            burst.extend(frame::encode(&req).unwrap());
        }
        // One write: the loop finds five frames at once. It answers the first two; the third
        // (ListCells) only a connection thread answers, and the two after it must reach that
        // thread too, in order.
        s.write_all(&burst).unwrap();
        let r = body(reply(&mut s));
        assert!(matches!(r, Body::Hello { .. }), "{r:?}");
        assert!(is_status(&reply(&mut s)));
        let r = body(reply(&mut s));
        assert!(matches!(r, Body::Cells { .. }), "{r:?}");
        let r = body(reply(&mut s));
        assert!(matches!(r, Body::Names { .. }), "{r:?}");
        assert!(is_status(&reply(&mut s)));
        s.write_all(&status_request()).unwrap();
        assert!(is_status(&reply(&mut s)), "the thread keeps serving it");
    }

    #[test]
    fn the_first_request_must_be_hello() {
        let server = start();
        let mut s = raw(&server);
        s.write_all(&status_request()).unwrap();
        match reply(&mut s) {
            Response::Error { kind, message } => {
                assert_eq!(kind, ErrorKind::Usage);
                assert!(message.contains("hello"), "{message}");
            }
            r => panic!("{r:?}"),
        }
        s.write_all(&hello()).unwrap();
        let r = reply(&mut s);
        assert!(matches!(r, Response::Ok { .. }), "{r:?}");
    }

    #[test]
    fn a_malformed_request_gets_an_error_and_an_unframeable_one_closes() {
        let server = start();
        let mut s = raw(&server);
        s.write_all(&hello()).unwrap();
        reply(&mut s);
        let mut bad = 9u32.to_le_bytes().to_vec();
        bad.extend_from_slice(b"{\"op\": 1}");
        s.write_all(&bad).unwrap();
        match reply(&mut s) {
            Response::Error { kind, message } => {
                assert_eq!(kind, ErrorKind::Usage);
                assert!(message.starts_with("malformed request"), "{message}");
            }
            r => panic!("{r:?}"),
        }
        s.write_all(&status_request()).unwrap();
        assert!(is_status(&reply(&mut s)), "the connection goes on");
        let huge = (frame::MAX_FRAME as u32 + 1).to_le_bytes();
        s.write_all(&huge).unwrap();
        match reply(&mut s) {
            Response::Error { message, .. } => assert!(message.contains("limit"), "{message}"),
            r => panic!("{r:?}"),
        }
        assert!(
            matches!(frame::read_response(&mut s), Err(FrameError::Closed)),
            "nothing after an impossible length can be framed"
        );
    }

    #[test]
    fn a_client_that_stops_mid_request_holds_up_no_one() {
        let server = start();
        let mut slow = raw(&server);
        slow.write_all(&hello()).unwrap();
        reply(&mut slow);
        let status = status_request();
        slow.write_all(&status[..3]).unwrap();
        let mut other = client(&server);
        let r = other.call(&Request::Status).unwrap();
        assert!(matches!(r, Body::Status(_)), "{r:?}");
        slow.write_all(&status[3..]).unwrap();
        assert!(
            is_status(&reply(&mut slow)),
            "the rest of the frame completes it"
        );
    }

    #[test]
    fn a_client_that_never_reads_its_replies_stalls_no_one() {
        let server = start();
        let mut deaf = raw(&server);
        deaf.write_all(&hello()).unwrap();
        reply(&mut deaf);
        // Far more replies than the socket buffers hold: the loop keeps the rest and stops
        // reading from this client. Its writes then block, so they run in a thread of their own.
        let status = status_request();
        let mut writer = deaf.try_clone().unwrap();
        let written = Arc::new(AtomicUsize::new(0));
        let counted = written.clone();
        std::thread::spawn(move || {
            for _ in 0..20_000 {
                if writer.write_all(&status).is_err() {
                    return;
                }
                counted.fetch_add(1, Ordering::Relaxed);
            }
        });
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            written.load(Ordering::Relaxed) < 20_000,
            "the loop stopped reading from a client whose replies pile up"
        );
        // A raw stream with a read timeout: a stalled loop fails the test instead of hanging it.
        let mut other = raw(&server);
        other.write_all(&hello()).unwrap();
        reply(&mut other);
        for _ in 0..100 {
            other.write_all(&status_request()).unwrap();
            assert!(is_status(&reply(&mut other)));
        }
        // And the deaf client gets all its replies once it reads.
        for _ in 0..20_000 {
            assert!(is_status(&reply(&mut deaf)));
        }
    }

    /// Waits up to 10 s for `live` to read `n`.
    fn live_becomes(server: &Server, n: usize) {
        let t0 = std::time::Instant::now();
        while server.live.load(Ordering::Relaxed) != n {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "{} connections counted open, {n} expected",
                server.live.load(Ordering::Relaxed)
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn connections_are_counted_while_open_in_the_loop_and_in_threads() {
        let server = start();
        let mut in_loop = client(&server);
        let mut in_thread = client(&server);
        in_loop.call(&Request::Status).unwrap();
        let r = in_thread.call(&Request::ListNames).unwrap();
        assert!(matches!(r, Body::Names { .. }), "{r:?}");
        live_becomes(&server, 2);
        drop(in_loop);
        live_becomes(&server, 1);
        drop(in_thread);
        live_becomes(&server, 0);
    }

    #[test]
    fn connections_beyond_the_limit_are_refused_with_a_reason() {
        let server = start_with_limit(2);
        let _a = client(&server);
        let _b = client(&server);
        live_becomes(&server, 2);
        let mut c = raw(&server);
        match reply(&mut c) {
            Response::Error { message, .. } => assert!(message.contains("busy"), "{message}"),
            r => panic!("{r:?}"),
        }
        drop(_a);
        live_becomes(&server, 1);
        client(&server).call(&Request::Status).unwrap();
    }
}
