//! `tess bench net`: seed 000 section 4.2 (Fig. 8) with the synthesizer's traffic behind the
//! network service, plus the cost and the capacity of the service path.
//!
//! ```text
//! floor  music pair through the service, nothing else           -> noise_floor_misses, need
//! direct music pair, the synthesizer owning its socket          -> baseline of the added latency
//! a      + abusive streaming client, no reservations             (paper: 99.91% missed)
//! b      + abuser, music flow reserved 240 Mbit/s                (paper: 0 missed)
//! c      + abuser, music flow reserved 150 Mbit/s                (paper: 8 missed)
//! d      + abuser, music flow reserved 1.1 x its measured need, with a latency bound
//! max    the service alone with a flooding client, not paced    -> service_max_pps
//! ```
//!
//! # Layout (2 harts; scales by giving the service the highest harts)
//! The service's cell is dedicated to the highest managed hart, where it busy-polls, like
//! Tessellation's non-multiplexed service cell (on this 2-hart machine tessd keeps one hart
//! shared, so the service is the one dedicated cell). The other hart holds the synthesizer's
//! event-triggered cell (250 us every 725.6 us; it sleeps between packets), the abusive client's
//! best-effort cell, and the SLABS emulator, test equipment standing in for the paper's second
//! machine: outside the cells, SCHED_FIFO 98, in its own network namespace across a veth pair.
//! The abuser streams to a sink on loopback. The service's link is declared as 500 Mbit/s and
//! 250 kpps and paced to it: well within what the service sustains on its hart, and less than
//! the abuser offers, so that the abuser saturates the service (not the host) as in the paper,
//! and a 240 Mbit/s reservation is feasible. With more harts the synthesizer would get a
//! dedicated hart too.
//!
//! # What is measured
//! Per package, the response time the device sees, `tf - t0` (seed 000 Fig. 6); misses are
//! late or lost answers. The abuser's throughput is what the
//! service sent for it, from its flow table, over the scenario. The added latency is the
//! median response through the service (floor) minus the median with the synthesizer's own
//! socket (direct).

use super::{cells, pingpong};
use anyhow::{bail, Context};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tess_bench::{Report, Table};
use tess_music::emulator::Pace;
use tess_music::net::Wait;
use tess_music::scenario::{self, Interference, RunEnv, ScenarioResult, ScenarioSpec};
use tess_net::client::qos::format_ns;
use tess_net::client::{FlowTable, Net, QosSpec, Throughput};
use tess_sched::HartSet;

/// Name the bench's service registers under.
pub const SERVICE_NAME: &str = "net-bench";
/// The service's link in the bench: what it promises and paces to. Well below what one hart
/// of the service sustains, and below what the abusive client offers from the shared hart, so
/// that the abuser saturates the service, as in the paper.
pub const LINK: Throughput = Throughput {
    pps: 250_000,
    bps: 500_000_000,
};
/// The paper's reservations.
const RESERVE_B_BPS: u64 = 240_000_000;
const RESERVE_C_BPS: u64 = 150_000_000;
/// The abuser's datagrams.
const ABUSE_BYTES: usize = 1472;
/// Every scenario, in the order they run.
pub const ALL: [&str; 8] = ["floor", "direct", "a", "b", "c", "d", "ping", "max"];

/// The music flow's payload both ways by the protocol: 22,050 input packets/s of 792 bytes and
/// 1378 answers/s of 1048 bytes (used for (d) when the floor run is skipped).
fn nominal_need_bps() -> f64 {
    let packages = 1e9 / cells::PACKAGE.as_nanos() as f64;
    packages * (16.0 * 792.0 + 1048.0) * 8.0
}

/// Options of the benchmark.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Short runs: a smoke test, not a measurement.
    pub quick: bool,
    /// Measured seconds per scenario (default 20; quick 4).
    pub seconds: Option<f64>,
    /// Directory for histograms, samples and logs.
    pub out: PathBuf,
    /// The `tess` executable (to run programs in cells).
    pub tess: PathBuf,
    /// Directory of `tess-netd`, `tess-net-flood`, `tess-migrator`, `tess-slabs`.
    pub bin_dir: PathBuf,
    /// Hart of the service (default: the highest managed).
    pub service_hart: Option<usize>,
    /// Latency bound of scenario d.
    pub latency: Duration,
    /// Scenarios to run, of `floor direct a b c d max` (default all).
    pub scenarios: Vec<String>,
}

impl BenchOptions {
    /// Defaults, with binaries next to the running executable.
    pub fn beside_current_exe(out: &Path) -> anyhow::Result<BenchOptions> {
        let tess = std::env::current_exe()?;
        let bin_dir = tess.parent().map(Path::to_path_buf).unwrap_or_default();
        Ok(BenchOptions {
            quick: false,
            seconds: None,
            out: out.to_path_buf(),
            tess,
            bin_dir,
            service_hart: None,
            latency: Duration::from_micros(250),
            scenarios: ALL.iter().map(|s| s.to_string()).collect(),
        })
    }
}

/// One scenario's outcome.
#[derive(Debug, serde::Serialize)]
struct Outcome {
    name: String,
    reservation: String,
    abusive_mbps: f64,
    music_mbps: f64,
    music_kpps: f64,
    music_late: u64,
    result: ScenarioResult,
}

fn flow_table(net: &Net) -> anyhow::Result<FlowTable> {
    Ok(net.control()?.flows()?)
}

fn totals_of(t: &FlowTable, cell: &str) -> tess_net::client::qos::Totals {
    t.flow(&format!("cell:{cell}"))
        .map(|f| f.totals)
        .unwrap_or_default()
}

/// Runs the benchmark against the tessd of `TESS_SOCKET`.
pub fn run(opts: BenchOptions) -> anyhow::Result<Report> {
    let seconds = opts.seconds.unwrap_or(if opts.quick { 4.0 } else { 20.0 });
    let duration = Duration::from_secs_f64(seconds);
    for p in ["tess-netd", "tess-net-flood", "tess-migrator", "tess-slabs"] {
        anyhow::ensure!(
            opts.bin_dir.join(p).exists(),
            "{} is missing (cargo build --workspace --bins)",
            opts.bin_dir.join(p).display()
        );
    }
    std::fs::create_dir_all(&opts.out)?;
    let out = std::fs::canonicalize(&opts.out)?;
    let mut s = cells::Session::connect()?;
    let status = s.status()?;
    let service_hart = match opts.service_hart {
        Some(h) if status.managed.contains(h) => h,
        Some(h) => bail!("hart {h} is not managed by tessd"),
        None => status
            .managed
            .iter()
            .last()
            .context("tessd manages no harts")?,
    };
    let service_harts = HartSet::single(service_hart);
    let shared = status.managed.difference(&service_harts);
    anyhow::ensure!(!shared.is_empty(), "tess bench net needs 2 managed harts");
    let emulator_hart = shared.first().expect("a shared hart");
    s.apply(cells::cells(&service_harts, &shared))?;

    let env = RunEnv {
        bin_dir: opts.bin_dir.clone(),
        cache_dir: scenario::interference::default_cache_dir(),
        work_dir: out.clone(),
    };
    let net = Net::named(SERVICE_NAME);
    let link = format!("{}bit,{}pps", LINK.bps, LINK.pps);
    let mut service = start_service(&opts, &out, SERVICE_NAME, &["--capacity", &link])?;
    // The abuser's sink: a socket nobody reads (the kernel drops what does not fit).
    let sink = std::net::UdpSocket::bind("127.0.0.1:0")?;
    let sink_addr = sink.local_addr()?;

    let mut outcomes: Vec<Outcome> = Vec::new();
    let run_one = |name: &str,
                   title: &str,
                   via_service: bool,
                   abuser: bool,
                   spec: Option<QosSpec>|
     -> anyhow::Result<Outcome> {
        let mut control = net.control()?;
        control.clear_all()?;
        if let Some(q) = spec {
            control.set(&format!("cell:{}", cells::SYNTH), q)?;
        }
        let mut flood = if abuser {
            let args: Vec<String> = vec![
                "--service".into(),
                SERVICE_NAME.into(),
                "--to".into(),
                sink_addr.to_string(),
                "--size".into(),
                ABUSE_BYTES.to_string(),
            ];
            let log = std::fs::File::create(out.join(format!("flood-{name}.log")))?;
            let g = cells::Guard(Some(cells::spawn_in_cell(
                &opts.tess,
                cells::ABUSE,
                &opts.bin_dir.join("tess-net-flood"),
                &args,
                Stdio::null(),
                Stdio::from(log),
            )?));
            // Let it fill its channel.
            std::thread::sleep(Duration::from_millis(300));
            Some(g)
        } else {
            None
        };
        let before = flow_table(&net)?;
        let t0 = Instant::now();
        let launcher = cells::CellLauncher {
            tess: opts.tess.clone(),
            net_service: via_service.then(|| SERVICE_NAME.to_string()),
        };
        let spec = music_spec(name, title, duration, emulator_hart);
        let result = scenario::run_scenario(&spec, &env, &launcher);
        let after = flow_table(&net)?;
        let dt = t0.elapsed().as_secs_f64();
        if let Some(f) = flood.as_mut() {
            f.stop(Duration::from_secs(2));
        }
        let result = result?;
        let (ab0, ab1) = (
            totals_of(&before, cells::ABUSE),
            totals_of(&after, cells::ABUSE),
        );
        let (m0, m1) = (
            totals_of(&before, cells::SYNTH),
            totals_of(&after, cells::SYNTH),
        );
        let music_secs = (seconds + spec.warmup.as_secs_f64()).min(dt);
        Ok(Outcome {
            name: name.into(),
            reservation: spec_text(spec_of(&after)),
            abusive_mbps: ab1.tx_bytes.saturating_sub(ab0.tx_bytes) as f64 * 8.0 / dt / 1e6,
            music_mbps: m1.bytes().saturating_sub(m0.bytes()) as f64 * 8.0 / music_secs / 1e6,
            music_kpps: m1.packets().saturating_sub(m0.packets()) as f64 / music_secs / 1e3,
            music_late: m1.late.saturating_sub(m0.late),
            result,
        })
    };

    let want = |n: &str| opts.scenarios.iter().any(|s| s == n);
    let mut ping = None;
    let res = (|| -> anyhow::Result<()> {
        let mut need_bps = nominal_need_bps();
        if want("floor") {
            let floor = run_one(
                "floor",
                "music pair through the service, alone",
                true,
                false,
                None,
            )?;
            if floor.music_mbps > 0.0 {
                need_bps = floor.music_mbps * 1e6;
            }
            outcomes.push(floor);
        }
        if want("direct") {
            outcomes.push(run_one(
                "direct",
                "music pair, synthesizer owning its socket, alone",
                false,
                false,
                None,
            )?);
        }
        let bits = |bps: u64| QosSpec {
            reservation: Throughput::bits(bps),
            ..QosSpec::default()
        };
        let d = QosSpec {
            latency_ns: Some(tess_sched::clock::ns(opts.latency)),
            ..bits((need_bps * 1.1).round() as u64)
        };
        let d_title = format!(
            "abusive client, music reserved 1.1 x need with a {} bound",
            format_ns(tess_sched::clock::ns(opts.latency))
        );
        let abused: [(&str, &str, Option<QosSpec>); 4] = [
            ("a", "abusive client, no reservations", None),
            (
                "b",
                "abusive client, music reserved 240 Mbit/s",
                Some(bits(RESERVE_B_BPS)),
            ),
            (
                "c",
                "abusive client, music reserved 150 Mbit/s",
                Some(bits(RESERVE_C_BPS)),
            ),
            ("d", &d_title, Some(d)),
        ];
        for (name, title, spec) in abused {
            if want(name) {
                outcomes.push(run_one(name, title, true, true, spec)?);
            }
        }
        if want("ping") {
            net.control()?.clear_all()?;
            let count = if opts.quick { 2_000 } else { 20_000 };
            ping = Some(pingpong::measure(&net, emulator_hart, count)?);
        }
        Ok(())
    })();
    service.stop(Duration::from_secs(2));
    res?;

    // The service's packet rate on one hart: not paced, one flooding client of small packets.
    let max_pps = if want("max") {
        measure_max_pps(&opts, &out, sink_addr, if opts.quick { 2.0 } else { 5.0 })?
    } else {
        f64::NAN
    };
    s.delete_all();
    drop(sink);

    report(&outcomes, ping, max_pps, service_hart, &shared, &out, &opts)
}

fn spec_of(t: &FlowTable) -> Option<QosSpec> {
    t.flow(&format!("cell:{}", cells::SYNTH))
        .and_then(|f| f.spec)
}

fn spec_text(s: Option<QosSpec>) -> String {
    match s {
        None => "-".into(),
        Some(q) => {
            let mut t = tess_net::client::qos::format_bps(q.reservation.bps as f64);
            if let Some(d) = q.latency_ns {
                t.push_str(&format!(", {} bound", format_ns(d)));
            }
            t
        }
    }
}

fn music_spec(name: &str, title: &str, duration: Duration, emulator_hart: usize) -> ScenarioSpec {
    let mut base = scenario::baseline_d(duration);
    base.name = name.into();
    base.title = title.into();
    // tessd places the threads: no pinning, no FIFO; the synthesizer sleeps between packets
    // (its cell shares a hart), the emulator paces by sleeping inside its reservation.
    base.synth.harts = None;
    base.synth.fifo = None;
    base.synth.wait = Wait::Block;
    // The emulator is test equipment (the paper's SLABS was another machine): outside the
    // cells, SCHED_FIFO 98 on the shared hart, sleeping until 20 us before each packet.
    base.emulator.hart = Some(emulator_hart);
    base.emulator.fifo = Some(98);
    base.emulator.pace = Pace::Hybrid {
        margin: Duration::from_micros(20),
    };
    base.interference = Interference::NONE;
    base.netns = Some("tess-netb".into());
    base
}

fn start_service(
    opts: &BenchOptions,
    out: &Path,
    name: &str,
    extra: &[&str],
) -> anyhow::Result<cells::Guard> {
    let ready = out.join(format!("{name}.ready"));
    let _ = std::fs::remove_file(&ready);
    let mut args: Vec<String> = vec![
        "--name".into(),
        name.into(),
        "--max-datagram".into(),
        "1500".into(),
        "--ready-file".into(),
        ready.display().to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let log = std::fs::File::create(out.join(format!("{name}.log")))?;
    let mut g = cells::Guard(Some(cells::spawn_in_cell(
        &opts.tess,
        cells::SERVICE,
        &opts.bin_dir.join("tess-netd"),
        &args,
        Stdio::null(),
        Stdio::from(log),
    )?));
    if !cells::wait_ready(&ready, &mut g, Duration::from_secs(20)) {
        bail!(
            "tess-netd did not start; see {}",
            out.join(format!("{name}.log")).display()
        );
    }
    Ok(g)
}

fn measure_max_pps(
    opts: &BenchOptions,
    out: &Path,
    sink: std::net::SocketAddr,
    seconds: f64,
) -> anyhow::Result<f64> {
    let name = "net-bench-max";
    let mut svc = start_service(
        opts,
        out,
        name,
        &[
            "--no-pacing",
            "--capacity",
            "100gbit,100mpps",
            "--batch",
            "64",
        ],
    )?;
    let args: Vec<String> = vec![
        "--service".into(),
        name.into(),
        "--to".into(),
        sink.to_string(),
        "--size".into(),
        "64".into(),
    ];
    let mut flood = cells::Guard(Some(cells::spawn_in_cell(
        &opts.tess,
        cells::ABUSE,
        &opts.bin_dir.join("tess-net-flood"),
        &args,
        Stdio::null(),
        Stdio::null(),
    )?));
    let net = Net::named(name);
    std::thread::sleep(Duration::from_millis(500));
    let before = flow_table(&net)?;
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(seconds));
    let after = flow_table(&net)?;
    let dt = t0.elapsed().as_secs_f64();
    flood.stop(Duration::from_secs(2));
    svc.stop(Duration::from_secs(2));
    let (a, b) = (
        totals_of(&before, cells::ABUSE),
        totals_of(&after, cells::ABUSE),
    );
    Ok(b.tx_packets.saturating_sub(a.tx_packets) as f64 / dt)
}

fn report(
    outcomes: &[Outcome],
    ping: Option<pingpong::PingPong>,
    max_pps: f64,
    service_hart: usize,
    shared: &HartSet,
    out: &Path,
    opts: &BenchOptions,
) -> anyhow::Result<Report> {
    let mut r = Report::new("net");
    let mut t = Table::new(
        "response time per package seen by the device (us; misses = late > 1405.9 us or lost), \
         and the abusive client's throughput through the service",
        &[
            "scenario",
            "music reservation",
            "packages",
            "misses",
            "mean",
            "p99",
            "p99.9",
            "max",
            "t2-t1 mean",
            "music Mbit/s",
            "late in service",
            "abuser Mbit/s",
        ],
    );
    let get = |n: &str| outcomes.iter().find(|o| o.name == n);
    let mut images = Vec::new();
    for o in outcomes {
        let s = o.result.summary();
        t.row(&[
            format!("{}: {}", o.name, o.result.spec.title),
            o.reservation.clone(),
            o.result.device.packages.to_string(),
            o.result.misses().to_string(),
            format!("{:.1}", s.mean),
            format!("{:.1}", s.p99),
            format!("{:.1}", s.p999),
            format!("{:.1}", s.max),
            format!("{:.1}", o.result.host.response_us.mean),
            format!("{:.1}", o.music_mbps),
            o.music_late.to_string(),
            format!("{:.1}", o.abusive_mbps),
        ]);
        let path = out.join(format!("net-{}.svg", o.name));
        std::fs::write(&path, scenario::histogram_svg(&o.result))?;
        images.push(path.display().to_string());
        for n in &o.result.notes {
            r.note(format!("{}: {n}", o.name));
        }
    }
    r.table(t);
    for n in ["a", "b", "c", "d"] {
        if let Some(o) = get(n) {
            r.figure(format!("{n}_packages"), o.result.device.packages as f64);
            r.figure(format!("{n}_misses"), o.result.misses() as f64);
            r.figure(format!("{n}_p999_us"), o.result.summary().p999);
            r.figure(format!("{n}_abusive_mbps"), o.abusive_mbps);
        }
    }
    let floor = get("floor");
    let floor_misses = floor.map_or(0, |f| f.result.misses());
    r.figure("noise_floor_misses", floor_misses as f64);
    let music_added = match (floor, get("direct")) {
        (Some(f), Some(d)) => f.result.summary().median - d.result.summary().median,
        _ => f64::NAN,
    };
    let added = ping.as_ref().map_or(music_added, |p| p.added_median_us());
    r.figure("service_added_median_us", added);
    if let Some(p) = &ping {
        let mut t = Table::new(
            "UDP round trips between two sockets of one busy-polling thread on the shared hart, 64-byte datagrams (us); through the service, the path is crossed twice per round trip",
            &["path", "samples", "median", "p99", "p99.9", "max"],
        );
        for (name, x) in [
            ("own socket (direct)", &p.direct_us),
            ("socket in the service", &p.service_us),
        ] {
            t.row(&[
                name.to_string(),
                x.count.to_string(),
                format!("{:.1}", x.median),
                format!("{:.1}", x.p99),
                format!("{:.1}", x.p999),
                format!("{:.1}", x.max),
            ]);
        }
        r.table(t);
        r.detail("pingpong", p);
    }
    if music_added.is_finite() {
        r.note(format!(
            "music pair alone, median response through the service minus with the synthesizer's own socket: {music_added:+.1} us (the synthesizer's own wake-ups differ between the two paths; service_added_median_us is from the round trips)"
        ));
    }
    r.figure("service_max_pps", max_pps);

    if let Some(a) = get("a") {
        let frac = a.result.misses() as f64 / a.result.device.packages.max(1) as f64;
        r.target(
            "(a) misses most deadlines",
            frac > 0.5,
            format!("{:.2}% missed (paper 99.91%)", frac * 100.0),
        );
    }
    for n in ["b", "d"] {
        if let Some(o) = get(n) {
            r.target(
                format!("({n}) misses none beyond the noise floor"),
                o.result.misses() <= floor_misses,
                format!("{} vs {floor_misses}", o.result.misses()),
            );
        }
    }
    if let Some(d) = get("d") {
        r.target(
            "(d) beats the paper's 8 misses at 150 Mbit/s",
            d.result.misses() < 8,
            format!("{} misses", d.result.misses()),
        );
    }
    r.target(
        "added median latency of the service path under 10 us",
        added < 10.0,
        format!("{added:.1} us"),
    );
    let emulator_hart = shared.first().unwrap_or(0);
    r.note(format!(
        "hart layout: hart {service_hart} is dedicated to the network service's cell {} (busy-poll); hart {} holds the synthesizer's cell {} (event-triggered {} us / 725.6 us, sleeping between packets), the abusive client's cell {} (best effort) and the SLABS emulator (test equipment outside the cells: SCHED_FIFO 98, paced by sleeping until 20 us before each packet, in network namespace tess-netb across a veth pair)",
        cells::SERVICE,
        emulator_hart,
        cells::SYNTH,
        cells::SYNTH_RES.0.as_micros(),
        cells::ABUSE
    ));
    r.note(format!(
        "service link: {} declared and paced, datagrams up to 1500 B, quantum 20 us; the abuser streams {ABUSE_BYTES}-byte datagrams to a sink on loopback as fast as the service takes them; flows without a spec share what reservations leave, first come first served",
        tess_net::sched::admission::describe(&tess_net::sched::Link::new(LINK))
    ));
    if let Some(f) = floor {
        r.note(format!(
            "music flow's measured need (floor): {:.1} Mbit/s, {:.1} kpps of payload both ways; (d) reserves 1.1 x the bit rate with a {} latency bound",
            f.music_mbps,
            f.music_kpps,
            format_ns(tess_sched::clock::ns(opts.latency))
        ));
    }
    r.note(format!(
        "service_max_pps: a second service instance on hart {service_hart}, not paced, batches of 64, one client flooding 64-byte datagrams to a loopback sink (kernel transmit and loopback receive included)"
    ));
    r.note("seed 000 Fig. 8: (a) no guarantee: 243,903 missed (99.91%), mean 461 ms; (b) 240 Mbit/s: 0 missed, max 1389 us, mean 983 us; 150 Mbit/s: 8 missed");
    r.note(format!("histograms: {}", images.join(", ")));
    r.detail("outcomes", outcomes);
    Ok(r)
}
