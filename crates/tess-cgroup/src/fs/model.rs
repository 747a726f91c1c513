//! A model of cgroupfs in a temporary directory, for the backends' unit tests: it behaves like
//! the kernel where the backends depend on it, so that they run their one production path.
//!
//! - A group is a directory the kernel fills with its control files, with the kernel's
//!   defaults: on v1 those of the hierarchy's controller, on v2 those of the controllers the
//!   parent enables in `cgroup.subtree_control` (and a controller enabled later adds its files
//!   to the children that exist). A write to a file the kernel did not make fails with
//!   `ENOENT`, as a misspelt name or a controller that is off would.
//! - A write replaces the file's content; `cgroup.subtree_control` takes `+name`/`-name` and
//!   reads back the names enabled, only for controllers the group has (`cgroup.controllers`).
//! - Writing an id to `cgroup.procs` or `tasks` moves that task: it leaves every other group of
//!   the same hierarchy and joins this one (listed in `cgroup.procs`, and in `tasks` on v1). A
//!   v1 cpuset with no harts or no memory nodes takes no task (`ENOSPC`).
//! - A group with tasks or child groups cannot be removed (`EBUSY`); an empty one goes with its
//!   control files.
//! - Where a task last ran is what the test said ([`Model::set_last_hart`]); unknown tasks run
//!   nowhere. A v2 partition the test invalidates ([`Model::invalidate_partition`]) reads back
//!   `root invalid (...)`, as the kernel reports one.
//!
//! Not modelled: `tasks` moving one thread where `cgroup.procs` moves a process (the tests use
//! single-threaded ids), effective cpus, and the rules of exclusive cpus between siblings.

use super::Kernel;
use std::collections::{HashMap, HashSet};
use std::io::{Error, ErrorKind};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

const PROCS: &str = "cgroup.procs";
const TASKS: &str = "tasks";
const SUBTREE: &str = "cgroup.subtree_control";
const CONTROLLERS: &str = "cgroup.controllers";
const PARTITION: &str = "cpuset.cpus.partition";

/// What `cpuset.cpus.partition` reads back after `kind` was written.
fn partition_state(kind: &str, invalid: bool) -> String {
    let kind = kind.split_whitespace().next().unwrap_or("member");
    if invalid && kind != "member" {
        format!("{kind} invalid (Cpu list in cpuset.cpus not exclusive)")
    } else {
        kind.to_string()
    }
}

/// v2 controllers in the kernel's order, as `cgroup.controllers` lists them.
const V2_CONTROLLERS: [&str; 5] = ["cpuset", "cpu", "io", "memory", "pids"];

/// Control files (name, default content) a v1 group of `controller` has besides the task lists.
fn v1_files(controller: &str) -> &'static [(&'static str, &'static str)] {
    match controller {
        "cpuset" => &[
            ("cpuset.cpus", ""),
            ("cpuset.mems", ""),
            ("cpuset.sched_load_balance", "1"),
            ("cpuset.cpu_exclusive", "0"),
        ],
        "cpu" => &[
            ("cpu.shares", "1024"),
            ("cpu.cfs_quota_us", "-1"),
            ("cpu.cfs_period_us", "100000"),
            ("cpu.idle", "0"),
        ],
        "memory" => &[("memory.limit_in_bytes", "9223372036854771712")],
        "pids" => &[("pids.max", "max")],
        _ => &[],
    }
}

/// The files of RT group scheduling (`CONFIG_RT_GROUP_SCHED`) a new v1 cpu group has where
/// the kernel has them, which the model takes to be where the test gave the root group
/// `cpu.rt_runtime_us`.
const V1_RT_GROUP_FILES: &[(&str, &str)] =
    &[("cpu.rt_runtime_us", "0"), ("cpu.rt_period_us", "1000000")];

/// Control files (name, default content) a v2 controller adds to a group whose parent
/// enables it.
fn v2_files(controller: &str) -> &'static [(&'static str, &'static str)] {
    match controller {
        "cpuset" => &[
            ("cpuset.cpus", ""),
            ("cpuset.mems", ""),
            (PARTITION, "member"),
        ],
        "cpu" => &[
            ("cpu.weight", "100"),
            ("cpu.max", "max 100000"),
            ("cpu.idle", "0"),
        ],
        "memory" => &[("memory.max", "max")],
        "pids" => &[("pids.max", "max")],
        _ => &[],
    }
}

/// Which hierarchy a mount of the model is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A v1 hierarchy of one controller (the mount directory's name: `cpuset`, `cpu`, ...).
    V1(&'static str),
    /// The unified hierarchy.
    V2,
}

/// One mounted hierarchy of the model.
#[derive(Debug)]
struct Hierarchy {
    root: PathBuf,
    kind: Kind,
}

/// The model (module docs).
#[derive(Debug, Default)]
pub(crate) struct Model {
    hierarchies: Vec<Hierarchy>,
    last_harts: Mutex<HashMap<i32, usize>>,
    /// v2 groups whose partition the kernel cannot make valid.
    invalid: Mutex<HashSet<PathBuf>>,
}

fn io<T>(r: std::io::Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("setting up the cgroupfs model: {e}"))
}

/// Writes `files` (name, content) into `dir` where they are missing.
fn populate(dir: &Path, files: &[(&str, &str)]) -> std::io::Result<()> {
    for (name, content) in files {
        let p = dir.join(name);
        if !p.exists() {
            std::fs::write(p, content)?;
        }
    }
    Ok(())
}

impl Model {
    /// v1 hierarchies mounted at `roots`, each named after its controller (`.../cpuset`,
    /// `.../cpu`, `.../memory`, `.../pids`); their root groups get the control files they
    /// lack.
    pub(crate) fn v1(roots: &[PathBuf]) -> Model {
        let hierarchies = roots
            .iter()
            .map(|r| {
                let name = r.file_name().and_then(|n| n.to_str()).unwrap_or("");
                let controller = ["cpuset", "cpu", "memory", "pids"]
                    .into_iter()
                    .find(|c| *c == name)
                    .unwrap_or_else(|| panic!("{}: not a v1 controller's mount", r.display()));
                io(std::fs::create_dir_all(r));
                io(populate(r, &[(PROCS, ""), (TASKS, "")]));
                io(populate(r, v1_files(controller)));
                Hierarchy {
                    root: r.clone(),
                    kind: Kind::V1(controller),
                }
            })
            .collect();
        Model {
            hierarchies,
            ..Default::default()
        }
    }

    /// The v2 hierarchy mounted at `root`: its root group has every controller and enables
    /// none yet.
    pub(crate) fn v2(root: &Path) -> Model {
        io(std::fs::create_dir_all(root));
        io(populate(
            root,
            &[
                (PROCS, ""),
                ("cgroup.threads", ""),
                (SUBTREE, ""),
                (CONTROLLERS, &V2_CONTROLLERS.join(" ")),
            ],
        ));
        Model {
            hierarchies: vec![Hierarchy {
                root: root.to_path_buf(),
                kind: Kind::V2,
            }],
            ..Default::default()
        }
    }

    /// Says that task `pid` last ran on `hart`.
    pub(crate) fn set_last_hart(&self, pid: i32, hart: usize) {
        self.last_harts.lock().unwrap().insert(pid, hart);
    }

    /// Makes the v2 partition of group `dir` invalid, as the kernel does when it cannot give
    /// the partition its harts: from now on it reads back `root invalid (...)` (or `isolated
    /// invalid`), whatever is written.
    pub(crate) fn invalidate_partition(&self, dir: &Path) {
        self.invalid.lock().unwrap().insert(dir.to_path_buf());
        let p = dir.join(PARTITION);
        let kind = std::fs::read_to_string(&p).unwrap_or_default();
        io(std::fs::write(&p, partition_state(kind.trim(), true)));
    }

    fn hierarchy_of(&self, path: &Path) -> Option<&Hierarchy> {
        self.hierarchies.iter().find(|h| path.starts_with(&h.root))
    }

    /// The controllers a v2 group has: what its parent enables (every one at the root).
    fn v2_controllers(&self, h: &Hierarchy, dir: &Path) -> Vec<String> {
        if dir == h.root {
            return V2_CONTROLLERS.iter().map(|c| c.to_string()).collect();
        }
        let parent = dir.parent().unwrap_or(dir);
        std::fs::read_to_string(parent.join(SUBTREE))
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_string)
            .collect()
    }

    /// `+name`/`-name` written to a v2 group's `cgroup.subtree_control`: the children get (or
    /// lose) the controllers' files and list the controllers they now have.
    fn write_subtree(&self, h: &Hierarchy, dir: &Path, value: &str) -> std::io::Result<()> {
        let available = self.v2_controllers(h, dir);
        let before: Vec<String> = std::fs::read_to_string(dir.join(SUBTREE))?
            .split_whitespace()
            .map(str::to_string)
            .collect();
        let mut enabled = before.clone();
        for token in value.split_whitespace() {
            let (on, name) = match token.split_at(1) {
                ("+", n) => (true, n),
                ("-", n) => (false, n),
                _ => return Err(Error::from(ErrorKind::InvalidInput)),
            };
            if !available.iter().any(|a| a == name) {
                return Err(Error::from(ErrorKind::NotFound));
            }
            enabled.retain(|e| e != name);
            if on {
                enabled.push(name.to_string());
            }
        }
        let ordered: Vec<&str> = V2_CONTROLLERS
            .into_iter()
            .filter(|c| enabled.iter().any(|e| e == c))
            .collect();
        for e in std::fs::read_dir(dir)?.flatten() {
            if !e.file_type()?.is_dir() {
                continue;
            }
            let child = e.path();
            for c in V2_CONTROLLERS {
                let (was, is) = (before.iter().any(|b| b == c), ordered.contains(&c));
                if is && !was {
                    populate(&child, v2_files(c))?;
                } else if was && !is {
                    for (file, _) in v2_files(c) {
                        let _ = std::fs::remove_file(child.join(file));
                    }
                }
            }
            std::fs::write(child.join(CONTROLLERS), ordered.join(" "))?;
        }
        std::fs::write(dir.join(SUBTREE), ordered.join(" "))
    }

    /// Moves task `id` into the group `dir` of hierarchy `h`.
    fn migrate(&self, h: &Hierarchy, dir: &Path, id: i32) -> std::io::Result<()> {
        if !dir.is_dir() {
            return Err(Error::from(ErrorKind::NotFound));
        }
        if h.kind == Kind::V1("cpuset") {
            let empty = |f: &str| {
                std::fs::read_to_string(dir.join(f)).map_or(true, |s| s.trim().is_empty())
            };
            if empty("cpuset.cpus") || empty("cpuset.mems") {
                return Err(Error::from_raw_os_error(libc::ENOSPC));
            }
        }
        let mut groups = vec![h.root.clone()];
        while let Some(g) = groups.pop() {
            for file in [PROCS, TASKS] {
                let p = g.join(file);
                if let Ok(text) = std::fs::read_to_string(&p) {
                    let kept: Vec<&str> = text
                        .lines()
                        .filter(|l| l.trim().parse::<i32>().ok() != Some(id))
                        .collect();
                    std::fs::write(&p, lines(&kept))?;
                }
            }
            for e in std::fs::read_dir(&g)?.flatten() {
                if e.file_type()?.is_dir() {
                    groups.push(e.path());
                }
            }
        }
        let files: &[&str] = match h.kind {
            Kind::V1(_) => &[PROCS, TASKS],
            Kind::V2 => &[PROCS],
        };
        for file in files {
            let p = dir.join(file);
            let mut text = std::fs::read_to_string(&p).unwrap_or_default();
            text.push_str(&format!("{id}\n"));
            std::fs::write(&p, text)?;
        }
        Ok(())
    }
}

fn lines(v: &[&str]) -> String {
    v.iter().map(|l| format!("{l}\n")).collect()
}

impl Kernel for Model {
    fn write_file(&self, path: &Path, value: &str) -> std::io::Result<()> {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let dir = path.parent().unwrap_or(path);
        let h = self.hierarchy_of(path);
        if let (Some(h), PROCS | TASKS) = (h, name) {
            let id = value
                .trim()
                .parse()
                .map_err(|_| Error::from(ErrorKind::InvalidInput))?;
            return self.migrate(h, dir, id);
        }
        if !path.is_file() {
            // The kernel makes every control file; one that is not there does not exist.
            return Err(Error::from(ErrorKind::NotFound));
        }
        match (h.map(|h| h.kind), name) {
            (Some(Kind::V2), SUBTREE) => self.write_subtree(h.expect("matched"), dir, value),
            (Some(Kind::V2), PARTITION) => {
                let invalid = self.invalid.lock().unwrap().contains(dir);
                std::fs::write(path, partition_state(value.trim(), invalid))
            }
            _ => std::fs::write(path, value),
        }
    }

    fn read_file(&self, path: &Path) -> std::io::Result<String> {
        std::fs::read_to_string(path)
    }

    fn make_dir(&self, path: &Path) -> std::io::Result<()> {
        std::fs::create_dir(path)?;
        let Some(h) = self.hierarchy_of(path) else {
            return Ok(());
        };
        match h.kind {
            Kind::V1(controller) => {
                populate(path, &[(PROCS, ""), (TASKS, "")])?;
                if controller == "cpu" && h.root.join("cpu.rt_runtime_us").is_file() {
                    populate(path, V1_RT_GROUP_FILES)?;
                }
                populate(path, v1_files(controller))
            }
            Kind::V2 => {
                let controllers = self.v2_controllers(h, path);
                populate(
                    path,
                    &[
                        (PROCS, ""),
                        ("cgroup.threads", ""),
                        (SUBTREE, ""),
                        (CONTROLLERS, &controllers.join(" ")),
                    ],
                )?;
                for c in &controllers {
                    populate(path, v2_files(c))?;
                }
                Ok(())
            }
        }
    }

    fn remove_dir(&self, path: &Path) -> std::io::Result<()> {
        if !path.is_dir() {
            return Err(Error::from(ErrorKind::NotFound));
        }
        let has_child = std::fs::read_dir(path)?
            .flatten()
            .any(|e| e.file_type().is_ok_and(|t| t.is_dir()));
        let has_task = [PROCS, TASKS]
            .iter()
            .any(|f| std::fs::read_to_string(path.join(f)).is_ok_and(|t| !t.trim().is_empty()));
        if has_child || has_task {
            return Err(Error::from_raw_os_error(libc::EBUSY));
        }
        std::fs::remove_dir_all(path)
    }

    fn last_hart(&self, pid: i32) -> Option<usize> {
        self.last_harts.lock().unwrap().get(&pid).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_written_to_a_group_leaves_every_other_group_of_its_hierarchy() {
        let dir = tempfile::tempdir().unwrap();
        let (cpu, mem) = (dir.path().join("cpu"), dir.path().join("memory"));
        let m = Model::v1(&[cpu.clone(), mem.clone()]);
        for h in [&cpu, &mem] {
            std::fs::write(h.join(PROCS), "7\n8\n").unwrap();
        }
        m.make_dir(&cpu.join("a")).unwrap();
        assert_eq!(m.read_file(&cpu.join("a/cpu.shares")).unwrap(), "1024");
        m.write_file(&cpu.join("a").join(PROCS), "7").unwrap();
        assert_eq!(std::fs::read_to_string(cpu.join(PROCS)).unwrap(), "8\n");
        assert_eq!(std::fs::read_to_string(cpu.join("a/tasks")).unwrap(), "7\n");
        // The other hierarchy is untouched.
        assert_eq!(std::fs::read_to_string(mem.join(PROCS)).unwrap(), "7\n8\n");
        // A group with a task stays; emptied, it goes with its files.
        assert_eq!(
            m.remove_dir(&cpu.join("a")).unwrap_err().raw_os_error(),
            Some(libc::EBUSY)
        );
        m.write_file(&cpu.join(PROCS), "7").unwrap();
        m.remove_dir(&cpu.join("a")).unwrap();
        assert!(!cpu.join("a").exists());
    }

    #[test]
    fn evacuating_a_group_moves_its_tasks_out_then_removes_it() {
        let dir = tempfile::tempdir().unwrap();
        let cpu = dir.path().join("cpu");
        let m = std::sync::Arc::new(Model::v1(std::slice::from_ref(&cpu)));
        let fs = crate::fs::Fs::over(m.clone());
        m.make_dir(&cpu.join("a")).unwrap();
        m.write_file(&cpu.join("a").join(PROCS), "7").unwrap();
        fs.evacuate_and_rmdir(&cpu.join("a"), &cpu.join(PROCS))
            .unwrap();
        assert!(!cpu.join("a").exists());
        assert_eq!(std::fs::read_to_string(cpu.join(PROCS)).unwrap(), "7\n");
        // A group that stays busy (a child group) is an error naming it, after the retries.
        m.make_dir(&cpu.join("b")).unwrap();
        m.make_dir(&cpu.join("b/c")).unwrap();
        let e = fs
            .evacuate_and_rmdir(&cpu.join("b"), &cpu.join(PROCS))
            .unwrap_err();
        assert!(e.to_string().contains("/b"), "{e}");
        assert!(cpu.join("b").exists());
    }

    #[test]
    fn a_cpuset_without_harts_or_memory_takes_no_task() {
        let dir = tempfile::tempdir().unwrap();
        let cpuset = dir.path().join("cpuset");
        let m = Model::v1(std::slice::from_ref(&cpuset));
        m.make_dir(&cpuset.join("a")).unwrap();
        let join = || m.write_file(&cpuset.join("a").join(PROCS), "7");
        assert_eq!(join().unwrap_err().raw_os_error(), Some(libc::ENOSPC));
        m.write_file(&cpuset.join("a/cpuset.cpus"), "1").unwrap();
        assert_eq!(join().unwrap_err().raw_os_error(), Some(libc::ENOSPC));
        m.write_file(&cpuset.join("a/cpuset.mems"), "0").unwrap();
        join().unwrap();
    }

    #[test]
    fn a_control_file_exists_only_where_the_kernel_makes_it_and_holds_the_last_value() {
        let dir = tempfile::tempdir().unwrap();
        let m = Model::v2(dir.path());
        let g = dir.path().join("g");
        m.make_dir(&g).unwrap();
        // The root enables no controller yet: the group has no cpu files.
        let max = g.join("cpu.max");
        assert_eq!(
            m.write_file(&max, "2000 10000").unwrap_err().kind(),
            ErrorKind::NotFound
        );
        m.write_file(&dir.path().join(SUBTREE), "+cpu +cpuset")
            .unwrap();
        assert_eq!(
            m.read_file(&dir.path().join(SUBTREE)).unwrap(),
            "cpuset cpu"
        );
        m.write_file(&max, "2000 10000").unwrap();
        m.write_file(&max, "max").unwrap();
        assert_eq!(m.read_file(&max).unwrap(), "max");
        // A controller the group does not have cannot be enabled below it.
        assert_eq!(
            m.write_file(&g.join(SUBTREE), "+memory")
                .unwrap_err()
                .kind(),
            ErrorKind::NotFound
        );
        assert_eq!(
            m.write_file(&g.join("cpu.maxx"), "1").unwrap_err().kind(),
            ErrorKind::NotFound
        );
    }
}
