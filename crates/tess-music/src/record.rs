//! Preallocated recorders for the audio path: per-package latency samples and output audio.
//!
//! Both are sized before the run and never grow, so pushing is allocation-free and system-call
//! free; what does not fit is counted, not stored. [`SampleLog`] is a single-producer,
//! append-only log that other threads may read while it fills (a statistics thread answering
//! "how are we doing" on request): a reader sees a prefix of the samples, and each sample it sees
//! is complete because `len` is published with Release after the sample is written.
//!
//! WAV output: 8 channels of 32-bit float at 44.1 kHz (`WAVE_FORMAT_IEEE_FLOAT`), written with
//! the `hound` crate after the run.
//!
//! Worked example: 60 s of packages is `60 * 44100 / 32 = 82,688` samples, 331 KB as `u32`
//! nanoseconds; 60 s of 8-channel audio is `60 * 44100 * 8 * 4` bytes = 84.7 MB.

use crate::slabs::{FRAMES_PER_PACKAGE, OUTPUT_CHANNELS, SAMPLE_RATE_HZ};
use crate::synth::AudioBlock;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// An append-only log of `u32` samples (nanoseconds) with a fixed capacity.
#[derive(Debug)]
pub struct SampleLog {
    slots: Box<[AtomicU32]>,
    len: AtomicUsize,
    dropped: AtomicU64,
}

impl SampleLog {
    /// A log for up to `capacity` samples.
    pub fn with_capacity(capacity: usize) -> SampleLog {
        SampleLog {
            slots: (0..capacity).map(|_| AtomicU32::new(0)).collect(),
            len: AtomicUsize::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    /// Appends `ns` (saturated to `u32::MAX`, 4.29 s). Only one thread may push.
    #[inline]
    pub fn push(&self, ns: u64) {
        let n = self.len.load(Ordering::Relaxed);
        match self.slots.get(n) {
            Some(slot) => {
                slot.store(ns.min(u64::from(u32::MAX)) as u32, Ordering::Relaxed);
                self.len.store(n + 1, Ordering::Release);
            }
            None => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Samples stored so far.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    /// Whether nothing was stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Samples that did not fit.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// A copy of the samples stored so far, in nanoseconds.
    pub fn snapshot_ns(&self) -> Vec<u32> {
        let n = self.len();
        self.slots[..n]
            .iter()
            .map(|s| s.load(Ordering::Relaxed))
            .collect()
    }

    /// A copy of the samples stored so far, in microseconds.
    pub fn snapshot_us(&self) -> Vec<f64> {
        self.snapshot_ns()
            .into_iter()
            .map(|ns| f64::from(ns) / 1000.0)
            .collect()
    }
}

/// Output audio kept in memory during the run, written as WAV afterwards.
#[derive(Debug)]
pub struct AudioRecorder {
    samples: Vec<f32>,
    dropped_blocks: u64,
}

impl AudioRecorder {
    /// A recorder for up to `seconds` of audio (all memory is allocated here).
    pub fn with_seconds(seconds: f64) -> AudioRecorder {
        let frames = (seconds.max(0.0) * f64::from(SAMPLE_RATE_HZ)) as usize;
        AudioRecorder {
            samples: Vec::with_capacity(frames * OUTPUT_CHANNELS),
            dropped_blocks: 0,
        }
    }

    /// Appends one block if it fits. Allocation-free.
    #[inline]
    pub fn push(&mut self, block: &AudioBlock) {
        if self.samples.capacity() - self.samples.len() < FRAMES_PER_PACKAGE * OUTPUT_CHANNELS {
            self.dropped_blocks += 1;
            return;
        }
        for frame in block {
            self.samples.extend_from_slice(frame);
        }
    }

    /// Interleaved samples recorded so far.
    pub fn samples(&self) -> &[f32] {
        &self.samples
    }

    /// Blocks that did not fit.
    pub fn dropped_blocks(&self) -> u64 {
        self.dropped_blocks
    }

    /// Writes the recording as an 8-channel float WAV file.
    pub fn write_wav(&self, path: &Path) -> Result<(), hound::Error> {
        write_wav(path, OUTPUT_CHANNELS, &self.samples)
    }
}

/// Writes interleaved `f32` samples at 44.1 kHz as a float WAV file.
pub fn write_wav(path: &Path, channels: usize, interleaved: &[f32]) -> Result<(), hound::Error> {
    let spec = hound::WavSpec {
        channels: channels as u16,
        sample_rate: SAMPLE_RATE_HZ,
        bits_per_sample: 32,
        sample_format: hound::SampleFormat::Float,
    };
    let mut w = hound::WavWriter::create(path, spec)?;
    for s in interleaved {
        w.write_sample(*s)?;
    }
    w.finalize()
}

/// Reads channel `channel` of a float WAV file (as written by [`write_wav`]).
pub fn read_wav_channel(path: &Path, channel: usize) -> Result<Vec<f32>, hound::Error> {
    let mut r = hound::WavReader::open(path)?;
    let n = usize::from(r.spec().channels);
    let all: Result<Vec<f32>, _> = r.samples::<f32>().collect();
    Ok(all?.into_iter().skip(channel).step_by(n).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_keeps_a_prefix_and_counts_the_rest() {
        let log = SampleLog::with_capacity(3);
        for ns in [1_000, 2_000, u64::MAX, 4] {
            log.push(ns);
        }
        assert_eq!(log.snapshot_ns(), vec![1_000, 2_000, u32::MAX]);
        assert_eq!(log.dropped(), 1);
        assert_eq!(log.snapshot_us()[1], 2.0);
    }

    #[test]
    fn wav_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.wav");
        let mut rec = AudioRecorder::with_seconds(0.002);
        let mut block = [[0.0; OUTPUT_CHANNELS]; FRAMES_PER_PACKAGE];
        for (f, frame) in block.iter_mut().enumerate() {
            for (c, s) in frame.iter_mut().enumerate() {
                *s = (f * 10 + c) as f32 / 1000.0;
            }
        }
        rec.push(&block);
        rec.push(&block);
        rec.push(&block); // 88 frames fit: the third block does not.
        assert_eq!(rec.dropped_blocks(), 1);
        rec.write_wav(&path).unwrap();
        let ch3 = read_wav_channel(&path, 3).unwrap();
        assert_eq!(ch3.len(), 64);
        assert_eq!(ch3[5], 0.053);
    }
}
