//! The stamp of a run set: the command, commit, date and machine, taken before the first bench
//! runs (a page generated later, or elsewhere, still describes the machine that ran them).

use serde::{Deserialize, Serialize};
use std::path::Path;
use std::process::Command;

impl Meta {
    /// How many runs of `bench` the run set was to make.
    pub fn reps_of(&self, bench: &str) -> u32 {
        if self.once.iter().any(|b| b == bench) {
            1
        } else {
            self.reps
        }
    }
}

/// What is known about a run set before it runs.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct Meta {
    /// The command that made the run set.
    pub command: String,
    /// `git rev-parse --short HEAD`, and whether the tree had uncommitted changes.
    pub commit: Commit,
    /// `YYYY-MM-DD HH:MM UTC`.
    pub date_utc: String,
    /// The machine.
    pub machine: Machine,
    /// Benches the run set was to run.
    pub benches: Vec<String>,
    /// Repetitions per bench.
    pub reps: u32,
    /// Benches that ran once instead of `reps` times (long searches that repeat their own
    /// measured runs inside one invocation).
    pub once: Vec<String>,
    /// Whether the benches ran with --quick.
    pub quick: bool,
}

/// The commit measured.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct Commit {
    /// Short hash (`unknown` outside a git tree).
    pub hash: String,
    /// Whether `git status --porcelain` listed changes to tracked or new files.
    pub dirty: bool,
}

/// The machine the run set ran on.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct Machine {
    /// `model name` of /proc/cpuinfo.
    pub cpu: String,
    /// Online harts.
    pub harts: usize,
    /// Kernel release (`uname -r`).
    pub kernel: String,
    /// `v1`, `v2` or `hybrid (v1 cpu, v2 mounted)`.
    pub cgroup: String,
    /// `no`, or `yes (kvm)`, `yes (hypervisor unknown)`.
    pub virtualised: String,
}

impl Machine {
    /// Reads this machine's description from /proc, /sys and `systemd-detect-virt`.
    pub fn probe() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo_field(&cpuinfo, "model name").unwrap_or_else(|| "unknown".into());
        let harts = std::fs::read_to_string("/sys/devices/system/cpu/online")
            .ok()
            .and_then(|s| count_cpu_list(s.trim()))
            .unwrap_or(0);
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unknown".into());
        let cgroup = cgroup_version(
            Path::new("/sys/fs/cgroup/cpu").exists()
                || Path::new("/sys/fs/cgroup/cpu,cpuacct").exists(),
            Path::new("/sys/fs/cgroup/cgroup.controllers").exists(),
            Path::new("/sys/fs/cgroup/unified/cgroup.controllers").exists(),
        );
        let detect = |flag: &str| {
            Command::new("systemd-detect-virt")
                .arg(flag)
                .output()
                .ok()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        };
        let hypervisor_flag = cpuinfo_field(&cpuinfo, "flags")
            .is_some_and(|f| f.split_whitespace().any(|x| x == "hypervisor"));
        let virtualised = virtualised(
            detect("--vm").as_deref(),
            detect("--container").as_deref(),
            hypervisor_flag,
        );
        Machine {
            cpu,
            harts,
            kernel,
            cgroup,
            virtualised,
        }
    }
}

/// The cgroup layout: where the cpu controller is (v1 hierarchies, or the v2 root) and
/// whether a v2 hierarchy is mounted beside v1 (hybrid).
pub(super) fn cgroup_version(v1_cpu: bool, v2_root: bool, v2_unified: bool) -> String {
    match (v1_cpu, v2_root, v2_unified) {
        (true, _, true) => "v1 (hybrid: cgroup2 also mounted at /sys/fs/cgroup/unified)",
        (true, _, false) => "v1",
        (false, true, _) => "v2",
        _ => "unknown",
    }
    .to_string()
}

/// Whether this is a virtual machine, from `systemd-detect-virt --vm` and `--container` (None
/// if it could not run) and the cpuid hypervisor flag; a container is named as well, since it
/// says nothing about the hardware underneath.
pub(super) fn virtualised(
    vm: Option<&str>,
    container: Option<&str>,
    hypervisor_flag: bool,
) -> String {
    let known = |s: Option<&str>| {
        s.filter(|s| !s.is_empty() && *s != "none")
            .map(str::to_string)
    };
    let mut text = match (known(vm), hypervisor_flag) {
        (Some(v), _) => format!("yes: {v} virtual machine"),
        (None, true) => "yes: virtual machine (cpuid hypervisor flag; hypervisor unknown)".into(),
        (None, false) => "no (no cpuid hypervisor flag)".into(),
    };
    if let Some(c) = known(container) {
        let _ = std::fmt::Write::write_fmt(&mut text, format_args!("; in a {c} container"));
    }
    text
}

pub(super) fn cpuinfo_field(cpuinfo: &str, key: &str) -> Option<String> {
    cpuinfo.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == key).then(|| v.trim().to_string())
    })
}

/// Number of CPUs in a kernel CPU list (`0-3,6`).
pub(super) fn count_cpu_list(list: &str) -> Option<usize> {
    list.split(',').try_fold(0, |n, part| {
        Some(
            n + match part.split_once('-') {
                Some((a, b)) => b.parse::<usize>().ok()? + 1 - a.parse::<usize>().ok()?,
                None => {
                    part.parse::<usize>().ok()?;
                    1
                }
            },
        )
    })
}

pub(super) fn git_commit() -> Commit {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    Commit {
        hash: git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into()),
        dirty: git(&["status", "--porcelain"]).is_some_and(|s| !s.is_empty()),
    }
}

pub(super) fn date_utc() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}
