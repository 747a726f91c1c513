//! `tess bench conference`: PACORA runs the video conference (seed 004 section 6.2, Fig. 7;
//! issue 14).
//!
//! Nine incoming H.264 streams at 30 fps, received over TCP and decoded in the video cell
//! (libavcodec, one decoder per stream; one thread per hart of the cell polls its streams and
//! decodes earliest release first, `roles::video`) and handed to the display, a frame sink
//! in a cell of its own found through tessd's nameserver, over one channel per stream
//! (`display`); a parallel file indexer over real text in a second cell; a TCP
//! bandwidth hog (a download as fast as the link allows) in a third. Every `--resize-every`
//! seconds a resize happens: one stream switches to its large encoding (640x360, 800 kbit/s
//! instead of 320x180, 200 kbit/s) or back, so one stream at most is large. The remote sites
//! are test equipment: one sender process in a network namespace of its own
//! (`tess_music::netns::NetnsPair`), whose cable releases what it sends at the link rate
//! (`--link-mbps`, a token bucket on the cable: the same link in every run).
//!
//! Three runs in the same invocation, the same streams, schedule, link and programs:
//!
//! | run | CPU | network |
//! |---|---|---|
//! | `linux` | plain processes, no cells (CFS on every hart) | kernel sockets; the hog and the videos share the cable's queue |
//! | `static` | video and indexer event-triggered cells splitting a hart evenly, pinned | through the network service (`tess-netd` in its own cell, paced just under the link): the video cell's flow reserved for the worst case (one large and eight small streams, 1.5 times), the hog limited to the rest |
//! | `pacora` | the same cells, brokered | the same service; each stream's connection is a flow of its own (flow label `sK`), and the broker divides the link between the nine streams' flows and the hog |
//!
//! Under `pacora` the bench runs the broker's own loop ([`tess_broker::service::Broker`],
//! policy `pacora` with a `[network]` pool) in this process, as `tess bench pota` does. The
//! video cell beats two heartbeats per frame: `conf-video` (target 270 frames a second, all
//! streams) carrying the frame's decode CPU time, and its stream's `conf-video@sK.net` (target
//! 30 a second) carrying its size as its header arrives (the demands the broker's models are
//! made of, docs/broker.md "Beats that carry demands"). The indexer beats per 64 KiB of text
//! and the hog per 64 KiB received, both with targets no allocation meets and a low penalty
//! slope: they take what the video leaves. PACORA allocates the hart's CPU pool (video,
//! indexer) and the link's pool (nine stream flows, hog): each stream gets a share of its
//! own, as the paper's Fig. 7a shows. The static run cannot do so: nine flows each reserved
//! for a large stream (1.5 x 0.8 Mbit/s) do not fit the link, so its streams share the cell's
//! flow, reserved for the worst case.
//!
//! **Hart layout** (2 harts; more harts give the cells more): the lowest managed hart holds the
//! network service's cell, the hog's best-effort cell, the sender and the broker; the highest
//! holds the video and the indexer cells.
//!
//! **Figures**: `fps_ok_fraction` (of the 1 s windows, those in which every stream had at least
//! 29 of its 30 frames decoded by its display deadline, 100 ms after release; the first 3 s and
//! the second after each resize are not counted), `hog_bandwidth_share` (the hog's mean
//! throughput over the counted windows / the link, `--link-mbps`), `indexer_throughput` (MB of
//! text indexed per second, over the counted windows), each for `pacora` and prefixed `static_` and `linux_` for the baselines, and
//! the broker's mean allocations. `--svg` plots allocations and frame rates over time (the
//! paper's Fig. 7).

mod display;
mod roles;
mod wire;

use super::net::cells::{self, Guard};
use super::support::{tess_exe, Session};
use super::Common;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;
use tess_bench::{Report, Summary, Table};
use tess_broker::config::{CellLimits, Config, NetworkConfig, Policy as BrokerPolicy};
use tess_broker::service::{Broker, Tessd};
use tess_core::spec::{CellSpec, Policy};
use tess_heartbeat::clock::now_ns;
use tess_sched::HartSet;
use wire::{Schedule, STREAMS};

/// `tess bench conference`.
#[derive(clap::Args, Debug)]
pub struct ConferenceArgs {
    #[command(flatten)]
    pub common: Common,
    /// Seconds per run (default 60; 20 with --quick).
    #[arg(long, value_name = "S")]
    pub secs: Option<f64>,
    /// Seconds between resizes (default 8; 5 with --quick).
    #[arg(long, value_name = "S")]
    pub resize_every: Option<f64>,
    /// The link's rate, Mbit/s.
    #[arg(long, default_value_t = 10.0, value_name = "MBPS")]
    pub link_mbps: f64,
    /// Clip cache (default $XDG_CACHE_HOME/tess/conference, else ~/.cache/tess/conference).
    #[arg(long, value_name = "DIR")]
    pub cache: Option<PathBuf>,
    /// Write allocations and frame rates over time here (SVG, the paper's Fig. 7; default
    /// <cache>/conference.svg).
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// Keep every program's log and result in this directory (default: a temporary one,
    /// removed at the end).
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    /// Only these runs, comma-separated (linux, static, pacora).
    #[arg(long, value_delimiter = ',', default_value = "linux,static,pacora")]
    pub runs: Vec<String>,
    /// The video cell's threads: one per hart of the cell, each polling its share of the
    /// streams and decoding earliest release first (`hart`, the default: the streams multiplexed
    /// at user level, as Pulse does), or one per stream, each sleeping in read and decoding its
    /// own (`stream`; under PACORA's tight budget its per-thread reservations starve the large
    /// stream: docs/broker.md, "The section 6.2 experiment").
    #[arg(long, value_enum, default_value = "hart")]
    pub video_threads: roles::VideoThreads,
    /// Internal: the program to be (sender, display, video, hog, indexer).
    #[arg(long, hide = true)]
    pub role: Option<String>,
    /// Internal: start of the run, CLOCK_MONOTONIC ns.
    #[arg(long, hide = true)]
    pub t0: Option<u64>,
    /// Internal: the sender's address (listen or connect).
    #[arg(long, hide = true)]
    pub addr: Option<SocketAddr>,
    /// Internal: the network service to go through (none: kernel sockets).
    #[arg(long, hide = true)]
    pub net_service: Option<String>,
    /// Internal (video): each stream a flow and a flow heartbeat of its own.
    #[arg(long, hide = true)]
    pub stream_flows: bool,
    /// Internal: where a role writes what it measured.
    #[arg(long, hide = true)]
    pub out: Option<PathBuf>,
}

const NET_CELL: &str = "conf-net";
const VIDEO_CELL: &str = "conf-video";
const INDEX_CELL: &str = "conf-index";
const HOG_CELL: &str = "conf-hog";
/// The display's cell: the frame sink as a service of its own (module `display`).
const DISPLAY_CELL: &str = "conf-display";
const SERVICE_NAME: &str = "conf-net";
const NETNS: &str = "tess-conf";
const PORT: u16 = 9470;
/// Shortest clip, seconds. A clip covers the whole run ([`clip_secs`]): its encoding has one
/// IDR frame, at its start, and a stream that looped would send that keyframe again, every
/// never-resized stream at the same instant, a burst of keyframes the scenario does not have
/// (its only keyframes start a resize).
const MIN_CLIP_SECS: u32 = 30;
/// The two encodings: size and x264 bit rate, kbit/s.
const SMALL: (&str, u32) = ("320x180", 200);
const LARGE: (&str, u32) = ("640x360", 800);
/// Budget period of the video and indexer cells.
const CELL_PERIOD: Duration = Duration::from_millis(10);
/// The share of the reserved hart each of the two cells starts with (and keeps, static).
const START_SHARE: f64 = 0.45;
/// Windows not counted at the start (processes connecting, the broker's first rounds).
const WARMUP_WINDOWS: usize = 3;
/// Frames of 30 a stream must show on time in a window for the window to count as met.
const FRAMES_OK: u32 = 29;
/// The service paces to this fraction of the link, so that queues form in the service (per
/// flow, where reservations apply) rather than in the cable's shared queue.
const SERVICE_FRACTION: f64 = 0.95;

fn cache_dir(a: &ConferenceArgs) -> PathBuf {
    super::support::cache_dir("conference", a.cache.as_deref())
}

/// Seconds of clip a run of `sched` plays without looping: from its start to its end (a
/// stream that never resizes), with a second to spare.
fn clip_secs(sched: &Schedule) -> u32 {
    (sched.secs.ceil() as u32 + 1).max(MIN_CLIP_SECS)
}

fn clip_path(dir: &Path, (size, kbps): (&str, u32), secs: u32) -> PathBuf {
    dir.join(format!("clip-{size}-30fps-{kbps}k-{secs}s-one-idr.264"))
}

fn ensure_clips(dir: &Path, sched: &Schedule) -> anyhow::Result<[PathBuf; 2]> {
    let secs = clip_secs(sched);
    let mut out = Vec::new();
    for enc in [SMALL, LARGE] {
        let p = clip_path(dir, enc, secs);
        if !p.exists() {
            let rate = enc.1.to_string();
            super::decoders::encode_clip(
                &p,
                enc.0,
                30,
                secs,
                &[
                    "--bitrate",
                    &rate,
                    "--vbv-maxrate",
                    &rate,
                    "--vbv-bufsize",
                    &rate,
                ],
            )?;
        }
        out.push(p);
    }
    Ok([out[0].clone(), out[1].clone()])
}

fn schedule(a: &ConferenceArgs, t0_ns: u64) -> Schedule {
    let q = a.common.quick;
    Schedule {
        t0_ns,
        secs: a.secs.unwrap_or(if q { 20.0 } else { 60.0 }),
        resize_every: a.resize_every.unwrap_or(if q { 5.0 } else { 8.0 }),
    }
}

/// A role: what the bench starts as `tess bench conference --role NAME`.
fn run_role(a: &ConferenceArgs, role: &str) -> anyhow::Result<Report> {
    let t0 = a.t0.ok_or_else(|| anyhow::anyhow!("--role needs --t0"))?;
    let sched = schedule(a, t0);
    let addr = a.addr;
    let need_addr = || addr.ok_or_else(|| anyhow::anyhow!("--role {role} needs --addr"));
    let json = match role {
        "sender" => {
            let [small, large] = ensure_clips(&cache_dir(a), &sched)?;
            let load = |p: &Path| -> anyhow::Result<Vec<Vec<u8>>> {
                Ok(super::decoders::load_units(p)?.to_vec())
            };
            roles::sender(need_addr()?, sched, load(&small)?, load(&large)?)?;
            serde_json::json!({})
        }
        "video" => serde_json::to_value(roles::video(
            need_addr()?,
            a.net_service.as_deref(),
            sched,
            a.video_threads,
            a.stream_flows,
        )?)?,
        "display" => serde_json::to_value(display::run(sched, VIDEO_CELL)?)?,
        "hog" => serde_json::to_value(roles::hog(need_addr()?, a.net_service.as_deref(), sched)?)?,
        "indexer" => serde_json::to_value(roles::indexer(sched)?)?,
        other => anyhow::bail!("unknown role {other:?} (sender, display, video, hog, indexer)"),
    };
    if let Some(p) = &a.out {
        std::fs::write(p, serde_json::to_vec(&json)?)?;
    }
    // A role prints nothing: the bench reads --out.
    std::process::exit(0);
}

/// One run's measurements.
#[derive(Debug, Default)]
struct RunOut {
    name: &'static str,
    video: roles::VideoOut,
    hog: roles::HogOut,
    index: roles::IndexOut,
    /// Per second from t0: (video CPU share, indexer CPU share, video Mbit/s, hog Mbit/s).
    alloc: Vec<(f64, [f64; 4])>,
    /// Per second from t0 (pacora): each stream's flow, Mbit/s.
    stream_net: Vec<(f64, Vec<f64>)>,
    notes: Vec<String>,
}

/// A bench cell on `hart` (the layout gives each cell one hart), pinned or not.
fn cell(name: &str, policy: Policy, hart: &HartSet, pinned: bool) -> CellSpec {
    let hart = hart.first().expect("a hart");
    CellSpec {
        pinned,
        ..super::support::cell_on_hart(name, policy, hart)
    }
}

fn et(share: f64) -> Policy {
    Policy::EventTriggered {
        period: CELL_PERIOD,
        budget: Duration::from_nanos((CELL_PERIOD.as_nanos() as f64 * share) as u64),
    }
}

/// The network share the static run reserves for the video flow: 1.5 times the worst case,
/// one large and eight small streams.
fn static_video_mbps() -> f64 {
    1.5 * f64::from(LARGE.1 + (STREAMS as u32 - 1) * SMALL.1) / 1000.0
}

struct Env<'a> {
    a: &'a ConferenceArgs,
    tess: String,
    dir: PathBuf,
    device: SocketAddr,
    shared: HartSet,
    reserved: HartSet,
}

fn spawn_role(
    env: &Env<'_>,
    role: &str,
    cell: Option<&str>,
    t0: u64,
    extra: &[String],
    envs: &[(&str, &Path)],
) -> anyhow::Result<Guard> {
    let mut cmd = Command::new(&env.tess);
    if let Some(c) = cell {
        cmd.args(["run", "--cell", c, "--", &env.tess]);
    }
    cmd.args(["bench", "conference", "--role", role])
        .args(["--t0", &t0.to_string()])
        .args(["--addr", &env.device.to_string()])
        .args([
            "--out",
            &env.dir.join(format!("{role}.json")).display().to_string(),
        ]);
    if let Some(s) = env.a.secs {
        cmd.args(["--secs", &s.to_string()]);
    }
    if let Some(r) = env.a.resize_every {
        cmd.args(["--resize-every", &r.to_string()]);
    }
    if env.a.common.quick {
        cmd.arg("--quick");
    }
    if role == "video" {
        cmd.args([
            "--video-threads",
            match env.a.video_threads {
                roles::VideoThreads::Stream => "stream",
                roles::VideoThreads::Hart => "hart",
            },
        ]);
    }
    cmd.args(["--cache", &cache_dir(env.a).display().to_string()]);
    cmd.args(extra);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let log = std::fs::File::create(env.dir.join(format!("{role}.log")))?;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log));
    Ok(Guard(Some(cmd.spawn()?)))
}

fn read_out<T: serde::de::DeserializeOwned + Default>(
    env: &Env<'_>,
    role: &str,
) -> anyhow::Result<T> {
    let p = env.dir.join(format!("{role}.json"));
    let bytes = std::fs::read(&p).map_err(|e| {
        let log = std::fs::read_to_string(env.dir.join(format!("{role}.log"))).unwrap_or_default();
        anyhow::anyhow!(
            "the {role} wrote no result ({e}); its log{}: {}",
            if env.a.work_dir.is_some() {
                format!(" ({})", env.dir.display())
            } else {
                String::new()
            },
            log.trim()
        )
    })?;
    Ok(serde_json::from_slice(&bytes)?)
}

fn broker_config(link: f64) -> Config {
    let mut c = Config {
        policy: BrokerPolicy::Pacora,
        // Two rounds a second: a resize is followed within half a second.
        period: Duration::from_millis(500),
        // Twice the video's measured decode demand: a frame's CPU time grows when the cell's
        // budget is small (the indexer runs between its slices and takes the caches), and
        // the decode of a resized stream's IDR frame is several times a P frame's.
        pacora: tess_broker::pacora::policy::PacoraConfig {
            margin: 1.0,
            ..Default::default()
        },
        network: Some(NetworkConfig {
            service: SERVICE_NAME.into(),
            capacity: link,
            // A stream's bit rate varies from second to second around its mean (x264's rate
            // control), and a resize makes one stream four times larger, starting with an IDR
            // frame, for a decision period before the broker sees it.
            margin: Some(0.5),
        }),
        ..Config::default()
    };
    let limits = |floor: f64, ceiling: f64, slope: f64, initial: Option<f64>| CellLimits {
        floor: Some(floor),
        ceiling: Some(ceiling),
        slope: Some(slope),
        initial,
        ..CellLimits::default()
    };
    // The video's lateness costs a hundred times the batch jobs'.
    c.cells
        .insert(VIDEO_CELL.into(), limits(0.05, 0.85, 100.0, None));
    c.cells
        .insert(INDEX_CELL.into(), limits(0.05, 0.85, 1.0, None));
    let half = link / 2.0;
    // Each stream's flow (`conf-video/sK`, under its cell's section): a small stream needs
    // 0.2 Mbit/s, a large one 0.8; each starts at twice a small one's need.
    c.cells.insert(
        format!("{VIDEO_CELL}.net"),
        limits(0.1, link, 100.0, Some(2.0 * f64::from(SMALL.1) / 1000.0)),
    );
    c.cells.insert(
        format!("{HOG_CELL}.net"),
        limits(0.1, link, 1.0, Some(half)),
    );
    c
}

fn run_one(env: &Env<'_>, name: &'static str, s: &mut Session) -> anyhow::Result<RunOut> {
    let a = env.a;
    let tess_run = name != "linux";
    // Whole kbit/s: the service and the broker's pool hold exactly the same capacity.
    let link = (a.link_mbps * SERVICE_FRACTION * 1000.0).floor() / 1000.0;
    let mut out = RunOut {
        name,
        ..Default::default()
    };
    let mut guards: Vec<Guard> = Vec::new();
    let mut service = None;
    if tess_run {
        let pinned = name == "static";
        s.apply(vec![
            cell(
                NET_CELL,
                Policy::BestEffort { weight: 100 },
                &env.shared,
                true,
            ),
            cell(
                HOG_CELL,
                Policy::BestEffort { weight: 100 },
                &env.shared,
                false,
            ),
            cell(
                DISPLAY_CELL,
                Policy::BestEffort { weight: 100 },
                &env.shared,
                false,
            ),
            cell(VIDEO_CELL, et(START_SHARE), &env.reserved, pinned),
            cell(INDEX_CELL, et(START_SHARE), &env.reserved, pinned),
        ])?;
        let ready = env.dir.join("netd.ready");
        let _ = std::fs::remove_file(&ready);
        let netd = Path::new(&env.tess)
            .parent()
            .map(|d| d.join("tess-netd"))
            .unwrap_or_else(|| PathBuf::from("tess-netd"));
        let args: Vec<String> = [
            "--name",
            SERVICE_NAME,
            "--capacity",
            &format!("{:.0}kbit,100kpps", link * 1000.0),
            "--wait",
            "epoll",
            // TCP is read in link-MTU chunks: each read is charged to its flow, and a 64 KiB
            // read would hold a limited flow back for a long time in one piece.
            "--max-datagram",
            "1500",
            // Each flow's backlog waits at the sender, not in the cable's queue ahead of the
            // others (tess-netd --help).
            "--tcp-rcvbuf",
            "32768",
            "--ready-file",
            &ready.display().to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let log = std::fs::File::create(env.dir.join(format!("netd-{name}.log")))?;
        let mut g = Guard(Some(cells::spawn_in_cell(
            Path::new(&env.tess),
            NET_CELL,
            &netd,
            &args,
            Stdio::null(),
            Stdio::from(log),
        )?));
        anyhow::ensure!(
            cells::wait_ready(&ready, &mut g, Duration::from_secs(20)),
            "tess-netd did not start; see {}",
            env.dir.join(format!("netd-{name}.log")).display()
        );
        service = Some(g);
        if name == "static" {
            use tess_broker::service::Flows;
            let mut flows = tess_broker::service::NetService::named(SERVICE_NAME);
            let v = static_video_mbps();
            flows.set(VIDEO_CELL, v)?;
            flows.set(HOG_CELL, link - v)?;
        }
    }
    let sock = env.dir.join(format!("broker-{name}.sock"));
    let mut broker = None;
    let mut listener = None;
    if name == "pacora" {
        let l = tess_heartbeat::register::Listener::bind(&sock)?;
        l.set_nonblocking(true)?;
        listener = Some(l);
        broker = Some(Broker::new(broker_config(link), Tessd::new()));
    }
    // Room to start, connect and load the corpus before the first release.
    let t0 = now_ns() + 4_000_000_000;
    let sched = schedule(a, t0);
    let sender = {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", NETNS, &env.tess, "bench", "conference"]);
        cmd.args(["--role", "sender", "--t0", &t0.to_string()])
            .args(["--addr", &env.device.to_string()])
            .args(["--secs", &sched.secs.to_string()])
            .args(["--resize-every", &sched.resize_every.to_string()])
            .args(["--cache", &cache_dir(a).display().to_string()]);
        let log = std::fs::File::create(env.dir.join(format!("sender-{name}.log")))?;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log));
        Guard(Some(cmd.spawn()?))
    };
    guards.push(sender);
    let svc: Vec<String> = if tess_run {
        vec!["--net-service".into(), SERVICE_NAME.into()]
    } else {
        vec![]
    };
    let envs: Vec<(&str, &Path)> = vec![("TESS_BROKER_SOCKET", sock.as_path())];
    let cell_of = |c: &'static str| tess_run.then_some(c);
    // The display first: the video cell's streams connect to it when they start.
    let roles_started = [
        ("display", cell_of(DISPLAY_CELL)),
        ("video", cell_of(VIDEO_CELL)),
        ("hog", cell_of(HOG_CELL)),
        ("indexer", cell_of(INDEX_CELL)),
    ];
    let mut role_guards = Vec::new();
    for (role, c) in roles_started {
        let _ = std::fs::remove_file(env.dir.join(format!("{role}.json")));
        let mut extra = svc.clone();
        if role == "video" && name == "pacora" {
            // The paper's shape: each stream a flow of its own, brokered on its own. (The
            // static run cannot: nine flows each reserved for a large stream do not fit the
            // link, so it reserves the cell's one flow for the worst case.)
            extra.push("--stream-flows".into());
        }
        role_guards.push(spawn_role(env, role, c, t0, &extra, &envs)?);
    }
    // The broker's loop (pacora), and a sample of the allocations every second.
    let end = sched.end_ns() + roles::GRACE_NS + roles::WRAP_UP_NS;
    let mut trace = vec!["t_s,heartbeat,resource,rate,tau_ms,from,to,reason,note".to_string()];
    let mut next_sample = t0;
    while now_ns() < end {
        if let (Some(b), Some(l)) = (broker.as_mut(), listener.as_ref()) {
            while let Ok(Some(inc)) = l.accept() {
                b.admit(inc);
            }
            b.reap();
            if b.decide_due() {
                let t = now_ns().saturating_sub(t0) as f64 / 1e9;
                for c in b.status().cells {
                    if let Some(d) = c.decisions.last() {
                        trace.push(format!(
                            "{t:.2},{},{},{:.2},{},{:.4},{:.4},{},\"{}\"",
                            c.heartbeat,
                            c.resource,
                            d.rate,
                            c.measured_tau_ms
                                .map_or(String::new(), |x| format!("{x:.2}")),
                            d.from,
                            d.to,
                            d.reason,
                            d.note
                        ));
                    }
                }
            }
        }
        let now = now_ns();
        if now >= next_sample && now < sched.end_ns() {
            next_sample += 1_000_000_000;
            let t = (now - t0) as f64 / 1e9;
            let alloc = match broker.as_ref() {
                Some(b) => {
                    let st = b.status();
                    // A cell's shares of a resource, summed (the video's streams' flows); NaN
                    // while it has none.
                    let get = |cell: &str, res: &str| {
                        let shares: Vec<f64> = st
                            .cells
                            .iter()
                            .filter(|c| c.cell == cell && c.resource == res)
                            .map(|c| c.share)
                            .collect();
                        if shares.is_empty() {
                            f64::NAN
                        } else {
                            shares.iter().sum()
                        }
                    };
                    let streams = (0..STREAMS)
                        .map(|k| {
                            let flow = format!("{VIDEO_CELL}/{}", roles::stream_flow(k));
                            st.cells
                                .iter()
                                .find(|c| c.flow.as_deref() == Some(flow.as_str()))
                                .map_or(f64::NAN, |c| c.share)
                        })
                        .collect();
                    out.stream_net.push((t, streams));
                    [
                        get(VIDEO_CELL, "cpu"),
                        get(INDEX_CELL, "cpu"),
                        get(VIDEO_CELL, "net"),
                        get(HOG_CELL, "net"),
                    ]
                }
                None if tess_run => [
                    START_SHARE,
                    START_SHARE,
                    static_video_mbps(),
                    link - static_video_mbps(),
                ],
                None => [f64::NAN; 4],
            };
            out.alloc.push((t, alloc));
        }
        if role_guards.iter_mut().all(|g| g.exited()) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if broker.is_some() {
        std::fs::write(env.dir.join("broker-trace.csv"), trace.join("\n") + "\n")?;
    }
    if let Some(b) = broker.as_ref() {
        let st = b.status();
        for c in &st.cells {
            if let Some(d) = c.decisions.last() {
                out.notes.push(format!(
                    "{name}: {} ({}) last decision {} -> {:.3} ({}{})",
                    c.heartbeat,
                    c.resource,
                    d.from,
                    d.to,
                    d.reason,
                    if d.note.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", d.note)
                    }
                ));
            }
        }
        for r in &st.refused {
            out.notes.push(format!("{name}: broker refused {r}"));
        }
    }
    for g in role_guards.iter_mut() {
        g.stop(Duration::from_secs(2));
    }
    for g in guards.iter_mut() {
        g.stop(Duration::from_secs(2));
    }
    if let Some(mut g) = service {
        g.stop(Duration::from_secs(2));
    }
    if tess_run {
        s.delete(&[VIDEO_CELL, INDEX_CELL, HOG_CELL, DISPLAY_CELL, NET_CELL]);
    }
    let _ = std::fs::remove_file(&sock);
    // What the frames did, the display measured; the video cell reports its threads' errors.
    let video: roles::VideoOut = read_out(env, "video")?;
    out.video = read_out(env, "display")?;
    out.video.errors.extend(video.errors);
    out.hog = read_out(env, "hog")?;
    out.index = read_out(env, "indexer")?;
    out.notes.extend(
        out.video
            .errors
            .iter()
            .map(|e| format!("{name}: video {e}")),
    );
    Ok(out)
}

/// Windows that count: after the warm-up, not within a second after a resize, before the end.
fn counted_windows(sched: &Schedule) -> Vec<usize> {
    let resizes = sched.resizes();
    (WARMUP_WINDOWS..sched.secs.floor() as usize)
        .filter(|&w| {
            let (lo, hi) = (w as f64, w as f64 + 1.0);
            // Out: a window overlapping [resize, resize + 1 s).
            !resizes.iter().any(|&r| lo < r + 1.0 && hi > r)
        })
        .collect()
}

/// Whether every stream met its frame rate in window `w`.
fn window_ok(v: &roles::VideoOut, w: usize) -> bool {
    v.on_time
        .get(w)
        .is_some_and(|row| row.len() == STREAMS && row.iter().all(|&n| n >= FRAMES_OK))
}

struct Figures {
    fps_ok: f64,
    hog_share: f64,
    index_mbs: f64,
    min_fps: Vec<f64>,
}

fn figures(r: &RunOut, sched: &Schedule, link_mbps: f64) -> Figures {
    let counted = counted_windows(sched);
    let n = counted.len().max(1) as f64;
    let ok = counted.iter().filter(|&&w| window_ok(&r.video, w)).count() as f64;
    let hog: f64 = counted
        .iter()
        .map(|&w| r.hog.bytes.get(w).copied().unwrap_or(0) as f64 * 8.0 / 1e6)
        .sum::<f64>()
        / n;
    let index: f64 = counted
        .iter()
        .map(|&w| r.index.bytes.get(w).copied().unwrap_or(0) as f64 / 1e6)
        .sum::<f64>()
        / n;
    let min_fps = (0..sched.secs.floor() as usize)
        .map(|w| {
            r.video
                .on_time
                .get(w)
                .map_or(0.0, |row| row.iter().copied().min().unwrap_or(0) as f64)
        })
        .collect();
    Figures {
        fps_ok: ok / n,
        hog_share: hog / link_mbps,
        index_mbs: index,
        min_fps,
    }
}

/// Runs the benchmark.
pub fn run(a: &ConferenceArgs) -> anyhow::Result<Report> {
    if let Some(role) = a.role.clone() {
        return run_role(a, &role);
    }
    let need = static_video_mbps() / SERVICE_FRACTION;
    anyhow::ensure!(
        a.link_mbps > need && a.link_mbps.is_finite(),
        "--link-mbps must be above {need:.2} (the static run reserves {:.2} Mbit/s of the service's {:.0}% of the link for the video)",
        static_video_mbps(),
        SERVICE_FRACTION * 100.0
    );
    for (what, v) in [("--secs", a.secs), ("--resize-every", a.resize_every)] {
        if let Some(v) = v {
            anyhow::ensure!(
                v.is_finite() && v > 0.0 && v <= 3600.0,
                "{what} takes seconds in (0, 3600], not {v}"
            );
        }
    }
    for r in &a.runs {
        anyhow::ensure!(
            ["linux", "static", "pacora"].contains(&r.as_str()),
            "unknown run {r:?} (linux, static, pacora)"
        );
    }
    let mut s = Session::connect()?;
    let status = s.status()?;
    let managed = status.managed.clone();
    anyhow::ensure!(
        managed.len() >= 2,
        "the conference needs 2 managed harts (tessd manages {managed})"
    );
    let reserved = HartSet::single(managed.iter().last().expect("two harts"));
    let shared = HartSet::single(managed.first().expect("two harts"));
    let tmp = tempfile::tempdir()?;
    let dir = match &a.work_dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            d.clone()
        }
        None => tmp.path().to_path_buf(),
    };
    ensure_clips(&cache_dir(a), &schedule(a, 0))?;
    super::decoders::avcodec_lib()?;
    let pair = tess_music::netns::NetnsPair::create_on_free_prefix(NETNS)?;
    // The cable: a token bucket at the link rate (bytes/s), a 16 KiB bucket.
    pair.pace_device((a.link_mbps * 1e6 / 8.0) as u64, 16 * 1024)?;
    let env = Env {
        a,
        tess: tess_exe(),
        dir,
        device: SocketAddr::new(pair.device_addr.into(), PORT),
        shared,
        reserved,
    };
    let mut runs = Vec::new();
    for name in ["linux", "static", "pacora"] {
        if a.runs.iter().any(|r| r == name) {
            runs.push(run_one(&env, name, &mut s)?);
        }
    }
    drop(pair);
    let sched = schedule(a, 0);
    report(a, &env, &runs, &sched)
}

fn report(
    a: &ConferenceArgs,
    env: &Env<'_>,
    runs: &[RunOut],
    sched: &Schedule,
) -> anyhow::Result<Report> {
    let mut r = Report::new("conference");
    let mut t = Table::new(
        format!(
            "9 streams x 30 fps (320x180 {} kbit/s; one at a time 640x360 {} kbit/s, resized every {} s), indexer, hog; link {} Mbit/s; {} s per run",
            SMALL.1, LARGE.1, sched.resize_every, a.link_mbps, sched.secs
        ),
        &[
            "run",
            "windows with every stream at >= 29 fps",
            "hog Mbit/s (share of link)",
            "indexer MB/s",
            "frame latency p50 / p99 / max ms",
            "transfer p50 / p99 ms",
            "decode p50 / p99 ms",
        ],
    );
    let link = a.link_mbps;
    for run in runs {
        let f = figures(run, sched, link);
        let v = &run.video;
        t.row(&[
            run.name.to_string(),
            format!("{:.3}", f.fps_ok),
            format!("{:.2} ({:.3})", f.hog_share * link, f.hog_share),
            format!("{:.2}", f.index_mbs),
            format!(
                "{:.1} / {:.1} / {:.1}",
                v.e2e_ms[0], v.e2e_ms[1], v.e2e_ms[2]
            ),
            format!("{:.1} / {:.1}", v.transfer_ms[0], v.transfer_ms[1]),
            format!("{:.1} / {:.1}", v.decode_ms[0], v.decode_ms[1]),
        ]);
        let prefix = match run.name {
            "pacora" => String::new(),
            n => format!("{n}_"),
        };
        r.figure(format!("{prefix}fps_ok_fraction"), f.fps_ok);
        r.figure(format!("{prefix}hog_bandwidth_share"), f.hog_share);
        r.figure(format!("{prefix}indexer_throughput"), f.index_mbs);
        r.figure(format!("{prefix}frame_p99_ms"), v.e2e_ms[1]);
        if run.name == "pacora" {
            let counted = counted_windows(sched);
            let mean = |k: usize| {
                let xs: Vec<f64> = run
                    .alloc
                    .iter()
                    .filter(|(t, _)| counted.contains(&(t.floor() as usize)))
                    .map(|(_, x)| x[k])
                    .filter(|x| x.is_finite())
                    .collect();
                Summary::of(&xs).mean
            };
            r.figure("video_cpu_share_mean", mean(0));
            r.figure("indexer_cpu_share_mean", mean(1));
            r.figure("video_net_mbps_mean", mean(2));
            r.figure("hog_net_mbps_mean", mean(3));
            r.target(
                "fps_ok_fraction >= 0.99",
                f.fps_ok >= 0.99,
                format!("{:.3}", f.fps_ok),
            );
        }
        for n in &run.notes {
            r.note(n.clone());
        }
        r.note(format!(
            "{}: indexer {} threads over {} documents ({:.1} MB of text)",
            run.name,
            run.index.threads,
            run.index.corpus.0,
            run.index.corpus.1 as f64 / 1e6
        ));
    }
    r.table(t);
    r.note(format!(
        "hart layout: hart {} holds the network service's cell {NET_CELL} (best effort, epoll), the hog's cell {HOG_CELL} and the display's {DISPLAY_CELL} (best effort, the frame sink: a nameserver service the video streams send their frames to over channels), the sender (test equipment in netns {NETNS}) and the broker; hart {} holds {VIDEO_CELL} and {INDEX_CELL} (event-triggered, {} ms period, {START_SHARE} of the hart each to start). linux: the same programs without cells or the service",
        env.shared,
        env.reserved,
        CELL_PERIOD.as_millis()
    ));
    r.note(format!(
        "static: video flow reserved {:.2} Mbit/s (1.5 x one large + eight small), the hog limited to the rest of the service's {:.2} Mbit/s",
        static_video_mbps(),
        a.link_mbps * SERVICE_FRACTION
    ));
    r.note("seed 004 section 6.2: the videos stay at 30 fps except while resizing; PACORA gives the hog the bandwidth the small videos leave and the indexer the cores the video cell does not need");
    let svg_path = a
        .svg
        .clone()
        .unwrap_or_else(|| cache_dir(a).join("conference.svg"));
    std::fs::write(&svg_path, svg(runs, sched, link))?;
    r.note(format!(
        "allocations and frame rates over time: {}",
        svg_path.display()
    ));
    Ok(r)
}

/// The paper's Fig. 7: (a) network allocations, (b) CPU allocations (PACORA), (c) the slowest
/// stream's on-time frames per window, every run.
fn svg(runs: &[RunOut], sched: &Schedule, link: f64) -> String {
    let (w, h, pad) = (800.0, 200.0, 40.0);
    let tmax = sched.secs.max(1.0);
    let x = |t: f64| pad + t / tmax * (w - 2.0 * pad);
    let y = |y0: f64, v: f64, max: f64| y0 + h - pad - (v / max).clamp(0.0, 1.05) * (h - 2.0 * pad);
    let line = |pts: Vec<(f64, f64)>, y0: f64, max: f64, color: &str, width: u32| {
        let p: Vec<String> = pts
            .iter()
            .filter(|(_, v)| v.is_finite())
            .map(|&(t, v)| format!("{:.1},{:.1}", x(t), y(y0, v, max)))
            .collect();
        format!(
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"{width}\" points=\"{}\"/>\n",
            p.join(" ")
        )
    };
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"12\">\n",
        3.0 * h
    );
    let pacora = runs.iter().find(|r| r.name == "pacora");
    out += &format!("<text x=\"{pad}\" y=\"20\">(a) network, Mbit/s of {link}: the video's flows blue (each stream's thin, their sum thick), hog red (PACORA)</text>\n");
    out += &format!("<text x=\"{pad}\" y=\"{}\">(b) CPU, share of the hart: video blue, indexer green (PACORA)</text>\n", h + 20.0);
    out += &format!("<text x=\"{pad}\" y=\"{}\">(c) slowest stream's on-time frames per second: PACORA blue, static grey, linux orange; 30 dashed; x: time, {tmax:.0} s, resizes dotted</text>\n", 2.0 * h + 20.0);
    if let Some(p) = pacora {
        let series = |k: usize| p.alloc.iter().map(|(t, a)| (*t, a[k])).collect::<Vec<_>>();
        for k in 0..STREAMS {
            let pts = p
                .stream_net
                .iter()
                .map(|(t, s)| (*t, s.get(k).copied().unwrap_or(f64::NAN)))
                .collect();
            out += &line(pts, 0.0, link, "lightblue", 1);
        }
        out += &line(series(2), 0.0, link, "blue", 2);
        out += &line(series(3), 0.0, link, "red", 2);
        out += &line(series(0), h, 1.0, "blue", 2);
        out += &line(series(1), h, 1.0, "green", 2);
    }
    for (name, color) in [("pacora", "blue"), ("static", "grey"), ("linux", "orange")] {
        if let Some(run) = runs.iter().find(|r| r.name == name) {
            let f = figures(run, sched, link);
            let pts = f
                .min_fps
                .iter()
                .enumerate()
                .map(|(i, &v)| (i as f64 + 0.5, v))
                .collect();
            out += &line(pts, 2.0 * h, 32.0, color, 2);
        }
    }
    let ty = y(2.0 * h, 30.0, 32.0);
    out += &format!(
        "<line x1=\"{pad}\" x2=\"{}\" y1=\"{ty:.1}\" y2=\"{ty:.1}\" stroke=\"red\" stroke-dasharray=\"4\"/>\n",
        w - pad
    );
    for t in sched.resizes() {
        out += &format!(
            "<line x1=\"{0:.1}\" x2=\"{0:.1}\" y1=\"0\" y2=\"{1}\" stroke=\"#999\" stroke-dasharray=\"1,3\"/>\n",
            x(t),
            3.0 * h
        );
    }
    out += "</svg>\n";
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_after_resizes_and_the_warm_up_are_not_counted() {
        let s = Schedule {
            t0_ns: 0,
            secs: 20.0,
            resize_every: 8.0,
        };
        let c = counted_windows(&s);
        assert_eq!(c.first(), Some(&3));
        assert!(!c.contains(&8) && !c.contains(&16));
        assert!(c.contains(&7) && c.contains(&9) && c.contains(&19));
        assert!(!c.contains(&20));
    }

    #[test]
    fn a_window_is_met_only_when_every_stream_shows_29_frames() {
        let mut v = roles::VideoOut {
            on_time: vec![vec![30; STREAMS], vec![30; STREAMS]],
            ..Default::default()
        };
        v.on_time[1][4] = 28;
        assert!(window_ok(&v, 0));
        assert!(!window_ok(&v, 1));
        assert!(!window_ok(&v, 2));
    }
}
