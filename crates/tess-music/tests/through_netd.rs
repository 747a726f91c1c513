//! End to end with a private tessd on the real kernel (root): `tess-netd` registers with the
//! nameserver, clients reach it by name, the QoS interface sets a spec, and the synthesizer's
//! host answers a SLABS emulator through the service with `t2` stamped by the service.
//!
//! Needs root and `tessd` and `tess-netd` built next to the tests (`cargo build --workspace`), so it is
//! `#[ignore]`d for ordinary `cargo test`; `scripts/test` runs it as root. The daemon comes from
//! `tess-testkit` (machine-wide lock, private socket, state and cgroup subtree).

use std::net::UdpSocket;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::Duration;
use tess_music::emulator::{self, EmulatorConfig, Pace};
use tess_music::gesture::Gesture;
use tess_music::host::{Host, HostConfig};
use tess_music::net::Wait;
use tess_net_client::{Net, QosSpec, Throughput};
use tess_testkit::{Reaper, Tessd};

/// The private tessd (the workspace's harness) and the network service registered with it;
/// the service is killed by pid before the daemon is stopped and reset.
struct Daemon {
    _netd: Reaper,
    _tessd: Tessd,
}

fn start() -> Daemon {
    let tessd = Tessd::start();
    // The nameserver clients of this process (ns::connect) find the daemon here.
    std::env::set_var(tess_proto::SOCKET_ENV, &tessd.socket);
    Daemon {
        _netd: tessd.start_netd("net-it"),
        _tessd: tessd,
    }
}

#[test]
#[ignore = "needs root: a private tessd on the real kernel"]
fn clients_reach_the_service_by_name_and_the_synthesizer_answers_through_it() {
    let _d = start();
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
    let gesture =
        Gesture::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("gestures/default.toml"))
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
