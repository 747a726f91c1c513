//! The broker's side: open a heartbeat handed over by a cell and read its beats.
//!
//! Everything in the region is written by the cell, so nothing read from it is trusted:
//!
//! - the header is copied once with a volatile read and validated ([`Header::validate`]);
//! - `count` may only grow: a count that goes back is reported and ignored;
//! - a beat is accepted only through the seqlock check ([`layout::read`]), and only if its
//!   timestamp is not in the future and not before the previous accepted beat (with a small
//!   tolerance for threads that beat at the same moment);
//! - a target above [`MAX_TARGET_NS`] is reported as invalid.
//!
//! The mapping is read-only, so the broker cannot be made to write anywhere by the cell, and the
//! memfd is sealed against resizing (checked in [`crate::region::check`]), so loads never fault.
//! The only references formed over the cell's memory are to atomics (`&AtomicU64` and `&Slot`,
//! made of `UnsafeCell`s), for the duration of one load: a concurrent store by the cell is then
//! an ordinary data race between atomics, not undefined behaviour. Plain data (the header) is
//! only ever copied out.

use crate::error::HeartbeatError;
use crate::layout::{self, Beat, Header, Slot, COUNT_OFFSET, RING, RING_OFFSET, SLOT_SIZE};
use crate::region::{self, Mapping};
use crate::sync::{AtomicU64, Ordering};
use std::os::fd::{AsFd, OwnedFd};

/// The longest target accepted: one unit of work per hour.
pub const MAX_TARGET_NS: u64 = 3_600_000_000_000;
/// How far back a beat's timestamp may lie behind the previous accepted one (several threads
/// take their index and their timestamp in different orders).
pub const REORDER_TOLERANCE_NS: u64 = 1_000_000;
/// How far in the future (by the reader's clock) a timestamp may lie.
pub const FUTURE_TOLERANCE_NS: u64 = 1_000_000;

/// A heartbeat as the broker sees it.
#[derive(Debug)]
pub struct HeartbeatReader {
    map: Mapping,
    _fd: OwnedFd,
    name: String,
    last_count: u64,
    last_ts_ns: u64,
}

/// What one [`HeartbeatReader::read_new`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reading {
    /// Beats counted so far (never less than the previous reading's).
    pub count: u64,
    /// Beats counted since the previous reading.
    pub new_count: u64,
    /// The target, ns per unit (`None`: no target, or an invalid one; see `bad_target`).
    pub target_ns: Option<u64>,
    /// The new beats that could be read and passed every check, oldest first.
    pub beats: Vec<Beat>,
    /// New beats that could not be read: overwritten by later ones before we looked, or
    /// being written at the moment we looked.
    pub unreadable: u64,
    /// New beats whose timestamps failed the checks (future, or out of order).
    pub bad_timestamps: u64,
    /// The count went back (the cell rewrote it); ignored.
    pub count_went_back: bool,
    /// The target word holds a value above [`MAX_TARGET_NS`].
    pub bad_target: bool,
}

impl HeartbeatReader {
    /// Opens a heartbeat region handed over by a cell: checks the memfd's seals and size, maps
    /// it read-only and validates the header.
    pub fn open(fd: OwnedFd) -> Result<HeartbeatReader, HeartbeatError> {
        region::check(fd.as_fd())?;
        let map = Mapping::map(fd.as_fd(), false)?;
        // SAFETY: the mapping is at least size_of::<Header>() bytes and 8-aligned; Header is
        // plain integers (any bit pattern is valid), copied out with one volatile read and
        // never referenced in place.
        let header = unsafe { std::ptr::read_volatile(map.at(0).cast::<Header>()) };
        let name = header
            .validate()
            .map_err(|e| HeartbeatError::BadRegion(e.into()))?;
        let mut r = HeartbeatReader {
            map,
            _fd: fd,
            name,
            last_count: 0,
            last_ts_ns: 0,
        };
        // Beats made before the broker looked count from here on: the first reading's rate
        // must not include a backlog of unknown age.
        r.last_count = r.count_word().load(Ordering::Acquire);
        Ok(r)
    }

    /// The name in the header.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Beats counted so far, as the region says now (unchecked).
    pub fn raw_count(&self) -> u64 {
        self.count_word().load(Ordering::Acquire)
    }

    /// Reads what the cell did since the previous call. `now_ns` is the reader's
    /// `CLOCK_MONOTONIC`.
    pub fn read_new(&mut self, now_ns: u64) -> Reading {
        let mut out = Reading::default();
        let target = self.target_word().load(Ordering::Acquire);
        match target {
            0 => {}
            t if t <= MAX_TARGET_NS => out.target_ns = Some(t),
            _ => out.bad_target = true,
        }
        let count = self.count_word().load(Ordering::Acquire);
        if count < self.last_count {
            out.count_went_back = true;
            out.count = self.last_count;
            return out;
        }
        out.count = count;
        out.new_count = count - self.last_count;
        let first = self.last_count.max(count.saturating_sub(RING as u64));
        out.unreadable = first - self.last_count;
        for index in first..count {
            match layout::read(self.slot(index), index) {
                None => out.unreadable += 1,
                Some(b) => {
                    let future = b.ts_ns > now_ns.saturating_add(FUTURE_TOLERANCE_NS);
                    let back = b.ts_ns.saturating_add(REORDER_TOLERANCE_NS) < self.last_ts_ns;
                    if future || back || b.ts_ns == 0 {
                        out.bad_timestamps += 1;
                    } else {
                        self.last_ts_ns = self.last_ts_ns.max(b.ts_ns);
                        out.beats.push(b);
                    }
                }
            }
        }
        self.last_count = count;
        out
    }

    fn target_word(&self) -> &AtomicU64 {
        // SAFETY: an 8-aligned atomic inside our read-only mapping that lives as long as
        // `self`; the cell may store to it concurrently, which atomics allow (see module docs).
        unsafe { &*self.map.at(layout::TARGET_OFFSET).cast::<AtomicU64>() }
    }

    fn count_word(&self) -> &AtomicU64 {
        // SAFETY: as for `target_word`, at COUNT_OFFSET.
        unsafe { &*self.map.at(COUNT_OFFSET).cast::<AtomicU64>() }
    }

    fn slot(&self, index: u64) -> &Slot {
        let off = RING_OFFSET + (index as usize % RING) * SLOT_SIZE;
        // SAFETY: the slot lies inside the mapping (index reduced modulo RING), is 8-aligned and
        // made only of atomics; the cell may store to them concurrently (see module docs).
        unsafe { &*self.map.at(off).cast::<Slot>() }
    }
}
