//! Channels and their endpoints: creation, opening from descriptors, and the operation families.

use crate::error::{
    OpenError, RecvError, RecvTimeoutError, SendError, SendTimeoutError, TryRecvError, TrySendError,
};
use crate::layout::{ctrl_offset, Geometry, PAGE};
use crate::ring::{Consumer, Corruption, PlaceError, Placement, Producer, Record, RingRef};
use crate::shm::{self, Mapping};
use crate::wait::{deadline_after, Attempt, Sleeper, Wait, WaitEnd, Waiter};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Parameters fixed when a channel is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelOptions {
    /// Bytes of ring per direction; a power of two, at least
    /// `2 * (8 + max_message_size rounded up to 8) + 8`.
    pub capacity: usize,
    /// Largest message, in bytes.
    pub max_message_size: usize,
}

impl Default for ChannelOptions {
    /// 64 KiB per direction, messages up to 4480 bytes (the largest size of the seed tables).
    fn default() -> Self {
        ChannelOptions {
            capacity: 64 * 1024,
            max_message_size: 4480,
        }
    }
}

impl ChannelOptions {
    /// Options for messages up to `max_message_size` bytes, with a ring of at least 64 KiB.
    pub fn for_max_message(max_message_size: usize) -> ChannelOptions {
        ChannelOptions {
            capacity: Geometry::capacity_for(max_message_size)
                .next_power_of_two()
                .max(64 * 1024),
            max_message_size,
        }
    }
}

/// Which end of a channel: A sends on ring 0 and receives on ring 1, B the reverse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Side {
    /// Ring 0 out, ring 1 in.
    A = 0,
    /// Ring 1 out, ring 0 in.
    B = 1,
}

impl Side {
    /// The other side.
    pub fn peer(self) -> Side {
        match self {
            Side::A => Side::B,
            Side::B => Side::A,
        }
    }
    fn tx_ring(self) -> usize {
        self as usize
    }
    fn rx_ring(self) -> usize {
        1 - self as usize
    }
}

/// Everything a process needs to open one end of a channel: hand these to it (see
/// [`handoff`](crate::handoff)), then drop your copies.
#[derive(Debug)]
pub struct EndpointFds {
    /// The sealed memfd holding both rings.
    pub memfd: OwnedFd,
    /// This side's end of the liveness socket pair; the peer holds the other end.
    pub liveness: OwnedFd,
    /// Which end this is.
    pub side: Side,
}

/// Namespace of the channel constructors.
#[derive(Debug)]
pub struct Channel;

impl Channel {
    /// Creates a channel and returns the descriptors of both ends, for a broker (tessd) to hand
    /// to two processes. Nothing stays mapped in the caller.
    pub fn create(opts: &ChannelOptions) -> Result<(EndpointFds, EndpointFds), OpenError> {
        let g = Geometry::new(opts.capacity, opts.max_message_size)?;
        let memfd = shm::create_memfd(g.total_size())?;
        {
            let map = Mapping::map(memfd.as_fd(), g.total_size())?;
            map.write_header(&g.header(std::process::id(), tess_sched::clock::now_ns()));
        }
        let memfd_b = memfd
            .try_clone()
            .map_err(|e| OpenError::io("dup of the channel memfd", e))?;
        let (la, lb) = shm::liveness_pair()?;
        Ok((
            EndpointFds {
                memfd,
                liveness: la,
                side: Side::A,
            },
            EndpointFds {
                memfd: memfd_b,
                liveness: lb,
                side: Side::B,
            },
        ))
    }

    /// Creates a channel and opens both ends in this process (threads, tests). To hand an end
    /// to another process use [`create`](Self::create) and [`handoff`](crate::handoff).
    pub fn pair(opts: &ChannelOptions) -> Result<(Endpoint, Endpoint), OpenError> {
        let (a, b) = Channel::create(opts)?;
        Ok((Endpoint::from_fds(a)?, Endpoint::from_fds(b)?))
    }
}

/// State shared by the two halves of an endpoint.
#[derive(Debug)]
struct Shared {
    // Owned so that it is unmapped / closed when the last half goes; read only by tests.
    #[allow(dead_code)]
    map: Mapping,
    #[allow(dead_code)]
    memfd: OwnedFd,
    liveness: OwnedFd,
    side: Side,
    geometry: Geometry,
    peer_dead: AtomicBool,
}

impl Shared {
    fn peer_alive(&self) -> bool {
        if self.peer_dead.load(Ordering::Relaxed) {
            return false;
        }
        if shm::peer_alive(self.liveness.as_fd()) {
            return true;
        }
        self.peer_dead.store(true, Ordering::Relaxed);
        false
    }

    fn peer_known_dead(&self) -> bool {
        self.peer_dead.load(Ordering::Relaxed)
    }
}

/// One end of a bidirectional channel: a [`Sender`] and a [`Receiver`].
///
/// Every operation of the two halves is available here too; [`split`](Self::split) separates
/// them so that two threads can send and receive independently.
#[derive(Debug)]
pub struct Endpoint {
    tx: Sender,
    rx: Receiver,
}

/// The sending half of an endpoint.
#[derive(Debug)]
pub struct Sender {
    prod: Producer,
    waiter: Waiter,
    poisoned: Option<Corruption>,
    hang_up_on_drop: bool,
    shared: Arc<Shared>,
    /// Private staging buffer of [`WriteSlot::buffer`].
    stage: Vec<u8>,
}

/// The receiving half of an endpoint.
#[derive(Debug)]
pub struct Receiver {
    cons: Consumer,
    waiter: Waiter,
    poisoned: Option<Corruption>,
    hang_up_on_drop: bool,
    shared: Arc<Shared>,
    /// Private copies of received messages ([`Receiver::recv_batch`], [`ReadSlot::bytes`]).
    scratch: Vec<u8>,
}

impl Endpoint {
    /// Opens a channel end from its descriptors, validating the memfd (seals, size) and the
    /// header (every field re-derived from the capacity). Never trusts the shared memory.
    pub fn from_fds(fds: EndpointFds) -> Result<Endpoint, OpenError> {
        let size = shm::check_memfd(fds.memfd.as_fd())?;
        let max_total = Geometry {
            capacity: crate::layout::MAX_CAPACITY,
            max_message: 0,
        }
        .total_size() as u64;
        if size < PAGE as u64 || size > max_total {
            return Err(OpenError::Size {
                found: size,
                expected: PAGE as u64,
            });
        }
        let map = Mapping::map(fds.memfd.as_fd(), size as usize)?;
        let g = Geometry::validate(&map.read_header())?;
        if g.total_size() as u64 != size {
            return Err(OpenError::Size {
                found: size,
                expected: g.total_size() as u64,
            });
        }
        let side = fds.side;
        // The mapping's size was checked against the geometry; the Arc<Shared> owning `map` is
        // stored next to every RingRef made from its region.
        let region = map.region();
        let ring = |r: usize| RingRef::new(region, ctrl_offset(r), g.data_offset(r), g.capacity);
        let prod = Producer::new(ring(side.tx_ring()), g.capacity, g.max_message);
        let cons = Consumer::new(ring(side.rx_ring()), g.capacity, g.max_message);
        let shared = Arc::new(Shared {
            map,
            memfd: fds.memfd,
            liveness: fds.liveness,
            side,
            geometry: g,
            peer_dead: AtomicBool::new(false),
        });
        Ok(Endpoint {
            tx: Sender {
                prod,
                waiter: Waiter::default(),
                poisoned: None,
                hang_up_on_drop: true,
                shared: shared.clone(),
                stage: Vec::new(),
            },
            rx: Receiver {
                cons,
                waiter: Waiter::default(),
                poisoned: None,
                hang_up_on_drop: true,
                shared,
                scratch: Vec::new(),
            },
        })
    }

    /// Receives a channel end over the Unix socket `sock` (see
    /// [`handoff::recv_endpoint`](crate::handoff::recv_endpoint)) and opens it.
    pub fn recv_from(sock: impl AsFd) -> Result<Endpoint, OpenError> {
        Endpoint::from_fds(crate::handoff::recv_endpoint(sock.as_fd())?)
    }

    /// Separates the two halves.
    pub fn split(self) -> (Sender, Receiver) {
        (self.tx, self.rx)
    }

    /// The sending half.
    pub fn sender(&mut self) -> &mut Sender {
        &mut self.tx
    }

    /// The receiving half.
    pub fn receiver(&mut self) -> &mut Receiver {
        &mut self.rx
    }

    /// Both halves at once, e.g. to copy a peeked message straight into a reserved slot.
    pub fn halves(&mut self) -> (&mut Sender, &mut Receiver) {
        (&mut self.tx, &mut self.rx)
    }

    /// Which end this is.
    pub fn side(&self) -> Side {
        self.tx.shared.side
    }

    /// Bytes of ring per direction.
    pub fn capacity(&self) -> usize {
        self.tx.shared.geometry.capacity
    }

    /// Largest message, in bytes.
    pub fn max_message_size(&self) -> usize {
        self.tx.prod.max_message()
    }

    /// Sets how both halves wait.
    pub fn set_wait(&mut self, wait: Wait) {
        self.tx.set_wait(wait);
        self.rx.set_wait(wait);
    }

    /// Sets the longest time a waiting operation goes without checking that the peer lives.
    pub fn set_liveness_interval(&mut self, interval: Duration) {
        self.tx.set_liveness_interval(interval);
        self.rx.set_liveness_interval(interval);
    }

    /// Whether the peer process still holds its end (a `poll` of the liveness socket).
    pub fn is_peer_alive(&self) -> bool {
        self.tx.shared.peer_alive()
    }

    /// See [`Sender::send`].
    #[inline]
    pub fn send(&mut self, msg: &[u8]) -> Result<(), SendError> {
        self.tx.send(msg)
    }
    /// See [`Sender::try_send`].
    pub fn try_send(&mut self, msg: &[u8]) -> Result<(), TrySendError> {
        self.tx.try_send(msg)
    }
    /// See [`Sender::send_timeout`].
    pub fn send_timeout(&mut self, msg: &[u8], timeout: Duration) -> Result<(), SendTimeoutError> {
        self.tx.send_timeout(msg, timeout)
    }
    /// See [`Sender::send_batch`].
    pub fn send_batch<M: AsRef<[u8]>>(&mut self, msgs: &[M]) -> Result<(), SendError> {
        self.tx.send_batch(msgs)
    }
    /// See [`Sender::try_send_batch`].
    pub fn try_send_batch<M: AsRef<[u8]>>(&mut self, msgs: &[M]) -> Result<usize, TrySendError> {
        self.tx.try_send_batch(msgs)
    }
    /// See [`Sender::reserve`].
    #[inline]
    pub fn reserve(&mut self, len: usize) -> Result<WriteSlot<'_>, SendError> {
        self.tx.reserve(len)
    }
    /// See [`Sender::try_reserve`].
    #[inline]
    pub fn try_reserve(&mut self, len: usize) -> Result<WriteSlot<'_>, TrySendError> {
        self.tx.try_reserve(len)
    }
    /// See [`Sender::reserve_timeout`].
    pub fn reserve_timeout(
        &mut self,
        len: usize,
        timeout: Duration,
    ) -> Result<WriteSlot<'_>, SendTimeoutError> {
        self.tx.reserve_timeout(len, timeout)
    }
    /// See [`Receiver::recv`].
    #[inline]
    pub fn recv(&mut self, buf: &mut [u8]) -> Result<usize, RecvError> {
        self.rx.recv(buf)
    }
    /// See [`Receiver::try_recv`].
    pub fn try_recv(&mut self, buf: &mut [u8]) -> Result<usize, TryRecvError> {
        self.rx.try_recv(buf)
    }
    /// See [`Receiver::recv_timeout`].
    pub fn recv_timeout(
        &mut self,
        buf: &mut [u8],
        timeout: Duration,
    ) -> Result<usize, RecvTimeoutError> {
        self.rx.recv_timeout(buf, timeout)
    }
    /// See [`Receiver::recv_batch`].
    pub fn recv_batch(&mut self, max: usize, f: impl FnMut(&[u8])) -> Result<usize, RecvError> {
        self.rx.recv_batch(max, f)
    }
    /// See [`Receiver::try_recv_batch`].
    pub fn try_recv_batch(
        &mut self,
        max: usize,
        f: impl FnMut(&[u8]),
    ) -> Result<usize, TryRecvError> {
        self.rx.try_recv_batch(max, f)
    }
    /// See [`Receiver::peek`].
    #[inline]
    pub fn peek(&mut self) -> Result<ReadSlot<'_>, RecvError> {
        self.rx.peek()
    }
    /// See [`Receiver::peek_timeout`].
    pub fn peek_timeout(&mut self, timeout: Duration) -> Result<ReadSlot<'_>, RecvTimeoutError> {
        self.rx.peek_timeout(timeout)
    }
    /// See [`Receiver::try_peek`].
    #[inline]
    pub fn try_peek(&mut self) -> Result<ReadSlot<'_>, TryRecvError> {
        self.rx.try_peek()
    }

    /// Closes this end without telling the peer (for a process that forked and leaves the end
    /// to its child). Only the benchmark and the tests do that.
    #[cfg(any(test, feature = "bench"))]
    pub(crate) fn discard(mut self) {
        self.tx.hang_up_on_drop = false;
        self.rx.hang_up_on_drop = false;
    }

    /// The shared mapping (base, length), for tests that play a hostile peer.
    #[cfg(test)]
    pub(crate) fn raw_memory(&self) -> (*mut u8, usize) {
        (self.tx.shared.map.base().as_ptr(), self.tx.shared.map.len())
    }

    /// A duplicate of the memfd (tests that map it themselves).
    #[cfg(test)]
    pub(crate) fn memfd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.tx.shared.memfd.as_fd()
    }
}

/// Adapter giving the waiter access to one half's sleep word and liveness.
struct Half<'a, R> {
    ring: &'a mut R,
    shared: &'a Shared,
}

impl Sleeper for Half<'_, Producer> {
    fn announce_sleep(&self) {
        self.ring.announce_sleep();
    }
    fn sleep(&self, timeout_ns: Option<u64>) {
        self.ring.sleep(timeout_ns);
    }
    fn cancel_sleep(&self) {
        self.ring.cancel_sleep();
    }
    fn peer_alive(&self) -> bool {
        self.shared.peer_alive()
    }
}

impl Sleeper for Half<'_, Consumer> {
    fn announce_sleep(&self) {
        self.ring.announce_sleep();
    }
    fn sleep(&self, timeout_ns: Option<u64>) {
        self.ring.sleep(timeout_ns);
    }
    fn cancel_sleep(&self) {
        self.ring.cancel_sleep();
    }
    fn peer_alive(&self) -> bool {
        self.shared.peer_alive()
    }
}

/// One attempt to place a record of `len` bytes.
#[inline]
fn attempt_place(
    prod: &mut Producer,
    shared: &Shared,
    len: usize,
) -> Attempt<Placement, SendError> {
    if prod.consumer_closed() || shared.peer_known_dead() {
        return Attempt::Disconnected;
    }
    match prod.place(len) {
        Ok(p) => Attempt::Ready(p),
        Err(PlaceError::Full) => Attempt::NotYet,
        Err(PlaceError::TooLarge) => Attempt::Fail(SendError::TooLarge {
            len,
            max: prod.max_message(),
        }),
        Err(PlaceError::Corrupted(c)) => Attempt::Fail(SendError::Corrupted(c)),
    }
}

impl Sender {
    /// Sets how blocking sends wait for room.
    pub fn set_wait(&mut self, wait: Wait) {
        self.waiter.mode = wait;
    }

    /// See [`Endpoint::set_liveness_interval`].
    pub fn set_liveness_interval(&mut self, interval: Duration) {
        self.waiter.liveness_interval_ns = tess_sched::clock::ns(interval).max(1);
    }

    /// Largest message, in bytes.
    pub fn max_message_size(&self) -> usize {
        self.prod.max_message()
    }

    /// The current spin budget of [`Wait::Adaptive`].
    pub fn spin_budget(&self) -> Duration {
        self.waiter.spin_budget()
    }

    /// Whether a single-message send pushes the message's cache lines out to the shared
    /// last-level cache (`CLDEMOTE` on x86-64; default on), so that the receiver's misses are
    /// served from there rather than by snooping this core, and claims the lines of the next
    /// message for writing (`PREFETCHW`) while the caller waits for an answer. Lowers latency;
    /// batches are never pushed. Turn off for a sender that streams single messages as fast as
    /// it can.
    pub fn set_demote(&mut self, on: bool) {
        self.prod.demote = on;
    }

    /// Room for a record of `len` bytes, waiting as `deadline` says (`Some(0)`: try once). The
    /// first attempt is inline: a send into a ring with room costs no call into the waiter.
    #[inline]
    fn place(
        &mut self,
        len: usize,
        deadline: Option<u64>,
    ) -> Result<Placement, WaitEnd<SendError>> {
        if let Some(c) = self.poisoned {
            return Err(WaitEnd::Fail(SendError::Corrupted(c)));
        }
        let r = match attempt_place(&mut self.prod, &self.shared, len) {
            Attempt::Ready(p) => return Ok(p),
            Attempt::NotYet if deadline == Some(0) => Err(WaitEnd::Timeout),
            Attempt::NotYet => self.wait_for_room(len, deadline),
            Attempt::Disconnected => Err(WaitEnd::Disconnected),
            Attempt::Fail(e) => Err(WaitEnd::Fail(e)),
        };
        if let Err(WaitEnd::Fail(SendError::Corrupted(c))) = r {
            self.poisoned = Some(c);
        }
        r
    }

    #[inline(never)]
    fn wait_for_room(
        &mut self,
        len: usize,
        deadline: Option<u64>,
    ) -> Result<Placement, WaitEnd<SendError>> {
        let shared = &*self.shared;
        let mut side = Half {
            ring: &mut self.prod,
            shared,
        };
        self.waiter.block_on(&mut side, deadline, |s| {
            attempt_place(s.ring, s.shared, len)
        })
    }

    fn send_inner(&mut self, msg: &[u8], deadline: Option<u64>) -> Result<(), WaitEnd<SendError>> {
        let p = self.place(msg.len(), deadline)?;
        self.prod.write(&p, msg);
        self.prod.commit(p, msg.len());
        self.prod.publish();
        Ok(())
    }

    /// Sends `msg`, waiting for room as [`set_wait`](Self::set_wait) says.
    #[inline]
    pub fn send(&mut self, msg: &[u8]) -> Result<(), SendError> {
        self.send_inner(msg, None).map_err(send_err)
    }

    /// Sends `msg` if there is room now.
    pub fn try_send(&mut self, msg: &[u8]) -> Result<(), TrySendError> {
        self.send_inner(msg, Some(0)).map_err(|e| match e {
            WaitEnd::Timeout => TrySendError::Full,
            WaitEnd::Disconnected => TrySendError::Disconnected,
            WaitEnd::Fail(e) => e.into(),
        })
    }

    /// Sends `msg`, waiting at most `timeout` for room.
    pub fn send_timeout(&mut self, msg: &[u8], timeout: Duration) -> Result<(), SendTimeoutError> {
        self.send_inner(msg, Some(deadline_after(timeout).max(1)))
            .map_err(send_timeout_err)
    }

    /// Sends as many of `msgs` as fit now, in order, published together (one Release store, at
    /// most one wake-up). Returns how many were sent; `Full` if none fit.
    pub fn try_send_batch<M: AsRef<[u8]>>(&mut self, msgs: &[M]) -> Result<usize, TrySendError> {
        if let Some(m) = msgs
            .iter()
            .find(|m| m.as_ref().len() > self.prod.max_message())
        {
            return Err(TrySendError::TooLarge {
                len: m.as_ref().len(),
                max: self.prod.max_message(),
            });
        }
        if let Some(c) = self.poisoned {
            return Err(TrySendError::Corrupted(c));
        }
        if self.prod.consumer_closed() || self.shared.peer_known_dead() {
            return Err(TrySendError::Disconnected);
        }
        let mut n = 0;
        let mut corrupted = None;
        for m in msgs {
            let m = m.as_ref();
            match self.prod.place(m.len()) {
                Ok(p) => {
                    self.prod.write(&p, m);
                    self.prod.commit(p, m.len());
                    n += 1;
                }
                Err(PlaceError::Full) => break,
                Err(PlaceError::TooLarge) => unreachable!("lengths checked above"),
                Err(PlaceError::Corrupted(c)) => {
                    self.poisoned = Some(c);
                    corrupted = Some(c);
                    break;
                }
            }
        }
        self.prod.publish();
        match (n, corrupted) {
            (0, Some(c)) => Err(TrySendError::Corrupted(c)),
            (0, None) if !msgs.is_empty() => Err(TrySendError::Full),
            _ => Ok(n),
        }
    }

    /// Sends all of `msgs`, in order, publishing whatever fits at once and waiting for room in
    /// between.
    pub fn send_batch<M: AsRef<[u8]>>(&mut self, msgs: &[M]) -> Result<(), SendError> {
        let mut rest = msgs;
        while !rest.is_empty() {
            match self.try_send_batch(rest) {
                Ok(n) => rest = &rest[n..],
                Err(TrySendError::Full) => {
                    // Wait for room for the next one, then go on batching.
                    let m = rest[0].as_ref();
                    self.send(m)?;
                    rest = &rest[1..];
                }
                Err(TrySendError::Disconnected) => return Err(SendError::Disconnected),
                Err(TrySendError::TooLarge { len, max }) => {
                    return Err(SendError::TooLarge { len, max })
                }
                Err(TrySendError::Corrupted(c)) => return Err(SendError::Corrupted(c)),
            }
        }
        Ok(())
    }

    /// Lends a slot for a message of up to `len` bytes, waiting for room.
    #[inline]
    pub fn reserve(&mut self, len: usize) -> Result<WriteSlot<'_>, SendError> {
        let p = self.place(len, None).map_err(send_err)?;
        Ok(WriteSlot {
            tx: self,
            p,
            staged: false,
        })
    }

    /// Lends a slot for a message of up to `len` bytes if there is room now.
    #[inline]
    pub fn try_reserve(&mut self, len: usize) -> Result<WriteSlot<'_>, TrySendError> {
        let p = self.place(len, Some(0)).map_err(|e| match e {
            WaitEnd::Timeout => TrySendError::Full,
            WaitEnd::Disconnected => TrySendError::Disconnected,
            WaitEnd::Fail(e) => e.into(),
        })?;
        Ok(WriteSlot {
            tx: self,
            p,
            staged: false,
        })
    }

    /// Lends a slot for a message of up to `len` bytes, waiting at most `timeout` for room.
    pub fn reserve_timeout(
        &mut self,
        len: usize,
        timeout: Duration,
    ) -> Result<WriteSlot<'_>, SendTimeoutError> {
        let p = self
            .place(len, Some(deadline_after(timeout).max(1)))
            .map_err(send_timeout_err)?;
        Ok(WriteSlot {
            tx: self,
            p,
            staged: false,
        })
    }

    /// Low-level reserve for the C ABI: a placement the caller must commit before any other
    /// operation on this sender.
    pub(crate) fn reserve_raw(
        &mut self,
        len: usize,
        deadline: Option<u64>,
    ) -> Result<(Placement, *mut u8), WaitEnd<SendError>> {
        let p = self.place(len, deadline)?;
        let ptr = self.prod.payload_ptr(&p);
        Ok((p, ptr))
    }

    /// Commits a placement from [`reserve_raw`](Self::reserve_raw).
    pub(crate) fn commit_raw(&mut self, p: Placement, len: usize) {
        self.prod.commit(p, len);
        self.prod.publish();
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        if self.hang_up_on_drop {
            self.prod.close();
        }
    }
}

fn send_err(e: WaitEnd<SendError>) -> SendError {
    match e {
        WaitEnd::Timeout => unreachable!("no deadline"),
        WaitEnd::Disconnected => SendError::Disconnected,
        WaitEnd::Fail(e) => e,
    }
}

fn send_timeout_err(e: WaitEnd<SendError>) -> SendTimeoutError {
    match e {
        WaitEnd::Timeout => SendTimeoutError::Timeout,
        WaitEnd::Disconnected => SendTimeoutError::Disconnected,
        WaitEnd::Fail(e) => e.into(),
    }
}

fn recv_err(e: WaitEnd<RecvError>) -> RecvError {
    match e {
        WaitEnd::Timeout => unreachable!("no deadline"),
        WaitEnd::Disconnected => RecvError::Disconnected,
        WaitEnd::Fail(e) => e,
    }
}

fn try_recv_err(e: WaitEnd<RecvError>) -> TryRecvError {
    match e {
        WaitEnd::Timeout => TryRecvError::Empty,
        WaitEnd::Disconnected => TryRecvError::Disconnected,
        WaitEnd::Fail(e) => e.into(),
    }
}

fn recv_timeout_err(e: WaitEnd<RecvError>) -> RecvTimeoutError {
    match e {
        WaitEnd::Timeout => RecvTimeoutError::Timeout,
        WaitEnd::Disconnected => RecvTimeoutError::Disconnected,
        WaitEnd::Fail(e) => e.into(),
    }
}

/// One attempt to find the record at the head (always inlined: see `Consumer::peek`).
#[inline(always)]
fn attempt_peek(cons: &mut Consumer, shared: &Shared) -> Attempt<Record, RecvError> {
    match cons.peek() {
        Ok(Some(r)) => Attempt::Ready(r),
        Ok(None) => {
            if !(cons.producer_closed() || shared.peer_known_dead()) {
                return Attempt::NotYet;
            }
            // Hung up: whatever it published before is visible now (Acquire on the flag).
            match cons.peek() {
                Ok(Some(r)) => Attempt::Ready(r),
                Ok(None) => Attempt::Disconnected,
                Err(c) => Attempt::Fail(RecvError::Corrupted(c)),
            }
        }
        Err(c) => Attempt::Fail(RecvError::Corrupted(c)),
    }
}

impl Receiver {
    /// Sets how blocking receives wait for a message.
    pub fn set_wait(&mut self, wait: Wait) {
        self.waiter.mode = wait;
    }

    /// See [`Endpoint::set_liveness_interval`].
    pub fn set_liveness_interval(&mut self, interval: Duration) {
        self.waiter.liveness_interval_ns = tess_sched::clock::ns(interval).max(1);
    }

    /// Largest message the peer may send, in bytes.
    pub fn max_message_size(&self) -> usize {
        self.cons.max_message()
    }

    /// The current spin budget of [`Wait::Adaptive`].
    pub fn spin_budget(&self) -> Duration {
        self.waiter.spin_budget()
    }

    /// The record at the head, waiting as `deadline` says (`Some(0)`: try once). The first
    /// look is inline: a receive from a ring that holds a message costs no call into the waiter.
    #[inline]
    fn next(&mut self, deadline: Option<u64>) -> Result<Record, WaitEnd<RecvError>> {
        if let Some(c) = self.poisoned {
            return Err(WaitEnd::Fail(RecvError::Corrupted(c)));
        }
        let r = match attempt_peek(&mut self.cons, &self.shared) {
            Attempt::Ready(r) => return Ok(r),
            Attempt::NotYet if deadline == Some(0) => Err(WaitEnd::Timeout),
            Attempt::NotYet => self.wait_for_message(deadline),
            Attempt::Disconnected => Err(WaitEnd::Disconnected),
            Attempt::Fail(e) => Err(WaitEnd::Fail(e)),
        };
        if let Err(WaitEnd::Fail(RecvError::Corrupted(c))) = r {
            self.poisoned = Some(c);
        }
        r
    }

    #[inline(never)]
    fn wait_for_message(&mut self, deadline: Option<u64>) -> Result<Record, WaitEnd<RecvError>> {
        let shared = &*self.shared;
        let mut side = Half {
            ring: &mut self.cons,
            shared,
        };
        self.waiter
            .block_on(&mut side, deadline, |s| attempt_peek(s.ring, s.shared))
    }

    /// Receives into `buf` with an internal deadline (`Some(0)`: try once); for the C ABI.
    pub(crate) fn recv_raw(
        &mut self,
        buf: &mut [u8],
        deadline: Option<u64>,
    ) -> Result<usize, WaitEnd<RecvError>> {
        self.recv_inner(buf, deadline)
    }

    fn recv_inner(
        &mut self,
        buf: &mut [u8],
        deadline: Option<u64>,
    ) -> Result<usize, WaitEnd<RecvError>> {
        let r = self.next(deadline)?;
        if r.len > buf.len() {
            return Err(WaitEnd::Fail(RecvError::BufferTooSmall {
                len: r.len,
                capacity: buf.len(),
            }));
        }
        self.cons.read(&r, buf);
        self.cons.consume(r);
        self.cons.publish();
        Ok(r.len)
    }

    /// Receives the next message into `buf`, waiting as [`set_wait`](Self::set_wait) says.
    /// Returns its length. A message longer than `buf` stays in the channel.
    #[inline]
    pub fn recv(&mut self, buf: &mut [u8]) -> Result<usize, RecvError> {
        self.recv_inner(buf, None).map_err(recv_err)
    }

    /// Receives the next message into `buf` if there is one now.
    pub fn try_recv(&mut self, buf: &mut [u8]) -> Result<usize, TryRecvError> {
        self.recv_inner(buf, Some(0)).map_err(try_recv_err)
    }

    /// Receives the next message into `buf`, waiting at most `timeout`.
    pub fn recv_timeout(
        &mut self,
        buf: &mut [u8],
        timeout: Duration,
    ) -> Result<usize, RecvTimeoutError> {
        self.recv_inner(buf, Some(deadline_after(timeout).max(1)))
            .map_err(recv_timeout_err)
    }

    /// Hands up to `max` waiting messages to `f`, in place, and frees their space with one
    /// store. Returns how many; `Empty` if there were none.
    pub fn try_recv_batch(
        &mut self,
        max: usize,
        f: impl FnMut(&[u8]),
    ) -> Result<usize, TryRecvError> {
        self.batch(max, Some(0), f).map_err(try_recv_err)
    }

    /// Like [`try_recv_batch`](Self::try_recv_batch), but waits for the first message.
    pub fn recv_batch(&mut self, max: usize, f: impl FnMut(&[u8])) -> Result<usize, RecvError> {
        self.batch(max, None, f).map_err(recv_err)
    }

    fn batch(
        &mut self,
        max: usize,
        deadline: Option<u64>,
        mut f: impl FnMut(&[u8]),
    ) -> Result<usize, WaitEnd<RecvError>> {
        if max == 0 {
            return Ok(0);
        }
        let mut r = self.next(deadline)?;
        let mut n = 0;
        if self.scratch.len() < self.cons.max_message() {
            self.scratch.resize(self.cons.max_message(), 0);
        }
        loop {
            // A private copy: the peer cannot change what `f` sees.
            let copy = &mut self.scratch[..r.len];
            self.cons.read(&r, copy);
            f(copy);
            self.cons.consume(r);
            n += 1;
            if n == max {
                break;
            }
            match self.cons.peek() {
                Ok(Some(next)) => r = next,
                Ok(None) => break,
                Err(c) => {
                    // Deliver what was good; the next call reports the corruption.
                    self.poisoned = Some(c);
                    break;
                }
            }
        }
        self.cons.publish();
        Ok(n)
    }

    /// Lends the next message in place, waiting for one. It stays in the channel until
    /// [`ReadSlot::release`].
    #[inline]
    pub fn peek(&mut self) -> Result<ReadSlot<'_>, RecvError> {
        let r = self.next(None).map_err(recv_err)?;
        Ok(ReadSlot::new(self, r))
    }

    /// Lends the next message in place if there is one now.
    #[inline]
    pub fn try_peek(&mut self) -> Result<ReadSlot<'_>, TryRecvError> {
        let r = self.next(Some(0)).map_err(try_recv_err)?;
        Ok(ReadSlot::new(self, r))
    }

    /// Lends the next message in place, waiting at most `timeout`.
    pub fn peek_timeout(&mut self, timeout: Duration) -> Result<ReadSlot<'_>, RecvTimeoutError> {
        let r = self
            .next(Some(deadline_after(timeout).max(1)))
            .map_err(recv_timeout_err)?;
        Ok(ReadSlot::new(self, r))
    }

    /// Low-level peek for the C ABI.
    pub(crate) fn peek_raw(
        &mut self,
        deadline: Option<u64>,
    ) -> Result<(Record, *const u8), WaitEnd<RecvError>> {
        let r = self.next(deadline)?;
        Ok((r, self.cons.payload_ptr(&r)))
    }

    /// Releases a record from [`peek_raw`](Self::peek_raw).
    pub(crate) fn release_raw(&mut self, r: Record) {
        self.cons.consume(r);
        self.cons.publish();
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if self.hang_up_on_drop {
            self.cons.close();
        }
    }
}

/// A slot lent by [`Sender::reserve`]: write the message, then [`commit`](Self::commit).
/// Dropping it without committing sends nothing.
///
/// The slot lies in memory the peer maps, so it is never lent as a `&mut [u8]`. Either write
/// into it in place with [`write`](Self::write) (and [`copy_from`](Self::copy_from) for a
/// received message), or fill the private [`buffer`](Self::buffer), which is copied into the
/// slot on commit (one more copy, for code that wants a `&mut [u8]`, e.g. `read(2)`). Do not
/// mix the two: a used buffer overwrites what `write` put in the slot.
#[derive(Debug)]
pub struct WriteSlot<'a> {
    tx: &'a mut Sender,
    p: Placement,
    staged: bool,
}

impl WriteSlot<'_> {
    /// Length of the slot: the most bytes a commit may send.
    pub fn len(&self) -> usize {
        self.p.len
    }

    /// Whether the slot has no room (a zero-length reservation).
    pub fn is_empty(&self) -> bool {
        self.p.len == 0
    }

    /// Copies `src` into the slot at byte `offset`. Panics if it does not fit (like slice
    /// indexing).
    #[inline]
    pub fn write(&mut self, offset: usize, src: &[u8]) {
        self.tx.prod.write_at(&self.p, offset, src);
    }

    /// Copies `len` bytes of the lent message `msg`, from its byte `offset`, into the slot at
    /// byte `at`, ring to ring. Panics if either range is outside its message.
    #[inline]
    pub fn copy_from(&mut self, at: usize, msg: &ReadSlot<'_>, offset: usize, len: usize) {
        self.tx
            .prod
            .copy_from_record(&self.p, at, &msg.rx.cons, &msg.r, offset, len);
    }

    /// A private buffer of [`len`](Self::len) bytes (contents unspecified), copied into the
    /// slot on commit.
    pub fn buffer(&mut self) -> &mut [u8] {
        let len = self.p.len;
        if self.tx.stage.len() < len {
            self.tx.stage.resize(len, 0);
        }
        self.staged = true;
        &mut self.tx.stage[..len]
    }

    /// Sends the whole slot.
    #[inline]
    pub fn commit(self) {
        let len = self.p.len;
        self.commit_len(len);
    }

    /// Sends the first `len` bytes of the slot (`len` is capped at the slot's length).
    #[inline]
    pub fn commit_len(self, len: usize) {
        let len = len.min(self.p.len);
        if self.staged {
            self.tx.prod.write(&self.p, &self.tx.stage[..len]);
        }
        self.tx.prod.commit(self.p, len);
        self.tx.prod.publish();
    }
}

/// A message lent by [`Receiver::peek`]. It stays in the channel until
/// [`release`](Self::release); dropping the slot leaves it there.
///
/// The bytes lie in memory the peer maps and may change under us, so they are never lent as a
/// `&[u8]`: read them by copying, with [`read`](Self::read) (a part, no allocation),
/// [`bytes`](Self::bytes) (the whole message, copied once into a private buffer of the
/// receiver) or [`to_vec`](Self::to_vec).
#[derive(Debug)]
pub struct ReadSlot<'a> {
    rx: &'a mut Receiver,
    r: Record,
    copied: bool,
}

impl<'a> ReadSlot<'a> {
    #[inline]
    fn new(rx: &'a mut Receiver, r: Record) -> ReadSlot<'a> {
        ReadSlot {
            rx,
            r,
            copied: false,
        }
    }

    /// Length of the message.
    pub fn len(&self) -> usize {
        self.r.len
    }

    /// Whether the message is empty.
    pub fn is_empty(&self) -> bool {
        self.r.len == 0
    }

    /// Copies `dst.len()` bytes of the message from byte `offset` into `dst`. Panics if the
    /// range is outside the message (like slice indexing).
    #[inline]
    pub fn read(&self, offset: usize, dst: &mut [u8]) {
        self.rx.cons.read_at(&self.r, offset, dst);
    }

    /// The whole message, copied into a private buffer of the receiver on the first call (a
    /// stable view: the peer cannot change it).
    pub fn bytes(&mut self) -> &[u8] {
        let len = self.r.len;
        if !self.copied {
            if self.rx.scratch.len() < len {
                self.rx.scratch.resize(len, 0);
            }
            self.rx.cons.read(&self.r, &mut self.rx.scratch[..len]);
            self.copied = true;
        }
        &self.rx.scratch[..len]
    }

    /// The whole message, copied into a new vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.r.len];
        self.rx.cons.read(&self.r, &mut v);
        v
    }

    /// Consumes the message, freeing its space for the sender.
    #[inline]
    pub fn release(self) {
        self.rx.cons.consume(self.r);
        self.rx.cons.publish();
    }
}
