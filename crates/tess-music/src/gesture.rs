//! Gesture scripts: which pads are pressed, where and how hard, over time, so that runs repeat.
//!
//! # Model
//! Each pad that appears in the script has keyframes `(t, x, y, p)`; between keyframes every
//! value is interpolated linearly:
//!
//! ```text
//! v(t) = v_i + (v_{i+1} - v_i) * (t - t_i) / (t_{i+1} - t_i)      for t_i <= t < t_{i+1}
//! ```
//!
//! Before its first keyframe a pad holds the first keyframe's values; after its last it holds the
//! last, unless the script (or the pad) has a loop period `loop_s`: then time is taken modulo
//! `loop_s`, and after the last keyframe the values glide back to the first keyframe, which recurs
//! at `t_first + loop_s`. Pads absent from the script are never pressed (pressure 0).
//!
//! The emulator evaluates the script once per frame, at `t = frame / 44100 s`.
//!
//! # Glossary
//! - **x**: horizontal position 0..=1; the Migrator's gaussian width.
//! - **y**: vertical position 0..=1; selects one of the pad's 4 pitch tables (`floor(4y)`).
//! - **p**: pressure 0..=1; amplitude, silent at 0.
//!
//! # Format (TOML)
//! ```toml
//! name = "two pads"
//! loop_s = 4.0                      # optional: repeat every 4 s
//! [[pads]]
//! pad = 0                           # 0..=31
//! keys = [
//!   { t = 0.0, x = 0.0, y = 0.1, p = 0.0 },
//!   { t = 0.5, x = 0.3, y = 0.1, p = 0.8 },   # pressed over half a second
//!   { t = 3.0, x = 0.3, y = 0.6, p = 0.8 },   # slides up into table 2
//! ]
//! [[pads]]
//! pad = 7
//! loop_s = 1.0                      # optional per-pad period
//! keys = [{ t = 0.0, x = 0.5, y = 0.9, p = 1.0 }]
//! ```
//!
//! # Worked example
//! For pad 0 above at `t = 0.25 s`: halfway between the first two keyframes, so
//! `x = 0.15, y = 0.1, p = 0.4`. At `t = 3.5 s` the pad is gliding back to its first keyframe,
//! which recurs at `0 + 4 = 4 s`: a fraction `(3.5 - 3) / (4 - 3) = 0.5` of the way, so
//! `x = 0.15, y = 0.35, p = 0.4`. At `t = 4.25 s` it is at `t = 0.25 s` again.

use crate::slabs::{PadSample, PADS, SAMPLE_RATE_HZ};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// A keyframe of one pad.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Key {
    /// Time in seconds from the start of the script (or of the loop).
    pub t: f64,
    /// Horizontal position, 0..=1.
    pub x: f32,
    /// Vertical position, 0..=1.
    pub y: f32,
    /// Pressure, 0..=1.
    pub p: f32,
}

/// The keyframes of one pad.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PadTrack {
    /// Pad number, 0..=31.
    pub pad: usize,
    /// Loop period of this pad in seconds; overrides the script's.
    #[serde(default)]
    pub loop_s: Option<f64>,
    /// Keyframes in increasing time.
    pub keys: Vec<Key>,
}

/// A gesture script.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gesture {
    /// Name shown in reports.
    #[serde(default)]
    pub name: String,
    /// Loop period of every pad in seconds, unless a pad sets its own.
    #[serde(default)]
    pub loop_s: Option<f64>,
    /// The pads that are touched at some time.
    #[serde(default)]
    pub pads: Vec<PadTrack>,
}

/// A gesture script that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum GestureError {
    /// The file could not be read.
    #[error("cannot read gesture file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The TOML does not parse into a gesture.
    #[error("gesture file {path} is not a valid gesture script: {source}")]
    Parse {
        /// The file (`<inline>` for text).
        path: PathBuf,
        /// Cause.
        #[source]
        source: Box<toml::de::Error>,
    },
    /// A value is out of range or the keyframes are not in order.
    #[error("gesture {path}: pad {pad}: {reason}")]
    Invalid {
        /// The file (`<inline>` for text).
        path: PathBuf,
        /// The offending pad.
        pad: usize,
        /// What is wrong.
        reason: String,
    },
}

impl Gesture {
    /// Reads and validates a gesture file.
    pub fn load(path: &Path) -> Result<Gesture, GestureError> {
        let text = std::fs::read_to_string(path).map_err(|source| GestureError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse_at(&text, path)
    }

    /// Parses and validates gesture text.
    pub fn parse(text: &str) -> Result<Gesture, GestureError> {
        Self::parse_at(text, Path::new("<inline>"))
    }

    fn parse_at(text: &str, path: &Path) -> Result<Gesture, GestureError> {
        let g: Gesture = toml::from_str(text).map_err(|source| GestureError::Parse {
            path: path.to_path_buf(),
            source: Box::new(source),
        })?;
        g.validate(path)?;
        Ok(g)
    }

    /// A script holding `pads` pressed at constant values, for tests and measurements.
    pub fn constant(pads: &[(usize, PadSample)]) -> Gesture {
        Gesture {
            name: "constant".into(),
            loop_s: None,
            pads: pads
                .iter()
                .map(|&(pad, s)| PadTrack {
                    pad,
                    loop_s: None,
                    keys: vec![Key {
                        t: 0.0,
                        x: s.x,
                        y: s.y,
                        p: s.pressure,
                    }],
                })
                .collect(),
        }
    }

    fn validate(&self, path: &Path) -> Result<(), GestureError> {
        let invalid = |pad: usize, reason: String| GestureError::Invalid {
            path: path.to_path_buf(),
            pad,
            reason,
        };
        if let Some(l) = self.loop_s {
            if !(l.is_finite() && l > 0.0) {
                return Err(invalid(
                    0,
                    format!("script loop_s {l} is not a positive time"),
                ));
            }
        }
        let mut seen = [false; PADS];
        for track in &self.pads {
            let pad = track.pad;
            if pad >= PADS {
                return Err(invalid(pad, format!("pad number outside 0..={}", PADS - 1)));
            }
            if std::mem::replace(&mut seen[pad], true) {
                return Err(invalid(pad, "pad listed twice".into()));
            }
            if track.keys.is_empty() {
                return Err(invalid(pad, "no keyframes".into()));
            }
            if let Some(l) = track.loop_s {
                if !(l.is_finite() && l > 0.0) {
                    return Err(invalid(pad, format!("loop_s {l} is not a positive time")));
                }
            }
            let mut last_t = f64::NEG_INFINITY;
            for k in &track.keys {
                if !(k.t.is_finite() && k.t >= 0.0) {
                    return Err(invalid(pad, format!("keyframe time {} is not >= 0", k.t)));
                }
                if k.t <= last_t {
                    return Err(invalid(
                        pad,
                        format!("keyframe times must increase, {} follows {last_t}", k.t),
                    ));
                }
                last_t = k.t;
                for (name, v) in [("x", k.x), ("y", k.y), ("p", k.p)] {
                    if !(0.0..=1.0).contains(&v) {
                        return Err(invalid(
                            pad,
                            format!("{name} = {v} at t = {} outside 0..=1", k.t),
                        ));
                    }
                }
            }
            if let Some(l) = track.loop_s.or(self.loop_s) {
                if last_t >= l + track.keys[0].t {
                    return Err(invalid(
                        pad,
                        format!("last keyframe at {last_t} s does not fit the {l} s loop"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Number of pads with non-zero pressure at some keyframe.
    pub fn pads_pressed(&self) -> usize {
        self.pads
            .iter()
            .filter(|t| t.keys.iter().any(|k| k.p > 0.0))
            .count()
    }

    /// Values of every pad at `t_s` seconds. Allocation-free.
    pub fn evaluate(&self, t_s: f64, out: &mut [PadSample; PADS]) {
        *out = [PadSample::default(); PADS];
        for track in &self.pads {
            out[track.pad] = track.at(t_s, track.loop_s.or(self.loop_s));
        }
    }

    /// Values of every pad at frame `frame` (44.1 kHz frames from the start of the run).
    pub fn frame(&self, frame: u64, out: &mut [PadSample; PADS]) {
        self.evaluate(frame as f64 / f64::from(SAMPLE_RATE_HZ), out);
    }
}

impl PadTrack {
    fn at(&self, t_s: f64, loop_s: Option<f64>) -> PadSample {
        let keys = &self.keys;
        let first = keys[0];
        let sample = |k: &Key| PadSample {
            x: k.x,
            y: k.y,
            pressure: k.p,
        };
        let t = match loop_s {
            // Map into [t_first, t_first + loop).
            Some(l) => first.t + (t_s - first.t).rem_euclid(l),
            None => t_s,
        };
        if t <= first.t {
            return sample(&first);
        }
        // Index of the last keyframe at or before t.
        let i = keys.partition_point(|k| k.t <= t) - 1;
        let (a, b) = match (keys.get(i + 1), loop_s) {
            (Some(next), _) => (keys[i], *next),
            (None, Some(l)) => (
                keys[i],
                Key {
                    t: first.t + l,
                    ..first
                },
            ),
            (None, None) => return sample(&keys[i]),
        };
        let u = ((t - a.t) / (b.t - a.t)) as f32;
        let lerp = |va: f32, vb: f32| va + (vb - va) * u;
        PadSample {
            x: lerp(a.x, b.x),
            y: lerp(a.y, b.y),
            pressure: lerp(a.p, b.p),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC_EXAMPLE: &str = r#"
name = "two pads"
loop_s = 4.0
[[pads]]
pad = 0
keys = [
  { t = 0.0, x = 0.0, y = 0.1, p = 0.0 },
  { t = 0.5, x = 0.3, y = 0.1, p = 0.8 },
  { t = 3.0, x = 0.3, y = 0.6, p = 0.8 },
]
[[pads]]
pad = 7
loop_s = 1.0
keys = [{ t = 0.0, x = 0.5, y = 0.9, p = 1.0 }]
"#;

    fn close(a: PadSample, x: f32, y: f32, p: f32) -> bool {
        (a.x - x).abs() < 1e-6 && (a.y - y).abs() < 1e-6 && (a.pressure - p).abs() < 1e-6
    }

    #[test]
    fn worked_example_of_the_docs() {
        let g = Gesture::parse(DOC_EXAMPLE).unwrap();
        let mut out = [PadSample::default(); PADS];
        g.evaluate(0.25, &mut out);
        assert!(close(out[0], 0.15, 0.1, 0.4), "{:?}", out[0]);
        assert!(close(out[7], 0.5, 0.9, 1.0));
        assert_eq!(out[1], PadSample::default());
        g.evaluate(3.5, &mut out);
        assert!(close(out[0], 0.15, 0.35, 0.4), "{:?}", out[0]);
        g.evaluate(4.25, &mut out);
        assert!(close(out[0], 0.15, 0.1, 0.4), "{:?}", out[0]);
        assert_eq!(g.pads_pressed(), 2);
    }

    #[test]
    fn without_loop_values_hold_at_the_ends() {
        let g = Gesture::parse(
            "[[pads]]\npad = 3\nkeys = [{ t = 1.0, x = 0.2, y = 0.2, p = 0.2 }, { t = 2.0, x = 1.0, y = 1.0, p = 1.0 }]",
        )
        .unwrap();
        let mut out = [PadSample::default(); PADS];
        g.evaluate(0.0, &mut out);
        assert!(close(out[3], 0.2, 0.2, 0.2));
        g.evaluate(100.0, &mut out);
        assert!(close(out[3], 1.0, 1.0, 1.0));
        g.frame(44_100 * 3 / 2, &mut out);
        assert!(close(out[3], 0.6, 0.6, 0.6));
    }

    #[test]
    fn invalid_scripts_name_the_pad_and_the_problem() {
        let cases = [
            ("[[pads]]\npad = 32\nkeys = [{ t = 0.0, x = 0.0, y = 0.0, p = 0.0 }]", "outside 0..=31"),
            ("[[pads]]\npad = 1\nkeys = []", "no keyframes"),
            ("[[pads]]\npad = 1\nkeys = [{ t = 0.0, x = 1.5, y = 0.0, p = 0.0 }]", "x = 1.5"),
            (
                "[[pads]]\npad = 1\nkeys = [{ t = 1.0, x = 0.0, y = 0.0, p = 0.0 }, { t = 0.5, x = 0.0, y = 0.0, p = 0.0 }]",
                "must increase",
            ),
            (
                "loop_s = 1.0\n[[pads]]\npad = 1\nkeys = [{ t = 0.0, x = 0.0, y = 0.0, p = 0.0 }, { t = 2.0, x = 0.0, y = 0.0, p = 0.0 }]",
                "does not fit",
            ),
        ];
        for (text, want) in cases {
            let err = Gesture::parse(text).unwrap_err().to_string();
            assert!(err.contains(want), "{err} should mention {want}");
        }
        assert!(matches!(
            Gesture::parse("pads = 3"),
            Err(GestureError::Parse { .. })
        ));
    }

    #[test]
    fn shipped_gestures_parse() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("gestures");
        let default = Gesture::load(&dir.join("default.toml")).unwrap();
        assert!(default.pads_pressed() >= 16);
        let all = Gesture::load(&dir.join("all-pads.toml")).unwrap();
        assert_eq!(all.pads_pressed(), PADS);
        let mut out = [PadSample::default(); PADS];
        all.evaluate(1.0, &mut out);
        assert!(out.iter().all(|s| s.pressure > 0.0));
    }
}
