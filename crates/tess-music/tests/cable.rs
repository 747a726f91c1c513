//! The paced cable end to end (root: network namespaces, `tc`, a packet socket): the emulator
//! in its namespace keeps the cable's queue filled, the wire's token bucket releases the
//! packets, the tap on the wire reports when each package's first and last packet left, and
//! the synthesizer answers through the wire. No timing is asserted; only that every measured
//! package's departures were seen on the cable and that answers came back through it.

use std::time::Duration;
use tess_music::emulator::{Pace, DEFAULT_LINK_LEAD};
use tess_music::net::Wait;
use tess_music::netns::{NetnsError, NetnsPair};
use tess_music::scenario::{
    self, EmulatorPlacement, Interference, PlainLauncher, RunEnv, ScenarioSpec, SynthPlacement,
};

fn env(work: &std::path::Path) -> RunEnv {
    let bin_dir = std::path::Path::new(env!("CARGO_BIN_EXE_tess-migrator"))
        .parent()
        .unwrap()
        .to_path_buf();
    RunEnv {
        bin_dir,
        cache_dir: work.join("cache"),
        work_dir: work.to_path_buf(),
    }
}

#[test]
#[ignore = "needs root: network namespaces, a tc queue and a packet socket"]
fn the_cable_paces_taps_and_carries_answers_back() {
    let work = tempfile::tempdir().unwrap();
    let hart = tess_sched::current_hart();
    let spec = ScenarioSpec {
        name: "W".into(),
        title: "test: link-paced emulator across the wire".into(),
        synth: SynthPlacement {
            harts: None,
            fifo: None,
            wait: Wait::Block,
            oscillators: 16,
            idle_spinner: false,
        },
        emulator: EmulatorPlacement {
            hart: None,
            fifo: None,
            pace: Pace::Link {
                lead: DEFAULT_LINK_LEAD,
            },
            response: tess_music::emulator::Response::Actual,
        },
        interference: Interference::NONE,
        duration: Duration::from_millis(1500),
        warmup: Duration::from_millis(300),
        gesture: None,
        netns: Some("tmcable".into()),
        record: None,
        steer_receive: Some(tess_sched::HartSet::single(hart)),
        cell_spinner: None,
    };
    let r = scenario::run_scenario(&spec, &env(work.path()), &PlainLauncher).unwrap();
    assert!(
        !r.notes
            .iter()
            .any(|n| n.contains("cannot") || n.contains("loopback")),
        "the cable was not set up as asked: {:?}",
        r.notes
    );
    assert_eq!(r.device.pace, format!("link:{DEFAULT_LINK_LEAD}"));
    assert!(
        r.device.packages > 0 && r.device.answered > 0,
        "{:?}",
        r.device
    );
    assert_eq!(
        r.device.tx_kernel_stamps, r.device.packages,
        "the tap saw every measured package leave: {:?}",
        r.device
    );
    assert_eq!(r.device_us.len() as u64, r.device.answered);
    // The namespaces go with the pair: a new pair of the same name can be made at once.
    let again = NetnsPair::create_on_free_prefix("tmcable").unwrap();
    assert!(std::path::Path::new("/var/run/netns/tmcable-w").exists());
    drop(again);
    assert!(!std::path::Path::new("/var/run/netns/tmcable-w").exists());
}

#[test]
#[ignore = "needs root: network namespaces and a packet socket"]
fn a_tap_sees_only_stamped_input_packets_leaving() {
    use tess_music::net::{Endpoint, Peer, WireTap};
    use tess_music::slabs::{self, PadSample, FRAMES_PER_PACKET, INPUT_PACKET_BYTES, PADS};
    let pair = NetnsPair::create_on_free_prefix("tmtap").unwrap();
    let host = Endpoint::bind((pair.host_addr, 0).into()).unwrap();
    let to_host = Peer::from_socket_addr(host.local_addr());
    let (wire, wire_if, device) = (
        pair.wire.clone(),
        pair.wire_host_if.clone(),
        pair.name.clone(),
    );
    // The tap opens in the wire's namespace, the sender in the device's: a fresh thread, so the
    // test thread stays in the root namespace.
    let seen = std::thread::spawn(move || {
        tess_music::netns::enter(&wire).unwrap();
        let tap = WireTap::open(&wire_if).unwrap();
        tess_music::netns::enter(&device).unwrap();
        let dev = Endpoint::bind("0.0.0.0:0".parse().unwrap()).unwrap();
        let frames = [[PadSample::default(); PADS]; FRAMES_PER_PACKET];
        let mut pkt = [0u8; INPUT_PACKET_BYTES];
        for index in 0..16u16 {
            slabs::encode_input(&mut pkt, 7, index, 0, &frames);
            dev.send_to(&pkt, &to_host).unwrap();
        }
        dev.send_to(b"not a SLABS packet at all", &to_host).unwrap();
        let mut seen = Vec::new();
        let until = std::time::Instant::now() + Duration::from_secs(2);
        while seen.len() < 2 && std::time::Instant::now() < until {
            match tap.next().unwrap() {
                Some(d) => seen.push((d.seq, d.index, d.ns > 0)),
                None => std::thread::sleep(Duration::from_millis(5)),
            }
        }
        std::thread::sleep(Duration::from_millis(50));
        assert!(tap.next().unwrap().is_none(), "only packets 0 and 15 pass");
        seen
    })
    .join()
    .unwrap();
    assert_eq!(seen, vec![(7, 0, true), (7, 15, true)]);
    // And the packets crossed the wire to the host.
    let mut buf = [0u8; 2048];
    let got = host.recv(&mut buf, Wait::Block).unwrap().expect("a packet");
    assert_eq!(got.len, INPUT_PACKET_BYTES);
}

#[test]
#[ignore = "needs root: network namespaces"]
fn cables_of_different_names_take_different_prefixes() {
    // Whatever else holds 10.213.77 (a leftover of a killed run, another test's cable), the
    // first cable takes a free prefix, and a second cable the next one.
    let first = NetnsPair::create_on_free_prefix("tmpfx1").unwrap();
    let second = NetnsPair::create_on_free_prefix("tmpfx2").unwrap();
    assert_ne!(first.host_addr, second.host_addr);
    assert_ne!(first.device_addr, second.device_addr);
    // Asking for the first cable's prefix by name is refused with the interface that holds it.
    let [a, b, c, _] = first.host_addr.octets();
    match NetnsPair::create("tmpfx3", [a, b, c]) {
        Err(e @ NetnsError::PrefixInUse { .. }) => {
            assert!(e.to_string().contains(&first.host_if), "{e}")
        }
        other => panic!("expected PrefixInUse, got {other:?}"),
    }
    assert!(!std::path::Path::new("/var/run/netns/tmpfx3").exists());
}
