//! The committed header matches what cbindgen generates from the Rust source.

#[test]
fn committed_header_is_current() {
    let generated = std::fs::read_to_string(concat!(env!("OUT_DIR"), "/tess_pulse.h"))
        .expect("build.rs wrote it");
    let committed_path = concat!(env!("CARGO_MANIFEST_DIR"), "/include/tess_pulse.h");
    if std::env::var_os("TESS_PULSE_BLESS").is_some() {
        std::fs::write(committed_path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(committed_path).unwrap_or_default();
    assert!(
        committed == generated,
        "include/tess_pulse.h is stale: run TESS_PULSE_BLESS=1 cargo test -p tess-pulse --test header"
    );
}
