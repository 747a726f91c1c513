//! The cell's side: create a heartbeat, declare a target, beat.

use crate::clock::now_ns;
use crate::error::HeartbeatError;
use crate::layout::{self, Slot, COUNT_OFFSET, RING, RING_OFFSET, SLOT_SIZE, TARGET_OFFSET};
use crate::region::{self, Mapping};
use crate::register::Link;
use crate::sync::{AtomicU64, Ordering};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

/// A performance target: how long one unit of work (a frame, a request) may take, or how many
/// units per second must be done. Stored as nanoseconds per unit (seed 004 section 5.1: "an
/// application with a desired rate of 30 frames per second would specify a performance target
/// of 33 ms per frame").
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Target {
    /// At most this long per unit of work.
    PerUnit(Duration),
    /// At least this many units per second.
    Rate(f64),
}

impl Target {
    /// The target in nanoseconds per unit of work.
    pub fn ns_per_unit(self) -> Result<u64, HeartbeatError> {
        let ns = match self {
            Target::PerUnit(d) => d.as_nanos().min(u64::MAX as u128) as u64,
            Target::Rate(r) if r.is_finite() && r > 0.0 => (1e9 / r).round() as u64,
            Target::Rate(r) => return Err(HeartbeatError::BadTarget(format!("{r} per second"))),
        };
        if ns == 0 {
            return Err(HeartbeatError::BadTarget(format!("{self:?}")));
        }
        Ok(ns)
    }
}

/// A heartbeat: the cell beats once per unit of work; the broker reads the beats from shared
/// memory. Beating is a `fetch_add`, a vDSO clock read and four stores: no system call, no
/// lock, safe from any number of threads at once.
#[derive(Debug)]
pub struct Heartbeat {
    map: Mapping,
    fd: OwnedFd,
    name: String,
    _link: Option<Link>,
}

impl Heartbeat {
    /// Creates a heartbeat that no broker knows of yet (see [`Heartbeat::register`]).
    pub fn new(name: &str, target: Option<Target>) -> Result<Heartbeat, HeartbeatError> {
        if !layout::valid_name(name) {
            return Err(HeartbeatError::BadName(name.into()));
        }
        let ns = target.map(Target::ns_per_unit).transpose()?.unwrap_or(0);
        let fd = region::create(name)?;
        let map = Mapping::map(fd.as_fd(), true)?;
        let hb = Heartbeat {
            map,
            fd,
            name: name.into(),
            _link: None,
        };
        hb.target_word().store(ns, Ordering::Release);
        Ok(hb)
    }

    /// Creates a heartbeat and registers it with the broker listening on its default socket
    /// ([`crate::register::socket_path`]). Registration happens on a helper thread that
    /// retries while no broker listens and registers again after a broker restart, so this
    /// never waits for the broker and beats are never lost to its absence (they are counted
    /// in shared memory either way).
    pub fn register(name: &str, target: Option<Target>) -> Result<Heartbeat, HeartbeatError> {
        Heartbeat::register_at(name, target, &crate::register::socket_path())
    }

    /// [`Heartbeat::register`] with an explicit broker socket.
    pub fn register_at(
        name: &str,
        target: Option<Target>,
        socket: &Path,
    ) -> Result<Heartbeat, HeartbeatError> {
        let mut hb = Heartbeat::new(name, target)?;
        let fd = hb.fd.try_clone().map_err(|e| HeartbeatError::Os {
            what: "duplicating the heartbeat memfd".into(),
            source: e,
        })?;
        hb._link = Some(Link::start(socket.to_path_buf(), name.to_string(), fd)?);
        Ok(hb)
    }

    /// One unit of work is done.
    #[inline]
    pub fn beat(&self) {
        self.beat_with(0)
    }

    /// One unit of work is done, and `value` is its demand: the CPU nanoseconds it used (a CPU
    /// heartbeat), or its size in bytes (a heartbeat named `NAME.net` or
    /// `NAME@LABEL.net`, of one of the cell's network flows). The PACORA broker sizes the cell
    /// from it (docs/broker.md, "Beats that carry demands"); 0 means none.
    #[inline]
    pub fn beat_with(&self, value: u64) {
        let index = self.count_word().fetch_add(1, Ordering::Relaxed);
        // A beat that loses its slot to another thread is still counted (see `layout`).
        let _ = layout::publish(self.slot(index), index, now_ns(), value);
    }

    /// Changes the target (takes effect at the broker's next decision).
    pub fn set_target(&self, target: Option<Target>) -> Result<(), HeartbeatError> {
        let ns = target.map(Target::ns_per_unit).transpose()?.unwrap_or(0);
        self.target_word().store(ns, Ordering::Release);
        Ok(())
    }

    /// The target in ns per unit of work (0: none).
    pub fn target_ns(&self) -> u64 {
        self.target_word().load(Ordering::Acquire)
    }

    /// Beats so far.
    pub fn count(&self) -> u64 {
        self.count_word().load(Ordering::Relaxed)
    }

    /// The heartbeat's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The memfd behind it (to hand to a broker by other means).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    fn target_word(&self) -> &AtomicU64 {
        // SAFETY: TARGET_OFFSET is an 8-aligned offset inside our own writable mapping, which
        // lives as long as `self`; only this process writes it (the broker maps it read-only)
        // and it is only ever accessed atomically.
        unsafe { &*self.map.at(TARGET_OFFSET).cast::<AtomicU64>() }
    }

    fn count_word(&self) -> &AtomicU64 {
        // SAFETY: as for `target_word`, at COUNT_OFFSET.
        unsafe { &*self.map.at(COUNT_OFFSET).cast::<AtomicU64>() }
    }

    #[inline(always)]
    fn slot(&self, index: u64) -> &Slot {
        let off = RING_OFFSET + (index as usize % RING) * SLOT_SIZE;
        // SAFETY: the slot lies inside our mapping (index is reduced modulo RING), is 8-aligned,
        // consists only of atomics, and only this process writes it.
        unsafe { &*self.map.at(off).cast::<Slot>() }
    }
}
