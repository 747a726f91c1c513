//! The memfd behind a heartbeat and its mappings.
//!
//! The cell creates the memfd (`MFD_ALLOW_SEALING`), sizes it to [`REGION_LEN`], writes the
//! header and seals it with `F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`, so that it can never
//! truncate the file under the broker's mapping (which would turn the broker's loads into
//! `SIGBUS`). The broker checks the seals and the size before it maps the file, read-only.

use crate::error::HeartbeatError;
use crate::layout::{Header, REGION_LEN};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

/// Creates the sealed memfd of a heartbeat called `name` with its header written.
pub(crate) fn create(name: &str) -> Result<OwnedFd, HeartbeatError> {
    // SAFETY: the name is a valid NUL-terminated string; flags are plain integers.
    let fd = unsafe {
        libc::memfd_create(
            c"tess-heartbeat".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if fd < 0 {
        return Err(HeartbeatError::last_os("memfd_create"));
    }
    // SAFETY: `fd` was just returned by memfd_create and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ftruncate on a descriptor we own.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), REGION_LEN as libc::off_t) } != 0 {
        return Err(HeartbeatError::last_os("sizing the heartbeat memfd"));
    }
    let header = Header::new(name);
    // SAFETY: pwrite from a plain-old-data struct on our stack of exactly its size.
    let n = unsafe {
        libc::pwrite(
            fd.as_raw_fd(),
            (&header as *const Header).cast(),
            std::mem::size_of::<Header>(),
            0,
        )
    };
    if n != std::mem::size_of::<Header>() as isize {
        return Err(HeartbeatError::last_os("writing the heartbeat header"));
    }
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: fcntl(F_ADD_SEALS) on a descriptor we own, with an integer argument.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(HeartbeatError::last_os("sealing the heartbeat memfd"));
    }
    Ok(fd)
}

/// Checks that `fd` is a memfd sealed against resizing, of exactly [`REGION_LEN`] bytes.
pub(crate) fn check(fd: BorrowedFd<'_>) -> Result<(), HeartbeatError> {
    // SAFETY: fcntl(F_GET_SEALS) takes no pointer argument.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 {
        return Err(HeartbeatError::BadRegion(
            "the descriptor is not a sealable memfd".into(),
        ));
    }
    let need = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
    if seals & need != need {
        return Err(HeartbeatError::BadRegion(format!(
            "the memfd is not sealed against resizing (seals {seals:#x})"
        )));
    }
    let st = nix::sys::stat::fstat(fd.as_raw_fd()).map_err(|e| HeartbeatError::Os {
        what: "fstat of the heartbeat memfd".into(),
        source: e.into(),
    })?;
    if st.st_size as usize != REGION_LEN {
        return Err(HeartbeatError::BadRegion(format!(
            "the memfd has {} bytes, a heartbeat has {REGION_LEN}",
            st.st_size
        )));
    }
    Ok(())
}

/// A shared mapping of a whole heartbeat region, unmapped on drop.
#[derive(Debug)]
pub(crate) struct Mapping {
    base: NonNull<u8>,
}

// SAFETY: the mapping is plain shared memory; every access to it goes through atomics or a
// volatile copy, so it may be used from any thread.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `fd` (already checked to be [`REGION_LEN`] bytes and sealed), writable or not.
    pub(crate) fn map(fd: BorrowedFd<'_>, writable: bool) -> Result<Mapping, HeartbeatError> {
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a fresh shared mapping of a file whose size is sealed at REGION_LEN; no
        // existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                REGION_LEN,
                prot,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(HeartbeatError::last_os("mapping the heartbeat memfd"));
        }
        Ok(Mapping {
            base: NonNull::new(p.cast()).expect("mmap never returns null on success"),
        })
    }

    /// The address `offset` bytes into the region (offsets come from `layout`, in bounds).
    #[inline(always)]
    pub(crate) fn at(&self, offset: usize) -> *mut u8 {
        debug_assert!(offset < REGION_LEN);
        // SAFETY: offset is within the REGION_LEN-byte mapping.
        unsafe { self.base.as_ptr().add(offset) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `base` is the start of a REGION_LEN-byte mapping we own; nothing refers to
        // it after drop (the atomics borrowed from it never outlive the owner).
        unsafe { libc::munmap(self.base.as_ptr().cast(), REGION_LEN) };
    }
}
