//! The memfd behind a channel, its mapping, and the liveness socket pair.
//!
//! The memfd is created with `MFD_CLOEXEC | MFD_ALLOW_SEALING`, sized, and sealed with
//! `F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`: no name in any file system, gone when the last
//! descriptor and mapping are, and impossible for a peer to truncate (which would turn our loads
//! into `SIGBUS`). An opener checks the seals and the size before mapping.
//!
//! Each mapping sits between two `PROT_NONE` guard pages, so an out-of-bounds access, should one
//! ever slip past the checks, faults at once instead of reading a neighbour's memory.
//!
//! Peer death is detected through a `SOCK_SEQPACKET` socket pair, one end per side: when every
//! descriptor of the peer's end is closed (its process exited or crashed, however it died) our
//! end polls `POLLHUP`. Unlike a pid it cannot be reused, and unlike a signal it needs no
//! handler. The check is a non-blocking `poll`, made between bounded futex waits.

use crate::error::OpenError;
use crate::layout::{ChannelHeader, PAGE};
use crate::region::Region;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

/// Creates a sealed memfd of `len` bytes.
pub(crate) fn create_memfd(len: usize) -> Result<OwnedFd, OpenError> {
    // SAFETY: the name is a valid NUL-terminated string; flags are plain integers.
    let fd = unsafe {
        libc::memfd_create(
            c"tess-channel".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if fd < 0 {
        return Err(OpenError::last_os("memfd_create"));
    }
    // SAFETY: `fd` was just returned by memfd_create and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ftruncate on a descriptor we own.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
        return Err(OpenError::last_os(format!(
            "ftruncate of memfd to {len} bytes"
        )));
    }
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: fcntl(F_ADD_SEALS) on a descriptor we own, with an integer argument.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(OpenError::last_os("sealing the memfd"));
    }
    Ok(fd)
}

/// Checks that `fd` is a memfd sealed against resizing and returns its size.
pub(crate) fn check_memfd(fd: BorrowedFd<'_>) -> Result<u64, OpenError> {
    // SAFETY: fcntl(F_GET_SEALS) takes no pointer argument.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 {
        return Err(OpenError::last_os(
            "reading the seals of the channel memfd (is it a memfd?)",
        ));
    }
    let need = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
    if seals & need != need {
        return Err(OpenError::NotSealed { seals });
    }
    // SAFETY: `st` is a plain-old-data out parameter that fstat fills in.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid, writable stat buffer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(OpenError::last_os("fstat of the channel memfd"));
    }
    Ok(st.st_size as u64)
}

/// A shared, read-write mapping of a whole channel memfd, between two guard pages.
#[derive(Debug)]
pub(crate) struct Mapping {
    /// Start of the reservation (a guard page).
    reserve: NonNull<u8>,
    /// Length of the reservation: `len + 2 * PAGE`.
    reserve_len: usize,
    /// Start of the channel (page 0 of the memfd).
    base: NonNull<u8>,
    /// Length of the channel.
    len: usize,
}

// SAFETY: the mapping is plain shared memory; all concurrent access to it goes through atomics
// or through the ring protocol, and unmapping happens only in Drop (exclusive access).
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` only hands out raw pointers.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd` shared and read-write.
    pub(crate) fn map(fd: BorrowedFd<'_>, len: usize) -> Result<Mapping, OpenError> {
        let reserve_len = len + 2 * PAGE;
        // SAFETY: an anonymous PROT_NONE reservation at an address of the kernel's choosing.
        let reserve = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                reserve_len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if reserve == libc::MAP_FAILED {
            return Err(OpenError::last_os(format!(
                "reserving {reserve_len} bytes of address space"
            )));
        }
        // SAFETY: `reserve + PAGE .. reserve + PAGE + len` lies inside the reservation we own,
        // so MAP_FIXED replaces only our own PROT_NONE pages.
        let base = unsafe {
            libc::mmap(
                (reserve as *mut u8).add(PAGE).cast(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED | libc::MAP_POPULATE,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            let err = std::io::Error::last_os_error();
            // SAFETY: unmapping the reservation we just made.
            unsafe { libc::munmap(reserve, reserve_len) };
            return Err(OpenError::io(
                format!("mmap of the {len}-byte channel memfd"),
                err,
            ));
        }
        Ok(Mapping {
            reserve: NonNull::new(reserve.cast()).expect("mmap returned null"),
            reserve_len,
            base: NonNull::new(base.cast()).expect("mmap returned null"),
            len,
        })
    }

    /// The mapping as a [`Region`], the only way the rings reach it.
    pub(crate) fn region(&self) -> Region {
        // SAFETY: `base .. base + len` is our shared read-write mapping, page-aligned; it stays
        // mapped until this Mapping drops, and every Region made here is used only by objects
        // that hold the `Arc<Shared>` owning this Mapping (endpoint.rs). No reference to plain
        // data is formed over it anywhere.
        unsafe { Region::new(self.base, self.len) }
    }

    /// A private copy of the header as it is now (copied out, then decoded).
    pub(crate) fn read_header(&self) -> ChannelHeader {
        let mut bytes = [0u8; ChannelHeader::SIZE];
        self.region().copy_out(0, &mut bytes);
        ChannelHeader::decode(&bytes).expect("a full header's bytes")
    }

    /// Writes the header (creator only, before anyone else maps the file).
    pub(crate) fn write_header(&self, h: &ChannelHeader) {
        self.region().copy_in(0, &h.encode());
    }

    /// Start of the mapping (for tests that play a hostile peer).
    #[cfg(test)]
    pub(crate) fn base(&self) -> NonNull<u8> {
        self.base
    }

    /// Length of the mapping.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: we own the reservation (and the shared mapping inside it); nothing made from
        // this mapping outlives it (owners hold it in an Arc alongside every pointer into it).
        unsafe { libc::munmap(self.reserve.as_ptr().cast(), self.reserve_len) };
    }
}

/// Creates the liveness socket pair: one end per side.
pub(crate) fn liveness_pair() -> Result<(OwnedFd, OwnedFd), OpenError> {
    let mut fds = [-1; 2];
    // SAFETY: `fds` is a valid two-element array for socketpair to fill.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(OpenError::last_os("socketpair for channel liveness"));
    }
    // SAFETY: both descriptors were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Whether the process holding the other end of the liveness socket still holds it.
pub(crate) fn peer_alive(fd: BorrowedFd<'_>) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: `p` is one valid pollfd; a zero timeout never blocks.
    let rc = unsafe { libc::poll(&mut p, 1, 0) };
    rc <= 0 || p.revents & (libc::POLLHUP | libc::POLLRDHUP | libc::POLLERR | libc::POLLNVAL) == 0
}
