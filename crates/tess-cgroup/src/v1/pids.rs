//! v1 `pids` controller files (identical on v2).

use crate::fs::Fs;
use crate::Result;
use std::path::Path;

/// Task limit, or `max`.
pub const MAX: &str = "pids.max";

/// Sets or clears the task limit.
pub fn set_max(fs: &Fs, dir: &Path, max: Option<u64>) -> Result<()> {
    let v = max.map_or_else(|| "max".to_string(), |n| n.to_string());
    fs.write_if_changed(&dir.join(MAX), &v).map(|_| ())
}
