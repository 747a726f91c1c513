//! `tess net fetch`: a workload whose every unit needs the network and then the CPU, to try
//! the broker's joint CPU + network model (`[cells.NAME] network = true`, docs/broker.md).
//!
//! Each unit is one request and one answer: the client asks the server for `--chunk` bytes
//! (a 4-byte little-endian length), reads them through the network service (in the flow of
//! its cell, which the broker's `[network]` pool shapes), then hashes them `--passes` times,
//! and beats its heartbeat. Fetch and compute do not overlap, as for a program that fetches an
//! object and then works on it, so the time per unit is the sum PACORA models: `w_n / a_n`
//! for the transfer at `a_n` Mbit/s plus `w_c / a_c` for the hashing at `a_c` harts.
//!
//! `tess net fetch --serve ADDR` is the matching server (kernel TCP, outside any cell): it
//! answers every request with that many zero bytes.

use crate::net_stream::NetStream;
use clap::Args;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};
use tess_heartbeat::Heartbeat;

/// Largest unit a request may ask for.
const MAX_CHUNK: u32 = 16 << 20;

#[derive(Args, Debug)]
#[command(after_help = "Examples:
  tess net fetch --serve 127.0.0.1:9300 &
  tess run --cell fetch -- tess net fetch 127.0.0.1:9300 --target 10/s
  tess net fetch 127.0.0.1:9300 --kernel --duration 5s --json   # no service: a baseline")]
pub struct FetchArgs {
    /// The server, HOST:PORT (with --serve: the address to listen on).
    pub addr: SocketAddr,
    /// Serve: answer each request (a 4-byte little-endian length) with that many bytes.
    #[arg(long)]
    pub serve: bool,
    /// Bytes per unit.
    #[arg(long, default_value_t = 65536, value_parser = clap::value_parser!(u32).range(1..=MAX_CHUNK as i64))]
    pub chunk: u32,
    /// CPU work per unit: passes of a hash over the unit's bytes.
    #[arg(long, default_value_t = 32)]
    pub passes: u32,
    /// The heartbeat's name (registered with the broker at $TESS_BROKER_SOCKET).
    #[arg(long, default_value = "fetch")]
    pub heartbeat: String,
    /// The heartbeat's target: a rate (`10/s`) or a time per unit (`100ms`).
    #[arg(long)]
    pub target: Option<String>,
    /// Stop after this long (default: until killed).
    #[arg(long)]
    pub duration: Option<String>,
    /// Fetch over a kernel socket of this process instead of the network service.
    #[arg(long)]
    pub kernel: bool,
    /// Network service name (default: $TESS_NET_SERVICE, else `net`).
    #[arg(long, value_name = "NAME")]
    pub service: Option<String>,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs `tess net fetch`.
pub fn run(a: FetchArgs) -> anyhow::Result<i32> {
    if a.serve {
        return serve(a.addr);
    }
    let target = a
        .target
        .as_deref()
        .map(crate::cmd::heartbeat_pipe::parse_target)
        .transpose()
        .map_err(|e| anyhow::anyhow!("--target: {e}"))?;
    let until = a
        .duration
        .as_deref()
        .map(tess_core::units::parse_duration)
        .transpose()
        .map_err(|e| anyhow::anyhow!("--duration: {e}"))?
        .map(|d| Instant::now() + d);
    let hb = Heartbeat::register(&a.heartbeat, target)
        .map_err(|e| anyhow::anyhow!("heartbeat '{}': {e}", a.heartbeat))?;
    let mut conn = connect(&a)?;
    let mut buf = vec![0u8; a.chunk as usize];
    let started = Instant::now();
    let mut units = 0u64;
    let mut digest = 0u64;
    while until.is_none_or(|t| Instant::now() < t) {
        conn.write_all(&a.chunk.to_le_bytes())?;
        conn.read_exact(&mut buf)
            .map_err(|e| anyhow::anyhow!("reading a unit from {}: {e}", a.addr))?;
        digest ^= hash_passes(&buf, a.passes);
        hb.beat();
        units += 1;
    }
    let secs = started.elapsed().as_secs_f64();
    let rate = units as f64 / secs;
    if a.json {
        let v = serde_json::json!({
            "units": units, "seconds": secs, "rate": rate, "chunk": a.chunk,
            "passes": a.passes, "digest": digest,
        });
        println!("{v}");
    } else {
        println!(
            "{units} units of {} bytes in {secs:.1} s: {rate:.2}/s",
            a.chunk
        );
    }
    Ok(0)
}

/// A byte stream to the server: through the network service, or a kernel socket.
fn connect(a: &FetchArgs) -> anyhow::Result<NetStream> {
    if a.kernel {
        return NetStream::kernel(a.addr)
            .map_err(|e| anyhow::anyhow!("connecting to {}: {e}", a.addr));
    }
    let net = a.service.as_deref().map_or_else(
        tess_net::client::Net::from_env,
        tess_net::client::Net::named,
    );
    NetStream::through(&net, a.addr).map_err(|e| {
        anyhow::anyhow!(
            "connecting to {} through the network service: {e} (is tess-netd running? --kernel fetches without it)",
            a.addr
        )
    })
}

/// FNV-1a over `bytes`, `passes` times (each pass seeded by the last): CPU work in proportion
/// to the bytes, which the compiler cannot skip.
fn hash_passes(bytes: &[u8], passes: u32) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for _ in 0..passes {
        for &b in bytes {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h = std::hint::black_box(h);
    }
    h
}

/// Answers each connection's requests until it closes, one thread per connection.
fn serve(addr: SocketAddr) -> anyhow::Result<i32> {
    let l = TcpListener::bind(addr).map_err(|e| anyhow::anyhow!("listening on {addr}: {e}"))?;
    eprintln!("tess net fetch: serving on {}", l.local_addr()?);
    for c in l.incoming() {
        let Ok(c) = c else { continue };
        std::thread::spawn(move || answer(c));
    }
    Ok(0)
}

fn answer(mut c: TcpStream) {
    let _ = c.set_nodelay(true);
    let _ = c.set_read_timeout(Some(Duration::from_secs(600)));
    let zeros = vec![0u8; 64 * 1024];
    let mut req = [0u8; 4];
    while c.read_exact(&mut req).is_ok() {
        let mut left = u32::from_le_bytes(req).min(MAX_CHUNK) as usize;
        while left > 0 {
            let n = left.min(zeros.len());
            if c.write_all(&zeros[..n]).is_err() {
                return;
            }
            left -= n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unit_is_fetched_and_hashed_over_a_kernel_socket() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for c in l.incoming().flatten() {
                std::thread::spawn(move || answer(c));
            }
        });
        let mut s = TcpStream::connect(addr).unwrap();
        for n in [1u32, 70_000, 3] {
            s.write_all(&n.to_le_bytes()).unwrap();
            let mut buf = vec![1u8; n as usize];
            s.read_exact(&mut buf).unwrap();
            assert!(buf.iter().all(|&b| b == 0));
        }
        // More passes, more work, a different digest; none, the seed.
        assert_ne!(hash_passes(&[0; 8], 1), hash_passes(&[0; 8], 2));
        assert_eq!(hash_passes(&[0; 8], 0), 0xcbf2_9ce4_8422_2325);
    }
}
