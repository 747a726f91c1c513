//! The generator on small hand-written run sets: medians over repetitions, a figure missing in
//! one repetition, failed and missing runs, and the machine description's parsers.

use super::machine::{
    cgroup_version, count_cpu_list, cpuinfo_field, virtualised, Commit, Machine, Meta,
};
use super::render::{render, Narrative, Spread};
use super::runset::{ReportView, Run, RunSet};
use std::collections::BTreeMap;
use std::path::Path;

fn report(figures: &[(&str, f64)], met: bool, notes: &[&str]) -> String {
    let figs: serde_json::Map<String, serde_json::Value> = figures
        .iter()
        .map(|(k, v)| (k.to_string(), serde_json::json!(v)))
        .collect();
    serde_json::json!({
        "bench": "demo",
        "figures": figs,
        "targets": [{"target": "lat_us < 100", "met": met, "measured": "x"}],
        "tables": [{"title": "t", "headers": ["a", "b"], "rows": [["1", "2"]]}],
        "notes": notes,
        "comparisons": [{
            "quantity": "latency (us)",
            "paper": "seed 000: 997.5",
            "ours": "lat_us",
            "baseline": "fifo_us",
            "baseline_is": "SCHED_FIFO 99"
        }],
        "detail": {}
    })
    .to_string()
}

fn write_run(dir: &Path, bench: &str, rep: u32, json: &str, status: i32, log: &str) {
    let base = dir.join(format!("{bench}-{rep}"));
    std::fs::write(base.with_extension("json"), json).unwrap();
    std::fs::write(base.with_extension("status"), format!("{status}\n")).unwrap();
    std::fs::write(base.with_extension("log"), log).unwrap();
}

fn fixture() -> (tempfile::TempDir, RunSet) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let meta = Meta {
        command: "scripts/bench-all --reps 3".into(),
        commit: Commit {
            hash: "abc1234".into(),
            dirty: true,
        },
        date_utc: "2026-11-23 15:00 UTC".into(),
        machine: Machine {
            cpu: "Test CPU".into(),
            harts: 2,
            kernel: "6.18.0".into(),
            cgroup: "v1".into(),
            virtualised: "yes (kvm)".into(),
        },
        benches: vec!["demo".into(), "broken".into(), "cut".into(), "long".into()],
        reps: 3,
        once: vec!["long".into()],
        quick: false,
    };
    std::fs::write(d.join("meta.json"), serde_json::to_string(&meta).unwrap()).unwrap();
    // demo: three good runs; `extra` only in run 2; run 3 misses the target.
    write_run(
        d,
        "demo",
        1,
        &report(&[("lat_us", 30.0), ("fifo_us", 40.0)], true, &["first"]),
        0,
        "",
    );
    write_run(
        d,
        "demo",
        2,
        &report(
            &[("lat_us", 10.0), ("fifo_us", 50.0), ("extra", 7.0)],
            true,
            &["second", "second"],
        ),
        0,
        "",
    );
    write_run(
        d,
        "demo",
        3,
        &report(&[("lat_us", 20.0), ("fifo_us", 45.0)], false, &["third"]),
        0,
        "",
    );
    // broken: run 1 panicked (partial JSON), run 2 fine, run 3 exit 0 but no report.
    write_run(
        d,
        "broken",
        1,
        "{\"bench\":",
        101,
        "warming up\nthread 'main' panicked: boom\n",
    );
    write_run(
        d,
        "broken",
        2,
        &report(&[("lat_us", 5.0)], true, &[]),
        0,
        "",
    );
    write_run(d, "broken", 3, "", 0, "");
    // cut: only run 1 exists (the run set was interrupted).
    write_run(d, "cut", 1, &report(&[("lat_us", 1.0)], true, &[]), 0, "");
    // long: runs once by design (`scripts/bench-all --once long`).
    write_run(d, "long", 1, &report(&[("lat_us", 2.0)], true, &[]), 0, "");
    let set = RunSet::load(d).unwrap();
    (dir, set)
}

#[test]
fn spread_is_median_min_max() {
    let s = Spread::of(&[30.0, 10.0, 20.0]).unwrap();
    assert_eq!((s.median, s.min, s.max, s.n), (20.0, 10.0, 30.0, 3));
    assert_eq!(s.text(), "20 (10–30)");
    let even = Spread::of(&[1.0, 4.0, 2.0, 3.0]).unwrap();
    assert_eq!(even.median, 2.5);
    assert_eq!(Spread::of(&[7.0]).unwrap().text(), "7");
    assert!(Spread::of(&[]).is_none());
    assert!(Spread::of(&[1.0, f64::NAN]).is_none());
}

#[test]
fn loads_ok_failed_and_missing_runs() {
    let (_d, set) = fixture();
    let demo = &set.benches["demo"];
    assert_eq!(demo.len(), 3);
    assert!(demo.iter().all(|r| matches!(r, Run::Ok(_))));
    let broken = &set.benches["broken"];
    match &broken[0] {
        Run::Failed { why, log_tail } => {
            assert_eq!(why, "exit status 101");
            assert!(log_tail.contains("panicked: boom"), "{log_tail}");
        }
        r => panic!("run 1 should have failed: {r:?}"),
    }
    assert!(matches!(broken[1], Run::Ok(_)));
    assert!(matches!(&broken[2], Run::Failed { why, .. } if why.starts_with("no readable report")));
    let cut = &set.benches["cut"];
    assert_eq!(cut.len(), 3, "the stamp announced 3 repetitions");
    assert!(matches!(cut[1], Run::Missing) && matches!(cut[2], Run::Missing));
    let long = &set.benches["long"];
    assert_eq!(long.len(), 1, "a bench the stamp runs once expects one run");
    assert!(matches!(long[0], Run::Ok(_)));
}

#[test]
fn page_shows_spreads_targets_failures_and_provenance() {
    let (_d, set) = fixture();
    let mut texts = BTreeMap::new();
    texts.insert(
        "demo".to_string(),
        "# `tess bench demo`: a demo (seed 000)\n\nMeasured on hart 1.\n".to_string(),
    );
    let page = render(&set, &Narrative::Texts(texts));
    // Provenance at the top.
    for want in [
        "This page is generated",
        "`scripts/bench-all --reps 3`",
        "`abc1234` with uncommitted changes (dirty tree)",
        "2026-11-23 15:00 UTC",
        "| CPU | Test CPU |",
        "| harts | 2 |",
        "| kernel | 6.18.0 |",
        "| virtualised | yes (kvm) |",
        "| repetitions | 3 per bench; 1 of long (",
        "| [long](#tess-bench-long) | 1 of 1 succeeded |",
    ] {
        assert!(page.contains(want), "missing {want:?} in:\n{page}");
    }
    assert!(
        !page.contains("Smoke run"),
        "a full run is not called a smoke run"
    );
    // The narrative's own title and text.
    assert!(page.contains("## `tess bench demo`: a demo (seed 000)\n\nMeasured on hart 1."));
    // Side by side: median (min–max) for tess and for the baseline, paper text as given.
    assert!(
        page.contains(
            "| latency (us) | seed 000: 997.5 | 20 (10–30) | 45 (40–50) (SCHED_FIFO 99) |"
        ),
        "{page}"
    );
    // Every figure; one reported by only one run says so.
    assert!(
        page.contains("| `lat_us` | 20 | 10 | 30 | 3 of 3 |"),
        "{page}"
    );
    assert!(page.contains("| `extra` | 7 | 7 | 7 | 1 of 3 |"), "{page}");
    // Targets: met in k of n runs.
    assert!(page.contains("| lat_us < 100 | 2 of 3 runs |"), "{page}");
    // Notes of the median run (lat_us 20 is run 3), deduplicated.
    assert!(
        page.contains("### Notes of the median run (run 3)\n\n- third\n"),
        "{page}"
    );
    assert!(!page.contains("- first"));
    // Failures are shown, with the log's end; missing runs too; nothing silently dropped.
    assert!(
        page.contains("Runs: 1 of 3 succeeded. Failed or missing:"),
        "{page}"
    );
    assert!(
        page.contains(
            "- run 1: **FAILED** (exit status 101): `warming up / thread 'main' panicked: boom`"
        ),
        "{page}"
    );
    assert!(page.contains("- run 2: **missing** (never ran)"), "{page}");
    assert!(
        page.contains("| [broken](#tess-bench-broken) | 1 of 3 succeeded |"),
        "{page}"
    );
    // A bench without narrative says so.
    assert!(
        page.contains("(No narrative: broken.md is missing.)"),
        "{page}"
    );
}

#[test]
fn notes_of_the_median_run_are_deduplicated() {
    let a = report(&[("lat_us", 10.0)], true, &["same", "same", "other"]);
    let r: ReportView = serde_json::from_str(&a).unwrap();
    let set = RunSet {
        meta: Meta::default(),
        benches: [("demo".to_string(), vec![Run::Ok(Box::new(r))])].into(),
    };
    let page = render(&set, &Narrative::Texts(BTreeMap::new()));
    assert_eq!(page.matches("- same\n").count(), 1, "{page}");
    assert!(page.contains("- other\n"));
    // A single run prints its value alone, not a range.
    assert!(
        page.contains("| latency (us) | seed 000: 997.5 | 10 | - (SCHED_FIFO 99) |"),
        "{page}"
    );
}

#[test]
fn machine_description_parsers() {
    assert_eq!(count_cpu_list("0-1"), Some(2));
    assert_eq!(count_cpu_list("0-3,6,8-9"), Some(7));
    assert_eq!(count_cpu_list("x"), None);
    let cpuinfo = "processor\t: 0\nmodel name\t: Intel Xeon\nflags\t\t: fpu hypervisor sse\n";
    assert_eq!(
        cpuinfo_field(cpuinfo, "model name").as_deref(),
        Some("Intel Xeon")
    );
    assert_eq!(
        virtualised(Some("kvm"), Some("docker"), true),
        "yes: kvm virtual machine; in a docker container"
    );
    assert_eq!(
        virtualised(Some("none"), Some("none"), false),
        "no (no cpuid hypervisor flag)"
    );
    assert_eq!(
        virtualised(None, None, true),
        "yes: virtual machine (cpuid hypervisor flag; hypervisor unknown)"
    );
    assert_eq!(
        cgroup_version(true, false, true),
        "v1 (hybrid: cgroup2 also mounted at /sys/fs/cgroup/unified)"
    );
    assert_eq!(cgroup_version(false, true, false), "v2");
}
