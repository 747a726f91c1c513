//! Copies between private memory and shared memory the peer may be writing at the same time.
//!
//! Rust's memory model has no plain copy that may race with another writer, so the copy must
//! be opaque to the compiler: inline assembly, which the compiler treats as an unknown access
//! to the two ranges (it cannot assume the source stable, cache values across it, or move it
//! across our atomic operations). A peer that writes during a copy changes the bytes we get,
//! nothing else; the ring never interprets payload bytes.
//!
//! On x86-64 the copy is sized the way C library `memcpy`s are, because the channel's messages
//! are mostly small and `rep movsb` has a fixed start-up cost: about 10 ns even for 4 bytes on
//! the test machine (an AMD EPYC guest with FSRM), where two overlapping 8-byte moves take
//! one. Up to 16 bytes: two overlapping moves of 8, 4, 2 or 1 bytes; up to 64: two or four
//! overlapping 16-byte SSE2 moves; up to [`STRING_COPY_FROM`]: a loop of 64-byte SSE2 blocks
//! and one overlapping last block; beyond: `rep movsb`, which the CPU runs as a wide copy
//! (faster than 16-byte moves from about 2 KiB on the test machine). SSE2 is part of x86-64,
//! so no CPU check is needed. Overlapping moves write some bytes twice, inside the caller's
//! range; if the peer changes the source in between, the last move wins, like any other torn
//! read of a payload.
//!
//! Other architectures copy with relaxed atomic byte operations (the "byte-wise atomic memcpy"
//! of C++ proposal P1478).

/// Length from which the copy is a `rep movsb` (x86-64).
#[cfg(target_arch = "x86_64")]
const STRING_COPY_FROM: usize = 2048;

/// Copies `len` bytes from `src` to `dst`, where either side may be shared memory that another
/// process writes concurrently.
///
/// # Safety
/// Both ranges are valid for `len` bytes (reads at `src`, writes at `dst`) and do not
/// overlap; no Rust reference to plain data exists over either shared range.
#[inline(always)]
pub(crate) unsafe fn opaque_copy(src: *const u8, dst: *mut u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller's contract, passed on; each helper touches only `[src, src + len)`
    // and `[dst, dst + len)` for the lengths it is called with.
    unsafe {
        match len {
            0 => {}
            1..=16 => x86::upto_16(src, dst, len),
            17..=32 => x86::from_17_to_32(src, dst, len),
            33..=64 => x86::from_33_to_64(src, dst, len),
            65..STRING_COPY_FROM => x86::blocks_of_64(src, dst, len),
            _ => x86::string(src, dst, len),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        use std::sync::atomic::{AtomicU8, Ordering};
        for i in 0..len {
            // SAFETY: both bytes lie in the caller's ranges; byte atomics have no alignment
            // requirement and may be mutated concurrently.
            unsafe {
                let v = AtomicU8::from_ptr(src.add(i) as *mut u8).load(Ordering::Relaxed);
                AtomicU8::from_ptr(dst.add(i)).store(v, Ordering::Relaxed);
            }
        }
    }
}

/// The x86-64 copies. Each has the contract of [`opaque_copy`] plus the length range its name
/// gives; none has an alignment requirement (`mov` and `movdqu` accept any address). No block
/// is `nomem`, so each is also a compiler barrier for memory, like the atomic operations around
/// it.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::asm;

    /// `1 <= len <= 16`: the first and the last `w` bytes, `w` the largest power of two up to
    /// `len` (at most 8); the two moves overlap unless `len == 2 w`.
    #[inline(always)]
    pub(super) unsafe fn upto_16(src: *const u8, dst: *mut u8, len: usize) {
        debug_assert!((1..=16).contains(&len));
        // SAFETY: in each branch `len >= w` for the width `w` it moves, so `[0, w)` and
        // `[len - w, len)` lie in both ranges.
        unsafe {
            if len >= 8 {
                asm!(
                    "mov {a}, qword ptr [{s}]",
                    "mov {b}, qword ptr [{s} + {n} - 8]",
                    "mov qword ptr [{d}], {a}",
                    "mov qword ptr [{d} + {n} - 8], {b}",
                    s = in(reg) src, d = in(reg) dst, n = in(reg) len,
                    a = out(reg) _, b = out(reg) _,
                    options(nostack, preserves_flags)
                );
            } else if len >= 4 {
                asm!(
                    "mov {a:e}, dword ptr [{s}]",
                    "mov {b:e}, dword ptr [{s} + {n} - 4]",
                    "mov dword ptr [{d}], {a:e}",
                    "mov dword ptr [{d} + {n} - 4], {b:e}",
                    s = in(reg) src, d = in(reg) dst, n = in(reg) len,
                    a = out(reg) _, b = out(reg) _,
                    options(nostack, preserves_flags)
                );
            } else if len >= 2 {
                asm!(
                    "movzx {a:e}, word ptr [{s}]",
                    "movzx {b:e}, word ptr [{s} + {n} - 2]",
                    "mov word ptr [{d}], {a:x}",
                    "mov word ptr [{d} + {n} - 2], {b:x}",
                    s = in(reg) src, d = in(reg) dst, n = in(reg) len,
                    a = out(reg) _, b = out(reg) _,
                    options(nostack, preserves_flags)
                );
            } else {
                asm!(
                    "movzx {a:e}, byte ptr [{s}]",
                    "mov byte ptr [{d}], {a:l}",
                    s = in(reg) src, d = in(reg) dst,
                    a = out(reg) _,
                    options(nostack, preserves_flags)
                );
            }
        }
    }

    /// `17 <= len <= 32`: the first and the last 16 bytes.
    #[inline(always)]
    pub(super) unsafe fn from_17_to_32(src: *const u8, dst: *mut u8, len: usize) {
        debug_assert!((17..=32).contains(&len));
        // SAFETY: `len >= 16`, so both 16-byte windows lie in both ranges.
        unsafe {
            asm!(
                "movdqu {x}, xmmword ptr [{s}]",
                "movdqu {y}, xmmword ptr [{s} + {n} - 16]",
                "movdqu xmmword ptr [{d}], {x}",
                "movdqu xmmword ptr [{d} + {n} - 16], {y}",
                s = in(reg) src, d = in(reg) dst, n = in(reg) len,
                x = out(xmm_reg) _, y = out(xmm_reg) _,
                options(nostack, preserves_flags)
            );
        }
    }

    /// `33 <= len <= 64`: the first and the last 32 bytes.
    #[inline(always)]
    pub(super) unsafe fn from_33_to_64(src: *const u8, dst: *mut u8, len: usize) {
        debug_assert!((33..=64).contains(&len));
        // SAFETY: `len >= 32`, so both 32-byte windows lie in both ranges.
        unsafe {
            asm!(
                "movdqu {w}, xmmword ptr [{s}]",
                "movdqu {x}, xmmword ptr [{s} + 16]",
                "movdqu {y}, xmmword ptr [{s} + {n} - 32]",
                "movdqu {z}, xmmword ptr [{s} + {n} - 16]",
                "movdqu xmmword ptr [{d}], {w}",
                "movdqu xmmword ptr [{d} + 16], {x}",
                "movdqu xmmword ptr [{d} + {n} - 32], {y}",
                "movdqu xmmword ptr [{d} + {n} - 16], {z}",
                s = in(reg) src, d = in(reg) dst, n = in(reg) len,
                w = out(xmm_reg) _, x = out(xmm_reg) _, y = out(xmm_reg) _, z = out(xmm_reg) _,
                options(nostack, preserves_flags)
            );
        }
    }

    /// `len > 64`: whole 64-byte blocks from the start while more than 64 bytes remain, then
    /// the last 64 bytes of the range (overlapping the block before unless `len` is a multiple
    /// of 64).
    #[inline(always)]
    pub(super) unsafe fn blocks_of_64(src: *const u8, dst: *mut u8, len: usize) {
        // The loop copies a block before it tests the length.
        debug_assert!(len > 64);
        // SAFETY: the loop runs while `n > 64` bytes remain at `s`/`d`, so each block lies in
        // the ranges; it leaves `0 < n <= 64` with at least 64 bytes copied before `s`, so the
        // last window `[s + n - 64, s + n)` starts inside the ranges and ends at their ends.
        unsafe {
            asm!(
                "2:",
                "movdqu {w}, xmmword ptr [{s}]",
                "movdqu {x}, xmmword ptr [{s} + 16]",
                "movdqu {y}, xmmword ptr [{s} + 32]",
                "movdqu {z}, xmmword ptr [{s} + 48]",
                "movdqu xmmword ptr [{d}], {w}",
                "movdqu xmmword ptr [{d} + 16], {x}",
                "movdqu xmmword ptr [{d} + 32], {y}",
                "movdqu xmmword ptr [{d} + 48], {z}",
                "add {s}, 64",
                "add {d}, 64",
                "sub {n}, 64",
                "cmp {n}, 64",
                "ja 2b",
                "movdqu {w}, xmmword ptr [{s} + {n} - 64]",
                "movdqu {x}, xmmword ptr [{s} + {n} - 48]",
                "movdqu {y}, xmmword ptr [{s} + {n} - 32]",
                "movdqu {z}, xmmword ptr [{s} + {n} - 16]",
                "movdqu xmmword ptr [{d} + {n} - 64], {w}",
                "movdqu xmmword ptr [{d} + {n} - 48], {x}",
                "movdqu xmmword ptr [{d} + {n} - 32], {y}",
                "movdqu xmmword ptr [{d} + {n} - 16], {z}",
                s = inout(reg) src => _, d = inout(reg) dst => _, n = inout(reg) len => _,
                w = out(xmm_reg) _, x = out(xmm_reg) _, y = out(xmm_reg) _, z = out(xmm_reg) _,
                options(nostack)
            );
        }
    }

    /// Any length: `rep movsb`.
    #[inline(always)]
    pub(super) unsafe fn string(src: *const u8, dst: *mut u8, len: usize) {
        // SAFETY: `rep movsb` copies rcx bytes from [rsi] to [rdi], forward (DF is clear on
        // entry to an asm block, as Rust requires), touching exactly the two ranges.
        unsafe {
            asm!(
                "rep movsb",
                inout("rcx") len => _,
                inout("rsi") src => _,
                inout("rdi") dst => _,
                options(nostack, preserves_flags)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::opaque_copy;

    /// Every length up to past the string threshold, at every alignment of source and
    /// destination within a word: the bytes copied are the source's, and not one byte outside
    /// the destination range changes.
    #[test]
    fn copies_exactly_the_range() {
        let max = 2200;
        let src: Vec<u8> = (0..max + 16).map(|i| (i * 7 + 3) as u8).collect();
        for len in 0..=max {
            for (s_off, d_off) in [(0, 0), (1, 3), (5, 0), (0, 7), (3, 3)] {
                let mut dst = vec![0xa5u8; max + 32];
                // SAFETY: both ranges are in bounds of their (private, distinct) vectors.
                unsafe {
                    opaque_copy(
                        src.as_ptr().add(s_off),
                        dst.as_mut_ptr().add(d_off + 8),
                        len,
                    )
                };
                assert!(dst[..d_off + 8].iter().all(|&b| b == 0xa5), "{len}: before");
                assert_eq!(
                    &dst[d_off + 8..d_off + 8 + len],
                    &src[s_off..s_off + len],
                    "{len} bytes from +{s_off} to +{d_off}"
                );
                assert!(
                    dst[d_off + 8 + len..].iter().all(|&b| b == 0xa5),
                    "{len}: after"
                );
            }
        }
    }

    /// Two readable and writable pages between inaccessible ones.
    struct Guarded {
        base: *mut u8,
        page: usize,
    }

    impl Guarded {
        fn new() -> Guarded {
            // SAFETY: sysconf has no preconditions.
            let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
            // SAFETY: a fresh anonymous mapping of four pages; nothing else refers to it.
            let base = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    4 * page,
                    libc::PROT_NONE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(base, libc::MAP_FAILED, "mmap");
            let base = base.cast::<u8>();
            // SAFETY: the middle two pages lie inside the mapping just made.
            let rc = unsafe {
                libc::mprotect(
                    base.add(page).cast(),
                    2 * page,
                    libc::PROT_READ | libc::PROT_WRITE,
                )
            };
            assert_eq!(rc, 0, "mprotect");
            Guarded { base, page }
        }

        /// The first accessible byte.
        fn start(&self) -> *mut u8 {
            // SAFETY: inside the four-page mapping.
            unsafe { self.base.add(self.page) }
        }

        /// One past the last accessible byte.
        fn end(&self) -> *mut u8 {
            // SAFETY: inside the four-page mapping.
            unsafe { self.base.add(3 * self.page) }
        }
    }

    impl Drop for Guarded {
        fn drop(&mut self) {
            // SAFETY: the mapping made in `new`, unmapped once.
            unsafe { libc::munmap(self.base.cast(), 4 * self.page) };
        }
    }

    /// No copy reads or writes a byte outside its two ranges: each range is placed flush
    /// against an inaccessible page, after it and before it, so a stray access faults.
    #[test]
    fn touches_nothing_outside_the_ranges() {
        let (from, to) = (Guarded::new(), Guarded::new());
        for len in 1..=2200usize {
            // SAFETY: each range lies in the accessible pages of its mapping (`len` is at most
            // two pages), flush against the guard page on one side.
            unsafe {
                std::ptr::write_bytes(from.start(), (len % 251) as u8, 2 * from.page);
                opaque_copy(from.end().sub(len), to.end().sub(len), len);
                assert_eq!(*to.end().sub(len), (len % 251) as u8, "{len}, at the end");
                opaque_copy(from.start(), to.start(), len);
                assert_eq!(
                    *to.start().add(len - 1),
                    (len % 251) as u8,
                    "{len}, at the start"
                );
            }
        }
    }
}
