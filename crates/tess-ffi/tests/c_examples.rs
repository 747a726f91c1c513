//! The C examples of the crates whose C ABIs make up libtess, each compiled with `cc` against
//! `libtess.a` through `tess.pc` (`tess_testkit::c_lib`) and run:
//! - `tess-channel/examples/c/ping.c`: a C peer talking to a Rust peer (this test) over a
//!   channel whose end is handed to it through a Unix socket pair with SCM_RIGHTS;
//! - `tess-runtime/examples/c/gang.c`: standalone (2 harts on a simulated grid, resized to 1 and
//!   back by itself), it must print both vhart ids and call `adapt` for each resize
//!   (tess-runtime's `tests/in_cell.rs` runs it in a real cell);
//! - `tess-pulse/examples/pulse_rr.c` (Listing 2 of seed 004 in C): 6 threads that never yield
//!   on 2 harts must all finish, each preempted by the tick.
//!
//! The nameserver's example (`examples/c/ns_echo.c`) needs tessd: tess-cli's
//! `tests/nameserver.rs` runs it.

use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use tess_channel::{handoff, Channel, ChannelOptions, Endpoint, RecvError, Wait};
use tess_testkit::c_lib::{self, Link};

/// A source file of a sibling crate, `crates/<path>`.
fn source(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

/// A fresh directory for one test's executable, removed by the test when it passes.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tess-ffi-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn channel_c_peer_exchanges_messages_with_a_rust_peer() {
    let dir = scratch("ping");
    let exe = dir.join("ping");
    c_lib::compile(
        &[&source("tess-channel/examples/c/ping.c")],
        &exe,
        Link::Static,
    );

    // Broker part: create the channel, hand side B to the C process, keep side A.
    let (a, b) = Channel::create(&ChannelOptions::default()).unwrap();
    let (ours, theirs) = handoff::socket_pair().unwrap();
    let theirs_raw = theirs.as_raw_fd();
    const COUNT: usize = 2000;
    let mut cmd = Command::new(&exe);
    cmd.arg(theirs_raw.to_string()).arg(COUNT.to_string());
    // SAFETY: the closure only calls fcntl, which is async-signal-safe, to let the child
    // inherit its socket end.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(theirs_raw, libc::F_SETFD, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().expect("spawn the C peer");
    drop(theirs);
    handoff::send_endpoint(std::os::fd::AsFd::as_fd(&ours), &b).unwrap();
    drop(b);
    let mut ep = Endpoint::from_fds(a).unwrap();
    ep.set_wait(Wait::Adaptive);

    // Echo upper-cased until the C peer hangs up.
    let mut buf = vec![0u8; ep.max_message_size()];
    let mut echoed = 0;
    loop {
        match ep.recv(&mut buf) {
            Ok(n) => {
                buf[..n].make_ascii_uppercase();
                ep.send(&buf[..n]).unwrap();
                echoed += 1;
            }
            Err(RecvError::Disconnected) => break,
            Err(e) => panic!("rust peer: {e}"),
        }
    }
    let status = child.wait().unwrap();
    assert!(status.success(), "C peer failed: {status}");
    assert_eq!(echoed, COUNT + 1 + 3);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn runtime_c_gang_runs_standalone_and_adapts() {
    let dir = scratch("gang");
    let exe = dir.join("gang");
    c_lib::compile(
        &[&source("tess-runtime/examples/c/gang.c")],
        &exe,
        Link::Static,
    );
    let out = Command::new(&exe)
        .args(["1", "--standalone"])
        .output()
        .expect("run the C example");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "gang failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for needle in [
        "vhart 0 on hart",
        "vhart 1 on hart",
        "adapt(2 -> 1)",
        "adapt(1 -> 2)",
        "done after 2 adaptations",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn pulse_listing_2_in_c_runs_and_preempts() {
    let dir = scratch("pulse");
    let exe = dir.join("pulse_rr");
    c_lib::compile(
        &[&source("tess-pulse/examples/pulse_rr.c")],
        &exe,
        Link::Static,
    );
    let out = Command::new(&exe)
        .args(["6", "2"])
        .output()
        .expect("run pulse_rr");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "pulse_rr failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("all 6 threads done"), "{text}");
    for i in 0..6 {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("thread {i}:")))
            .unwrap_or_else(|| panic!("no line for thread {i}: {text}"));
        assert!(
            !line.contains("preempted 0 times"),
            "thread {i} never preempted: {line}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
