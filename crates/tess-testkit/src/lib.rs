//! Test support shared by every Rust test that needs a daemon or root, or builds C programs
//! against libtess ([`c_lib`]).
//!
//! One harness, the same rules as `scripts/with-tessd` (which the scripts, benches and the demo
//! use):
//! - only one tessd may shape the machine at a time (two would fight over the root cpuset), so
//!   [`Tessd`] holds the machine-wide lock `/run/lock/tess-dev.lock` for its whole life;
//! - the daemon is private: its own socket, state directory (a temporary directory) and cgroup
//!   subtree (`--group tess-it-PID-N`), so it never touches a system tessd's state;
//! - it is stopped by its pid (the [`std::process::Child`] we spawned), never by name, and then
//!   `tessd --reset` with the same flags removes its cgroups and restores kernel settings.
//!
//! Root tests are marked `#[ignore = "needs root: ..."]`, so that `cargo test` as an ordinary
//! user lists them as ignored instead of counting them as passed; `scripts/test` runs them as
//! root with `--include-ignored` and fails if any test was ignored. Inside such a test,
//! [`require_root`] fails loudly if it runs without root anyway: a root test never returns early.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub use tess_cgroup::{cell_in_path, Version};

pub mod c_lib;

/// The cgroup hierarchy a tessd started here drives: v1 where it mounts both the cpuset and the
/// cpu controllers (hybrid hosts), else v2 (the same rule as `tessd`'s automatic choice).
pub fn cgroup_version() -> tess_cgroup::Version {
    tess_cgroup::detect()
        .expect("reading /proc/self/mountinfo")
        .preferred()
        .expect("this machine offers no cgroup hierarchy tessd can drive")
}

/// The harts online here: root tests place cells by what the machine has (2 harts on the
/// development machine, 2 and 4 in `scripts/test-vm`), never by an assumed count.
pub fn online_harts() -> tess_sched::HartSet {
    tess_sched::online_harts().expect("reading the online harts")
}

/// Where the cgroup hierarchy that holds cpusets is mounted (v1 `cpuset`, or the v2 root).
pub fn cpuset_mount() -> PathBuf {
    let h = tess_cgroup::detect().expect("reading /proc/self/mountinfo");
    match cgroup_version() {
        tess_cgroup::Version::V1 => h.v1_cpuset,
        tess_cgroup::Version::V2 => h.v2,
    }
    .expect("the cpuset hierarchy is mounted")
}

/// The path of process `pid` in the cpuset hierarchy (`/G/cells/NAME` on v1; on v2 the same,
/// or `/G.part-HARTS/NAME` for a cell in a partition), from `/proc/PID/cgroup`.
pub fn cpuset_cgroup_of(pid: u32) -> String {
    let controller = match cgroup_version() {
        tess_cgroup::Version::V1 => Some("cpuset"),
        tess_cgroup::Version::V2 => None,
    };
    tess_cgroup::proc_cgroup_path(pid as i32, controller)
        .unwrap_or_else(|| panic!("process {pid} has no cpuset cgroup (exited?)"))
}

/// The lock every private tessd holds (shared with `scripts/with-tessd`).
pub const MACHINE_LOCK: &str = "/run/lock/tess-dev.lock";

/// How long a daemon may take to answer after it is spawned.
const START_TIMEOUT: Duration = Duration::from_secs(20);

static IN_PROCESS: Mutex<()> = Mutex::new(());
static DAEMONS_STARTED: AtomicUsize = AtomicUsize::new(0);

/// Whether this process runs as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Fails the test (never skips it) unless it runs as root. Root tests are `#[ignore]`d so that
/// an ordinary `cargo test` reports them as ignored; this catches `--include-ignored` without
/// root.
pub fn require_root() {
    assert!(
        is_root(),
        "this test needs root (cgroups, SCHED_DEADLINE): run it as root, e.g. through scripts/test"
    );
}

/// Holds the machine-wide lock (and an in-process one, so that the threads of one test binary
/// queue on a mutex rather than on the file lock).
#[derive(Debug)]
pub struct MachineLock {
    _local: MutexGuard<'static, ()>,
    _file: File,
}

/// Takes the machine-wide lock, waiting for other tessd users (other test binaries, other
/// engineers' `scripts/with-tessd`) to finish.
pub fn machine_lock() -> MachineLock {
    let local = IN_PROCESS.lock().unwrap_or_else(|p| p.into_inner());
    let _ = std::fs::create_dir_all("/run/lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(MACHINE_LOCK)
        .unwrap_or_else(|e| panic!("opening {MACHINE_LOCK}: {e}"));
    // SAFETY: flock on a descriptor we own; blocks until the lock is free.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
    assert_eq!(
        rc,
        0,
        "flock {MACHINE_LOCK}: {}",
        std::io::Error::last_os_error()
    );
    MachineLock {
        _local: local,
        _file: file,
    }
}

/// `target/<profile>`: test executables run from its `deps` directory, next to which cargo puts
/// the workspace's binaries and `examples/`.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(Path::parent)
        .expect("test executable in target/<profile>/deps")
        .to_path_buf()
}

/// Checks that a committed C header equals what cbindgen generated at build time; with the
/// environment variable `bless` set, rewrites the committed copy instead. `how` is the command
/// that regenerates it, for the failure message.
pub fn check_generated_header(committed_path: &str, generated: &str, bless: &str, how: &str) {
    if std::env::var_os(bless).is_some() {
        std::fs::write(committed_path, generated).expect("write the committed header");
        return;
    }
    let committed = std::fs::read_to_string(committed_path).unwrap_or_default();
    if committed != generated {
        let first = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(committed.lines().count().min(generated.lines().count()));
        panic!(
            "{committed_path} is stale (first difference at line {}); regenerate it with {how}",
            first + 1
        );
    }
}

/// A workspace binary built next to the tests; panics with the command to build it if missing.
pub fn built(name: &str) -> PathBuf {
    let p = profile_dir().join(name);
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --workspace` before the tests",
        p.display()
    );
    p
}

/// A private tessd: its own socket, state directory and cgroup subtree, under the machine-wide
/// lock; killed by pid and reset when dropped.
#[derive(Debug)]
pub struct Tessd {
    /// Temporary directory holding the socket, the state and the log.
    pub dir: tempfile::TempDir,
    /// The API socket (`TESS_SOCKET`).
    pub socket: PathBuf,
    /// The cgroup subtree's name.
    pub group: String,
    /// Extra environment for the daemon process (fault injection), used by [`Tessd::spawn`].
    pub env: Vec<(String, String)>,
    /// Configuration file given with `--config` (see [`Tessd::configure`]).
    config: Option<PathBuf>,
    /// The binary the daemon runs (a copy after [`Tessd::run_from_copy`]).
    tessd: PathBuf,
    /// The built binary, which resets the daemon's state whatever became of the copy.
    built_tessd: PathBuf,
    child: Option<Child>,
    // Dropped last (fields drop in declaration order after `Drop::drop`): the reset runs
    // while the lock is still held.
    _lock: MachineLock,
}

impl Tessd {
    /// Takes the machine-wide lock and starts a daemon (`tessd` built next to the tests);
    /// returns once it answers on its socket. Panics without root.
    pub fn start() -> Tessd {
        let mut d = Tessd::new();
        d.spawn();
        d
    }

    /// Takes the lock and prepares a daemon without starting it (set [`Tessd::env`], then
    /// [`Tessd::spawn`]).
    pub fn new() -> Tessd {
        require_root();
        let tessd = built("tessd");
        let lock = machine_lock();
        let dir = tempfile::tempdir().expect("temporary directory");
        let n = DAEMONS_STARTED.fetch_add(1, Ordering::Relaxed);
        Tessd {
            socket: dir.path().join("tessd.sock"),
            group: format!("tess-it-{}-{n}", std::process::id()),
            dir,
            env: Vec::new(),
            config: None,
            built_tessd: tessd.clone(),
            tessd,
            child: None,
            _lock: lock,
        }
    }

    /// `tess ARGS` against this daemon (`TESS_SOCKET` set), ready to run.
    pub fn tess_command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(built("tess"));
        c.args(args).env("TESS_SOCKET", &self.socket);
        c
    }

    /// Runs `tess ARGS` against this daemon and returns what it printed.
    pub fn tess(&self, args: &[&str]) -> std::process::Output {
        self.tess_command(args).output().expect("running tess")
    }

    /// Runs `tess ARGS` against this daemon; panics with its standard error unless it succeeds.
    pub fn tess_ok(&self, args: &[&str]) {
        let out = self.tess(args);
        assert!(
            out.status.success(),
            "tess {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Runs a copy of the built `tessd` from this daemon's directory (before [`Tessd::spawn`]);
    /// returns the copy's path, which a test may then replace or delete under the running
    /// daemon, as a package upgrade does. The reset at drop still uses the built binary.
    pub fn run_from_copy(&mut self) -> PathBuf {
        assert!(self.child.is_none(), "run_from_copy comes before spawn");
        let copy = self.dir.path().join("tessd");
        std::fs::copy(&self.tessd, &copy).expect("copying tessd");
        self.tessd = copy.clone();
        copy
    }

    /// Gives the daemon a configuration file with `text` (tessd.toml syntax) before
    /// [`Tessd::spawn`].
    pub fn configure(&mut self, text: &str) {
        let path = self.dir.path().join("tessd.toml");
        std::fs::write(&path, text).expect("writing the daemon's configuration");
        self.config = Some(path);
    }

    /// The flags that make this daemon private (also given to `--reset`).
    pub fn args(&self) -> Vec<String> {
        let config = self
            .config
            .iter()
            .flat_map(|p| ["--config".to_string(), p.display().to_string()]);
        config
            .chain([
                "--socket".into(),
                self.socket.display().to_string(),
                "--state-dir".into(),
                self.dir.path().join("state").display().to_string(),
                "--group".into(),
                self.group.clone(),
            ])
            .collect()
    }

    /// The cpuset group of cell `name` (v1: `<cpuset>/G/cells/NAME`; v2: `G/cells/NAME`, or
    /// `G.part-HARTS/NAME` for a dedicated or reserved cell in its partition), present or not.
    pub fn cell_cgroup(&self, name: &str) -> PathBuf {
        let mount = cpuset_mount();
        let plain = mount.join(&self.group).join("cells").join(name);
        if cgroup_version() == tess_cgroup::Version::V1 || plain.exists() {
            return plain;
        }
        self.partitions()
            .into_iter()
            .map(|p| p.join(name))
            .find(|p| p.exists())
            .unwrap_or(plain)
    }

    /// The v2 partitions of this daemon (`G.part-HARTS` beside its group); none on v1.
    pub fn partitions(&self) -> Vec<PathBuf> {
        let prefix = format!("{}.part-", self.group);
        let mut v: Vec<PathBuf> = std::fs::read_dir(cpuset_mount())
            .map(|rd| {
                rd.filter_map(|e| {
                    let e = e.ok()?;
                    let name = e.file_name().into_string().ok()?;
                    name.starts_with(&prefix).then(|| e.path())
                })
                .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    /// Names of the cells that have a cpuset group now, sorted.
    pub fn cell_cgroups(&self) -> Vec<String> {
        let mut dirs = vec![cpuset_mount().join(&self.group).join("cells")];
        dirs.extend(self.partitions());
        let mut names: Vec<String> = dirs
            .iter()
            .filter_map(|d| std::fs::read_dir(d).ok())
            .flatten()
            .filter_map(|e| {
                let e = e.ok()?;
                e.file_type()
                    .ok()?
                    .is_dir()
                    .then(|| e.file_name().into_string().ok())
                    .flatten()
            })
            .filter(|n| !n.starts_with('.'))
            .collect();
        names.sort();
        names
    }

    /// Path of the daemon's log.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("tessd.log")
    }

    /// The daemon's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// (Re)starts the daemon process (appending to its log) and waits until it accepts
    /// connections on its socket.
    pub fn spawn(&mut self) {
        assert!(self.child.is_none(), "tessd is already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("creating tessd.log");
        let _ = std::fs::remove_file(&self.socket);
        let child = Command::new(&self.tessd)
            .args(self.args())
            .env("RUST_LOG", "info")
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {}: {e}", self.tessd.display()));
        self.child = Some(child);
        let t0 = Instant::now();
        while std::os::unix::net::UnixStream::connect(&self.socket).is_err() {
            if let Some(st) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                panic!("tessd exited with {st}:\n{}", self.log());
            }
            assert!(
                t0.elapsed() < START_TIMEOUT,
                "tessd did not come up in {START_TIMEOUT:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The daemon's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the daemon (SIGKILL, by pid) and reaps it; its cgroups stay as they were.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Default for Tessd {
    fn default() -> Self {
        Tessd::new()
    }
}

impl Drop for Tessd {
    fn drop(&mut self) {
        self.kill9();
        // A reset that fails leaves the daemon's cgroups behind, with every task its sweep
        // moved into its system group: later daemons then find hart domains they cannot
        // split, and their reservations are refused. So the test that leaked fails here, and
        // the report goes to stderr directly (the test harness captures `eprintln!`).
        let reset = Command::new(&self.built_tessd)
            .args(self.args())
            .arg("--reset")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output();
        let failure = match reset {
            Ok(o) if o.status.success() => return,
            Ok(o) => format!(
                "{}: {}",
                o.status,
                String::from_utf8_lossy(&o.stderr).trim()
            ),
            Err(e) => e.to_string(),
        };
        let report = format!(
            "tess-testkit: resetting tessd group {} failed ({failure}); \
             reset it with `tessd {} --reset`\n",
            self.group,
            self.args().join(" ")
        );
        use std::io::Write;
        let _ = std::io::stderr().write_all(report.as_bytes());
        if !std::thread::panicking() {
            panic!("{report}");
        }
    }
}

impl Tessd {
    /// Starts the network service (`tess-netd`, built next to the tests) registered with this
    /// daemon's nameserver as `name`, epoll-waiting, and returns once it has registered; its log
    /// is `DIR/netd-NAME.log`. The returned reaper kills it by pid: drop it before the daemon.
    pub fn start_netd(&self, name: &str) -> Reaper {
        self.start_netd_with(name, &[])
    }

    /// [`Tessd::start_netd`] with more of `tess-netd`'s options (a link's `--capacity`, say).
    pub fn start_netd_with(&self, name: &str, options: &[&str]) -> Reaper {
        let ready = self.dir.path().join(format!("netd-{name}.ready"));
        let log = self.dir.path().join(format!("netd-{name}.log"));
        let mut reaper = Reaper::default();
        reaper.push(
            Command::new(built("tess-netd"))
                .args(["--name", name, "--wait", "epoll", "--ready-file"])
                .arg(&ready)
                .args(options)
                .env("TESS_SOCKET", &self.socket)
                .stdout(Stdio::null())
                .stderr(File::create(&log).expect("creating the service's log"))
                .spawn()
                .expect("starting tess-netd"),
        );
        let t0 = Instant::now();
        while !ready.exists() {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "tess-netd did not register: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        reaper
    }
}

/// Children a test started, killed by pid (SIGKILL) and reaped when dropped: a test never
/// cleans up by process name.
#[derive(Debug, Default)]
pub struct Reaper(Vec<Child>);

impl Reaper {
    /// Adds a child to kill at the end.
    pub fn push(&mut self, c: Child) -> &mut Child {
        self.0.push(c);
        self.0.last_mut().expect("just pushed")
    }

    /// Moves `other`'s children here (they are then killed with these, in reverse order).
    pub fn append(&mut self, mut other: Reaper) {
        self.0.append(&mut other.0);
    }
}

impl Extend<Child> for Reaper {
    fn extend<I: IntoIterator<Item = Child>>(&mut self, children: I) {
        self.0.extend(children);
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        for c in self.0.iter_mut().rev() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_dir_holds_the_test_executable() {
        let exe = std::env::current_exe().unwrap();
        assert!(exe.starts_with(profile_dir()));
        assert_eq!(exe.parent().unwrap().file_name().unwrap(), "deps");
    }

    #[test]
    #[ignore = "needs root: starts a private tessd on the real kernel"]
    fn a_private_daemon_answers_and_is_reset() {
        let group;
        {
            let d = Tessd::start();
            group = d.group.clone();
            assert!(d.pid().is_some());
            assert!(d.socket.exists());
        }
        // --reset removed the private subtree wherever the cpuset controller is mounted, and
        // on v2 its partitions beside it.
        for root in ["/sys/fs/cgroup/cpuset", "/sys/fs/cgroup"] {
            assert!(
                !Path::new(root).join(&group).exists(),
                "{root}/{group} left"
            );
            let leftovers: Vec<String> = std::fs::read_dir(root)
                .into_iter()
                .flatten()
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.starts_with(&format!("{group}.")))
                .collect();
            assert!(leftovers.is_empty(), "{root}: {leftovers:?} left");
        }
    }
}
