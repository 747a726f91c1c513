//! Generates `tess_ns.h` from `src/ns.rs` with cbindgen into `OUT_DIR`, and lays out the C
//! library's build tree next to `libtess.a` and `libtess.so` in `target/<profile>`:
//!
//! ```text
//! target/<profile>/include/          tess.h and the five headers it includes (copies)
//! target/<profile>/pkgconfig/tess.pc tess.pc.in with prefix = target/<profile>
//! ```
//!
//! so that `PKG_CONFIG_PATH=target/debug/pkgconfig pkg-config --cflags --libs tess` works after
//! `cargo build`. The committed headers stay next to the Rust code that defines them (each
//! crate's `include/`, checked against its own cbindgen output by its `tests/header.rs`); the
//! committed copy of this crate's header is `include/tess_ns.h` (`TESS_FFI_BLESS=1 cargo test
//! -p tess-ffi --test header` updates it). The build script never writes into the source tree.

use std::path::{Path, PathBuf};

/// The include directories of the crates whose C ABIs make up libtess (see `src/lib.rs`), this
/// crate's (with the umbrella `tess.h`) first.
const INCLUDE_DIRS: [&str; 5] = [
    "include",
    "../tess-channel/include",
    "../tess-runtime/include",
    "../tess-heartbeat/include",
    "../tess-pulse/include",
];

fn main() {
    println!("cargo:rerun-if-changed=src/ns.rs");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    println!("cargo:rerun-if-changed=tess.pc.in");
    for dir in INCLUDE_DIRS {
        println!("cargo:rerun-if-changed={dir}");
    }
    let crate_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it"));
    let config =
        cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml parses");
    cbindgen::Builder::new()
        .with_config(config)
        .with_src(crate_dir.join("src/ns.rs"))
        .generate()
        .expect("cbindgen generates the C header")
        .write_to_file(out_dir.join("tess_ns.h"));

    let Some(profile_dir) = profile_dir(&out_dir) else {
        println!(
            "cargo:warning=OUT_DIR {} is not <target>/<profile>/build/<pkg>/out: \
             the C library's include/ and pkgconfig/ are not written",
            out_dir.display()
        );
        return;
    };
    let include = profile_dir.join("include");
    std::fs::create_dir_all(&include).expect("create target/<profile>/include");
    for dir in INCLUDE_DIRS {
        for header in headers_in(&crate_dir.join(dir)) {
            let text = std::fs::read_to_string(&header)
                .unwrap_or_else(|e| panic!("read {}: {e}", header.display()));
            write_if_changed(&include.join(header.file_name().expect("a file")), &text);
        }
    }
    let template = std::fs::read_to_string(crate_dir.join("tess.pc.in")).expect("read tess.pc.in");
    let pc = template
        .replace("@prefix@", &profile_dir.display().to_string())
        .replace("@libdir@", "${prefix}")
        .replace("@includedir@", "${prefix}/include")
        .replace(
            "@version@",
            &std::env::var("CARGO_PKG_VERSION").expect("cargo sets it"),
        );
    let pkgconfig = profile_dir.join("pkgconfig");
    std::fs::create_dir_all(&pkgconfig).expect("create target/<profile>/pkgconfig");
    write_if_changed(&pkgconfig.join("tess.pc"), &pc);
}

/// `target/<profile>` (or `target/<triple>/<profile>`), where cargo puts `libtess.a` and
/// `libtess.so`: `OUT_DIR` is `<that>/build/tess-ffi-<hash>/out`.
fn profile_dir(out_dir: &Path) -> Option<PathBuf> {
    let build = out_dir.parent()?.parent()?;
    (build.file_name()? == "build").then(|| build.parent().map(Path::to_path_buf))?
}

/// The `*.h` files of `dir`, sorted.
fn headers_in(dir: &Path) -> Vec<PathBuf> {
    let mut headers: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "h"))
        .collect();
    headers.sort();
    headers
}

/// Writes `text` to `path` unless it already holds exactly that, through a temporary file and a
/// rename, so that a compiler reading the file (another build, a test) never sees half of it.
fn write_if_changed(path: &Path, text: &str) {
    if std::fs::read_to_string(path).is_ok_and(|old| old == text) {
        return;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, text).unwrap_or_else(|e| panic!("write {}: {e}", tmp.display()));
    std::fs::rename(&tmp, path).unwrap_or_else(|e| panic!("rename to {}: {e}", path.display()));
}
