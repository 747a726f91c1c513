//! A private tessd for root tests on the real kernel (the workspace's one harness,
//! `tess-testkit`), with helpers to drive it through the `tess` binary under test.
//!
//! Every test here needs root and is `#[ignore = "needs root: ..."]`: `cargo test` as an ordinary
//! user lists it as ignored; `scripts/test` runs it as root with `--include-ignored`.

#![allow(dead_code)] // each test binary uses a different part of this module

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};
use tess_testkit::Tessd;

/// Path of the `tess` binary under test.
pub fn tess_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tess"))
}

/// A running private daemon ([`tess_testkit::Tessd`]: machine-wide lock, own socket, state
/// directory and cgroup subtree, killed by pid and reset when dropped), with `tess` helpers.
pub struct Daemon(Tessd);

impl std::ops::Deref for Daemon {
    type Target = Tessd;
    fn deref(&self) -> &Tessd {
        &self.0
    }
}

impl std::ops::DerefMut for Daemon {
    fn deref_mut(&mut self) -> &mut Tessd {
        &mut self.0
    }
}

impl Daemon {
    /// Starts a daemon and waits until it answers `tess status`.
    pub fn start() -> Daemon {
        let mut d = Daemon(Tessd::new());
        d.spawn();
        d
    }

    /// Starts a daemon with configuration `text` (tessd.toml syntax).
    #[allow(dead_code)] // not every test binary that includes this module uses it
    pub fn start_configured(text: &str) -> Daemon {
        let mut d = Daemon(Tessd::new());
        d.0.configure(text);
        d.spawn();
        d
    }

    /// (Re)starts the daemon process and waits until it answers `tess status`.
    pub fn spawn(&mut self) {
        self.0.spawn();
        let t0 = Instant::now();
        while self.tess(&["status"]).status.code() != Some(0) {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "tessd does not answer `tess status`:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
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

    /// Whether process `pid` sits in cell `name`'s cpuset group (either cgroup version).
    pub fn in_cell(&self, pid: u32, name: &str) -> bool {
        let path = tess_testkit::cpuset_cgroup_of(pid);
        tess_testkit::cell_in_path(&path, &self.group).as_deref() == Some(name)
    }

    /// Writes a manifest file and returns its path.
    pub fn manifest(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

/// Whether tessd drives cgroup v2 here (v1 on hybrid hosts: see `tess_testkit::cgroup_version`).
pub fn v2() -> bool {
    tess_testkit::cgroup_version() == tess_testkit::Version::V2
}

/// How many harts are online (hart ids are 0..harts()).
pub fn harts() -> usize {
    tess_testkit::online_harts().len()
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
