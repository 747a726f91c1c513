//! Faults of the state directory (issue 12 part 2): a second tessd on the same state, a
//! corrupted state file, a full disk. Each gives a clear error and loses nothing.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tess_proto::client::Client;
use tess_proto::{Body, Request};
use tess_testkit::Tessd;

/// Runs one more tessd with `args` that is expected to refuse to start; returns its stderr.
/// If it does start, it is killed (by pid) and the test fails.
fn refused_start(args: &[String]) -> String {
    let mut c = Command::new(tess_testkit::built("tessd"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    loop {
        if let Some(st) = c.try_wait().unwrap() {
            let mut err = String::new();
            use std::io::Read;
            c.stderr.take().unwrap().read_to_string(&mut err).unwrap();
            assert!(!st.success(), "tessd exited successfully: {err}");
            return err;
        }
        if t0.elapsed() > Duration::from_secs(10) {
            let _ = c.kill();
            let _ = c.wait();
            panic!("tessd started although it should have refused");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn client(d: &Tessd) -> Client {
    Client::connect(&d.socket).unwrap()
}

fn create(c: &mut Client, name: &str, memory: &str) -> Result<Body, tess_proto::client::ApiError> {
    let spec = tess_core::spec::CellSpec {
        name: name.into(),
        policy: tess_core::spec::Policy::BestEffort { weight: 100 },
        harts: tess_core::spec::HartRequest::Count(1),
        memory_max: Some(memory.parse::<u64>().unwrap()),
        pids_max: None,
        pinned: false,
        idle: None,
        broker: Default::default(),
    };
    c.call(&Request::CreateCell { spec })
}

fn cells(d: &Tessd) -> Vec<String> {
    match client(d).call(&Request::ListCells).unwrap() {
        Body::Cells { cells } => cells.into_iter().map(|c| c.name).collect(),
        other => panic!("{other:?}"),
    }
}

fn state_dir(d: &Tessd) -> PathBuf {
    d.dir.path().join("state")
}

#[test]
#[ignore = "needs root: private tessd daemons on the real kernel"]
fn a_second_daemon_on_the_same_state_is_refused_and_the_first_keeps_serving() {
    let d = Tessd::start();
    create(&mut client(&d), "one", "67108864").unwrap();
    let mut args = d.args();
    // Its own socket, so that the only thing shared is the state directory.
    let i = args.iter().position(|a| a == "--socket").unwrap();
    args[i + 1] = d.dir.path().join("second.sock").display().to_string();
    let err = refused_start(&args);
    assert!(
        err.contains("another tessd") && err.contains(&d.pid().unwrap().to_string()),
        "{err}"
    );
    assert_eq!(cells(&d), ["one"]);
}

#[test]
#[ignore = "needs root: a private tessd on the real kernel"]
fn a_corrupted_state_file_is_a_clear_error_and_left_untouched() {
    let mut d = Tessd::start();
    create(&mut client(&d), "one", "67108864").unwrap();
    d.kill9();
    let db = state_dir(&d).join("state.db");
    // Fold the write-ahead log into the file (SQLite would otherwise read page 1 from the log,
    // and the damage below would go unseen), then write garbage over the header.
    {
        let c = rusqlite::Connection::open(&db).unwrap();
        c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
    }
    let good = std::fs::read(&db).unwrap();
    let mut bytes = good.clone();
    bytes[..100].copy_from_slice(&[0x5a; 100]);
    std::fs::write(&db, &bytes).unwrap();
    let err = refused_start(&d.args());
    assert!(
        err.contains("state.db") && err.contains("unreadable"),
        "{err}"
    );
    // Nothing was rewritten: the same bytes are there to be recovered.
    assert_eq!(std::fs::read(&db).unwrap(), bytes);
    // Recover, so that the harness's reset finds the saved kernel settings and removes the
    // cgroups (an unreadable state would leave them, with the test runner inside).
    std::fs::write(&db, &good).unwrap();
}

#[test]
#[ignore = "needs root: a private tessd on the real kernel"]
fn a_corrupted_cell_row_names_the_cell_and_keeps_it() {
    let mut d = Tessd::start();
    create(&mut client(&d), "one", "67108864").unwrap();
    d.kill9();
    let db = state_dir(&d).join("state.db");
    let good_row: String = {
        let c = rusqlite::Connection::open(&db).unwrap();
        let row = c
            .query_row("SELECT data FROM cells WHERE name = 'one'", [], |r| {
                r.get(0)
            })
            .unwrap();
        c.execute("UPDATE cells SET data = '{broken' WHERE name = 'one'", [])
            .unwrap();
        row
    };
    let err = refused_start(&d.args());
    assert!(
        err.contains("\"one\"") && err.contains("unreadable"),
        "{err}"
    );
    let c = rusqlite::Connection::open(&db).unwrap();
    let kept: String = c
        .query_row("SELECT data FROM cells WHERE name = 'one'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(kept, "{broken");
    // Repair the row, so that the harness's reset can read the state and clean up.
    c.execute(
        "UPDATE cells SET data = ?1 WHERE name = 'one'",
        [good_row.as_str()],
    )
    .unwrap();
}

/// A tmpfs mounted for the life of the value.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(at).unwrap();
        let st = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size}"),
                "tess-full",
                at.to_str().unwrap(),
            ])
            .status()
            .unwrap();
        assert!(st.success(), "mounting a tmpfs at {}", at.display());
        Tmpfs(at.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Fills the filesystem of `dir` until it is full; returns the filler's path.
fn fill(dir: &Path) -> PathBuf {
    use std::io::Write;
    let p = dir.join("filler");
    let mut f = std::fs::File::create(&p).unwrap();
    let block = vec![0u8; 4096];
    while f.write_all(&block).is_ok() {}
    let _ = f.sync_all();
    p
}

#[test]
#[ignore = "needs root: a private tessd on the real kernel, and mount"]
fn a_full_disk_refuses_the_change_clearly_and_rolls_the_kernel_back() {
    let mut d = Tessd::new();
    let mnt = Tmpfs::mount(&state_dir(&d), "4M");
    d.spawn();
    create(&mut client(&d), "kept", "67108864").unwrap();
    let filler = fill(&mnt.0);
    let e = create(&mut client(&d), "more", "67108864").unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("could not be recorded") && msg.contains("full"),
        "{msg}"
    );
    // Rolled back: no cgroup for the refused cell; the kept one is intact.
    assert_eq!(cells(&d), ["kept"]);
    for root in ["/sys/fs/cgroup/cpuset", "/sys/fs/cgroup"] {
        let dir = Path::new(root).join(&d.group).join("cells");
        assert!(!dir.join("more").exists(), "{} left", dir.display());
    }
    // With space again, the same change goes through, and survives a restart.
    std::fs::remove_file(filler).unwrap();
    create(&mut client(&d), "more", "67108864").unwrap();
    d.kill9();
    d.spawn();
    assert_eq!(cells(&d), ["kept", "more"]);
    // The harness's reset reads the saved kernel settings from the state on the tmpfs: it must
    // run before the tmpfs goes, or the kernel keeps what tessd raised.
    drop(d);
    drop(mnt);
}

/// Pids of tessd's idle spinners (`tessd __spin-idle HART`) that are children of `parent`.
fn spinners_of(parent: u32) -> Vec<i32> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // The parent pid is the second field after the command in parentheses.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if args.get(1) == Some(&&b"__spin-idle"[..]) && ppid == Some(parent) {
            v.push(pid);
        }
    }
    v
}

#[test]
#[ignore = "needs root: a private tessd on the real kernel"]
fn a_daemon_whose_binary_was_replaced_still_starts_spinners() {
    // An upgrade replaces the binary under a running daemon. tessd starts a spinning cell's
    // spinners from its own executable; by the path it was started from, that failed with "No
    // such file or directory" once the file was gone.
    let mut d = Tessd::new();
    let exe = d.run_from_copy();
    d.spawn();
    let pid = d.pid().unwrap();
    std::fs::remove_file(&exe).unwrap();
    std::fs::write(&exe, b"#!/bin/false\n").unwrap();
    let hart = tess_testkit::online_harts()
        .iter()
        .last()
        .unwrap()
        .to_string();
    d.tess_ok(&[
        "cell",
        "create",
        "spin",
        "--policy",
        "dedicated",
        "--hart-ids",
        &hart,
        "--idle",
        "spin",
    ]);
    let t0 = Instant::now();
    while spinners_of(pid).is_empty() && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(spinners_of(pid).len(), 1, "{}", d.log());
    d.tess_ok(&["cell", "delete", "spin"]);
    let t0 = Instant::now();
    while !spinners_of(pid).is_empty() && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(spinners_of(pid).is_empty(), "the spinner outlived its cell");
}
