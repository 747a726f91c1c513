//! The committed C header must be exactly what cbindgen generates from the Rust source.
//!
//! `TESS_HEARTBEAT_BLESS=1 cargo test -p tess-heartbeat --test header` rewrites the committed copy.
#![cfg(not(loom))]

#[test]
fn committed_header_matches_generated() {
    tess_testkit::check_generated_header(
        concat!(env!("CARGO_MANIFEST_DIR"), "/include/tess_heartbeat.h"),
        include_str!(concat!(env!("OUT_DIR"), "/tess_heartbeat.h")),
        "TESS_HEARTBEAT_BLESS",
        "TESS_HEARTBEAT_BLESS=1 cargo test -p tess-heartbeat --test header",
    );
}
