//! The programs of the conference experiment, each started by the bench as `tess bench
//! conference --role NAME` (in its cell through `tess run`, or plainly for the Linux baseline):
//!
//! - `sender`: the remote sites, test equipment in the device's network namespace. It serves
//!   nine video streams (pre-encoded H.264 access units, one per frame, released at 30 fps on
//!   a common clock) and one bulk download for the hog, over TCP.
//! - `video`: the video cell. Its threads receive frames (through the network service, or a
//!   kernel socket in the baseline), decode them with libavcodec, beat the cell's heartbeats
//!   and hand a record of each frame to the display over a channel.
//! - `display` (module `display`): the frame sink, a service in a cell of its own.
//! - `hog`: the bandwidth hog, a download as fast as the link allows.
//! - `indexer`: a parallel file indexer over real text (one thread per hart of its cell).
//!
//! Every role starts its work at the same instant `t0` (`CLOCK_MONOTONIC`, ns) and stops `secs`
//! later; what it measured goes to `--out` as JSON, counted in 1 s windows from `t0`.

use super::display::{self, Shown};
use super::wire::{FrameHeader, Schedule, HEADER_LEN, HOG_HELLO, STREAMS};
use crate::net_stream::NetStream;
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tess_heartbeat::clock::now_ns;
use tess_heartbeat::{Heartbeat, Target};

/// A frame is on time when it is decoded within this time of its release (the display
/// deadline: a conference client's playout delay).
pub const PLAYOUT_NS: u64 = 100_000_000;
/// The video cell's CPU heartbeat target (and its one flow heartbeat's without
/// `--stream-flows`): frames at the rate they are sent, 9 x 30 a second. Each CPU beat carries
/// a frame's decode CPU time, each flow beat a frame's size as its header arrives: the broker
/// sizes the cell's share and its flows from these demands.
pub const FRAME_TARGET: Duration = Duration::from_nanos(1_000_000_000 / (STREAMS as u64 * 30));
/// A stream's own target (`--stream-flows`): 30 frames a second.
pub const STREAM_FRAME_TARGET: Duration = Duration::from_nanos(1_000_000_000 / 30);
/// Heartbeat names (the `.net` suffix: the broker's network resource).
pub const VIDEO_CPU_HB: &str = "conf-video";
/// See [`VIDEO_CPU_HB`]: the cell's one flow, all streams together.
pub const VIDEO_NET_HB: &str = "conf-video.net";

/// The flow label of stream `k` (`--stream-flows`): its connection's flow at the network
/// service is `cell:conf-video/sK`.
pub fn stream_flow(k: usize) -> String {
    format!("s{k}")
}

/// The heartbeat of stream `k`'s flow (`--stream-flows`), `conf-video@sK.net`: the broker
/// gives each stream a share of the link of its own (seed 004 section 6.2).
pub fn stream_net_hb(k: usize) -> String {
    format!("{VIDEO_CPU_HB}@{}.net", stream_flow(k))
}
/// The hog's heartbeat: one beat per [`HOG_CHUNK`] received.
pub const HOG_HB: &str = "conf-hog.net";
/// The indexer's heartbeat: one beat per [`INDEX_UNIT`] bytes of text indexed (documents
/// differ in size by three orders of magnitude; a unit of bytes gives a steady rate).
pub const INDEX_HB: &str = "conf-index";
/// Bytes of text per indexer beat.
pub const INDEX_UNIT: usize = 64 * 1024;
/// Bytes per hog beat and per hog write.
pub const HOG_CHUNK: usize = 64 * 1024;
/// A target no cell meets: the hog and the indexer take what the others leave.
const INSATIABLE: Duration = Duration::from_micros(1);

fn sleep_until(t_ns: u64) {
    let now = now_ns();
    if t_ns > now {
        std::thread::sleep(Duration::from_nanos(t_ns - now));
    }
}

pub(super) fn window_of(t_ns: u64, t0: u64) -> Option<usize> {
    t_ns.checked_sub(t0).map(|d| (d / 1_000_000_000) as usize)
}

pub(super) fn bump<T: Default + Clone>(v: &mut Vec<T>, w: usize) -> &mut T {
    if v.len() <= w {
        v.resize(w + 1, T::default());
    }
    &mut v[w]
}

// ---------------------------------------------------------------------------------------------
// sender

/// Serves the streams and the hog on `listen` until `t0 + secs`.
pub fn sender(
    listen: SocketAddr,
    sched: Schedule,
    small: Vec<Vec<u8>>,
    large: Vec<Vec<u8>>,
) -> anyhow::Result<()> {
    let l = std::net::TcpListener::bind(listen)?;
    let clips = Arc::new([small, large]);
    let mut threads = Vec::new();
    for _ in 0..=STREAMS {
        let (mut c, _) = l.accept()?;
        let mut hello = [0u8; 1];
        c.read_exact(&mut hello)?;
        let clips = clips.clone();
        threads.push(std::thread::spawn(move || {
            if hello[0] == HOG_HELLO {
                hog_source(c, sched)
            } else {
                let _ = c.set_nodelay(true);
                stream_source(c, usize::from(hello[0]), sched, &clips)
            }
        }));
    }
    for t in threads {
        // A receiver that hung up ends its stream; the others go on.
        let _ = t.join();
    }
    Ok(())
}

fn stream_source(
    mut c: std::net::TcpStream,
    stream: usize,
    sched: Schedule,
    clips: &[Vec<Vec<u8>>; 2],
) -> anyhow::Result<()> {
    anyhow::ensure!(stream < STREAMS, "stream {stream} out of range");
    let mut pos = 0usize;
    let mut was_large = false;
    let mut msg = Vec::new();
    for seq in 0u32.. {
        let release = sched.release_ns(stream, seq);
        if release >= sched.end_ns() {
            break;
        }
        sleep_until(release);
        let large = sched.large_at(release) == Some(stream);
        if large != was_large {
            // A resize: the other encoding, from its IDR frame.
            pos = 0;
            was_large = large;
        }
        let clip = &clips[usize::from(large)];
        let au = &clip[pos % clip.len()];
        pos += 1;
        msg.clear();
        msg.extend_from_slice(
            &FrameHeader {
                seq,
                release_ns: release,
                large,
                stream: stream as u8,
                len: au.len() as u32,
            }
            .encode(),
        );
        msg.extend_from_slice(au);
        c.write_all(&msg)?;
    }
    Ok(())
}

fn hog_source(mut c: std::net::TcpStream, sched: Schedule) -> anyhow::Result<()> {
    let buf = vec![0x5au8; HOG_CHUNK];
    sleep_until(sched.t0_ns);
    while now_ns() < sched.end_ns() {
        c.write_all(&buf)?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// receivers: a TCP stream through the network service or the kernel

/// Connects to `to`, through the service named `service` if any (in its flow labelled `flow`,
/// if any), and says `hello`. A refused connection is tried again for up to 10 s (the sender
/// may still be loading its clips).
pub fn open_conn(
    to: SocketAddr,
    service: Option<&str>,
    flow: Option<&str>,
    hello: u8,
) -> anyhow::Result<NetStream> {
    let give_up = now_ns() + 10_000_000_000;
    loop {
        let conn = match service {
            Some(s) => {
                let net = tess_net::client::Net::named(s);
                let net = match flow {
                    Some(f) => net.flow(f),
                    None => net,
                };
                NetStream::through(&net, to)
            }
            None => NetStream::kernel(to),
        };
        match conn {
            Ok(mut c) => {
                c.write_all(&[hello])?;
                return Ok(c);
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused && now_ns() < give_up => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(anyhow::anyhow!("connecting to {to}: {e}")),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// video

/// What the video cell measured.
#[derive(serde::Serialize, serde::Deserialize, Debug, Default)]
pub struct VideoOut {
    /// Per 1 s window (by release time), per stream: frames decoded by their display deadline.
    pub on_time: Vec<Vec<u32>>,
    /// Per window, per stream: frames released that reached the sink.
    pub frames: Vec<Vec<u32>>,
    /// Release to decoded, ms: p50, p99, max over all frames.
    pub e2e_ms: [f64; 3],
    /// Release to received, ms: p50, p99.
    pub transfer_ms: [f64; 2],
    /// Received to decoded, ms: p50, p99.
    pub decode_ms: [f64; 2],
    /// Errors of the video cell's stream threads and of the display.
    pub errors: Vec<String>,
}

/// Receives and decodes the nine streams until the sender stops; returns the errors of its
/// threads (what the frames did, the display measures).
///
/// One kernel thread per hart of the cell (as Pulse runs one per hart) serves the streams
/// `k = j (mod harts)`: it reads whatever has arrived on their connections without blocking,
/// decodes the complete frames earliest release first (every stream has the same display
/// delay, so that is earliest deadline first), hands each to the display, and sleeps a
/// millisecond when there is nothing to do. The paper gives each stream a Pulse thread of its
/// own under the cell's EDF scheduler; what matters for the cell's reservation is the same:
/// the work of all the streams is done by as many kernel threads as the cell has harts, so
/// the budget goes where the frames are. (Nine receiving threads and a decoding one were
/// tried first: each receiver woke often enough to count as working, the cell's budget was
/// split among them evenly, and the decoder got 40% of it. A thread per stream that sleeps in
/// read, `--video-threads stream`, still fails under PACORA with tessd's split by demand: the
/// cell's budget covers the streams' mean need, nine per-thread reservations cannot lend each
/// other their slack, and each small stream's bursty peak plus headroom already asks for more
/// than its even share, so the large stream's thread is held to an even share and falls behind.)
///
/// With `stream_flows`, each stream's connection is a flow of its own at the network service
/// (flow label [`stream_flow`]) with a heartbeat of its own ([`stream_net_hb`]), so that the
/// broker gives each stream its own share of the link, as the paper does; otherwise the
/// streams share the cell's flow and one heartbeat ([`VIDEO_NET_HB`]).
pub fn video(
    to: SocketAddr,
    service: Option<&str>,
    sched: Schedule,
    threads: VideoThreads,
    stream_flows: bool,
) -> anyhow::Result<VideoOut> {
    let lib = super::super::decoders::avcodec_lib()?;
    let cpu = Arc::new(Heartbeat::register(
        VIDEO_CPU_HB,
        Some(Target::PerUnit(FRAME_TARGET)),
    )?);
    let cell_net = match stream_flows {
        true => None,
        false => Some(Arc::new(Heartbeat::register(
            VIDEO_NET_HB,
            Some(Target::PerUnit(FRAME_TARGET)),
        )?)),
    };
    let harts = match threads {
        VideoThreads::Stream => STREAMS,
        VideoThreads::Hart => tess_sched::affinity::get_affinity(0)
            .map(|h| h.len())
            .unwrap_or(1)
            .clamp(1, STREAMS),
    };
    let mut groups: Vec<Vec<StreamIn>> = (0..harts).map(|_| Vec::new()).collect();
    for k in 0..STREAMS {
        let sink = display::connect(sched.t0_ns)?;
        let (flow, net) = match &cell_net {
            Some(hb) => (None, hb.clone()),
            None => {
                let hb = Heartbeat::register(
                    &stream_net_hb(k),
                    Some(Target::PerUnit(STREAM_FRAME_TARGET)),
                )?;
                (Some(stream_flow(k)), Arc::new(hb))
            }
        };
        let mut conn = open_conn(to, service, flow.as_deref(), k as u8)?;
        // A thread of its own sleeps in read until data comes; a thread serving several
        // streams polls them.
        let blocking = threads == VideoThreads::Stream;
        if blocking {
            conn.set_read_timeout(Duration::from_millis(50))?;
        } else {
            conn.set_nonblocking()?;
        }
        groups[k % harts].push(StreamIn {
            stream: k,
            conn,
            net,
            announced: None,
            decoder: lib.decoder()?,
            sink,
            bytes: Vec::new(),
            frames: VecDeque::new(),
            open: true,
            blocking,
        });
    }
    let mut threads = Vec::new();
    for group in groups {
        let cpu = cpu.clone();
        threads.push(std::thread::spawn(move || {
            serve_streams(group, &cpu, sched)
        }));
    }
    let mut out = VideoOut::default();
    // The threads end when their streams hang up, or a grace period after the last release; a
    // thread still running half the wrap-up later is stuck, and the report must be written
    // before the bench stops this process.
    let give_up = sched.end_ns() + GRACE_NS + WRAP_UP_NS / 2;
    for (j, t) in threads.into_iter().enumerate() {
        while !t.is_finished() && now_ns() < give_up {
            std::thread::sleep(Duration::from_millis(200));
        }
        if !t.is_finished() {
            out.errors
                .push(format!("stream thread {j}: still running at the end"));
            continue;
        }
        match t.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => out.errors.push(format!("stream thread {j}: {e:#}")),
            Err(_) => out.errors.push(format!("stream thread {j}: panicked")),
        }
    }
    Ok(out)
}

/// How the video cell's streams map to its threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum VideoThreads {
    /// A thread per stream, receiving and decoding it (the paper's shape).
    Stream,
    /// A thread per hart of the cell, each serving its share of the streams earliest release
    /// first.
    Hart,
}

/// One incoming stream, as its thread holds it.
struct StreamIn {
    stream: usize,
    conn: NetStream,
    /// The heartbeat of the stream's flow (its own, or the cell's).
    net: Arc<Heartbeat>,
    /// The frame whose arrival was beaten already (on its header).
    announced: Option<u32>,
    decoder: super::super::decoders::avcodec::Decoder,
    sink: tess_channel::Endpoint,
    /// Bytes received and not yet parsed into frames.
    bytes: Vec<u8>,
    /// Complete frames waiting to be decoded, with their arrival times.
    frames: VecDeque<(FrameHeader, Vec<u8>, u64)>,
    open: bool,
    /// Reads wait (with a timeout) instead of returning at once: the stream has its thread.
    blocking: bool,
}

impl StreamIn {
    /// Reads what has arrived and queues the complete frames; returns whether anything came.
    fn poll(&mut self, buf: &mut [u8]) -> anyhow::Result<bool> {
        let mut got = false;
        while self.open {
            match self.conn.read(buf) {
                Ok(0) => self.open = false,
                Ok(n) => {
                    got = true;
                    self.bytes.extend_from_slice(&buf[..n]);
                    if self.blocking {
                        // what came is handled before waiting for more
                        break;
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    break
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        let now = now_ns();
        let mut used = 0;
        while self.bytes.len() - used >= HEADER_LEN {
            let head: &[u8; HEADER_LEN] = self.bytes[used..used + HEADER_LEN]
                .try_into()
                .expect("a header's bytes");
            let h = FrameHeader::decode(head)?;
            anyhow::ensure!(
                usize::from(h.stream) == self.stream,
                "a frame of stream {} on stream {}'s connection",
                h.stream,
                self.stream
            );
            // The flow's beat carries the frame's size as soon as its header is in: a
            // resized stream's first large frames arrive through its old, small share, and
            // the broker learns the new demand without waiting for them to finish.
            if self.announced != Some(h.seq) {
                self.announced = Some(h.seq);
                self.net.beat_with(u64::from(h.len) + HEADER_LEN as u64);
            }
            let end = used + HEADER_LEN + h.len as usize;
            if self.bytes.len() < end {
                break;
            }
            self.frames
                .push_back((h, self.bytes[used + HEADER_LEN..end].to_vec(), now));
            used = end;
        }
        self.bytes.drain(..used);
        Ok(got)
    }
}

/// A stream thread: polls its streams and decodes earliest release first, until all have
/// ended (or the grace period after the last release has passed).
fn serve_streams(
    mut streams: Vec<StreamIn>,
    cpu: &Heartbeat,
    sched: Schedule,
) -> anyhow::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut errors = Vec::new();
    loop {
        let mut busy = false;
        for s in streams.iter_mut() {
            if s.blocking && !s.frames.is_empty() {
                // decode what is queued before waiting in read for more
                continue;
            }
            // A corrupt or failed stream ends alone; the thread's other streams go on.
            match s.poll(&mut buf) {
                Ok(got) => busy |= got,
                Err(e) => {
                    errors.push(format!("stream {}: {e:#}", s.stream));
                    s.open = false;
                    s.bytes.clear();
                }
            }
        }
        let next = streams
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.frames.front().map(|f| (f.0.release_ns, i)))
            .min();
        if let Some((_, i)) = next {
            let s = &mut streams[i];
            let (h, au, arrival) = s.frames.pop_front().expect("a frame");
            let cpu0 = super::super::decoders::thread_cpu_ns();
            if let Err(e) = s.decoder.decode(&au) {
                errors.push(format!("stream {}: {e:#}", s.stream));
                s.open = false;
                s.frames.clear();
                continue;
            }
            let done = now_ns();
            // The beat's value is the frame's CPU time: the broker's model of the cell's CPU
            // (its size went to the flow's heartbeat as it arrived).
            cpu.beat_with((super::super::decoders::thread_cpu_ns() - cpu0).max(1));
            let shown = Shown {
                stream: h.stream,
                release_ns: h.release_ns,
                arrival_ns: arrival,
                done_ns: done,
            };
            // The display drains every 100 ms; a ring full for a second means it died.
            s.sink
                .send_timeout(&shown.encode(), Duration::from_secs(1))
                .map_err(|e| anyhow::anyhow!("display: {e}"))?;
            continue;
        }
        if streams.iter().all(|s| !s.open) || now_ns() > sched.end_ns() + GRACE_NS {
            anyhow::ensure!(errors.is_empty(), "{}", errors.join("; "));
            return Ok(());
        }
        if !busy && !streams.iter().all(|s| s.blocking) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// How long after the last release the receivers wait for what is still on its way.
pub const GRACE_NS: u64 = 3_000_000_000;
/// After the grace period, how long the bench waits for the roles to write their reports
/// before it stops them.
pub const WRAP_UP_NS: u64 = 2_000_000_000;

// ---------------------------------------------------------------------------------------------
// hog

/// What the hog received: bytes per 1 s window.
#[derive(serde::Serialize, serde::Deserialize, Debug, Default)]
pub struct HogOut {
    /// Bytes received per window.
    pub bytes: Vec<u64>,
}

/// Downloads as fast as the link allows until the sender stops.
pub fn hog(to: SocketAddr, service: Option<&str>, sched: Schedule) -> anyhow::Result<HogOut> {
    let hb = Heartbeat::register(HOG_HB, Some(Target::PerUnit(INSATIABLE)))?;
    let mut c = open_conn(to, service, None, HOG_HELLO)?;
    // A held-back flow or a stalled service must not keep the hog past the grace period.
    c.set_read_timeout(Duration::from_millis(200))?;
    let mut out = HogOut::default();
    let mut buf = vec![0u8; HOG_CHUNK];
    let mut since_beat = 0usize;
    loop {
        if now_ns() > sched.end_ns() + GRACE_NS {
            break;
        }
        let n = match c.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::Interrupted
                        | std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            // The sender closing mid-stream ends the download.
            Err(_) => break,
        };
        if let Some(w) = window_of(now_ns(), sched.t0_ns) {
            *bump(&mut out.bytes, w) += n as u64;
        }
        since_beat += n;
        while since_beat >= HOG_CHUNK {
            hb.beat_with(HOG_CHUNK as u64);
            since_beat -= HOG_CHUNK;
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// indexer

/// What the indexer did: documents and bytes per 1 s window.
#[derive(serde::Serialize, serde::Deserialize, Debug, Default)]
pub struct IndexOut {
    /// Documents indexed per window.
    pub docs: Vec<u64>,
    /// Bytes of text indexed per window.
    pub bytes: Vec<u64>,
    /// Documents in the corpus, and its bytes.
    pub corpus: (usize, u64),
    /// Threads.
    pub threads: usize,
}

/// Text files under `roots` (no compressed files, none over 1 MiB), up to `limit` bytes.
pub fn corpus(roots: &[&Path], limit: u64) -> Vec<Vec<u8>> {
    let mut docs = Vec::new();
    let mut total = 0u64;
    let mut stack: Vec<std::path::PathBuf> = roots.iter().map(|p| p.to_path_buf()).collect();
    while let Some(dir) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut entries: Vec<_> = rd.flatten().map(|e| e.path()).collect();
        entries.sort();
        for p in entries {
            let Ok(md) = std::fs::symlink_metadata(&p) else {
                continue;
            };
            if md.is_dir() {
                stack.push(p);
            } else if md.is_file() && md.len() > 0 && md.len() <= 1 << 20 {
                let compressed = p.extension().is_some_and(|e| {
                    ["gz", "xz", "bz2", "zst", "png", "jpg"].contains(&&*e.to_string_lossy())
                });
                if compressed {
                    continue;
                }
                if let Ok(b) = std::fs::read(&p) {
                    // Text only: no NUL in the first KiB.
                    if b.iter().take(1024).any(|&c| c == 0) {
                        continue;
                    }
                    total += b.len() as u64;
                    docs.push(b);
                    if total >= limit {
                        return docs;
                    }
                }
            }
        }
    }
    docs
}

/// Adds one document to an inverted index: lower-cased alphanumeric terms of 2 to 32 bytes,
/// each posting the document's number once. Returns the number of terms.
pub fn index_document(
    index: &mut std::collections::HashMap<Vec<u8>, Vec<u32>>,
    doc_id: u32,
    text: &[u8],
) -> usize {
    let mut terms = 0;
    for word in text.split(|c| !c.is_ascii_alphanumeric()) {
        if word.len() < 2 || word.len() > 32 {
            continue;
        }
        terms += 1;
        let key = word.to_ascii_lowercase();
        let postings = index.entry(key).or_default();
        if postings.last() != Some(&doc_id) {
            postings.push(doc_id);
        }
    }
    terms
}

/// Documents per segment: an indexer flushes its in-memory index this often (here: drops it,
/// keeping the memory bounded over a long run).
const SEGMENT_DOCS: u32 = 2000;

/// Indexes the corpus over and over with one thread per hart of this process's cpuset, from
/// `t0` to `t0 + secs`.
pub fn indexer(sched: Schedule) -> anyhow::Result<IndexOut> {
    let docs = Arc::new(corpus(
        &[
            Path::new("/usr/share/doc"),
            Path::new("/usr/share/common-licenses"),
            Path::new("/usr/share/perl"),
            Path::new("/usr/share/perl5"),
        ],
        64 << 20,
    ));
    anyhow::ensure!(
        docs.len() >= 100,
        "found only {} text files under /usr/share to index",
        docs.len()
    );
    let threads = tess_sched::affinity::get_affinity(0)
        .map(|h| h.len())
        .unwrap_or(1)
        .max(1);
    let hb = Arc::new(Heartbeat::register(
        INDEX_HB,
        Some(Target::PerUnit(INSATIABLE)),
    )?);
    let corpus_bytes = docs.iter().map(|d| d.len() as u64).sum();
    let mut handles = Vec::new();
    for t in 0..threads {
        let (docs, hb) = (docs.clone(), hb.clone());
        handles.push(std::thread::spawn(move || {
            let mut out = IndexOut::default();
            let mut index = std::collections::HashMap::new();
            sleep_until(sched.t0_ns);
            let mut i = t;
            let mut id = 0u32;
            let mut since_beat = 0usize;
            while now_ns() < sched.end_ns() {
                let d = &docs[i % docs.len()];
                i += threads;
                index_document(&mut index, id, d);
                id += 1;
                if id.is_multiple_of(SEGMENT_DOCS) {
                    index.clear();
                }
                since_beat += d.len();
                while since_beat >= INDEX_UNIT {
                    hb.beat();
                    since_beat -= INDEX_UNIT;
                }
                if let Some(w) = window_of(now_ns(), sched.t0_ns) {
                    *bump(&mut out.docs, w) += 1;
                    *bump(&mut out.bytes, w) += d.len() as u64;
                }
            }
            out
        }));
    }
    let mut out = IndexOut {
        corpus: (docs.len(), corpus_bytes),
        threads,
        ..Default::default()
    };
    for h in handles {
        let o = h
            .join()
            .map_err(|_| anyhow::anyhow!("an indexer thread panicked"))?;
        for (w, n) in o.docs.iter().enumerate() {
            *bump(&mut out.docs, w) += n;
        }
        for (w, n) in o.bytes.iter().enumerate() {
            *bump(&mut out.bytes, w) += n;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_index_posts_each_term_once_per_document() {
        let mut ix = std::collections::HashMap::new();
        let n = index_document(&mut ix, 7, b"The cat, the CAT and a dog.");
        // "a" is too short: the, cat, the, cat, and, dog.
        assert_eq!(n, 6);
        assert_eq!(ix[b"the".as_slice()], vec![7]);
        assert_eq!(ix[b"cat".as_slice()], vec![7]);
        index_document(&mut ix, 8, b"cat");
        assert_eq!(ix[b"cat".as_slice()], vec![7, 8]);
        assert!(!ix.contains_key(b"a".as_slice()));
    }
}
