//! One client channel to the service: record framing, waiting as the socket's mode says, and
//! the records every socket handles the same way (`SENT`, `ERROR`, `REPLY`).

use crate::wire::{Header, Op, HEADER_LEN};
use std::io;
use std::time::Duration;
use tess_channel::{
    Endpoint, RecvError, RecvTimeoutError, SendError, TryRecvError, TrySendError, Wait,
};

/// How long an open (bind, connect, listen, adopt, control) waits for the service's reply.
pub(crate) const REPLY_TIMEOUT: Duration = Duration::from_secs(15);

/// When a datagram left the host, as the service saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SentStamp {
    /// The cookie given to the send.
    pub cookie: u64,
    /// `CLOCK_REALTIME` ns right after the service's `sendmmsg` returned.
    pub sent_ns: u64,
}

const SENT_SLOTS: usize = 64;

/// A fixed ring of the latest [`SentStamp`]s (no allocation; the oldest is overwritten).
#[derive(Debug)]
struct SentRing {
    slots: [SentStamp; SENT_SLOTS],
    head: usize,
    len: usize,
    overwritten: u64,
}

impl SentRing {
    fn new() -> SentRing {
        SentRing {
            slots: [SentStamp {
                cookie: 0,
                sent_ns: 0,
            }; SENT_SLOTS],
            head: 0,
            len: 0,
            overwritten: 0,
        }
    }

    fn push(&mut self, s: SentStamp) {
        let tail = (self.head + self.len) % SENT_SLOTS;
        self.slots[tail] = s;
        if self.len == SENT_SLOTS {
            self.head = (self.head + 1) % SENT_SLOTS;
            self.overwritten += 1;
        } else {
            self.len += 1;
        }
    }

    fn pop(&mut self) -> Option<SentStamp> {
        if self.len == 0 {
            return None;
        }
        let s = self.slots[self.head];
        self.head = (self.head + 1) % SENT_SLOTS;
        self.len -= 1;
        Some(s)
    }
}

/// What a record handler wants done with the record it saw.
pub(crate) enum Seen<R> {
    /// Consume it and return `R`.
    Take(R),
    /// Leave it at the head of the channel (partly read) and return `R`.
    Keep(R),
    /// Consume it and look at the next one.
    Skip,
}

pub(crate) fn gone() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "the network service closed the channel (it exited or dropped this client)",
    )
}

fn would_block() -> io::Error {
    io::Error::from(io::ErrorKind::WouldBlock)
}

/// A channel to the service with the state all sockets share.
#[derive(Debug)]
pub(crate) struct Conn {
    ep: Endpoint,
    pub(crate) nonblocking: bool,
    pub(crate) read_timeout: Option<Duration>,
    pub(crate) write_timeout: Option<Duration>,
    /// Longest wait for the answer to a control request.
    pub(crate) reply_timeout: Duration,
    sent: SentRing,
    error: Option<i32>,
}

impl Conn {
    pub(crate) fn new(ep: Endpoint) -> Conn {
        Conn {
            ep,
            nonblocking: false,
            read_timeout: None,
            write_timeout: None,
            reply_timeout: REPLY_TIMEOUT,
            sent: SentRing::new(),
            error: None,
        }
    }

    pub(crate) fn set_wait(&mut self, wait: Wait) {
        self.ep.set_wait(wait);
    }

    pub(crate) fn take_sent(&mut self) -> Option<SentStamp> {
        self.sent.pop()
    }

    pub(crate) fn sent_overwritten(&self) -> u64 {
        self.sent.overwritten
    }

    pub(crate) fn take_error(&mut self) -> Option<io::Error> {
        self.error.take().map(io::Error::from_raw_os_error)
    }

    /// Sends one record of `HEADER_LEN + len` bytes whose payload `fill` writes in place.
    pub(crate) fn send_with(
        &mut self,
        header: &Header,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> io::Result<()> {
        let total = HEADER_LEN + len;
        let mut slot = if self.nonblocking {
            match self.ep.try_reserve(total) {
                Ok(s) => s,
                Err(TrySendError::Full) => return Err(would_block()),
                Err(TrySendError::Disconnected) => return Err(gone()),
                Err(TrySendError::TooLarge { len, max }) => return Err(too_large(len, max)),
                Err(TrySendError::Corrupted(c)) => return Err(io::Error::other(c)),
            }
        } else if let Some(t) = self.write_timeout {
            match self.ep.reserve_timeout(total, t) {
                Ok(s) => s,
                Err(tess_channel::SendTimeoutError::Timeout) => return Err(would_block()),
                Err(tess_channel::SendTimeoutError::Disconnected) => return Err(gone()),
                Err(tess_channel::SendTimeoutError::TooLarge { len, max }) => {
                    return Err(too_large(len, max))
                }
                Err(tess_channel::SendTimeoutError::Corrupted(c)) => {
                    return Err(io::Error::other(c))
                }
            }
        } else {
            match self.ep.reserve(total) {
                Ok(s) => s,
                Err(SendError::Disconnected) => return Err(gone()),
                Err(SendError::TooLarge { len, max }) => return Err(too_large(len, max)),
                Err(SendError::Corrupted(c)) => return Err(io::Error::other(c)),
            }
        };
        // `fill` wants a `&mut [u8]`: the slot's private buffer, copied in on commit (the slot
        // itself is shared memory and never lent as a slice).
        let buf = slot.buffer();
        header.encode(&mut buf[..HEADER_LEN]);
        fill(&mut buf[HEADER_LEN..total]);
        slot.commit_len(total);
        Ok(())
    }

    /// Sends a record with `payload` copied in.
    pub(crate) fn send(&mut self, header: &Header, payload: &[u8]) -> io::Result<()> {
        self.send_with(header, payload.len(), |b| b.copy_from_slice(payload))
    }

    /// Hands records to `f` until it takes or keeps one, waiting as the mode says. `SENT` and
    /// `ERROR` records are absorbed on the way (an error is returned at once).
    pub(crate) fn next<R>(
        &mut self,
        timeout: Option<Duration>,
        mut f: impl FnMut(&Header, &[u8]) -> Seen<R>,
    ) -> io::Result<R> {
        if let Some(e) = self.take_error() {
            return Err(e);
        }
        let nonblocking = self.nonblocking && timeout.is_none();
        let timeout = timeout.or(self.read_timeout);
        loop {
            let mut slot = if nonblocking {
                match self.ep.try_peek() {
                    Ok(s) => s,
                    Err(TryRecvError::Empty) => return Err(would_block()),
                    Err(TryRecvError::Disconnected) => return Err(gone()),
                    Err(e) => return Err(io::Error::other(e)),
                }
            } else if let Some(t) = timeout {
                match self.ep.peek_timeout(t) {
                    Ok(s) => s,
                    Err(RecvTimeoutError::Timeout) => return Err(would_block()),
                    Err(RecvTimeoutError::Disconnected) => return Err(gone()),
                    Err(e) => return Err(io::Error::other(e)),
                }
            } else {
                match self.ep.peek() {
                    Ok(s) => s,
                    Err(RecvError::Disconnected) => return Err(gone()),
                    Err(e) => return Err(io::Error::other(e)),
                }
            };
            let Ok(h) = Header::decode(slot.bytes()) else {
                // Not from a well-behaved service: skip it.
                slot.release();
                continue;
            };
            match h.op {
                Op::Sent => {
                    self.sent.push(SentStamp {
                        cookie: h.value,
                        sent_ns: h.stamp,
                    });
                    slot.release();
                    continue;
                }
                Op::Error => {
                    slot.release();
                    return Err(io::Error::from_raw_os_error(i32::from(h.status)));
                }
                _ => {}
            }
            match f(&h, &slot.bytes()[HEADER_LEN..]) {
                Seen::Take(r) => {
                    slot.release();
                    return Ok(r);
                }
                Seen::Keep(r) => return Ok(r),
                Seen::Skip => slot.release(),
            }
        }
    }

    /// Sends an open request and waits for its `REPLY`; returns the reply's header.
    pub(crate) fn request(&mut self, header: &Header, payload: &[u8]) -> io::Result<Header> {
        let nb = std::mem::replace(&mut self.nonblocking, false);
        let wt = self.write_timeout.replace(REPLY_TIMEOUT);
        let sent = self.send(header, payload);
        self.nonblocking = nb;
        self.write_timeout = wt;
        sent?;
        let reply = self.next(Some(REPLY_TIMEOUT), |h, _| match h.op {
            Op::Reply => Seen::Take(*h),
            _ => Seen::Skip,
        });
        let reply = match reply {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "the network service did not answer {:?} within {} s",
                        header.op,
                        REPLY_TIMEOUT.as_secs()
                    ),
                ))
            }
            r => r?,
        };
        if reply.status != 0 {
            return Err(io::Error::from_raw_os_error(i32::from(reply.status)));
        }
        Ok(reply)
    }

    /// Sends a `CONTROL` request and waits for its JSON reply.
    pub(crate) fn control(&mut self, json: &[u8]) -> io::Result<Vec<u8>> {
        self.send(&Header::new(Op::Control), json)?;
        let r = self.next(Some(self.reply_timeout), |h, p| match h.op {
            Op::ControlReply => Seen::Take(p.to_vec()),
            _ => Seen::Skip,
        });
        match r {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the network service did not answer a control request",
            )),
            r => r,
        }
    }
}

fn too_large(len: usize, max: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "message of {} bytes is larger than the service's maximum of {} bytes",
            len.saturating_sub(HEADER_LEN),
            max.saturating_sub(HEADER_LEN)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sent_ring_keeps_the_latest() {
        let mut r = SentRing::new();
        for i in 0..(SENT_SLOTS as u64 + 3) {
            r.push(SentStamp {
                cookie: i,
                sent_ns: i,
            });
        }
        assert_eq!(r.overwritten, 3);
        assert_eq!(r.pop().unwrap().cookie, 3);
        let mut n = 1;
        while r.pop().is_some() {
            n += 1;
        }
        assert_eq!(n, SENT_SLOTS);
    }
}
