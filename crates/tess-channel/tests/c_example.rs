//! Compiles `examples/c/ping.c` with `cc` against the static library and runs it as a separate
//! process talking to a Rust peer (this test) over a channel whose end is handed to it through
//! a Unix socket pair with SCM_RIGHTS.
#![cfg(not(loom))]

use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;
use tess_channel::{handoff, Channel, ChannelOptions, Endpoint, RecvError, Wait};

fn staticlib_dir() -> PathBuf {
    // Integration tests run from target/<profile>/deps, where cargo also puts the staticlib.
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent().expect("deps dir").to_path_buf()
}

#[test]
fn c_peer_exchanges_messages_with_a_rust_peer() {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let lib = staticlib_dir().join("libtess_channel.a");
    assert!(lib.exists(), "{} not built", lib.display());
    let out_dir = std::env::temp_dir().join(format!("tess-channel-c-{}", std::process::id()));
    std::fs::create_dir_all(&out_dir).unwrap();
    let exe = out_dir.join("ping");
    let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-I"])
        .arg(crate_dir.join("include"))
        .arg(crate_dir.join("examples/c/ping.c"))
        .arg(&lib)
        .args(["-lpthread", "-ldl", "-lm", "-o"])
        .arg(&exe)
        .status()
        .expect("run cc");
    assert!(status.success(), "cc failed");

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
    let _ = std::fs::remove_dir_all(&out_dir);
}
