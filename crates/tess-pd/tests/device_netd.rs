//! The engine serves the audio device through the tess network service (`tess-netd`), the
//! paper's path (seed 001 section 5: "Tessellation's Network Service provides the application a
//! guaranteed communication path to the Ethernet audio device"): a private tessd on the real
//! kernel (root), the service registered with its nameserver, the engine's socket bound in the
//! service by name, and a device answered packet for packet with its own header.
//!
//! Needs root and `tess-netd` built next to the tests (`cargo build --workspace`).

use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tess_pd::device::{self, Header, Link, PACKET_BYTES};
use tess_pd::engine::Engine;
use tess_pd::sched::Executor;
use tess_testkit::Tessd;

#[test]
#[ignore = "needs root: a private tessd on the real kernel"]
fn the_engine_answers_the_device_through_the_network_service() {
    let tessd = Tessd::start();
    // the nameserver clients of this process (the engine's socket) find the daemon here
    std::env::set_var(tess_proto::SOCKET_ENV, &tessd.socket);
    let _netd = tessd.start_netd("net-pd");

    let d = tempfile::tempdir().unwrap();
    let patch = d.path().join("gain.pd");
    std::fs::write(
        &patch,
        "#N canvas 0 0 400 300 12;\n#X obj 10 10 adc~ 1;\n#X obj 10 40 *~ -1;\n\
         #X obj 10 70 dac~ 1;\n#X connect 0 0 1 0;\n#X connect 1 0 2 0;\n",
    )
    .unwrap();
    let mut engine = Engine::open(&patch, device::config()).unwrap();
    let mut exec = Executor::serial();
    let mut link = Link::bind("127.0.0.1:0".parse().unwrap(), Some("net-pd")).unwrap();
    assert!(matches!(link, Link::Service(_)));
    let host = link.local_addr().unwrap();
    let dev = UdpSocket::bind("127.0.0.1:0").unwrap();
    dev.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let server = s.spawn(|| {
            device::serve(
                &mut engine,
                &mut exec,
                &mut link,
                &stop,
                None,
                &mut tess_pd::play::ControlIn::default(),
            )
        });
        let mut pkt = [0u8; PACKET_BYTES];
        let mut ans = [0u8; PACKET_BYTES + 1];
        for seq in 0..20u32 {
            let h = Header {
                seq,
                stamp_ns: 7 * seq as u64,
            };
            device::encode(h, &mut pkt, |ch, frame| {
                if ch == 0 {
                    (frame as f32 + 1.0) / 64.0
                } else {
                    0.0
                }
            });
            dev.send_to(&pkt, host).unwrap();
            let (n, from) = dev.recv_from(&mut ans).unwrap();
            assert_eq!(from, host, "the answer comes from the service's socket");
            assert_eq!(device::decode_header(&ans[..n]), Ok(h));
            let mut out = [0f32; device::FRAMES];
            device::channel(&ans[..n], 0, &mut out);
            for (f, x) in out.iter().enumerate() {
                assert_eq!(*x, -(f as f32 + 1.0) / 64.0, "packet {seq} frame {f}");
            }
        }
        stop.store(true, Ordering::Relaxed);
        let r = server.join().unwrap().unwrap();
        assert_eq!(r.answered, 20);
        assert_eq!(r.gaps, 0);
    });
}
