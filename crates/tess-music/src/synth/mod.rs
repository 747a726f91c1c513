//! The Migrator Synthesizer (seed 000, section 3.2): 32 Migrator objects of 100 sinusoidal
//! oscillators, a voice activation that computes only pressed pads, and a mixer that folds the
//! voices into the 8 output channels of the SLABS.
//!
//! # Signal flow and cost
//! ```text
//! 16 input packets --> controls[pad] = (x, y, p) of the package's last frame
//!                  --> Voice[pad].process (only if p > 0 or fading out)   32 x 100 oscillators
//!                  --> Mixer: channel c = 0.5 * sum of voices c, c+8, c+16, c+24
//!                  --> one output packet of 32 frames x 8 channels
//! ```
//! Work per package for the full Migrator: 32 x 100 oscillators x 32 frames = 102,400
//! oscillator-samples, every 32 / 44100 s = 725.6 us, i.e. 141 million oscillator-samples per
//! second.
//!
//! # Glossary
//! - **voice / Migrator object**: the oscillators of one pad ([`voice::Voice`]).
//! - **table**: a microtonal pitch probability table ([`tables`]).
//! - **migration**: an oscillator moving to a newly drawn frequency.
//! - **block**: the 32 frames of one package.
//!
//! # Worked example
//! With pads 0 and 8 pressed at pressure 1, channel 0 carries `0.5 * (voice 0 + voice 8)`: two
//! voices of RMS 0.1 each (uncorrelated), so about `0.5 * sqrt(2) * 0.1 = 0.071` RMS.
//!
//! Real-time rules: [`Engine::process`], [`voice::Voice::process`] and [`Mixer`] neither
//! allocate, lock nor make system calls (`tests/no_alloc.rs` proves the first).

pub mod osc;
pub mod rng;
pub mod tables;
pub mod voice;

use crate::slabs::{PadSample, FRAMES_PER_PACKAGE, OUTPUT_CHANNELS, PADS};
pub use tables::Tables;
pub use voice::{Voice, VoiceParams};

/// One package of output audio: `block[frame][channel]`.
pub type AudioBlock = [[f32; OUTPUT_CHANNELS]; FRAMES_PER_PACKAGE];

/// Gain of each voice in its channel: 4 voices share a channel.
pub const MIX_GAIN: f32 = 0.5;

/// The output channel of `pad`'s voice: the pad's column, `pad % 8`.
#[inline]
pub const fn channel_of(pad: usize) -> usize {
    pad % OUTPUT_CHANNELS
}

/// Folds voice outputs into the 8 output channels.
#[derive(Debug, Default, Clone, Copy)]
pub struct Mixer;

impl Mixer {
    /// Clears `out`.
    #[inline]
    pub fn clear(out: &mut AudioBlock) {
        *out = [[0.0; OUTPUT_CHANNELS]; FRAMES_PER_PACKAGE];
    }

    /// Adds voice `pad`'s block into its channel.
    #[inline]
    pub fn add(out: &mut AudioBlock, pad: usize, voice: &[f32; FRAMES_PER_PACKAGE]) {
        let c = channel_of(pad);
        for (frame, s) in out.iter_mut().zip(voice) {
            frame[c] += MIX_GAIN * s;
        }
    }
}

/// Synthesizer parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SynthParams {
    /// Voice parameters (oscillators per voice, migration, glide, level).
    pub voice: VoiceParams,
    /// Seed of every random stream.
    pub seed: u64,
}

impl Default for SynthParams {
    fn default() -> Self {
        SynthParams {
            voice: VoiceParams::default(),
            seed: 0x5EED_0000,
        }
    }
}

/// The whole Migrator on one thread: 32 voices, tables and mixer.
#[derive(Debug, Clone)]
pub struct Engine {
    tables: Tables,
    voices: Vec<Voice>,
}

impl Engine {
    /// Builds all 32 voices (all memory is allocated here).
    pub fn new(params: &SynthParams) -> Engine {
        Engine {
            tables: Tables::new(),
            voices: (0..PADS)
                .map(|p| Voice::new(p, params.voice, params.seed))
                .collect(),
        }
    }

    /// Computes one package: every voice whose pad is pressed (or fading), mixed into `out`.
    /// Returns the number of voices computed. Allocation-free.
    pub fn process(&mut self, controls: &[PadSample; PADS], out: &mut AudioBlock) -> usize {
        Mixer::clear(out);
        let mut active = 0;
        for (v, ctl) in self.voices.iter_mut().zip(controls) {
            if v.process(ctl, &self.tables) {
                Mixer::add(out, v.pad(), v.output());
                active += 1;
            }
        }
        active
    }

    /// The pitch tables.
    pub fn tables(&self) -> &Tables {
        &self.tables
    }

    /// The voices.
    pub fn voices(&self) -> &[Voice] {
        &self.voices
    }

    /// Splits into tables and voices (the multi-threaded host hands voices to workers).
    pub fn into_parts(self) -> (Tables, Vec<Voice>) {
        (self.tables, self.voices)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_pressed_pads_reach_their_channels() {
        let mut e = Engine::new(&SynthParams::default());
        let mut ctl = [PadSample::default(); PADS];
        ctl[10] = PadSample {
            x: 0.1,
            y: 0.5,
            pressure: 0.8,
        };
        let mut out = [[0.0; OUTPUT_CHANNELS]; FRAMES_PER_PACKAGE];
        let mut energy = [0f64; OUTPUT_CHANNELS];
        for _ in 0..50 {
            assert_eq!(e.process(&ctl, &mut out), 1);
            for frame in &out {
                for (c, s) in frame.iter().enumerate() {
                    energy[c] += f64::from(*s) * f64::from(*s);
                }
            }
        }
        assert!(energy[2] > 0.0);
        for (c, e) in energy.iter().enumerate() {
            if c != 2 {
                assert_eq!(*e, 0.0, "channel {c}");
            }
        }
        // Voice RMS at pressure 0.8 is about 0.08, times the mix gain 0.5.
        let rms = (energy[2] / (50.0 * 32.0)).sqrt();
        assert!(rms > 0.01 && rms < 0.1, "rms {rms}");
    }
}
