//! The committed C header must be exactly what cbindgen generates from the Rust source.
//!
//! `TESS_RUNTIME_BLESS=1 cargo test -p tess-runtime --test header` rewrites the committed copy.
#![cfg(not(loom))]

#[test]
fn committed_header_matches_generated() {
    tess_testkit::check_generated_header(
        concat!(env!("CARGO_MANIFEST_DIR"), "/include/tess_runtime.h"),
        include_str!(concat!(env!("OUT_DIR"), "/tess_runtime.h")),
        "TESS_RUNTIME_BLESS",
        "TESS_RUNTIME_BLESS=1 cargo test -p tess-runtime --test header",
    );
}
