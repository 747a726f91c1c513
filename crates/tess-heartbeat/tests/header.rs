//! The committed C header must be exactly what cbindgen generates from `src/ffi.rs`.
//!
//! `TESS_HEARTBEAT_BLESS=1 cargo test -p tess-heartbeat --test header` rewrites the committed copy.
#![cfg(not(loom))]

const GENERATED: &str = include_str!(concat!(env!("OUT_DIR"), "/tess_heartbeat.h"));

#[test]
fn committed_header_matches_generated() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/include/tess_heartbeat.h");
    if std::env::var_os("TESS_HEARTBEAT_BLESS").is_some() {
        std::fs::write(path, GENERATED).expect("write the committed header");
        return;
    }
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    if committed != GENERATED {
        let first = committed
            .lines()
            .zip(GENERATED.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(committed.lines().count().min(GENERATED.lines().count()));
        panic!(
            "{path} is stale (first difference at line {}); regenerate it with \
             TESS_HEARTBEAT_BLESS=1 cargo test -p tess-heartbeat --test header",
            first + 1
        );
    }
}
