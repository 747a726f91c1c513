//! `tess bench daemon`: tessd under load (issue 12 part 1). Many clients ask for `status` in a
//! loop while one more applies transactions at a fixed rate; reads must not wait behind the
//! transactions (tessd answers them from a published snapshot, docs/tessd.md "Concurrency").
//!
//! Two baselines are measured in the same run: the same readers with no writer, and the same
//! readers against the floor, a bare epoll server answering every request with a `status`
//! reply tessd sent ([`floor`]): what any server on this machine costs these clients. A transaction
//! is counted lost when tessd acknowledged it but a read right after it (or at the end) does
//! not show it: each transaction sets a best-effort cell's weight to a new value, so the
//! value read back says which transaction it came from.

mod floor;

use super::support::{cell_on_hart, pick_hart, spawn_work, stop, Session};
use super::Common;
use clap::Args;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tess_bench::{Report, Summary, Table};
use tess_core::spec::{CellSpec, Policy};
use tess_proto::client::Client;
use tess_proto::{Body, Request};

/// `tess bench daemon`.
#[derive(Args, Debug, Clone)]
pub struct DaemonArgs {
    #[command(flatten)]
    pub common: Common,
    /// Concurrent clients asking for `status` in a loop.
    #[arg(long, default_value_t = 200, value_name = "N")]
    clients: usize,
    /// Transactions per second applied by the writer.
    #[arg(long, default_value_t = 20, value_name = "N")]
    rate: u32,
    /// Length of the loaded phase, in seconds (the floor and the baseline each run a sixth of
    /// it, at least 2 s, before it).
    #[arg(long, default_value_t = 60, value_name = "S")]
    seconds: u64,
    /// Pause of each reader between two calls, in milliseconds (0: a tight loop, which keeps
    /// both harts busy, so that latency then measures the queue of 200 clients, not tessd).
    #[arg(long, default_value_t = 0, value_name = "MS")]
    pause_ms: u64,
    /// Internal: serve the floor baseline on this socket (the bench starts it as a process).
    #[arg(long, hide = true, value_name = "SOCKET", requires = "floor_reply")]
    serve_floor: Option<std::path::PathBuf>,
    /// Internal: the reply frame the floor server sends.
    #[arg(long, hide = true, value_name = "FILE")]
    floor_reply: Option<std::path::PathBuf>,
}

const BE: &str = "bd-be";
const ET: &str = "bd-et";
/// The clients' nice value: tessd's (see `run`).
const CLIENT_NICE: libc::c_int = -10;
/// Weights are `WEIGHT0 + i` for transaction `i`.
const WEIGHT0: u32 = 100;

fn cells(hart: usize, i: u32) -> Vec<CellSpec> {
    let spec = |name: &str, policy| cell_on_hart(name, policy, hart);
    vec![
        spec(
            BE,
            Policy::BestEffort {
                weight: WEIGHT0 + i,
            },
        ),
        spec(
            ET,
            Policy::EventTriggered {
                period: Duration::from_millis(10),
                budget: Duration::from_millis(1 + u64::from(i % 2)),
            },
        ),
    ]
}

/// The weight of the best-effort cell as tessd shows it now.
fn weight_now(c: &mut Client) -> anyhow::Result<u32> {
    match c.call(&Request::ShowCell { name: BE.into() })? {
        Body::Cell(info) => match info.policy {
            Policy::BestEffort { weight } => Ok(weight),
            p => anyhow::bail!("{BE} has policy {p:?}"),
        },
        other => anyhow::bail!("unexpected reply {other:?}"),
    }
}

/// Latencies (ms) of `status` calls by `clients` connections until `stop`, and errors.
fn readers(
    socket: &std::path::Path,
    clients: usize,
    pause: Duration,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<(Vec<f64>, u64, f64)> {
    let conns: Vec<Client> = (0..clients)
        .map(|_| Client::connect(socket))
        .collect::<Result<_, _>>()?;
    let t0 = Instant::now();
    let handles: Vec<_> = conns
        .into_iter()
        .map(|mut c| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let (mut lat, mut errors) = (Vec::new(), 0u64);
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    match c.call(&Request::Status) {
                        Ok(Body::Status(_)) => lat.push(t.elapsed().as_secs_f64() * 1e3),
                        _ => errors += 1,
                    }
                    if !pause.is_zero() {
                        std::thread::sleep(pause);
                    }
                }
                (lat, errors)
            })
        })
        .collect();
    let (mut all, mut errors) = (Vec::new(), 0);
    for h in handles {
        let (l, e) = h.join().map_err(|_| anyhow::anyhow!("a reader panicked"))?;
        all.extend(l);
        errors += e;
    }
    Ok((all, errors, t0.elapsed().as_secs_f64()))
}

/// What the writer saw.
#[derive(Debug, Default)]
struct Writes {
    apply_ms: Vec<f64>,
    errors: u64,
    lost: u64,
    last_ok: Option<u32>,
}

fn writer(hart: usize, rate: u32, seconds: u64, stop: &AtomicBool) -> anyhow::Result<Writes> {
    let mut s = Session::connect()?;
    let mut check = Client::connect(&tess_proto::client::socket_path())?;
    let mut w = Writes::default();
    let n = rate as u64 * seconds;
    let t0 = Instant::now();
    for i in 1..=n as u32 {
        let due = t0 + Duration::from_secs_f64(f64::from(i - 1) / f64::from(rate));
        if let Some(d) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
        let t = Instant::now();
        let r = s.client.call(&Request::Apply {
            cells: cells(hart, i),
            delete: vec![],
            prune: false,
            dry_run: false,
        });
        match r {
            Ok(Body::Applied(_)) => {
                w.apply_ms.push(t.elapsed().as_secs_f64() * 1e3);
                w.last_ok = Some(i);
                // Acknowledged means visible: a read right after must show this transaction.
                match weight_now(&mut check) {
                    Ok(x) if x == WEIGHT0 + i => {}
                    Ok(_) => w.lost += 1,
                    Err(_) => w.errors += 1,
                }
            }
            _ => w.errors += 1,
        }
    }
    stop.store(true, Ordering::Relaxed);
    Ok(w)
}

/// Runs the benchmark.
pub fn run(a: &DaemonArgs) -> anyhow::Result<Report> {
    if let (Some(socket), Some(reply)) = (&a.serve_floor, &a.floor_reply) {
        floor::serve(socket, reply)?;
        anyhow::bail!("the floor server stopped");
    }
    anyhow::ensure!(a.clients > 0, "--clients must be at least 1");
    anyhow::ensure!((1..=1000).contains(&a.rate), "--rate must be 1-1000");
    anyhow::ensure!(a.seconds > 0, "--seconds must be at least 1");
    let seconds = if a.common.quick {
        a.seconds.min(5)
    } else {
        a.seconds
    };
    // The clients run at tessd's own nice value (threads spawned below inherit it), so that
    // what is measured is the daemon, not how builds or other batch work on the machine delay
    // the clients. Best effort: without the privilege the figures include that delay.
    // SAFETY: setpriority on the calling thread has no memory-safety implications.
    let _ = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, CLIENT_NICE) };
    let mut s = Session::connect()?;
    let status = s.status()?;
    let hart = pick_hart(a.common.hart, &status)?;
    let pause = Duration::from_millis(a.pause_ms);
    s.apply(cells(hart, 0))?;
    let holder = spawn_work(Some(ET), &["idle".into()])?;
    std::thread::sleep(Duration::from_millis(300));

    let socket = tess_proto::client::socket_path();
    let base_s = (seconds / 6).max(2);
    // The readers alone for `base_s`, against `socket`.
    let readers_alone = |socket: &std::path::Path| {
        let stop = Arc::new(AtomicBool::new(false));
        let (socket, clients, stop_them) = (socket.to_path_buf(), a.clients, stop.clone());
        let h = std::thread::spawn(move || readers(&socket, clients, pause, stop_them));
        std::thread::sleep(Duration::from_secs(base_s));
        stop.store(true, Ordering::Relaxed);
        h.join()
            .map_err(|_| anyhow::anyhow!("the readers panicked"))?
    };
    // The floor: the same readers, answered by a bare server with tessd's reply. Its errors
    // are returned after the holder is stopped, like the other phases'.
    let floor_run = (|| {
        let reply = tess_proto::frame::encode(&tess_proto::Response::Ok {
            body: Body::Status(Box::new(s.status()?)),
        })?;
        let floor = floor::start(&reply)?;
        readers_alone(&floor.socket)
    })();
    // Baseline: the readers alone.
    let base = readers_alone(&socket);
    // Loaded: the readers and the writer.
    let stop_load = Arc::new(AtomicBool::new(false));
    let loaded = {
        let stop = stop_load.clone();
        let (socket, clients) = (socket.clone(), a.clients);
        let h = std::thread::spawn(move || readers(&socket, clients, pause, stop));
        let w = writer(hart, a.rate, seconds, &stop_load);
        stop_load.store(true, Ordering::Relaxed);
        let r = h
            .join()
            .map_err(|_| anyhow::anyhow!("the readers panicked"))?;
        (r, w)
    };
    stop(holder);
    let (base_lat, base_err, base_wall) = base?;
    let (floor_lat, floor_err, floor_wall) = floor_run?;
    let (readings, w) = loaded;
    let (lat, read_errors, wall) = readings?;
    let mut w = w?;
    // At the end the last acknowledged transaction is what tessd holds.
    let mut check = Client::connect(&tess_proto::client::socket_path())?;
    match (weight_now(&mut check), w.last_ok) {
        (Ok(x), Some(i)) if x != WEIGHT0 + i => w.lost += 1,
        (Err(_), _) => w.errors += 1,
        _ => {}
    }
    s.delete(&[BE, ET]);

    let b = Summary::of(&base_lat);
    let f = Summary::of(&floor_lat);
    let l = Summary::of(&lat);
    let ap = Summary::of(&w.apply_ms);
    let errors = floor_err + base_err + read_errors + w.errors;
    let mut r = Report::new("daemon");
    let mut t = Table::new(
        format!(
            "{} clients asking for status in a loop (pause {} ms); writer: {} transactions/s for {seconds} s (ms)",
            a.clients, a.pause_ms, a.rate
        ),
        &["measure", "calls", "calls/s", "median", "p99", "max"],
    );
    let row = |t: &mut Table, name: &str, x: &Summary, n: usize, wall: f64| {
        t.row(&[
            name.to_string(),
            n.to_string(),
            format!("{:.0}", n as f64 / wall.max(1e-9)),
            format!("{:.3}", x.median),
            format!("{:.3}", x.p99),
            format!("{:.3}", x.max),
        ]);
    };
    row(
        &mut t,
        "floor: a bare epoll server, tessd's reply",
        &f,
        floor_lat.len(),
        floor_wall,
    );
    row(
        &mut t,
        "status, no writer (baseline)",
        &b,
        base_lat.len(),
        base_wall,
    );
    row(&mut t, "status, with the writer", &l, lat.len(), wall);
    row(
        &mut t,
        "apply (writer)",
        &ap,
        w.apply_ms.len(),
        seconds as f64,
    );
    r.table(t);
    r.figure("status_p99_ms", l.p99);
    r.figure("status_p99_baseline_ms", b.p99);
    r.figure("status_p99_floor_ms", f.p99);
    r.figure("status_median_floor_ms", f.median);
    r.figure("status_median_ms", l.median);
    r.figure("apply_p99_ms", ap.p99);
    r.figure("apply_median_ms", ap.median);
    r.figure("transactions", w.apply_ms.len() as f64);
    r.figure("lost_transactions", w.lost as f64);
    r.figure("errors", errors as f64);
    r.target(
        "status p99 under 5 ms with the writer",
        l.p99 < 5.0,
        format!("{:.3} ms", l.p99),
    );
    r.target("no lost transaction", w.lost == 0, w.lost.to_string());
    r.target("no error", errors == 0, errors.to_string());
    r.note(format!("each transaction changes two cells on hart {hart}: a best-effort weight (a new value each time) and an event-triggered budget 1ms<->2ms whose cell holds a running process"));
    r.detail("pause_ms", a.pause_ms);
    r.note("the clients run at nice -10, as tessd does, so that other work on the machine delays neither");
    r.note("the floor is the same clients against a bare epoll server in a process of its own that answers every request with a status reply tessd sent: what any server costs these clients on this machine");
    r.note("a transaction counts as lost when tessd acknowledged it but the read that follows does not show it");
    r.detail("status_ms", l);
    r.detail("status_baseline_ms", b);
    r.detail("status_floor_ms", f);
    r.detail("apply_ms", ap);
    Ok(r)
}
