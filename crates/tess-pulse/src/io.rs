//! Waiting for I/O and conditions without blocking the hart.
//!
//! Pulse has no kernel support for user-level blocking (the paper's kernel would hand back
//! the hart); here a Pulse thread waits by polling: it checks, and if not ready it sleeps with
//! [`crate::sleep`] (the hart runs other threads) and checks again. The poll interval doubles
//! from 20 us up to one tick, so a quiet wait costs little and a busy one reacts quickly.

use std::time::Duration;

/// Waits until `fd` is ready for `events` (`libc::POLLIN`, `POLLOUT`, ...) or `timeout`
/// passes; returns the ready events (0 on timeout).
///
/// A check interrupted by a signal (`EINTR`) counts as not ready: Pulse's tick is a signal,
/// and `poll` is never restarted after one, whatever `SA_RESTART` says (signal(7)), so a
/// check that lands on a tick must simply be repeated.
pub fn wait_fd(fd: i32, events: i16, timeout: Option<Duration>) -> std::io::Result<i16> {
    let mut ready = 0;
    let mut error = None;
    let ok = wait_until(timeout, || {
        let mut p = libc::pollfd {
            fd,
            events,
            revents: 0,
        };
        // SAFETY: p is a valid pollfd; a zero timeout never blocks.
        let r = unsafe { libc::poll(&mut p, 1, 0) };
        if r < 0 {
            // Read errno now: the sleep between checks makes system calls of its own.
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                return false;
            }
            error = Some(e);
            return true;
        }
        ready = p.revents;
        r > 0
    });
    if let Some(e) = error {
        return Err(e);
    }
    Ok(if ok { ready } else { 0 })
}

/// Waits until `ready()` is true (returns true) or `timeout` passes (returns false), sleeping
/// between checks (module docs). Use for channel waits: `wait_until(None, || !rx.is_empty())`.
pub fn wait_until(timeout: Option<Duration>, mut ready: impl FnMut() -> bool) -> bool {
    let start = crate::clock::now_ns();
    let limit = timeout.map(crate::clock::ns);
    let mut pause = Duration::from_micros(20);
    loop {
        if ready() {
            return true;
        }
        if limit.is_some_and(|l| crate::clock::now_ns() - start >= l) {
            return false;
        }
        crate::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(1));
    }
}
