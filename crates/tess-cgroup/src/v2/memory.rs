//! v2 `memory` controller files.

use crate::fs::Fs;
use crate::Result;
use std::path::Path;

/// Hard limit in bytes, or `max`.
pub const MAX: &str = "memory.max";

/// Sets or clears the memory limit.
pub fn set_max(fs: &Fs, dir: &Path, limit: Option<u64>) -> Result<()> {
    let v = limit.map_or_else(|| "max".to_string(), |b| b.to_string());
    fs.write_if_changed(&dir.join(MAX), &v).map(|_| ())
}
