//! v1 `cpuset` controller files.

use crate::fs::Fs;
use crate::Result;
use std::path::Path;
use tess_sched::HartSet;

/// Harts of the group.
pub const CPUS: &str = "cpuset.cpus";
/// Memory nodes of the group (must be set before tasks can join).
pub const MEMS: &str = "cpuset.mems";
/// Whether the scheduler balances load across this group's harts.
pub const SCHED_LOAD_BALANCE: &str = "cpuset.sched_load_balance";

/// Writes the hart list.
pub fn set_cpus(fs: &Fs, dir: &Path, cpus: &HartSet) -> Result<()> {
    fs.write_if_changed(&dir.join(CPUS), &cpus.to_string())
        .map(|_| ())
}

/// Writes the memory nodes.
pub fn set_mems(fs: &Fs, dir: &Path, mems: &str) -> Result<()> {
    fs.write_if_changed(&dir.join(MEMS), mems).map(|_| ())
}

/// Turns load balancing on or off.
pub fn set_load_balance(fs: &Fs, dir: &Path, on: bool) -> Result<()> {
    fs.write_if_changed(&dir.join(SCHED_LOAD_BALANCE), if on { "1" } else { "0" })
        .map(|_| ())
}
