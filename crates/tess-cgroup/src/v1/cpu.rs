//! v1 `cpu` controller files.

use crate::fs::Fs;
use crate::Result;
use std::path::Path;
use std::time::Duration;

/// CFS weight; 1024 is the default.
pub const SHARES: &str = "cpu.shares";
/// CFS bandwidth quota in microseconds per period, -1 for none.
pub const CFS_QUOTA_US: &str = "cpu.cfs_quota_us";
/// CFS bandwidth period in microseconds.
pub const CFS_PERIOD_US: &str = "cpu.cfs_period_us";

/// Sets the weight on the v2 scale (1..=10000, default 100), converted to shares (x 1024 / 100).
pub fn set_weight(fs: &Fs, dir: &Path, weight: u32) -> Result<()> {
    let shares = (u64::from(weight) * 1024 / 100).max(2);
    fs.write_if_changed(&dir.join(SHARES), &shares.to_string())
        .map(|_| ())
}

/// Sets or clears a CFS bandwidth limit `(quota, period)`.
pub fn set_bandwidth(fs: &Fs, dir: &Path, limit: Option<(Duration, Duration)>) -> Result<()> {
    match limit {
        Some((quota, period)) => {
            // Quota first to -1 so the period can change without violating the old quota.
            fs.write_if_changed(&dir.join(CFS_QUOTA_US), "-1")?;
            fs.write_if_changed(&dir.join(CFS_PERIOD_US), &period.as_micros().to_string())?;
            fs.write_if_changed(&dir.join(CFS_QUOTA_US), &quota.as_micros().to_string())?;
        }
        None => {
            fs.write_if_changed(&dir.join(CFS_QUOTA_US), "-1")?;
        }
    }
    Ok(())
}
