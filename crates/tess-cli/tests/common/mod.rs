//! A private tessd for root tests on the real kernel: its own socket, state directory and cgroup
//! subtree, torn down (cgroups removed, kernel settings restored) when dropped.
//!
//! Tests that start a daemon hold [`serial`]: two daemons would fight over the root cpuset.

#![allow(dead_code)] // each test binary uses a different part of this module

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

static SERIAL: Mutex<()> = Mutex::new(());

/// Holds the in-process lock and the machine-wide one (`/run/lock/tess-dev.lock`, shared with
/// `scripts/with-tessd`): only one tessd may shape the machine at a time.
pub struct Serial {
    _local: MutexGuard<'static, ()>,
    _file: std::fs::File,
}

/// Serializes daemon tests, within this binary and across processes.
pub fn serial() -> Serial {
    let local = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let _ = std::fs::create_dir_all("/run/lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open("/run/lock/tess-dev.lock")
        .expect("opening /run/lock/tess-dev.lock");
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a descriptor we own; blocks until the lock is free.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
    Serial {
        _local: local,
        _file: file,
    }
}

/// Whether we run as root (the real-kernel tests need it; CI runs as root).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Path of the `tess` binary under test.
pub fn tess_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tess"))
}

/// Path of `tessd`, built next to `tess` (`cargo build --workspace --bins` builds both).
pub fn tessd_bin() -> PathBuf {
    let p = tess_bin().with_file_name("tessd");
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --workspace --bins` before the tests",
        p.display()
    );
    p
}

/// A running private daemon.
pub struct Daemon {
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub group: String,
    child: Option<Child>,
    /// Environment for the daemon process (fault injection).
    pub env: Vec<(String, String)>,
}

impl Daemon {
    /// Starts a daemon and waits until it answers.
    pub fn start() -> Daemon {
        assert!(is_root(), "root tests need root");
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("tessd.sock");
        let group = format!("tess-it-{}", std::process::id());
        let mut d = Daemon {
            dir,
            socket,
            group,
            child: None,
            env: Vec::new(),
        };
        d.spawn();
        d
    }

    fn args(&self) -> Vec<String> {
        vec![
            "--socket".into(),
            self.socket.display().to_string(),
            "--state-dir".into(),
            self.dir.path().join("state").display().to_string(),
            "--group".into(),
            self.group.clone(),
        ]
    }

    /// (Re)starts the daemon process.
    pub fn spawn(&mut self) {
        let log = std::fs::File::create(self.dir.path().join("tessd.log")).unwrap();
        let child = Command::new(tessd_bin())
            .args(self.args())
            .env("RUST_LOG", "info")
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stderr(log)
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
        let t0 = Instant::now();
        while self.tess(&["status"]).status.code() != Some(0) {
            if t0.elapsed() > Duration::from_secs(20) {
                panic!("tessd did not come up:\n{}", self.log());
            }
            if let Some(st) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("tessd exited with {st}:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills the daemon with SIGKILL.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The daemon's log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("tessd.log")).unwrap_or_default()
    }

    /// Runs `tess ARGS` against this daemon.
    pub fn tess(&self, args: &[&str]) -> Output {
        Command::new(tess_bin())
            .args(args)
            .env("TESS_SOCKET", &self.socket)
            .output()
            .unwrap()
    }

    /// Runs `tess ARGS` as another user (uid, gid) with `setpriv`.
    pub fn tess_as(&self, uid: u32, args: &[&str]) -> Output {
        Command::new("setpriv")
            .args([
                format!("--reuid={uid}"),
                format!("--regid={uid}"),
                "--clear-groups".into(),
            ])
            .arg(tess_bin())
            .args(args)
            .env("TESS_SOCKET", &self.socket)
            .output()
            .unwrap()
    }

    /// Runs `tess ARGS --json` and parses the output; panics on failure.
    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut a: Vec<&str> = args.to_vec();
        a.push("--json");
        let out = self.tess(&a);
        assert!(
            out.status.success(),
            "tess {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "tess {args:?}: {e}: {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }

    /// Cell names and their harts, as the daemon reports them.
    pub fn cells(&self) -> Vec<(String, String)> {
        let v = self.json(&["cell", "list"]);
        v.as_array()
            .unwrap()
            .iter()
            .map(|c| {
                let harts: Vec<String> = c["harts"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|h| h.to_string())
                    .collect();
                (c["name"].as_str().unwrap().to_string(), harts.join(","))
            })
            .collect()
    }

    /// The cpuset directory of tess's subtree (v1).
    pub fn cpuset_root(&self) -> PathBuf {
        Path::new("/sys/fs/cgroup/cpuset").join(&self.group)
    }

    /// Writes a manifest file and returns its path.
    pub fn manifest(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill9();
        let _ = Command::new(tessd_bin())
            .args(self.args())
            .arg("--reset")
            .output();
    }
}

/// Reads a file, trimmed.
pub fn read(p: impl AsRef<Path>) -> String {
    std::fs::read_to_string(p.as_ref())
        .unwrap_or_else(|e| panic!("{}: {e}", p.as_ref().display()))
        .trim()
        .to_string()
}

/// Exit code and stderr of a command.
pub fn outcome(o: &Output) -> (i32, String) {
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}
