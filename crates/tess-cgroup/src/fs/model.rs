//! A model of cgroupfs in a temporary directory, for the backends' unit tests: it behaves like
//! the kernel where the backends depend on it, so that they run their one production path.
//!
//! - A write replaces the file's content (a control file holds the last value written); a file
//!   the kernel would have made appears on first write.
//! - Writing an id to `cgroup.procs` or `tasks` moves that task: it leaves every other group of
//!   the same hierarchy and joins this one (listed in `cgroup.procs`, and in `tasks` on v1).
//! - A group with tasks or child groups cannot be removed (`EBUSY`); an empty one goes with its
//!   control files.
//! - Where a task last ran is what the test said ([`Model::set_last_hart`]); unknown tasks run
//!   nowhere.

use super::Kernel;
use std::collections::HashMap;
use std::io::{Error, ErrorKind};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

const PROCS: &str = "cgroup.procs";
const TASKS: &str = "tasks";

/// One mounted hierarchy of the model.
#[derive(Debug)]
struct Hierarchy {
    root: PathBuf,
    /// v1 hierarchies list threads in `tasks` too.
    has_tasks: bool,
}

/// The model (module docs).
#[derive(Debug, Default)]
pub(crate) struct Model {
    hierarchies: Vec<Hierarchy>,
    last_harts: Mutex<HashMap<i32, usize>>,
}

impl Model {
    /// v1 hierarchies mounted at `roots` (each with `cgroup.procs` and `tasks`).
    pub(crate) fn v1(roots: &[PathBuf]) -> Model {
        Model {
            hierarchies: roots
                .iter()
                .map(|r| Hierarchy {
                    root: r.clone(),
                    has_tasks: true,
                })
                .collect(),
            ..Default::default()
        }
    }

    /// The v2 hierarchy mounted at `root`.
    pub(crate) fn v2(root: &Path) -> Model {
        Model {
            hierarchies: vec![Hierarchy {
                root: root.to_path_buf(),
                has_tasks: false,
            }],
            ..Default::default()
        }
    }

    /// Says that task `pid` last ran on `hart`.
    pub(crate) fn set_last_hart(&self, pid: i32, hart: usize) {
        self.last_harts.lock().unwrap().insert(pid, hart);
    }

    fn hierarchy_of(&self, path: &Path) -> Option<&Hierarchy> {
        self.hierarchies.iter().find(|h| path.starts_with(&h.root))
    }

    /// Moves task `id` into the group `dir` of hierarchy `h`.
    fn migrate(&self, h: &Hierarchy, dir: &Path, id: i32) -> std::io::Result<()> {
        if !dir.is_dir() {
            return Err(Error::from(ErrorKind::NotFound));
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
        let files: &[&str] = if h.has_tasks {
            &[PROCS, TASKS]
        } else {
            &[PROCS]
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
        if let (Some(h), PROCS | TASKS) = (self.hierarchy_of(path), name) {
            let id = value
                .trim()
                .parse()
                .map_err(|_| Error::from(ErrorKind::InvalidInput))?;
            return self.migrate(h, path.parent().unwrap_or(path), id);
        }
        if !path.parent().is_some_and(Path::is_dir) {
            return Err(Error::from(ErrorKind::NotFound));
        }
        std::fs::write(path, value)
    }

    fn read_file(&self, path: &Path) -> std::io::Result<String> {
        std::fs::read_to_string(path)
    }

    fn make_dir(&self, path: &Path) -> std::io::Result<()> {
        std::fs::create_dir(path)
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
        for h in [&cpu, &mem] {
            std::fs::create_dir_all(h.join("a")).unwrap();
            std::fs::write(h.join(PROCS), "7\n8\n").unwrap();
        }
        let m = Model::v1(&[cpu.clone(), mem.clone()]);
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
    fn a_control_file_holds_the_last_value_written() {
        let dir = tempfile::tempdir().unwrap();
        let m = Model::v2(dir.path());
        let f = dir.path().join("cpu.max");
        m.write_file(&f, "2000 10000").unwrap();
        m.write_file(&f, "max").unwrap();
        assert_eq!(m.read_file(&f).unwrap(), "max");
        assert_eq!(
            m.write_file(&dir.path().join("gone/cpu.max"), "1")
                .unwrap_err()
                .kind(),
            ErrorKind::NotFound
        );
    }
}
