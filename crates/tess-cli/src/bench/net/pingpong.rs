//! The per-packet cost of the service path: UDP round trips between two sockets of one
//! busy-polling thread, one of them our own or in the service. Each round trip crosses the service twice (the ping's
//! send, the pong's receive), so half the difference of the medians is the added latency per
//! packet.

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};
use tess_bench::Summary;
use tess_net::client::Net;
use tess_sched::{affinity, attr, clock, HartSet, Policy};

/// Round-trip times, microseconds.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PingPong {
    /// From a socket of our own.
    pub direct_us: Summary,
    /// From a socket in the service.
    pub service_us: Summary,
}

impl PingPong {
    /// Half the difference of the median round trips: what the service adds per packet.
    pub fn added_median_us(&self) -> f64 {
        (self.service_us.median - self.direct_us.median) / 2.0
    }
}

fn place(hart: usize) {
    let _ = affinity::set_affinity(0, &HartSet::single(hart));
    let _ = attr::set_policy(0, Policy::OTHER, 0);
}

/// Measures `count` round trips each way on one thread busy-polling on `hart`: it sends a ping
/// from socket A to socket B, receives it on B, answers from B and receives the answer on A.
/// A is a socket of our own, then one in the service; B is always our own. One thread and no
/// sleeping means no wake-ups in the figure, only the paths.
pub fn measure(net: &Net, hart: usize, count: usize) -> anyhow::Result<PingPong> {
    let net = net.clone();
    let t = std::thread::spawn(move || -> anyhow::Result<PingPong> {
        place(hart);
        let b = UdpSocket::bind("127.0.0.1:0")?;
        b.set_nonblocking(true)?;
        let direct = {
            let a = UdpSocket::bind("127.0.0.1:0")?;
            a.set_nonblocking(true)?;
            let a_addr = a.local_addr()?;
            let b_addr = b.local_addr()?;
            round_trips(
                count,
                &b,
                a_addr,
                |p| a.send_to(p, b_addr).map(|_| ()),
                || {
                    let mut buf = [0u8; 128];
                    a.recv_from(&mut buf).map(|_| ())
                },
            )?
        };
        let service = {
            let mut a = net.udp_bind("127.0.0.1:0".parse()?)?;
            a.set_nonblocking(true)?;
            let a_addr = a.local_addr()?;
            let b_addr = b.local_addr()?;
            let a = std::cell::RefCell::new(a);
            round_trips(
                count,
                &b,
                a_addr,
                |p| a.borrow_mut().send_to(p, b_addr).map(|_| ()),
                || a.borrow_mut().recv_with(|_| ()),
            )?
        };
        Ok(PingPong {
            direct_us: Summary::of_ns_as_us(&direct),
            service_us: Summary::of_ns_as_us(&service),
        })
    });
    t.join().map_err(|_| anyhow::anyhow!("pinger panicked"))?
}

const PAYLOAD: [u8; 64] = [0x5A; 64];
const GIVE_UP: Duration = Duration::from_millis(200);

fn spin(mut f: impl FnMut() -> std::io::Result<()>) -> std::io::Result<bool> {
    let end = Instant::now() + GIVE_UP;
    loop {
        match f() {
            Ok(()) => return Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() > end {
                    return Ok(false);
                }
                std::hint::spin_loop();
            }
            Err(e) => return Err(e),
        }
    }
}

/// `count` round trips (after a tenth more to warm up): `send` a ping from A, receive it on
/// `b`, answer to `a_addr`, `recv` it on A.
fn round_trips(
    count: usize,
    b: &UdpSocket,
    a_addr: SocketAddr,
    send: impl Fn(&[u8]) -> std::io::Result<()>,
    mut recv: impl FnMut() -> std::io::Result<()>,
) -> anyhow::Result<Vec<u64>> {
    let mut out = Vec::with_capacity(count + count / 10);
    let mut buf = [0u8; 128];
    for _ in 0..count + count / 10 {
        let t0 = clock::now_ns();
        send(&PAYLOAD)?;
        if !spin(|| b.recv_from(&mut buf).map(|_| ()))? {
            continue;
        }
        b.send_to(&PAYLOAD, a_addr)?;
        if spin(&mut recv)? {
            out.push(clock::now_ns() - t0);
        }
    }
    Ok(out.split_off(out.len().saturating_sub(count)))
}
