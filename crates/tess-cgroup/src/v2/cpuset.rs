//! v2 `cpuset` controller files.

use crate::fs::Fs;
use crate::Result;
use std::path::Path;
use tess_sched::HartSet;

/// Harts the group asks for.
pub const CPUS: &str = "cpuset.cpus";
/// `member`, `root` or `isolated`.
pub const PARTITION: &str = "cpuset.cpus.partition";

/// Partition states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Partition {
    /// An ordinary member of its parent's partition.
    Member,
    /// A partition root: its own root domain, load balanced inside.
    Root,
    /// An isolated partition: its own harts, no load balancing (dedicated cells).
    Isolated,
}

impl Partition {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Partition::Member => "member",
            Partition::Root => "root",
            Partition::Isolated => "isolated",
        }
    }
}

/// Writes the hart list.
pub fn set_cpus(fs: &Fs, dir: &Path, cpus: &HartSet) -> Result<()> {
    fs.write_if_changed(&dir.join(CPUS), &cpus.to_string())
        .map(|_| ())
}

/// Sets the partition state. The kernel reports an invalid partition by reading back
/// `root invalid (reason)`; that is surfaced as an error.
pub fn set_partition(fs: &Fs, dir: &Path, p: Partition) -> Result<()> {
    let path = dir.join(PARTITION);
    fs.write_if_changed(&path, p.as_str())?;
    let now = fs.read(&path)?;
    if now.contains("invalid") {
        return Err(crate::CgroupError::Write {
            path,
            value: p.as_str().into(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, now.trim().to_string()),
        });
    }
    Ok(())
}
