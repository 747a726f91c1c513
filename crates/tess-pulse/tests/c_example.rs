//! Compiles `examples/pulse_rr.c` (Listing 2 of seed 004 in C) with `cc` against the static
//! library and runs it: 6 threads that never yield on 2 harts must all finish, each
//! preempted by the tick.

use std::path::PathBuf;
use std::process::Command;

fn static_lib() -> PathBuf {
    // Integration tests run from target/<profile>/deps; cargo leaves the staticlib there under
    // a hashed name (and a copy in target/<profile> after `cargo build`): take the newest.
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps dir");
    let candidates = [
        deps.to_path_buf(),
        deps.parent().expect("profile dir").to_path_buf(),
    ];
    candidates
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flat_map(|r| r.flatten().map(|e| e.path()))
        .filter(|p| {
            let n = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            n.starts_with("libtess_pulse") && n.ends_with(".a")
        })
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok())
        .expect("libtess_pulse.a is built with the tests")
}

#[test]
fn listing_2_in_c_runs_and_preempts() {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::temp_dir().join(format!("tess-pulse-c-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("pulse_rr");
    let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-I"])
        .arg(crate_dir.join("include"))
        .arg(crate_dir.join("examples/pulse_rr.c"))
        .arg(static_lib())
        .args(["-lpthread", "-ldl", "-lm", "-o"])
        .arg(&exe)
        .status()
        .expect("run cc");
    assert!(status.success(), "cc failed");
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
