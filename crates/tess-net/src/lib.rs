//! The tess network service (issue 6; seed 000 section 2.2 "Network Service" and section 4.2;
//! seed 004 sections 2.3 and 6.2).
//!
//! Tessellation's network service runs in a cell of its own, owns the network adapters, and
//! gives each client cell's data flow a minimum throughput, a share of the excess and a limit
//! (an adaptation of mClock); this crate adds the paper's future work, latency bounds.
//!
//! ```text
//!  client cell                      service cell (tess-netd)                   kernel
//!  +---------------------+  channel  +-------------------------------------+
//!  | tess_net::client    |<=========>| sessions -> flows -> scheduler      |  UDP / TCP
//!  | UdpSocket, TcpStream|  (memfd)  | (mClock + deadlines, paced link)    |<=========> sockets
//!  +---------------------+           | recvmmsg / sendmmsg, busy-poll|epoll|
//!  admin / tessd / broker ---------->| QoS interface: specs, flow table    |
//!                                    +-------------------------------------+
//! ```
//!
//! # Map
//! - [`client`]: the client library (re-exported from `tess-net-client`): socket-like UDP and
//!   TCP over a channel, the QoS interface ([`client::Control`]), the wire format.
//! - [`sched`]: the scheduler, with its equations, glossary and worked example; admission in
//!   [`sched::admission`].
//! - [`service`]: the service loop, sessions, batched socket calls, the flow table.
//! - Its benchmark, `tess bench net` (seed 000 section 4.2, Fig. 8, with the synthesizer's
//!   traffic behind the service), is in `tess-cli` (`src/bench/net/`): it drives the music
//!   application, which sits above this service.
//! - Binaries: `tess-netd` (the service), `tess-net-flood` (the abusive streaming client).
#![warn(missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod sched;
pub mod service;

/// The client library.
pub use tess_net_client as client;
