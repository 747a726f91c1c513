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
//! checked, and the memory accessors mask offsets into the ring besides (and the region
//! bound-checks every payload copy). Shared memory is
//! reached only through [`Region`](crate::region::Region): single atomic word operations and
//! opaque copies, never a Rust reference to plain data (see `region` for the safety model).
//! The checks of a record header are the pure function [`decode_record`], also fuzzed on its
//! own (`crates/tess-channel/fuzz`).
//!
//! The same code runs under loom (`--cfg loom`): only the region below it is a model.
//!
//! Concurrency caveat, as rtrb puts it: a full ring might cease to be full at any time, and an
//! empty one might cease to be empty.

use crate::layout::{
    header_word, record_size, CTRL_CONSUMER_CLOSED, CTRL_HEAD, CTRL_PRODUCER_CLOSED, CTRL_RX_SLEEP,
    CTRL_SIZE, CTRL_TX_SLEEP, HDR_PAD, HDR_SEQ_MASK, HDR_VALID, RECORD_HEADER,
};
use crate::region::Region;
use crate::sync::{fence, AtomicU32, AtomicU64, Ordering};

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

/// What a record header word read at the consumer's head says, once checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordWord {
    /// Zero: nothing published here yet (the terminator).
    Empty,
    /// Padding of this many bytes up to the end of the ring.
    Pad(u64),
    /// A record with a payload of this many bytes.
    Record(usize),
}

/// Checks the header word `w` read at byte index `head` of a ring of `cap` bytes (a power of
/// two) whose records carry at most `max_message` bytes. A pure function of private values:
/// the word was read once, atomically, and is not read again.
///
/// Accepts only what an honest producer writes: the valid bit, the sequence number of `head`,
/// a length within the maximum, a record that ends inside the ring, and a PAD that is not at
/// offset 0 and ends exactly at the end of the ring.
#[inline]
pub fn decode_record(
    w: u64,
    head: u64,
    cap: u64,
    max_message: usize,
) -> Result<RecordWord, Corruption> {
    if w == 0 {
        return Ok(RecordWord::Empty);
    }
    let bad = |what| {
        Err(Corruption {
            what,
            index: head,
            found: w,
        })
    };
    if w & HDR_VALID == 0 {
        return bad("record header without the valid bit");
    }
    if (w >> 32) & HDR_SEQ_MASK != (head >> 3) & HDR_SEQ_MASK {
        return bad("record header with a wrong sequence number");
    }
    let off = head & (cap - 1);
    let len = w & 0xffff_ffff;
    if w & HDR_PAD != 0 {
        if off == 0 || len != cap - off {
            return bad("padding record not ending at the end of the ring");
        }
        return Ok(RecordWord::Pad(len));
    }
    if len > max_message as u64 {
        return bad("record longer than the maximum message size");
    }
    if off + record_size(len as usize) as u64 > cap {
        return bad("record running past the end of the ring");
    }
    Ok(RecordWord::Record(len as usize))
}

/// One ring inside a [`Region`]: its control block and data area, at offsets checked once at
/// construction. Every access below masks its index into the ring. Payload copies are checked
/// again by the region; word accesses are not, and rely on the checks of [`RingRef::new`].
///
/// Safety invariant: `cap` is a power of two of at least 8, `ctrl` and `data` are 8-aligned, and
/// `ctrl + CTRL_SIZE` and `data + cap` are at most the region's length. The fields are private
/// and set only by `new`.
#[derive(Debug, Clone)]
pub(crate) struct RingRef {
    region: Region,
    ctrl: usize,
    data: usize,
    cap: usize,
}

impl RingRef {
    /// The ring whose control block is at `ctrl` and whose `cap`-byte data area is at `data`.
    /// Panics unless both lie inside the region, `ctrl` is 8-aligned, `data` 8-aligned and
    /// `cap` a power of two of at least 8 (the caller derives them from a validated geometry).
    pub(crate) fn new(region: Region, ctrl: usize, data: usize, cap: usize) -> RingRef {
        assert!(cap.is_power_of_two() && cap >= 8, "ring capacity {cap}");
        assert!(
            ctrl % 8 == 0 && data % 8 == 0,
            "unaligned ring at {ctrl}/{data}"
        );
        let inside = |at: usize, len: usize| at.checked_add(len).is_some_and(|e| e <= region.len());
        assert!(
            inside(ctrl, CTRL_SIZE) && inside(data, cap),
            "ring at {ctrl}/{data}+{cap} outside a {}-byte region",
            region.len()
        );
        RingRef {
            region,
            ctrl,
            data,
            cap,
        }
    }

    /// A ring alone in a fresh model region (loom): control block, then data.
    #[cfg(loom)]
    pub(crate) fn new_model(cap: usize) -> RingRef {
        RingRef::new(Region::new_model(CTRL_SIZE + cap), 0, CTRL_SIZE, cap)
    }

    /// Offset in the region of the 8-byte word holding byte index `index` of the ring.
    #[inline(always)]
    fn word_at(&self, index: u64) -> usize {
        self.data + ((index as usize) & (self.cap - 1) & !7)
    }

    /// The 8-byte word holding byte index `index` of the ring.
    #[inline(always)]
    fn word(&self, index: u64) -> &AtomicU64 {
        // SAFETY: `word_at` masks the index into `[0, cap - 8]` and to a multiple of 8, and
        // `new` checked that `data` is 8-aligned and `data + cap` inside the region.
        unsafe { self.region.u64_in_bounds(self.word_at(index)) }
    }

    #[inline(always)]
    fn load_word(&self, index: u64, order: Ordering) -> u64 {
        self.word(index).load(order)
    }

    #[inline(always)]
    fn store_word(&self, index: u64, v: u64, order: Ordering) {
        self.word(index).store(v, order)
    }

    /// The 4-byte control word at control-block offset `field` (one of the `CTRL_*` u32s).
    #[inline(always)]
    fn ctrl_u32(&self, field: usize) -> &AtomicU32 {
        // Folds away: every caller passes a constant.
        assert!(
            field % 4 == 0 && field <= CTRL_SIZE - 4,
            "control word at {field}"
        );
        // SAFETY: `field` is 4-aligned and inside the control block (checked above), and `new`
        // checked that the block is 8-aligned and inside the region.
        unsafe { self.region.u32_in_bounds(self.ctrl + field) }
    }

    /// The consumer's head, in the control block.
    #[inline(always)]
    fn head_word(&self) -> &AtomicU64 {
        const { assert!(CTRL_HEAD % 8 == 0 && CTRL_HEAD + 8 <= CTRL_SIZE) };
        // SAFETY: as in `ctrl_u32`, for the 8-aligned u64 at `CTRL_HEAD`.
        unsafe { self.region.u64_in_bounds(self.ctrl + CTRL_HEAD) }
    }

    /// Offset in the region of data-area offset `off` (`off + len <= cap`, checked).
    #[inline(always)]
    fn data_at(&self, off: usize, len: usize) -> usize {
        check_range("ring access", off, len, self.cap);
        self.data + off
    }

    /// Calls `hint` with the region offset of each 64-byte line holding byte indices
    /// `[from, to)`, reduced into the ring.
    #[inline(always)]
    fn for_each_line(&self, from: u64, to: u64, hint: impl Fn(usize)) {
        let mask = self.cap as u64 - 1;
        let mut line = from & !63;
        while line < to {
            hint(self.data + (line & mask) as usize);
            line += 64;
        }
    }

    /// Moves the lines holding `[from, to)` towards the shared cache (`CLDEMOTE`), so the
    /// consumer's misses are served from there instead of by a cross-core snoop. A CPU without
    /// the instruction (AMD's, Intel's before Sapphire Rapids) runs it as a no-op, so the loop
    /// is skipped there.
    #[inline(always)]
    fn demote(&self, from: u64, to: u64) {
        if crate::region::has_cldemote() {
            self.for_each_line(from, to, |off| self.region.demote_line(off));
        }
    }

    /// Fetches the lines holding `[from, to)` for writing (`PREFETCHW`), so writing them later
    /// needs no cross-core invalidation.
    #[inline(always)]
    fn claim(&self, from: u64, to: u64) {
        self.for_each_line(from, to, |off| self.region.claim_line(off));
    }

    /// Sets the futex word at control-block offset `field` and issues the SeqCst fence of the
    /// sleep protocol.
    fn announce(&self, field: usize) {
        self.ctrl_u32(field).store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    /// Sleeps on the futex word at `field` while it is 1, then withdraws the announcement.
    fn sleep(&self, field: usize, timeout_ns: Option<u64>) {
        self.region.futex_wait(self.ctrl + field, 1, timeout_ns);
        self.ctrl_u32(field).store(0, Ordering::Relaxed);
    }

    fn cancel(&self, field: usize) {
        self.ctrl_u32(field).store(0, Ordering::Relaxed);
    }

    /// After a SeqCst fence: wakes the side sleeping on `field` if it announced it sleeps.
    #[inline(always)]
    fn wake_if_asleep(&self, field: usize) {
        let word = self.ctrl_u32(field);
        if word.load(Ordering::Relaxed) != 0 && word.swap(0, Ordering::Relaxed) != 0 {
            self.region.futex_wake(self.ctrl + field);
        }
    }

    /// Sets a hang-up flag and wakes the other side, whatever it announced.
    fn hang_up(&self, flag: usize, wake: usize) {
        self.ctrl_u32(flag).store(1, Ordering::Release);
        fence(Ordering::SeqCst);
        self.ctrl_u32(wake).store(0, Ordering::Relaxed);
        self.region.futex_wake(self.ctrl + wake);
    }

    #[inline(always)]
    fn flag(&self, flag: usize) -> bool {
        self.ctrl_u32(flag).load(Ordering::Acquire) != 0
    }
}

/// Panics unless `len` bytes at `offset` lie inside something `size` bytes long (`what`).
#[inline(always)]
fn check_range(what: &'static str, offset: usize, len: usize, size: usize) {
    if !(offset <= size && len <= size - offset) {
        out_of_range(what, offset, len, size);
    }
}

/// The panic of a failed [`check_range`], out of the hot path, so that the checks cost a
/// compare and a branch (an inline `assert!` made the compiler store its message arguments on
/// every call).
#[cold]
#[inline(never)]
fn out_of_range(what: &str, offset: usize, len: usize, size: usize) -> ! {
    panic!("{what}: {len} bytes at byte {offset} of {size}")
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
        let h = self.ring.head_word().load(Ordering::Acquire);
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

    /// Copies `src` (at most `p.len` bytes, panics otherwise) to the start of the payload of
    /// `p`.
    #[inline(always)]
    pub(crate) fn write(&self, p: &Placement, src: &[u8]) {
        self.write_at(p, 0, src);
    }

    /// Copies `src` to byte `offset` of the payload of `p` (`offset + src.len() <= p.len`,
    /// panics otherwise), leaving the other bytes alone.
    #[inline(always)]
    pub(crate) fn write_at(&self, p: &Placement, offset: usize, src: &[u8]) {
        check_range("write into a slot", offset, src.len(), p.len);
        let at = self
            .ring
            .data_at(self.payload_offset(p) + offset, src.len());
        self.ring.region.copy_in(at, src);
    }

    /// Copies `len` bytes of the payload of `r`, read by `from`, from its byte `offset` to byte
    /// `at` of the payload of `p` (ring to ring, no private copy). Panics if either range is
    /// outside its record.
    #[cfg(not(loom))]
    #[inline]
    pub(crate) fn copy_from_record(
        &self,
        p: &Placement,
        at: usize,
        from: &Consumer,
        r: &Record,
        offset: usize,
        len: usize,
    ) {
        check_range("copy from a message", offset, len, r.len);
        check_range("copy into a slot", at, len, p.len);
        let src = from.ring.data_at(r.offset + offset, len);
        let dst = self.ring.data_at(self.payload_offset(p) + at, len);
        from.ring.region.copy_to(src, &self.ring.region, dst, len);
    }

    /// Raw address of the payload of `p`, for the C ABI's in-place writes (never made a
    /// Rust reference).
    #[cfg(not(loom))]
    pub(crate) fn payload_ptr(&self, p: &Placement) -> *mut u8 {
        let at = self.ring.data_at(self.payload_offset(p), p.len);
        self.ring.region.ptr(at, p.len)
    }

    /// Makes `p` a record of `len <= p.len` bytes; it becomes visible at the next
    /// [`publish`](Self::publish) (together with the rest of the batch).
    #[inline]
    pub(crate) fn commit(&mut self, p: Placement, len: usize) {
        debug_assert_eq!(p.start, self.tail);
        let len = len.min(p.len);
        let next = p.rec + record_size(len) as u64;
        // The terminator where the next record will go, ordered before the publishing store.
        self.ring.store_word(next, 0, Ordering::Relaxed);
        let rec_word = header_word(p.rec, len as u32, false);
        let first = if p.pad > 0 {
            self.ring.store_word(p.rec, rec_word, Ordering::Relaxed);
            (p.start, header_word(p.start, p.pad as u32, true))
        } else {
            (p.rec, rec_word)
        };
        if self.pending.is_none() {
            self.pending = Some(first);
        } else {
            self.ring.store_word(first.0, first.1, Ordering::Relaxed);
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
        self.ring.store_word(index, word, Ordering::Release);
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
        self.ring.wake_if_asleep(CTRL_RX_SLEEP);
        true
    }

    /// Whether the consumer has hung up.
    #[inline]
    pub(crate) fn consumer_closed(&self) -> bool {
        self.ring.flag(CTRL_CONSUMER_CLOSED)
    }

    /// Announces that we are about to sleep because the ring is full. The caller must re-check
    /// (call [`place`](Self::place) again) before [`sleep`](Self::sleep).
    pub(crate) fn announce_sleep(&self) {
        self.ring.announce(CTRL_TX_SLEEP);
    }

    /// Sleeps until woken or `timeout_ns` passes, then withdraws the announcement.
    pub(crate) fn sleep(&self, timeout_ns: Option<u64>) {
        self.ring.sleep(CTRL_TX_SLEEP, timeout_ns);
    }

    /// Withdraws a sleep announcement without sleeping.
    pub(crate) fn cancel_sleep(&self) {
        self.ring.cancel(CTRL_TX_SLEEP);
    }

    /// Hangs up: publishes anything pending, sets `producer_closed` and wakes the consumer.
    pub(crate) fn close(&mut self) {
        self.publish();
        self.ring.hang_up(CTRL_PRODUCER_CLOSED, CTRL_RX_SLEEP);
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

    /// The record at the head, if one is published; validated, not consumed. Each header word
    /// is read once, atomically (Acquire: the payload written before it is visible), and
    /// checked by [`decode_record`] before any offset is derived from it.
    ///
    /// Always inlined, as is `attempt_peek` above it: left out of line, the compiler returned
    /// the record through the stack as two 8-byte stores that the caller read back as one
    /// 16-byte load, which the CPU cannot forward from the stores and stalls on (perf put a
    /// third of a receive on that load). Inlined, the record stays in registers: the code of a
    /// 4-byte round trip in one thread went from 67 to 40 ns (`rtt_one_thread_ns_4`).
    #[inline(always)]
    pub(crate) fn peek(&mut self) -> Result<Option<Record>, Corruption> {
        // At most one PAD precedes a record: after it the head is at offset 0, where
        // `decode_record` rejects a PAD.
        for _ in 0..2 {
            let w = self.ring.load_word(self.head, Ordering::Acquire);
            match decode_record(w, self.head, self.cap, self.max_message)? {
                RecordWord::Empty => return Ok(None),
                RecordWord::Pad(len) => self.head += len,
                RecordWord::Record(len) => {
                    return Ok(Some(Record {
                        offset: (self.head & (self.cap - 1)) as usize + RECORD_HEADER,
                        len,
                        next: self.head + record_size(len) as u64,
                    }))
                }
            }
        }
        unreachable!("decode_record rejects a PAD at offset 0")
    }

    /// Copies the payload of `r` into `dst[..r.len]`.
    #[inline(always)]
    pub(crate) fn read(&self, r: &Record, dst: &mut [u8]) {
        self.read_at(r, 0, &mut dst[..r.len]);
    }

    /// Copies `dst.len()` bytes of the payload of `r` from its byte `offset` into `dst`.
    /// Panics if the range is outside the payload.
    #[inline(always)]
    pub(crate) fn read_at(&self, r: &Record, offset: usize, dst: &mut [u8]) {
        check_range("read from a message", offset, dst.len(), r.len);
        let at = self.ring.data_at(r.offset + offset, dst.len());
        self.ring.region.copy_out(at, dst);
    }

    /// Raw address of the payload of `r`, for the C ABI's in-place reads (never made a Rust
    /// reference).
    #[cfg(not(loom))]
    pub(crate) fn payload_ptr(&self, r: &Record) -> *const u8 {
        let at = self.ring.data_at(r.offset, r.len);
        self.ring.region.ptr(at, r.len)
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
        self.ring.head_word().store(self.head, Ordering::Release);
        fence(Ordering::SeqCst);
        self.ring.wake_if_asleep(CTRL_TX_SLEEP);
    }

    /// Whether the producer has hung up.
    #[inline]
    pub(crate) fn producer_closed(&self) -> bool {
        self.ring.flag(CTRL_PRODUCER_CLOSED)
    }

    /// Announces that we are about to sleep on an empty ring. The caller must re-check (call
    /// [`peek`](Self::peek) again) before [`sleep`](Self::sleep).
    pub(crate) fn announce_sleep(&self) {
        self.ring.announce(CTRL_RX_SLEEP);
    }

    /// Sleeps until woken or `timeout_ns` passes, then withdraws the announcement.
    pub(crate) fn sleep(&self, timeout_ns: Option<u64>) {
        self.ring.sleep(CTRL_RX_SLEEP, timeout_ns);
    }

    /// Withdraws a sleep announcement without sleeping.
    pub(crate) fn cancel_sleep(&self) {
        self.ring.cancel(CTRL_RX_SLEEP);
    }

    /// Hangs up: sets `consumer_closed` and wakes the producer.
    pub(crate) fn close(&mut self) {
        self.publish();
        self.ring.hang_up(CTRL_CONSUMER_CLOSED, CTRL_TX_SLEEP);
    }
}
