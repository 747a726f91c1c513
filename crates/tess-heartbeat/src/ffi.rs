//! The C ABI (`include/tess_heartbeat.h`, generated from this file by cbindgen), linked from
//! libtess, the one C library of tess (crates/tess-ffi, docs/c-library.md).
//!
//! A C program registers a heartbeat with a target in nanoseconds per unit of work and beats
//! once per unit:
//!
//! ```c
//! tess_heartbeat_t *hb;
//! if (tess_heartbeat_register("encoder", 33333333, &hb) != 0) { ... }
//! for (;;) { encode_frame(); tess_heartbeat_beat(hb); }
//! tess_heartbeat_free(hb);
//! ```

use crate::writer::{Heartbeat, Target};
use crate::HeartbeatError;
use std::ffi::{c_char, c_int, CStr};
use std::time::Duration;

/// Success.
pub const TESS_HEARTBEAT_OK: c_int = 0;
/// A null pointer, a name that is not 1-64 of `a-z A-Z 0-9 - _ . @`, or a bad target.
pub const TESS_HEARTBEAT_EINVAL: c_int = -22;
/// The system refused a resource (memfd, mapping, thread); `errno` says which.
pub const TESS_HEARTBEAT_ESYS: c_int = -5;

/// A heartbeat (opaque).
#[derive(Debug)]
pub struct TessHeartbeat {
    inner: Heartbeat,
}

fn code(e: &HeartbeatError) -> c_int {
    match e {
        HeartbeatError::BadName(_) | HeartbeatError::BadTarget(_) => TESS_HEARTBEAT_EINVAL,
        _ => TESS_HEARTBEAT_ESYS,
    }
}

fn target(ns: u64) -> Option<Target> {
    (ns != 0).then(|| Target::PerUnit(Duration::from_nanos(ns)))
}

/// Creates a heartbeat called `name` with a target of `target_ns_per_unit` nanoseconds per unit
/// of work (0: no target yet) and registers it with the broker (`$TESS_BROKER_SOCKET`, default
/// `/run/tess/broker.sock`) on a helper thread that retries while no broker listens, so this
/// never waits. On success stores the handle in `*out` and returns `TESS_HEARTBEAT_OK`;
/// otherwise returns `TESS_HEARTBEAT_EINVAL` or `TESS_HEARTBEAT_ESYS`.
///
/// # Safety
/// `name` is a NUL-terminated string; `out` points to writable storage for one pointer.
#[no_mangle]
pub unsafe extern "C" fn tess_heartbeat_register(
    name: *const c_char,
    target_ns_per_unit: u64,
    out: *mut *mut TessHeartbeat,
) -> c_int {
    if name.is_null() || out.is_null() {
        return TESS_HEARTBEAT_EINVAL;
    }
    // SAFETY: the caller promises a NUL-terminated string.
    let Ok(name) = unsafe { CStr::from_ptr(name) }.to_str() else {
        return TESS_HEARTBEAT_EINVAL;
    };
    match Heartbeat::register(name, target(target_ns_per_unit)) {
        Ok(inner) => {
            // SAFETY: the caller promises `out` is writable.
            unsafe { *out = Box::into_raw(Box::new(TessHeartbeat { inner })) };
            TESS_HEARTBEAT_OK
        }
        Err(e) => code(&e),
    }
}

/// One unit of work is done. Safe to call from several threads at once. No system call.
///
/// # Safety
/// `hb` is a handle from `tess_heartbeat_register` not yet freed.
#[no_mangle]
pub unsafe extern "C" fn tess_heartbeat_beat(hb: *const TessHeartbeat) {
    // SAFETY: the caller promises a live handle.
    if let Some(hb) = unsafe { hb.as_ref() } {
        hb.inner.beat();
    }
}

/// One unit of work is done, and `value` is its demand: the CPU nanoseconds it used (a CPU
/// heartbeat), or its size in bytes (a heartbeat named `NAME.net` or `NAME@LABEL.net`, of
/// one of the cell's network flows). The PACORA broker sizes the cell from it (docs/broker.md,
/// "Beats that carry demands"); pass 0 for none. Safe to call from several threads at once. No
/// system call.
///
/// # Safety
/// `hb` is a handle from `tess_heartbeat_register` not yet freed.
#[no_mangle]
pub unsafe extern "C" fn tess_heartbeat_beat_value(hb: *const TessHeartbeat, value: u64) {
    // SAFETY: the caller promises a live handle.
    if let Some(hb) = unsafe { hb.as_ref() } {
        hb.inner.beat_with(value);
    }
}

/// Changes the target to `target_ns_per_unit` nanoseconds per unit (0: no target). Returns
/// `TESS_HEARTBEAT_OK`, or `TESS_HEARTBEAT_EINVAL` for a null handle.
///
/// # Safety
/// `hb` is a handle from `tess_heartbeat_register` not yet freed.
#[no_mangle]
pub unsafe extern "C" fn tess_heartbeat_set_target(
    hb: *const TessHeartbeat,
    target_ns_per_unit: u64,
) -> c_int {
    // SAFETY: the caller promises a live handle.
    let Some(hb) = (unsafe { hb.as_ref() }) else {
        return TESS_HEARTBEAT_EINVAL;
    };
    match hb.inner.set_target(target(target_ns_per_unit)) {
        Ok(()) => TESS_HEARTBEAT_OK,
        Err(e) => code(&e),
    }
}

/// Beats so far (0 for a null handle).
///
/// # Safety
/// `hb` is a handle from `tess_heartbeat_register` not yet freed.
#[no_mangle]
pub unsafe extern "C" fn tess_heartbeat_count(hb: *const TessHeartbeat) -> u64 {
    // SAFETY: the caller promises a live handle.
    unsafe { hb.as_ref() }.map_or(0, |hb| hb.inner.count())
}

/// Unregisters and frees a heartbeat (null is ignored).
///
/// # Safety
/// `hb` is a handle from `tess_heartbeat_register`, freed at most once, used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn tess_heartbeat_free(hb: *mut TessHeartbeat) {
    if !hb.is_null() {
        // SAFETY: the caller promises the handle came from Box::into_raw and is freed once.
        drop(unsafe { Box::from_raw(hb) });
    }
}
