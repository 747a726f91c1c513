//! The SLABS network protocol: constants, timing, and the wire format of input and output packets.
//!
//! # Derivation (seed 000, sections 3.1 and 3.2, Fig. 6)
//!
//! The SLABS samples x, y and pressure of each of its 32 pads as 32-bit floats at
//! `fs` = 44.1 kHz and streams them over UDP:
//!
//! ```text
//! packet period    = 2 frames / fs            = 2 / 44100 s   = 45.351 us  (22,050 packets/s)
//! package period   = 16 packets x 2 frames / fs = 32 / 44100 s = 725.624 us (1,378.1 packages/s)
//! deadline         = (64 - 2) frames / fs     = 62 / 44100 s  = 1405.896 us
//! ```
//!
//! The deadline is measured from `t0`, the instant the device sends the first packet of a package
//! (its first two frames were digitised just before). The answer must be back before the device
//! finishes gathering the *next* package, whose 16th packet leaves at
//! `t0 + 31 packet periods = t0 + 62 frames`: hence `(64 - 2) / fs`, slightly less than the
//! two package periods (1451.2 us) the processing could otherwise overlap.
//!
//! Input bandwidth: 96 channels x 32 bit x 44.1 kHz = 135.5 Mbit/s of samples, 139.7 Mbit/s of
//! UDP payload with the 24-byte header below. Output: 8 channels x 32 bit x 44.1 kHz =
//! 11.3 Mbit/s of samples.
//!
//! # Glossary
//! - **frame**: one sampling instant; an input frame holds 32 pads x (x, y, pressure), an output
//!   frame holds 8 channels.
//! - **packet**: one UDP datagram. Input packets carry 2 frames, output packets 32 frames.
//! - **package**: the 16 input packets (32 frames) the host processes as one block, and the one
//!   output packet that answers them. Numbered by `seq`.
//! - **t0 / tf**: device-side send time of a package's first packet / arrival time of its answer
//!   at the device. **t1 / t2**: host-side arrival of the first packet / return of the answer's
//!   `sendto` (section 4). `t2 - t1` approximates `tf - t0`.
//!
//! # Wire format (all fields little-endian)
//!
//! Both directions share a 24-byte header, followed by the samples as IEEE-754 `f32`:
//!
//! ```text
//!  byte 0        4        8      10      12              16                              24
//!       +--------+--------+------+-------+---------------+-------------------------------+
//!       | magic  |  seq   | idx  | flags |      aux      |          timestamp_ns         |
//!       | 4 x u8 |  u32   | u16  |  u16  |      u32      |              u64              |
//!       +--------+--------+------+-------+---------------+-------------------------------+
//!
//!  input  (device -> host), 24 + 768 = 792 bytes:
//!       magic = "SLBI"; seq = package number; idx = packet index 0..=15 within the package;
//!       flags = 0; aux = 0; timestamp_ns = CLOCK_REALTIME when the device sent *this* packet;
//!       payload at byte 24: frame-major, pad-major, 2 x 32 x 3 f32:
//!         offset 24 + ((frame * 32 + pad) * 3 + k) * 4, k = 0 x, 1 y, 2 pressure
//!
//!  output (host -> device), 24 + 1024 = 1048 bytes:
//!       magic = "SLBO"; seq = the answered package; idx = 0; flags = FLAG_*;
//!       aux = host compute time for the package in ns (diagnostic; saturates);
//!       timestamp_ns = echo of the answered package's t0 (the timestamp of its packet 0),
//!                      so the device computes tf - t0 without keeping state;
//!       payload at byte 24: frame-major, 32 x 8 f32:
//!         offset 24 + (frame * 8 + channel) * 4
//! ```
//!
//! # Worked example
//! Packet 37 of a run is packet index `37 % 16 = 5` of package `37 / 16 = 2`. With the first
//! packet of the run sent at `T`, the device sends it at `T + 37 x 2 / 44100 s = T + 1678.0 us`;
//! package 2 began (t0) at `T + 32 x 2 / 44100 s = T + 1451.2 us`, so its answer is on time if it
//! arrives before `T + 1451.2 + 1405.9 = T + 2857.1 us`.

use std::time::Duration;

/// Audio sampling rate of the device, in Hz.
pub const SAMPLE_RATE_HZ: u32 = 44_100;
/// Number of pressure pads.
pub const PADS: usize = 32;
/// Values per pad per frame: x, y, pressure.
pub const VALUES_PER_PAD: usize = 3;
/// Frames in one input packet.
pub const FRAMES_PER_PACKET: usize = 2;
/// Input packets in one package.
pub const PACKETS_PER_PACKAGE: usize = 16;
/// Frames in one package (and in one output packet).
pub const FRAMES_PER_PACKAGE: usize = FRAMES_PER_PACKET * PACKETS_PER_PACKAGE;
/// Output audio channels.
pub const OUTPUT_CHANNELS: usize = 8;

/// Bytes of the common header.
pub const HEADER_BYTES: usize = 24;
/// Bytes of an input packet.
pub const INPUT_PACKET_BYTES: usize = HEADER_BYTES + FRAMES_PER_PACKET * PADS * VALUES_PER_PAD * 4;
/// Bytes of an output packet.
pub const OUTPUT_PACKET_BYTES: usize = HEADER_BYTES + FRAMES_PER_PACKAGE * OUTPUT_CHANNELS * 4;

/// Magic of input packets (device to host).
pub const INPUT_MAGIC: [u8; 4] = *b"SLBI";
/// Magic of output packets (host to device).
pub const OUTPUT_MAGIC: [u8; 4] = *b"SLBO";

/// Output flag: some input packets of the package never arrived; their frames repeat the last
/// known values.
pub const FLAG_INCOMPLETE: u16 = 1 << 0;
/// Output flag: packet 0 of the package was lost, so `timestamp_ns` is the earliest packet that
/// did arrive, not the true t0.
pub const FLAG_NO_FIRST_PACKET: u16 = 1 << 1;

/// Nanoseconds from the start of frame 0 to the start of frame `frames` (exact, rounded down).
pub fn frames_to_ns(frames: u64) -> u64 {
    (u128::from(frames) * 1_000_000_000 / u128::from(SAMPLE_RATE_HZ)) as u64
}

/// Offset of packet `k` (counted from the first packet of the run) from the run's start, in ns.
/// Computed exactly from the frame count so that pacing never drifts.
pub fn packet_offset_ns(k: u64) -> u64 {
    frames_to_ns(k * FRAMES_PER_PACKET as u64)
}

/// One packet period, 2 / 44100 s = 45.351 us.
pub const PACKET_PERIOD: Duration = Duration::from_nanos(45_351);
/// One package period, 32 / 44100 s = 725.624 us.
pub const PACKAGE_PERIOD: Duration = Duration::from_nanos(725_624);
/// The response-time deadline, (64 - 2) / 44100 s = 1405.896 us.
pub const DEADLINE: Duration = Duration::from_nanos(1_405_896);
/// [`DEADLINE`] in nanoseconds.
pub const DEADLINE_NS: u64 = 1_405_896;
/// [`PACKAGE_PERIOD`] in nanoseconds.
pub const PACKAGE_PERIOD_NS: u64 = 725_624;

/// One pad's reading in one frame.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PadSample {
    /// Horizontal position, 0..=1 (sets the gaussian width of the Migrator).
    pub x: f32,
    /// Vertical position, 0..=1 (selects one of 4 pitch tables).
    pub y: f32,
    /// Pressure, 0..=1 (amplitude; 0 is silent).
    pub pressure: f32,
}

/// The 24-byte header shared by both directions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// [`INPUT_MAGIC`] or [`OUTPUT_MAGIC`].
    pub magic: [u8; 4],
    /// Package sequence number (wraps at 2^32).
    pub seq: u32,
    /// Packet index within the package (0..=15 for input, 0 for output).
    pub index: u16,
    /// `FLAG_*` bits (output only).
    pub flags: u16,
    /// Output: host compute time in ns. Input: zero.
    pub aux: u32,
    /// Input: this packet's send time. Output: the answered package's t0. CLOCK_REALTIME ns.
    pub timestamp_ns: u64,
}

/// A malformed datagram.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Wrong size for its kind.
    #[error("datagram of {got} bytes where a SLABS {kind} packet has {want}")]
    Length {
        /// `input` or `output`.
        kind: &'static str,
        /// Bytes received.
        got: usize,
        /// Bytes expected.
        want: usize,
    },
    /// Unknown magic.
    #[error("datagram with magic {got:02x?}, expected {want:?}")]
    Magic {
        /// Bytes found.
        got: [u8; 4],
        /// Expected magic, as text.
        want: &'static str,
    },
    /// Packet index outside 0..=15.
    #[error("input packet index {0} outside 0..=15")]
    Index(u16),
}

impl Header {
    /// Writes the header into the first 24 bytes of `buf`.
    pub fn write(&self, buf: &mut [u8]) {
        buf[0..4].copy_from_slice(&self.magic);
        buf[4..8].copy_from_slice(&self.seq.to_le_bytes());
        buf[8..10].copy_from_slice(&self.index.to_le_bytes());
        buf[10..12].copy_from_slice(&self.flags.to_le_bytes());
        buf[12..16].copy_from_slice(&self.aux.to_le_bytes());
        buf[16..24].copy_from_slice(&self.timestamp_ns.to_le_bytes());
    }

    /// Reads a header from the first 24 bytes of `buf` (which must hold at least 24).
    pub fn read(buf: &[u8]) -> Header {
        let u32_at = |o: usize| u32::from_le_bytes([buf[o], buf[o + 1], buf[o + 2], buf[o + 3]]);
        let u16_at = |o: usize| u16::from_le_bytes([buf[o], buf[o + 1]]);
        let mut ts = [0u8; 8];
        ts.copy_from_slice(&buf[16..24]);
        Header {
            magic: [buf[0], buf[1], buf[2], buf[3]],
            seq: u32_at(4),
            index: u16_at(8),
            flags: u16_at(10),
            aux: u32_at(12),
            timestamp_ns: u64::from_le_bytes(ts),
        }
    }
}

#[inline]
fn f32_at(buf: &[u8], offset: usize) -> f32 {
    f32::from_le_bytes([
        buf[offset],
        buf[offset + 1],
        buf[offset + 2],
        buf[offset + 3],
    ])
}

/// Byte offset of value `k` (0 x, 1 y, 2 pressure) of `pad` in `frame` of an input packet.
#[inline]
pub const fn input_value_offset(frame: usize, pad: usize, k: usize) -> usize {
    HEADER_BYTES + ((frame * PADS + pad) * VALUES_PER_PAD + k) * 4
}

/// Byte offset of `channel` in `frame` of an output packet.
#[inline]
pub const fn output_value_offset(frame: usize, channel: usize) -> usize {
    HEADER_BYTES + (frame * OUTPUT_CHANNELS + channel) * 4
}

/// Encodes an input packet into `buf`.
pub fn encode_input(
    buf: &mut [u8; INPUT_PACKET_BYTES],
    seq: u32,
    index: u16,
    send_ns: u64,
    frames: &[[PadSample; PADS]; FRAMES_PER_PACKET],
) {
    Header {
        magic: INPUT_MAGIC,
        seq,
        index,
        flags: 0,
        aux: 0,
        timestamp_ns: send_ns,
    }
    .write(&mut buf[..]);
    for (f, frame) in frames.iter().enumerate() {
        for (p, s) in frame.iter().enumerate() {
            for (k, v) in [s.x, s.y, s.pressure].into_iter().enumerate() {
                let o = input_value_offset(f, p, k);
                buf[o..o + 4].copy_from_slice(&v.to_le_bytes());
            }
        }
    }
}

/// Overwrites only the timestamp of an encoded packet (the emulator encodes the samples ahead of
/// time and stamps the packet just before `sendto`).
#[inline]
pub fn stamp(buf: &mut [u8], timestamp_ns: u64) {
    buf[16..24].copy_from_slice(&timestamp_ns.to_le_bytes());
}

/// Decodes an input packet: returns its header and writes its two frames into `frames`.
pub fn decode_input(
    buf: &[u8],
    frames: &mut [[PadSample; PADS]; FRAMES_PER_PACKET],
) -> Result<Header, WireError> {
    if buf.len() != INPUT_PACKET_BYTES {
        return Err(WireError::Length {
            kind: "input",
            got: buf.len(),
            want: INPUT_PACKET_BYTES,
        });
    }
    let h = Header::read(buf);
    if h.magic != INPUT_MAGIC {
        return Err(WireError::Magic {
            got: h.magic,
            want: "SLBI",
        });
    }
    if usize::from(h.index) >= PACKETS_PER_PACKAGE {
        return Err(WireError::Index(h.index));
    }
    for (f, frame) in frames.iter_mut().enumerate() {
        for (p, s) in frame.iter_mut().enumerate() {
            s.x = f32_at(buf, input_value_offset(f, p, 0));
            s.y = f32_at(buf, input_value_offset(f, p, 1));
            s.pressure = f32_at(buf, input_value_offset(f, p, 2));
        }
    }
    Ok(h)
}

/// Encodes an output packet: header plus `audio[frame][channel]`.
pub fn encode_output(
    buf: &mut [u8; OUTPUT_PACKET_BYTES],
    header: &Header,
    audio: &[[f32; OUTPUT_CHANNELS]; FRAMES_PER_PACKAGE],
) {
    header.write(&mut buf[..]);
    for (f, frame) in audio.iter().enumerate() {
        for (c, v) in frame.iter().enumerate() {
            let o = output_value_offset(f, c);
            buf[o..o + 4].copy_from_slice(&v.to_le_bytes());
        }
    }
}

/// Checks an output packet and returns its header (the device needs nothing else to time it).
pub fn decode_output_header(buf: &[u8]) -> Result<Header, WireError> {
    if buf.len() != OUTPUT_PACKET_BYTES {
        return Err(WireError::Length {
            kind: "output",
            got: buf.len(),
            want: OUTPUT_PACKET_BYTES,
        });
    }
    let h = Header::read(buf);
    if h.magic != OUTPUT_MAGIC {
        return Err(WireError::Magic {
            got: h.magic,
            want: "SLBO",
        });
    }
    Ok(h)
}

/// Decodes the audio of an output packet into `audio[frame][channel]`.
pub fn decode_output_audio(
    buf: &[u8],
    audio: &mut [[f32; OUTPUT_CHANNELS]; FRAMES_PER_PACKAGE],
) -> Result<Header, WireError> {
    let h = decode_output_header(buf)?;
    for (f, frame) in audio.iter_mut().enumerate() {
        for (c, v) in frame.iter_mut().enumerate() {
            *v = f32_at(buf, output_value_offset(f, c));
        }
    }
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timing_constants_follow_from_the_sample_rate() {
        assert_eq!(INPUT_PACKET_BYTES, 792);
        assert_eq!(OUTPUT_PACKET_BYTES, 1048);
        assert_eq!(FRAMES_PER_PACKAGE, 32);
        assert_eq!(frames_to_ns(2), PACKET_PERIOD.as_nanos() as u64);
        // 32 / 44100 s = 725623.58 ns; the constant rounds to the nearest ns.
        assert_eq!(frames_to_ns(32), PACKAGE_PERIOD_NS - 1);
        // 62 / 44100 s = 1405895.69 ns; the constant rounds up to the next whole ns.
        assert_eq!(frames_to_ns(62), DEADLINE_NS - 1);
        assert_eq!(DEADLINE.as_nanos() as u64, DEADLINE_NS);
        // The worked example of the module docs.
        assert_eq!(packet_offset_ns(37), 1_678_004);
        assert_eq!(packet_offset_ns(32) + DEADLINE_NS, 2_857_143);
        // No drift: a million packets later we are still on the exact frame grid.
        assert_eq!(packet_offset_ns(22_050), 1_000_000_000);
    }

    #[test]
    fn input_round_trips() {
        let mut frames = [[PadSample::default(); PADS]; FRAMES_PER_PACKET];
        for (f, frame) in frames.iter_mut().enumerate() {
            for (p, s) in frame.iter_mut().enumerate() {
                *s = PadSample {
                    x: p as f32 / 32.0,
                    y: f as f32,
                    pressure: 0.5 + p as f32,
                };
            }
        }
        let mut buf = [0u8; INPUT_PACKET_BYTES];
        encode_input(&mut buf, 7, 15, 123_456_789, &frames);
        stamp(&mut buf, 42);
        assert_eq!(&buf[0..4], b"SLBI");
        // Pad 1 pressure of frame 1 sits where the diagram says.
        let o = input_value_offset(1, 1, 2);
        assert_eq!(o, 24 + ((32 + 1) * 3 + 2) * 4);
        assert_eq!(f32::from_le_bytes(buf[o..o + 4].try_into().unwrap()), 1.5);
        let mut back = [[PadSample::default(); PADS]; FRAMES_PER_PACKET];
        let h = decode_input(&buf, &mut back).unwrap();
        assert_eq!((h.seq, h.index, h.timestamp_ns), (7, 15, 42));
        assert_eq!(back, frames);
    }

    #[test]
    fn output_round_trips_and_rejects_garbage() {
        let mut audio = [[0f32; OUTPUT_CHANNELS]; FRAMES_PER_PACKAGE];
        for (f, frame) in audio.iter_mut().enumerate() {
            for (c, v) in frame.iter_mut().enumerate() {
                *v = f as f32 * 10.0 + c as f32;
            }
        }
        let h = Header {
            magic: OUTPUT_MAGIC,
            seq: u32::MAX,
            index: 0,
            flags: FLAG_INCOMPLETE,
            aux: 1234,
            timestamp_ns: u64::MAX - 1,
        };
        let mut buf = [0u8; OUTPUT_PACKET_BYTES];
        encode_output(&mut buf, &h, &audio);
        let mut back = [[0f32; OUTPUT_CHANNELS]; FRAMES_PER_PACKAGE];
        assert_eq!(decode_output_audio(&buf, &mut back).unwrap(), h);
        assert_eq!(back, audio);
        assert!(matches!(
            decode_output_header(&buf[..100]),
            Err(WireError::Length { got: 100, .. })
        ));
        let mut frames = [[PadSample::default(); PADS]; FRAMES_PER_PACKET];
        assert!(decode_input(&buf[..INPUT_PACKET_BYTES], &mut frames).is_err());
        let mut bad = [0u8; INPUT_PACKET_BYTES];
        encode_input(&mut bad, 0, 16, 0, &frames);
        assert_eq!(decode_input(&bad, &mut frames), Err(WireError::Index(16)));
    }
}
