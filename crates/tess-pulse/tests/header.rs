//! The committed C header must be exactly what cbindgen generates from the Rust source.
//!
//! `TESS_PULSE_BLESS=1 cargo test -p tess-pulse --test header` rewrites the committed copy.
#![cfg(not(loom))]

#[test]
fn committed_header_is_current() {
    tess_testkit::check_generated_header(
        concat!(env!("CARGO_MANIFEST_DIR"), "/include/tess_pulse.h"),
        include_str!(concat!(env!("OUT_DIR"), "/tess_pulse.h")),
        "TESS_PULSE_BLESS",
        "TESS_PULSE_BLESS=1 cargo test -p tess-pulse --test header",
    );
}
