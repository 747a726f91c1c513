//! Following the cell: Pulse inside a tess cell attaches to tessd, runs one hart per hart of
//! the cell, and turns tessd's `Adapt` message into the adaptation of [`crate::adapt`] (seed
//! 004 section 4.4, issue 13). The protocol is `tess_proto::runtime`, spoken the way
//! tess-runtime speaks it (`tess_proto::runtime::link` is shared by both).
//!
//! ```text
//!   Pulse::new       which cell (Config::cell: named, or the one the process runs in),
//!                    RuntimeAttach -> the cell's harts and policy, the control channel
//!   Pulse::run       the calling thread becomes vhart 0, one kernel thread per other hart;
//!                    each waits until tessd has placed it (reserved cells) or pins itself to
//!                    its hart (other cells)
//!   checkpoints      a hart's first scheduler entry after each tick of its timer, its idle
//!                    wake-ups (without ticks: every scheduler entry) poll the channel, at
//!                    most once per POLL_INTERVAL_NS for all harts
//!   Adapt{seq, n}    adapt::begin(n): kicks, hand-over, adapt(old_n, new_n, ctx[]) on vhart 0
//!   adapt returned   vhart 0 joins the retired harts' kernel threads and waits until the kernel
//!                    has reaped them (a shrink), then acknowledges Adapted{seq, n}: tessd takes
//!                    the harts away only then
//!   Shutdown/closed  every hart leaves at its next scheduler entry; Pulse::run returns
//! ```
//!
//! # One adaptation at a time
//!
//! A hart reads the channel only while no adaptation is in progress, and the adaptation ends
//! (`in_progress` cleared) only after its acknowledgement was sent. A second `Adapt` that
//! arrives meanwhile therefore stays in the channel and is read at the first checkpoint after
//! the acknowledgement: it is never lost, never interleaved, and never waits for more than the
//! adaptation before it. tessd serialises its own changes (it waits up to
//! `ADAPT_ACK_TIMEOUT` for a shrink's acknowledgement, and does not wait for a growth's), so at
//! most one message waits; if Pulse is slower than that timeout, tessd shrinks the cell anyway
//! and the harts Pulse still runs share what is left until the adaptation completes.
//! `PulseHandle::resize` is refused in a cell: the cell's size is tessd's.
//!
//! # Placement
//!
//! A `SCHED_DEADLINE` thread may not change its own affinity, so in a reserved
//! (time-triggered or event-triggered) cell Pulse never pins: tessd places each thread on the
//! least populated hart of the cell and makes it a deadline thread, and a hart waits for that
//! ([`tess_proto::runtime::wait_placed`], up to `PLACEMENT_TIMEOUT`) before it runs anything.
//! The thread that calls `Pulse::run` is vhart 0, so the process leaves no idle thread in the
//! cell holding a slot and a share of a hart's budget. In other cells (dedicated,
//! best-effort) a hart pins itself to the cell's hart with its index (vhart `v` on
//! `harts[v % n]`, harts in ascending order); tessd tells a runtime about new harts before it
//! grows the cpuset, so a new hart retries until the kernel accepts its hart.

use crate::adapt;
use crate::clock::now_ns;
use crate::lock::SpinLock;
use crate::runtime::{pin_to, PulseError, Shared, MAX_HARTS};
use std::ffi::CString;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;
use tess_proto::runtime::{Control, ControlChannel, PLACEMENT_TIMEOUT};

/// Which cell Pulse follows ([`crate::Config::cell`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum CellMode {
    /// The cell the process runs in (`tess run --cell NAME`, from its cpuset cgroup), if any;
    /// standalone otherwise. The default.
    #[default]
    Auto,
    /// This cell; the process must run in it (an error otherwise).
    Named(String),
    /// Never attach to tessd, even inside a cell: [`crate::Config::harts`] harts, resized only
    /// by [`crate::PulseHandle::resize`].
    Standalone,
}

impl CellMode {
    /// The cell to attach to, if any.
    fn resolve(&self) -> Option<String> {
        match self {
            CellMode::Auto => tess_proto::runtime::current_cell(),
            CellMode::Named(n) => Some(n.clone()),
            CellMode::Standalone => None,
        }
    }
}

/// The control channel is read at most this often (all harts together).
const POLL_INTERVAL_NS: u64 = 200_000;

/// How long vhart 0 waits for a retired hart's kernel thread to be reaped before it
/// acknowledges a shrink anyway.
const GONE_LIMIT: Duration = Duration::from_millis(5);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Pulse's link to its cell (module docs).
pub(crate) struct CellLink {
    name: String,
    c_name: CString,
    /// tessd places the threads (a reserved cell); otherwise harts pin themselves.
    reserved: bool,
    channel: SpinLock<ControlChannel>,
    /// The cell's harts as tessd last said, ascending.
    harts: Mutex<Vec<usize>>,
    /// The `seq` of the adaptation in progress.
    seq: AtomicU64,
    next_poll_ns: AtomicU64,
}

impl std::fmt::Debug for CellLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CellLink")
            .field("name", &self.name)
            .field("reserved", &self.reserved)
            .finish_non_exhaustive()
    }
}

impl CellLink {
    /// Attaches to the cell `mode` names, if any; returns the link and the cell's hart count.
    pub(crate) fn attach(mode: &CellMode) -> Result<Option<(CellLink, usize)>, PulseError> {
        let Some(name) = mode.resolve() else {
            return Ok(None);
        };
        let (info, channel) = tess_proto::runtime::attach(&name)?;
        let harts: Vec<usize> = info.harts.iter().collect();
        if harts.is_empty() {
            return Err(PulseError::NoHarts { cell: name });
        }
        if harts.len() > MAX_HARTS {
            return Err(PulseError::Config(format!(
                "cell '{name}' has {} harts; Pulse runs at most {MAX_HARTS}",
                harts.len()
            )));
        }
        let n = harts.len();
        let c_name = CString::new(name.clone()).unwrap_or_default();
        Ok(Some((
            CellLink {
                name,
                c_name,
                reserved: info.policy.is_reservation(),
                channel: SpinLock::new(channel),
                harts: Mutex::new(harts),
                seq: AtomicU64::new(0),
                next_poll_ns: AtomicU64::new(0),
            },
            n,
        )))
    }

    /// The cell's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The cell's name for C (`pulse_cell`).
    pub(crate) fn c_name(&self) -> &std::ffi::CStr {
        &self.c_name
    }

    /// Whether tessd places the harts (a reserved cell).
    pub(crate) fn reserved(&self) -> bool {
        self.reserved
    }

    /// A checkpoint: reads one control message, unless an adaptation is in progress, another
    /// hart is reading, or the channel was read less than [`POLL_INTERVAL_NS`] ago. Called in
    /// a hart's scheduler context (ticks off).
    pub(crate) fn poll(&self, shared: &Shared) {
        if shared.adapt.in_progress() {
            return;
        }
        let now = now_ns();
        if now < self.next_poll_ns.load(Ordering::Relaxed) {
            return;
        }
        let Some(mut channel) = self.channel.try_lock() else {
            return;
        };
        self.next_poll_ns
            .store(now + POLL_INTERVAL_NS, Ordering::Relaxed);
        // Adaptations begin only here, under the channel's lock, and end only after their
        // acknowledgement was sent under it: checked again now that the lock is ours, this
        // cannot change until it is released.
        if shared.adapt.in_progress() {
            return;
        }
        match channel.poll() {
            Some(Control::Adapt { seq, harts, .. }) => {
                let new_n = harts.len().clamp(1, MAX_HARTS);
                *lock(&self.harts) = harts;
                if new_n == shared.harts() {
                    // Other harts or other timing, the same count: nothing for Pulse to do
                    // (tessd re-places the threads of a reserved cell itself).
                    channel.ack(seq, new_n);
                    return;
                }
                self.seq.store(seq, Ordering::Release);
                if let Err(e) = adapt::begin(shared, new_n) {
                    eprintln!("tess-pulse: cell '{}': {e}", self.name);
                    channel.ack(seq, shared.harts());
                }
            }
            Some(Control::Shutdown) => {
                drop(channel);
                shared.shut_down();
            }
            None => {}
        }
    }

    /// The end of an adaptation, on vhart 0 after `adapt` returned and the retired harts were
    /// released: waits until their kernel threads are gone (`retired`: their vhart ids and
    /// thread ids), then acknowledges the adaptation with `vharts` harts running.
    pub(crate) fn complete(&self, shared: &Shared, retired: &[(usize, i32)], vharts: usize) {
        shared.join_harts(retired.iter().map(|r| r.0));
        let tids: Vec<i32> = retired.iter().map(|r| r.1).filter(|&t| t > 0).collect();
        tess_proto::runtime::wait_gone(&tids, GONE_LIMIT);
        let seq = self.seq.load(Ordering::Acquire);
        self.channel.lock().ack(seq, vharts);
    }

    /// Puts the calling kernel thread, vhart `vhart`, on its hart (module docs, Placement).
    pub(crate) fn place(&self, shared: &Shared, vhart: usize) {
        if self.reserved {
            if !tess_proto::runtime::wait_placed(PLACEMENT_TIMEOUT, || shared.finished())
                && !shared.finished()
            {
                eprintln!(
                    "tess-pulse: vhart {vhart} was not placed under cell '{}''s reservation by tessd within {PLACEMENT_TIMEOUT:?}; running without it",
                    self.name
                );
            }
            return;
        }
        let give_up = now_ns() + crate::clock::ns(PLACEMENT_TIMEOUT);
        loop {
            let cpu = {
                let harts = lock(&self.harts);
                harts[vhart % harts.len()]
            };
            match pin_to(cpu) {
                Ok(()) => return,
                Err(e) if now_ns() > give_up || shared.finished() => {
                    eprintln!(
                        "tess-pulse: vhart {vhart} cannot pin itself to hart {cpu} of cell '{}': {e}; the kernel places it",
                        self.name
                    );
                    return;
                }
                Err(_) => std::thread::yield_now(),
            }
        }
    }
}
