//! The C ABI. `include/tess_channel.h` is generated from this file by cbindgen (build.rs); a
//! test fails when the committed header differs from the generated one. C programs link these
//! functions from libtess, the one C library of tess (crates/tess-ffi, docs/c-library.md).
//!
//! Conventions: every function returns `TESS_CHANNEL_OK` (0) or a negative
//! `TESS_CHANNEL_E*` code; `tess_channel_strerror` names it. Timeouts are in nanoseconds; where
//! a function takes `timeout_ns` as `int64_t`, `-1` waits forever and `0` does not wait. A
//! channel handle must not be used by two threads at once.

use crate::endpoint::{Channel, ChannelOptions, Endpoint, EndpointFds, Side};
use crate::error::{OpenError, RecvError, SendError, SendTimeoutError, TryRecvError, TrySendError};
use crate::ring::{Placement, Record};
use crate::wait::{deadline_after, Wait, WaitEnd};
use std::ffi::{c_char, c_int, c_void};
use std::os::fd::{BorrowedFd, FromRawFd, IntoRawFd, OwnedFd};
use std::time::Duration;

/// Success.
pub const TESS_CHANNEL_OK: c_int = 0;
/// The channel is full (send) or empty (receive); try again later.
pub const TESS_CHANNEL_EAGAIN: c_int = -1;
/// The timeout passed.
pub const TESS_CHANNEL_ETIMEDOUT: c_int = -2;
/// The peer hung up or died (and, when receiving, everything it sent has been received).
pub const TESS_CHANNEL_EDISCONNECTED: c_int = -3;
/// The peer corrupted the shared memory; the channel is unusable.
pub const TESS_CHANNEL_ECORRUPTED: c_int = -4;
/// The message is longer than the channel's maximum message size.
pub const TESS_CHANNEL_ETOOLARGE: c_int = -5;
/// The buffer is shorter than the next message (which stays in the channel).
pub const TESS_CHANNEL_EBUFFER: c_int = -6;
/// An argument is invalid (null pointer, unknown wait mode, bad options).
pub const TESS_CHANNEL_EINVAL: c_int = -7;
/// A system call failed; `errno` says why.
pub const TESS_CHANNEL_EOS: c_int = -8;
/// The descriptors do not hold a valid channel (bad seals, size, header or hand-off message).
pub const TESS_CHANNEL_EBADCHANNEL: c_int = -9;
/// A reservation or a peeked message is outstanding (or none is, for commit / release).
pub const TESS_CHANNEL_EBUSY: c_int = -10;

/// Wait mode: spin until the operation can proceed.
pub const TESS_CHANNEL_WAIT_BUSY_POLL: u32 = 0;
/// Wait mode: spin for an adaptive budget, then sleep on a futex (the default).
pub const TESS_CHANNEL_WAIT_ADAPTIVE: u32 = 1;
/// Wait mode: sleep on a futex at once.
pub const TESS_CHANNEL_WAIT_SLEEP: u32 = 2;

/// An open channel end. Opaque.
#[derive(Debug)]
pub struct TessChannel {
    ep: Endpoint,
    write: Option<Placement>,
    read: Option<Record>,
}

/// The descriptors of one channel end, as created by `tess_channel_create` and moved between
/// processes with `tess_channel_send_fds` / `tess_channel_recv_fds`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TessChannelFds {
    /// The sealed memfd holding both rings.
    pub memfd: c_int,
    /// This side's end of the liveness socket pair.
    pub liveness: c_int,
    /// 0 for side A, 1 for side B.
    pub side: u32,
}

/// Parameters fixed when a channel is created.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TessChannelOptions {
    /// Bytes of ring per direction: a power of two, at least
    /// 2 * (8 + max_message_size rounded up to 8) + 8.
    pub capacity: usize,
    /// Largest message, in bytes.
    pub max_message_size: usize,
}

/// One message of a batch send.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TessChannelMsg {
    /// The bytes.
    pub data: *const c_void,
    /// How many.
    pub len: usize,
}

/// Called once per message by `tess_channel_try_recv_batch`, with the message in place.
pub type TessChannelRecvFn =
    Option<unsafe extern "C" fn(ctx: *mut c_void, msg: *const c_void, len: usize)>;

fn set_errno(e: &std::io::Error) {
    if let Some(code) = e.raw_os_error() {
        // SAFETY: __errno_location returns the calling thread's errno slot.
        unsafe { *libc::__errno_location() = code };
    }
}

fn open_code(e: &OpenError) -> c_int {
    match e {
        OpenError::Io { source, .. } => {
            set_errno(source);
            TESS_CHANNEL_EOS
        }
        OpenError::Layout(_) => TESS_CHANNEL_EINVAL,
        _ => TESS_CHANNEL_EBADCHANNEL,
    }
}

fn send_code(e: WaitEnd<SendError>) -> c_int {
    match e {
        WaitEnd::Timeout => TESS_CHANNEL_ETIMEDOUT,
        WaitEnd::Disconnected => TESS_CHANNEL_EDISCONNECTED,
        WaitEnd::Fail(SendError::Disconnected) => TESS_CHANNEL_EDISCONNECTED,
        WaitEnd::Fail(SendError::TooLarge { .. }) => TESS_CHANNEL_ETOOLARGE,
        WaitEnd::Fail(SendError::Corrupted(_)) => TESS_CHANNEL_ECORRUPTED,
    }
}

fn recv_code(e: WaitEnd<RecvError>) -> c_int {
    match e {
        WaitEnd::Timeout => TESS_CHANNEL_ETIMEDOUT,
        WaitEnd::Disconnected => TESS_CHANNEL_EDISCONNECTED,
        WaitEnd::Fail(RecvError::Disconnected) => TESS_CHANNEL_EDISCONNECTED,
        WaitEnd::Fail(RecvError::BufferTooSmall { .. }) => TESS_CHANNEL_EBUFFER,
        WaitEnd::Fail(RecvError::Corrupted(_)) => TESS_CHANNEL_ECORRUPTED,
    }
}

fn try_send_code(e: TrySendError) -> c_int {
    match e {
        TrySendError::Full => TESS_CHANNEL_EAGAIN,
        TrySendError::Disconnected => TESS_CHANNEL_EDISCONNECTED,
        TrySendError::TooLarge { .. } => TESS_CHANNEL_ETOOLARGE,
        TrySendError::Corrupted(_) => TESS_CHANNEL_ECORRUPTED,
    }
}

/// `timeout_ns` (-1 forever, 0 no wait) as an internal deadline (`Some(0)`: no wait).
fn deadline(timeout_ns: i64) -> Option<u64> {
    match timeout_ns {
        t if t < 0 => None,
        0 => Some(0),
        t => Some(deadline_after(Duration::from_nanos(t as u64)).max(1)),
    }
}

/// Borrows the channel behind `ch`, or returns EINVAL.
macro_rules! chan {
    ($ch:expr) => {
        // SAFETY: the caller passes a handle from tess_channel_open that it has not closed and
        // does not use from another thread at the same time (documented contract).
        match unsafe { $ch.as_mut() } {
            Some(c) => c,
            None => return TESS_CHANNEL_EINVAL,
        }
    };
}

/// Creates a channel and stores the descriptors of its two ends in `*a` and `*b`.
///
/// `opts`: capacity and max message size; NULL for the defaults (64 KiB, 4480 bytes).
/// `a`, `b`: filled with side A's and side B's descriptors, owned by the caller, who hands
/// each to one process (`tess_channel_send_fds`) and then closes its copies
/// (`tess_channel_close_fds`).
/// Returns 0, TESS_CHANNEL_EINVAL for impossible options, or TESS_CHANNEL_EOS.
///
/// # Safety
/// `opts` is NULL or valid; `a` and `b` are valid for writes.
#[no_mangle]
pub unsafe extern "C" fn tess_channel_create(
    opts: *const TessChannelOptions,
    a: *mut TessChannelFds,
    b: *mut TessChannelFds,
) -> c_int {
    if a.is_null() || b.is_null() {
        return TESS_CHANNEL_EINVAL;
    }
    // SAFETY: `opts` is NULL or valid by the contract.
    let opts = match unsafe { opts.as_ref() } {
        Some(o) => ChannelOptions {
            capacity: o.capacity,
            max_message_size: o.max_message_size,
        },
        None => ChannelOptions::default(),
    };
    match Channel::create(&opts) {
        Ok((fa, fb)) => {
            // SAFETY: `a` and `b` are valid for writes by the contract.
            unsafe {
                *a = into_c(fa);
                *b = into_c(fb);
            }
            TESS_CHANNEL_OK
        }
        Err(e) => open_code(&e),
    }
}

fn into_c(f: EndpointFds) -> TessChannelFds {
    TessChannelFds {
        memfd: f.memfd.into_raw_fd(),
        liveness: f.liveness.into_raw_fd(),
        side: f.side as u32,
    }
}

/// Sends the descriptors `*fds` over the connected Unix socket `sock` (SCM_RIGHTS). The caller
/// still owns `*fds` and should close them afterwards (`tess_channel_close_fds`).
/// Returns 0, TESS_CHANNEL_EINVAL or TESS_CHANNEL_EOS.
///
/// # Safety
/// `fds` is valid; its descriptors are open.
#[no_mangle]
pub unsafe extern "C" fn tess_channel_send_fds(sock: c_int, fds: *const TessChannelFds) -> c_int {
    // SAFETY: `fds` is NULL or valid by the contract.
    let Some(f) = (unsafe { fds.as_ref() }) else {
        return TESS_CHANNEL_EINVAL;
    };
    if sock < 0 || f.memfd < 0 || f.liveness < 0 || f.side > 1 {
        return TESS_CHANNEL_EINVAL;
    }
    // Borrow the descriptors as owned ones just for the call, without closing them after.
    // SAFETY: the descriptors are open (contract); ManuallyDrop keeps them open.
    let tmp = std::mem::ManuallyDrop::new(unsafe {
        EndpointFds {
            memfd: OwnedFd::from_raw_fd(f.memfd),
            liveness: OwnedFd::from_raw_fd(f.liveness),
            side: if f.side == 0 { Side::A } else { Side::B },
        }
    });
    // SAFETY: `sock` is an open descriptor for the duration of the call (contract).
    let sock = unsafe { BorrowedFd::borrow_raw(sock) };
    match crate::handoff::send_endpoint(sock, &tmp) {
        Ok(()) => TESS_CHANNEL_OK,
        Err(e) => open_code(&e),
    }
}

/// Receives descriptors of one channel end from the Unix socket `sock` into `*out` (blocking).
/// Returns 0, TESS_CHANNEL_EINVAL, TESS_CHANNEL_EBADCHANNEL (malformed hand-off) or
/// TESS_CHANNEL_EOS.
///
/// # Safety
/// `out` is valid for writes.
#[no_mangle]
pub unsafe extern "C" fn tess_channel_recv_fds(sock: c_int, out: *mut TessChannelFds) -> c_int {
    if sock < 0 || out.is_null() {
        return TESS_CHANNEL_EINVAL;
    }
    // SAFETY: `sock` is open for the duration of the call (contract).
    let sock = unsafe { BorrowedFd::borrow_raw(sock) };
    match crate::handoff::recv_endpoint(sock) {
        Ok(f) => {
            // SAFETY: `out` is valid for writes (contract).
            unsafe { *out = into_c(f) };
            TESS_CHANNEL_OK
        }
        Err(e) => open_code(&e),
    }
}

/// Closes the descriptors in `*fds` (those that are >= 0) and sets them to -1.
///
/// # Safety
/// `fds` is NULL or valid; its descriptors are owned by the caller.
#[no_mangle]
pub unsafe extern "C" fn tess_channel_close_fds(fds: *mut TessChannelFds) {
    // SAFETY: `fds` is NULL or valid (contract).
    if let Some(f) = unsafe { fds.as_mut() } {
        for fd in [&mut f.memfd, &mut f.liveness] {
            if *fd >= 0 {
                // SAFETY: the caller owns the descriptor (contract).
                unsafe { libc::close(*fd) };
                *fd = -1;
            }
        }
    }
}

/// Opens a channel end from its descriptors, validating them, and stores the handle in `*out`.
/// On success the handle owns the descriptors and `*fds` is set to -1s; on failure the caller
/// still owns them.
/// Returns 0, TESS_CHANNEL_EINVAL, TESS_CHANNEL_EBADCHANNEL or TESS_CHANNEL_EOS.
///
/// # Safety
/// `fds` is valid and its descriptors are open and owned by the caller; `out` is valid for
/// writes.
#[no_mangle]
pub unsafe extern "C" fn tess_channel_open(
    fds: *mut TessChannelFds,
    out: *mut *mut TessChannel,
) -> c_int {
    // SAFETY: `fds` is NULL or valid (contract).
    let Some(f) = (unsafe { fds.as_mut() }) else {
        return TESS_CHANNEL_EINVAL;
    };
    if out.is_null() || f.memfd < 0 || f.liveness < 0 || f.side > 1 {
        return TESS_CHANNEL_EINVAL;
    }
    // Duplicate first, so that a failure leaves the caller's descriptors untouched.
    // SAFETY: the descriptors are open (contract); borrowed only for the duplication.
    let dup = |fd| unsafe { BorrowedFd::borrow_raw(fd) }.try_clone_to_owned();
    let (memfd, liveness) = match (dup(f.memfd), dup(f.liveness)) {
        (Ok(m), Ok(l)) => (m, l),
        (Err(e), _) | (_, Err(e)) => {
            set_errno(&e);
            return TESS_CHANNEL_EOS;
        }
    };
    let side = if f.side == 0 { Side::A } else { Side::B };
    match Endpoint::from_fds(EndpointFds {
        memfd,
        liveness,
        side,
    }) {
        Ok(ep) => {
            // SAFETY: closing the caller's originals, now duplicated into the handle.
            unsafe { tess_channel_close_fds(f) };
            let ch = Box::new(TessChannel {
                ep,
                write: None,
                read: None,
            });
            // SAFETY: `out` is valid for writes (contract).
            unsafe { *out = Box::into_raw(ch) };
            TESS_CHANNEL_OK
        }
        Err(e) => open_code(&e),
    }
}

/// Receives a channel end from the Unix socket `sock` and opens it (`tess_channel_recv_fds`
/// then `tess_channel_open`). Returns as those do.
///
/// # Safety
/// `out` is valid for writes.
#[no_mangle]
pub unsafe extern "C" fn tess_channel_recv_open(sock: c_int, out: *mut *mut TessChannel) -> c_int {
    let mut fds = TessChannelFds {
        memfd: -1,
        liveness: -1,
        side: 0,
    };
    // SAFETY: `fds` is a valid local; `out` per the contract.
    unsafe {
        let rc = tess_channel_recv_fds(sock, &mut fds);
        if rc != TESS_CHANNEL_OK {
            return rc;
        }
        let rc = tess_channel_open(&mut fds, out);
        tess_channel_close_fds(&mut fds);
        rc
    }
}

/// Closes a channel end: the peer sees an orderly hang-up. NULL is ignored.
///
/// # Safety
/// `ch` is NULL or a handle from `tess_channel_open` not closed before.
#[no_mangle]
pub unsafe extern "C" fn tess_channel_close(ch: *mut TessChannel) {
    if !ch.is_null() {
        // SAFETY: the handle came from Box::into_raw in tess_channel_open (contract).
        drop(unsafe { Box::from_raw(ch) });
    }
}

/// Sets how blocking calls wait: TESS_CHANNEL_WAIT_BUSY_POLL, _ADAPTIVE (default) or _SLEEP.
/// Returns 0 or TESS_CHANNEL_EINVAL.
///
/// # Safety
/// `ch` is a valid handle.
#[no_mangle]
pub unsafe extern "C" fn tess_channel_set_wait(ch: *mut TessChannel, mode: u32) -> c_int {
    let c = chan!(ch);
    let w = match mode {
        TESS_CHANNEL_WAIT_BUSY_POLL => Wait::BusyPoll,
        TESS_CHANNEL_WAIT_ADAPTIVE => Wait::Adaptive,
        TESS_CHANNEL_WAIT_SLEEP => Wait::Sleep,
        _ => return TESS_CHANNEL_EINVAL,
    };
    c.ep.set_wait(w);
    TESS_CHANNEL_OK
}

/// Sets the longest time (ns, > 0) a waiting call goes without checking that the peer lives.
/// Returns 0 or TESS_CHANNEL_EINVAL.
///
/// # Safety
/// `ch` is a valid handle.
#[no_mangle]
pub unsafe extern "C" fn tess_channel_set_liveness_interval(
    ch: *mut TessChannel,
    interval_ns: u64,
) -> c_int {
    let c = chan!(ch);
    if interval_ns == 0 {
        return TESS_CHANNEL_EINVAL;
    }
    c.ep.set_liveness_interval(Duration::from_nanos(interval_ns));
    TESS_CHANNEL_OK
}

/// The largest message of the channel, in bytes (0 for NULL).
///
/// # Safety
/// `ch` is NULL or a valid handle.
#[no_mangle]
pub unsafe extern "C" fn tess_channel_max_message_size(ch: *const TessChannel) -> usize {
    // SAFETY: NULL or valid (contract).
    unsafe { ch.as_ref() }.map_or(0, |c| c.ep.max_message_size())
}

/// 1 if the peer process still holds its end, 0 if not (or NULL).
///
/// # Safety
/// `ch` is NULL or a valid handle.
#[no_mangle]
pub unsafe extern "C" fn tess_channel_peer_alive(ch: *const TessChannel) -> c_int {
    // SAFETY: NULL or valid (contract).
    unsafe { ch.as_ref() }.map_or(0, |c| c.ep.is_peer_alive() as c_int)
}

unsafe fn bytes<'a>(buf: *const c_void, len: usize) -> Option<&'a [u8]> {
    if len == 0 {
        return Some(&[]);
    }
    if buf.is_null() {
        return None;
    }
    // SAFETY: the caller guarantees `len` readable bytes at `buf`.
    Some(unsafe { std::slice::from_raw_parts(buf.cast(), len) })
}

unsafe fn bytes_mut<'a>(buf: *mut c_void, len: usize) -> Option<&'a mut [u8]> {
    if len == 0 {
        return Some(&mut []);
    }
    if buf.is_null() {
        return None;
    }
    // SAFETY: the caller guarantees `len` writable bytes at `buf`.
    Some(unsafe { std::slice::from_raw_parts_mut(buf.cast(), len) })
}

/// Sends `len` bytes from `buf`, waiting for room as the wait mode says.
/// Returns 0, TESS_CHANNEL_EDISCONNECTED, _ETOOLARGE, _ECORRUPTED, _EBUSY or _EINVAL.
///
/// # Safety
/// `ch` is a valid handle; `buf` has `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn tess_channel_send(
    ch: *mut TessChannel,
    buf: *const c_void,
    len: usize,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { tess_channel_send_timeout(ch, buf, len, u64::MAX) }
}

/// Sends `len` bytes from `buf` if there is room now.
/// Returns 0, TESS_CHANNEL_EAGAIN (full), or as `tess_channel_send`.
///
/// # Safety
/// `ch` is a valid handle; `buf` has `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn tess_channel_try_send(
    ch: *mut TessChannel,
    buf: *const c_void,
    len: usize,
) -> c_int {
    let c = chan!(ch);
    if c.write.is_some() {
        return TESS_CHANNEL_EBUSY;
    }
    // SAFETY: forwarded contract.
    let Some(msg) = (unsafe { bytes(buf, len) }) else {
        return TESS_CHANNEL_EINVAL;
    };
    match c.ep.try_send(msg) {
        Ok(()) => TESS_CHANNEL_OK,
        Err(e) => try_send_code(e),
    }
}

/// Sends `len` bytes from `buf`, waiting at most `timeout_ns` for room (`UINT64_MAX`: no
/// limit). Returns 0, TESS_CHANNEL_ETIMEDOUT, or as `tess_channel_send`.
///
/// # Safety
/// `ch` is a valid handle; `buf` has `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn tess_channel_send_timeout(
    ch: *mut TessChannel,
    buf: *const c_void,
    len: usize,
    timeout_ns: u64,
) -> c_int {
    let c = chan!(ch);
    if c.write.is_some() {
        return TESS_CHANNEL_EBUSY;
    }
    // SAFETY: forwarded contract.
    let Some(msg) = (unsafe { bytes(buf, len) }) else {
        return TESS_CHANNEL_EINVAL;
    };
    let r = if timeout_ns == u64::MAX {
        c.ep.send(msg).map_err(|e| send_code(WaitEnd::Fail(e)))
    } else {
        c.ep.send_timeout(msg, Duration::from_nanos(timeout_ns))
            .map_err(|e| match e {
                SendTimeoutError::Timeout => TESS_CHANNEL_ETIMEDOUT,
                SendTimeoutError::Disconnected => TESS_CHANNEL_EDISCONNECTED,
                SendTimeoutError::TooLarge { .. } => TESS_CHANNEL_ETOOLARGE,
                SendTimeoutError::Corrupted(_) => TESS_CHANNEL_ECORRUPTED,
            })
    };
    r.err().unwrap_or(TESS_CHANNEL_OK)
}

/// Sends as many of the `n` messages at `msgs` as fit now, in order, published together;
/// stores how many in `*sent`. Returns 0 (at least one sent), TESS_CHANNEL_EAGAIN (none fit),
/// or as `tess_channel_send`.
///
/// # Safety
/// `ch` is a valid handle; `msgs` has `n` valid entries; `sent` is NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn tess_channel_try_send_batch(
    ch: *mut TessChannel,
    msgs: *const TessChannelMsg,
    n: usize,
    sent: *mut usize,
) -> c_int {
    let c = chan!(ch);
    if c.write.is_some() {
        return TESS_CHANNEL_EBUSY;
    }
    if n > 0 && msgs.is_null() {
        return TESS_CHANNEL_EINVAL;
    }
    let list: &[TessChannelMsg] = if n == 0 {
        &[]
    } else {
        // SAFETY: `msgs` has `n` entries (contract).
        unsafe { std::slice::from_raw_parts(msgs, n) }
    };
    let mut slices = Vec::with_capacity(n);
    for m in list {
        // SAFETY: each entry points to `len` readable bytes (contract).
        match unsafe { bytes(m.data, m.len) } {
            Some(s) => slices.push(s),
            None => return TESS_CHANNEL_EINVAL,
        }
    }
    let (rc, k) = match c.ep.try_send_batch(&slices) {
        Ok(k) => (TESS_CHANNEL_OK, k),
        Err(e) => (try_send_code(e), 0),
    };
    if !sent.is_null() {
        // SAFETY: valid for writes (contract).
        unsafe { *sent = k };
    }
    rc
}

fn recv_common(
    c: &mut TessChannel,
    buf: &mut [u8],
    len: *mut usize,
    deadline: Option<u64>,
) -> c_int {
    if c.read.is_some() {
        return TESS_CHANNEL_EBUSY;
    }
    let (rc, n) = match c.ep.receiver().recv_raw(buf, deadline) {
        Ok(n) => (TESS_CHANNEL_OK, n),
        Err(WaitEnd::Fail(RecvError::BufferTooSmall { len, .. })) => (TESS_CHANNEL_EBUFFER, len),
        Err(e) => (recv_code(e), 0),
    };
    if !len.is_null() {
        // SAFETY: NULL or valid for writes (contract of the callers).
        unsafe { *len = n };
    }
    rc
}

/// Receives the next message into `buf` (`cap` bytes), waiting as the wait mode says; stores
/// its length in `*len`. Returns 0, TESS_CHANNEL_EBUFFER (message longer than `cap`; `*len`
/// is its length and it stays in the channel), TESS_CHANNEL_EDISCONNECTED, _ECORRUPTED,
/// _EBUSY or _EINVAL.
///
/// # Safety
/// `ch` is a valid handle; `buf` has `cap` writable bytes; `len` is NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn tess_channel_recv(
    ch: *mut TessChannel,
    buf: *mut c_void,
    cap: usize,
    len: *mut usize,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { tess_channel_recv_timeout(ch, buf, cap, len, u64::MAX) }
}

/// Receives the next message if there is one now. Returns 0, TESS_CHANNEL_EAGAIN (empty), or
/// as `tess_channel_recv`.
///
/// # Safety
/// As `tess_channel_recv`.
#[no_mangle]
pub unsafe extern "C" fn tess_channel_try_recv(
    ch: *mut TessChannel,
    buf: *mut c_void,
    cap: usize,
    len: *mut usize,
) -> c_int {
    let c = chan!(ch);
    // SAFETY: forwarded contract.
    let Some(buf) = (unsafe { bytes_mut(buf, cap) }) else {
        return TESS_CHANNEL_EINVAL;
    };
    match recv_common(c, buf, len, Some(0)) {
        TESS_CHANNEL_ETIMEDOUT => TESS_CHANNEL_EAGAIN,
        rc => rc,
    }
}

/// Receives the next message, waiting at most `timeout_ns` (`UINT64_MAX`: no limit).
/// Returns 0, TESS_CHANNEL_ETIMEDOUT, or as `tess_channel_recv`.
///
/// # Safety
/// As `tess_channel_recv`.
#[no_mangle]
pub unsafe extern "C" fn tess_channel_recv_timeout(
    ch: *mut TessChannel,
    buf: *mut c_void,
    cap: usize,
    len: *mut usize,
    timeout_ns: u64,
) -> c_int {
    let c = chan!(ch);
    // SAFETY: forwarded contract.
    let Some(buf) = (unsafe { bytes_mut(buf, cap) }) else {
        return TESS_CHANNEL_EINVAL;
    };
    let d = if timeout_ns == u64::MAX {
        None
    } else {
        Some(deadline_after(Duration::from_nanos(timeout_ns)).max(1))
    };
    recv_common(c, buf, len, d)
}

/// Calls `cb(ctx, msg, len)` for up to `max` waiting messages, in place (valid only during the
/// call), then frees their space at once; stores how many in `*received`. Returns 0 (at least
/// one), TESS_CHANNEL_EAGAIN (none), TESS_CHANNEL_EDISCONNECTED, _ECORRUPTED, _EBUSY or
/// _EINVAL.
///
/// # Safety
/// `ch` is a valid handle; `cb` is a valid function; `received` is NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn tess_channel_try_recv_batch(
    ch: *mut TessChannel,
    max: usize,
    cb: TessChannelRecvFn,
    ctx: *mut c_void,
    received: *mut usize,
) -> c_int {
    let c = chan!(ch);
    let Some(cb) = cb else {
        return TESS_CHANNEL_EINVAL;
    };
    if c.read.is_some() {
        return TESS_CHANNEL_EBUSY;
    }
    let r = c.ep.try_recv_batch(max, |m| {
        // SAFETY: `cb` is a valid function (contract); `m` is valid for the call.
        unsafe { cb(ctx, m.as_ptr().cast(), m.len()) }
    });
    let (rc, n) = match r {
        Ok(n) => (TESS_CHANNEL_OK, n),
        Err(TryRecvError::Empty) => (TESS_CHANNEL_EAGAIN, 0),
        Err(TryRecvError::Disconnected) => (TESS_CHANNEL_EDISCONNECTED, 0),
        Err(TryRecvError::BufferTooSmall { .. }) => (TESS_CHANNEL_EBUFFER, 0),
        Err(TryRecvError::Corrupted(_)) => (TESS_CHANNEL_ECORRUPTED, 0),
    };
    if !received.is_null() {
        // SAFETY: valid for writes (contract).
        unsafe { *received = n };
    }
    rc
}

/// Lends a slot of `len` bytes to write a message in place; stores its address in `*slot`.
/// Waits for room up to `timeout_ns` (-1: forever, 0: not at all). Follow with
/// `tess_channel_commit`; until then no other send is allowed (TESS_CHANNEL_EBUSY).
/// Returns 0, TESS_CHANNEL_EAGAIN (no room and timeout 0), _ETIMEDOUT, _EDISCONNECTED,
/// _ETOOLARGE, _ECORRUPTED, _EBUSY or _EINVAL.
///
/// # Safety
/// `ch` is a valid handle; `slot` is valid for writes.
#[no_mangle]
pub unsafe extern "C" fn tess_channel_reserve(
    ch: *mut TessChannel,
    len: usize,
    timeout_ns: i64,
    slot: *mut *mut c_void,
) -> c_int {
    let c = chan!(ch);
    if slot.is_null() {
        return TESS_CHANNEL_EINVAL;
    }
    if c.write.is_some() {
        return TESS_CHANNEL_EBUSY;
    }
    let d = deadline(timeout_ns);
    match c.ep.sender().reserve_raw(len, d) {
        Ok((p, ptr)) => {
            c.write = Some(p);
            // SAFETY: valid for writes (contract).
            unsafe { *slot = ptr.cast() };
            TESS_CHANNEL_OK
        }
        Err(WaitEnd::Timeout) if d == Some(0) => TESS_CHANNEL_EAGAIN,
        Err(e) => send_code(e),
    }
}

/// Sends the first `len` bytes of the slot lent by `tess_channel_reserve` (`len` at most the
/// reserved length). Returns 0, TESS_CHANNEL_EBUSY (no slot lent) or TESS_CHANNEL_EINVAL.
///
/// # Safety
/// `ch` is a valid handle.
#[no_mangle]
pub unsafe extern "C" fn tess_channel_commit(ch: *mut TessChannel, len: usize) -> c_int {
    let c = chan!(ch);
    let Some(p) = c.write.take() else {
        return TESS_CHANNEL_EBUSY;
    };
    if len > p.len {
        c.write = Some(p);
        return TESS_CHANNEL_EINVAL;
    }
    c.ep.sender().commit_raw(p, len);
    TESS_CHANNEL_OK
}

/// Lends the next message in place: stores its address in `*msg` and length in `*len`. Waits
/// up to `timeout_ns` (-1: forever, 0: not at all). The message stays in the channel until
/// `tess_channel_release`; until then no other receive is allowed (TESS_CHANNEL_EBUSY). The
/// bytes live in memory the peer maps: validate what you parse from them.
/// Returns 0, TESS_CHANNEL_EAGAIN (empty and timeout 0), _ETIMEDOUT, _EDISCONNECTED,
/// _ECORRUPTED, _EBUSY or _EINVAL.
///
/// # Safety
/// `ch` is a valid handle; `msg` and `len` are valid for writes.
#[no_mangle]
pub unsafe extern "C" fn tess_channel_peek(
    ch: *mut TessChannel,
    timeout_ns: i64,
    msg: *mut *const c_void,
    len: *mut usize,
) -> c_int {
    let c = chan!(ch);
    if msg.is_null() || len.is_null() {
        return TESS_CHANNEL_EINVAL;
    }
    if c.read.is_some() {
        return TESS_CHANNEL_EBUSY;
    }
    let d = deadline(timeout_ns);
    match c.ep.receiver().peek_raw(d) {
        Ok((r, ptr)) => {
            c.read = Some(r);
            // SAFETY: valid for writes (contract).
            unsafe {
                *msg = ptr.cast();
                *len = r.len;
            }
            TESS_CHANNEL_OK
        }
        Err(WaitEnd::Timeout) if d == Some(0) => TESS_CHANNEL_EAGAIN,
        Err(e) => recv_code(e),
    }
}

/// Consumes the message lent by `tess_channel_peek`. Returns 0 or TESS_CHANNEL_EBUSY (none
/// lent).
///
/// # Safety
/// `ch` is a valid handle.
#[no_mangle]
pub unsafe extern "C" fn tess_channel_release(ch: *mut TessChannel) -> c_int {
    let c = chan!(ch);
    let Some(r) = c.read.take() else {
        return TESS_CHANNEL_EBUSY;
    };
    c.ep.receiver().release_raw(r);
    TESS_CHANNEL_OK
}

/// A static, human-readable name for a return code.
#[no_mangle]
pub extern "C" fn tess_channel_strerror(code: c_int) -> *const c_char {
    let s: &'static std::ffi::CStr = match code {
        TESS_CHANNEL_OK => c"success",
        TESS_CHANNEL_EAGAIN => c"channel full or empty, try again",
        TESS_CHANNEL_ETIMEDOUT => c"timed out",
        TESS_CHANNEL_EDISCONNECTED => c"peer hung up or died",
        TESS_CHANNEL_ECORRUPTED => c"peer corrupted the shared memory",
        TESS_CHANNEL_ETOOLARGE => c"message larger than the channel maximum",
        TESS_CHANNEL_EBUFFER => c"buffer smaller than the message",
        TESS_CHANNEL_EINVAL => c"invalid argument",
        TESS_CHANNEL_EOS => c"system call failed (see errno)",
        TESS_CHANNEL_EBADCHANNEL => c"descriptors do not hold a valid channel",
        TESS_CHANNEL_EBUSY => c"a reserved or peeked slot is outstanding (or none is)",
        _ => c"unknown tess_channel error",
    };
    s.as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_abi_round_trip_in_process() {
        let mut a = TessChannelFds {
            memfd: -1,
            liveness: -1,
            side: 9,
        };
        let mut b = a;
        let opts = TessChannelOptions {
            capacity: 4096,
            max_message_size: 256,
        };
        // SAFETY: all pointers are valid locals; handles are used from this thread only.
        unsafe {
            assert_eq!(tess_channel_create(&opts, &mut a, &mut b), 0);
            let (mut ca, mut cb) = (std::ptr::null_mut(), std::ptr::null_mut());
            assert_eq!(tess_channel_open(&mut a, &mut ca), 0);
            assert_eq!(tess_channel_open(&mut b, &mut cb), 0);
            assert_eq!(a.memfd, -1);
            assert_eq!(tess_channel_max_message_size(ca), 256);
            assert_eq!(tess_channel_send(ca, b"hi".as_ptr().cast(), 2), 0);
            let mut buf = [0u8; 8];
            let mut len = 0usize;
            assert_eq!(
                tess_channel_try_recv(cb, buf.as_mut_ptr().cast(), 1, &mut len),
                TESS_CHANNEL_EBUFFER
            );
            assert_eq!(len, 2);
            assert_eq!(
                tess_channel_recv(cb, buf.as_mut_ptr().cast(), 8, &mut len),
                0
            );
            assert_eq!(&buf[..len], b"hi");
            assert_eq!(
                tess_channel_try_recv(cb, buf.as_mut_ptr().cast(), 8, &mut len),
                TESS_CHANNEL_EAGAIN
            );
            // Zero copy.
            let mut slot = std::ptr::null_mut();
            assert_eq!(tess_channel_reserve(cb, 5, 0, &mut slot), 0);
            assert_eq!(
                tess_channel_try_send(cb, b"x".as_ptr().cast(), 1),
                TESS_CHANNEL_EBUSY
            );
            std::ptr::copy_nonoverlapping(b"hello".as_ptr(), slot.cast::<u8>(), 5);
            assert_eq!(tess_channel_commit(cb, 4), 0);
            let (mut m, mut l) = (std::ptr::null(), 0usize);
            assert_eq!(tess_channel_peek(ca, -1, &mut m, &mut l), 0);
            assert_eq!(std::slice::from_raw_parts(m.cast::<u8>(), l), b"hell");
            assert_eq!(tess_channel_release(ca), 0);
            assert_eq!(tess_channel_release(ca), TESS_CHANNEL_EBUSY);
            // Hang-up.
            tess_channel_close(cb);
            assert_eq!(
                tess_channel_recv_timeout(ca, buf.as_mut_ptr().cast(), 8, &mut len, 1_000_000),
                TESS_CHANNEL_EDISCONNECTED
            );
            tess_channel_close(ca);
            let name = std::ffi::CStr::from_ptr(tess_channel_strerror(TESS_CHANNEL_ECORRUPTED));
            assert!(name.to_str().unwrap().contains("corrupted"));
        }
    }
}
