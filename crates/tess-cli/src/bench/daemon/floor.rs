//! The floor of `tess bench daemon`: the least a server can do per call on this machine with the
//! same clients. A process of its own (as tessd is), at the clients' nice value and on their
//! harts, answers every request on a Unix socket with a `status` reply tessd sent (decoded and
//! encoded again: the same JSON), from one epoll loop: no snapshot, no metrics, no parsing
//! beyond finding where a frame ends. The clients decode that reply as they decode tessd's, so
//! the difference between the two measurements is tessd's own cost.

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tess_proto::frame;

/// A running floor server; stopped (by its pid) when dropped.
pub struct Floor {
    child: Option<Child>,
    pub socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Floor {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            super::stop(child);
        }
    }
}

/// Starts the floor server in a new process (this program, `tess bench daemon --serve-floor`),
/// answering with `reply` (one whole frame), and waits until it accepts connections.
pub fn start(reply: &[u8]) -> anyhow::Result<Floor> {
    let dir = tempfile::tempdir()?;
    let socket = dir.path().join("floor.sock");
    let reply_file = dir.path().join("reply");
    std::fs::write(&reply_file, reply)?;
    let child = Command::new(std::env::current_exe()?)
        .args(["bench", "daemon", "--serve-floor"])
        .arg(&socket)
        .arg("--floor-reply")
        .arg(&reply_file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()?;
    let mut floor = Floor {
        child: Some(child),
        socket,
        _dir: dir,
    };
    let t0 = Instant::now();
    while UnixStream::connect(&floor.socket).is_err() {
        if let Some(status) = floor
            .child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
        {
            anyhow::bail!("the floor server exited at start ({status})");
        }
        anyhow::ensure!(
            t0.elapsed() < Duration::from_secs(10),
            "the floor server did not listen within 10 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(floor)
}

/// The server's side: answers every frame on every connection with the reply in `reply_file`,
/// until killed.
pub fn serve(socket: &Path, reply_file: &Path) -> anyhow::Result<()> {
    // Ends with the bench, even one killed outright.
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes a signal number and touches no memory of ours.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    if std::os::unix::process::parent_id() == 1 {
        anyhow::bail!("the bench that started this floor server has already exited");
    }
    let reply = std::fs::read(reply_file)?;
    let listener = UnixListener::bind(socket)?;
    listener.set_nonblocking(true)?;
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
    const LISTENER: u64 = u64::MAX;
    epoll.add(&listener, EpollEvent::new(EpollFlags::EPOLLIN, LISTENER))?;
    let mut conns: HashMap<u64, (UnixStream, Vec<u8>)> = HashMap::new();
    let mut next = 0u64;
    let mut events = vec![EpollEvent::empty(); 64];
    let mut chunk = vec![0u8; 16 << 10];
    loop {
        let n = match epoll.wait(&mut events, EpollTimeout::NONE) {
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        };
        for ev in &events[..n] {
            if ev.data() == LISTENER {
                // At most the bench's clients connect, once each: accept until none is left.
                while let Ok((s, _)) = listener.accept() {
                    s.set_nonblocking(true)?;
                    epoll.add(&s, EpollEvent::new(EpollFlags::EPOLLIN, next))?;
                    conns.insert(next, (s, Vec::new()));
                    next += 1;
                }
                continue;
            }
            let Some((stream, input)) = conns.get_mut(&ev.data()) else {
                continue;
            };
            let open = match stream.read(&mut chunk) {
                Ok(0) => false,
                Ok(got) => {
                    input.extend_from_slice(&chunk[..got]);
                    // Each client waits for its reply before it asks again, so a reply always
                    // fits the socket's buffer.
                    let mut ok = true;
                    while let Ok(Some(len)) = frame::complete_len(input) {
                        input.drain(..len);
                        ok &= stream.write_all(&reply).is_ok();
                    }
                    ok
                }
                Err(e) => e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted,
            };
            if !open {
                let (s, _) = conns.remove(&ev.data()).expect("looked up above");
                let _ = epoll.delete(&s);
            }
        }
    }
}
