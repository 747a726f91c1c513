//! The committed C header must be exactly what cbindgen generates from the Rust source.
//!
//! `TESS_FFI_BLESS=1 cargo test -p tess-ffi --test header` rewrites the committed copy.

#[test]
fn committed_header_matches_generated() {
    tess_testkit::check_generated_header(
        concat!(env!("CARGO_MANIFEST_DIR"), "/include/tess_ns.h"),
        include_str!(concat!(env!("OUT_DIR"), "/tess_ns.h")),
        "TESS_FFI_BLESS",
        "TESS_FFI_BLESS=1 cargo test -p tess-ffi --test header",
    );
}
