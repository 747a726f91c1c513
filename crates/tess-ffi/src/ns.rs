//! The nameserver, C ABI (`include/tess_ns.h`, generated from this file by cbindgen).
//!
//! The calls speak tessd's protocol (`tess_proto`) and then receive the channel end with
//! `tess_channel_recv_open`, so a C program gets the same `tess_channel_t` as one that was
//! handed a channel directly.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};
use std::os::unix::net::UnixStream;
use tess_channel::ffi::{tess_channel_recv_open, TessChannel};
use tess_proto::frame;
use tess_proto::ns::{Access, ChannelShape, Push};
use tess_proto::{Body, ErrorKind, Request, Response, PROTOCOL_VERSION};

/// Success.
pub const TESS_NS_OK: c_int = 0;
/// A bad argument (NULL pointer, invalid name).
pub const TESS_NS_EINVAL: c_int = -1;
/// tessd cannot be reached.
pub const TESS_NS_EUNREACHABLE: c_int = -2;
/// No such service.
pub const TESS_NS_ENOTFOUND: c_int = -3;
/// The service does not admit this caller.
pub const TESS_NS_EPERM: c_int = -4;
/// The name is taken.
pub const TESS_NS_EEXIST: c_int = -5;
/// The connection to tessd or the service failed.
pub const TESS_NS_EIO: c_int = -6;
/// Receiving the channel end failed.
pub const TESS_NS_ECHANNEL: c_int = -7;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn fail(code: c_int, message: String) -> c_int {
    LAST_ERROR
        .with(|e| *e.borrow_mut() = CString::new(message.replace('\0', " ")).unwrap_or_default());
    code
}

fn code_of(kind: ErrorKind) -> c_int {
    match kind {
        ErrorKind::NotFound => TESS_NS_ENOTFOUND,
        ErrorKind::Permission => TESS_NS_EPERM,
        ErrorKind::Exists => TESS_NS_EEXIST,
        ErrorKind::Usage | ErrorKind::Admission => TESS_NS_EINVAL,
        ErrorKind::Kernel | ErrorKind::Internal => TESS_NS_EIO,
    }
}

/// Connects to tessd and greets it; on error returns the code (message recorded).
fn daemon() -> Result<UnixStream, c_int> {
    let path = tess_proto::client::socket_path();
    let mut s = UnixStream::connect(&path).map_err(|e| {
        fail(
            TESS_NS_EUNREACHABLE,
            format!("cannot reach tessd at {}: {e}", path.display()),
        )
    })?;
    call(
        &mut s,
        &Request::Hello {
            version: PROTOCOL_VERSION,
        },
    )?;
    Ok(s)
}

fn call(s: &mut UnixStream, req: &Request) -> Result<Body, c_int> {
    frame::write(s, req).map_err(|e| fail(TESS_NS_EIO, e.to_string()))?;
    match frame::read_response(s).map_err(|e| fail(TESS_NS_EIO, e.to_string()))? {
        Response::Ok { body } => Ok(body),
        Response::Error { kind, message } => Err(fail(code_of(kind), message)),
    }
}

/// # Safety
/// `p` is NULL or a NUL-terminated string.
unsafe fn str_arg(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: non-NULL and NUL-terminated (contract).
    unsafe { CStr::from_ptr(p) }.to_str().ok().map(String::from)
}

/// A registered service. Opaque.
#[derive(Debug)]
pub struct TessService {
    stream: UnixStream,
}

/// Who connected to a service, as tessd vouches for it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TessPeer {
    /// User id.
    pub uid: u32,
    /// Process id.
    pub pid: i32,
    /// The client's cell name, NUL-terminated (empty if it runs outside any cell).
    pub cell: [c_char; 65],
}

/// Asks tessd for a channel to service `name` and opens the client's end into `*out`.
/// Returns TESS_NS_OK, or TESS_NS_EINVAL, TESS_NS_EUNREACHABLE, TESS_NS_ENOTFOUND (no such
/// service), TESS_NS_EPERM (the service does not admit the caller), TESS_NS_EIO or
/// TESS_NS_ECHANNEL.
///
/// # Safety
/// `name` is a NUL-terminated string; `out` is valid for writes.
#[no_mangle]
pub unsafe extern "C" fn tess_ns_connect(name: *const c_char, out: *mut *mut TessChannel) -> c_int {
    // SAFETY: contract.
    let Some(name) = (unsafe { str_arg(name) }) else {
        return fail(TESS_NS_EINVAL, "name is NULL or not UTF-8".into());
    };
    if out.is_null() {
        return fail(TESS_NS_EINVAL, "out is NULL".into());
    }
    let mut s = match daemon() {
        Ok(s) => s,
        Err(c) => return c,
    };
    if let Err(c) = call(&mut s, &Request::Connect { name }) {
        return c;
    }
    // SAFETY: `s` is an open socket and `out` is valid for writes (contract).
    let rc = unsafe { tess_channel_recv_open(s.as_raw_fd(), out) };
    if rc != 0 {
        return fail(
            TESS_NS_ECHANNEL,
            format!("receiving the channel end failed ({rc})"),
        );
    }
    TESS_NS_OK
}

/// Registers the calling process as service `name`. Clients are admitted when `anyone` is
/// non-zero, or their uid is among the `n_uids` in `uids`, or they run in one of the `n_cells`
/// cells named in `cells` (the service's own user and root always are). Each client's channel
/// carries messages up to `max_message` bytes. The name is freed when the service closes the
/// handle or exits.
///
/// # Safety
/// `name` is NUL-terminated; `uids` points to `n_uids` values (or is NULL when 0); `cells`
/// points to `n_cells` NUL-terminated strings (or is NULL when 0); `out` is valid for writes.
#[no_mangle]
pub unsafe extern "C" fn tess_ns_register(
    name: *const c_char,
    anyone: c_int,
    uids: *const u32,
    n_uids: usize,
    cells: *const *const c_char,
    n_cells: usize,
    max_message: usize,
    out: *mut *mut TessService,
) -> c_int {
    // SAFETY: contract.
    let Some(name) = (unsafe { str_arg(name) }) else {
        return fail(TESS_NS_EINVAL, "name is NULL or not UTF-8".into());
    };
    if out.is_null() || (n_uids > 0 && uids.is_null()) || (n_cells > 0 && cells.is_null()) {
        return fail(TESS_NS_EINVAL, "NULL argument".into());
    }
    let mut access = Access {
        anyone: anyone != 0,
        ..Default::default()
    };
    if n_uids > 0 {
        // SAFETY: `uids` points to `n_uids` values (contract).
        access.uids = unsafe { std::slice::from_raw_parts(uids, n_uids) }.to_vec();
    }
    for i in 0..n_cells {
        // SAFETY: `cells` points to `n_cells` string pointers (contract).
        let p = unsafe { *cells.add(i) };
        // SAFETY: each is NUL-terminated (contract).
        match unsafe { str_arg(p) } {
            Some(c) => access.cells.push(c),
            None => return fail(TESS_NS_EINVAL, format!("cells[{i}] is NULL or not UTF-8")),
        }
    }
    let opts = tess_channel::ChannelOptions::for_max_message(max_message.max(1));
    let mut s = match daemon() {
        Ok(s) => s,
        Err(c) => return c,
    };
    if let Err(c) = call(
        &mut s,
        &Request::Register {
            name,
            access,
            channel: ChannelShape::from(&opts),
        },
    ) {
        return c;
    }
    // SAFETY: `out` is valid for writes (contract).
    unsafe { *out = Box::into_raw(Box::new(TessService { stream: s })) };
    TESS_NS_OK
}

/// Waits for the next client of `svc`; opens the service's end of its channel into `*out` and,
/// if `peer` is not NULL, describes the client there.
///
/// # Safety
/// `svc` comes from `tess_ns_register`; `out` is valid for writes; `peer` is NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn tess_ns_accept(
    svc: *mut TessService,
    out: *mut *mut TessChannel,
    peer: *mut TessPeer,
) -> c_int {
    // SAFETY: `svc` is NULL or a live handle (contract).
    let Some(svc) = (unsafe { svc.as_mut() }) else {
        return fail(TESS_NS_EINVAL, "svc is NULL".into());
    };
    if out.is_null() {
        return fail(TESS_NS_EINVAL, "out is NULL".into());
    }
    let push: Push = match frame::read(&mut svc.stream) {
        Ok(p) => p,
        Err(e) => return fail(TESS_NS_EIO, format!("waiting for a client: {e}")),
    };
    let Push::Incoming { client } = push;
    // SAFETY: the stream is open and `out` is valid for writes (contract).
    let rc = unsafe { tess_channel_recv_open(svc.stream.as_raw_fd(), out) };
    if rc != 0 {
        return fail(
            TESS_NS_ECHANNEL,
            format!("receiving the channel end failed ({rc})"),
        );
    }
    // SAFETY: `peer` is NULL or valid for writes (contract).
    if let Some(p) = unsafe { peer.as_mut() } {
        p.uid = client.uid;
        p.pid = client.pid;
        p.cell = [0; 65];
        for (i, b) in client.cell.unwrap_or_default().bytes().take(64).enumerate() {
            p.cell[i] = b as c_char;
        }
    }
    TESS_NS_OK
}

/// The descriptor to poll for readability: a client is waiting to be accepted.
///
/// # Safety
/// `svc` comes from `tess_ns_register`.
#[no_mangle]
pub unsafe extern "C" fn tess_ns_service_fd(svc: *const TessService) -> c_int {
    // SAFETY: `svc` is NULL or a live handle (contract).
    unsafe { svc.as_ref() }.map_or(-1, |s| s.stream.as_raw_fd())
}

/// Unregisters and frees the service handle (the name becomes free).
///
/// # Safety
/// `svc` comes from `tess_ns_register` and is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn tess_ns_close(svc: *mut TessService) {
    if !svc.is_null() {
        // SAFETY: created by Box::into_raw in tess_ns_register; ownership returns here once.
        let s = unsafe { Box::from_raw(svc) };
        // Closing the connection is what tells tessd to free the name.
        // SAFETY: the descriptor is owned by the handle and closed exactly once here.
        unsafe { drop(std::os::fd::OwnedFd::from_raw_fd(s.stream.into_raw_fd())) };
    }
}

/// The name of a TESS_NS_* code.
#[no_mangle]
pub extern "C" fn tess_ns_strerror(code: c_int) -> *const c_char {
    let s: &'static CStr = match code {
        TESS_NS_OK => c"ok",
        TESS_NS_EINVAL => c"invalid argument",
        TESS_NS_EUNREACHABLE => c"tessd unreachable",
        TESS_NS_ENOTFOUND => c"no such service",
        TESS_NS_EPERM => c"not admitted by the service",
        TESS_NS_EEXIST => c"name taken",
        TESS_NS_EIO => c"connection failed",
        TESS_NS_ECHANNEL => c"channel hand-off failed",
        _ => c"unknown error",
    };
    s.as_ptr()
}

/// tessd's message for the last failure on the calling thread (empty if none). Valid until the
/// next tess_ns call on this thread.
#[no_mangle]
pub extern "C" fn tess_ns_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}
