//! Lock-free shared-memory channels between tess cells (issue 3; seed 000 section 2.1, seed 001
//! section 5.2, seed 003 "Channels").
//!
//! A channel is bidirectional: two single-producer single-consumer rings of variable-size byte
//! records, one per direction, in one sealed memfd (the non-blocking buffer of the papers; see
//! [`ring`] for the algorithm and [`layout`] for the memory layout). Nothing on the
//! data path enters the kernel unless a side chooses to sleep.
//!
//! # Handing the two ends to two processes (what tessd does)
//!
//! ```no_run
//! use std::os::fd::AsFd;
//! use tess_channel::{handoff, Channel, ChannelOptions, Endpoint};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let (client_sock, _c) = handoff::socket_pair()?;
//! # let (service_sock, _s) = handoff::socket_pair()?;
//! // In the broker: create, send one end to each process, close the broker's copies.
//! let (a, b) = Channel::create(&ChannelOptions::default())?;
//! handoff::send_endpoint(client_sock.as_fd(), &a)?;
//! handoff::send_endpoint(service_sock.as_fd(), &b)?;
//! drop((a, b)); // required: peer-death detection needs each process to hold the only copy
//!
//! // In each process, on its end of the Unix socket to the broker:
//! # let sock = _c;
//! let mut ep = Endpoint::recv_from(sock.as_fd())?;
//! ep.send(b"hello")?;
//! let mut buf = [0u8; 4480];
//! let n = ep.recv(&mut buf)?;
//! # let _ = n; Ok(()) }
//! ```
//!
//! # Operations
//!
//! | family | blocking | non-blocking | bounded |
//! |---|---|---|---|
//! | send a copy | [`Sender::send`] | [`Sender::try_send`] | [`Sender::send_timeout`] |
//! | send many | [`Sender::send_batch`] | [`Sender::try_send_batch`] | |
//! | write into the ring | [`Sender::reserve`] | [`Sender::try_reserve`] | [`Sender::reserve_timeout`] |
//! | receive a copy | [`Receiver::recv`] | [`Receiver::try_recv`] | [`Receiver::recv_timeout`] |
//! | receive many | [`Receiver::recv_batch`] | [`Receiver::try_recv_batch`] | |
//! | read from the ring | [`Receiver::peek`] | [`Receiver::try_peek`] | [`Receiver::peek_timeout`] |
//!
//! Blocking operations wait as [`Wait`] says: busy-poll, adaptive spin then futex, or futex.
//!
//! # A hostile or dead peer
//!
//! The peer can write anything into the shared pages at any time. No Rust reference is ever
//! formed over them: words are read and written atomically and payloads are copied (the
//! safety model is in `region.rs` and the crate README). Every index and length read from them
//! is read once and validated before use, and memory outside the rings is never touched; an
//! impossible state is reported as `Corrupted` (and the half that saw it stays unusable).
//! Slots lent by [`Sender::reserve`] and [`Receiver::peek`] therefore copy: [`WriteSlot::write`],
//! [`ReadSlot::read`], [`ReadSlot::bytes`]. A peer
//! that dies is noticed through the liveness socket within the liveness interval of any wait;
//! an orderly hang-up (dropping the endpoint) is noticed at once.
#![warn(missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks)]
#![cfg_attr(loom, allow(dead_code, unused_imports))]

pub mod layout;
#[cfg(not(loom))]
mod opaque_copy;
mod region;
pub mod ring;
mod sync;

#[cfg(all(feature = "bench", not(loom)))]
pub mod bench;
#[cfg(not(loom))]
mod endpoint;
#[cfg(not(loom))]
pub mod error;
#[cfg(not(loom))]
pub mod ffi;
// The hostile-peer fuzzer reuses the benchmark's process helpers, so it comes with the `bench`
// feature (tess-cli, the hostile test and example, and the cargo-fuzz targets turn it on).
#[cfg(all(not(loom), feature = "bench"))]
#[doc(hidden)]
pub mod fuzzing;
#[cfg(not(loom))]
pub mod handoff;
#[cfg(not(loom))]
mod shm;
#[cfg(not(loom))]
mod wait;

#[cfg(all(test, loom))]
mod loom_tests;
#[cfg(all(test, not(loom)))]
mod tests;

#[cfg(not(loom))]
pub use endpoint::{
    Channel, ChannelOptions, Endpoint, EndpointFds, ReadSlot, Receiver, Sender, Side, WriteSlot,
};
#[cfg(not(loom))]
pub use error::{
    OpenError, RecvError, RecvTimeoutError, SendError, SendTimeoutError, TryRecvError, TrySendError,
};
pub use ring::{decode_record, Corruption, RecordWord};
#[cfg(not(loom))]
pub use wait::{Wait, DEFAULT_LIVENESS_INTERVAL, MAX_SPIN_NS, MIN_SPIN_NS};
