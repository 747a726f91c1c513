//! File access for cgroup control files, with errors that carry the path and the value.

use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

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

/// What the backends ask of the kernel: its control files, and where a task last ran.
///
/// [`KernelFiles`] is the real thing; the backends' unit tests run over a model of cgroupfs in
/// a temporary directory (`fs::model`, test builds only), so that production code has one path
/// and no stand-in branches.
pub trait Kernel: Send + Sync + std::fmt::Debug {
    /// Writes `value` to the control file `path` in one `write(2)`.
    fn write_file(&self, path: &Path, value: &str) -> std::io::Result<()>;
    /// Reads a control file.
    fn read_file(&self, path: &Path) -> std::io::Result<String>;
    /// Creates a group directory (the kernel fills it with its control files).
    fn make_dir(&self, path: &Path) -> std::io::Result<()>;
    /// Removes an empty group directory (its control files go with it).
    fn remove_dir(&self, path: &Path) -> std::io::Result<()>;
    /// The hart task `pid` last ran on, if it exists.
    fn last_hart(&self, pid: i32) -> Option<usize>;
}

/// The running kernel: `/sys/fs/cgroup` files and `/proc`.
#[derive(Debug, Clone, Copy, Default)]
pub struct KernelFiles;

impl Kernel for KernelFiles {
    fn write_file(&self, path: &Path, value: &str) -> std::io::Result<()> {
        // Never O_CREAT: a control file the kernel did not make (a controller that is off)
        // must fail as missing.
        std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .and_then(|mut f| f.write_all(value.as_bytes()))
    }
    fn read_file(&self, path: &Path) -> std::io::Result<String> {
        tess_sched::proc::read_kernel_file(path)
    }
    fn make_dir(&self, path: &Path) -> std::io::Result<()> {
        std::fs::create_dir(path)
    }
    fn remove_dir(&self, path: &Path) -> std::io::Result<()> {
        std::fs::remove_dir(path)
    }
    fn last_hart(&self, pid: i32) -> Option<usize> {
        tess_sched::proc::last_hart(pid)
    }
}

/// Control-file access with errors that name the file and the value, over a [`Kernel`].
#[derive(Debug, Clone)]
pub struct Fs {
    kernel: Arc<dyn Kernel>,
}

impl Default for Fs {
    fn default() -> Fs {
        Fs::real()
    }
}

impl Fs {
    /// Access to the running kernel's cgroup filesystems.
    pub fn real() -> Fs {
        Fs::over(Arc::new(KernelFiles))
    }

    /// Access through `kernel` (the tests' model of cgroupfs).
    pub fn over(kernel: Arc<dyn Kernel>) -> Fs {
        Fs { kernel }
    }

    /// The hart task `pid` last ran on, if it exists.
    pub fn last_hart(&self, pid: i32) -> Option<usize> {
        self.kernel.last_hart(pid)
    }

    /// Writes `value` to `path` in one `write(2)`, as the kernel expects.
    pub fn write(&self, path: &Path, value: &str) -> Result<(), CgroupError> {
        self.kernel
            .write_file(path, value)
            .map_err(|source| CgroupError::Write {
                path: path.to_path_buf(),
                value: value.to_string(),
                source,
            })
    }

    /// Writes only if the current content differs (after trimming); saves kernel work such as
    /// sched-domain rebuilds on no-op updates.
    pub fn write_if_changed(&self, path: &Path, value: &str) -> Result<bool, CgroupError> {
        if let Ok(cur) = self.kernel.read_file(path) {
            if cur.trim() == value.trim() {
                return Ok(false);
            }
        }
        self.write(path, value)?;
        Ok(true)
    }

    /// Reads a control file.
    pub fn read(&self, path: &Path) -> Result<String, CgroupError> {
        self.kernel
            .read_file(path)
            .map_err(|source| CgroupError::Read {
                path: path.to_path_buf(),
                source,
            })
    }

    /// Reads a list of ids (one per line), as in `tasks` and `cgroup.procs`. A missing file
    /// (group gone) reads as empty.
    pub fn read_ids(&self, path: &Path) -> Result<Vec<i32>, CgroupError> {
        match self.kernel.read_file(path) {
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
        match self.kernel.make_dir(path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(false),
            Err(source) => Err(CgroupError::Dir {
                op: "create",
                path: path.to_path_buf(),
                source,
            }),
        }
    }

    /// Removes an (empty) group directory; missing is fine.
    pub fn rmdir(&self, path: &Path) -> Result<(), CgroupError> {
        match self.kernel.remove_dir(path) {
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

    /// Removes group `dir` after moving its processes to `to_procs` (a `cgroup.procs`),
    /// retrying for up to [`EVACUATE_LIMIT`] while the kernel says the group is busy: a process
    /// that forks between the move and the removal (a browser shutting down its helpers) puts
    /// its child where the parent was, and a task that is exiting keeps the group populated
    /// until it has left. A group that is gone already is not an error.
    pub fn evacuate_and_rmdir(&self, dir: &Path, to_procs: &Path) -> Result<(), CgroupError> {
        let started = std::time::Instant::now();
        loop {
            self.move_all(&dir.join("cgroup.procs"), to_procs)?;
            match self.kernel.remove_dir(dir) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
                Err(e)
                    if e.raw_os_error() == Some(libc::EBUSY)
                        && started.elapsed() < EVACUATE_LIMIT =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(source) => {
                    return Err(CgroupError::Dir {
                        op: "remove",
                        path: dir.to_path_buf(),
                        source,
                    })
                }
            }
        }
    }
}

/// How long [`Fs::evacuate_and_rmdir`] keeps moving tasks out of a busy group.
pub const EVACUATE_LIMIT: std::time::Duration = std::time::Duration::from_secs(2);

#[cfg(test)]
pub(crate) mod model;
