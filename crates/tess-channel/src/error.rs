//! Error families, one per operation family (crossbeam style): `send` -> [`SendError`],
//! `try_send` -> [`TrySendError`], `send_timeout` -> [`SendTimeoutError`], and the same for
//! receiving. Reserving a slot shares the send family, peeking the receive family.

pub use crate::ring::Corruption;

/// Error of [`send`](crate::Sender::send) and the other blocking sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The peer hung up or its process died; nothing more will be received.
    #[error("cannot send: the peer has hung up or died")]
    Disconnected,
    /// The message is longer than the channel's maximum.
    #[error("cannot send {len} bytes: the channel's maximum message size is {max}")]
    TooLarge {
        /// Length of the message.
        len: usize,
        /// The channel's maximum.
        max: usize,
    },
    /// The peer left the shared memory in an impossible state; the endpoint is unusable.
    #[error(transparent)]
    Corrupted(Corruption),
}

/// Error of [`try_send`](crate::Sender::try_send) and the other non-blocking sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TrySendError {
    /// No room now; the receiver has not caught up.
    #[error("cannot send now: the channel is full")]
    Full,
    /// See [`SendError::Disconnected`].
    #[error("cannot send: the peer has hung up or died")]
    Disconnected,
    /// See [`SendError::TooLarge`].
    #[error("cannot send {len} bytes: the channel's maximum message size is {max}")]
    TooLarge {
        /// Length of the message.
        len: usize,
        /// The channel's maximum.
        max: usize,
    },
    /// See [`SendError::Corrupted`].
    #[error(transparent)]
    Corrupted(Corruption),
}

/// Error of [`send_timeout`](crate::Sender::send_timeout).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SendTimeoutError {
    /// The channel stayed full until the deadline.
    #[error("cannot send: the channel stayed full until the timeout")]
    Timeout,
    /// See [`SendError::Disconnected`].
    #[error("cannot send: the peer has hung up or died")]
    Disconnected,
    /// See [`SendError::TooLarge`].
    #[error("cannot send {len} bytes: the channel's maximum message size is {max}")]
    TooLarge {
        /// Length of the message.
        len: usize,
        /// The channel's maximum.
        max: usize,
    },
    /// See [`SendError::Corrupted`].
    #[error(transparent)]
    Corrupted(Corruption),
}

/// Error of [`recv`](crate::Receiver::recv) and the other blocking receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RecvError {
    /// The peer hung up or died and every message it sent has been received.
    #[error("cannot receive: the peer has hung up or died and the channel is empty")]
    Disconnected,
    /// The next message is longer than the buffer; it stays in the channel.
    #[error("cannot receive a {len}-byte message into a {capacity}-byte buffer")]
    BufferTooSmall {
        /// Length of the waiting message.
        len: usize,
        /// Length of the buffer given.
        capacity: usize,
    },
    /// See [`SendError::Corrupted`].
    #[error(transparent)]
    Corrupted(Corruption),
}

/// Error of [`try_recv`](crate::Receiver::try_recv) and the other non-blocking receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TryRecvError {
    /// No message now.
    #[error("cannot receive now: the channel is empty")]
    Empty,
    /// See [`RecvError::Disconnected`].
    #[error("cannot receive: the peer has hung up or died and the channel is empty")]
    Disconnected,
    /// See [`RecvError::BufferTooSmall`].
    #[error("cannot receive a {len}-byte message into a {capacity}-byte buffer")]
    BufferTooSmall {
        /// Length of the waiting message.
        len: usize,
        /// Length of the buffer given.
        capacity: usize,
    },
    /// See [`SendError::Corrupted`].
    #[error(transparent)]
    Corrupted(Corruption),
}

/// Error of [`recv_timeout`](crate::Receiver::recv_timeout).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RecvTimeoutError {
    /// No message arrived before the deadline.
    #[error("cannot receive: no message arrived before the timeout")]
    Timeout,
    /// See [`RecvError::Disconnected`].
    #[error("cannot receive: the peer has hung up or died and the channel is empty")]
    Disconnected,
    /// See [`RecvError::BufferTooSmall`].
    #[error("cannot receive a {len}-byte message into a {capacity}-byte buffer")]
    BufferTooSmall {
        /// Length of the waiting message.
        len: usize,
        /// Length of the buffer given.
        capacity: usize,
    },
    /// See [`SendError::Corrupted`].
    #[error(transparent)]
    Corrupted(Corruption),
}

/// Error creating, opening or handing over a channel.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// A system call failed.
    #[error("{op} failed: {source}")]
    Io {
        /// What was being done, e.g. `memfd_create` or `mmap of 266240 bytes`.
        op: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The options or the header describe an impossible layout.
    #[error("invalid channel layout: {0}")]
    Layout(#[from] crate::layout::LayoutError),
    /// The memfd's size does not match its header.
    #[error("channel memfd is {found} bytes, its header says {expected}")]
    Size {
        /// Size from `fstat`.
        found: u64,
        /// Size the header implies.
        expected: u64,
    },
    /// The memfd is not sealed against resizing, so a peer could truncate it under us.
    #[error("channel memfd seals are {seals:#x}; F_SEAL_SHRINK and F_SEAL_GROW are required")]
    NotSealed {
        /// Seals found.
        seals: i32,
    },
    /// A hand-off message over the Unix socket was malformed.
    #[error("bad channel hand-off message: {what}")]
    Handoff {
        /// What was wrong.
        what: String,
    },
}

impl OpenError {
    pub(crate) fn io(op: impl Into<String>, source: std::io::Error) -> OpenError {
        OpenError::Io {
            op: op.into(),
            source,
        }
    }
    pub(crate) fn last_os(op: impl Into<String>) -> OpenError {
        OpenError::io(op, std::io::Error::last_os_error())
    }
}

macro_rules! from_send {
    ($t:ident) => {
        impl From<SendError> for $t {
            fn from(e: SendError) -> $t {
                match e {
                    SendError::Disconnected => $t::Disconnected,
                    SendError::TooLarge { len, max } => $t::TooLarge { len, max },
                    SendError::Corrupted(c) => $t::Corrupted(c),
                }
            }
        }
    };
}
from_send!(TrySendError);
from_send!(SendTimeoutError);

macro_rules! from_recv {
    ($t:ident) => {
        impl From<RecvError> for $t {
            fn from(e: RecvError) -> $t {
                match e {
                    RecvError::Disconnected => $t::Disconnected,
                    RecvError::BufferTooSmall { len, capacity } => {
                        $t::BufferTooSmall { len, capacity }
                    }
                    RecvError::Corrupted(c) => $t::Corrupted(c),
                }
            }
        }
    };
}
from_recv!(TryRecvError);
from_recv!(RecvTimeoutError);
