//! What runtimes publish about themselves: how many events they handled, how many missed their
//! deadline, and a histogram of response times, in one shared page per runtime that observers
//! (`tessd --metrics-listen`, `tess top`, `tess web`) read without asking the runtime anything.
//!
//! # Why a shared page
//! The kernel counts CPU time and switches, but only the runtime knows what a deadline is: the
//! synthesizer's 1.4 ms answer, a graph engine's audio block, a Pulse thread's job, a gang
//! window's start. Recording one event must cost nothing on the real-time path: no lock, no
//! system call, no allocation. A [`Publisher`] maps a 4 KiB file under `/run/tess/stats`
//! (tmpfs) and records with a handful of relaxed atomic adds; an observer reads the file with
//! `read(2)`, a copy, whenever it likes.
//!
//! # The page (little-endian `u64` words)
//! ```text
//! word 0      magic "TESSSTA1"           word 5      misses (events past the deadline)
//! word 1      layout version (1)         word 6      sum of response times, ns
//! word 2      publisher's pid (tgid)     word 7      largest response time, ns
//! word 3      deadline, ns (0: none)     word 8      buckets (42)
//! word 4      events                     words 9-12  name, UTF-8, NUL-padded (32 bytes)
//! word 13     publisher's start time (field 22 of /proc/PID/stat, clock ticks since boot)
//! word 14     bytes the events carried (a network service's packets; 0 for most runtimes)
//! word 15     a `tess trace` that wants the events: its pid (its tracefs instance is
//!             `tess-PID`); 0: none. Written by the tracer (root), read by the publisher.
//! words 16-57 bucket counts: bucket i counts times <= BOUNDS_NS[i]; bucket 41 the rest
//! ```
//! Bucket bounds grow by a factor of sqrt(2) from 1.024 us to 1.07 s, so any quantile read from
//! them is within 41% of the truth, finer than a decade scale and fine enough for us-ms tails.
//!
//! # Trust
//! The directory is shared (mode 1777, like `/tmp`), so a reader never trusts a file: it copies
//! the bytes, checks magic, version, size and bucket count, and reports a file under a cell only
//! when its name's pid is a process of that cell, the file belongs to root or to that
//! process's owner, and the process started when the page says its publisher did (a page left
//! by a killed runtime is not taken for a later process that got the same pid)
//! ([`for_processes`]). A publisher opens with `O_EXCL | O_NOFOLLOW`, so a link
//! planted under its name cannot redirect its writes.
//!
//! # Worked example
//! The synthesizer (pid 4242) publishes `synth` with a deadline of 1,405,896 ns. Package 1
//! answers in 700 us: events 1, bucket 19 (bound 741,376 ns) +1. Package 2 answers in 1.6 ms:
//! events 2, misses 1, bucket 22 (bound 2,097,152 ns). `quantile(0.5)` is then 741,376 ns and
//! `quantile(0.99)` 1,600,000 ns: a quantile is its bucket's bound, but never more than the
//! largest time seen.

#![warn(missing_docs)]

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The page's first word.
pub const MAGIC: u64 = u64::from_le_bytes(*b"TESSSTA1");
/// Layout version this crate writes and reads.
pub const VERSION: u64 = 1;
/// Bytes in a page.
pub const PAGE_BYTES: usize = 4096;
/// Histogram buckets, the last one unbounded.
pub const BUCKETS: usize = 42;
/// Longest name, bytes.
pub const NAME_BYTES: usize = 32;
/// Where publishers put their pages unless `TESS_STATS_DIR` says otherwise.
pub const DEFAULT_DIR: &str = "/run/tess/stats";

const W_MAGIC: usize = 0;
const W_VERSION: usize = 1;
const W_PID: usize = 2;
const W_DEADLINE: usize = 3;
const W_EVENTS: usize = 4;
const W_MISSES: usize = 5;
const W_SUM: usize = 6;
const W_MAX: usize = 7;
const W_BUCKETS: usize = 8;
const W_NAME: usize = 9;
const W_START: usize = 13;
const W_BYTES: usize = 14;
const W_TRACE: usize = 15;
const W_HIST: usize = 16;
const WORDS: usize = PAGE_BYTES / 8;

/// Upper bounds of buckets 0..=40 in ns: 1.024 us times sqrt(2)^i (1024 << i/2 for even i,
/// 1448 << i/2 for odd i, 1448 being 1024 sqrt(2) rounded down).
pub const BOUNDS_NS: [u64; BUCKETS - 1] = bounds();

const fn bounds() -> [u64; BUCKETS - 1] {
    let mut b = [0u64; BUCKETS - 1];
    let mut i = 0;
    while i < BUCKETS - 1 {
        b[i] = if i % 2 == 0 { 1024 } else { 1448 } << (i / 2);
        i += 1;
    }
    b
}

/// The bucket that counts a response time of `ns`.
#[inline]
pub fn bucket_of(ns: u64) -> usize {
    BOUNDS_NS.partition_point(|&b| b < ns)
}

/// Why a page could not be published or read.
#[derive(Debug, thiserror::Error)]
pub enum StatsError {
    /// A system call failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The file is not a page of this layout.
    #[error("{0}")]
    Malformed(String),
    /// The name cannot be used in a file name.
    #[error("a runtime's name must be 1-32 characters of [A-Za-z0-9_-], not {0:?}")]
    BadName(String),
}

fn io(what: &'static str, path: &Path, source: std::io::Error) -> StatsError {
    StatsError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// The directory of pages: `TESS_STATS_DIR`, else [`DEFAULT_DIR`].
pub fn default_dir() -> PathBuf {
    std::env::var_os("TESS_STATS_DIR")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_DIR), PathBuf::from)
}

/// Creates `dir` (and its parents) shared like `/tmp`: everyone may publish, nobody may remove
/// another user's page. tessd calls this at start; a root publisher also may.
pub fn ensure_dir(dir: &Path) -> Result<(), StatsError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).map_err(|e| io("creating", dir, e))?;
    let meta = std::fs::metadata(dir).map_err(|e| io("reading", dir, e))?;
    if meta.permissions().mode() & 0o7777 != 0o1777 && meta.uid() == euid() {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1777))
            .map_err(|e| io("setting the mode of", dir, e))?;
    }
    Ok(())
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= NAME_BYTES
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A runtime name made from `prefix` and another name (a cell's, a flow's): characters a page
/// name does not allow become `-`, and it is cut to [`NAME_BYTES`] (`net-` + `music synth` gives
/// `net-music-synth`).
pub fn runtime_name(prefix: &str, name: &str) -> String {
    let mut out: String = prefix
        .chars()
        .chain(name.chars())
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    // Only ASCII is left, so any byte length is a character boundary.
    out.truncate(NAME_BYTES);
    out
}

/// The file name of `pid`'s page `name`.
pub fn file_name(pid: i32, name: &str) -> String {
    format!("{pid}-{name}.stats")
}

/// Splits a page's file name into pid and name.
pub fn parse_file_name(file: &str) -> Option<(i32, &str)> {
    let (pid, name) = file.strip_suffix(".stats")?.split_once('-')?;
    let pid: i32 = pid.parse().ok().filter(|p| *p > 0)?;
    valid_name(name).then_some((pid, name))
}

/// A runtime's published page. Recording is wait-free and may be done from any thread.
#[derive(Debug)]
pub struct Publisher {
    words: NonNull<AtomicU64>,
    path: PathBuf,
    deadline_ns: u64,
    name: [u8; NAME_BYTES],
    name_len: usize,
    marker: Marker,
}

/// The `trace_marker` of the tracefs instance that asked for this runtime's events.
#[derive(Debug)]
struct Marker {
    /// Its file descriptor (-1: none open).
    fd: std::sync::atomic::AtomicI32,
    /// The tracer it was opened for (0: none).
    tracer: AtomicU64,
    /// Threads writing to `fd` right now (it is closed only when none is).
    writers: std::sync::atomic::AtomicUsize,
}

// SAFETY: the mapping is only ever accessed through `AtomicU64`s, which may be shared and sent
// between threads; it lives until `Drop`, which needs `&mut self`.
unsafe impl Send for Publisher {}
// SAFETY: as above: every access is atomic.
unsafe impl Sync for Publisher {}

impl Publisher {
    /// Publishes `name` for this process in [`default_dir`], with `deadline` (an event slower
    /// than it is a miss), creating the directory if it may. Pages of dead processes that
    /// this caller may remove are swept on the way.
    pub fn create(name: &str, deadline: Option<Duration>) -> Result<Publisher, StatsError> {
        let dir = default_dir();
        if !dir.is_dir() {
            ensure_dir(&dir)?;
        }
        sweep_stale(&dir);
        Publisher::create_in(&dir, name, deadline)
    }

    /// [`Publisher::create`], or `None` (and a line on stderr) when publishing is not possible
    /// here: a runtime never fails because nobody can watch it. `TESS_STATS=0` turns it off.
    pub fn try_create(name: &str, deadline: Option<Duration>) -> Option<Publisher> {
        if std::env::var_os("TESS_STATS").is_some_and(|v| v == "0") {
            return None;
        }
        match Publisher::create(name, deadline) {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!("tess-stats: not publishing {name}: {e}");
                None
            }
        }
    }

    /// Publishes `name` for this process in `dir`.
    pub fn create_in(
        dir: &Path,
        name: &str,
        deadline: Option<Duration>,
    ) -> Result<Publisher, StatsError> {
        if !valid_name(name) {
            return Err(StatsError::BadName(name.into()));
        }
        let pid = std::process::id() as i32;
        let path = dir.join(file_name(pid, name));
        let fd = open_exclusive(&path)?;
        // SAFETY: `fd` is an open file we own; the length is a page.
        let sized = unsafe { libc::ftruncate(fd, PAGE_BYTES as libc::off_t) };
        if sized != 0 {
            let e = std::io::Error::last_os_error();
            close_and_unlink(fd, &path);
            return Err(io("sizing", &path, e));
        }
        // SAFETY: a fresh shared read-write mapping of a page of the file just sized; the kernel
        // picks the address. The fd may be closed once mapped.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                PAGE_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        let mapped = std::io::Error::last_os_error();
        close_fd(fd);
        if map == libc::MAP_FAILED {
            let _ = std::fs::remove_file(&path);
            return Err(io("mapping", &path, mapped));
        }
        let words = NonNull::new(map.cast::<AtomicU64>()).expect("mmap never returns null");
        let deadline_ns = deadline.map_or(0, |d| d.as_nanos().min(u64::MAX as u128) as u64);
        let mut name_words = [0u8; NAME_BYTES];
        name_words[..name.len()].copy_from_slice(name.as_bytes());
        let p = Publisher {
            words,
            path,
            deadline_ns,
            name: name_words,
            name_len: name.len(),
            marker: Marker {
                fd: std::sync::atomic::AtomicI32::new(-1),
                tracer: AtomicU64::new(0),
                writers: std::sync::atomic::AtomicUsize::new(0),
            },
        };
        for (i, chunk) in name_words.chunks_exact(8).enumerate() {
            p.word(W_NAME + i).store(
                u64::from_le_bytes(chunk.try_into().unwrap()),
                Ordering::Relaxed,
            );
        }
        p.word(W_VERSION).store(VERSION, Ordering::Relaxed);
        p.word(W_PID).store(pid as u64, Ordering::Relaxed);
        p.word(W_START)
            .store(start_time(pid).unwrap_or(0), Ordering::Relaxed);
        p.word(W_DEADLINE).store(deadline_ns, Ordering::Relaxed);
        p.word(W_BUCKETS).store(BUCKETS as u64, Ordering::Relaxed);
        p.word(W_MAGIC).store(MAGIC, Ordering::Release);
        Ok(p)
    }

    #[inline]
    fn word(&self, i: usize) -> &AtomicU64 {
        debug_assert!(i < WORDS);
        // SAFETY: `words` maps WORDS u64s for as long as `self` lives, every index used is a
        // constant below WORDS or W_HIST + bucket_of(..) < W_HIST + BUCKETS <= WORDS, and the
        // page is only ever accessed atomically (other processes only read it with read(2)).
        unsafe { &*self.words.as_ptr().add(i) }
    }

    /// The deadline events are judged against (0: none).
    pub fn deadline_ns(&self) -> u64 {
        self.deadline_ns
    }

    /// Records one event that took `ns`, a miss when a deadline is set and `ns` exceeds it.
    #[inline]
    pub fn record(&self, ns: u64) {
        self.record_judged(ns, self.deadline_ns != 0 && ns > self.deadline_ns);
    }

    /// Records one event that took `ns`, a miss when `missed` (for runtimes whose deadline
    /// varies from event to event, such as EDF jobs).
    #[inline]
    pub fn record_judged(&self, ns: u64, missed: bool) {
        self.word(W_EVENTS).fetch_add(1, Ordering::Relaxed);
        if missed {
            self.word(W_MISSES).fetch_add(1, Ordering::Relaxed);
        }
        self.word(W_SUM).fetch_add(ns, Ordering::Relaxed);
        self.word(W_MAX).fetch_max(ns, Ordering::Relaxed);
        self.word(W_HIST + bucket_of(ns))
            .fetch_add(1, Ordering::Relaxed);
        let tracer = self.word(W_TRACE).load(Ordering::Relaxed);
        if tracer != 0 || self.marker.tracer.load(Ordering::Relaxed) != 0 {
            self.trace(tracer, ns, missed);
        }
    }

    /// While a `tess trace` asks for it (word 15), writes each event to its tracefs
    /// instance's `trace_marker` as `tess-stats NAME RESPONSE_NS MISSED`: one system call per
    /// event, only while tracing. The thread that first sees a new tracer (or none) switches
    /// the marker; events recorded meanwhile by other threads are not traced. A runtime that
    /// may not write the marker (not root) traces nothing.
    #[cold]
    fn trace(&self, tracer: u64, ns: u64, missed: bool) {
        let m = &self.marker;
        let current = m.tracer.load(Ordering::Acquire);
        if current != tracer {
            if m.tracer
                .compare_exchange(current, tracer, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
            {
                return;
            }
            let old = m.fd.swap(-1, Ordering::AcqRel);
            if old >= 0 {
                // Wait out writers that loaded the old descriptor (each is one write call).
                while m.writers.load(Ordering::Acquire) != 0 {
                    std::hint::spin_loop();
                }
                close_fd(old);
            }
            if tracer != 0 {
                let path = format!("/sys/kernel/tracing/instances/tess-{tracer}/trace_marker");
                if let Ok(c) = CString::new(path) {
                    // SAFETY: `c` is a NUL-terminated path.
                    let fd = unsafe { libc::open(c.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
                    m.fd.store(fd.max(-1), Ordering::Release);
                }
            }
            return;
        }
        m.writers.fetch_add(1, Ordering::AcqRel);
        let fd = m.fd.load(Ordering::Acquire);
        if fd >= 0 {
            let mut line = [0u8; 96];
            let mut w = &mut line[..];
            let name = &self.name[..self.name_len];
            let ok = std::io::Write::write_all(&mut w, b"tess-stats ").is_ok()
                && std::io::Write::write_all(&mut w, name).is_ok()
                && std::io::Write::write_fmt(&mut w, format_args!(" {ns} {}\n", missed as u8))
                    .is_ok();
            let len = 96 - w.len();
            if ok {
                // SAFETY: `fd` stays open while `writers` counts us; `line[..len]` is valid.
                unsafe { libc::write(fd, line.as_ptr().cast(), len) };
            }
        }
        m.writers.fetch_sub(1, Ordering::AcqRel);
    }

    /// Records one event that carried `bytes` (a packet a network service moved) and waited
    /// `ns` (its queueing), a miss when `missed`.
    #[inline]
    pub fn record_bytes(&self, ns: u64, missed: bool, bytes: u64) {
        self.word(W_BYTES).fetch_add(bytes, Ordering::Relaxed);
        self.record_judged(ns, missed);
    }

    /// Where the page lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What an observer would read now.
    pub fn read_back(&self) -> Published {
        let mut bytes = vec![0u8; PAGE_BYTES];
        for (i, chunk) in bytes.chunks_exact_mut(8).enumerate() {
            chunk.copy_from_slice(&self.word(i).load(Ordering::Relaxed).to_le_bytes());
        }
        parse(&bytes).expect("a publisher's own page is well formed")
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        let fd = *self.marker.fd.get_mut();
        if fd >= 0 {
            close_fd(fd);
        }
        // SAFETY: the mapping was made in `create_in` with this length and nothing refers to
        // it once `self` is dropped (`word` borrows `self`).
        unsafe { libc::munmap(self.words.as_ptr().cast(), PAGE_BYTES) };
        let _ = std::fs::remove_file(&self.path);
    }
}

fn open_exclusive(path: &Path) -> Result<libc::c_int, StatsError> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| StatsError::Malformed(format!("{} holds a NUL", path.display())))?;
    let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    for attempt in 0..2 {
        // SAFETY: `c` is a NUL-terminated path; the mode is a plain integer.
        let fd = unsafe { libc::open(c.as_ptr(), flags, 0o644 as libc::c_uint) };
        if fd >= 0 {
            // The umask may have narrowed the mode; observers of other users must read it.
            // SAFETY: `fd` is the file just created.
            unsafe { libc::fchmod(fd, 0o644) };
            return Ok(fd);
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EEXIST) && attempt == 0 {
            // A page left by an earlier process with this pid: ours to replace (in a shared
            // directory only when it is ours, which unlink checks).
            std::fs::remove_file(path).map_err(|e| io("replacing", path, e))?;
            continue;
        }
        return Err(io("creating", path, e));
    }
    unreachable!("the loop returns on its second attempt")
}

fn close_fd(fd: libc::c_int) {
    // SAFETY: `fd` is open and owned by the caller, who does not use it again.
    unsafe { libc::close(fd) };
}

fn close_and_unlink(fd: libc::c_int, path: &Path) {
    close_fd(fd);
    let _ = std::fs::remove_file(path);
}

/// One page as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// The publisher's pid.
    pub pid: i32,
    /// The runtime's name (`synth`, `pd`, `pulse-edf`, `gang-window`, ...).
    pub name: String,
    /// Deadline, ns (0: none).
    pub deadline_ns: u64,
    /// Events recorded.
    pub events: u64,
    /// Events past their deadline.
    pub misses: u64,
    /// Sum of response times, ns.
    pub sum_ns: u64,
    /// Largest response time, ns.
    pub max_ns: u64,
    /// When the publisher started (clock ticks since boot, as `/proc/PID/stat` says).
    pub start_time: u64,
    /// Bytes its events carried.
    pub bytes: u64,
    /// The `tess trace` that asked for its events (0: none).
    pub tracer: u64,
    /// Bucket counts ([`BOUNDS_NS`], then the overflow).
    pub buckets: Vec<u64>,
}

impl Published {
    /// The `q` quantile (0..=1) as the bound of the bucket that holds it (the largest time
    /// seen for the overflow bucket); `None` with no events.
    pub fn quantile(&self, q: f64) -> Option<u64> {
        quantile(&self.buckets, q, self.max_ns)
    }
}

/// The `q` quantile of bucket counts, as a bucket bound (`max_ns` for the overflow bucket).
pub fn quantile(buckets: &[u64], q: f64, max_ns: u64) -> Option<u64> {
    let total: u64 = buckets.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
    let mut seen = 0;
    for (i, n) in buckets.iter().enumerate() {
        seen += n;
        if seen >= rank {
            return Some(
                BOUNDS_NS
                    .get(i)
                    .copied()
                    .unwrap_or(max_ns)
                    .min(max_ns.max(1)),
            );
        }
    }
    Some(max_ns)
}

/// Parses a page's bytes, checking everything a hostile writer could get wrong.
pub fn parse(bytes: &[u8]) -> Result<Published, StatsError> {
    if bytes.len() != PAGE_BYTES {
        return Err(StatsError::Malformed(format!(
            "a page is {PAGE_BYTES} bytes, not {}",
            bytes.len()
        )));
    }
    let w = |i: usize| u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().unwrap());
    if w(W_MAGIC) != MAGIC {
        return Err(StatsError::Malformed("not a tess stats page".into()));
    }
    if w(W_VERSION) != VERSION {
        return Err(StatsError::Malformed(format!(
            "layout version {} (this reader knows {VERSION})",
            w(W_VERSION)
        )));
    }
    if w(W_BUCKETS) != BUCKETS as u64 {
        return Err(StatsError::Malformed(format!(
            "{} buckets (the layout has {BUCKETS})",
            w(W_BUCKETS)
        )));
    }
    let pid = i32::try_from(w(W_PID))
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| StatsError::Malformed(format!("pid {} is out of range", w(W_PID))))?;
    let raw_name = &bytes[W_NAME * 8..W_NAME * 8 + NAME_BYTES];
    let name = std::str::from_utf8(raw_name)
        .ok()
        .map(|s| s.trim_end_matches('\0'))
        .filter(|s| valid_name(s))
        .ok_or_else(|| StatsError::Malformed("the name is not a runtime's name".into()))?;
    Ok(Published {
        pid,
        name: name.to_string(),
        deadline_ns: w(W_DEADLINE),
        events: w(W_EVENTS),
        misses: w(W_MISSES),
        sum_ns: w(W_SUM),
        max_ns: w(W_MAX),
        start_time: w(W_START),
        bytes: w(W_BYTES),
        tracer: w(W_TRACE),
        buckets: (0..BUCKETS).map(|i| w(W_HIST + i)).collect(),
    })
}

/// Reads one page (a copy: a writer changing it meanwhile can only make counts slightly stale).
pub fn read_file(path: &Path) -> Result<Published, StatsError> {
    use std::io::Read;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags_nofollow()
        .open(path)
        .map_err(|e| io("opening", path, e))?;
    let mut bytes = Vec::with_capacity(PAGE_BYTES + 1);
    f.take(PAGE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| io("reading", path, e))?;
    parse(&bytes)
}

trait NoFollow {
    fn custom_flags_nofollow(&mut self) -> &mut Self;
}

impl NoFollow for std::fs::OpenOptions {
    fn custom_flags_nofollow(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
    }
}

/// Asks the runtime of the page at `path` to write its events to the `trace_marker` of the
/// tracefs instance `tess-TRACER` (0: stop). Needs the right to write the page (root, or its
/// owner).
pub fn request_trace(path: &Path, tracer: u32) -> Result<(), StatsError> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let f = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| io("opening", path, e))?;
    // Only a page of this layout: never write into anything else.
    read_file(path)?;
    f.write_at(&u64::from(tracer).to_le_bytes(), (W_TRACE * 8) as u64)
        .map_err(|e| io("writing", path, e))?;
    Ok(())
}

/// A page found in the directory, not yet read or checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    /// The pid its file name gives.
    pub pid: i32,
    /// The runtime name its file name gives.
    pub name: String,
    /// The file.
    pub path: PathBuf,
}

/// The pages in `dir`, by their file names (one directory read; nothing opened).
pub fn pages(dir: &Path) -> Vec<Page> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<Page> = entries
        .flatten()
        .filter_map(|e| {
            let file = e.file_name();
            let (pid, name) = file.to_str().and_then(parse_file_name)?;
            Some(Page {
                pid,
                name: name.to_string(),
                path: e.path(),
            })
        })
        .collect();
    out.sort_by(|a, b| (a.pid, &a.name).cmp(&(b.pid, &b.name)));
    out
}

/// Reads `page` if it can be believed: the process is alive, the file is a regular file that
/// belongs to root or to the process's owner, and its contents agree with its name.
pub fn read_checked(page: &Page) -> Option<Published> {
    let owner = process_owner(page.pid)?;
    let meta = std::fs::symlink_metadata(&page.path).ok()?;
    if !meta.is_file() || (meta.uid() != 0 && meta.uid() != owner) {
        return None;
    }
    read_file(&page.path).ok().filter(|p| {
        p.pid == page.pid && p.name == page.name && Some(p.start_time) == start_time(page.pid)
    })
}

/// When process `pid` started: field 22 of `/proc/PID/stat`, in clock ticks since boot.
pub fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count from its end.
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(19)?.parse().ok()
}

/// The pages in `dir` published by `pids` (a cell's processes), each [`read_checked`].
pub fn for_processes(dir: &Path, pids: &[i32]) -> Vec<Published> {
    if pids.is_empty() {
        return Vec::new();
    }
    pages(dir)
        .iter()
        .filter(|p| pids.contains(&p.pid))
        .filter_map(read_checked)
        .collect()
}

fn process_owner(pid: i32) -> Option<u32> {
    std::fs::metadata(format!("/proc/{pid}"))
        .ok()
        .map(|m| m.uid())
}

/// Removes pages whose process is gone (those this caller may remove); returns how many.
pub fn sweep_stale(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .and_then(parse_file_name)
                .is_some_and(|(pid, _)| process_owner(pid).is_none())
        })
        .filter(|e| std::fs::remove_file(e.path()).is_ok())
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bounds_grow_by_root_two() {
        assert_eq!(BOUNDS_NS[0], 1024);
        assert_eq!(BOUNDS_NS[1], 1448);
        assert_eq!(BOUNDS_NS[2], 2048);
        assert_eq!(BOUNDS_NS[40], 1024 << 20);
        for w in BOUNDS_NS.windows(2) {
            let r = w[1] as f64 / w[0] as f64;
            assert!((1.41..1.42).contains(&r), "{w:?}");
        }
    }

    #[test]
    fn the_worked_example_holds() {
        let d = tempfile::tempdir().unwrap();
        let p =
            Publisher::create_in(d.path(), "synth", Some(Duration::from_nanos(1_405_896))).unwrap();
        p.record(700_000);
        p.record(1_600_000);
        let r = read_file(p.path()).unwrap();
        assert_eq!((r.events, r.misses), (2, 1));
        assert_eq!(r.buckets[19], 1);
        assert_eq!(BOUNDS_NS[19], 741_376);
        assert_eq!(r.buckets[22], 1);
        assert_eq!(r.quantile(0.5), Some(741_376));
        // Bucket 22's bound is 2,097,152 ns, but nothing took longer than 1.6 ms.
        assert_eq!(r.quantile(0.99), Some(1_600_000));
        assert_eq!(r.max_ns, 1_600_000);
        assert_eq!(r.sum_ns, 2_300_000);
        assert_eq!(r.name, "synth");
        assert_eq!(r.pid, std::process::id() as i32);
        assert_eq!(r, p.read_back());
    }

    #[test]
    fn bytes_are_counted_beside_the_events() {
        let d = tempfile::tempdir().unwrap();
        let p = Publisher::create_in(d.path(), "net-synth", None).unwrap();
        p.record_bytes(20_000, false, 1500);
        p.record_bytes(90_000, true, 64);
        let r = p.read_back();
        assert_eq!((r.events, r.misses, r.bytes), (2, 1, 1564));
    }

    #[test]
    fn a_tracer_request_reaches_the_publisher_and_a_missing_instance_is_harmless() {
        let d = tempfile::tempdir().unwrap();
        let p = Publisher::create_in(d.path(), "synth", None).unwrap();
        // No tracefs instance tess-4000000 exists: the marker cannot open, events still count.
        request_trace(p.path(), 4_000_000).unwrap();
        assert_eq!(p.read_back().tracer, 4_000_000);
        p.record(1_000);
        p.record(2_000);
        assert_eq!(p.marker.fd.load(Ordering::Relaxed), -1);
        assert_eq!(p.marker.tracer.load(Ordering::Relaxed), 4_000_000);
        request_trace(p.path(), 0).unwrap();
        p.record(3_000);
        assert_eq!(p.marker.tracer.load(Ordering::Relaxed), 0);
        assert_eq!(p.read_back().events, 3);
        // A page that is not one is refused.
        let junk = d.path().join("1-x.stats");
        std::fs::write(&junk, "x").unwrap();
        assert!(request_trace(&junk, 5).is_err());
    }

    #[test]
    fn a_page_goes_with_its_publisher() {
        let d = tempfile::tempdir().unwrap();
        let path = {
            let p = Publisher::create_in(d.path(), "pd", None).unwrap();
            assert!(p.path().exists());
            p.path().to_path_buf()
        };
        assert!(!path.exists());
    }

    #[test]
    fn observers_find_a_cells_pages_and_nothing_else() {
        let d = tempfile::tempdir().unwrap();
        let me = std::process::id() as i32;
        let p = Publisher::create_in(d.path(), "pulse-edf", None).unwrap();
        p.record_judged(5_000, true);
        // Junk beside it: a bad name, a forged page for a pid that does not exist, garbage.
        std::fs::write(d.path().join("notes.txt"), "x").unwrap();
        std::fs::write(d.path().join(file_name(me, "junk")), vec![7u8; PAGE_BYTES]).unwrap();
        let dead = 0x3fff_fff0;
        let mut forged = std::fs::read(p.path()).unwrap();
        forged[W_PID * 8..W_PID * 8 + 8].copy_from_slice(&(dead as u64).to_le_bytes());
        std::fs::write(d.path().join(file_name(dead, "pulse-edf")), &forged).unwrap();

        let seen = for_processes(d.path(), &[me, dead]);
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert_eq!((seen[0].name.as_str(), seen[0].misses), ("pulse-edf", 1));
        assert!(for_processes(d.path(), &[me + 1]).is_empty());
        // The dead process's page is swept; ours is not.
        assert_eq!(sweep_stale(d.path()), 1);
        assert!(p.path().exists());
    }

    #[test]
    fn a_page_named_for_another_pid_is_not_believed() {
        let d = tempfile::tempdir().unwrap();
        let me = std::process::id() as i32;
        let p = Publisher::create_in(d.path(), "synth", None).unwrap();
        // Same contents under the name of pid 1 (alive, root's): names and contents disagree.
        std::fs::copy(p.path(), d.path().join(file_name(1, "synth"))).unwrap();
        let seen = for_processes(d.path(), &[1, me]);
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].pid, me);
    }

    #[test]
    fn a_page_from_an_earlier_process_with_the_same_pid_is_not_believed() {
        let d = tempfile::tempdir().unwrap();
        let me = std::process::id() as i32;
        let p = Publisher::create_in(d.path(), "synth", None).unwrap();
        assert_eq!(p.read_back().start_time, start_time(me).unwrap());
        assert_eq!(for_processes(d.path(), &[me]).len(), 1);
        // The same page, as if written by a process that had this pid before.
        let mut bytes = std::fs::read(p.path()).unwrap();
        let earlier = start_time(me).unwrap().saturating_sub(1);
        bytes[W_START * 8..W_START * 8 + 8].copy_from_slice(&earlier.to_le_bytes());
        std::fs::write(p.path(), &bytes).unwrap();
        assert!(for_processes(d.path(), &[me]).is_empty());
    }

    #[test]
    fn a_planted_link_is_not_followed() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("victim");
        std::fs::write(&target, "keep me").unwrap();
        let me = std::process::id() as i32;
        std::os::unix::fs::symlink(&target, d.path().join(file_name(me, "synth"))).unwrap();
        // The publisher replaces the link with its own file; the target is untouched.
        let p = Publisher::create_in(d.path(), "synth", None).unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");
        assert!(!std::fs::symlink_metadata(p.path())
            .unwrap()
            .file_type()
            .is_symlink());
    }

    #[test]
    fn bad_names_are_refused() {
        let d = tempfile::tempdir().unwrap();
        for n in ["", "a/b", "../x", "with space", &"x".repeat(33)] {
            assert!(matches!(
                Publisher::create_in(d.path(), n, None),
                Err(StatsError::BadName(_))
            ));
        }
        assert_eq!(runtime_name("net-", "music synth"), "net-music-synth");
        assert_eq!(runtime_name("hb-", "é"), "hb--");
        assert_eq!(runtime_name("hb-", &"x".repeat(40)).len(), NAME_BYTES);
        assert!(valid_name(&runtime_name("net-", "a/b.c")));
        assert_eq!(parse_file_name("12-synth.stats"), Some((12, "synth")));
        assert_eq!(
            parse_file_name("12-gang-window.stats"),
            Some((12, "gang-window"))
        );
        assert_eq!(parse_file_name("0-synth.stats"), None);
        assert_eq!(parse_file_name("x-synth.stats"), None);
    }

    #[test]
    fn quantiles_of_empty_and_overflow() {
        assert_eq!(quantile(&[0; BUCKETS], 0.5, 0), None);
        let mut b = vec![0; BUCKETS];
        b[BUCKETS - 1] = 3;
        assert_eq!(quantile(&b, 0.99, 5_000_000_000), Some(5_000_000_000));
    }

    proptest! {
        #[test]
        fn every_time_lands_in_the_bucket_whose_bounds_hold_it(ns in 0u64..u64::MAX) {
            let i = bucket_of(ns);
            prop_assert!(i < BUCKETS);
            if i < BUCKETS - 1 {
                prop_assert!(ns <= BOUNDS_NS[i]);
            }
            if i > 0 {
                prop_assert!(ns > BOUNDS_NS[i - 1]);
            }
        }

        #[test]
        fn parsing_any_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..5000),
                                          magic in any::<bool>()) {
            let mut bytes = bytes;
            if magic && bytes.len() >= 8 {
                bytes[..8].copy_from_slice(&MAGIC.to_le_bytes());
            }
            let _ = parse(&bytes);
        }
    }
}
