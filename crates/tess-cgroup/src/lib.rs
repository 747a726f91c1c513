//! cgroup backends for tess.
//!
//! One interface ([`Backend`]) realises a [`tess_core::layout::Layout`] on either cgroup
//! hierarchy; which one is chosen at start-up by what the host mounts ([`detect`]). Each kernel
//! controller has its own file under `v1/` and `v2/`, with its kernel file names as constants, so
//! "where is `cpuset.cpus` written" has one answer per version.
//!
//! Every backend takes a root path and writes, reads, creates and removes groups through
//! [`fs::Kernel`], so that its one production path is unit-tested against a model of cgroupfs
//! in a temporary directory (`fs::model`: the kernel's control files and defaults, tasks that
//! move between groups, busy groups that stay, controllers enabled per subtree, invalid
//! partitions). Directory listings and existence checks read the filesystem directly: the
//! model is a real directory tree. The real hierarchies are tested by the daemon's root tests
//! and, for v2, in a VM (`scripts/test-vm`).
#![warn(missing_docs)]

pub mod detect;
pub mod fs;
pub mod v1;
pub mod v2;

use std::path::PathBuf;
use tess_core::layout::{CellLayout, DomainMode, Layout};
use tess_sched::HartSet;

pub use detect::{detect, Hierarchies};

/// Finds the cell in a cgroup path relative to a hierarchy root: `/<group>/cells/<name>`, or
/// `/<group>.part-<harts>/<name>` (v2 partitions, beside the group).
pub fn cell_in_path(path: &str, group: &str) -> Option<String> {
    let rest = path.strip_prefix('/')?.strip_prefix(group)?;
    let rest = match rest.strip_prefix(".part-") {
        Some(part) => part.split_once('/')?.1,
        None => rest.strip_prefix("/cells/")?,
    };
    (!rest.is_empty() && !rest.contains('/')).then(|| rest.to_string())
}

/// Reads the line of `/proc/PID/cgroup` for a v1 controller (`cpuset`) or v2 (`None`).
pub fn proc_cgroup_path(pid: i32, controller: Option<&str>) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_id, ctrls, path) = (f.next()?, f.next()?, f.next()?);
        let hit = match controller {
            Some(c) => ctrls.split(',').any(|x| x == c),
            None => ctrls.is_empty(),
        };
        hit.then(|| path.to_string())
    })
}
pub use fs::CgroupError;

/// Which cgroup hierarchy a backend drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// Legacy per-controller hierarchies.
    V1,
    /// The unified hierarchy.
    V2,
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Version::V1 => "v1",
            Version::V2 => "v2",
        })
    }
}

/// Result alias.
pub type Result<T> = std::result::Result<T, CgroupError>;

/// Realises tess layouts on one cgroup hierarchy.
///
/// All operations are idempotent: applying the same layout twice changes nothing, and applying a
/// layout over any earlier state (including one left by a daemon killed mid-update) converges.
pub trait Backend: Send + Sync + std::fmt::Debug {
    /// Hierarchy version.
    fn version(&self) -> Version;

    /// How root domains are formed on this hierarchy.
    fn domain_mode(&self) -> DomainMode;

    /// A one-line description (mount points) for `tess status`.
    fn describe(&self) -> String;

    /// Creates tess's top-level groups over `managed` harts.
    fn init(&self, managed: &HartSet) -> Result<()>;

    /// Applies the hart partitioning: scheduling domains and the system group.
    fn apply_topology(&self, layout: &Layout) -> Result<()>;

    /// Creates or updates the groups of cell `name`.
    fn apply_cell(&self, name: &str, cell: &CellLayout, layout: &Layout) -> Result<()>;

    /// Removes cell `name`'s groups, first moving any remaining tasks to the system group.
    fn remove_cell(&self, name: &str) -> Result<()>;

    /// Moves process `pid` (all its threads) into cell `name`. With `cpu = false` the cpu
    /// controller is left for [`Backend::complete_attach`]: on a hart whose root domain has no
    /// sched domain (every single-hart domain), the kernel never decays the load a task leaves
    /// behind in a group's runqueue, and a task moved into a cell's cpu group while it still
    /// sits on a foreign hart leaves such load there, skewing the group's CFS weight for good
    /// (measured: two equal best-effort cells split 39/61 instead of 50/50).
    fn attach_process(&self, name: &str, pid: i32, cpu: bool) -> Result<()>;

    /// Finishes attaching the processes of cell `name` that now run on one of its harts
    /// (`cpus`): moves them into the cell's cpu group. Returns how many moved.
    fn complete_attach(&self, name: &str, cpus: &HartSet) -> Result<usize>;

    /// Puts the idle spinner `pid` of a shared hart (one that belongs to no cell) where it can
    /// only take time nothing else wants. `SCHED_IDLE` alone is not enough: it is a weight (3),
    /// and a cell's cpu group can weigh as little on one hart when the kernel keeps the
    /// group's load elsewhere (measured on v1: a spinner in the cpu root took half a hart from
    /// a best-effort cell). On v1 the spinner goes to an idle cpu group beside the cells
    /// (`cpu.idle = 1`), where it competes with each cell at that cell's full weight. The
    /// default leaves it where it is (v2: the system group, whose weight is its own).
    fn attach_spinner(&self, _pid: i32) -> Result<()> {
        Ok(())
    }

    /// Lets thread `tid` of tessd run on the harts of root domain `domain` although tessd's own
    /// group may not (tessd's budget ticks, which must sit in the root domain they police). On
    /// v1 the thread joins that domain's anchor cpuset (threads are placed one by one there).
    /// The default leaves it where it is (v2: a thread stays in its process's cgroup; the tick
    /// then runs only where tessd may).
    fn attach_thread_to_domain(&self, _tid: i32, _domain: &HartSet) -> Result<()> {
        Ok(())
    }

    /// `Some(limit)` when a cell's cpu group can serve all its threads from one RT bandwidth
    /// budget (cgroup v1 with `CONFIG_RT_GROUP_SCHED`): `limit` is the RT bandwidth ratio the
    /// kernel allows all groups together (`sched_rt_runtime_us / sched_rt_period_us`). cgroup v2
    /// has no RT group scheduling: `None`, and reservations are split between threads.
    fn group_servers(&self) -> Option<f64> {
        None
    }

    /// Whether thread `tid` sits in cell `name`'s cpu group with RT bandwidth applying to it.
    /// A group server's threads are raised to `SCHED_RR` only there: elsewhere (attachment not
    /// yet completed) nothing would throttle them. Without RT group scheduling (v2): never.
    fn in_cpu_group(&self, _name: &str, _tid: i32) -> bool {
        false
    }

    /// Thread ids in cell `name`.
    fn threads(&self, name: &str) -> Result<Vec<i32>>;

    /// Process ids in cell `name`.
    fn processes(&self, name: &str) -> Result<Vec<i32>>;

    /// Names of cells that have groups now (for reconciliation after a restart).
    fn existing_cells(&self) -> Result<Vec<String>>;

    /// Moves tasks that escaped into the hierarchy's root (v1 only) into the system group;
    /// returns how many moved.
    fn sweep_into_system(&self) -> Result<usize>;

    /// Removes everything tess created, returning all tasks to the root.
    fn teardown(&self) -> Result<()>;

    /// The cpuset directory of cell `name` (for diagnostics and tests).
    fn cell_cpuset_dir(&self, name: &str) -> PathBuf;

    /// The cell process `pid` runs in, from `/proc/PID/cgroup`.
    fn cell_of_pid(&self, pid: i32) -> Option<String>;

    /// Cgroups outside tess that undermine the layout: on v1 a cpuset of other software that
    /// balances load across a reserved hart and another hart merges their root domains (so
    /// `SCHED_DEADLINE` threads cannot be pinned), and one that includes a dedicated hart lets
    /// its tasks run there. v1 gives tess no way to constrain them; they are reported.
    fn foreign_conflicts(&self, layout: &Layout) -> Vec<String>;
}
