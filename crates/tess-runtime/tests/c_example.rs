//! Compiles `examples/c/gang.c` with `cc` against the static library and runs it standalone
//! (2 harts on a simulated grid, resized to 1 and back by itself): it must print both vhart
//! ids and call `adapt` for each resize. `tests/in_cell.rs` runs it in a real cell.
#![cfg(not(loom))]

use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds the C example into `dir` and returns its path.
pub fn build_c_gang(dir: &Path) -> PathBuf {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    // Integration tests run from target/<profile>/deps; cargo puts the staticlib in
    // target/<profile> (and a hashed copy in deps).
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps dir");
    let lib = deps
        .parent()
        .map(|p| p.join("libtess_runtime.a"))
        .filter(|p| p.exists())
        .or_else(|| {
            std::fs::read_dir(deps)
                .ok()?
                .flatten()
                .map(|e| e.path())
                .find(|p| {
                    let n = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                    n.starts_with("libtess_runtime") && n.ends_with(".a")
                })
        })
        .unwrap_or_else(|| deps.join("libtess_runtime.a"));
    assert!(lib.exists(), "{} not built", lib.display());
    std::fs::create_dir_all(dir).unwrap();
    let out = dir.join("gang");
    let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-I"])
        .arg(crate_dir.join("include"))
        .arg(crate_dir.join("examples/c/gang.c"))
        .arg(&lib)
        .args(["-lpthread", "-ldl", "-lm", "-o"])
        .arg(&out)
        .status()
        .expect("run cc");
    assert!(status.success(), "cc failed");
    out
}

#[test]
fn c_gang_runs_standalone_and_adapts() {
    let dir = std::env::temp_dir().join(format!("tess-runtime-c-{}", std::process::id()));
    let exe = build_c_gang(&dir);
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
