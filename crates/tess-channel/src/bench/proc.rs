//! Forked, pinned child processes and anonymous shared pages for the benchmark.
//!
//! The child of `fork` in a possibly multi-threaded process may only call async-signal-safe
//! functions: the bodies run here allocate nothing (buffers live on the stack or were made
//! before the fork), take no locks, and end with `_exit`.

use anyhow::{bail, Context};
use std::sync::atomic::AtomicU64;
use tess_sched::{affinity, HartSet};

/// A forked child; killed and reaped on drop unless [`wait`](Self::wait)ed.
#[derive(Debug)]
pub(crate) struct Child {
    pid: libc::pid_t,
    hart: usize,
    reaped: bool,
}

/// Exit status of a child that could not pin itself.
const EXIT_PIN_FAILED: i32 = 90;

fn describe(status: i32, hart: usize) -> String {
    if libc::WIFEXITED(status) {
        match libc::WEXITSTATUS(status) {
            EXIT_PIN_FAILED => format!(
                "could not pin itself to hart {hart} (is the hart in this process's cpuset?)"
            ),
            code => format!("exited with status {code}"),
        }
    } else {
        format!("ended with wait status {status:#x}")
    }
}

/// Forks a child pinned to `hart` that runs `body` and exits with its return value.
pub(crate) fn spawn_pinned(hart: usize, body: impl FnOnce() -> i32) -> anyhow::Result<Child> {
    let set = HartSet::single(hart); // allocated before the fork
                                     // SAFETY: fork has no memory-safety preconditions; the child below sticks to
                                     // async-signal-safe work (see the module docs) and never returns from this function.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error()).context("fork of the benchmark peer");
    }
    if pid == 0 {
        // Die with the measuring thread rather than spin on as an orphan.
        // SAFETY: prctl is async-signal-safe and takes plain integers.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
        let code = if affinity::set_affinity(0, &set).is_err() {
            EXIT_PIN_FAILED
        } else {
            body()
        };
        // SAFETY: _exit ends the child without running the parent's destructors or atexit
        // handlers.
        unsafe { libc::_exit(code) };
    }
    Ok(Child {
        pid,
        hart,
        reaped: false,
    })
}

impl Child {
    /// If the child has exited, a description of how (and it is reaped).
    pub(crate) fn exited(&mut self) -> Option<String> {
        if self.reaped {
            return Some("already reaped".into());
        }
        let mut status = 0;
        // SAFETY: non-blocking wait for our own child; `status` is a valid out parameter.
        let rc = unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) };
        if rc != self.pid {
            return None;
        }
        self.reaped = true;
        Some(describe(status, self.hart))
    }

    /// Waits for the child and checks it exited with status 0.
    pub(crate) fn wait(mut self, what: &str) -> anyhow::Result<()> {
        let mut status = 0;
        // SAFETY: waiting for our own child; `status` is a valid out parameter.
        let rc = unsafe { libc::waitpid(self.pid, &mut status, 0) };
        self.reaped = true;
        if rc != self.pid {
            bail!(
                "waitpid of the {what} peer failed: {}",
                std::io::Error::last_os_error()
            );
        }
        if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
            bail!("the {what} peer process {}", describe(status, self.hart));
        }
        Ok(())
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if !self.reaped {
            // SAFETY: killing and reaping our own child.
            unsafe {
                libc::kill(self.pid, libc::SIGKILL);
                libc::waitpid(self.pid, std::ptr::null_mut(), 0);
            }
        }
    }
}

/// An anonymous shared mapping (survives fork shared), for the flag, payload and futex
/// baselines.
#[derive(Debug)]
pub(crate) struct SharedPage {
    base: *mut u8,
    len: usize,
}

pub(crate) const PAGE_LEN: usize = 4096;

impl SharedPage {
    /// One page.
    pub(crate) fn new() -> anyhow::Result<SharedPage> {
        SharedPage::with_len(PAGE_LEN)
    }

    /// `len` bytes (rounded up to whole pages by the kernel).
    pub(crate) fn with_len(len: usize) -> anyhow::Result<SharedPage> {
        // SAFETY: an anonymous shared mapping at an address of the kernel's choosing.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error()).context("mmap of a shared page");
        }
        Ok(SharedPage {
            base: p.cast(),
            len,
        })
    }

    /// The 8-byte word at `off` (a multiple of 8 within the mapping).
    pub(crate) fn word(&self, off: usize) -> &AtomicU64 {
        assert!(off % 8 == 0 && off + 8 <= self.len);
        // SAFETY: in bounds and aligned (asserted); the page is zero-initialised, mapped for
        // the life of `self`, and any bit pattern is a valid AtomicU64.
        unsafe { &*(self.base.add(off) as *const AtomicU64) }
    }

    /// The address of the `len` bytes at `off` (asserted to lie within the mapping). Callers
    /// copy through it only while a flag protocol gives their side those bytes.
    pub(crate) fn bytes(&self, off: usize, len: usize) -> *mut u8 {
        assert!(off.checked_add(len).is_some_and(|end| end <= self.len));
        // SAFETY: in bounds (asserted) of our live mapping.
        unsafe { self.base.add(off) }
    }
}

impl Drop for SharedPage {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}
