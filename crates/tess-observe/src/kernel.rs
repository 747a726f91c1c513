//! What the kernel counts about cells and harts, read from procfs and cgroupfs.
//!
//! Every reader is a pure parser over the file's text (unit-tested on captured text) plus a
//! thin function that reads the real file. A file that is missing (a thread that just exited, a
//! cell without a `cpu` group) reads as `None`: a scrape reports what it can see, never fails.
//!
//! | what | file | unit in the file |
//! |---|---|---|
//! | CPU time, run-queue wait, timeslices of a thread | `/proc/<tid>/schedstat` | ns, ns, count |
//! | involuntary switches of a thread | `/proc/<tid>/status`, `nonvoluntary_ctxt_switches` | count |
//! | busy and steal time per hart | `/proc/stat`, `cpuN` lines | USER_HZ ticks |
//! | CFS bandwidth throttling of a group | v1 `cpu.stat` (`throttled_time` ns), v2 `cpu.stat` (`throttled_usec`) | count, ns/us |
//! | memory charged to a group | v1 `memory.usage_in_bytes`, v2 `memory.current` | bytes |

use std::path::Path;

/// Reads a small kernel file; `None` if it cannot be read (gone, no permission).
fn read(path: &Path) -> Option<String> {
    tess_sched::proc::read_kernel_file(path).ok()
}

/// The text of an open kernel file, afresh (`None`: its thread or group is gone).
fn read_at_start(f: &std::fs::File) -> Option<String> {
    tess_sched::proc::read_generated(f).ok()
}

/// Kernel files kept open from one scrape to the next.
///
/// Opening is most of what a scrape costs: the kernel walks the path (`/proc/<tid>` looks the
/// task up, cgroupfs takes its locks) for every one of some 400 files per 100 cells; reading
/// an open file again is a third to a sixth of that. A file that fails to read (its thread
/// exited, its cgroup was removed, and a new one may now have its name) is opened afresh once;
/// files not read in a scrape are closed at its end ([`Files::end_scrape`]). At most a quarter
/// of the process's file limit is kept open; past that, files are opened and closed each time.
#[derive(Debug, Default)]
pub struct Files {
    open: std::collections::HashMap<std::path::PathBuf, (std::fs::File, bool)>,
    cap: Option<usize>,
}

impl Files {
    /// An empty cache.
    pub fn new() -> Files {
        Files::default()
    }

    fn cap(&mut self) -> usize {
        *self.cap.get_or_insert_with(|| {
            let mut lim = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: `lim` is a valid rlimit for the kernel to fill.
            let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0;
            if ok {
                (lim.rlim_cur / 4).min(1 << 16) as usize
            } else {
                256
            }
        })
    }

    /// The text of `path`, from the open file when there is one.
    pub fn read(&mut self, path: &Path) -> Option<String> {
        if let Some((f, used)) = self.open.get_mut(path) {
            if let Some(t) = read_at_start(f) {
                *used = true;
                return Some(t);
            }
            self.open.remove(path);
        }
        let f = std::fs::File::open(path).ok()?;
        let text = read_at_start(&f)?;
        if self.open.len() < self.cap() {
            self.open.insert(path.to_path_buf(), (f, true));
        }
        Some(text)
    }

    /// Closes the files this scrape did not read (threads gone, cells deleted).
    pub fn end_scrape(&mut self) {
        self.open.retain(|_, (_, used)| std::mem::take(used));
    }

    /// Files held open.
    pub fn len(&self) -> usize {
        self.open.len()
    }

    /// Whether none is held open.
    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }
}

/// A thread's `/proc/<tid>/schedstat`: time on a CPU, time runnable but waiting for one, and
/// how many times it was given a CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SchedStat {
    /// Time on a CPU, ns.
    pub run_ns: u64,
    /// Time runnable in a run queue, waiting for a CPU, ns.
    pub wait_ns: u64,
    /// Times it was switched in.
    pub timeslices: u64,
}

/// Parses `/proc/<tid>/schedstat` (`run_ns wait_ns timeslices`).
pub fn parse_schedstat(text: &str) -> Option<SchedStat> {
    let mut f = text.split_whitespace().map(|v| v.parse::<u64>().ok());
    Some(SchedStat {
        run_ns: f.next()??,
        wait_ns: f.next()??,
        timeslices: f.next()??,
    })
}

/// A thread's scheduling statistics (`None` once it has exited).
pub fn thread_schedstat(files: &mut Files, tid: i32) -> Option<SchedStat> {
    parse_schedstat(&files.read(Path::new(&format!("/proc/{tid}/schedstat")))?)
}

/// `nonvoluntary_ctxt_switches` from `/proc/<tid>/status`.
pub fn parse_nonvoluntary_switches(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("nonvoluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Times a thread was switched out while it could still run: preempted by a more urgent task,
/// or, for a `SCHED_DEADLINE` thread, throttled at the end of its budget.
pub fn thread_involuntary_switches(files: &mut Files, tid: i32) -> Option<u64> {
    parse_nonvoluntary_switches(&files.read(Path::new(&format!("/proc/{tid}/status")))?)
}

/// One hart's times from `/proc/stat`, in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct HartTimes {
    /// Hart number.
    pub hart: usize,
    /// Time spent running anything (user, nice, system, irq, softirq).
    pub busy_s: f64,
    /// Time the hypervisor ran something else while this hart wanted to run.
    pub steal_s: f64,
}

/// The kernel's `USER_HZ` (ticks per second in `/proc/stat`).
pub fn user_hz() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 {
        hz as f64
    } else {
        100.0
    }
}

/// Parses the `cpuN` lines of `/proc/stat` (`cpu` alone, the sum, is skipped).
pub fn parse_proc_stat(text: &str, hz: f64) -> Vec<HartTimes> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let hart: usize = f.next()?.strip_prefix("cpu")?.parse().ok()?;
            // user nice system idle iowait irq softirq steal guest guest_nice
            let v: Vec<u64> = f.filter_map(|x| x.parse().ok()).collect();
            let at = |i: usize| v.get(i).copied().unwrap_or(0);
            // guest time is already counted in user (and guest_nice in nice).
            let busy = at(0) + at(1) + at(2) + at(5) + at(6);
            Some(HartTimes {
                hart,
                busy_s: busy as f64 / hz,
                steal_s: at(7) as f64 / hz,
            })
        })
        .collect()
}

/// Every online hart's times.
pub fn hart_times() -> Vec<HartTimes> {
    read(Path::new("/proc/stat"))
        .map(|t| parse_proc_stat(&t, user_hz()))
        .unwrap_or_default()
}

/// CFS bandwidth throttling of a cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Throttling {
    /// Enforcement periods in which the group ran out of quota.
    pub periods: u64,
    /// Time its tasks waited for the next period.
    pub seconds: f64,
}

/// Parses `cpu.stat` of either hierarchy (v1 `throttled_time` in ns, v2 `throttled_usec`).
pub fn parse_cpu_stat(text: &str) -> Option<Throttling> {
    let mut t = Throttling::default();
    let mut seen = false;
    for l in text.lines() {
        let mut f = l.split_whitespace();
        let (Some(k), Some(v)) = (f.next(), f.next().and_then(|v| v.parse::<u64>().ok())) else {
            continue;
        };
        match k {
            "nr_throttled" => {
                t.periods = v;
                seen = true;
            }
            "throttled_time" => t.seconds = v as f64 / 1e9,
            "throttled_usec" => t.seconds = v as f64 / 1e6,
            _ => {}
        }
    }
    seen.then_some(t)
}

/// A cgroup directory's throttling (`None` when it has no `cpu.stat`).
pub fn throttling(files: &mut Files, dir: &Path) -> Option<Throttling> {
    parse_cpu_stat(&files.read(&dir.join("cpu.stat"))?)
}

/// Memory charged to a cgroup directory, in bytes (v1 `memory.usage_in_bytes` or v2
/// `memory.current`).
pub fn memory_bytes(files: &mut Files, dir: &Path) -> Option<u64> {
    ["memory.usage_in_bytes", "memory.current"]
        .iter()
        .find_map(|f| files.read(&dir.join(f)))
        .and_then(|t| t.trim().parse().ok())
}

/// Where a cell's groups live in each hierarchy, found from its cpuset directory.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Mounts {
    /// The hierarchy holding `cpuset` (the prefix of every cell's reported `cgroup`).
    pub cpuset: Option<std::path::PathBuf>,
    /// The v1 `cpu` hierarchy.
    pub cpu: Option<std::path::PathBuf>,
    /// The v1 `memory` hierarchy.
    pub memory: Option<std::path::PathBuf>,
}

impl Mounts {
    /// The v1 hierarchies from `/proc/self/mountinfo` (on v2 every controller shares the
    /// cpuset directory, and these stay `None`).
    pub fn detect() -> Mounts {
        read(Path::new("/proc/self/mountinfo"))
            .map(|t| Mounts::parse(&t))
            .unwrap_or_default()
    }

    /// Parses mountinfo text for the v1 `cpuset`, `cpu` and `memory` mounts.
    pub fn parse(mountinfo: &str) -> Mounts {
        let mut m = Mounts::default();
        for line in mountinfo.lines() {
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let mut r = right.split_whitespace();
            if r.next() != Some("cgroup") {
                continue;
            }
            let (Some(mount), Some(opts)) = (left.split_whitespace().nth(4), r.nth(1)) else {
                continue;
            };
            let has = |c: &str| opts.split(',').any(|o| o == c);
            let path = Some(std::path::PathBuf::from(mount));
            if has("cpuset") {
                m.cpuset = path.clone();
            }
            if has("cpu") {
                m.cpu = path.clone();
            }
            if has("memory") {
                m.memory = path;
            }
        }
        m
    }

    /// The same group as `cpuset_dir` in `hierarchy` (v1), or `cpuset_dir` itself (v2, or when
    /// the hierarchy is unknown).
    pub fn sibling(&self, cpuset_dir: &Path, hierarchy: Option<&Path>) -> std::path::PathBuf {
        match (self.cpuset.as_deref(), hierarchy) {
            (Some(cs), Some(h)) => match cpuset_dir.strip_prefix(cs) {
                Ok(rel) => h.join(rel),
                Err(_) => cpuset_dir.to_path_buf(),
            },
            _ => cpuset_dir.to_path_buf(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedstat_gives_run_and_wait_nanoseconds() {
        assert_eq!(
            parse_schedstat("123456789 4000 17\n"),
            Some(SchedStat {
                run_ns: 123_456_789,
                wait_ns: 4000,
                timeslices: 17
            })
        );
        assert_eq!(parse_schedstat(""), None);
    }

    #[test]
    fn status_gives_involuntary_switches() {
        let s = "Name:\tsynth\nvoluntary_ctxt_switches:\t10\nnonvoluntary_ctxt_switches:\t7\n";
        assert_eq!(parse_nonvoluntary_switches(s), Some(7));
        assert_eq!(parse_nonvoluntary_switches("Name: x\n"), None);
    }

    #[test]
    fn proc_stat_counts_busy_and_steal_per_hart() {
        let s = "cpu  10 0 10 100 0 0 0 0 0 0\n\
                 cpu0 100 50 25 1000 5 10 15 40 0 0\n\
                 cpu1 1 0 1 9 0 0 0 0 0 0\nintr 5\n";
        let h = parse_proc_stat(s, 100.0);
        assert_eq!(h.len(), 2);
        assert_eq!(h[0].hart, 0);
        assert!((h[0].busy_s - 2.0).abs() < 1e-9, "{:?}", h[0]);
        assert!((h[0].steal_s - 0.4).abs() < 1e-9);
        assert!((h[1].busy_s - 0.02).abs() < 1e-9);
    }

    #[test]
    fn cpu_stat_of_both_versions() {
        let v1 = "nr_periods 10\nnr_throttled 3\nthrottled_time 2000000000\n";
        assert_eq!(
            parse_cpu_stat(v1),
            Some(Throttling {
                periods: 3,
                seconds: 2.0
            })
        );
        let v2 = "usage_usec 5\nnr_periods 4\nnr_throttled 2\nthrottled_usec 1500000\n";
        assert_eq!(
            parse_cpu_stat(v2),
            Some(Throttling {
                periods: 2,
                seconds: 1.5
            })
        );
        assert_eq!(parse_cpu_stat("usage_usec 5\n"), None);
    }

    #[test]
    fn mounts_map_a_cpuset_group_to_its_siblings() {
        let mi = "30 25 0:26 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset\n\
                  31 25 0:27 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n\
                  32 25 0:28 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n\
                  33 25 0:29 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";
        let m = Mounts::parse(mi);
        assert_eq!(m.cpu.as_deref(), Some(Path::new("/sys/fs/cgroup/cpu")));
        let dir = Path::new("/sys/fs/cgroup/cpuset/tess/cells/synth");
        assert_eq!(
            m.sibling(dir, m.memory.as_deref()),
            Path::new("/sys/fs/cgroup/memory/tess/cells/synth")
        );
        assert_eq!(m.sibling(dir, None), dir);
    }

    #[test]
    fn memory_reads_either_file() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(memory_bytes(&mut Files::new(), d.path()), None);
        std::fs::write(d.path().join("memory.current"), "4096\n").unwrap();
        assert_eq!(memory_bytes(&mut Files::new(), d.path()), Some(4096));
    }

    #[test]
    fn an_open_file_reads_fresh_counters_each_time() {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        let mut files = Files::new();
        let spin = |ms| {
            let t = std::time::Instant::now();
            while t.elapsed() < std::time::Duration::from_millis(ms) {}
        };
        spin(10);
        let a = thread_schedstat(&mut files, tid).unwrap();
        assert_eq!(files.len(), 1);
        spin(30);
        let b = thread_schedstat(&mut files, tid).unwrap();
        assert!(b.run_ns > a.run_ns, "{a:?} then {b:?}");
        assert_eq!(files.len(), 1, "the second read reuses the open file");
        // A file not read in a scrape is closed at its end; one that was is kept.
        files.end_scrape();
        assert_eq!(files.len(), 1);
        files.end_scrape();
        assert!(files.is_empty());
        // A file longer than the first buffer is read whole.
        let d = tempfile::tempdir().unwrap();
        let long = d.path().join("long");
        std::fs::write(&long, "x".repeat(10_000)).unwrap();
        assert_eq!(files.read(&long).unwrap().len(), 10_000);
        // A file that disappears reads as None.
        std::fs::remove_file(&long).unwrap();
        assert_eq!(
            files.read(&long).map(|t| t.len()),
            Some(10_000),
            "still open: same file"
        );
        files.end_scrape();
        files.end_scrape();
        assert_eq!(files.read(&long), None);
    }

    #[test]
    fn this_thread_has_cpu_time() {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        // The kernel charges run time at ticks and switches (4 ms apart at HZ=250): spin
        // across several.
        let spin = std::time::Instant::now();
        while spin.elapsed() < std::time::Duration::from_millis(30) {}
        let mut files = Files::new();
        let st = thread_schedstat(&mut files, tid).unwrap();
        assert!(st.run_ns > 0 && st.timeslices > 0, "{st:?}");
        assert!(thread_involuntary_switches(&mut files, tid).is_some());
        assert!(!hart_times().is_empty());
    }
}
