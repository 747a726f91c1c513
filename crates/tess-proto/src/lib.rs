//! The tessd API.
//!
//! Clients talk to `tessd` over a Unix stream socket (default [`DEFAULT_SOCKET`]). Each message
//! is a frame: a 4-byte little-endian length, then that many bytes of JSON ([`frame`]). A client
//! sends one [`Request`] and reads one [`Response`] per call; a connection may carry many calls.
//! The daemon identifies callers by `SO_PEERCRED` (uid and pid), never by what they claim.
#![warn(missing_docs)]

pub mod client;
pub mod decode;
pub mod frame;
mod messages;
pub mod ns;
pub mod runtime;

pub use client::{ApiError, CellSession, Client};
pub use messages::*;

/// Where tessd listens unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/run/tess/tessd.sock";
/// Environment variable that overrides the socket path for clients.
pub const SOCKET_ENV: &str = "TESS_SOCKET";
/// Version of this protocol; the daemon refuses clients that speak another.
pub const PROTOCOL_VERSION: u32 = 1;
