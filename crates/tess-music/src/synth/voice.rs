//! One Migrator object: a voice of `n` sinusoidal oscillators whose frequencies migrate.
//!
//! # Behaviour (seed 000, section 3.2)
//! - Each oscillator migrates every `migrate_s` seconds on average; migrations within a voice are
//!   staggered evenly: the voice migrates one oscillator (round robin) every `migrate_s / n`
//!   seconds, and voice `v` starts `v / 32` of that interval late, so no two voices migrate in the
//!   same block by design. In blocks: the voice earns `n / (migrate_s * 1378.125)` migrations
//!   per block (a package is 32/44100 s) and performs one whenever the credit reaches 1.
//! - A migrating oscillator glides to its new frequency, exponentially (linearly in pitch) over
//!   `glide_s`; with `glide_s = 0` it jumps. The phase is continuous either way (see `osc`).
//! - New frequencies are drawn from the pad's current table and gaussian width (`tables`), so
//!   moving `y` to another table makes the voice *migrate* into it over `migrate_s`.
//! - Pressure `p` scales the voice; its gain ramps linearly across the block from the previous
//!   package's pressure to this one's, so pressure changes do not click.
//! - A voice is computed only while its pad is pressed or its gain is still ramping down to 0.
//!   When a pad is pressed after silence, all `n` oscillators are drawn afresh (the "voice
//!   activation" of the paper), with random phases.
//!
//! # Glossary
//! - **credit**: fractional migrations owed to a voice, `n / (migrate_s * 1378.125)` per block;
//!   **glide**: an oscillator moving in pitch towards a new frequency over `glide_s`;
//!   **gain ramp**: linear interpolation of the pressure across the block's 32 frames.
//!
//! # Worked example
//! `n = 100`, `migrate_s = 4`: the voice migrates one oscillator every 40 ms, i.e. every
//! `4 * 1378.125 / 100 = 55.1` packages; with `glide_s = 0.2` each glide lasts 275.6 packages,
//! so about 5 oscillators of the voice are gliding at any time.

use super::osc::{fold_lanes, Accumulator, OscBank, LANES};
use super::rng::Rng;
use super::tables::Tables;
use crate::slabs::{PadSample, FRAMES_PER_PACKAGE, SAMPLE_RATE_HZ};

/// Packages per second: 44100 / 32.
pub const PACKAGES_PER_S: f64 = SAMPLE_RATE_HZ as f64 / FRAMES_PER_PACKAGE as f64;
/// Most glides in flight per voice; a migration beyond that finishes the oldest glide at once.
pub const MAX_GLIDES: usize = 16;

/// Parameters of a Migrator voice.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VoiceParams {
    /// Oscillators per voice (the paper: 100).
    pub oscillators: usize,
    /// Mean time between two migrations of the same oscillator, in seconds.
    pub migrate_s: f64,
    /// Duration of a migration glide, in seconds (0 = jump).
    pub glide_s: f64,
    /// Output level of a voice at full pressure, as RMS of its sum (the oscillators' amplitude is
    /// `level * sqrt(2 / n)`).
    pub level: f32,
}

impl Default for VoiceParams {
    fn default() -> Self {
        VoiceParams {
            oscillators: 100,
            migrate_s: 4.0,
            glide_s: 0.2,
            level: 0.1,
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Glide {
    osc: usize,
    log2_hz: f64,
    step: f64,
    left: u32,
}

/// One Migrator object.
#[derive(Debug, Clone)]
pub struct Voice {
    pad: usize,
    params: VoiceParams,
    bank: OscBank,
    rng: Rng,
    amp: f32,
    gain: f32,
    sounding: bool,
    credit: f64,
    credit_per_block: f64,
    next_osc: usize,
    glide_blocks: u32,
    glides: [Glide; MAX_GLIDES],
    n_glides: usize,
    migrations: u64,
    out: [f32; FRAMES_PER_PACKAGE],
}

impl Voice {
    /// A silent voice for `pad`; its random stream derives from `seed` and the pad.
    pub fn new(pad: usize, params: VoiceParams, seed: u64) -> Voice {
        let n = params.oscillators;
        let per_block = if params.migrate_s > 0.0 {
            n as f64 / (params.migrate_s * PACKAGES_PER_S)
        } else {
            0.0
        };
        Voice {
            pad,
            params,
            bank: OscBank::new(n),
            rng: Rng::new(seed ^ (pad as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)),
            amp: params.level * (2.0 / n.max(1) as f32).sqrt(),
            gain: 0.0,
            sounding: false,
            // Stagger: voice v starts v/32 of an interval into its cycle.
            credit: pad as f64 / crate::slabs::PADS as f64,
            credit_per_block: per_block,
            next_osc: 0,
            glide_blocks: (params.glide_s * PACKAGES_PER_S).round() as u32,
            glides: [Glide::default(); MAX_GLIDES],
            n_glides: 0,
            migrations: 0,
            out: [0.0; FRAMES_PER_PACKAGE],
        }
    }

    /// The pad this voice answers.
    pub fn pad(&self) -> usize {
        self.pad
    }

    /// Whether the voice must be computed for a package whose control is `ctl`.
    #[inline]
    pub fn needs_processing(&self, ctl: &PadSample) -> bool {
        ctl.pressure > 0.0 || self.gain > 0.0
    }

    /// Computes the next block for control `ctl` into [`Voice::output`]. Returns `false`, and
    /// computes nothing, when the pad is not pressed and the voice has faded out.
    /// Allocation-free.
    pub fn process(&mut self, ctl: &PadSample, tables: &Tables) -> bool {
        let target = ctl.pressure.clamp(0.0, 1.0);
        if !self.needs_processing(ctl) {
            return false;
        }
        let table = Tables::table_for_y(ctl.y);
        let sigma = Tables::sigma_for_x(ctl.x);
        if !self.sounding {
            self.activate(table, sigma, tables);
        }
        self.migrate(table, sigma, tables);
        self.advance_glides();

        let mut acc: Accumulator = [[0.0; LANES]; FRAMES_PER_PACKAGE];
        self.bank.render(&mut acc);
        fold_lanes(&acc, &mut self.out);
        let g0 = self.gain;
        let dg = (target - g0) / FRAMES_PER_PACKAGE as f32;
        for (f, o) in self.out.iter_mut().enumerate() {
            *o *= g0 + dg * (f + 1) as f32;
        }
        self.gain = target;
        if target == 0.0 {
            // Faded out: the next press draws the voice afresh.
            self.sounding = false;
        }
        true
    }

    /// The last block computed (meaningful when the last [`Voice::process`] returned `true`).
    pub fn output(&self) -> &[f32; FRAMES_PER_PACKAGE] {
        &self.out
    }

    /// Number of migrations performed so far.
    pub fn migrations(&self) -> u64 {
        self.migrations
    }

    /// The oscillator bank (for tests and analysis).
    pub fn bank(&self) -> &OscBank {
        &self.bank
    }

    fn activate(&mut self, table: usize, sigma: f64, tables: &Tables) {
        for i in 0..self.params.oscillators {
            let hz = tables.draw_hz(self.pad, table, sigma, &mut self.rng);
            let phase = self.rng.uniform() * std::f64::consts::TAU;
            self.bank.set(i, hz, self.amp, phase);
        }
        self.n_glides = 0;
        self.sounding = true;
    }

    fn migrate(&mut self, table: usize, sigma: f64, tables: &Tables) {
        self.credit += self.credit_per_block;
        while self.credit >= 1.0 {
            self.credit -= 1.0;
            let osc = self.next_osc;
            self.next_osc = (self.next_osc + 1) % self.params.oscillators.max(1);
            let hz = tables.draw_hz(self.pad, table, sigma, &mut self.rng);
            self.migrations += 1;
            // An oscillator still gliding restarts from where it is.
            if let Some(k) = self.glides[..self.n_glides]
                .iter()
                .position(|g| g.osc == osc)
            {
                self.remove_glide(k);
            }
            if self.glide_blocks == 0 {
                self.bank.set_frequency(osc, hz);
                continue;
            }
            if self.n_glides == MAX_GLIDES {
                // Finish the oldest glide now to make room.
                let g = self.glides[0];
                let end = g.log2_hz + g.step * f64::from(g.left);
                self.bank.set_frequency(g.osc, end.exp2());
                self.remove_glide(0);
            }
            let from = self.bank.frequency(osc).abs().max(1.0).log2();
            self.glides[self.n_glides] = Glide {
                osc,
                log2_hz: from,
                step: (hz.log2() - from) / f64::from(self.glide_blocks),
                left: self.glide_blocks,
            };
            self.n_glides += 1;
        }
    }

    fn remove_glide(&mut self, k: usize) {
        self.glides.copy_within(k + 1..self.n_glides, k);
        self.n_glides -= 1;
    }

    fn advance_glides(&mut self) {
        let mut k = 0;
        while k < self.n_glides {
            let g = &mut self.glides[k];
            g.log2_hz += g.step;
            g.left -= 1;
            let (osc, hz, done) = (g.osc, g.log2_hz.exp2(), g.left == 0);
            self.bank.set_frequency(osc, hz);
            if done {
                self.remove_glide(k);
            } else {
                k += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pressed(x: f32, y: f32, p: f32) -> PadSample {
        PadSample { x, y, pressure: p }
    }

    #[test]
    fn silent_pad_is_not_computed_and_release_fades_out() {
        let tables = Tables::new();
        let mut v = Voice::new(3, VoiceParams::default(), 1);
        assert!(!v.process(&pressed(0.0, 0.0, 0.0), &tables));
        assert!(v.process(&pressed(0.0, 0.0, 1.0), &tables));
        assert!(v.output().iter().any(|s| *s != 0.0));
        // Released: one more block ramps the gain to zero, ending exactly at silence.
        assert!(v.process(&pressed(0.0, 0.0, 0.0), &tables));
        assert_eq!(v.output()[FRAMES_PER_PACKAGE - 1], 0.0);
        assert!(!v.process(&pressed(0.0, 0.0, 0.0), &tables));
        assert!(!v.sounding);
    }

    #[test]
    fn oscillators_migrate_at_the_documented_rate_and_stay_on_the_table() {
        let tables = Tables::new();
        let params = VoiceParams {
            glide_s: 0.0,
            ..VoiceParams::default()
        };
        let mut v = Voice::new(8, params, 5);
        let ctl = pressed(0.0, 0.3, 1.0);
        let blocks = (PACKAGES_PER_S * 8.0) as usize; // 8 s
        for _ in 0..blocks {
            v.process(&ctl, &tables);
        }
        // 100 oscillators every 4 s on average: 200 migrations in 8 s.
        assert!((199..=201).contains(&v.migrations()), "{}", v.migrations());
        let allowed = tables.frequencies_hz(8, 1);
        for i in 0..100 {
            let f = v.bank().frequency(i);
            assert!(allowed.iter().any(|a| (a - f).abs() < 0.05), "{f} Hz");
        }
    }

    #[test]
    fn glides_end_on_the_drawn_frequency() {
        let tables = Tables::new();
        let mut v = Voice::new(0, VoiceParams::default(), 9);
        let ctl = pressed(0.0, 0.9, 1.0);
        for _ in 0..(PACKAGES_PER_S * 3.0) as usize {
            v.process(&ctl, &tables);
        }
        // Stop migrating new ones (a pad's voice keeps migrating, so look only at
        // oscillators not in flight).
        let allowed = tables.frequencies_hz(0, 3);
        let in_flight: Vec<usize> = v.glides[..v.n_glides].iter().map(|g| g.osc).collect();
        assert!(v.n_glides <= MAX_GLIDES);
        for i in (0..100).filter(|i| !in_flight.contains(i)) {
            let f = v.bank().frequency(i);
            assert!(allowed.iter().any(|a| (a - f).abs() < 0.05), "{f} Hz");
        }
    }
}
