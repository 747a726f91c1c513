//! The console service (seed 000 section 2.2): a cell's log lines go one way over a channel to
//! the console service, which writes them with the cell's name and the time. For the writer,
//! logging is one attempt to put a record into shared memory: it never makes a system call and
//! never waits, so printing never blocks a real-time thread. A line that does not fit (the
//! service is behind) is counted, and the count is reported with the next line that does.
//!
//! Record format on the channel (little-endian):
//!
//! ```text
//!  0        8       12          16
//!  | time_ns | kind | dropped   | text (UTF-8, up to the channel's max message) |
//! ```
//! `time_ns` is `CLOCK_REALTIME` when the line was logged; `dropped` is how many lines were lost
//! just before this one.
#![warn(missing_docs)]

pub mod service;

use tess_channel::{Endpoint, TrySendError};
use tess_proto::client::ApiError;

/// The name the console service registers.
pub const SERVICE_NAME: &str = "console";
/// Header bytes before the text.
pub const HEADER: usize = 16;

/// A connection to the console service.
#[derive(Debug)]
pub struct Console {
    ep: Endpoint,
    dropped: u32,
    total_dropped: u64,
}

/// Encodes one record (used by [`Console::log`] and tests).
pub fn encode(time_ns: u64, dropped: u32, text: &str, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&time_ns.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&dropped.to_le_bytes());
    out.extend_from_slice(text.as_bytes());
}

/// A decoded record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// When it was logged (`CLOCK_REALTIME`, ns).
    pub time_ns: u64,
    /// Lines lost just before it.
    pub dropped: u32,
    /// The line (invalid UTF-8 replaced).
    pub text: String,
}

/// Decodes a record; `None` if it is too short (a peer cannot make the service misbehave).
pub fn decode(b: &[u8]) -> Option<Record> {
    if b.len() < HEADER {
        return None;
    }
    Some(Record {
        time_ns: u64::from_le_bytes(b[0..8].try_into().ok()?),
        dropped: u32::from_le_bytes(b[12..16].try_into().ok()?),
        text: String::from_utf8_lossy(&b[HEADER..])
            .trim_end_matches(['\n', '\r'])
            .to_string(),
    })
}

impl Console {
    /// Connects to the console service through the nameserver.
    pub fn connect() -> Result<Console, ApiError> {
        let (ep, _) = tess_proto::ns::connect(SERVICE_NAME)?;
        Ok(Console::from_endpoint(ep))
    }

    /// Wraps a channel end already connected to the service.
    pub fn from_endpoint(ep: Endpoint) -> Console {
        Console {
            ep,
            dropped: 0,
            total_dropped: 0,
        }
    }

    /// Logs one line without ever blocking: returns `false` (and counts the line) when the
    /// service is behind or gone. Lines longer than the channel's message limit are cut.
    pub fn log(&mut self, line: &str) -> bool {
        let max = self.ep.max_message_size().saturating_sub(HEADER);
        let mut end = line.len().min(max);
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        let text = &line.as_bytes()[..end];
        let len = HEADER + text.len();
        let now = tess_sched::clock::realtime_ns();
        let dropped = self.dropped;
        let sent = match self.ep.sender().try_reserve(len) {
            Ok(mut slot) => {
                // The slot's private buffer, copied into the channel on commit.
                let buf = slot.buffer();
                buf[0..8].copy_from_slice(&now.to_le_bytes());
                buf[8..12].copy_from_slice(&0u32.to_le_bytes());
                buf[12..16].copy_from_slice(&dropped.to_le_bytes());
                buf[HEADER..len].copy_from_slice(text);
                slot.commit();
                true
            }
            Err(TrySendError::Full) | Err(_) => false,
        };
        if sent {
            self.dropped = 0;
        } else {
            self.dropped = self.dropped.saturating_add(1);
            self.total_dropped += 1;
        }
        sent
    }

    /// Lines lost since the connection was made.
    pub fn dropped(&self) -> u64 {
        self.total_dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tess_channel::{Channel, ChannelOptions};

    #[test]
    fn records_round_trip_and_short_ones_are_rejected() {
        let mut b = Vec::new();
        encode(42, 3, "héllo\n", &mut b);
        assert_eq!(
            decode(&b),
            Some(Record {
                time_ns: 42,
                dropped: 3,
                text: "héllo".into()
            })
        );
        assert_eq!(decode(&b[..10]), None);
    }

    #[test]
    fn logging_never_blocks_and_counts_what_did_not_fit() {
        let (client, mut service) = Channel::pair(&ChannelOptions::for_max_message(256)).unwrap();
        let mut c = Console::from_endpoint(client);
        let mut sent = 0;
        for i in 0..10_000 {
            if c.log(&format!("line {i}")) {
                sent += 1;
            }
        }
        assert!(
            sent > 0 && c.dropped() > 0,
            "sent {sent}, dropped {}",
            c.dropped()
        );
        assert_eq!(sent + c.dropped(), 10_000);
        // Drain, then the next line carries the count of the lost ones.
        let mut buf = vec![0u8; 256];
        let mut n_read = 0;
        while let Ok(n) = service.try_recv(&mut buf) {
            assert!(decode(&buf[..n]).unwrap().text.starts_with("line "));
            n_read += 1;
        }
        assert_eq!(n_read, sent);
        assert!(c.log("after"));
        let n = service.try_recv(&mut buf).unwrap();
        let r = decode(&buf[..n]).unwrap();
        assert_eq!(r.text, "after");
        assert!(r.dropped > 0);
        // Long lines are cut at a character boundary, never rejected.
        assert!(c.log(&"é".repeat(500)));
        let n = service.try_recv(&mut buf).unwrap();
        assert!(decode(&buf[..n]).unwrap().text.len() <= 256 - HEADER);
    }
}
