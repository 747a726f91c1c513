//! The records exchanged on a client's channel: a fixed 40-byte header, then the payload.
//!
//! ```text
//!  byte 0    1       2        4      6        7     8                        24         32         40
//!       +----+-------+--------+------+--------+-----+------------------------+----------+----------+
//!       | op | flags | status | port | family | 0   | address (16 bytes)     | value    | stamp    |
//!       | u8 | u8    | u16    | u16  | u8     | u8  | v4 in the first 4      | u64      | u64      |
//!       +----+-------+--------+------+--------+-----+------------------------+----------+----------+
//!       then `len - 40` bytes of payload (datagram, stream bytes or JSON)
//! ```
//! All integers little-endian; the port in host order. `family` is 0 (no address), 4 or 6.
//!
//! | op | direction | meaning | address | value | stamp |
//! |---|---|---|---|---|---|
//! | `UDP_BIND` | c -> s | open a UDP socket bound there | local | | |
//! | `SEND` | c -> s | send a datagram (payload) | destination | cookie | client's send time (monotonic ns) |
//! | `TCP_CONNECT` | c -> s | open a TCP connection | remote | | |
//! | `TCP_LISTEN` | c -> s | listen; `status` = backlog | local | | |
//! | `ADOPT` | c -> s | take over an accepted connection | | token | |
//! | `WRITE` | c -> s | stream bytes (payload) | | | client's send time |
//! | `SHUTDOWN` | c -> s | shut down writing | | | |
//! | `CONTROL` | c -> s | QoS interface: JSON request (payload) | | | |
//! | `LABEL` | c -> s | put this channel in flow `KEY/LABEL` of its cell (payload: the label), once, before it opens a socket; `REPLY` status `EISCONN`, `EALREADY`, `EINVAL` (not a label) or `EMFILE` (the cell has 256 labelled flows) | | | |
//! | `REPLY` | s -> c | result of an open; `status` = errno or 0 | local | | |
//! | `DATAGRAM` | s -> c | a received datagram (payload) | source | receive time (realtime ns) | |
//! | `SENT` | s -> c | a `SEND` with [`FLAG_WANT_SENT`] left | | cookie | when `sendmmsg` returned (realtime ns) |
//! | `DATA` | s -> c | stream bytes (payload) | | | |
//! | `EOF` | s -> c | the peer closed its side | | | |
//! | `ACCEPTED` | s -> c | a connection waits on a listener | remote | token | |
//! | `ERROR` | s -> c | asynchronous error; `status` = errno | | | |
//! | `CONTROL_REPLY` | s -> c | JSON reply (payload) | | | |
//!
//! The service treats everything a client writes as hostile: [`Header::decode`] checks the op
//! and the family, and the service checks lengths and permissions.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Header length in bytes.
pub const HEADER_LEN: usize = 40;
/// Largest payload of one record (a maximal UDP datagram fits).
pub const MAX_PAYLOAD: usize = 65_536;
/// Largest record.
pub const MAX_RECORD: usize = HEADER_LEN + MAX_PAYLOAD;
/// Ring bytes per direction of a client channel: room for a few maximal records or a few
/// hundred MTU-sized ones.
pub const CHANNEL_CAPACITY: usize = 256 * 1024;

/// The shape of every client channel of the service.
pub fn channel_options() -> tess_channel::ChannelOptions {
    tess_channel::ChannelOptions {
        capacity: CHANNEL_CAPACITY,
        max_message_size: MAX_RECORD,
    }
}

/// Operation of a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Op {
    /// Open a UDP socket bound to the address.
    UdpBind = 1,
    /// Send a datagram.
    Send = 2,
    /// Open a TCP connection to the address.
    TcpConnect = 3,
    /// Open a TCP listener on the address.
    TcpListen = 4,
    /// Take over an accepted connection (`value` = token).
    Adopt = 5,
    /// Stream bytes.
    Write = 6,
    /// Shut down the writing side of a stream.
    Shutdown = 7,
    /// A QoS-interface request (JSON payload).
    Control = 8,
    /// Put the channel in a labelled flow of its cell (payload: the label; answered by a
    /// `REPLY`).
    Label = 9,
    /// Result of an open.
    Reply = 64,
    /// A received datagram.
    Datagram = 65,
    /// A datagram left the host.
    Sent = 66,
    /// Stream bytes.
    Data = 67,
    /// End of stream.
    Eof = 68,
    /// A connection waits to be adopted.
    Accepted = 69,
    /// Asynchronous error.
    Error = 70,
    /// A QoS-interface reply (JSON payload).
    ControlReply = 71,
}

impl Op {
    /// The op for a byte, if it is one.
    pub fn from_u8(b: u8) -> Option<Op> {
        Some(match b {
            1 => Op::UdpBind,
            2 => Op::Send,
            3 => Op::TcpConnect,
            4 => Op::TcpListen,
            5 => Op::Adopt,
            6 => Op::Write,
            7 => Op::Shutdown,
            8 => Op::Control,
            9 => Op::Label,
            64 => Op::Reply,
            65 => Op::Datagram,
            66 => Op::Sent,
            67 => Op::Data,
            68 => Op::Eof,
            69 => Op::Accepted,
            70 => Op::Error,
            71 => Op::ControlReply,
            _ => return None,
        })
    }
}

/// `SEND`: answer with a `SENT` record carrying the time the datagram left.
pub const FLAG_WANT_SENT: u8 = 1 << 0;
/// `DATAGRAM`: `value` is the kernel's receive timestamp (else the service's clock).
pub const FLAG_KERNEL_STAMP: u8 = 1 << 1;
/// `DATAGRAM`: the datagram was longer than the payload and was cut.
pub const FLAG_TRUNCATED: u8 = 1 << 2;

/// A decoded header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Operation.
    pub op: Op,
    /// `FLAG_*` bits.
    pub flags: u8,
    /// errno of a reply or error; backlog of a listen; 0 otherwise.
    pub status: u16,
    /// Address, if any.
    pub addr: Option<SocketAddr>,
    /// Cookie, token or receive time (see the table above).
    pub value: u64,
    /// Send time or transmit time (see the table above).
    pub stamp: u64,
}

/// Why a record was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Shorter than a header.
    #[error("record of {0} bytes is shorter than the {HEADER_LEN}-byte header")]
    Short(usize),
    /// Unknown op byte.
    #[error("unknown op {0}")]
    Op(u8),
    /// Unknown address family.
    #[error("unknown address family {0}")]
    Family(u8),
}

impl Header {
    /// A header with no address and zero fields.
    pub fn new(op: Op) -> Header {
        Header {
            op,
            flags: 0,
            status: 0,
            addr: None,
            value: 0,
            stamp: 0,
        }
    }

    /// Sets the address.
    pub fn with_addr(mut self, addr: SocketAddr) -> Header {
        self.addr = Some(addr);
        self
    }

    /// Writes the header into the first [`HEADER_LEN`] bytes of `buf` (which must be that long).
    pub fn encode(&self, buf: &mut [u8]) {
        let b = &mut buf[..HEADER_LEN];
        b[0] = self.op as u8;
        b[1] = self.flags;
        b[2..4].copy_from_slice(&self.status.to_le_bytes());
        b[7] = 0;
        b[8..24].fill(0);
        match self.addr {
            None => {
                b[4..6].fill(0);
                b[6] = 0;
            }
            Some(SocketAddr::V4(a)) => {
                b[4..6].copy_from_slice(&a.port().to_le_bytes());
                b[6] = 4;
                b[8..12].copy_from_slice(&a.ip().octets());
            }
            Some(SocketAddr::V6(a)) => {
                b[4..6].copy_from_slice(&a.port().to_le_bytes());
                b[6] = 6;
                b[8..24].copy_from_slice(&a.ip().octets());
            }
        }
        b[24..32].copy_from_slice(&self.value.to_le_bytes());
        b[32..40].copy_from_slice(&self.stamp.to_le_bytes());
    }

    /// Reads a header from the start of a record. Never panics, whatever the bytes.
    pub fn decode(rec: &[u8]) -> Result<Header, WireError> {
        if rec.len() < HEADER_LEN {
            return Err(WireError::Short(rec.len()));
        }
        let op = Op::from_u8(rec[0]).ok_or(WireError::Op(rec[0]))?;
        let u16_at = |i: usize| u16::from_le_bytes([rec[i], rec[i + 1]]);
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&rec[i..i + 8]);
            u64::from_le_bytes(a)
        };
        let port = u16_at(4);
        let addr = match rec[6] {
            0 => None,
            4 => Some(SocketAddr::new(
                IpAddr::V4(Ipv4Addr::new(rec[8], rec[9], rec[10], rec[11])),
                port,
            )),
            6 => {
                let mut o = [0u8; 16];
                o.copy_from_slice(&rec[8..24]);
                Some(SocketAddr::new(IpAddr::V6(Ipv6Addr::from(o)), port))
            }
            f => return Err(WireError::Family(f)),
        };
        Ok(Header {
            op,
            flags: rec[1],
            status: u16_at(2),
            addr,
            value: u64_at(24),
            stamp: u64_at(32),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn headers_round_trip() {
        let addrs: [Option<SocketAddr>; 3] = [
            None,
            Some("10.1.2.3:9701".parse().unwrap()),
            Some("[fe80::1]:53".parse().unwrap()),
        ];
        for addr in addrs {
            let h = Header {
                op: Op::Datagram,
                flags: FLAG_KERNEL_STAMP,
                status: 7,
                addr,
                value: u64::MAX - 3,
                stamp: 42,
            };
            let mut buf = [0xAAu8; HEADER_LEN + 3];
            h.encode(&mut buf);
            assert_eq!(Header::decode(&buf), Ok(h));
        }
    }

    #[test]
    fn bad_records_are_refused() {
        assert_eq!(Header::decode(&[1; 10]), Err(WireError::Short(10)));
        let mut b = [0u8; HEADER_LEN];
        b[0] = 200;
        assert_eq!(Header::decode(&b), Err(WireError::Op(200)));
        b[0] = Op::Send as u8;
        b[6] = 5;
        assert_eq!(Header::decode(&b), Err(WireError::Family(5)));
    }

    proptest! {
        #[test]
        fn decoding_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
            let _ = Header::decode(&bytes);
        }
    }
}
