//! v2 `cpu` controller files.

use crate::fs::Fs;
use crate::Result;
use std::path::Path;
use std::time::Duration;

/// CFS weight, 1..=10000, default 100.
pub const WEIGHT: &str = "cpu.weight";
/// CFS bandwidth: `QUOTA PERIOD` in microseconds, or `max PERIOD`.
pub const MAX: &str = "cpu.max";

/// Sets the weight.
pub fn set_weight(fs: &Fs, dir: &Path, weight: u32) -> Result<()> {
    fs.write_if_changed(&dir.join(WEIGHT), &weight.clamp(1, 10_000).to_string())
        .map(|_| ())
}

/// Sets or clears a CFS bandwidth limit.
pub fn set_max(fs: &Fs, dir: &Path, limit: Option<(Duration, Duration)>) -> Result<()> {
    let v = match limit {
        Some((q, p)) => format!("{} {}", q.as_micros(), p.as_micros()),
        None => "max 100000".to_string(),
    };
    fs.write_if_changed(&dir.join(MAX), &v).map(|_| ())
}
