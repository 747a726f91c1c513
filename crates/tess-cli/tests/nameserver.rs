//! The nameserver on the real kernel: processes in different cells find each other by name and
//! exchange messages, from Rust and from C (tess_ns.h); access rules by uid and by cell with two
//! unprivileged users; names are freed when their service exits.

mod common;

use common::{outcome, Daemon};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Builds `crates/tess-ffi/examples/c/ns_echo.c` against libtess (static, through `tess.pc`).
fn build_c_client(dir: &Path) -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tess-ffi/examples/c/ns_echo.c");
    let exe = dir.join("ns_echo");
    tess_testkit::c_lib::compile(&[&source], &exe, tess_testkit::c_lib::Link::Static);
    exe
}

/// Starts `tess run --cell CELL -- PROGRAM ARGS` (as `uid` when given) and waits for "ready".
fn start_service(d: &Daemon, uid: Option<u32>, cell: &str, program: &[&str]) -> Child {
    let mut cmd = match uid {
        Some(u) => {
            let mut c = Command::new("setpriv");
            c.args([
                format!("--reuid={u}"),
                format!("--regid={u}"),
                "--clear-groups".into(),
            ])
            .arg(common::tess_bin());
            c
        }
        None => Command::new(common::tess_bin()),
    };
    let mut child = cmd
        .args(["run", "--cell", cell, "--"])
        .args(program)
        .env("TESS_SOCKET", &d.socket)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready", "service did not start");
    child
}

fn names(d: &Daemon) -> Vec<String> {
    d.json(&["ns", "list"])
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
#[ignore = "needs root: a private tessd on the real kernel"]
fn rust_and_c_peers_find_each_other_by_name_with_access_rules() {
    let d = Daemon::start();
    let _ = std::fs::set_permissions(
        d.dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    );
    let c_prog = build_c_client(d.dir.path());
    let c = c_prog.to_str().unwrap();
    let tess = common::tess_bin();
    let tess = tess.to_str().unwrap();
    for (name, hart) in [("svc", "0"), ("cli", "1")] {
        let o = d.tess(&[
            "cell",
            "create",
            name,
            "--policy",
            "best-effort",
            "--hart-ids",
            hart,
        ]);
        assert_eq!(outcome(&o).0, 0, "{}", outcome(&o).1);
    }

    // A Rust service in cell svc, a C client in cell cli.
    let mut rust_svc = start_service(
        &d,
        None,
        "svc",
        &[
            tess,
            "work",
            "echo",
            "demo/rust",
            "--allow-cell",
            "cli",
            "--clients",
            "1",
        ],
    );
    assert!(names(&d).contains(&"demo/rust".to_string()));
    let o = d.tess(&["run", "--cell", "cli", "--", c, "ping", "demo/rust", "500"]);
    assert_eq!(outcome(&o).0, 0, "C client: {}", outcome(&o).1);
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "ok 500");
    assert!(rust_svc.wait().unwrap().success());

    // A C service in cell svc admitting uid 41001; Rust clients as 41001 and 41002.
    let (alice, bob) = (41001u32, 41002u32);
    let mut c_svc = start_service(&d, None, "svc", &[c, "serve", "demo/c", &alice.to_string()]);
    let (code, err) = outcome(&d.tess_as(bob, &["work", "ping", "demo/c", "--count", "10"]));
    assert_eq!(code, 4, "bob must be refused: {err}");
    assert!(err.contains("does not admit uid 41002"), "{err}");
    let o = d.tess_as(alice, &["work", "ping", "demo/c", "--count", "200"]);
    assert_eq!(outcome(&o).0, 0, "alice: {}", outcome(&o).1);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["count"], 200);
    // The C service served its one client and exited: its name is free again.
    assert!(c_svc.wait().unwrap().success());
    let t0 = Instant::now();
    while names(&d).contains(&"demo/c".to_string()) {
        assert!(t0.elapsed() < Duration::from_secs(20), "name not freed");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        outcome(&d.tess(&["work", "ping", "demo/c", "--count", "1"])).0,
        5
    );

    // Access by cell: bob's own cell is admitted, bob outside it is not.
    let o = d.tess(&[
        "quota",
        "set",
        &bob.to_string(),
        "--max-cells",
        "1",
        "--max-harts",
        "1",
    ]);
    assert_eq!(outcome(&o).0, 0, "{}", outcome(&o).1);
    let o = d.tess_as(
        bob,
        &[
            "cell",
            "create",
            "bobcell",
            "--policy",
            "best-effort",
            "--hart-ids",
            "1",
        ],
    );
    assert_eq!(outcome(&o).0, 0, "{}", outcome(&o).1);
    let mut cell_svc = start_service(
        &d,
        None,
        "svc",
        &[
            tess,
            "work",
            "echo",
            "demo/cells",
            "--allow-cell",
            "bobcell",
            "--clients",
            "1",
        ],
    );
    let (code, err) = outcome(&d.tess_as(bob, &["work", "ping", "demo/cells", "--count", "5"]));
    assert_eq!(code, 4, "bob outside bobcell must be refused: {err}");
    let o = d.tess_as(
        bob,
        &[
            "run",
            "--cell",
            "bobcell",
            "--",
            tess,
            "work",
            "ping",
            "demo/cells",
            "--count",
            "5",
        ],
    );
    assert_eq!(outcome(&o).0, 0, "bob in bobcell: {}", outcome(&o).1);
    assert!(cell_svc.wait().unwrap().success());
    // Names are unique: a second registration of a live name is refused.
    let mut holder = start_service(
        &d,
        None,
        "svc",
        &[tess, "work", "echo", "demo/dup", "--clients", "1"],
    );
    let (code, err) = outcome(&d.tess(&["work", "echo", "demo/dup"]));
    assert_eq!(code, 6, "{err}");
    let _ = holder.kill();
    let _ = holder.wait();
}

/// One frame's record as the conference bench's video streams send it to the display
/// (`crates/tess-cli/src/bench/conference/display.rs`, `Shown`): the stream, then its release,
/// arrival and decode-done times, little-endian ns.
fn shown(stream: u8, release_ns: u64, arrival_ns: u64, done_ns: u64) -> Vec<u8> {
    let mut b = vec![stream];
    for t in [release_ns, arrival_ns, done_ns] {
        b.extend_from_slice(&t.to_le_bytes());
    }
    b
}

#[test]
#[ignore = "needs root: a private tessd on the real kernel"]
fn the_conference_display_counts_what_streams_send_it_through_the_nameserver() {
    const STREAMS: u8 = 9;
    let d = Daemon::start();
    let o = d.tess(&[
        "cell",
        "create",
        "conf-display",
        "--policy",
        "best-effort",
        "--hart-ids",
        "0",
    ]);
    assert_eq!(outcome(&o).0, 0, "{}", outcome(&o).1);
    let out = d.dir.path().join("display.json");
    let t0 = tess_heartbeat::clock::now_ns() + 1_000_000_000;
    let tess = common::tess_bin();
    let mut display = Command::new(&tess)
        .args(["run", "--cell", "conf-display", "--"])
        .arg(&tess)
        .args(["bench", "conference", "--role", "display", "--secs", "1"])
        .args(["--t0", &t0.to_string(), "--out"])
        .arg(&out)
        .env("TESS_SOCKET", &d.socket)
        .spawn()
        .unwrap();
    // Each stream connects by name (the display may not have registered yet), sends one
    // frame on time and, stream 0 only, one late; then hangs up.
    let mut ends = Vec::new();
    let started = Instant::now();
    for k in 0..STREAMS {
        let ep = loop {
            match tess_proto::ns::connect_via(&d.socket, "conf-display") {
                Ok((ep, info)) => {
                    assert_eq!(info.service.cell.as_deref(), Some("conf-display"));
                    break ep;
                }
                Err(e) => {
                    assert!(started.elapsed() < Duration::from_secs(20), "{e}");
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        };
        ends.push(ep);
        let release = t0 + 10_000_000 * u64::from(k);
        let ep = ends.last_mut().unwrap();
        ep.send(&shown(k, release, release + 1_000_000, release + 5_000_000))
            .unwrap();
        if k == 0 {
            let late = t0 + 1_500_000_000;
            ep.send(&shown(0, late, late + 1_000_000, late + 200_000_000))
                .unwrap();
        }
    }
    drop(ends);
    // All nine came and went: the display ends at its next drain, long before the grace
    // period after the last release (3 s after t0 + 1 s) would end it.
    let status = loop {
        if let Some(s) = display.try_wait().unwrap() {
            break s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "the display did not end when every stream had hung up"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let row = |w: usize, what: &str| -> Vec<u64> {
        v[what][w]
            .as_array()
            .unwrap_or_else(|| panic!("no {what}[{w}] in {v}"))
            .iter()
            .map(|n| n.as_u64().unwrap())
            .collect()
    };
    assert_eq!(row(0, "frames"), vec![1; STREAMS as usize], "{v}");
    assert_eq!(row(0, "on_time"), vec![1; STREAMS as usize], "{v}");
    let mut late = vec![0; STREAMS as usize];
    late[0] = 1;
    assert_eq!(row(1, "frames"), late, "{v}");
    assert_eq!(row(1, "on_time"), vec![0; STREAMS as usize], "{v}");
    assert_eq!(v["errors"].as_array().map(Vec::len), Some(0), "{v}");
}
