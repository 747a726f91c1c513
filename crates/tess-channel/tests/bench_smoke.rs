//! The whole benchmark runs in quick mode and reports every figure issue 3 names. No timing is
//! asserted: benchmarks are commands, and this machine's numbers are noise.
#![cfg(not(loom))]

use std::time::Duration;
use tess_channel::bench::{run, BenchOptions};

#[test]
fn quick_bench_reports_every_figure() {
    let allowed = tess_sched::affinity::get_affinity(0).unwrap();
    let harts: Vec<usize> = allowed.iter().take(2).collect();
    if harts.len() < 2 {
        eprintln!("skipped: the bench needs two harts, this process may use {allowed}");
        return;
    }
    let opts = BenchOptions {
        parent_hart: harts[0],
        child_hart: harts[1],
        rtt_samples: 300,
        block_samples: 100,
        warmup: 50,
        tput_duration: Duration::from_millis(5),
        noise_samples: 0,
        ..BenchOptions::quick()
    };
    let report = run(opts).unwrap();
    let mut names = vec![
        "rtt_block_median_ns_512".to_string(),
        "flag_rtt_median_ns".into(),
        "flag_rtt_after_median_ns".into(),
        "futex_rtt_median_ns".into(),
        "futex_always_wake_rtt_median_ns".into(),
        "uds_rtt_median_ns_512".into(),
        "pipe_rtt_median_ns_512".into(),
        "tput_msgs_per_s_8".into(),
        "tput_bytes_per_s_4096".into(),
        "memcpy_bytes_per_s".into(),
    ];
    for size in tess_channel::bench::SIZES {
        names.push(format!("rtt_busy_median_ns_{size}"));
        names.push(format!("rtt_busy_p999_ns_{size}"));
        names.push(format!("rtt_block_median_ns_{size}"));
        names.push(format!("linux_block_rtt_median_ns_{size}"));
        names.push(format!("linux_poll_rtt_mean_ns_{size}"));
        names.push(format!("tput_mb_per_s_{size}"));
    }
    // Every side-by-side row names figures of this report.
    for c in &report.comparisons {
        names.push(c.ours.clone());
        names.extend(c.baseline.clone());
    }
    assert!(report.comparisons.len() >= 6 + 4 * 2);
    for n in &names {
        let v = report
            .figures
            .get(n)
            .unwrap_or_else(|| panic!("figure {n} missing"));
        assert!(v.is_finite() && *v > 0.0, "{n} = {v}");
    }
    // Two per size up to 512 bytes, 4480 bytes, blocking, and two throughput targets.
    let small = tess_channel::bench::SIZES
        .iter()
        .filter(|&&s| s <= 512)
        .count();
    assert_eq!(report.targets.len(), 2 * small + 4);
    let json: serde_json::Value = serde_json::from_str(&report.render_json()).unwrap();
    assert!(json["figures"]["flag_rtt_median_ns"].is_number());
    assert!(report.render_text().contains("round trip, busy-poll"));
}
