//! The service on a thread of this process, real channels and real sockets on loopback: UDP
//! and TCP through the service, non-blocking mode, transmit stamps, the QoS interface, a
//! hostile client, and an abusive client shaped beside a reserved one.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};
use tess_net::client::wire::{Header, Op};
use tess_net::client::{ControlError, QosSpec, Throughput};
use tess_net::service::{Config, LocalService, WaitMode};

const LOOPBACK: &str = "127.0.0.1:0";

fn any() -> SocketAddr {
    LOOPBACK.parse().unwrap()
}

fn service() -> LocalService {
    LocalService::start(Config {
        name: "net-test".into(),
        ..Config::default()
    })
    .unwrap()
}

fn timeout() -> Option<Duration> {
    Some(Duration::from_secs(10))
}

#[test]
fn udp_datagrams_cross_the_service_both_ways() {
    // The service publishes each flow's packets (crate tess-stats): into a private directory.
    let stats = tempfile::tempdir().unwrap();
    std::env::set_var("TESS_STATS_DIR", stats.path());
    let svc = service();
    let net = svc.net(Some("app"), 0);
    let mut s = net.udp_bind(any()).unwrap();
    s.set_read_timeout(timeout()).unwrap();
    let local = s.local_addr().unwrap();
    assert_eq!(local.ip().to_string(), "127.0.0.1");
    assert_ne!(local.port(), 0);

    let peer = UdpSocket::bind(LOOPBACK).unwrap();
    peer.set_read_timeout(timeout()).unwrap();
    s.send_to_stamped(b"ping", peer.local_addr().unwrap(), 7)
        .unwrap();
    let mut buf = [0u8; 64];
    let (n, from) = peer.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"ping");
    assert_eq!(from, local, "the service's socket is the sender");

    peer.send_to(b"pong", local).unwrap();
    let before = tess_net::service::sys::realtime_ns();
    let got = s
        .recv_with(|d| {
            assert!(d.kernel_stamp, "kernel receive timestamp");
            assert!(d.rx_ns <= before + 10_000_000_000);
            (d.payload.to_vec(), d.from)
        })
        .unwrap();
    assert_eq!(got, (b"pong".to_vec(), peer.local_addr().unwrap()));
    // The transmit report came in before the datagram.
    let sent = s.take_sent().expect("a SENT report");
    assert_eq!(sent.cookie, 7);
    assert!(sent.sent_ns > 0);

    // Connected: send/recv, and datagrams from others are filtered out.
    s.connect(peer.local_addr().unwrap()).unwrap();
    s.send(b"again").unwrap();
    let (n, _) = peer.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"again");
    let stranger = UdpSocket::bind(LOOPBACK).unwrap();
    stranger.send_to(b"noise", local).unwrap();
    peer.send_to(b"signal", local).unwrap();
    let n = s.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"signal");

    // In place: write the payload straight into the channel.
    s.send_to_with(3, peer.local_addr().unwrap(), |b| b.copy_from_slice(b"abc"))
        .unwrap();
    let (n, _) = peer.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"abc");
    // The app's flow: its packets, their bytes and their queueing, as tess top will show them.
    let me = std::process::id() as i32;
    let pages = tess_stats::for_processes(stats.path(), &[me]);
    let page = pages
        .iter()
        .find(|p| p.name == "net-app")
        .unwrap_or_else(|| panic!("no net-app page in {pages:?}"));
    // ping, again and abc out; pong and signal in (at least).
    assert!(page.events >= 5, "{page:?}");
    assert!(page.bytes >= 4 + 5 + 3 + 4 + 6, "{page:?}");
    assert_eq!(page.buckets.iter().sum::<u64>(), page.events);
    svc.stop().unwrap();
}

#[test]
fn non_blocking_receives_would_block() {
    let svc = service();
    let mut s = svc.net(None, 0).udp_bind(any()).unwrap();
    s.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 16];
    let e = s.recv_from(&mut buf).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
    let peer = UdpSocket::bind(LOOPBACK).unwrap();
    peer.send_to(b"x", s.local_addr().unwrap()).unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        match s.recv_from(&mut buf) {
            Ok((n, _)) => {
                assert_eq!(&buf[..n], b"x");
                break;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < end => {
                std::thread::yield_now()
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[test]
fn binding_twice_and_privileged_ports_are_refused() {
    let svc = service();
    let net = svc.net(Some("app"), 1000);
    let a = net.udp_bind(any()).unwrap();
    let taken = net.udp_bind(a.local_addr().unwrap()).unwrap_err();
    assert_eq!(taken.raw_os_error(), Some(libc::EADDRINUSE), "{taken}");
    let low = net.udp_bind("127.0.0.1:9".parse().unwrap()).unwrap_err();
    assert_eq!(low.raw_os_error(), Some(libc::EACCES), "{low}");
}

#[test]
fn tcp_streams_through_the_service() {
    let svc = service();
    let net = svc.net(Some("web"), 0);

    // Client side in the service, server outside.
    let server = TcpListener::bind(LOOPBACK).unwrap();
    let mut c = net.tcp_connect(server.local_addr().unwrap()).unwrap();
    c.set_read_timeout(timeout()).unwrap();
    let (mut other, _) = server.accept().unwrap();
    c.write_all(b"hello over tcp").unwrap();
    let mut buf = [0u8; 64];
    let n = other.read(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"hello over tcp");
    // Large writes are cut into records and reassembled in order.
    let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    other.write_all(&big).unwrap();
    drop(other);
    let mut got = Vec::new();
    c.read_to_end(&mut got).unwrap();
    assert_eq!(got, big);

    // Server side in the service, client outside.
    let mut l = net.tcp_listen(any()).unwrap();
    let addr = l.local_addr().unwrap();
    let outside = std::thread::spawn(move || {
        let mut t = TcpStream::connect(addr).unwrap();
        t.write_all(b"request").unwrap();
        t.shutdown(std::net::Shutdown::Write).unwrap();
        let mut r = Vec::new();
        t.read_to_end(&mut r).unwrap();
        r
    });
    let (mut s, peer) = l.accept().unwrap();
    assert_eq!(peer.ip().to_string(), "127.0.0.1");
    s.set_read_timeout(timeout()).unwrap();
    let mut req = Vec::new();
    s.read_to_end(&mut req).unwrap();
    assert_eq!(req, b"request");
    s.write_all(b"response").unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(outside.join().unwrap(), b"response");
}

#[test]
fn connecting_to_a_closed_port_fails() {
    let svc = service();
    let port = TcpListener::bind(LOOPBACK).unwrap().local_addr().unwrap();
    // The listener is gone: nobody listens there any more.
    let e = svc.net(None, 0).tcp_connect(port).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ECONNREFUSED), "{e}");
}

#[test]
fn the_qos_interface_sets_specs_and_refuses_what_does_not_fit() {
    let svc = service();
    let mut admin = svc.net(None, 0).control().unwrap();
    let spec = |bps| QosSpec {
        reservation: Throughput::bits(bps),
        latency_ns: Some(500_000),
        ..QosSpec::default()
    };
    admin.set("cell:synth", spec(240_000_000)).unwrap();
    let e = admin.set("cell:other", spec(800_000_000)).unwrap_err();
    let ControlError::Refused(msg) = e else {
        panic!("{e}")
    };
    assert!(msg.contains("over by"), "{msg}");
    let t = admin.flows().unwrap();
    assert_eq!(t.reserved.bps, 240_000_000);
    assert!(t.flow("cell:synth").unwrap().spec.is_some());
    assert!(t.flow("cell:other").is_none_or(|f| f.spec.is_none()));

    // Someone else may read the table but not change it.
    let mut user = svc.net(Some("x"), 4242).control().unwrap();
    assert!(user.flows().is_ok());
    assert!(matches!(
        user.clear("cell:synth"),
        Err(ControlError::Refused(_))
    ));
    admin.clear_all().unwrap();
    assert_eq!(admin.flows().unwrap().reserved, Throughput::ZERO);
}

#[test]
fn a_hostile_client_cannot_break_the_service() {
    let svc = service();
    let net = svc.net(Some("evil"), 1000);
    let mut raw = svc.connect_raw(Some("evil"), 1000).unwrap();
    // Garbage, a header with a bad family, a send before any bind, a short record.
    raw.send(&[0xFF; 100]).unwrap();
    let mut h = [0u8; 40];
    Header::new(Op::UdpBind).encode(&mut h);
    h[6] = 9;
    raw.send(&h).unwrap();
    Header::new(Op::Send).with_addr(any()).encode(&mut h);
    raw.send(&h).unwrap();
    raw.send(&[1, 2, 3]).unwrap();
    // The service answers the send-before-bind with an error, and still serves others.
    let mut buf = [0u8; 128];
    let n = raw.recv_timeout(&mut buf, Duration::from_secs(10)).unwrap();
    let reply = Header::decode(&buf[..n]).unwrap();
    assert_eq!(reply.op, Op::Error);
    assert_eq!(i32::from(reply.status), libc::ENOTCONN);
    let mut ok = net.udp_bind(any()).unwrap();
    let peer = UdpSocket::bind(LOOPBACK).unwrap();
    ok.send_to(b"still here", peer.local_addr().unwrap())
        .unwrap();
    peer.set_read_timeout(timeout()).unwrap();
    let (n, _) = peer.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"still here");
}

#[test]
fn an_abusive_sender_gets_only_what_the_reservation_leaves() {
    // A small link (20 Mbit/s) so that the abuser saturates it at once.
    let svc = LocalService::start(Config {
        name: "net-test".into(),
        capacity: Throughput {
            pps: 20_000,
            bps: 20_000_000,
        },
        wait: WaitMode::BusyPoll,
        max_datagram: 1500,
        ..Config::default()
    })
    .unwrap();
    // Never read: the kernel drops what does not fit.
    let sink = UdpSocket::bind(LOOPBACK).unwrap();
    let to = sink.local_addr().unwrap();
    let mut admin = svc.net(None, 0).control().unwrap();
    admin
        .set(
            "cell:music",
            QosSpec {
                reservation: Throughput::bits(5_000_000),
                latency_ns: Some(2_000_000),
                ..QosSpec::default()
            },
        )
        .unwrap();
    let abuse_net = svc.net(Some("abuse"), 0);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s2 = stop.clone();
    let abuser = std::thread::spawn(move || {
        let mut a = abuse_net.udp_bind(any()).unwrap();
        a.set_write_timeout(Some(Duration::from_millis(20)))
            .unwrap();
        let payload = [0xAB; 1400];
        let mut sent = 0u64;
        while !s2.load(std::sync::atomic::Ordering::Relaxed) {
            if a.send_to(&payload, to).is_ok() {
                sent += 1;
            }
        }
        sent
    });
    let mut music = svc.net(Some("music"), 0).udp_bind(any()).unwrap();
    // 200 packets of 500 bytes, at most 2 Mbit/s: well within the 5 Mbit/s reservation.
    for _ in 0..200 {
        music.send_to(&[0x11; 500], to).unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
    std::thread::sleep(Duration::from_millis(50));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let offered = abuser.join().unwrap();
    let t = admin.flows().unwrap();
    let m = t.flow("cell:music").unwrap().totals;
    let a = t.flow("cell:abuse").unwrap().totals;
    assert_eq!(m.tx_packets, 200, "every reserved packet was sent");
    assert_eq!(m.drops, 0);
    assert_eq!(
        m.reserved_served, 200,
        "all of them under the reservation, ahead of the abuser"
    );
    assert!(a.tx_packets > 0 && a.tx_packets <= offered);
    assert_eq!(a.reserved_served, 0, "the abuser has no reservation");
}

#[test]
fn labelled_sockets_are_flows_of_their_own() {
    let svc = service();
    let peer = UdpSocket::bind(LOOPBACK).unwrap();
    let to = peer.local_addr().unwrap();
    let cell = svc.net(Some("video"), 0);
    let mut plain = cell.udp_bind(any()).unwrap();
    let mut s1 = cell.clone().flow("s1").udp_bind(any()).unwrap();
    plain.send_to(b"cell", to).unwrap();
    for _ in 0..3 {
        s1.send_to(b"stream 1", to).unwrap();
    }
    let mut admin = svc.net(None, 0).control().unwrap();
    let spec = QosSpec {
        reservation: Throughput::bits(1_000_000),
        ..QosSpec::default()
    };
    admin.set("cell:video/s1", spec).unwrap();
    let e = admin.set("cell:video/a b", spec).unwrap_err();
    assert!(
        matches!(e, ControlError::Refused(ref m) if m.contains("/LABEL")),
        "{e}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let t = loop {
        let t = admin.flows().unwrap();
        let sent = |k: &str| t.flow(k).map_or(0, |f| f.totals.tx_packets);
        if (sent("cell:video"), sent("cell:video/s1")) == (1, 3) || Instant::now() > deadline {
            break t;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(t.flow("cell:video").unwrap().totals.tx_packets, 1);
    let f = t.flow("cell:video/s1").unwrap();
    assert_eq!(
        f.totals.tx_packets, 3,
        "the labelled socket's packets are its flow's"
    );
    assert_eq!(f.spec, Some(spec));
    assert_eq!(f.sockets, 1, "the labelled socket is counted on its flow");
    assert!(t.flow("cell:video").unwrap().spec.is_none());
    assert_eq!(t.flow("cell:video").unwrap().sockets, 1);

    // A bad label fails the open; the service refuses a label after the socket opened, or one
    // that is not a label, and goes on.
    let e = cell.clone().flow("no/slash").udp_bind(any()).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    let mut raw = svc.connect_raw(Some("video"), 0).unwrap();
    let mut buf = [0u8; 128];
    let mut ask = |raw: &mut tess_channel::Endpoint, h: Header, payload: &[u8]| {
        let mut rec = vec![0u8; 40];
        h.encode(&mut rec);
        rec.extend_from_slice(payload);
        raw.send(&rec).unwrap();
        let n = raw.recv_timeout(&mut buf, Duration::from_secs(10)).unwrap();
        Header::decode(&buf[..n]).unwrap()
    };
    let r = ask(&mut raw, Header::new(Op::Label), b"\xff\xfe");
    assert_eq!((r.op, i32::from(r.status)), (Op::Reply, libc::EINVAL));
    let r = ask(&mut raw, Header::new(Op::Label), b"s2");
    assert_eq!((r.op, r.status), (Op::Reply, 0));
    let r = ask(&mut raw, Header::new(Op::Label), b"s3");
    assert_eq!(
        (r.op, i32::from(r.status)),
        (Op::Reply, libc::EALREADY),
        "once per channel"
    );
    let r = ask(&mut raw, Header::new(Op::UdpBind).with_addr(any()), b"");
    assert_eq!((r.op, r.status), (Op::Reply, 0));
    let r = ask(&mut raw, Header::new(Op::Label), b"late");
    assert_eq!((r.op, i32::from(r.status)), (Op::Reply, libc::EISCONN));
    // The raw channel's socket is on flow s2; closing the channel takes it off again.
    let mut sockets = |k: &str| {
        let t = admin.flows().unwrap();
        t.flow(k).map_or(0, |f| f.sockets)
    };
    assert_eq!(sockets("cell:video/s2"), 1);
    drop(raw);
    let deadline = Instant::now() + Duration::from_secs(10);
    while sockets("cell:video/s2") != 0 {
        assert!(
            Instant::now() < deadline,
            "the closed channel's socket stayed on its flow"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(sockets("cell:video/s1"), 1);
    s1.send_to(b"still served", to).unwrap();
    peer.set_read_timeout(timeout()).unwrap();
    loop {
        let (n, _) = peer.recv_from(&mut buf).expect("the service still sends");
        if &buf[..n] == b"still served" {
            break;
        }
    }
}
