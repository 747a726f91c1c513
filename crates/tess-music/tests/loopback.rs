//! End-to-end runs on loopback: emulator and synthesizer exchange packages and both ends measure
//! response times. No timing is asserted (the machine may be busy); only that measurements exist.

use std::process::{Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::time::Duration;
use tess_music::emulator::{self, EmulatorConfig, EmulatorReport, Pace};
use tess_music::gesture::Gesture;
use tess_music::host::{Host, HostConfig, HostReport};

fn default_gesture() -> Gesture {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("gestures");
    Gesture::load(&dir.join("default.toml")).unwrap()
}

#[test]
fn library_host_and_emulator_exchange_packages() {
    // Where the host publishes its answers for observers (crate tess-stats): a private
    // directory, so that the test needs no /run/tess.
    let stats = tempfile::tempdir().unwrap();
    std::env::set_var("TESS_STATS_DIR", stats.path());
    for workers in [0, 1] {
        let cfg = HostConfig {
            bind: "127.0.0.1:0".parse().unwrap(),
            workers,
            duration: Some(Duration::from_millis(2_500)),
            warmup: Duration::from_millis(200),
            ..HostConfig::default()
        };
        let mut host = Host::new(cfg).unwrap();
        let mut ecfg = EmulatorConfig::new(host.local_addr(), default_gesture());
        ecfg.duration = Duration::from_millis(1_800);
        ecfg.warmup = Duration::from_millis(200);
        ecfg.pace = Pace::Spin;
        let device = std::thread::spawn(move || emulator::run(&ecfg, &AtomicBool::new(false)));
        host.run(&AtomicBool::new(false)).unwrap();
        let run = device.join().unwrap().unwrap();
        let h = host.report();
        let e = run.report;
        assert!(e.packages > 0 && e.answered > 0, "{e:?}");
        assert_eq!(e.answered, run.response_ns.len() as u64);
        assert!(e.response_us.count > 0 && e.response_us.mean > 0.0);
        assert!(h.packages > 0 && h.response_us.mean > 0.0, "{h:?}");
        assert_eq!(h.workers, workers);
        assert_eq!(e.misses, e.late + e.lost);
        assert_eq!(h.counters.malformed, 0);
        // Loopback gives kernel transmit stamps: every measured package's last packet has one.
        assert_eq!(e.tx_kernel_stamps, e.packages, "{e:?}");
        assert_eq!(e.send_delay_us.count as u64, e.packages);
        // Every measured answer was published, and the misses agree with the host's count.
        let p = host
            .published()
            .expect("publishing into a private directory");
        assert_eq!(p.name, "synth");
        assert_eq!(p.events, h.response_us.count as u64, "{p:?}\n{h:?}");
        assert_eq!(p.misses, h.misses);
        assert_eq!(p.buckets.iter().sum::<u64>(), p.events);
        assert_eq!(p.deadline_ns, tess_music::slabs::DEADLINE_NS);
    }
}

#[test]
fn binaries_run_record_and_report_json() {
    let dir = tempfile::tempdir().unwrap();
    let wav = dir.path().join("out.wav");
    let ready = dir.path().join("ready");
    let stats = dir.path().join("stats.txt");
    let samples = dir.path().join("samples.txt");
    let port = {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        s.local_addr().unwrap().port()
    };
    let addr = format!("127.0.0.1:{port}");
    let synth = Command::new(env!("CARGO_BIN_EXE_tess-migrator"))
        .args([
            "--bind",
            &addr,
            "--duration",
            "3.5",
            "--warmup",
            "0.3",
            "--json",
        ])
        .arg("--record")
        .arg(&wav)
        .arg("--stats-file")
        .arg(&stats)
        .arg("--ready-file")
        .arg(&ready)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while !ready.exists() && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let dev = Command::new(env!("CARGO_BIN_EXE_tess-slabs"))
        .args([
            "--to",
            &addr,
            "--duration",
            "2",
            "--warmup",
            "0.3",
            "--json",
        ])
        .arg("--samples-file")
        .arg(&samples)
        .output()
        .unwrap();
    assert!(
        dev.status.success(),
        "{}",
        String::from_utf8_lossy(&dev.stderr)
    );
    let out = synth.wait_with_output().unwrap();
    assert!(out.status.success());
    let e: EmulatorReport = serde_json::from_slice(&dev.stdout).unwrap();
    let h: HostReport = serde_json::from_slice(&out.stdout).unwrap();
    assert!(e.answered > 0 && h.packages > 0);
    let lines = std::fs::read_to_string(&samples).unwrap().lines().count() as u64;
    assert_eq!(lines, e.answered);
    assert!(std::fs::read_to_string(&stats).unwrap().lines().count() > 0);
    let spec = hound::WavReader::open(&wav).unwrap().spec();
    assert_eq!((spec.channels, spec.sample_rate), (8, 44_100));
}
