//! The DSP graph: one node per signal object in Pd's sort order, its input wiring, and its
//! buffers; plus the dependency edges the parallel scheduler must respect.
//!
//! Dependencies are (1) signal wires and (2) Pd's sort order among objects that touch the
//! same named state (a delay line, a `send~`/`catch~` bus, the `dac~` channels): those run
//! one after the other in exactly Pd's order, so their results match Pd's even on many harts.
//!
//! # Signal buffers
//! Every signal buffer lives in one [`SignalArena`], one after the other in Pd's order and each
//! starting on a cache line (a block is a power of two of at least 16 samples, so a buffer
//! is whole lines). Two reasons, both measured on the 64-voice bench patch:
//! - **No false sharing.** Buffers from the allocator share lines with their neighbours; with
//!   two harts, the voices one hart computes then keep stealing lines from the other's.
//! - **Small footprint.** An inlet fed by exactly one source reads that buffer in place and
//!   gets no buffer of its own; only a scalar (unconnected) inlet or a sum has one. A patch's
//!   buffers then stay in the cache that computes them.
//!
//! # Concurrency
//! Each node's object sits in an [`UnsafeCell`], its buffers in the arena. A node is run only
//! by the one hart that took its task, after every predecessor finished and that was made
//! visible to this hart (the scheduler's hand-overs: the same hart running on, a deque or
//! queue, or a join's count reaching zero with acquire ordering); it writes only its own
//! buffers and reads only its predecessors' output buffers, which nobody writes until the next
//! block.

use crate::load::Program;
use crate::objects::{BackgroundTask, PdObject, Port};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use tess_sched::clock::now_ns;

/// One signal object, ready to run.
#[derive(Debug)]
pub struct Node {
    obj: UnsafeCell<Box<dyn PdObject>>,
    /// Per signal inlet: the buffer `perform` reads (the inlet's own, or its one source's).
    reads: Vec<BufId>,
    /// Per signal outlet: its buffer in the arena.
    outs: Vec<BufId>,
    /// Unconnected signal inlets: (object inlet, own buffer, bits of the value the buffer holds
    /// or [`NOT_FILLED`]). The buffer is refilled only when the value changes: nothing else
    /// writes it, and a patch's scalar inlets rarely change.
    scalars: Vec<(usize, BufId, UnsafeCell<u64>)>,
    /// Per inlet with several sources: its own buffer and the sources' buffers.
    sums: Vec<(BufId, Vec<BufId>)>,
    /// After `perform`: outlet buffers to copy (first) or add into partial sums that a node of
    /// another task reads (see [`DspGraph::plan_partial_sums`]).
    accumulate: Vec<(BufId, BufId, bool)>,
    /// The object may ask for a clock after a block.
    reports: bool,
    /// The flat object id (of the object a part belongs to, for a part).
    pub obj_id: usize,
    /// For a part of an object ([`PdObject::parallel_parts`]): the node of that object.
    pub part_of: Option<usize>,
    /// For each signal inlet: the sources `(node, signal outlet)` summed into it.
    pub sources: Vec<Vec<(usize, usize)>>,
    /// The object's inlet number of each signal inlet (for unconnected inlets' scalars).
    pub signal_inlet_ports: Vec<usize>,
    /// Nodes that must run before this one.
    pub preds: Vec<usize>,
    /// Nodes that wait for this one.
    pub succs: Vec<usize>,
    /// Relative cost (ns per block, a hint for clustering).
    pub cost_ns: u32,
    /// Per signal inlet: its own buffer in the arena (a scalar inlet or a sum), or None when
    /// it reads its one source's buffer in place.
    ins: Vec<Option<BufId>>,
    /// Per signal inlet: an earlier inlet of this node that sums the very same sources.
    same_sum_as: Vec<Option<usize>>,
}

// SAFETY: a node's cells (its object, the memo of its scalar inlets) are only touched by the
// one worker running it, with the happens-before edges described in the module docs (or through
// `&mut DspGraph` between blocks); the object itself is `Send`.
unsafe impl Sync for Node {}

/// What running a node needs first, 12 bytes in node order: reading these for every node of
/// a block touches a few cache lines in sequence, where the nodes' own vectors would each be a
/// line somewhere on the heap (measured: about 1% of the 64-voice patch's block on one hart).
#[derive(Debug, Clone, Copy, Default)]
struct RunPlan {
    /// Where the node's input buffers (`n_in`), then output buffers (`n_out`), start in
    /// [`DspGraph::io`].
    io: u32,
    n_in: u16,
    n_out: u16,
    /// [`HAS_SCALARS`], [`HAS_SUMS`], [`HAS_ACCUMULATE`], [`REPORTS`].
    flags: u8,
}

const HAS_SCALARS: u8 = 1;
const HAS_SUMS: u8 = 2;
const HAS_ACCUMULATE: u8 = 4;
const REPORTS: u8 = 8;

/// A scalar inlet's buffer holds no value yet.
const NOT_FILLED: u64 = u64::MAX;

/// A buffer in the [`SignalArena`]: its first sample's index.
#[derive(Debug, Clone, Copy)]
struct BufId(usize);

/// One cache line of samples.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; 16]);

/// Every signal buffer of a graph, each `block` samples starting on a cache line.
struct SignalArena {
    /// Owns the memory `base` points into; never touched through this field again (every
    /// access goes through `base`, so no reference to the whole arena ever exists).
    _lines: Box<[Line]>,
    base: *mut f32,
    block: usize,
    len: usize,
}

// SAFETY: the arena is plain memory; which thread may touch which buffer when is the graph's
// schedule (module docs), enforced by `run_node`'s contract.
unsafe impl Send for SignalArena {}
// SAFETY: as above.
unsafe impl Sync for SignalArena {}

impl std::fmt::Debug for SignalArena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignalArena")
            .field("buffers", &(self.len / self.block.max(1)))
            .field("block", &self.block)
            .finish()
    }
}

impl Default for SignalArena {
    fn default() -> SignalArena {
        SignalArena::new(0, 16)
    }
}

impl SignalArena {
    fn new(buffers: usize, block: usize) -> SignalArena {
        debug_assert!(block.is_multiple_of(16), "a block is whole cache lines");
        let mut lines = vec![Line([0.0; 16]); buffers * block / 16].into_boxed_slice();
        let base = lines.as_mut_ptr().cast::<f32>();
        SignalArena {
            _lines: lines,
            base,
            block,
            len: buffers * block,
        }
    }

    /// A buffer for reading.
    ///
    /// # Safety
    /// Nobody writes buffer `b` while the returned slice lives.
    unsafe fn get(&self, b: BufId) -> &[f32] {
        assert!(b.0 + self.block <= self.len);
        // SAFETY: in bounds (asserted) of a live allocation of initialised f32s; no writer, by
        // the caller's contract.
        unsafe { std::slice::from_raw_parts(self.base.add(b.0), self.block) }
    }

    /// A buffer for writing.
    ///
    /// # Safety
    /// Nobody else reads or writes buffer `b` while the returned slice lives.
    #[allow(clippy::mut_from_ref)]
    unsafe fn get_mut(&self, b: BufId) -> &mut [f32] {
        assert!(b.0 + self.block <= self.len);
        // SAFETY: in bounds (asserted); exclusive, by the caller's contract; buffers never
        // overlap (each is its own `block` samples).
        unsafe { std::slice::from_raw_parts_mut(self.base.add(b.0), self.block) }
    }
}

/// `dst += src`, sample by sample.
fn add_into(dst: &mut [f32], src: &[f32]) {
    for (d, x) in dst.iter_mut().zip(src) {
        *d += *x;
    }
}

/// The objects' background work ([`PdObject::background_tasks`]), most urgent first, run a
/// piece at a time by whichever hart has nothing else to do: the executor's worker harts
/// while they wait for the next block, and the host's thread between its blocks
/// (`Engine::run_background_until`). A hart claims a task for one piece, so two harts never
/// run the same task at once, and returns to block work at the next piece boundary.
#[derive(Debug, Default)]
pub struct Background {
    tasks: Vec<BackgroundSlot>,
    /// Pieces started with a deadline that ended after it ([`Background::overran`]).
    overran: AtomicU64,
    /// The deadline of the last gap whose shut-out tasks were looked at
    /// ([`Background::note_gap`]).
    noted_gap: AtomicU64,
}

struct BackgroundSlot {
    /// On a line of its own: idle harts try it on every spin.
    busy: crossbeam_utils::CachePadded<AtomicBool>,
    /// How long the task's pieces take (ns): a running estimate ([`PieceTime`]), written by
    /// the hart that holds the task, read by a host that must not start a piece it has no
    /// time for ([`Background::run_piece_before`]).
    piece_ns: AtomicU64,
    /// Whether `piece_ns` comes from a timed piece (else it is the task's first guess).
    timed: AtomicBool,
    /// Whether the task may have work: looked at before claiming it, so that idle harts
    /// only read while no task has work.
    probe: crate::objects::WorkProbe,
    task: UnsafeCell<Box<dyn BackgroundTask>>,
}

impl std::fmt::Debug for BackgroundSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackgroundSlot")
            .field("busy", &self.busy)
            .finish_non_exhaustive()
    }
}

/// Clears a slot's `busy` when dropped, also when its task panics (the engine's panic
/// handling may go on using the graph; a slot left busy would stall `run_all` forever).
struct Release<'a>(&'a AtomicBool);

impl Drop for Release<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

// SAFETY: a slot's task is only touched by the hart that set `busy` (acquire) until it clears
// it (release); tasks are `Send`.
unsafe impl Sync for Background {}

impl Background {
    pub(crate) fn new(mut tasks: Vec<Box<dyn BackgroundTask>>) -> Background {
        tasks.sort_by_key(|t| t.due_within_ns());
        Background {
            tasks: tasks
                .into_iter()
                .map(|t| BackgroundSlot {
                    busy: crossbeam_utils::CachePadded::new(AtomicBool::new(false)),
                    piece_ns: AtomicU64::new(t.piece_ns_hint()),
                    timed: AtomicBool::new(false),
                    probe: t.probe(),
                    task: UnsafeCell::new(t),
                })
                .collect(),
            overran: AtomicU64::new(0),
            noted_gap: AtomicU64::new(0),
        }
    }

    /// Whether there is any background work at all.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Runs one piece of the most urgent task that has work and that no other hart holds;
    /// returns whether a piece ran.
    pub fn run_piece(&self) -> bool {
        self.try_piece(None) == PieceRun::Ran
    }

    /// [`Background::run_piece`] for a host that owes a block at `deadline_ns` (on
    /// `tess_sched::clock`): only a task whose pieces are expected to end before then (by a
    /// running estimate of their length with half as much again to spare,
    /// [`PieceTime::fits`]) is run, so the block is not delayed by a piece it would have to
    /// wait for.
    pub fn run_piece_before(&self, deadline_ns: u64) -> bool {
        self.try_piece(Some(deadline_ns)) == PieceRun::Ran
    }

    /// Runs pieces while there are any that fit before `deadline_ns`
    /// ([`Background::run_piece_before`]): a host's gap until its next block; then
    /// [`Background::note_gap`] for that gap.
    pub fn run_until(&self, deadline_ns: u64) {
        let start = now_ns();
        while self.run_piece_before(deadline_ns) {}
        self.note_gap(start, deadline_ns);
    }

    /// Once per gap between blocks (per `deadline_ns`, by whichever hart asks first): a task
    /// with work whose estimate does not fit into the whole gap, `start_ns` to
    /// `deadline_ns`, has its estimate lowered by a sixty-fourth ([`PieceTime::skipped`]).
    /// With deadlines, nobody else would run such a task and time it again, so an estimate
    /// too high (a stall that stretched a run of pieces) would shut it out for good. A task
    /// whose pieces really are longer than the gaps is therefore run now and then (after
    /// about eight such gaps) and delays that block (on the host's thread) or keeps a worker
    /// out of it, rather than being late for ever: such a patch needs smaller partitions for
    /// its block size.
    ///
    /// A gap looked at before, or older than one looked at (a hart that saw a due time late),
    /// or already over when it is first looked at, is left alone: none of them says anything
    /// about the estimates.
    pub fn note_gap(&self, start_ns: u64, deadline_ns: u64) {
        if start_ns >= deadline_ns
            || self.noted_gap.load(Ordering::Relaxed) >= deadline_ns
            || self.noted_gap.fetch_max(deadline_ns, Ordering::Relaxed) >= deadline_ns
        {
            return;
        }
        let gap = deadline_ns - start_ns;
        for slot in self.tasks.iter().filter(|slot| (slot.probe)()) {
            let estimate = PieceTime(slot.piece_ns.load(Ordering::Relaxed));
            if estimate.guarded() > gap {
                // A plain store: a holder's update racing with it wins or loses, either is
                // an estimate.
                slot.piece_ns.store(estimate.skipped().0, Ordering::Relaxed);
            }
        }
    }

    /// Pieces started by [`Background::run_piece_before`] (or `run_until`), on any hart, that
    /// ended after the deadline they were started for, so far: each delayed its host's block
    /// or kept a worker out of it (a piece the kernel preempted, an estimate too low, a task
    /// run again after a shut-out).
    pub fn overran(&self) -> u64 {
        self.overran.load(Ordering::Relaxed)
    }

    /// Runs every piece there is, on the calling thread, until no task has work: waits for a
    /// task another hart holds to be given back (its work may not be done). Offline hosts
    /// call it between blocks, so that no step is ever late.
    pub fn run_all(&self) {
        loop {
            match self.try_piece(None) {
                PieceRun::Ran => {}
                PieceRun::Held => std::thread::yield_now(),
                PieceRun::Idle => return,
            }
        }
    }

    fn try_piece(&self, deadline_ns: Option<u64>) -> PieceRun {
        let mut held = false;
        // Read at the first task with work: idle harts try on every poll of the next block,
        // most of the time with nothing to do.
        let mut now = None;
        for slot in &self.tasks {
            if !(slot.probe)() {
                // No step in flight: nothing to claim (and not held: a hart that holds it
                // has finished its work).
                continue;
            }
            if let Some(deadline) = deadline_ns {
                let now = *now.get_or_insert_with(now_ns);
                if !PieceTime(slot.piece_ns.load(Ordering::Relaxed)).fits(now, deadline) {
                    // Work, but not for this host now (another task's pieces may be
                    // shorter); not held either: the next call may find time for it.
                    continue;
                }
            }
            if slot.busy.load(Ordering::Relaxed)
                || slot
                    .busy
                    .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                    .is_err()
            {
                held = true;
                continue;
            }
            let release = Release(&slot.busy);
            let started = now_ns();
            // SAFETY: this hart set `busy`: the task is its own until `release` clears it.
            let ran = unsafe { (*slot.task.get()).run_piece() };
            if ran {
                // Before the release: the estimate is the holder's to write. The first
                // timed piece replaces the task's guess whole.
                let ended = now_ns();
                if deadline_ns.is_some_and(|d| ended > d) {
                    self.overran.fetch_add(1, Ordering::Relaxed);
                }
                let known = if slot.timed.swap(true, Ordering::Relaxed) {
                    PieceTime(slot.piece_ns.load(Ordering::Relaxed))
                } else {
                    PieceTime::UNKNOWN
                };
                let took = ended.saturating_sub(started);
                slot.piece_ns.store(known.after(took).0, Ordering::Relaxed);
            }
            drop(release);
            if ran {
                return PieceRun::Ran;
            }
        }
        if held {
            PieceRun::Held
        } else {
            PieceRun::Idle
        }
    }
}

/// A running estimate of how long a task's pieces take (ns; 0: not known yet): the first
/// timed piece, then an exponentially weighted mean with weight 1/8, each sample clamped to
/// twice the estimate first. The clamp is for the pieces the kernel preempted or an interrupt
/// stretched: one such piece moves the estimate by at most an eighth, where an unclamped
/// millisecond would shut the task out of every host's gap between blocks for a long while.
/// A machine that is really slower than the first piece said still gets there, an eighth at
/// a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PieceTime(u64);

impl PieceTime {
    /// Nothing timed yet (a task's guess is only that).
    const UNKNOWN: PieceTime = PieceTime(0);

    /// The estimate after a piece that took `sample_ns`.
    fn after(self, sample_ns: u64) -> PieceTime {
        if self == PieceTime::UNKNOWN {
            return PieceTime(sample_ns.max(1));
        }
        let clamped = sample_ns.min(self.0.saturating_mul(2)) as i128;
        let est = self.0 as i128;
        PieceTime((est + (clamped - est) / 8).max(1) as u64)
    }

    /// The estimate after a gap between blocks was too short for the task: a sixty-fourth
    /// lower ([`Background::note_gap`]).
    fn skipped(self) -> PieceTime {
        PieceTime(self.0 - self.0 / 64)
    }

    /// The time to leave for a piece: the estimate is a mean over pieces of different kinds
    /// (the forward FFT, a range of partitions, the inverse FFT), each sized to about the
    /// same work, so half as much again.
    fn guarded(self) -> u64 {
        self.0.saturating_add(self.0 / 2)
    }

    /// Whether a piece started at `now_ns` is expected to end before `deadline_ns`; never
    /// when the deadline has come, even with nothing known.
    fn fits(self, now_ns: u64, deadline_ns: u64) -> bool {
        now_ns < deadline_ns && self.guarded() <= deadline_ns - now_ns
    }
}

/// What one try at background work did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PieceRun {
    /// Ran a piece.
    Ran,
    /// Ran nothing, but another hart held a task (which may have work left).
    Held,
    /// Ran nothing: no task had work.
    Idle,
}

/// The graph.
#[derive(Debug, Default)]
pub struct DspGraph {
    /// Nodes in Pd's order (a valid serial schedule), each object's parallel parts
    /// ([`PdObject::parallel_parts`]) just before it.
    pub nodes: Vec<Node>,
    /// Node of each flat object id (None for control objects).
    pub node_of: Vec<Option<usize>>,
    /// Per node: its object asked for a clock after this block (`wants_clock_after_block`).
    /// Asked on the hart that ran the node, right after `perform`, so that the control pass
    /// after the block reads these flags instead of every object: reading the objects would
    /// pull each one's state from the hart that computes it, and back, on every block.
    fired: Vec<AtomicBool>,
    /// Nodes whose objects may ask for a clock after a block.
    reporters: Vec<usize>,
    /// Per node, what running it needs first.
    plans: Vec<RunPlan>,
    /// Buffers (first sample index) of every node's inlets then outlets, in node order.
    io: Vec<u32>,
    arena: SignalArena,
    /// Samples in the arena before any partial sum buffers.
    base_len: usize,
    /// The objects' background work.
    pub background: Arc<Background>,
}

impl DspGraph {
    /// Builds the graph, taking the signal objects out of `program` (control objects stay).
    /// `order` is Pd's sort order; `block` the block size.
    pub fn build(
        program: &mut Program,
        order: &[usize],
        block: usize,
        placeholder: impl Fn() -> Box<dyn PdObject>,
    ) -> DspGraph {
        // An object's parallel parts become nodes just before it, each a predecessor of it, so
        // that node order stays a valid serial schedule (Pd's order, parts first).
        let mut slots: Vec<(usize, Option<Box<dyn PdObject>>)> = Vec::with_capacity(order.len());
        let mut background = Vec::new();
        for &id in order {
            background.extend(program.objects[id].obj.background_tasks());
            for part in program.objects[id].obj.parallel_parts() {
                slots.push((id, Some(part)));
            }
            slots.push((id, None));
        }
        let mut node_of = vec![None; program.objects.len()];
        for (k, (id, part)) in slots.iter().enumerate() {
            if part.is_none() {
                node_of[*id] = Some(k);
            }
        }
        let mut nodes: Vec<Node> = slots
            .into_iter()
            .map(|(id, part)| {
                let e = &mut program.objects[id];
                let (n_in, n_out, signal_inlet_ports) = match &part {
                    Some(_) => (0, 0, Vec::new()),
                    None => (
                        e.ins.iter().filter(|p| **p == Port::Signal).count(),
                        e.outs.iter().filter(|p| **p == Port::Signal).count(),
                        e.ins
                            .iter()
                            .enumerate()
                            .filter(|(_, p)| **p == Port::Signal)
                            .map(|(i, _)| i)
                            .collect(),
                    ),
                };
                let part_of = part
                    .as_ref()
                    .map(|_| node_of[id].expect("the owner follows its parts"));
                let obj = part.unwrap_or_else(|| std::mem::replace(&mut e.obj, placeholder()));
                // A part never reports to control (its clock would go to its object).
                let reports = part_of.is_none() && obj.reports_after_block();
                let cost_ns = obj.cost_hint_ns();
                Node {
                    obj: UnsafeCell::new(obj),
                    obj_id: id,
                    part_of,
                    signal_inlet_ports,
                    sources: vec![Vec::new(); n_in],
                    preds: Vec::new(),
                    succs: Vec::new(),
                    cost_ns,
                    ins: vec![None; n_in],
                    reads: Vec::new(),
                    sums: Vec::new(),
                    accumulate: Vec::new(),
                    scalars: Vec::new(),
                    reports,
                    same_sum_as: vec![None; n_in],
                    outs: vec![BufId(0); n_out],
                }
            })
            .collect();
        let sig_index =
            |ports: &[Port], i: usize| ports[..i].iter().filter(|p| **p == Port::Signal).count();
        let mut edges = Vec::new();
        for &(s, so, d, di) in &program.signal_edges {
            let (Some(sn), Some(dn)) = (node_of[s], node_of[d]) else {
                continue;
            };
            let so = sig_index(&program.objects[s].outs, so);
            let di = sig_index(&program.objects[d].ins, di);
            nodes[dn].sources[di].push((sn, so));
            edges.push((sn, dn));
        }
        // each part before the object it belongs to
        edges.extend(
            nodes
                .iter()
                .enumerate()
                .filter_map(|(k, n)| n.part_of.map(|owner| (k, owner))),
        );
        // Pd's order among users of the same named state
        let mut last_user: std::collections::HashMap<&str, usize> = Default::default();
        for &id in order {
            let k = node_of[id].expect("every object of the order has a node");
            if let Some(r) = program.objects[id].resource.as_deref() {
                if let Some(&prev) = last_user.get(r) {
                    edges.push((prev, k));
                }
                last_user.insert(r, k);
            }
        }
        edges.sort_unstable();
        edges.dedup();
        for (a, b) in edges {
            if a != b {
                nodes[b].preds.push(a);
                nodes[a].succs.push(b);
            }
        }
        // buffers in Pd's order, each node's inlets then outlets
        let mut next = 0;
        let mut take = || {
            let b = BufId(next);
            next += block;
            b
        };
        for node in &mut nodes {
            for (i, srcs) in node.sources.iter().enumerate() {
                if srcs.len() != 1 {
                    node.ins[i] = Some(take());
                }
            }
            for o in node.outs.iter_mut() {
                *o = take();
            }
        }
        // An inlet summing exactly the sources an earlier inlet of the same node sums (a
        // stereo `dac~` fed the same voices on both sides) reads that inlet's sum.
        for node in &mut nodes {
            for i in 1..node.sources.len() {
                if node.sources[i].len() < 2 {
                    continue;
                }
                if let Some(j) = (0..i).find(|&j| node.sources[j] == node.sources[i]) {
                    node.same_sum_as[i] = Some(j);
                }
            }
        }
        // what each inlet reads, resolved once
        for k in 0..nodes.len() {
            let reads: Vec<BufId> = nodes[k]
                .sources
                .iter()
                .zip(&nodes[k].ins)
                .enumerate()
                .map(|(i, (srcs, own))| match nodes[k].same_sum_as[i] {
                    Some(j) => nodes[k].ins[j].expect("a sum has its own buffer"),
                    None => own.unwrap_or_else(|| nodes[srcs[0].0].outs[srcs[0].1]),
                })
                .collect();
            let sums = nodes[k]
                .sources
                .iter()
                .zip(&nodes[k].ins)
                .zip(&nodes[k].same_sum_as)
                .filter(|((srcs, _), same)| srcs.len() > 1 && same.is_none())
                .map(|((srcs, own), _)| {
                    let from = srcs.iter().map(|&(s, o)| nodes[s].outs[o]).collect();
                    (own.expect("a sum has its own buffer"), from)
                })
                .collect();
            let scalars = nodes[k]
                .sources
                .iter()
                .zip(&nodes[k].ins)
                .zip(&nodes[k].signal_inlet_ports)
                .filter(|((srcs, _), _)| srcs.is_empty())
                .map(|((_, own), &port)| {
                    let own = own.expect("a scalar inlet has its own buffer");
                    (port, own, UnsafeCell::new(NOT_FILLED))
                })
                .collect();
            nodes[k].reads = reads;
            nodes[k].sums = sums;
            nodes[k].scalars = scalars;
        }
        let arena = SignalArena::new(next / block, block);
        let fired = nodes.iter().map(|_| AtomicBool::new(false)).collect();
        let reporters = (0..nodes.len()).filter(|&k| nodes[k].reports).collect();
        let mut g = DspGraph {
            nodes,
            node_of,
            fired,
            reporters,
            plans: Vec::new(),
            io: Vec::new(),
            arena,
            base_len: next,
            background: Arc::new(Background::new(background)),
        };
        g.make_plans();
        g
    }

    /// Fills `plans` and `io` from the nodes.
    fn make_plans(&mut self) {
        self.io.clear();
        self.plans.clear();
        for node in &self.nodes {
            let io = u32::try_from(self.io.len()).expect("fewer than 2^32 buffers");
            let offset = |b: &BufId| u32::try_from(b.0).expect("an arena under 2^32 samples");
            self.io.extend(node.reads.iter().map(offset));
            self.io.extend(node.outs.iter().map(offset));
            let flag = |on: bool, f: u8| if on { f } else { 0 };
            self.plans.push(RunPlan {
                io,
                n_in: u16::try_from(node.reads.len()).expect("fewer than 2^16 inlets"),
                n_out: u16::try_from(node.outs.len()).expect("fewer than 2^16 outlets"),
                flags: flag(!node.scalars.is_empty(), HAS_SCALARS)
                    | flag(!node.sums.is_empty(), HAS_SUMS)
                    | flag(!node.accumulate.is_empty(), HAS_ACCUMULATE)
                    | flag(node.reports, REPORTS),
            });
        }
    }

    /// Calls node's `perform` with its buffers in arrays of `I` inputs and `O` outputs (at
    /// least as many as it has). Called from `run_node`, under its contract.
    #[inline(always)]
    fn perform_on_stack<const I: usize, const O: usize>(
        &self,
        io: &[u32],
        n_in: usize,
        obj: &mut Box<dyn PdObject>,
    ) {
        let arena = &self.arena;
        let (ins, outs_at) = io.split_at(n_in);
        let mut views: [&[f32]; I] = [&[]; I];
        for (v, &b) in views.iter_mut().zip(ins) {
            // SAFETY: the node's own input buffers (written before this, no longer borrowed
            // mutably) or its single sources' outputs (finished predecessors; a node feeding
            // itself is a DSP loop, which `sort` refuses before a graph is built, so a read
            // never aliases an output).
            *v = unsafe { arena.get(BufId(b as usize)) };
        }
        let mut outs: [&mut [f32]; O] = std::array::from_fn(|_| <&mut [f32]>::default());
        for (slot, &b) in outs.iter_mut().zip(outs_at) {
            // SAFETY: the node's outputs are its own; no successor runs before it ends.
            *slot = unsafe { arena.get_mut(BufId(b as usize)) };
        }
        obj.perform(&views[..n_in], &mut outs[..outs_at.len()]);
    }

    /// Sums that gather from many tasks, computed in parts: for a task that feeds several sources
    /// into an inlet of a node in another task (64 voices into one `dac~` inlet), the task adds
    /// its sources into a partial buffer as it runs them, in its own cache, and the inlet sums
    /// the few partials instead of reading every source from another hart's cache.
    ///
    /// `task_of[k]` is node k's task; a task runs its nodes in Pd's order on one hart. The
    /// float order of a sum changes (the parts are added per task), within what compatibility
    /// allows. Call before a block, never during one; buffer contents start from zero.
    pub fn plan_partial_sums(&mut self, task_of: &[usize]) {
        let block = self.arena.block;
        let mut next = self.base_len;
        let mut plans: Vec<(usize, usize, BufId, Vec<BufId>)> = Vec::new(); // (node, sum, own, from)
        let mut accumulate: Vec<Vec<(BufId, BufId, bool)>> = vec![Vec::new(); self.nodes.len()];
        // one partial per set of sources: a stereo `dac~` fed the same voices on both inlets
        // sums them once
        let mut made: std::collections::HashMap<Vec<(usize, usize)>, BufId> = Default::default();
        for (d, node) in self.nodes.iter().enumerate() {
            let mut si = 0;
            for ((srcs, own), same) in node.sources.iter().zip(&node.ins).zip(&node.same_sum_as) {
                if srcs.len() < 2 || same.is_some() {
                    continue;
                }
                let own = own.expect("a sum has its own buffer");
                let mut by_task: std::collections::BTreeMap<usize, Vec<(usize, usize)>> =
                    Default::default();
                for &(s, o) in srcs {
                    by_task.entry(task_of[s]).or_default().push((s, o));
                }
                let mut from = Vec::new();
                for (t, mut group) in by_task {
                    if group.len() < 2 || t == task_of[d] {
                        from.extend(group.iter().map(|&(s, o)| self.nodes[s].outs[o]));
                        continue;
                    }
                    group.sort_unstable();
                    let partial = *made.entry(group.clone()).or_insert_with(|| {
                        let partial = BufId(next);
                        next += block;
                        for (i, &(s, o)) in group.iter().enumerate() {
                            accumulate[s].push((self.nodes[s].outs[o], partial, i == 0));
                        }
                        partial
                    });
                    from.push(partial);
                }
                plans.push((d, si, own, from));
                si += 1;
            }
        }
        for (node, acc) in self.nodes.iter_mut().zip(accumulate) {
            node.accumulate = acc;
            // the new arena starts zeroed
            for (_, _, held) in &mut node.scalars {
                *held.get_mut() = NOT_FILLED;
            }
        }
        for (d, si, own, from) in plans {
            self.nodes[d].sums[si] = (own, from);
        }
        self.arena = SignalArena::new(next / block, block);
        self.make_plans();
    }

    /// The nodes whose objects may ask for a clock after a block, in node order.
    pub fn reporters(&self) -> &[usize] {
        &self.reporters
    }

    /// Whether node `k`'s object asked for a clock after the last block (and forgets it).
    pub fn take_fired(&self, k: usize) -> bool {
        // Only a flag that is set is written, so the flags' lines stay shared between harts.
        self.fired[k].load(Ordering::Relaxed) && self.fired[k].swap(false, Ordering::Relaxed)
    }

    /// The object of a node, for control messages between blocks.
    pub fn obj_mut(&mut self, node: usize) -> &mut Box<dyn PdObject> {
        self.nodes[node].obj.get_mut()
    }

    /// Runs node `k`: gathers its inputs and calls its perform routine.
    ///
    /// # Safety
    /// No other thread runs `k` or any node that reads or writes what `k` does at the same time:
    /// every predecessor of `k` has finished (and that is visible to this thread), no successor
    /// of `k` has started, and `k` runs once per block.
    pub unsafe fn run_node(&self, k: usize) {
        let plan = self.plans[k];
        let node = &self.nodes[k];
        // SAFETY: the caller guarantees exclusive access to node k's object.
        let obj = unsafe { &mut *node.obj.get() };
        let arena = &self.arena;
        // An inlet with one source reads that source's buffer in place, as Pd does; only a
        // scalar (unconnected) inlet or a sum of several sources is written into the node's own
        // input buffer first.
        if plan.flags & HAS_SCALARS != 0 {
            for (port, own, held) in &node.scalars {
                let v = obj.signal_scalar(*port);
                // SAFETY: node k's own buffers and memo are touched only by whoever runs k.
                unsafe {
                    if *held.get() != u64::from(v.to_bits()) {
                        arena.get_mut(*own).fill(v);
                        *held.get() = u64::from(v.to_bits());
                    }
                }
            }
        }
        if plan.flags & HAS_SUMS != 0 {
            for (own, from) in &node.sums {
                // SAFETY: node k's own buffer, as above; `from` are outputs of predecessors,
                // finished, not written until the next block.
                let (buf, first) = unsafe { (arena.get_mut(*own), arena.get(from[0])) };
                buf.copy_from_slice(first);
                for &src in &from[1..] {
                    // SAFETY: as above.
                    add_into(buf, unsafe { arena.get(src) });
                }
            }
        }
        // Most objects have at most two signal inlets and outlets: a small array then costs
        // less to set up per block than the 16 inlets a `dac~` of the emulator needs; only an
        // object with more than 16 inlets or 4 outlets pays an allocation per block.
        let (n_in, n_out) = (plan.n_in as usize, plan.n_out as usize);
        let io = &self.io[plan.io as usize..plan.io as usize + n_in + n_out];
        if n_in <= 2 && n_out <= 2 {
            self.perform_on_stack::<2, 2>(io, n_in, obj);
        } else if n_in <= 16 && n_out <= 4 {
            self.perform_on_stack::<16, 4>(io, n_in, obj);
        } else {
            let (ins, outs_at) = io.split_at(n_in);
            // SAFETY: as in `perform_on_stack`.
            let views: Vec<&[f32]> = ins
                .iter()
                .map(|&b| unsafe { arena.get(BufId(b as usize)) })
                .collect();
            let mut outs: Vec<&mut [f32]> = outs_at
                .iter()
                // SAFETY: as in `perform_on_stack`.
                .map(|&b| unsafe { arena.get_mut(BufId(b as usize)) })
                .collect();
            obj.perform(&views, &mut outs);
        }
        if plan.flags & HAS_ACCUMULATE != 0 {
            for &(out, partial, first) in &node.accumulate {
                // SAFETY: the partial belongs to node k's task, which runs its nodes one after
                // the other on one hart; its reader is in a later task; `out` is k's own, just
                // written.
                let (p, o) = unsafe { (arena.get_mut(partial), arena.get(out)) };
                if first {
                    p.copy_from_slice(o);
                } else {
                    add_into(p, o);
                }
            }
        }
        if plan.flags & REPORTS != 0 && obj.wants_clock_after_block() {
            // Read after the block by the thread that ran it, which the block's completion
            // (an acquire of the done count) orders after this store.
            self.fired[k].store(true, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// A background task whose pieces sleep `piece`, `pieces` of them.
    #[derive(Debug)]
    struct Sleeper {
        piece: std::time::Duration,
        hint_ns: u64,
        left: usize,
        ran: Arc<AtomicUsize>,
    }

    impl BackgroundTask for Sleeper {
        fn run_piece(&mut self) -> bool {
            if self.left == 0 {
                return false;
            }
            std::thread::sleep(self.piece);
            self.left -= 1;
            self.ran.fetch_add(1, Ordering::Relaxed);
            true
        }
        fn due_within_ns(&self) -> u64 {
            1_000_000_000
        }
        fn piece_ns_hint(&self) -> u64 {
            self.hint_ns
        }
    }

    fn sleeper(piece_us: u64, hint_ns: u64, pieces: usize) -> (Background, Arc<AtomicUsize>) {
        let ran = Arc::new(AtomicUsize::new(0));
        let task = Sleeper {
            piece: std::time::Duration::from_micros(piece_us),
            hint_ns,
            left: pieces,
            ran: ran.clone(),
        };
        (Background::new(vec![Box::new(task)]), ran)
    }

    /// A deadline no test thread can miss, however loaded the machine.
    const FAR_NS: u64 = 10_000_000_000;

    #[test]
    fn a_piece_expected_to_end_after_the_deadline_is_not_started() {
        let (bg, ran) = sleeper(100, 5_000_000, 1);
        // guessed at 5 ms: not with 1 ms to go
        assert!(!bg.run_piece_before(now_ns() + 1_000_000));
        assert_eq!(ran.load(Ordering::Relaxed), 0);
        assert!(bg.run_piece_before(now_ns() + FAR_NS));
        assert_eq!(ran.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn the_first_timed_piece_replaces_the_guess() {
        // guessed at 1 us, takes at least 2 ms: known after one piece
        let (bg, ran) = sleeper(2_000, 1_000, 2);
        assert!(!bg.run_piece_before(now_ns() - 1), "no time left");
        assert!(bg.run_piece_before(now_ns() + FAR_NS));
        assert_eq!(ran.load(Ordering::Relaxed), 1);
        assert!(bg.tasks[0].piece_ns.load(Ordering::Relaxed) >= 2_000_000);
        // so not started with 1 ms to go
        assert!(!bg.run_piece_before(now_ns() + 1_000_000));
        assert_eq!(ran.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_piece_that_ends_past_its_deadline_is_counted() {
        // guessed at 1 us, takes at least 2 ms: started with 1 ms to go, ends past it
        let (bg, ran) = sleeper(2_000, 1_000, 1);
        assert!(bg.run_piece_before(now_ns() + 1_000_000));
        assert_eq!(ran.load(Ordering::Relaxed), 1);
        assert_eq!(bg.overran(), 1);
        // with no deadline nothing is counted
        let (bg, _) = sleeper(2_000, 1_000, 1);
        assert!(bg.run_piece());
        assert_eq!(bg.overran(), 0);
    }

    #[test]
    fn run_until_stops_when_no_piece_fits() {
        // pieces of at least 1 ms (a sleep), 100 ms to go: never 100 (at least one runs
        // unless this thread lost the CPU for the whole gap)
        let (bg, ran) = sleeper(1_000, 1_000_000, 1_000);
        bg.run_until(now_ns() + 100_000_000);
        assert!(ran.load(Ordering::Relaxed) < 100);
    }

    #[test]
    fn a_task_shut_out_by_a_high_estimate_gets_another_try() {
        // guessed at 10 ms, never run in gaps of 1 ms until the gaps it did not fit have
        // brought the guess down; on one hart nobody else would time it (each gap has a
        // deadline of its own: a gap is looked at once)
        let (bg, ran) = sleeper(10, 10_000_000, 1);
        let mut gaps = 0;
        while ran.load(Ordering::Relaxed) == 0 {
            gaps += 1;
            assert!(gaps < 1_000, "never tried again");
            bg.run_until(now_ns() + 1_000_000);
        }
        assert!(gaps > 100, "{gaps}");
        // a gap is looked at once, whoever asks; an older gap or one already over not at all
        let (bg, _) = sleeper(10, 10_000_000, 1);
        let lowered = 10_000_000 - 156_250;
        for _ in 0..10 {
            bg.note_gap(1_000, 2_000);
        }
        assert_eq!(bg.tasks[0].piece_ns.load(Ordering::Relaxed), lowered);
        bg.note_gap(500, 1_500);
        bg.note_gap(3_000, 3_000);
        assert_eq!(bg.tasks[0].piece_ns.load(Ordering::Relaxed), lowered);
        // a single try does not lower it
        let (bg, _) = sleeper(10, 10_000_000, 1);
        for _ in 0..300 {
            bg.run_piece_before(now_ns() + 1_000_000);
        }
        assert_eq!(bg.tasks[0].piece_ns.load(Ordering::Relaxed), 10_000_000);
    }

    #[test]
    fn a_gap_that_could_have_held_the_piece_does_not_lower_its_estimate() {
        // a task whose work is held by another hart, with an estimate of 1 ms: a gap of
        // 50 ms that ends with it still there leaves the estimate alone
        let (bg, _) = sleeper(10, 1_000_000, 1);
        bg.tasks[0].busy.store(true, Ordering::Relaxed);
        bg.run_until(now_ns() + 50_000_000);
        assert_eq!(bg.tasks[0].piece_ns.load(Ordering::Relaxed), 1_000_000);
    }

    #[test]
    fn fits_leaves_half_as_much_again_and_never_past_the_deadline() {
        assert!(PieceTime(100).fits(1_000, 1_150));
        assert!(!PieceTime(100).fits(1_000, 1_149));
        assert!(!PieceTime(0).fits(1_000, 1_000), "the deadline has come");
        assert!(PieceTime(0).fits(1_000, 1_001));
        assert!(!PieceTime(100).fits(2_000, 1_000));
        assert!(!PieceTime(u64::MAX).fits(1, u64::MAX), "no overflow");
    }

    #[test]
    fn the_estimate_follows_the_pieces_but_not_one_outlier() {
        let est = PieceTime(80_000);
        // a preempted piece of 5 ms: counted as twice the estimate, an eighth of the way
        assert_eq!(est.after(5_000_000), PieceTime(90_000));
        // a run of slower pieces gets there
        let mut e = est;
        for _ in 0..64 {
            e = e.after(200_000);
        }
        assert!(e.0 > 195_000, "{e:?}");
        // unknown: the first sample is taken whole
        assert_eq!(PieceTime(0).after(5_000_000), PieceTime(5_000_000));
        assert_eq!(PieceTime(6_400).skipped(), PieceTime(6_300));
        assert_eq!(PieceTime(80_000).guarded(), 120_000);
    }
}
