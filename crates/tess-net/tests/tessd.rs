//! End to end with a private tessd on the real kernel (root): `tess-netd` registers with the
//! nameserver, clients reach it by name, the QoS interface sets a spec, and the synthesizer's
//! host answers a SLABS emulator through the service with `t2` stamped by the service.
//!
//! Takes the machine-wide lock `/run/lock/tess-dev.lock` (only one tessd may shape the machine,
//! as `scripts/with-tessd` and the tess-cli root tests know). Skipped, with a message, when not
//! root or when `tessd` is not built next to `tess-netd`.

use std::net::UdpSocket;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};
use tess_music::emulator::{self, EmulatorConfig, Pace};
use tess_music::gesture::Gesture;
use tess_music::host::{Host, HostConfig};
use tess_music::net::Wait;
use tess_net::client::{Net, QosSpec, Throughput};

struct Daemon {
    dir: tempfile::TempDir,
    tessd: PathBuf,
    args: Vec<String>,
    children: Vec<Child>,
    _lock: std::fs::File,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        for c in self.children.iter_mut().rev() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = Command::new(&self.tessd)
            .args(&self.args)
            .arg("--reset")
            .output();
    }
}

fn netd() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tess-netd"))
}

fn start() -> Option<Daemon> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root");
        return None;
    }
    let tessd = netd().with_file_name("tessd");
    if !tessd.exists() {
        eprintln!(
            "skipped: {} is not built (cargo build --workspace --bins)",
            tessd.display()
        );
        return None;
    }
    let _ = std::fs::create_dir_all("/run/lock");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open("/run/lock/tess-dev.lock")
        .unwrap();
    // SAFETY: flock on a descriptor we own; blocks until the lock is free.
    unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) };
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("tessd.sock");
    let args = vec![
        "--socket".to_string(),
        socket.display().to_string(),
        "--state-dir".into(),
        dir.path().join("state").display().to_string(),
        "--group".into(),
        format!("tess-net-it-{}", std::process::id()),
    ];
    // The nameserver clients of this process (ns::connect) find the daemon here.
    std::env::set_var(tess_proto::SOCKET_ENV, &socket);
    let child = Command::new(&tessd)
        .args(&args)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("tessd.log")).unwrap())
        .spawn()
        .unwrap();
    let mut d = Daemon {
        dir,
        tessd,
        args,
        children: vec![child],
        _lock: lock,
    };
    let t0 = Instant::now();
    while tess_proto::Client::connect(&socket).is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "tessd did not come up"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let ready = d.dir.path().join("netd.ready");
    let netd = Command::new(netd())
        .args(["--name", "net-it", "--wait", "epoll", "--ready-file"])
        .arg(&ready)
        .env(tess_proto::SOCKET_ENV, &socket)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(d.dir.path().join("netd.log")).unwrap())
        .spawn()
        .unwrap();
    d.children.push(netd);
    wait_for(&ready, &d.dir.path().join("netd.log"));
    Some(d)
}

fn wait_for(p: &Path, log: &Path) {
    let t0 = Instant::now();
    while !p.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "tess-netd did not register: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn clients_reach_the_service_by_name_and_the_synthesizer_answers_through_it() {
    let Some(_d) = start() else { return };
    let net = Net::named("net-it");

    // A socket by name, and the QoS interface.
    let mut s = net.udp_bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
    peer.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    s.send_to(b"by name", peer.local_addr().unwrap()).unwrap();
    let mut buf = [0u8; 32];
    let (n, _) = peer.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"by name");
    let key = format!("pid:{}", std::process::id());
    let mut admin = net.control().unwrap();
    admin
        .set(
            &key,
            QosSpec {
                reservation: Throughput::bits(10_000_000),
                ..QosSpec::default()
            },
        )
        .unwrap();
    let table = admin.flows().unwrap();
    let row = table.flow(&key).expect("our flow");
    assert_eq!(row.spec.unwrap().reservation.bps, 10_000_000);
    assert!(row.sockets >= 1);
    drop(s);

    // The synthesizer through the service, against the emulator on loopback.
    let mut host = Host::new(HostConfig {
        bind: "127.0.0.1:0".parse().unwrap(),
        wait: Wait::Block,
        duration: Some(Duration::from_millis(2_500)),
        warmup: Duration::from_millis(200),
        net_service: Some("net-it".into()),
        // Few oscillators: this test may run unoptimized.
        synth: tess_music::synth::SynthParams {
            voice: tess_music::synth::VoiceParams {
                oscillators: 4,
                ..Default::default()
            },
            ..Default::default()
        },
        ..HostConfig::default()
    })
    .unwrap();
    let gesture = Gesture::load(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../tess-music/gestures/default.toml"),
    )
    .unwrap();
    let mut ecfg = EmulatorConfig::new(host.local_addr(), gesture);
    ecfg.duration = Duration::from_millis(1_500);
    ecfg.warmup = Duration::from_millis(200);
    ecfg.pace = Pace::Sleep;
    let device = std::thread::spawn(move || emulator::run(&ecfg, &AtomicBool::new(false)));
    host.run(&AtomicBool::new(false)).unwrap();
    let run = device.join().unwrap().unwrap();
    assert!(run.report.answered > 0, "{:?}", run.report);
    let h = host.report();
    assert!(h.counters.packets > 0);
    assert_eq!(h.counters.send_errors, 0);
    assert!(
        h.packages > 0,
        "t2 stamps from the service were logged: {h:?}"
    );
}
