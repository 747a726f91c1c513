//! C programs built against libtess, the C library of tess, the way its users build them: with
//! the flags of `tess.pc` (`pkg-config --cflags --libs tess`, docs/c-library.md) from the build
//! tree, `target/<profile>/pkgconfig`, which crates/tess-ffi's build script writes.
//!
//! One difference: `libdir` is `target/<profile>/deps` ([`lib_dir`]), where cargo builds
//! `libtess.a` and `libtess.so`. `cargo build` then links copies into `target/<profile>` (the
//! `libdir` of `tess.pc`), but `cargo test` does not, so those copies can be older than the
//! library tess-ffi's tests were built with. Tests of other crates find the library only after
//! it was built (`cargo build --workspace`, as `scripts/test` does, or `cargo build -p
//! tess-ffi`); tess-ffi's own tests always get a fresh one, since cargo builds it before them.

use std::path::{Path, PathBuf};
use std::process::Command;

/// How a program links libtess.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// `libtess.a`: the program carries the library and runs anywhere (in a cell, as another
    /// user). The flags of `tess.pc`, with `-ltess` naming the archive (`-l:libtess.a`), since
    /// the linker prefers `libtess.so` when both are in the directory.
    Static,
    /// `libtess.so`, exactly the flags of `tess.pc`, plus an rpath to [`lib_dir`].
    Shared,
}

/// `target/<profile>/pkgconfig`, the directory to put in `PKG_CONFIG_PATH`.
pub fn pkg_config_dir() -> PathBuf {
    crate::profile_dir().join("pkgconfig")
}

/// `target/<profile>/deps`, where cargo builds `libtess.a` and `libtess.so` (module docs).
pub fn lib_dir() -> PathBuf {
    crate::profile_dir().join("deps")
}

/// `pkg-config ARGS tess` against the build tree's `tess.pc` with `libdir` = [`lib_dir`], split
/// into words; panics with what to do when the library, the file or pkg-config is missing.
pub fn pkg_config(args: &[&str]) -> Vec<String> {
    let dir = pkg_config_dir();
    for file in [dir.join("tess.pc"), lib_dir().join("libtess.a")] {
        assert!(
            file.exists(),
            "{} is missing: build the C library first (`cargo build -p tess-ffi`, or \
             `cargo build --workspace`)",
            file.display()
        );
    }
    let out = Command::new("pkg-config")
        .arg(format!("--define-variable=libdir={}", lib_dir().display()))
        .args(args)
        .arg("tess")
        .env("PKG_CONFIG_PATH", &dir)
        .output()
        .unwrap_or_else(|e| panic!("run pkg-config (install pkgconf; scripts/setup does): {e}"));
    assert!(
        out.status.success(),
        "pkg-config {args:?} tess failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(String::from)
        .collect()
}

/// A `tess.pc` variable (`libdir`, `includedir`, ...) of the build tree.
pub fn variable(name: &str) -> PathBuf {
    let words = pkg_config(&[&format!("--variable={name}")]);
    assert_eq!(words.len(), 1, "tess.pc: {name} = {words:?}");
    PathBuf::from(&words[0])
}

/// Compiles the C `sources` into the executable `out` with the system C compiler (`$CC`, or
/// `cc`) in C11 with every warning an error, against libtess as `link` says; panics with the
/// compiler's complaint if it fails.
pub fn compile(sources: &[&Path], out: &Path, link: Link) {
    let mut flags = pkg_config(&["--cflags", "--libs"]);
    match link {
        Link::Static => {
            let l = flags.iter_mut().find(|f| *f == "-ltess");
            *l.expect("tess.pc links -ltess") = "-l:libtess.a".into();
        }
        Link::Shared => flags.push(format!("-Wl,-rpath,{}", lib_dir().display())),
    }
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    }
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let output = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1"])
        .args(sources)
        .args(&flags)
        .arg("-o")
        .arg(out)
        .output()
        .unwrap_or_else(|e| panic!("run {cc}: {e}"));
    assert!(
        output.status.success(),
        "{cc} {sources:?} {flags:?} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
