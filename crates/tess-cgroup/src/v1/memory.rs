//! v1 `memory` controller files.

use crate::fs::Fs;
use crate::Result;
use std::path::Path;

/// Hard limit in bytes, -1 for none.
pub const LIMIT_IN_BYTES: &str = "memory.limit_in_bytes";

/// Sets or clears the memory limit.
pub fn set_limit(fs: &Fs, dir: &Path, limit: Option<u64>) -> Result<()> {
    let v = limit.map_or_else(|| "-1".to_string(), |b| b.to_string());
    // The kernel prints "unlimited" as a large page-aligned number, so compare loosely.
    if limit.is_none() {
        if let Ok(cur) = fs.read(&dir.join(LIMIT_IN_BYTES)) {
            if cur.trim().parse::<u64>().is_ok_and(|n| n >= (1u64 << 62)) {
                return Ok(());
            }
        }
    }
    fs.write_if_changed(&dir.join(LIMIT_IN_BYTES), &v)
        .map(|_| ())
}
