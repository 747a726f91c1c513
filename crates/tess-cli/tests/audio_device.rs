//! `tess bench audio-device` end to end (issue 15, seed 001 Table 2): the device emulator, the
//! engine in a dedicated cell (`tess-pd device`) and the synthetic application's cell, against a
//! private tessd. Checks what the run did, never how fast: every packet of both tess scenarios
//! is answered with its own header, and the report carries the figures the record reads.
//! Run as root.

mod common;

use common::{outcome, Daemon};

#[test]
#[ignore = "needs root: a private tessd on the real kernel"]
fn the_engine_answers_every_packet_of_the_device_in_its_cell() {
    let d = Daemon::start();
    let o = d.tess(&[
        "bench",
        "audio-device",
        "--quick",
        "--seconds",
        "2",
        "--scenarios",
        "alone,synthetic",
        "--json",
    ]);
    let (code, text) = outcome(&o);
    assert_eq!(code, 0, "{text}");
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    let f = &report["figures"];
    for s in ["alone", "synthetic"] {
        let packets = f[format!("{s}_packets")].as_f64().unwrap();
        // 2 s of 725.6 us packets
        assert_eq!(packets, 2757.0, "{s}: {f}");
        assert_eq!(f[format!("{s}_lost")].as_f64(), Some(0.0), "{s}: {f}");
        assert_eq!(
            f[format!("{s}_bad_answers")].as_f64(),
            Some(0.0),
            "{s}: {f}"
        );
        let (min, max) = (
            f[format!("{s}_min_us")].as_f64().unwrap(),
            f[format!("{s}_max_us")].as_f64().unwrap(),
        );
        assert!(min > 0.0 && max >= min, "{s}: {f}");
        assert!(
            f[format!("{s}_engine_turnaround_p99_us")].is_number(),
            "{s}: {f}"
        );
    }
    // the cells are gone afterwards
    let st = d.tess(&["status", "--json"]);
    let st = String::from_utf8_lossy(&st.stdout);
    assert!(!st.contains("pd-device-"), "{st}");
}
