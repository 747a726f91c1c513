//! The shared memory a channel lives in, and the only code that touches it.
//!
//! # Safety model
//!
//! The peer maps the same pages and may write any byte of them at any time, with any width,
//! atomically or not, or stop half-way through. So nothing here ever forms a Rust reference to
//! plain data (`&[u8]`, `&mut [u8]`, `&T`) over the region: a reference promises the compiler
//! that nobody else writes the bytes, a promise we cannot keep. Instead:
//!
//! - **Words** (indices, record headers, flags, futex words) are read and written with single
//!   atomic operations on naturally aligned 4- and 8-byte words, made through transient
//!   `&AtomicU64` / `&AtomicU32` built with `from_ptr` (atomics are `UnsafeCell`s: shared
//!   mutation through them is what they are for). A value read once is a private copy, validated
//!   before use; we never read the same word twice expecting the same value.
//! - **Payload bytes** are copied between the region and private memory, never used in place.
//!   On x86-64 the copy is inline assembly sized like a C library `memcpy` (see
//!   `opaque_copy`): opaque to the compiler, so the peer's concurrent writes cannot be a data
//!   race in Rust's model, and the compiler cannot assume the source stays unchanged. Other
//!   architectures copy with relaxed atomic byte operations (the "byte-wise atomic memcpy" of
//!   C++ proposal P1478). A peer that writes during a copy changes the values we get, nothing
//!   else.
//! - **Bounds**: every access checks its offset and length against the region (offsets are
//!   derived from private, validated state and masked into the ring besides), so a bug here
//!   panics instead of touching a neighbour's memory. The one exception is the ring's word
//!   accesses on the hot path (`u64_in_bounds`, `u32_in_bounds`): their offsets are masked into
//!   a ring, or are constants of the control block, whose bounds `RingRef::new` checked once.
//!   The region is a sealed memfd mapping between guard pages (see `shm`), so the peer cannot
//!   shrink it under us.
//!
//! Under `--cfg loom` the region is a model: one loom atomic per 8-byte word and per 4-byte word,
//! payload copies as relaxed word operations, and the futex as a mutex and condition variable.
//! The ring code above this module is the same in both builds: loom checks the code that ships.

/// Whether this CPU has `CLDEMOTE` (CPUID leaf 7, ECX bit 25); asked once.
pub(crate) fn has_cldemote() -> bool {
    use std::sync::atomic::{AtomicU8, Ordering};
    // 0: not asked yet, 1: no, 2: yes.
    static KNOWN: AtomicU8 = AtomicU8::new(0);
    match KNOWN.load(Ordering::Relaxed) {
        0 => {
            // Leaf 7 only where the CPU has it (above its highest leaf, Intel's CPUID answers
            // with that leaf's data, not zeros).
            #[cfg(target_arch = "x86_64")]
            // SAFETY: CPUID exists on every x86-64 CPU (older Rust declares the intrinsics
            // `unsafe` because of 32-bit x86); leaf 7 is read only where the CPU has it.
            #[allow(unused_unsafe)]
            let yes = unsafe {
                use std::arch::x86_64::{__cpuid_count, __get_cpuid_max};
                __get_cpuid_max(0).0 >= 7 && __cpuid_count(7, 0).ecx & (1 << 25) != 0
            };
            #[cfg(not(target_arch = "x86_64"))]
            let yes = false;
            KNOWN.store(if yes { 2 } else { 1 }, Ordering::Relaxed);
            yes
        }
        k => k == 2,
    }
}

#[cfg(not(loom))]
pub(crate) use real::Region;

#[cfg(loom)]
pub(crate) use model::Region;

#[cfg(not(loom))]
mod real {
    use crate::opaque_copy::opaque_copy;
    #[cfg(feature = "bench")]
    use crate::sync::Ordering;
    use std::ptr::NonNull;
    use std::sync::atomic::{AtomicU32, AtomicU64};

    /// A window of shared memory: a base address and a length. `Copy`; whoever makes one keeps
    /// the mapping alive for as long as any copy is used (see [`Region::new`]).
    #[derive(Debug, Clone, Copy)]
    pub(crate) struct Region {
        base: NonNull<u8>,
        len: usize,
    }

    // SAFETY: a Region is an address range; every access through it is an atomic operation or
    // an opaque copy (module docs), which any thread may perform.
    unsafe impl Send for Region {}
    // SAFETY: as above; `&Region` offers nothing beyond what a copy offers.
    unsafe impl Sync for Region {}

    impl Region {
        /// # Safety
        /// `base .. base + len` is readable and writable memory, 8-byte aligned, that stays
        /// mapped for as long as this Region or any copy of it is used. Other parties (threads,
        /// processes) may write it at any time; no Rust reference to plain data may exist over it.
        pub(crate) unsafe fn new(base: NonNull<u8>, len: usize) -> Region {
            debug_assert_eq!(base.as_ptr() as usize % 8, 0);
            Region { base, len }
        }

        /// Length in bytes.
        pub(crate) fn len(&self) -> usize {
            self.len
        }

        /// The address of `size` bytes at `off`, after checking they lie inside the region and
        /// `off` is a multiple of `align`.
        #[inline(always)]
        fn at(&self, off: usize, size: usize, align: usize) -> *mut u8 {
            if !(off % align == 0 && off <= self.len && size <= self.len - off) {
                outside(off, size, align, self.len);
            }
            // SAFETY: `off <= len`, so the result is inside the mapping or one past its end.
            unsafe { self.base.as_ptr().add(off) }
        }

        /// The address of byte `off` for a cache hint (`CLDEMOTE`, `PREFETCHW`), which cannot
        /// fault and has no architectural effect, so it needs no bounds check; `off` is masked
        /// into a ring by the caller anyway.
        #[inline(always)]
        fn hint_at(&self, off: usize) -> *const u8 {
            debug_assert!(off < self.len, "cache hint at {off} outside {}", self.len);
            self.base.as_ptr().wrapping_add(off)
        }

        #[cfg(feature = "bench")]
        #[inline(always)]
        fn u64_at(&self, off: usize) -> &AtomicU64 {
            let p = self.at(off, 8, 8).cast::<u64>();
            // SAFETY: `p` is 8-aligned and inside the mapping (checked), which outlives `self`
            // (contract of `new`). An atomic may be mutated by others while referenced.
            unsafe { AtomicU64::from_ptr(p) }
        }

        #[cfg(feature = "bench")]
        #[inline(always)]
        fn u32_at(&self, off: usize) -> &AtomicU32 {
            let p = self.at(off, 4, 4).cast::<u32>();
            // SAFETY: as in `u64_at`, for a 4-aligned word.
            unsafe { AtomicU32::from_ptr(p) }
        }

        /// The 8-byte word at `off`, without the bounds check: for the ring's hot path, whose
        /// offsets are masked into bounds checked once when the ring was made.
        ///
        /// # Safety
        /// `off` is 8-aligned and `off + 8 <= self.len()`.
        #[inline(always)]
        pub(crate) unsafe fn u64_in_bounds(&self, off: usize) -> &AtomicU64 {
            debug_assert!(off % 8 == 0 && off + 8 <= self.len, "word at {off}");
            // SAFETY: in bounds and aligned (caller's contract), inside the mapping, which
            // outlives `self`; an atomic may be mutated by others while referenced.
            unsafe { AtomicU64::from_ptr(self.base.as_ptr().add(off).cast::<u64>()) }
        }

        /// The 4-byte word at `off`, without the bounds check (see [`u64_in_bounds`]).
        ///
        /// # Safety
        /// `off` is 4-aligned and `off + 4 <= self.len()`.
        ///
        /// [`u64_in_bounds`]: Self::u64_in_bounds
        #[inline(always)]
        pub(crate) unsafe fn u32_in_bounds(&self, off: usize) -> &AtomicU32 {
            debug_assert!(off % 4 == 0 && off + 4 <= self.len, "word at {off}");
            // SAFETY: as in `u64_in_bounds`, for a 4-aligned word.
            unsafe { AtomicU32::from_ptr(self.base.as_ptr().add(off).cast::<u32>()) }
        }

        /// Atomic load of the 8-byte word at `off` (8-aligned). Checked; for the
        /// hostile-peer fuzzer, which plays the peer (the ring itself uses the accessors above).
        #[cfg(feature = "bench")]
        #[inline(always)]
        pub(crate) fn load_u64(&self, off: usize, order: Ordering) -> u64 {
            self.u64_at(off).load(order)
        }

        /// Atomic store of the 8-byte word at `off` (8-aligned). Checked; for the
        /// hostile-peer fuzzer, which plays the peer (the ring itself uses the accessors above).
        #[cfg(feature = "bench")]
        #[inline(always)]
        pub(crate) fn store_u64(&self, off: usize, v: u64, order: Ordering) {
            self.u64_at(off).store(v, order)
        }

        /// Atomic store of the 4-byte word at `off` (4-aligned). Checked; for the
        /// hostile-peer fuzzer.
        #[cfg(feature = "bench")]
        #[inline(always)]
        pub(crate) fn store_u32(&self, off: usize, v: u32, order: Ordering) {
            self.u32_at(off).store(v, order)
        }

        /// Copies `dst.len()` bytes at `off` out into private memory.
        #[inline(always)]
        pub(crate) fn copy_out(&self, off: usize, dst: &mut [u8]) {
            let len = dst.len();
            let src = self.at(off, len, 1);
            // SAFETY: `src .. src + len` is inside the mapping (checked); `dst` is private,
            // writable and cannot overlap shared memory we were handed as a Region.
            unsafe { opaque_copy(src, dst.as_mut_ptr(), len) }
        }

        /// Copies `src` into the region at `off`.
        #[inline(always)]
        pub(crate) fn copy_in(&self, off: usize, src: &[u8]) {
            let len = src.len();
            let dst = self.at(off, len, 1);
            // SAFETY: `dst .. dst + len` is inside the mapping (checked); `src` is private.
            unsafe { opaque_copy(src.as_ptr(), dst, len) }
        }

        /// Copies `len` bytes at `off` to `dst_off` of `dst` (possibly the same region; the two
        /// ranges are the caller's and do not overlap).
        #[inline(always)]
        pub(crate) fn copy_to(&self, off: usize, dst: &Region, dst_off: usize, len: usize) {
            let s = self.at(off, len, 1);
            let d = dst.at(dst_off, len, 1);
            // SAFETY: both ranges lie inside live mappings (checked; contract of `new`).
            unsafe { opaque_copy(s, d, len) }
        }

        /// Raw address of `len` bytes at `off`, for the C ABI's in-place slots. Never turned
        /// into a Rust reference.
        pub(crate) fn ptr(&self, off: usize, len: usize) -> *mut u8 {
            self.at(off, len, 1)
        }

        /// Sleeps while the 4-byte word at `off` holds `expected`, for at most `timeout_ns`
        /// (`None`: no limit). Returns on a wake-up, timeout, signal or mismatch; callers
        /// re-check. Not `FUTEX_PRIVATE_FLAG`: the kernel keys the queue on the memfd page, so
        /// the two processes meet on it.
        pub(crate) fn futex_wait(&self, off: usize, expected: u32, timeout_ns: Option<u64>) {
            let word = self.at(off, 4, 4);
            let ts = timeout_ns.map(|ns| libc::timespec {
                tv_sec: (ns / 1_000_000_000) as libc::time_t,
                tv_nsec: (ns % 1_000_000_000) as libc::c_long,
            });
            let ts_ptr = ts
                .as_ref()
                .map_or(std::ptr::null(), |t| t as *const libc::timespec);
            // SAFETY: `word` is an aligned u32 inside a live mapping; `ts_ptr` is null or points
            // to a timespec on our stack. FUTEX_WAIT reads both, atomically for the word.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    word,
                    libc::FUTEX_WAIT,
                    expected,
                    ts_ptr,
                    std::ptr::null::<u32>(),
                    0u32,
                );
            }
        }

        /// Wakes every thread sleeping on the 4-byte word at `off`.
        pub(crate) fn futex_wake(&self, off: usize) {
            let word = self.at(off, 4, 4);
            // SAFETY: `word` is an aligned u32 inside a live mapping; FUTEX_WAKE does not
            // dereference the other arguments.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    word,
                    libc::FUTEX_WAKE,
                    i32::MAX,
                    std::ptr::null::<libc::timespec>(),
                    std::ptr::null::<u32>(),
                    0u32,
                );
            }
        }

        /// Hints the CPU to move the 64-byte line at `off` to the shared cache (`CLDEMOTE`, a
        /// NOP where unsupported). No architectural effect on memory.
        #[inline(always)]
        pub(crate) fn demote_line(&self, off: usize) {
            let _line = self.hint_at(off);
            // SAFETY: CLDEMOTE neither reads nor writes memory architecturally, and a hint does
            // not fault whatever the address.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                std::arch::asm!("cldemote [{0}]", in(reg) _line, options(nostack, preserves_flags))
            };
        }

        /// Hints the CPU to fetch the line at `off` in a writable state (`PREFETCHW`). No
        /// architectural effect on memory.
        #[inline(always)]
        pub(crate) fn claim_line(&self, off: usize) {
            let _line = self.hint_at(off);
            // SAFETY: PREFETCHW neither reads nor writes memory architecturally, and a prefetch
            // does not fault whatever the address.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                std::arch::asm!("prefetchw [{0}]", in(reg) _line, options(nostack, preserves_flags))
            };
        }
    }

    /// The panic of a failed bounds check, out of the hot path (an inline `assert!` made the
    /// compiler store its message arguments on every access).
    #[cold]
    #[inline(never)]
    fn outside(off: usize, size: usize, align: usize, len: usize) -> ! {
        panic!("shared-memory access {off}+{size} (align {align}) outside a {len}-byte region")
    }
}

#[cfg(loom)]
mod model {
    use crate::sync::Ordering;
    use crate::sync::{AtomicU32, AtomicU64};
    use std::sync::Arc;

    /// Loom model of a shared region: one loom atomic per 8-byte word (for 8-byte accesses and
    /// payload bytes) and one per 4-byte word (for the 4-byte flags and futex words; the ring
    /// never accesses the same bytes with both widths).
    #[derive(Debug, Clone)]
    pub(crate) struct Region {
        inner: Arc<Model>,
    }

    #[derive(Debug)]
    struct Model {
        w64: Vec<AtomicU64>,
        w32: Vec<AtomicU32>,
        futex: loom::sync::Mutex<()>,
        cv: loom::sync::Condvar,
    }

    impl Region {
        /// A zeroed region of `len` bytes (a multiple of 8).
        pub(crate) fn new_model(len: usize) -> Region {
            assert_eq!(len % 8, 0);
            Region {
                inner: Arc::new(Model {
                    w64: (0..len / 8).map(|_| AtomicU64::new(0)).collect(),
                    w32: (0..len / 4).map(|_| AtomicU32::new(0)).collect(),
                    futex: loom::sync::Mutex::new(()),
                    cv: loom::sync::Condvar::new(),
                }),
            }
        }

        pub(crate) fn len(&self) -> usize {
            self.inner.w64.len() * 8
        }

        fn w64(&self, off: usize) -> &AtomicU64 {
            assert_eq!(off % 8, 0, "unaligned 8-byte access at {off}");
            &self.inner.w64[off / 8]
        }

        fn w32(&self, off: usize) -> &AtomicU32 {
            assert_eq!(off % 4, 0, "unaligned 4-byte access at {off}");
            &self.inner.w32[off / 4]
        }

        /// The model checks bounds anyway.
        pub(crate) unsafe fn u64_in_bounds(&self, off: usize) -> &AtomicU64 {
            self.w64(off)
        }
        pub(crate) unsafe fn u32_in_bounds(&self, off: usize) -> &AtomicU32 {
            self.w32(off)
        }

        /// Relaxed word loads, so loom explores every visibility of every payload word.
        pub(crate) fn copy_out(&self, off: usize, dst: &mut [u8]) {
            for (i, b) in dst.iter_mut().enumerate() {
                let at = off + i;
                let w = self.w64(at & !7).load(Ordering::Relaxed).to_ne_bytes();
                *b = w[at % 8];
            }
        }

        /// Relaxed word stores (read-modify-write of partly covered words: the writer owns them).
        pub(crate) fn copy_in(&self, off: usize, src: &[u8]) {
            let mut at = off;
            for chunk_end in ((off & !7) + 8..).step_by(8) {
                let end = chunk_end.min(off + src.len());
                if at >= end {
                    break;
                }
                let word = self.w64(at & !7);
                let mut w = word.load(Ordering::Relaxed).to_ne_bytes();
                for k in at..end {
                    w[k % 8] = src[k - off];
                }
                word.store(u64::from_ne_bytes(w), Ordering::Relaxed);
                at = end;
            }
        }

        /// The futex check-and-sleep happens under one lock, as the kernel does it under the
        /// hash-bucket lock, so a lost wake-up is a deadlock loom reports. A bounded wait may
        /// end at any moment (a yield); callers re-check everything.
        pub(crate) fn futex_wait(&self, off: usize, expected: u32, timeout_ns: Option<u64>) {
            if timeout_ns.is_some() {
                loom::thread::yield_now();
                return;
            }
            let guard = self.inner.futex.lock().unwrap();
            if self.w32(off).load(Ordering::SeqCst) == expected {
                drop(self.inner.cv.wait(guard).unwrap());
            }
        }

        pub(crate) fn futex_wake(&self, _off: usize) {
            let _guard = self.inner.futex.lock().unwrap();
            self.inner.cv.notify_all();
        }

        pub(crate) fn demote_line(&self, _off: usize) {}
        pub(crate) fn claim_line(&self, _off: usize) {}
    }
}
