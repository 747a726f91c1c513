//! The shared-memory layout of a channel: one memfd, one header page, two rings.
//!
//! ```text
//!  offset        size          contents                          written by
//!  ------------  ------------  --------------------------------  -------------------------
//!  0             128           ChannelHeader (magic, version,    creator, before hand-off;
//!                              capacity, max message, ...)       read once and validated
//!  512           512           control block of ring 0 (A -> B)  see below
//!  1024          512           control block of ring 1 (B -> A)  see below
//!  4096          capacity      ring 0 data: records              A (producer)
//!  4096+cap      capacity      ring 1 data: records              B (producer)
//!
//!  Control block (CTRL_* offsets; four 128-byte lines, so no two writers share a line or an
//!  adjacent-line pair):
//!  +0    head             u64   consumer: byte index of the next record to read
//!  +128  rx_sleep         u32   futex: 1 while the consumer sleeps on an empty ring
//!  +256  tx_sleep         u32   futex: 1 while the producer sleeps on a full ring
//!  +384  producer_closed  u32   producer: 1 once it has hung up (graceful close)
//!        consumer_closed  u32   consumer: 1 once it has hung up
//!
//!  A record in a ring's data area (8-byte aligned, never split by the end of the ring):
//!  +0    header  u64   bit 63 VALID, bit 62 PAD, bits 32..62 sequence, bits 0..32 length
//!  +8    payload       `length` bytes, padded to a multiple of 8
//! ```
//!
//! Side A sends on ring 0 and receives on ring 1; side B the reverse. The whole file is sealed
//! (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`) once sized, so a peer cannot truncate it under
//! us and turn our loads into `SIGBUS`.
//!
//! Nothing here is trusted after creation: [`Geometry::validate`] re-derives every offset from
//! the capacity and checks the header against it, and each side keeps its own copy of the
//! geometry so a peer that rewrites the header later changes nothing.

/// `b"TESSCHAN"` read as a little-endian u64.
pub const MAGIC: u64 = u64::from_le_bytes(*b"TESSCHAN");
/// Layout version; bumped on any incompatible change of this module.
pub const LAYOUT_VERSION: u32 = 1;
/// The header page and data areas are aligned to this.
pub const PAGE: usize = 4096;
/// Spacing of independently written words (two 64-byte lines: Intel's adjacent-line
/// prefetcher pairs lines, crossbeam's `CachePadded` uses 128 on x86-64 for the same reason).
pub const LINE: usize = 128;
/// Offset of ring `r`'s control block.
pub const fn ctrl_offset(ring: usize) -> usize {
    512 + ring * 512
}
/// Size of a record header.
pub const RECORD_HEADER: usize = 8;
/// Smallest ring capacity accepted.
pub const MIN_CAPACITY: usize = 64;
/// Largest ring capacity accepted (1 GiB per direction).
pub const MAX_CAPACITY: usize = 1 << 30;
/// Largest message size accepted.
pub const MAX_MESSAGE: usize = (MAX_CAPACITY - RECORD_HEADER) / 2 - RECORD_HEADER;

/// Record header bit: this word is a published header (a zero word is the terminator that
/// marks where the producer will write next).
pub const HDR_VALID: u64 = 1 << 63;
/// Record header bit: padding up to the end of the ring; the next record starts at offset 0.
pub const HDR_PAD: u64 = 1 << 62;
/// Mask of the 30-bit sequence number (byte index / 8) stored in bits 32..62.
pub const HDR_SEQ_MASK: u64 = (1 << 30) - 1;

/// Builds a record header for the record starting at byte index `index`.
#[inline(always)]
pub const fn header_word(index: u64, len: u32, pad: bool) -> u64 {
    let seq = (index >> 3) & HDR_SEQ_MASK;
    HDR_VALID | if pad { HDR_PAD } else { 0 } | (seq << 32) | len as u64
}

/// Bytes a record with a `len`-byte payload occupies in the ring.
#[inline(always)]
pub const fn record_size(len: usize) -> usize {
    RECORD_HEADER + ((len + 7) & !7)
}

/// The header at offset 0, as the creator writes it. Plain integers: it is copied out once
/// ([`ChannelHeader::decode`] of the copied bytes) and validated, never used in place.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChannelHeader {
    /// [`MAGIC`].
    pub magic: u64,
    /// [`LAYOUT_VERSION`].
    pub version: u32,
    /// `size_of::<ChannelHeader>()`.
    pub header_size: u32,
    /// Bytes of data per ring (a power of two).
    pub capacity: u64,
    /// Largest payload accepted, in bytes.
    pub max_message: u64,
    /// Total size of the memfd.
    pub total_size: u64,
    /// Offsets of the two ring control blocks.
    pub ctrl_offset: [u64; 2],
    /// Offsets of the two data areas.
    pub data_offset: [u64; 2],
    /// Pid of the creating process (informational).
    pub creator_pid: u32,
    /// Reserved flags, zero.
    pub flags: u32,
    /// `CLOCK_MONOTONIC` nanoseconds at creation (informational).
    pub created_ns: u64,
}

impl ChannelHeader {
    /// Size of the header in shared memory (a multiple of 8).
    pub const SIZE: usize = std::mem::size_of::<ChannelHeader>();

    /// The header's bytes, little-endian, fields at their `repr(C)` offsets.
    pub fn encode(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        let mut put = |off: usize, v: &[u8]| b[off..off + v.len()].copy_from_slice(v);
        put(0, &self.magic.to_le_bytes());
        put(8, &self.version.to_le_bytes());
        put(12, &self.header_size.to_le_bytes());
        put(16, &self.capacity.to_le_bytes());
        put(24, &self.max_message.to_le_bytes());
        put(32, &self.total_size.to_le_bytes());
        put(40, &self.ctrl_offset[0].to_le_bytes());
        put(48, &self.ctrl_offset[1].to_le_bytes());
        put(56, &self.data_offset[0].to_le_bytes());
        put(64, &self.data_offset[1].to_le_bytes());
        put(72, &self.creator_pid.to_le_bytes());
        put(76, &self.flags.to_le_bytes());
        put(80, &self.created_ns.to_le_bytes());
        b
    }

    /// Parses a header copied out of shared memory. Any bytes decode to some header; whether it
    /// describes a usable channel is [`Geometry::validate`]'s question. `None` if `bytes` is
    /// shorter than [`SIZE`](Self::SIZE).
    pub fn decode(bytes: &[u8]) -> Option<ChannelHeader> {
        let b: &[u8; Self::SIZE] = bytes.get(..Self::SIZE)?.try_into().ok()?;
        let u64_at = |off: usize| u64::from_le_bytes(b[off..off + 8].try_into().unwrap());
        let u32_at = |off: usize| u32::from_le_bytes(b[off..off + 4].try_into().unwrap());
        Some(ChannelHeader {
            magic: u64_at(0),
            version: u32_at(8),
            header_size: u32_at(12),
            capacity: u64_at(16),
            max_message: u64_at(24),
            total_size: u64_at(32),
            ctrl_offset: [u64_at(40), u64_at(48)],
            data_offset: [u64_at(56), u64_at(64)],
            creator_pid: u32_at(72),
            flags: u32_at(76),
            created_ns: u64_at(80),
        })
    }
}

/// Size of one ring's control block. Its fields, each alone on a [`LINE`] so no two writers
/// share a line or an adjacent-line pair, are at the `CTRL_*` offsets; all-zero is the initial
/// state. They are words reached only through atomic operations (see `region`), never a struct
/// overlaid on shared memory.
pub const CTRL_SIZE: usize = 4 * LINE;
/// Consumer's head (u64): byte index of the next record to read.
pub const CTRL_HEAD: usize = 0;
/// Futex word (u32): 1 while the consumer sleeps on an empty ring.
pub const CTRL_RX_SLEEP: usize = LINE;
/// Futex word (u32): 1 while the producer sleeps on a full ring.
pub const CTRL_TX_SLEEP: usize = 2 * LINE;
/// Hang-up flag (u32): 1 once the producer has hung up.
pub const CTRL_PRODUCER_CLOSED: usize = 3 * LINE;
/// Hang-up flag (u32): 1 once the consumer has hung up.
pub const CTRL_CONSUMER_CLOSED: usize = 3 * LINE + 4;

/// The sizes every offset is derived from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Bytes of data per ring, a power of two.
    pub capacity: usize,
    /// Largest payload, in bytes.
    pub max_message: usize,
}

/// Why a geometry or header is not acceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// Capacity not a power of two or out of range.
    #[error("ring capacity {capacity} is not a power of two in {MIN_CAPACITY}..={MAX_CAPACITY}")]
    Capacity {
        /// The offending capacity.
        capacity: u64,
    },
    /// The largest record does not fit twice in the ring (progress needs that).
    #[error(
        "max message size {max_message} needs a ring capacity of at least {needed} bytes \
         (have {capacity})"
    )]
    MessageTooLarge {
        /// Requested max message size.
        max_message: u64,
        /// Ring capacity.
        capacity: u64,
        /// Smallest capacity that would do.
        needed: u64,
    },
    /// A header field disagrees with what the geometry implies.
    #[error("channel header field {field} is {found}, expected {expected}")]
    Field {
        /// Field name.
        field: &'static str,
        /// Value found in shared memory.
        found: u64,
        /// Value implied by the rest of the header.
        expected: u64,
    },
}

impl Geometry {
    /// Checks a requested geometry.
    pub fn new(capacity: usize, max_message: usize) -> Result<Geometry, LayoutError> {
        if !capacity.is_power_of_two() || !(MIN_CAPACITY..=MAX_CAPACITY).contains(&capacity) {
            return Err(LayoutError::Capacity {
                capacity: capacity as u64,
            });
        }
        let needed = Self::capacity_for(max_message);
        if max_message > MAX_MESSAGE || needed > capacity {
            return Err(LayoutError::MessageTooLarge {
                max_message: max_message as u64,
                capacity: capacity as u64,
                needed: needed as u64,
            });
        }
        Ok(Geometry {
            capacity,
            max_message,
        })
    }

    /// Smallest capacity (not rounded) that guarantees a maximal record can always be written
    /// into an empty ring: the record, padding in front of it of less than one record, and the
    /// terminator after it.
    pub const fn capacity_for(max_message: usize) -> usize {
        2 * record_size(max_message) + RECORD_HEADER
    }

    /// Offset of ring `r`'s data area.
    pub const fn data_offset(&self, ring: usize) -> usize {
        PAGE + ring * self.capacity
    }

    /// Total size of the memfd.
    pub const fn total_size(&self) -> usize {
        PAGE + 2 * self.capacity
    }

    /// The header the creator writes.
    pub fn header(&self, creator_pid: u32, created_ns: u64) -> ChannelHeader {
        ChannelHeader {
            magic: MAGIC,
            version: LAYOUT_VERSION,
            header_size: std::mem::size_of::<ChannelHeader>() as u32,
            capacity: self.capacity as u64,
            max_message: self.max_message as u64,
            total_size: self.total_size() as u64,
            ctrl_offset: [ctrl_offset(0) as u64, ctrl_offset(1) as u64],
            data_offset: [self.data_offset(0) as u64, self.data_offset(1) as u64],
            creator_pid,
            flags: 0,
            created_ns,
        }
    }

    /// Validates a header read from shared memory and returns the geometry it describes.
    pub fn validate(h: &ChannelHeader) -> Result<Geometry, LayoutError> {
        let field = |field, found: u64, expected: u64| {
            if found == expected {
                Ok(())
            } else {
                Err(LayoutError::Field {
                    field,
                    found,
                    expected,
                })
            }
        };
        field("magic", h.magic, MAGIC)?;
        field("version", h.version.into(), LAYOUT_VERSION.into())?;
        field(
            "header_size",
            h.header_size.into(),
            std::mem::size_of::<ChannelHeader>() as u64,
        )?;
        if h.capacity > MAX_CAPACITY as u64 || h.max_message > MAX_MESSAGE as u64 {
            return Err(LayoutError::Capacity {
                capacity: h.capacity,
            });
        }
        let g = Geometry::new(h.capacity as usize, h.max_message as usize)?;
        field("total_size", h.total_size, g.total_size() as u64)?;
        for r in 0..2 {
            field("ctrl_offset", h.ctrl_offset[r], ctrl_offset(r) as u64)?;
            field("data_offset", h.data_offset[r], g.data_offset(r) as u64)?;
        }
        field("flags", h.flags.into(), 0)?;
        Ok(g)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn control_block_fits_its_slot_and_lines_are_apart() {
        const {
            assert!(CTRL_SIZE == 512);
            assert!(ChannelHeader::SIZE <= ctrl_offset(0));
            assert!(ChannelHeader::SIZE % 8 == 0);
            assert!(ctrl_offset(1) + CTRL_SIZE <= PAGE);
            assert!(CTRL_RX_SLEEP - CTRL_HEAD >= LINE);
            assert!(CTRL_TX_SLEEP - CTRL_RX_SLEEP >= LINE);
            assert!(CTRL_PRODUCER_CLOSED - CTRL_TX_SLEEP >= LINE);
            assert!(CTRL_CONSUMER_CLOSED + 4 <= CTRL_SIZE);
        }
    }

    #[test]
    fn header_bytes_round_trip_at_repr_c_offsets() {
        let h = Geometry::new(1 << 16, 4480).unwrap().header(77, 99);
        assert_eq!(ChannelHeader::decode(&h.encode()), Some(h));
        assert_eq!(std::mem::offset_of!(ChannelHeader, created_ns), 80);
        assert_eq!(std::mem::offset_of!(ChannelHeader, flags), 76);
        assert_eq!(ChannelHeader::decode(&[0u8; 10]), None);
    }

    #[test]
    fn geometry_rules() {
        assert!(Geometry::new(4096, 1000).is_ok());
        assert!(Geometry::new(4095, 8).is_err());
        assert!(Geometry::new(32, 8).is_err());
        // 2 * (8 + 4480) + 8 = 8984 > 8192.
        assert!(matches!(
            Geometry::new(8192, 4480),
            Err(LayoutError::MessageTooLarge { needed: 8984, .. })
        ));
        let g = Geometry::new(1 << 16, 4480).unwrap();
        assert_eq!(Geometry::validate(&g.header(1, 2)), Ok(g));
    }

    #[test]
    fn validation_rejects_every_tampered_field() {
        let g = Geometry::new(1 << 16, 4480).unwrap();
        let good = g.header(1, 2);
        let mut h = good;
        h.magic ^= 1;
        assert!(Geometry::validate(&h).is_err());
        let mut h = good;
        h.capacity = 1 << 40;
        assert!(Geometry::validate(&h).is_err());
        let mut h = good;
        h.max_message = 1 << 20;
        assert!(Geometry::validate(&h).is_err());
        let mut h = good;
        h.total_size += 4096;
        assert!(Geometry::validate(&h).is_err());
        let mut h = good;
        h.data_offset[1] = 0;
        assert!(Geometry::validate(&h).is_err());
    }

    #[test]
    fn header_word_round_trip() {
        let w = header_word(4096 * 9 + 24, 77, false);
        assert_eq!(w & HDR_VALID, HDR_VALID);
        assert_eq!(w & HDR_PAD, 0);
        assert_eq!(w as u32, 77);
        assert_eq!((w >> 32) & HDR_SEQ_MASK, (4096 * 9 + 24) / 8);
        assert_eq!(record_size(0), 8);
        assert_eq!(record_size(1), 16);
        assert_eq!(record_size(8), 16);
        assert_eq!(record_size(9), 24);
    }
}
