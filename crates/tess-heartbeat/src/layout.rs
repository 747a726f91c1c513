//! The shared-memory layout of one heartbeat, and the seqlock protocol on its ring.
//!
//! ```text
//!  offset  size        contents                                        written by
//!  ------  ----------  ----------------------------------------------  ------------------
//!  0       128         Header: magic, version, ring length, name       creator, once, before
//!                                                                      the memfd is sealed
//!  128     8           target_ns: ns per unit of work (0: no target)   the cell, any time
//!  256     8           count: beats begun so far (fetch_add)           the cell, per beat
//!  384     32 * RING   ring of Slot { seq, ts_ns, value, _ }           the cell, per beat
//! ```
//!
//! A beat with index `i` (the value `count` had before the beat's `fetch_add`) goes to slot
//! `i % RING`, with the seqlock protocol of Boehm, "Can seqlocks get along with programming
//! language memory models?" (MSPC 2012), every field an atomic:
//!
//! ```text
//!  writer                                   reader of beat i
//!  CAS seq: even < 2i+1 -> 2i+1 (relaxed)   s1 = seq            (acquire); s1 == 2i+2 or skip
//!  fence(release)                           ts, value           (relaxed)
//!  ts, value               (relaxed)        fence(acquire)
//!  seq   = 2i+2            (release)        s2 = seq            (relaxed); valid iff s1 == s2
//! ```
//!
//! So a reader never sees a torn beat: a slot being rewritten (or rewritten for a later beat
//! `i + RING`) reads as "not beat i". The reader trusts nothing else either: the header is
//! copied once and validated, `count` only has to be plausible, and each timestamp is checked
//! against the reader's own clock (see [`crate::reader`]).
//!
//! Several threads may beat on one heartbeat: the `fetch_add` on `count` gives each its own
//! index, and a writer claims its slot with a compare-and-swap from an even (complete), older
//! sequence to its odd one, so two writers that meet on one slot (one was preempted while the
//! ring wrapped) never interleave: the loser's beat is counted but not kept in the ring.

use crate::sync::{fence, AtomicU64, Ordering};

/// `b"TESSBEAT"` read as a little-endian u64.
pub const MAGIC: u64 = u64::from_le_bytes(*b"TESSBEAT");
/// Layout version; bumped on any incompatible change of this module.
pub const LAYOUT_VERSION: u32 = 1;
/// Beats kept in the ring (a power of two): a broker that reads once per second sees every
/// beat of a cell beating up to 1024 times per second, and the count of all of them.
pub const RING: usize = 1024;
/// Longest heartbeat name, bytes.
pub const MAX_NAME: usize = 64;
/// Offset of `target_ns`.
pub const TARGET_OFFSET: usize = 128;
/// Offset of `count`.
pub const COUNT_OFFSET: usize = 256;
/// Offset of the ring.
pub const RING_OFFSET: usize = 384;
/// Size of one slot.
pub const SLOT_SIZE: usize = 32;
/// Bytes of the whole region.
pub const REGION_LEN: usize = RING_OFFSET + RING * SLOT_SIZE;

/// The header at offset 0, as the creator writes it. Plain integers: the reader copies it
/// once with a volatile read and validates the copy, never uses it in place.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Header {
    /// [`MAGIC`].
    pub magic: u64,
    /// [`LAYOUT_VERSION`].
    pub version: u32,
    /// [`RING`].
    pub ring: u32,
    /// Length of `name` in bytes.
    pub name_len: u32,
    /// Reserved, zero.
    pub _reserved: u32,
    /// The heartbeat's name (UTF-8, `name_len` bytes).
    pub name: [u8; MAX_NAME],
}

const _: () = assert!(std::mem::size_of::<Header>() <= TARGET_OFFSET);
const _: () = assert!(std::mem::size_of::<Slot>() == SLOT_SIZE);

impl Header {
    /// A header for a heartbeat called `name` (at most [`MAX_NAME`] bytes, checked by caller).
    pub fn new(name: &str) -> Header {
        let mut buf = [0u8; MAX_NAME];
        buf[..name.len()].copy_from_slice(name.as_bytes());
        Header {
            magic: MAGIC,
            version: LAYOUT_VERSION,
            ring: RING as u32,
            name_len: name.len() as u32,
            _reserved: 0,
            name: buf,
        }
    }

    /// The name, if the header is one this version wrote.
    pub fn validate(&self) -> Result<String, &'static str> {
        if self.magic != MAGIC {
            return Err("bad magic (not a tess heartbeat)");
        }
        if self.version != LAYOUT_VERSION {
            return Err("unknown layout version");
        }
        if self.ring as usize != RING {
            return Err("unexpected ring length");
        }
        let len = self.name_len as usize;
        if len == 0 || len > MAX_NAME {
            return Err("name length out of range");
        }
        let name = std::str::from_utf8(&self.name[..len]).map_err(|_| "name is not UTF-8")?;
        if !valid_name(name) {
            return Err("name has characters other than a-z A-Z 0-9 - _ . @");
        }
        Ok(name.to_string())
    }
}

/// Checks a heartbeat name: 1-64 of `a-z A-Z 0-9 - _ . @` (`@` separates a flow heartbeat's
/// name from its flow label, `NAME@LABEL.net`).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.@".contains(&b))
}

/// One beat in the ring.
#[repr(C)]
#[derive(Debug, Default)]
pub struct Slot {
    /// `2i+1` while beat `i` is being written, `2i+2` once it is complete.
    pub seq: AtomicU64,
    /// `CLOCK_MONOTONIC` of the beat, ns.
    pub ts_ns: AtomicU64,
    /// The value the cell measured (0: none).
    pub value: AtomicU64,
    _pad: AtomicU64,
}

/// A beat as read from the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Beat {
    /// Its index (0 for the first beat).
    pub index: u64,
    /// `CLOCK_MONOTONIC` when it was made, ns.
    pub ts_ns: u64,
    /// The value the cell reported with it (0: none).
    pub value: u64,
}

/// Publishes beat `index` into its slot (the writer's half of the seqlock). Returns `false`,
/// leaving the slot alone, if another writer holds the slot or has already put a later beat
/// there: the beat is then counted but not in the ring.
#[inline(always)]
pub fn publish(slot: &Slot, index: u64, ts_ns: u64, value: u64) -> bool {
    let writing = 2 * index + 1;
    // Claim the slot: only from a complete, older beat. A single writer always succeeds at once;
    // two writers meeting on one slot (one was preempted while the ring wrapped) never
    // interleave their stores.
    let seen = slot.seq.load(Ordering::Relaxed);
    if seen & 1 == 1 || seen >= writing {
        return false;
    }
    // Acquire: the previous owner's stores happen before ours, so ours come later in every
    // field's modification order (loom found the relaxed version wrong).
    if slot
        .seq
        .compare_exchange(seen, writing, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        return false;
    }
    fence(Ordering::Release);
    slot.ts_ns.store(ts_ns, Ordering::Relaxed);
    slot.value.store(value, Ordering::Relaxed);
    slot.seq.store(writing + 1, Ordering::Release);
    true
}

/// Reads beat `index` from its slot (the reader's half): `None` if the slot holds another
/// beat, or this one half-written.
#[inline]
pub fn read(slot: &Slot, index: u64) -> Option<Beat> {
    let want = index.checked_mul(2)?.checked_add(2)?;
    let s1 = slot.seq.load(Ordering::Acquire);
    if s1 != want {
        return None;
    }
    let ts_ns = slot.ts_ns.load(Ordering::Relaxed);
    let value = slot.value.load(Ordering::Relaxed);
    fence(Ordering::Acquire);
    let s2 = slot.seq.load(Ordering::Relaxed);
    (s1 == s2).then_some(Beat {
        index,
        ts_ns,
        value,
    })
}
