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

/// `tess-pd play --harts cell` in a best-effort cell on two harts of a private tessd: `tess
/// cell resize` to one hart and back, and the engine splits its graph for each (its report's
/// `splits`); the shrink, which only the engine's audio thread can complete, is acknowledged
/// (tessd logs no "shrinking anyway"); the play ends on time.
#[test]
#[ignore = "needs root: a private tessd on the real kernel"]
fn the_engine_follows_its_cell_through_resizes() {
    if common::harts() < 2 {
        eprintln!("skipped: needs two harts");
        return;
    }
    let d = Daemon::start();
    let o = d.tess(&[
        "cell",
        "create",
        "pd-harts",
        "--policy",
        "best-effort",
        "--hart-ids",
        "0,1",
    ]);
    assert_eq!(outcome(&o).0, 0, "{}", outcome(&o).1);
    let dir = tempfile::tempdir().unwrap();
    let patch = dir.path().join("v.pd");
    // 16 voices (the graph bench's osc~ -> vcf~ -> env~ chains) into one dac~: tasks for
    // both harts.
    std::fs::write(&patch, tess_pd::bench::voices_patch(16)).unwrap();
    let play = std::process::Command::new(common::tess_bin())
        .args(["run", "--cell", "pd-harts", "--"])
        .arg(tess_testkit::built("tess-pd"))
        .arg("play")
        .arg(&patch)
        .args(["--seconds", "5", "--strategy", "work-stealing"])
        .args(["--harts", "cell", "--json"])
        .env("TESS_SOCKET", &d.socket)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    for harts in ["1", "0,1"] {
        let o = d.tess(&["cell", "resize", "pd-harts", "--hart-ids", harts]);
        assert_eq!(outcome(&o).0, 0, "{}", outcome(&o).1);
        std::thread::sleep(std::time::Duration::from_millis(1000));
    }
    let out = play.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("the play report");
    let splits: Vec<u64> = r["splits"]
        .as_array()
        .expect("splits")
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(splits, [2, 1, 2], "{r}");
    let log = d.log();
    assert!(!log.contains("shrinking anyway"), "{log}");
}
