//! One direction of a channel: a single-producer single-consumer ring of variable-size byte
//! records in shared memory, the non-blocking buffer of the papers (Kim, Colmenares and Rim,
//! "Efficient adaptations of the non-blocking buffer for event message communication", 2007).
//!
//! # Algorithm
//!
//! Lamport's SPSC ring (1983) with two refinements:
//!
//! - **Self-describing records** (FastForward, Giacomoni, Moseley and Vachharajani, PPoPP 2008):
//!   there is no shared tail index. The consumer polls the header word of the record at its own
//!   head; a non-zero header means "published". A small message therefore crosses between cores
//!   as one cache line (header and payload together) instead of two (tail, then data), which is
//!   what keeps the round trip close to a bare flag ping-pong.
//! - **Cached opposite index** (as in rtrb and crossbeam's array flavour): the producer keeps a
//!   private copy of the consumer's `head` and reloads the shared one only when that copy says
//!   the ring is full, so on the fast path it never touches the consumer's line.
//!
//! To make "non-zero header means published" sound across laps, the producer always writes a
//! zero *terminator* word at the position the next record will start, before it publishes the
//! current one (Release). The consumer reaches a position only through the Acquire load of the
//! header before it, so it sees that terminator or something newer; stale bytes of an earlier
//! lap (which may be a payload that looks like a header) are never interpreted. The ring
//! therefore keeps room for one terminator: a record needs `record_size(len) + 8` free bytes.
//!
//! A record never straddles the end of the ring. If it does not fit before the end, the producer
//! writes a PAD header covering the rest and puts the record at offset 0. A ring of capacity
//! `2 * record_size(max_message) + 8` always has room for a maximal record once empty.
//!
//! Batches: the producer may write several records and publish them with one Release store, of
//! the first header, last; the consumer may read several and publish its head once.
//!
//! # Sleeping
//!
//! Either side may sleep on a futex word in the control block (`rx_sleep` for a consumer on an
//! empty ring, `tx_sleep` for a producer on a full one). The sleeper sets the word to 1, issues a
//! SeqCst fence, re-checks the ring, and only then `FUTEX_WAIT`s; the other side, after
//! publishing, issues a SeqCst fence and reads the word, and only if it is 1 swaps it to 0 and
//! `FUTEX_WAKE`s. The two fences form Dekker's pattern: at least one side sees the other's store,
//! so a wake-up is never lost, and a side whose peer is not asleep makes no system call.
//!
//! # Hostile peer
//!
//! The peer can write any word of the shared pages at any time. Each side trusts only its own
//! private indices. The one index it reads from the peer (the producer reads `head`) must lie
//! between the previously seen value and the private tail; every header the consumer reads must
//! carry the right sequence number, a length within the maximum, and end inside the ring. Any
//! violation is a [`Corruption`]; no offset derived from shared memory is used before it is
//! checked, and the memory accessors mask and bound-check offsets besides.
//!
//! Concurrency caveat, as rtrb puts it: a full ring might cease to be full at any time, and an
//! empty one might cease to be empty.

use crate::layout::{
    header_word, record_size, RingCtrl, HDR_PAD, HDR_SEQ_MASK, HDR_VALID, RECORD_HEADER,
};
use crate::sync::{fence, AtomicU64, Ordering};

/// Shared memory of one ring was found in a state no honest peer produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("peer corrupted the channel: {what} at byte index {index} (found {found:#x})")]
pub struct Corruption {
    /// What was wrong.
    pub what: &'static str,
    /// Byte index in the ring (not reduced modulo the capacity) where it was found.
    pub index: u64,
    /// The offending value.
    pub found: u64,
}

/// Access to one ring's control block and data area.
#[cfg(not(loom))]
#[derive(Debug)]
pub(crate) struct RingRef {
    ctrl: std::ptr::NonNull<RingCtrl>,
    data: std::ptr::NonNull<u8>,
    cap: usize,
}

#[cfg(not(loom))]
impl RingRef {
    /// # Safety
    /// `ctrl` must point to a `RingCtrl`-sized, 128-byte aligned region and `data` to a
    /// `cap`-byte, 8-byte aligned region (`cap` a power of two >= 8), both in a shared mapping
    /// that stays mapped for as long as this `RingRef` (and anything made from it) is used.
    pub(crate) unsafe fn new(
        ctrl: std::ptr::NonNull<RingCtrl>,
        data: std::ptr::NonNull<u8>,
        cap: usize,
    ) -> RingRef {
        debug_assert!(cap.is_power_of_two() && cap >= 8);
        debug_assert_eq!(ctrl.as_ptr() as usize % crate::layout::LINE, 0);
        debug_assert_eq!(data.as_ptr() as usize % 8, 0);
        RingRef { ctrl, data, cap }
    }

    #[inline(always)]
    fn ctrl(&self) -> &RingCtrl {
        // SAFETY: by the contract of `new`, `ctrl` is aligned and mapped while `self` lives;
        // every field is an atomic, for which any bit pattern (whatever the peer wrote) is valid.
        unsafe { self.ctrl.as_ref() }
    }

    /// The 8-byte word at `off`, reduced into the ring and aligned (so never out of bounds).
    #[inline(always)]
    fn word(&self, off: usize) -> &AtomicU64 {
        let off = off & (self.cap - 1) & !7;
        // SAFETY: `off + 8 <= cap` and `off` is 8-aligned (masked above; cap is a power of two
        // >= 8), so the word lies inside the mapped, 8-aligned data area; AtomicU64 has the
        // layout of u64 and every bit pattern is valid.
        unsafe { &*(self.data.as_ptr().add(off) as *const AtomicU64) }
    }

    #[inline(always)]
    fn check(&self, off: usize, len: usize) {
        assert!(
            off <= self.cap && len <= self.cap - off,
            "ring access {off}+{len} outside capacity {}",
            self.cap
        );
    }

    /// Copies `src` into the data area at `off`.
    #[inline(always)]
    fn copy_in(&self, off: usize, src: &[u8]) {
        self.check(off, src.len());
        // SAFETY: `check` keeps [off, off+len) inside the mapped data area; `src` is private
        // memory, so the ranges cannot overlap. The bytes are plain data (see `ptr`).
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.data.as_ptr().add(off), src.len())
        };
    }

    /// Copies from the data area at `off` into `dst`.
    #[inline(always)]
    fn copy_out(&self, off: usize, dst: &mut [u8]) {
        self.check(off, dst.len());
        // SAFETY: `check` keeps [off, off+len) inside the mapped data area; `dst` is private.
        // A hostile peer writing these bytes concurrently can change only their values.
        unsafe {
            std::ptr::copy_nonoverlapping(self.data.as_ptr().add(off), dst.as_mut_ptr(), dst.len())
        };
    }

    /// Calls `hint` with the address of each cache line holding byte indices `[from, to)`
    /// (reduced into the ring, so every address lies inside the mapped data area).
    #[inline(always)]
    fn for_each_line(&self, from: u64, to: u64, hint: impl Fn(*const u8)) {
        let mask = self.cap as u64 - 1;
        let mut line = from & !63;
        while line < to {
            // SAFETY: `line & mask < cap`, so the offset stays inside the data area.
            hint(unsafe { self.data.as_ptr().add((line & mask) as usize) });
            line += 64;
        }
    }

    /// Hints the CPU to move the lines holding byte indices `[from, to)` out of this core's
    /// private caches into the shared last-level cache (`CLDEMOTE`), so that the consumer's
    /// misses on them are served from there instead of by a cross-core snoop. A no-op hint
    /// (`CLDEMOTE` is in the NOP space) on CPUs without it.
    #[inline(always)]
    fn demote(&self, from: u64, to: u64) {
        self.for_each_line(from, to, |_line| {
            // SAFETY: `_line` lies inside the mapped data area; CLDEMOTE neither reads nor
            // writes memory architecturally.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                std::arch::asm!("cldemote [{0}]", in(reg) _line, options(nostack, preserves_flags))
            };
        });
    }

    /// Hints the CPU to fetch the lines holding byte indices `[from, to)` into this core's
    /// cache in a writable state (`PREFETCHW`), so that writing them later needs no
    /// cross-core invalidation. A hint: no architectural effect on memory.
    #[inline(always)]
    fn claim(&self, from: u64, to: u64) {
        self.for_each_line(from, to, |_line| {
            // SAFETY: `_line` lies inside the mapped data area; PREFETCHW neither reads nor
            // writes memory architecturally.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                std::arch::asm!("prefetchw [{0}]", in(reg) _line, options(nostack, preserves_flags))
            };
        });
    }

    /// Raw pointer to `len` bytes at `off` in the data area, for zero-copy slots.
    ///
    /// The bytes live in memory another process maps; they are plain `u8`s with no validity
    /// invariant, so a peer that writes them while we hold a slice can change the values we
    /// read but never make us touch memory outside the ring.
    #[inline(always)]
    pub(crate) fn ptr(&self, off: usize, len: usize) -> *mut u8 {
        self.check(off, len);
        // SAFETY: `check` keeps the offset inside the data area.
        unsafe { self.data.as_ptr().add(off) }
    }
}

/// Loom stand-in for a ring in shared memory: the same control block, and the data area as
/// words accessed atomically (relaxed), so loom explores every visibility of the payload.
#[cfg(loom)]
#[derive(Debug, Clone)]
pub(crate) struct RingRef {
    inner: std::sync::Arc<LoomRing>,
}

#[cfg(loom)]
#[derive(Debug)]
struct LoomRing {
    ctrl: RingCtrl,
    data: Vec<AtomicU64>,
}

#[cfg(loom)]
impl RingRef {
    pub(crate) fn new_model(cap: usize) -> RingRef {
        assert!(cap.is_power_of_two() && cap >= 8);
        RingRef {
            inner: std::sync::Arc::new(LoomRing {
                ctrl: RingCtrl::default(),
                data: (0..cap / 8).map(|_| AtomicU64::new(0)).collect(),
            }),
        }
    }

    fn ctrl(&self) -> &RingCtrl {
        &self.inner.ctrl
    }

    fn word(&self, off: usize) -> &AtomicU64 {
        let cap = self.inner.data.len() * 8;
        &self.inner.data[(off & (cap - 1)) / 8]
    }

    fn copy_in(&self, off: usize, src: &[u8]) {
        assert_eq!(off % 8, 0);
        for (i, chunk) in src.chunks(8).enumerate() {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.word(off + 8 * i)
                .store(u64::from_le_bytes(b), Ordering::Relaxed);
        }
    }

    fn demote(&self, _from: u64, _to: u64) {}

    fn claim(&self, _from: u64, _to: u64) {}

    fn copy_out(&self, off: usize, dst: &mut [u8]) {
        assert_eq!(off % 8, 0);
        for (i, chunk) in dst.chunks_mut(8).enumerate() {
            let b = self.word(off + 8 * i).load(Ordering::Relaxed).to_le_bytes();
            chunk.copy_from_slice(&b[..chunk.len()]);
        }
    }
}

/// Where a record is going to be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Placement {
    /// Index of the first header written (the PAD if any, else the record's).
    start: u64,
    /// Bytes of padding before the record (0: none).
    pad: u64,
    /// Index of the record's header.
    rec: u64,
    /// Largest payload length that may be committed.
    pub(crate) len: usize,
}

/// Why a record cannot be placed now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PlaceError {
    /// Not enough free space (yet).
    Full,
    /// Longer than the channel's maximum.
    TooLarge,
    /// The consumer's head is impossible.
    Corrupted(Corruption),
}

/// The writing end of one ring. Lives in exactly one process.
#[derive(Debug)]
pub(crate) struct Producer {
    ring: RingRef,
    cap: u64,
    max_message: usize,
    /// Index where the next record starts; a terminator lies there.
    tail: u64,
    /// Last value of the consumer's head that we read and validated.
    head_cache: u64,
    /// First header of a batch not yet published: (index, word).
    pending: Option<(u64, u64)>,
    /// Records committed since the last publish.
    pending_count: u32,
    /// Whether a publish of a single record demotes its lines to the shared cache.
    pub(crate) demote: bool,
}

impl Producer {
    /// A producer for a fresh (all-zero) ring.
    pub(crate) fn new(ring: RingRef, cap: usize, max_message: usize) -> Producer {
        Producer {
            ring,
            cap: cap as u64,
            max_message,
            tail: 0,
            head_cache: 0,
            pending: None,
            pending_count: 0,
            demote: true,
        }
    }

    /// Largest payload accepted.
    pub(crate) fn max_message(&self) -> usize {
        self.max_message
    }

    /// Reloads the consumer's head and checks it lies in `[head_cache, tail]`, 8-aligned.
    #[inline]
    fn refresh_head(&mut self) -> Result<(), Corruption> {
        let h = self.ring.ctrl().head.load(Ordering::Acquire);
        let behind = self.tail.wrapping_sub(h);
        if h & 7 != 0 || behind > self.tail.wrapping_sub(self.head_cache) {
            return Err(Corruption {
                what: "consumer head outside [last head, tail]",
                index: self.tail,
                found: h,
            });
        }
        self.head_cache = h;
        Ok(())
    }

    /// Finds room for a record of up to `len` payload bytes, without writing anything.
    #[inline]
    pub(crate) fn place(&mut self, len: usize) -> Result<Placement, PlaceError> {
        if len > self.max_message {
            return Err(PlaceError::TooLarge);
        }
        let rec_size = record_size(len) as u64;
        let off = self.tail & (self.cap - 1);
        let pad = if off + rec_size > self.cap {
            self.cap - off
        } else {
            0
        };
        let need = pad + rec_size + RECORD_HEADER as u64;
        if self.tail.wrapping_sub(self.head_cache) + need > self.cap {
            self.refresh_head().map_err(PlaceError::Corrupted)?;
            if self.tail.wrapping_sub(self.head_cache) + need > self.cap {
                return Err(PlaceError::Full);
            }
        }
        Ok(Placement {
            start: self.tail,
            pad,
            rec: self.tail + pad,
            len,
        })
    }

    /// Offset in the data area of the payload of `p`.
    #[inline(always)]
    pub(crate) fn payload_offset(&self, p: &Placement) -> usize {
        ((p.rec & (self.cap - 1)) as usize) + RECORD_HEADER
    }

    /// Copies `src` (at most `p.len` bytes) into the payload of `p`.
    #[inline(always)]
    pub(crate) fn write(&self, p: &Placement, src: &[u8]) {
        debug_assert!(src.len() <= p.len);
        self.ring
            .copy_in(self.payload_offset(p), &src[..src.len().min(p.len)]);
    }

    /// Pointer to the payload of `p` (zero-copy writes).
    #[cfg(not(loom))]
    pub(crate) fn payload_ptr(&self, p: &Placement) -> *mut u8 {
        self.ring.ptr(self.payload_offset(p), p.len)
    }

    /// Makes `p` a record of `len <= p.len` bytes; it becomes visible at the next
    /// [`publish`](Self::publish) (together with the rest of the batch).
    #[inline]
    pub(crate) fn commit(&mut self, p: Placement, len: usize) {
        debug_assert_eq!(p.start, self.tail);
        let len = len.min(p.len);
        let next = p.rec + record_size(len) as u64;
        // The terminator where the next record will go, ordered before the publishing store.
        self.ring
            .word((next & (self.cap - 1)) as usize)
            .store(0, Ordering::Relaxed);
        let rec_word = header_word(p.rec, len as u32, false);
        let first = if p.pad > 0 {
            self.ring
                .word((p.rec & (self.cap - 1)) as usize)
                .store(rec_word, Ordering::Relaxed);
            (p.start, header_word(p.start, p.pad as u32, true))
        } else {
            (p.rec, rec_word)
        };
        if self.pending.is_none() {
            self.pending = Some(first);
        } else {
            self.ring
                .word((first.0 & (self.cap - 1)) as usize)
                .store(first.1, Ordering::Relaxed);
        }
        self.tail = next;
        self.pending_count += 1;
    }

    /// Publishes every committed record with one Release store, then wakes the consumer if it
    /// announced it is asleep. Returns whether anything was published.
    ///
    /// A single record (a latency-bound send, not a batch) is also pushed towards the consumer
    /// when `demote` is set: its lines are demoted to the shared last-level cache (see
    /// `RingRef::demote`), and the lines the next record of the same size will occupy are
    /// claimed for writing (`RingRef::claim`), so that the next send finds them in this core's
    /// cache instead of invalidating the consumer's copies on the critical path. On the test
    /// machine demoting cut the 512-byte round trip by a third and claiming by another quarter
    /// (1 KiB and more: by a third); demoting every batch of a stream cost most of the
    /// throughput, so batches are left alone.
    #[inline]
    pub(crate) fn publish(&mut self) -> bool {
        let Some((index, word)) = self.pending.take() else {
            return false;
        };
        self.ring
            .word((index & (self.cap - 1)) as usize)
            .store(word, Ordering::Release);
        fence(Ordering::SeqCst);
        if self.demote && self.pending_count == 1 {
            self.ring.demote(index, self.tail + RECORD_HEADER as u64);
            // Claim the lines a next record of the same size will use, while the caller
            // waits for an answer: all but the one holding the terminator (the consumer polls
            // it), and only free space (lines ahead of it may hold records being read).
            let free = self.cap - self.tail.wrapping_sub(self.head_cache);
            let size = (self.tail - index).min(free);
            self.ring.claim((self.tail & !63) + 64, self.tail + size);
        }
        self.pending_count = 0;
        let sleep = &self.ring.ctrl().rx_sleep;
        if sleep.word().load(Ordering::Relaxed) != 0 && sleep.word().swap(0, Ordering::Relaxed) != 0
        {
            sleep.wake();
        }
        true
    }

    /// Whether the consumer has hung up.
    #[inline]
    pub(crate) fn consumer_closed(&self) -> bool {
        self.ring.ctrl().closed.consumer.load(Ordering::Acquire) != 0
    }

    /// Announces that we are about to sleep because the ring is full. The caller must re-check
    /// (call [`place`](Self::place) again) before [`sleep`](Self::sleep).
    pub(crate) fn announce_sleep(&self) {
        self.ring.ctrl().tx_sleep.word().store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    /// Sleeps until woken or `timeout_ns` passes, then withdraws the announcement.
    pub(crate) fn sleep(&self, timeout_ns: Option<u64>) {
        let w = &self.ring.ctrl().tx_sleep;
        w.wait(1, timeout_ns);
        w.word().store(0, Ordering::Relaxed);
    }

    /// Withdraws a sleep announcement without sleeping.
    pub(crate) fn cancel_sleep(&self) {
        self.ring.ctrl().tx_sleep.word().store(0, Ordering::Relaxed);
    }

    /// Hangs up: publishes anything pending, sets `producer_closed` and wakes the consumer.
    pub(crate) fn close(&mut self) {
        self.publish();
        let ctrl = self.ring.ctrl();
        ctrl.closed.producer.store(1, Ordering::Release);
        fence(Ordering::SeqCst);
        ctrl.rx_sleep.word().store(0, Ordering::Relaxed);
        ctrl.rx_sleep.wake();
    }
}

/// A record found at the consumer's head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Record {
    /// Offset of the payload in the data area.
    pub(crate) offset: usize,
    /// Payload length.
    pub(crate) len: usize,
    /// Index just past the record.
    next: u64,
}

/// The reading end of one ring. Lives in exactly one process.
#[derive(Debug)]
pub(crate) struct Consumer {
    ring: RingRef,
    cap: u64,
    max_message: usize,
    /// Index of the next header to read (private; the shared `head` is a copy for the producer).
    head: u64,
    /// `head` as last stored to shared memory.
    published_head: u64,
}

impl Consumer {
    /// A consumer for a fresh (all-zero) ring.
    pub(crate) fn new(ring: RingRef, cap: usize, max_message: usize) -> Consumer {
        Consumer {
            ring,
            cap: cap as u64,
            max_message,
            head: 0,
            published_head: 0,
        }
    }

    /// Largest payload the producer may send.
    pub(crate) fn max_message(&self) -> usize {
        self.max_message
    }

    /// The record at the head, if one is published; validated, not consumed.
    #[inline]
    pub(crate) fn peek(&mut self) -> Result<Option<Record>, Corruption> {
        let mask = self.cap - 1;
        // At most one PAD precedes a record: the second iteration starts at offset 0, where a
        // PAD is rejected.
        for _ in 0..2 {
            let off = self.head & mask;
            let w = self.ring.word(off as usize).load(Ordering::Acquire);
            if w == 0 {
                return Ok(None);
            }
            let bad = |what| {
                Err(Corruption {
                    what,
                    index: self.head,
                    found: w,
                })
            };
            if w & HDR_VALID == 0 {
                return bad("record header without the valid bit");
            }
            if (w >> 32) & HDR_SEQ_MASK != (self.head >> 3) & HDR_SEQ_MASK {
                return bad("record header with a wrong sequence number");
            }
            let len = (w & 0xffff_ffff) as usize;
            if w & HDR_PAD != 0 {
                if off == 0 || len as u64 != self.cap - off {
                    return bad("padding record not ending at the end of the ring");
                }
                self.head += len as u64;
                continue;
            }
            if len > self.max_message {
                return bad("record longer than the maximum message size");
            }
            let size = record_size(len) as u64;
            if off + size > self.cap {
                return bad("record running past the end of the ring");
            }
            return Ok(Some(Record {
                offset: off as usize + RECORD_HEADER,
                len,
                next: self.head + size,
            }));
        }
        Err(Corruption {
            what: "padding record at the start of the ring",
            index: self.head,
            found: self
                .ring
                .word((self.head & mask) as usize)
                .load(Ordering::Relaxed),
        })
    }

    /// Copies the payload of `r` into `dst[..r.len]`.
    #[inline(always)]
    pub(crate) fn read(&self, r: &Record, dst: &mut [u8]) {
        self.ring.copy_out(r.offset, &mut dst[..r.len]);
    }

    /// Pointer to the payload of `r` (zero-copy reads).
    #[cfg(not(loom))]
    pub(crate) fn payload_ptr(&self, r: &Record) -> *const u8 {
        self.ring.ptr(r.offset, r.len)
    }

    /// Consumes `r` locally; the producer sees the space at the next [`publish`](Self::publish).
    #[inline(always)]
    pub(crate) fn consume(&mut self, r: Record) {
        self.head = r.next;
    }

    /// Stores the head for the producer (Release: our reads of the consumed records happen
    /// before the producer reuses their space), then wakes the producer if it sleeps.
    #[inline]
    pub(crate) fn publish(&mut self) {
        if self.published_head == self.head {
            return;
        }
        self.published_head = self.head;
        let ctrl = self.ring.ctrl();
        ctrl.head.store(self.head, Ordering::Release);
        fence(Ordering::SeqCst);
        let sleep = &ctrl.tx_sleep;
        if sleep.word().load(Ordering::Relaxed) != 0 && sleep.word().swap(0, Ordering::Relaxed) != 0
        {
            sleep.wake();
        }
    }

    /// Whether the producer has hung up.
    #[inline]
    pub(crate) fn producer_closed(&self) -> bool {
        self.ring.ctrl().closed.producer.load(Ordering::Acquire) != 0
    }

    /// Announces that we are about to sleep on an empty ring. The caller must re-check (call
    /// [`peek`](Self::peek) again) before [`sleep`](Self::sleep).
    pub(crate) fn announce_sleep(&self) {
        self.ring.ctrl().rx_sleep.word().store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    /// Sleeps until woken or `timeout_ns` passes, then withdraws the announcement.
    pub(crate) fn sleep(&self, timeout_ns: Option<u64>) {
        let w = &self.ring.ctrl().rx_sleep;
        w.wait(1, timeout_ns);
        w.word().store(0, Ordering::Relaxed);
    }

    /// Withdraws a sleep announcement without sleeping.
    pub(crate) fn cancel_sleep(&self) {
        self.ring.ctrl().rx_sleep.word().store(0, Ordering::Relaxed);
    }

    /// Hangs up: sets `consumer_closed` and wakes the producer.
    pub(crate) fn close(&mut self) {
        self.publish();
        let ctrl = self.ring.ctrl();
        ctrl.closed.consumer.store(1, Ordering::Release);
        fence(Ordering::SeqCst);
        ctrl.tx_sleep.word().store(0, Ordering::Relaxed);
        ctrl.tx_sleep.wake();
    }
}
