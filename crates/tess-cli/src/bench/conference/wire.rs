//! What the sender and the receivers agree on: the frame header on the TCP stream and the
//! schedule of releases and resizes.

/// Incoming video streams (the paper's nine participants).
pub const STREAMS: usize = 9;
/// Frames per second of every stream.
pub const FPS: u64 = 30;
/// The hello byte of the hog's connection (a stream's is its number).
pub const HOG_HELLO: u8 = 255;
/// Bytes of [`FrameHeader`] on the wire.
pub const HEADER_LEN: usize = 24;
const MAGIC: u32 = 0x434f_4e46; // "CONF"

/// The header before each access unit: little-endian magic, sequence number, release time
/// (`CLOCK_MONOTONIC` ns, the sender's and the receiver's clock are the same machine's), a
/// large flag, the stream and the payload's length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// Frame number in the stream.
    pub seq: u32,
    /// When the frame was due to be sent.
    pub release_ns: u64,
    /// Whether the frame is of the large encoding.
    pub large: bool,
    /// The stream.
    pub stream: u8,
    /// Bytes of access unit that follow.
    pub len: u32,
}

/// Largest access unit a receiver accepts.
pub const MAX_FRAME: u32 = 4 << 20;

impl FrameHeader {
    /// The header's bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&self.seq.to_le_bytes());
        b[8..16].copy_from_slice(&self.release_ns.to_le_bytes());
        b[16] = u8::from(self.large);
        b[17] = self.stream;
        b[20..24].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Parses a header; a wrong magic, stream or length is an error (the stream is corrupt).
    pub fn decode(b: &[u8; HEADER_LEN]) -> anyhow::Result<FrameHeader> {
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        anyhow::ensure!(u32_at(0) == MAGIC, "bad frame header magic");
        let h = FrameHeader {
            seq: u32_at(4),
            release_ns: u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
            large: b[16] != 0,
            stream: b[17],
            len: u32_at(20),
        };
        anyhow::ensure!(
            usize::from(h.stream) < STREAMS,
            "frame of stream {}",
            h.stream
        );
        anyhow::ensure!(h.len > 0 && h.len <= MAX_FRAME, "frame of {} bytes", h.len);
        Ok(h)
    }
}

/// When frames are released and which stream is large.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Schedule {
    /// Start of the run, `CLOCK_MONOTONIC` ns.
    pub t0_ns: u64,
    /// Length of the run, s.
    pub secs: f64,
    /// Seconds between resizes.
    pub resize_every: f64,
}

impl Schedule {
    /// End of the run.
    pub fn end_ns(&self) -> u64 {
        self.t0_ns + (self.secs * 1e9) as u64
    }

    /// Release time of frame `seq` of `stream`: every 1/30 s, the streams spread evenly over
    /// the frame period (as independent remote cameras are).
    pub fn release_ns(&self, stream: usize, seq: u32) -> u64 {
        let period = 1_000_000_000 / FPS;
        self.t0_ns + stream as u64 * period / STREAMS as u64 + u64::from(seq) * 1_000_000_000 / FPS
    }

    /// The large stream at `t_ns`, if any: resize `n` (at `n * resize_every`) makes stream
    /// `(n - 1) / 2` (mod 9) large for odd `n` and all streams small again for even `n`, so one
    /// stream at most is large and the large one changes.
    pub fn large_at(&self, t_ns: u64) -> Option<usize> {
        let t = t_ns.saturating_sub(self.t0_ns) as f64 / 1e9;
        let n = (t / self.resize_every).floor() as usize;
        (n % 2 == 1).then(|| ((n - 1) / 2) % STREAMS)
    }

    /// Times of the resizes, s from `t0`.
    pub fn resizes(&self) -> Vec<f64> {
        (1..)
            .map(|n| n as f64 * self.resize_every)
            .take_while(|&t| t < self.secs)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_round_trips_and_corruption_is_refused() {
        let h = FrameHeader {
            seq: 42,
            release_ns: 123_456_789_012,
            large: true,
            stream: 8,
            len: 1234,
        };
        assert_eq!(FrameHeader::decode(&h.encode()).unwrap(), h);
        let mut bad = h.encode();
        bad[0] ^= 1;
        assert!(FrameHeader::decode(&bad).is_err());
        let mut bad = h.encode();
        bad[17] = 9;
        assert!(FrameHeader::decode(&bad).is_err());
        let mut bad = h.encode();
        bad[20..24].copy_from_slice(&(MAX_FRAME + 1).to_le_bytes());
        assert!(FrameHeader::decode(&bad).is_err());
    }

    #[test]
    fn one_stream_at_most_is_large_and_each_takes_its_turn() {
        let s = Schedule {
            t0_ns: 1_000_000_000,
            secs: 60.0,
            resize_every: 8.0,
        };
        let at = |t: f64| s.large_at(s.t0_ns + (t * 1e9) as u64);
        assert_eq!(at(0.0), None);
        assert_eq!(at(7.9), None);
        assert_eq!(at(8.0), Some(0));
        assert_eq!(at(16.5), None);
        assert_eq!(at(24.1), Some(1));
        assert_eq!(at(40.0), Some(2));
        assert_eq!(s.resizes(), vec![8.0, 16.0, 24.0, 32.0, 40.0, 48.0, 56.0]);
        // Releases: 1/30 s apart, streams spread over the period.
        assert_eq!(s.release_ns(0, 1) - s.release_ns(0, 0), 33_333_333);
        // Thirty frames a second exactly: frame 30 opens the next second.
        assert_eq!(s.release_ns(0, 30) - s.release_ns(0, 0), 1_000_000_000);
        assert_eq!(s.release_ns(1, 0) - s.release_ns(0, 0), 33_333_333 / 9);
    }
}
