//! Baselines measured in the same run as the channel: the hardware floor (a bare flag
//! ping-pong), raw futex ping-pongs, a Unix-domain socket pair and a pipe (blocking, and
//! non-blocking with spinning reads, the plain-Linux counterpart of a busy-polled channel),
//! and single-core memcpy.

use super::proc::{spawn_pinned, SharedPage};
use super::BenchOptions;
use anyhow::{bail, Context};

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use tess_sched::clock::now_ns;

/// Longest a baseline waits for its peer before giving up (the peer died or is starved).
const STALL_NS: u64 = 10_000_000_000;

/// Spins until `word` holds `want`; false if that takes longer than [`STALL_NS`] or `alive`
/// (asked every so often) says the peer is gone.
#[inline]
fn spin_for(word: &AtomicU64, want: u64, mut alive: impl FnMut() -> bool) -> bool {
    let mut n = 0u32;
    let mut since = 0;
    while word.load(Ordering::Acquire) != want {
        std::hint::spin_loop();
        n = n.wrapping_add(1);
        if n % 65_536 == 0 {
            let now = now_ns();
            if since == 0 {
                since = now;
            } else if now - since > STALL_NS || !alive() {
                return false;
            }
        }
    }
    true
}

fn stalled(what: &str, how: Option<String>) -> anyhow::Error {
    match how {
        Some(how) => anyhow::anyhow!("{what} peer {how}"),
        None => anyhow::anyhow!("{what} peer stalled for {} s", STALL_NS / 1_000_000_000),
    }
}

/// Bare shared-memory ping-pong: each side owns one flag on its own 128-byte slot and spins on
/// the other's. The same line traffic a channel message needs at the least, with no ring.
pub(crate) fn flag_rtt(o: &BenchOptions, samples: usize) -> anyhow::Result<Vec<u64>> {
    let page = SharedPage::new()?;
    let (ping, pong) = (page.word(0), page.word(128));
    let total = (o.warmup + samples) as u64;
    let mut child = spawn_pinned(o.child_hart, || {
        for i in 1..=total {
            if !spin_for(ping, i, || true) {
                return 1;
            }
            pong.store(i, Ordering::Release);
        }
        0
    })?;
    let mut out = Vec::with_capacity(samples);
    for i in 1..=total {
        let t0 = now_ns();
        ping.store(i, Ordering::Release);
        let mut how = None;
        if !spin_for(pong, i, || {
            how = child.exited();
            how.is_none()
        }) {
            return Err(stalled("flag ping-pong", how));
        }
        let dt = now_ns() - t0;
        if i > o.warmup as u64 {
            out.push(dt);
        }
    }
    child.wait("flag ping-pong")?;
    Ok(out)
}

/// Bare payload ping-pong: the least a round trip of `size` bytes costs between the two harts,
/// with no ring. Each side owns a flag on its own 128-byte slot and a buffer; the measuring side
/// copies the message into its buffer and raises its flag; the peer, seeing it, copies that
/// buffer into its own (one copy, as the channel's echo copies ring to ring) and raises its
/// flag; the measuring side copies the answer out. The same copies and the same line traffic a
/// channel round trip needs at the least: the flag ping-pong plus the payload's lines.
pub(crate) fn payload_rtt(
    o: &BenchOptions,
    samples: usize,
    size: usize,
) -> anyhow::Result<Vec<u64>> {
    // The flags at bytes 0 and 128, then the two buffers, each room for the largest message.
    const BUF_BYTES: usize = super::channel::MAX_SIZE;
    const BUF_A_OFF: usize = 256;
    const BUF_B_OFF: usize = BUF_A_OFF + BUF_BYTES;
    assert!(size <= BUF_BYTES);
    let page = SharedPage::with_len(BUF_B_OFF + BUF_BYTES)?;
    let (ping, pong) = (page.word(0), page.word(128));
    let (buf_a, buf_b) = (
        page.bytes(BUF_A_OFF, BUF_BYTES),
        page.bytes(BUF_B_OFF, BUF_BYTES),
    );
    let total = (o.warmup + samples) as u64;
    let mut child = spawn_pinned(o.child_hart, || {
        for i in 1..=total {
            if !spin_for(ping, i, || true) {
                return 1;
            }
            // SAFETY: both buffers lie in the live mapping (`bytes` checked); the peer wrote
            // buf_a before raising `ping` (Release, seen with Acquire) and does not touch either
            // buffer until `pong` is raised.
            unsafe { std::ptr::copy_nonoverlapping(buf_a, buf_b, size) };
            pong.store(i, Ordering::Release);
        }
        0
    })?;
    let msg = vec![0x3cu8; size];
    let mut back = vec![0u8; size];
    let mut out = Vec::with_capacity(samples);
    for i in 1..=total {
        let t0 = now_ns();
        // SAFETY: buf_a is ours until `ping` is raised; the peer reads it only after.
        unsafe { std::ptr::copy_nonoverlapping(msg.as_ptr(), buf_a, size) };
        ping.store(i, Ordering::Release);
        let mut how = None;
        if !spin_for(pong, i, || {
            how = child.exited();
            how.is_none()
        }) {
            return Err(stalled("payload ping-pong", how));
        }
        // SAFETY: the peer wrote buf_b before raising `pong` and leaves it until the next ping.
        unsafe { std::ptr::copy_nonoverlapping(buf_b, back.as_mut_ptr(), size) };
        std::hint::black_box(&back);
        let dt = now_ns() - t0;
        if i > o.warmup as u64 {
            out.push(dt);
        }
    }
    child.wait("payload ping-pong")?;
    Ok(out)
}

fn futex_word(page: &SharedPage, off: usize) -> &AtomicU32 {
    // SAFETY: `word` checks that 8 bytes at `off` are in bounds and 8-aligned, so their first
    // 4 bytes are an in-bounds, aligned u32; both sides use only this u32 view of the slot.
    unsafe { &*(page.word(off) as *const AtomicU64 as *const AtomicU32) }
}

fn futex_wait(w: &AtomicU32, val: u32) {
    let ts = libc::timespec {
        tv_sec: 1,
        tv_nsec: 0,
    };
    // SAFETY: `w` is an aligned u32 in a live shared mapping; `ts` is a valid timespec.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            w.as_ptr(),
            libc::FUTEX_WAIT,
            val,
            &ts as *const libc::timespec,
            0,
            0,
        )
    };
}

fn futex_wake(w: &AtomicU32) {
    // SAFETY: `w` is an aligned u32 in a live shared mapping.
    unsafe { libc::syscall(libc::SYS_futex, w.as_ptr(), libc::FUTEX_WAKE, 1, 0, 0, 0) };
}

/// Waits on a futex until `w` holds `want`; false after [`STALL_NS`].
fn futex_until(w: &AtomicU32, want: u32) -> bool {
    let start = now_ns();
    loop {
        let v = w.load(Ordering::Acquire);
        if v == want {
            return true;
        }
        if now_ns() - start > STALL_NS {
            return false;
        }
        futex_wait(w, v);
    }
}

/// One direction of the futex ping-pong: the counter the sender moves and, for the fair
/// variant, the word its waiter announces itself on.
#[derive(Clone, Copy)]
struct Direction<'a> {
    counter: &'a AtomicU32,
    sleep: &'a AtomicU32,
}

/// How the futex ping-pong wakes its peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FutexWake {
    /// `FUTEX_WAKE` after every store, whether or not the peer sleeps.
    Always,
    /// The channel's protocol (see `ring.rs`, "Sleeping"): the waiter sets its sleep word, a
    /// SeqCst fence, re-checks, and only then `FUTEX_WAIT`s on the sleep word; the sender, after
    /// its store and a SeqCst fence, `FUTEX_WAKE`s only if that word was set. No system call
    /// when the peer has not gone to sleep yet: the fair comparison for the channel's blocking
    /// mode.
    IfWaiting,
}

impl Direction<'_> {
    fn send(&self, value: u32, how: FutexWake) {
        self.counter.store(value, Ordering::Release);
        match how {
            FutexWake::Always => futex_wake(self.counter),
            FutexWake::IfWaiting => {
                fence(Ordering::SeqCst);
                if self.sleep.load(Ordering::Relaxed) != 0
                    && self.sleep.swap(0, Ordering::Relaxed) != 0
                {
                    futex_wake(self.sleep);
                }
            }
        }
    }

    /// Waits until the counter holds `want`; false after [`STALL_NS`].
    fn wait(&self, want: u32, how: FutexWake) -> bool {
        match how {
            FutexWake::Always => futex_until(self.counter, want),
            FutexWake::IfWaiting => {
                let start = now_ns();
                loop {
                    if self.counter.load(Ordering::Acquire) == want {
                        return true;
                    }
                    self.sleep.store(1, Ordering::Relaxed);
                    fence(Ordering::SeqCst);
                    if self.counter.load(Ordering::Acquire) == want {
                        self.sleep.store(0, Ordering::Relaxed);
                        return true;
                    }
                    futex_wait(self.sleep, 1);
                    self.sleep.store(0, Ordering::Relaxed);
                    if now_ns() - start > STALL_NS {
                        return false;
                    }
                }
            }
        }
    }
}

/// Raw futex ping-pong: each side stores its counter, wakes the other as `how` says, and
/// sleeps in `FUTEX_WAIT` until the other's counter moves. No spinning: the kernel's wake-up
/// path is the whole cost, which is what the channel's blocking mode is compared against.
pub(crate) fn futex_rtt(
    o: &BenchOptions,
    samples: usize,
    how: FutexWake,
) -> anyhow::Result<Vec<u64>> {
    let page = SharedPage::new()?;
    // Each word on its own 128-byte slot, as the channel's control block keeps them apart.
    let ping = Direction {
        counter: futex_word(&page, 0),
        sleep: futex_word(&page, 256),
    };
    let pong = Direction {
        counter: futex_word(&page, 128),
        sleep: futex_word(&page, 384),
    };
    let total = (o.warmup.min(1000) + samples) as u32;
    let child = spawn_pinned(o.child_hart, || {
        for i in 1..=total {
            if !ping.wait(i, how) {
                return 1;
            }
            pong.send(i, how);
        }
        0
    })?;
    let mut out = Vec::with_capacity(samples);
    for i in 1..=total {
        let t0 = now_ns();
        ping.send(i, how);
        if !pong.wait(i, how) {
            bail!("futex ping-pong peer stalled");
        }
        let dt = now_ns() - t0;
        if i as usize > o.warmup.min(1000) {
            out.push(dt);
        }
    }
    child.wait("futex ping-pong")?;
    Ok(out)
}

/// How the stream baselines wait for data and room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StreamWait {
    /// Blocking reads and writes: the kernel sleeps and wakes each side.
    Block,
    /// `O_NONBLOCK` descriptors, retrying on `EAGAIN` without sleeping: the best a plain-Linux
    /// program that spins can do with a pipe or socket, compared with the busy-polled channel.
    Poll,
}

/// Whether the last failed call should simply be retried: no data or room yet on a
/// non-blocking descriptor, or a signal interrupted a blocking one.
fn would_block() -> bool {
    matches!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EAGAIN) | Some(libc::EINTR)
    )
}

fn write_all(fd: RawFd, buf: &[u8]) -> bool {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: writing from a valid buffer range.
        let n = unsafe { libc::write(fd, buf[done..].as_ptr().cast(), buf.len() - done) };
        if n < 0 && would_block() {
            std::hint::spin_loop();
            continue;
        }
        if n <= 0 {
            return false;
        }
        done += n as usize;
    }
    true
}

fn read_exact(fd: RawFd, buf: &mut [u8]) -> bool {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: reading into a valid buffer range.
        let n = unsafe { libc::read(fd, buf[done..].as_mut_ptr().cast(), buf.len() - done) };
        if n < 0 && would_block() {
            std::hint::spin_loop();
            continue;
        }
        if n <= 0 {
            return false;
        }
        done += n as usize;
    }
    true
}

fn set_nonblocking(fd: RawFd) -> anyhow::Result<()> {
    // SAFETY: F_GETFL/F_SETFL on a descriptor the caller owns; no pointers involved.
    let ok = unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) == 0
    };
    if ok {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error()).context("setting O_NONBLOCK")
    }
}

/// Ping-pong of `size`-byte messages over a pair of byte streams (`parent_tx -> child_rx`,
/// `child_tx -> parent_rx`), waiting as `wait` says. `child_owned` holds the child's
/// descriptors; the parent closes its copies after the fork so that the child's death shows
/// as end-of-file.
fn stream_rtt(
    o: &BenchOptions,
    samples: usize,
    size: usize,
    wait: StreamWait,
    (parent_tx, parent_rx): (RawFd, RawFd),
    (child_rx, child_tx): (RawFd, RawFd),
    child_owned: Vec<OwnedFd>,
) -> anyhow::Result<Vec<u64>> {
    if wait == StreamWait::Poll {
        for fd in [parent_tx, parent_rx, child_rx, child_tx] {
            set_nonblocking(fd)?;
        }
    }
    let total = o.warmup.min(1000) + samples;
    let child = spawn_pinned(o.child_hart, || {
        let mut buf = vec![0u8; size];
        let b = &mut buf[..];
        for _ in 0..total {
            if !read_exact(child_rx, b) || !write_all(child_tx, b) {
                return 1;
            }
        }
        0
    })?;
    drop(child_owned);
    let msg = vec![0x5au8; size];
    let mut back = vec![0u8; size];
    let mut out = Vec::with_capacity(samples);
    for i in 0..total {
        let t0 = now_ns();
        if !write_all(parent_tx, &msg) || !read_exact(parent_rx, &mut back) {
            let err = std::io::Error::last_os_error();
            bail!("stream ping-pong ({size} B, {wait:?}) failed at round trip {i}: the peer went away or {err}");
        }
        let dt = now_ns() - t0;
        if i >= o.warmup.min(1000) {
            out.push(dt);
        }
    }
    child.wait("stream ping-pong")?;
    Ok(out)
}

fn owned_pair(fds: [RawFd; 2]) -> (OwnedFd, OwnedFd) {
    // SAFETY: both descriptors were just created by the caller and are owned by nobody else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// Unix-domain stream socket pair ping-pong of `size` bytes.
pub(crate) fn uds_rtt(
    o: &BenchOptions,
    samples: usize,
    size: usize,
    wait: StreamWait,
) -> anyhow::Result<Vec<u64>> {
    let mut fds = [-1; 2];
    // SAFETY: `fds` is a valid two-element array.
    if unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    } != 0
    {
        return Err(std::io::Error::last_os_error()).context("socketpair");
    }
    let (p, c) = owned_pair(fds);
    let c_raw = c.as_raw_fd();
    stream_rtt(
        o,
        samples,
        size,
        wait,
        (p.as_raw_fd(), p.as_raw_fd()),
        (c_raw, c_raw),
        vec![c],
    )
}

/// Pipe ping-pong of `size` bytes (two pipes, one per direction).
pub(crate) fn pipe_rtt(
    o: &BenchOptions,
    samples: usize,
    size: usize,
    wait: StreamWait,
) -> anyhow::Result<Vec<u64>> {
    let mut down = [-1; 2];
    let mut up = [-1; 2];
    // SAFETY: valid two-element arrays.
    if unsafe { libc::pipe2(down.as_mut_ptr(), libc::O_CLOEXEC) } != 0
        // SAFETY: as above.
        || unsafe { libc::pipe2(up.as_mut_ptr(), libc::O_CLOEXEC) } != 0
    {
        return Err(std::io::Error::last_os_error()).context("pipe2");
    }
    let (down_r, down_w) = owned_pair(down);
    let (up_r, up_w) = owned_pair(up);
    let child_ends = (down_r.as_raw_fd(), up_w.as_raw_fd());
    stream_rtt(
        o,
        samples,
        size,
        wait,
        (down_w.as_raw_fd(), up_r.as_raw_fd()),
        child_ends,
        vec![down_r, up_w],
    )
}

/// Single-core memcpy bandwidth in bytes/s: `chunk`-byte copies from a hot source into a
/// destination cycling through `region` bytes (the channel ring's size, so the working set
/// matches), for about `duration_ns`.
pub(crate) fn memcpy_bandwidth(chunk: usize, region: usize, duration_ns: u64) -> f64 {
    let src = vec![0xa5u8; chunk];
    let mut dst = vec![0u8; region.max(chunk)];
    let per_pass = dst.len() / chunk * chunk;
    let mut bytes = 0u64;
    let t0 = now_ns();
    let mut elapsed;
    loop {
        for off in (0..per_pass).step_by(chunk) {
            dst[off..off + chunk].copy_from_slice(std::hint::black_box(&src));
        }
        std::hint::black_box(&mut dst);
        bytes += per_pass as u64;
        elapsed = now_ns() - t0;
        if elapsed >= duration_ns {
            break;
        }
    }
    bytes as f64 * 1e9 / elapsed as f64
}
