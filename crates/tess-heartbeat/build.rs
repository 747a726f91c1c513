//! Generates the C header from `src/ffi.rs` with cbindgen into `OUT_DIR/tess_heartbeat.h`.
//!
//! The committed copy is `include/tess_heartbeat.h`; `tests/header.rs` fails when the two differ
//! (run it with `TESS_HEARTBEAT_BLESS=1` to update the committed copy). The build script never
//! writes into the source tree.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=src/ffi.rs");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    let crate_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let out =
        PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it")).join("tess_heartbeat.h");
    let config =
        cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml parses");
    // Parse only the C ABI module, not the whole crate: the header is exactly that module.
    cbindgen::Builder::new()
        .with_config(config)
        .with_src(crate_dir.join("src/ffi.rs"))
        .generate()
        .expect("cbindgen generates the C header")
        .write_to_file(out);
}
