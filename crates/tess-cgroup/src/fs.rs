//! File access for cgroup control files, with errors that carry the path and the value.

use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

/// A failed cgroup operation, e.g. "failed to write 2-3 to /sys/fs/cgroup/cpuset/tess/cells/audio
/// /cpuset.cpus: invalid argument".
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// Writing a control file failed.
    #[error("failed to write {value:?} to {}: {source}", path.display())]
    Write {
        /// File.
        path: PathBuf,
        /// What was written.
        value: String,
        /// OS error.
        #[source]
        source: std::io::Error,
    },
    /// Reading a control file failed.
    #[error("failed to read {}: {source}", path.display())]
    Read {
        /// File.
        path: PathBuf,
        /// OS error.
        #[source]
        source: std::io::Error,
    },
    /// Creating or removing a group failed.
    #[error("failed to {op} {}: {source}", path.display())]
    Dir {
        /// "create" or "remove".
        op: &'static str,
        /// Directory.
        path: PathBuf,
        /// OS error.
        #[source]
        source: std::io::Error,
    },
    /// No usable hierarchy, or a needed controller is missing.
    #[error("cgroups: {0}")]
    Unsupported(String),
}

impl CgroupError {
    /// The OS error number, if any.
    pub fn errno(&self) -> Option<i32> {
        match self {
            CgroupError::Write { source, .. }
            | CgroupError::Read { source, .. }
            | CgroupError::Dir { source, .. } => source.raw_os_error(),
            CgroupError::Unsupported(_) => None,
        }
    }
}

/// Control-file access. In `fake` mode (tests over a temporary directory) writes create missing
/// files, standing in for the kernel's pre-made control files.
#[derive(Debug, Clone, Copy, Default)]
pub struct Fs {
    fake: bool,
}

impl Fs {
    /// Access to a real cgroup filesystem.
    pub fn real() -> Fs {
        Fs { fake: false }
    }

    /// Access to a directory standing in for one.
    pub fn fake() -> Fs {
        Fs { fake: true }
    }

    /// Whether this is a stand-in.
    pub fn is_fake(&self) -> bool {
        self.fake
    }

    /// Writes `value` to `path` in one `write(2)`, as the kernel expects.
    pub fn write(&self, path: &Path, value: &str) -> Result<(), CgroupError> {
        let res = std::fs::OpenOptions::new()
            .write(true)
            .truncate(self.fake)
            .create(self.fake)
            .open(path)
            .and_then(|mut f| f.write_all(value.as_bytes()));
        res.map_err(|source| CgroupError::Write {
            path: path.to_path_buf(),
            value: value.to_string(),
            source,
        })
    }

    /// Writes only if the current content differs (after trimming); saves kernel work such as
    /// sched-domain rebuilds on no-op updates.
    pub fn write_if_changed(&self, path: &Path, value: &str) -> Result<bool, CgroupError> {
        if let Ok(cur) = tess_sched::proc::read_kernel_file(path) {
            if cur.trim() == value.trim() {
                return Ok(false);
            }
        }
        self.write(path, value)?;
        Ok(true)
    }

    /// Reads a control file.
    pub fn read(&self, path: &Path) -> Result<String, CgroupError> {
        tess_sched::proc::read_kernel_file(path).map_err(|source| CgroupError::Read {
            path: path.to_path_buf(),
            source,
        })
    }

    /// Reads a list of ids (one per line), as in `tasks` and `cgroup.procs`. A missing file
    /// (group gone) reads as empty.
    pub fn read_ids(&self, path: &Path) -> Result<Vec<i32>, CgroupError> {
        match tess_sched::proc::read_kernel_file(path) {
            Ok(s) => Ok(s.lines().filter_map(|l| l.trim().parse().ok()).collect()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(Vec::new()),
            Err(source) => Err(CgroupError::Read {
                path: path.to_path_buf(),
                source,
            }),
        }
    }

    /// Creates a group directory (no error if it exists).
    pub fn mkdir(&self, path: &Path) -> Result<bool, CgroupError> {
        match std::fs::create_dir(path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(false),
            Err(source) => Err(CgroupError::Dir {
                op: "create",
                path: path.to_path_buf(),
                source,
            }),
        }
    }

    /// Removes an (empty) group directory; missing is fine. On a stand-in the files inside are
    /// removed too (the kernel's control files vanish with the group).
    pub fn rmdir(&self, path: &Path) -> Result<(), CgroupError> {
        let res = if self.fake {
            std::fs::remove_dir_all(path)
        } else {
            std::fs::remove_dir(path)
        };
        match res {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(source) => Err(CgroupError::Dir {
                op: "remove",
                path: path.to_path_buf(),
                source,
            }),
        }
    }

    /// Subdirectories of `path` (child groups), sorted.
    pub fn children(&self, path: &Path) -> Vec<String> {
        let Ok(rd) = std::fs::read_dir(path) else {
            return Vec::new();
        };
        let mut v: Vec<String> = rd
            .filter_map(|e| {
                let e = e.ok()?;
                if e.file_type().ok()?.is_dir() {
                    e.file_name().into_string().ok()
                } else {
                    None
                }
            })
            .collect();
        v.sort();
        v
    }

    /// Moves every id listed in `from_file` into `to_file`, one write each; ids that cannot move
    /// (exited, or kernel threads) are skipped. Returns how many moved.
    pub fn move_all(&self, from_file: &Path, to_file: &Path) -> Result<usize, CgroupError> {
        let mut moved = 0;
        for id in self.read_ids(from_file)? {
            if self.write(to_file, &id.to_string()).is_ok() {
                moved += 1;
            }
        }
        Ok(moved)
    }
}
