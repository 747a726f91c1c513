//! Parallel execution of the DSP graph, per block (seed 001 section 2.2).
//!
//! **Tasks.** Running each object as its own task costs more in synchronisation than small
//! objects compute, so nodes are merged into tasks first (section 2.2: "aggregating multiple
//! nodes into a single executable unit ... any grouping that preserves the dependencies is
//! valid"). [`cluster`] merges by cost with two rules that never create a cycle, so a voice
//! `osc~ -> vcf~ -> env~` becomes one task while 64 voices stay 64 tasks.
//!
//! **Scheduling.** Per block, the tasks without predecessors are ready; a task becomes ready
//! when its predecessors have finished (a join's count of them is reset each block). Two
//! dynamic strategies (section 2.2, [6] in the paper):
//! - [`Strategy::GlobalQueue`]: one shared ready queue every hart pops from and pushes to.
//! - [`Strategy::WorkStealing`]: a local deque per hart; a hart pushes the tasks it makes
//!   ready onto its own deque (LIFO, cache-warm) and steals from the others when empty
//!   (Blumofe and Leiserson [4]). The tasks ready at a block's start are dealt out once, by
//!   cost, to "home" harts: each hart claims its own first, so a task runs on the same hart
//!   block after block and finds its state in that hart's cache; a hart that runs out claims
//!   the others' (a late or preempted hart's share is taken over, never waited for).
//!
//! **Hand-overs.** Every line one hart writes and another reads costs a transfer between caches
//! (a few hundred ns on the 2-vCPU machine here), so the harts share as few as they can: every
//! counter sits on its own cache line; a task with one predecessor runs on the hart that
//! finished that one, with no count and no queue; a hart reports only the sink tasks it
//! finished, in a count of its own; an idle hart reads the others' queues less and less often,
//! and a home list it found claimed to the end not again in that block; and a hart looks at its
//! deque before popping it.
//!
//! The caller's thread is hart 0; `harts - 1` worker threads spin between blocks (a real-time
//! audio cell owns its harts, so spinning is its business), yielding after a while.

use crate::graph::DspGraph;
use crossbeam_deque::{Injector, Steal, Stealer, Worker};
use crossbeam_utils::CachePadded;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// How ready tasks are shared among harts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
pub enum Strategy {
    /// One thread, Pd's order.
    Serial,
    /// A global ready queue.
    GlobalQueue,
    /// Local queues with work stealing.
    WorkStealing,
}

/// Tasks made from the graph's nodes.
#[derive(Debug, Default)]
pub struct TaskGraph {
    /// Each task's nodes, in a valid order.
    pub tasks: Vec<Vec<usize>>,
    /// Task dependencies: number of predecessors.
    pub npreds: Vec<usize>,
    /// Successor tasks.
    pub succs: Vec<Vec<usize>>,
}

impl TaskGraph {
    /// Clusters nodes into tasks by cost (see the module docs).
    pub fn from_graph(g: &DspGraph, harts: usize) -> TaskGraph {
        cluster(g, harts)
    }
}

/// A task while clustering.
#[derive(Debug, Clone)]
struct Cluster {
    nodes: Vec<usize>,
    cost: u64,
    preds: BTreeSet<usize>,
    succs: BTreeSet<usize>,
    /// Made of an object's parallel parts: merges only with other parts, never into the
    /// object it belongs to (a part is there to run beside it, on another hart).
    parts: bool,
}

/// Merges nodes into tasks. Two merges never create a cycle:
/// - **absorb a successor** B into A when A is B's only predecessor task (any other path from
///   A to B would enter B through another predecessor);
/// - **absorb a predecessor** A into B when B is A's only successor task (any other path from
///   A to B would leave A through another successor).
///
/// A cluster of an object's parallel parts never merges with anything but other parts: a
/// part is there to run beside its object on another hart (its cost hint is small only
/// because it averages its level's FFT blocks with its lighter ones).
///
/// Pure chains (A's only successor is B and B's only predecessor is A) always merge; other
/// merges only while the task's cost stays under `total / (2 * harts)`, so a wide graph keeps
/// two tasks or more for every hart (enough to even out costs the hints got wrong, few enough
/// that claiming and handing over tasks stays a small part of a block: with four per hart the
/// 64-voice bench patch ran 4% slower on 2 harts, with one 8%); and a predecessor is absorbed
/// only into a task with at most two predecessors (a `+~` of a mixing tree, not a 64-input `dac~` that would serialise the
/// voices behind it).
fn cluster(g: &DspGraph, harts: usize) -> TaskGraph {
    let n = g.nodes.len();
    let mut cl: Vec<Option<Cluster>> = g
        .nodes
        .iter()
        .enumerate()
        .map(|(k, node)| {
            Some(Cluster {
                nodes: vec![k],
                cost: node.cost_ns as u64,
                preds: node.preds.iter().copied().collect(),
                succs: node.succs.iter().copied().collect(),
                parts: node.part_of.is_some(),
            })
        })
        .collect();
    let total: u64 = cl.iter().flatten().map(|c| c.cost).sum();
    let cap = (total / (2 * harts.max(1) as u64)).max(1);
    let merge = |cl: &mut Vec<Option<Cluster>>, a: usize, b: usize| {
        // b into a
        let bc = cl[b].take().expect("live");
        for &p in &bc.preds {
            if p != a {
                let pc = cl[p].as_mut().expect("live");
                pc.succs.remove(&b);
                pc.succs.insert(a);
            }
        }
        for &s in &bc.succs {
            if s != a {
                let sc = cl[s].as_mut().expect("live");
                sc.preds.remove(&b);
                sc.preds.insert(a);
            }
        }
        let ac = cl[a].as_mut().expect("live");
        ac.succs.remove(&b);
        ac.preds.remove(&b);
        ac.nodes.extend(bc.nodes);
        ac.cost += bc.cost;
        ac.preds.extend(bc.preds.into_iter().filter(|&p| p != a));
        ac.succs.extend(bc.succs.into_iter().filter(|&s| s != a));
    };
    let mut changed = true;
    while changed {
        changed = false;
        for b in 0..n {
            let Some(bc) = &cl[b] else { continue };
            if bc.preds.len() == 1 {
                let a = *bc.preds.iter().next().expect("one");
                let ac = cl[a].as_ref().expect("live");
                let chain = ac.succs.len() == 1;
                if ac.parts == bc.parts && (chain || ac.cost + bc.cost <= cap) {
                    merge(&mut cl, a, b);
                    changed = true;
                    continue;
                }
            }
        }
        for a in 0..n {
            let Some(ac) = &cl[a] else { continue };
            if ac.succs.len() == 1 {
                let b = *ac.succs.iter().next().expect("one");
                let bc = cl[b].as_ref().expect("live");
                if ac.parts == bc.parts && bc.preds.len() <= 2 && ac.cost + bc.cost <= cap {
                    // keep the id of the absorbing task b; nodes are re-sorted below
                    merge(&mut cl, b, a);
                    changed = true;
                }
            }
        }
        // siblings: tasks with the same predecessors and the same successors have no path
        // between them (one would need the other among its ancestors), so they merge safely;
        // pack them into tasks of up to `cap` (64 voices into a mixer become a few tasks)
        let mut groups: std::collections::BTreeMap<(Vec<usize>, Vec<usize>, bool), Vec<usize>> =
            Default::default();
        for (k, c) in cl.iter().enumerate() {
            if let Some(c) = c {
                let key = (
                    c.preds.iter().copied().collect(),
                    c.succs.iter().copied().collect(),
                    c.parts,
                );
                groups.entry(key).or_default().push(k);
            }
        }
        for members in groups.into_values().filter(|m| m.len() > 1) {
            let mut head = members[0];
            for &m in &members[1..] {
                let (hc, mc) = (
                    cl[head].as_ref().expect("live").cost,
                    cl[m].as_ref().expect("live").cost,
                );
                if hc + mc <= cap {
                    merge(&mut cl, head, m);
                    changed = true;
                } else {
                    head = m;
                }
            }
        }
    }
    let live: Vec<usize> = (0..n).filter(|&k| cl[k].is_some()).collect();
    let mut index = vec![usize::MAX; n];
    for (t, &k) in live.iter().enumerate() {
        index[k] = t;
    }
    let mut tasks = Vec::with_capacity(live.len());
    let mut succs = Vec::with_capacity(live.len());
    let mut npreds = Vec::with_capacity(live.len());
    for &k in &live {
        let c = cl[k].as_ref().expect("live");
        let mut nodes = c.nodes.clone();
        nodes.sort_unstable(); // Pd's order is topological
        tasks.push(nodes);
        succs.push(c.succs.iter().map(|&s| index[s]).collect());
        npreds.push(c.preds.len());
    }
    TaskGraph {
        tasks,
        npreds,
        succs,
    }
}

/// State shared by the harts. Queue items are `(block epoch << 32) | task`; the per-task counts
/// come in two sets used by alternate blocks, so the calling thread can start the next block
/// without waiting for the other harts to notice that this one ended: a late hart only ever
/// finds items of the current block, and uses the set its item names.
pub(crate) struct Shared {
    graph: CachePadded<AtomicPtr<DspGraph>>,
    epoch: CachePadded<AtomicU64>,
    stop: AtomicBool,
    remaining: [Vec<CachePadded<AtomicUsize>>; 2],
    /// Per hart, the sink tasks (no successors) it finished since the executor started, written
    /// by that hart alone. Block `e` is complete when they sum to `e * sinks`, since every task
    /// is a sink or runs before one. Only idle harts read them, and a count changes once per
    /// sink and block, so polling takes nothing from the busy harts' caches.
    sinks_done: Vec<CachePadded<AtomicU64>>,
    /// Number of sink tasks.
    sinks: u64,
    /// Work stealing: the block-start tasks each hart claims first.
    home: Vec<Vec<usize>>,
    /// Work stealing: who last claimed each block-start task, as [`claim_word`].
    claimed: Vec<CachePadded<AtomicU64>>,
    injector: Injector<u64>,
    stealers: Vec<Stealer<u64>>,
    strategy: Strategy,
    /// Tasks each hart ran (statistics).
    ran: Vec<CachePadded<AtomicU64>>,
    /// The tasks, alive as long as any hart holds this state: a hart may still be leaving its
    /// last task when the executor splits the graph again (`Executor::retire`) or ends.
    task_graph: Arc<TaskGraph>,
    /// The graph's background work, run by harts waiting for the next block.
    background: Arc<crate::graph::Background>,
    /// When the host's next block is due (`tess_sched::clock` ns; 0: not said), so that
    /// waiting harts start no background piece expected to end after it
    /// ([`Executor::expect_next_block`]). Written once a block, on a line of its own.
    next_block_due: CachePadded<AtomicU64>,
}

/// `n` zeroed values, each on its own cache line.
fn padded<T: Default>(n: usize) -> Vec<CachePadded<T>> {
    (0..n).map(|_| CachePadded::new(T::default())).collect()
}

impl Shared {
    /// State for the tasks of `tg` on one hart per `home` list.
    fn new(
        strategy: Strategy,
        tg: Arc<TaskGraph>,
        home: Vec<Vec<usize>>,
        stealers: Vec<Stealer<u64>>,
        background: Arc<crate::graph::Background>,
    ) -> Shared {
        let (nt, harts) = (tg.tasks.len(), home.len());
        Shared {
            sinks: tg.succs.iter().filter(|s| s.is_empty()).count() as u64,
            task_graph: tg,
            graph: CachePadded::new(AtomicPtr::new(std::ptr::null_mut())),
            epoch: CachePadded::default(),
            stop: AtomicBool::new(false),
            remaining: [padded(nt), padded(nt)],
            sinks_done: padded(harts),
            home,
            claimed: padded(nt),
            injector: Injector::new(),
            stealers,
            strategy,
            ran: padded(harts),
            background,
            next_block_due: CachePadded::default(),
        }
    }

    fn block_done(&self, e: u64) -> bool {
        let done: u64 = self
            .sinks_done
            .iter()
            .map(|d| d.load(Ordering::Acquire))
            .sum();
        done >= e * self.sinks
    }

    /// Claims block-start task `t` for block `e` as hart `me`; false if a hart already did,
    /// for this block or a later one (a hart still finishing block `e` after the next started
    /// must not take the next block's tasks for its own: epochs only grow).
    fn claim(&self, t: usize, e: u64, me: usize) -> bool {
        let c = &self.claimed[t];
        let prev = c.load(Ordering::Relaxed);
        prev >> CLAIMER_BITS < e
            && c.compare_exchange(prev, claim_word(e, me), Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
    }

    /// Takes one of hart `h`'s block-start tasks for hart `me`, from the end of `h`'s list (`h`
    /// claims from the front). Tasks other thieves took already are passed over; one `h` took
    /// means thieves and owner met and nothing is left. So an idle hart reads the lines of the
    /// tasks stolen so far and one of `h`'s, instead of taking all of them out of `h`'s cache.
    fn steal_home(&self, h: usize, me: usize, e: u64) -> Option<usize> {
        for &t in self.home[h].iter().rev() {
            let c = self.claimed[t].load(Ordering::Relaxed);
            if c >> CLAIMER_BITS >= e {
                if c & CLAIMER_MASK == h as u64 {
                    return None;
                }
                continue;
            }
            if self.claim(t, e, me) {
                return Some(t);
            }
            // another thief (or the owner) took it just now: look at it again
            let c = self.claimed[t].load(Ordering::Relaxed);
            if c & CLAIMER_MASK == h as u64 {
                return None;
            }
        }
        None
    }
}

/// Bits of a claim word that name the claiming hart; the rest is the block epoch.
const CLAIMER_BITS: u32 = 16;
const CLAIMER_MASK: u64 = (1 << CLAIMER_BITS) - 1;

/// A claim: block `e`, by hart `me`.
fn claim_word(e: u64, me: usize) -> u64 {
    (e << CLAIMER_BITS) | (me as u64 & CLAIMER_MASK)
}

/// Deals the block-start tasks (no predecessors) out to `harts` home lists: runs of tasks
/// adjacent in Pd's order (so in memory: nodes, objects and signal buffers are laid out in that
/// order), cut where the running cost passes each hart's share.
///
/// Contiguous rather than round robin because interleaving is slow here: a hart streaming
/// through its task's buffers makes the hardware prefetcher run ahead into the next task's
/// lines, and when another hart owns that task, it takes them away from that hart's cache at
/// every boundary. Measured on the 64-voice patch, alternating 8-voice tasks between two harts
/// cost about 1 us per task.
fn deal_home(g: &DspGraph, tg: &TaskGraph, harts: usize) -> Vec<Vec<usize>> {
    let cost = |t: usize| -> u64 { tg.tasks[t].iter().map(|&k| g.nodes[k].cost_ns as u64).sum() };
    let mut starts: Vec<usize> = (0..tg.tasks.len()).filter(|&t| tg.npreds[t] == 0).collect();
    starts.sort_by_key(|&t| tg.tasks[t].first().copied().unwrap_or(0));
    let total: u64 = starts.iter().map(|&t| cost(t)).sum();
    let mut home = vec![Vec::new(); harts];
    let mut done = 0u64;
    for t in starts {
        let c = cost(t);
        // the hart whose share the task's midpoint falls in
        let mid = done + c / 2;
        let h = ((mid as u128 * harts as u128) / total.max(1) as u128) as usize;
        home[h.min(harts - 1)].push(t);
        done += c;
    }
    home
}

/// Runs blocks of a graph with a strategy on a number of harts.
pub struct Executor {
    strategy: Strategy,
    harts: usize,
    /// The harts are a tess runtime's, not threads of the executor's own ([`crate::cell`]).
    host: Option<Arc<crate::cell::Host>>,
    /// The host's adaptations the current split was made after.
    adaptations_seen: u64,
    /// The harts of each split of the graph so far.
    splits: Vec<usize>,
    shared: Option<Arc<Shared>>,
    hart0: Option<Hart>,
    rt_priority: Option<i32>,
    threads: Vec<std::thread::JoinHandle<()>>,
    pin_first_cpu: Option<usize>,
    /// The host's last word on when its next block is due ([`Executor::expect_next_block`]),
    /// kept here so that a new split of the graph starts with it.
    next_block_due: u64,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("strategy", &self.strategy)
            .field("harts", &self.harts)
            .finish()
    }
}

impl Executor {
    /// A serial executor (Pd's own order on the calling thread).
    pub fn serial() -> Executor {
        Executor::new(Strategy::Serial, 1)
    }

    /// An executor; threads start at the first block.
    pub fn new(strategy: Strategy, harts: usize) -> Executor {
        Executor {
            strategy,
            harts: harts.clamp(1, CLAIMER_MASK as usize),
            shared: None,
            hart0: None,
            threads: Vec::new(),
            pin_first_cpu: None,
            rt_priority: None,
            host: None,
            adaptations_seen: 0,
            splits: Vec::new(),
            next_block_due: 0,
        }
    }

    /// An executor whose harts other than the caller's are the worker tasks of `host` (a tess
    /// runtime's vharts, [`crate::cell`]); it follows the host's count of harts between blocks.
    pub(crate) fn hosted(strategy: Strategy, host: Arc<crate::cell::Host>) -> Executor {
        let mut e = Executor::new(strategy, host.harts());
        e.host = Some(host);
        e
    }

    /// Harts the executor runs on now (the caller's thread and its workers).
    pub fn harts(&self) -> usize {
        self.harts
    }

    /// The tess runtime whose harts this executor runs on ([`crate::cell::run_on_harts`]), to
    /// stop it or (standalone) resize it.
    pub fn runtime(&self) -> Option<tess_runtime::Handle> {
        self.host.as_ref().and_then(|h| h.handle())
    }

    /// On a tess runtime's harts: lets the runtime read tessd's messages now. [`run_block`]
    /// does so before each block; a program that waits without running blocks (a device
    /// with no client yet) calls this in its wait, so that an adaptation only this thread
    /// can complete (a shrink to one hart) is not held up. Elsewhere it does nothing.
    ///
    /// [`run_block`]: Executor::run_block
    pub fn checkpoint(&self) {
        if let Some(host) = &self.host {
            host.checkpoint();
        }
    }

    /// Tells the worker harts when the host's next block is due (`tess_sched::clock` ns; 0:
    /// not known): while they wait for it they start only the background pieces expected to
    /// end before then ([`crate::graph::Background::run_piece_before`]), so that they are
    /// free when it starts. Without it they run any piece, and a block that starts while a
    /// worker is in one takes that worker's share over. Call it as soon as the host knows its
    /// next release (a due time that has passed stops the workers' background work until the
    /// next call: say 0 when no block is coming, as the device does while no packet comes).
    pub fn expect_next_block(&mut self, due_ns: u64) {
        self.next_block_due = due_ns;
        if let Some(sh) = &self.shared {
            sh.next_block_due.store(due_ns, Ordering::Relaxed);
        }
    }

    /// On a tess runtime's harts: whether the runtime was told to stop (tessd deletes the
    /// cell); a program's loop ends then. Elsewhere false.
    pub fn stop_requested(&self) -> bool {
        self.host.as_ref().is_some_and(|h| h.stopping())
    }

    /// Runs the worker harts `SCHED_FIFO` at this priority (needs root or `CAP_SYS_NICE`; the
    /// calling thread's policy is the caller's business, see [`set_fifo`]).
    pub fn realtime(mut self, priority: i32) -> Executor {
        self.rt_priority = Some(priority);
        self
    }

    /// Pins hart `i` (the calling thread is hart 0) to CPU `first + i` (modulo the CPUs).
    pub fn pinned(mut self, first_cpu: usize) -> Executor {
        self.pin_first_cpu = Some(first_cpu);
        self
    }

    /// Tasks each hart has run so far (empty for the serial executor).
    pub fn tasks_per_hart(&self) -> Vec<u64> {
        self.shared
            .as_ref()
            .map(|sh| sh.ran.iter().map(|r| r.load(Ordering::Relaxed)).collect())
            .unwrap_or_default()
    }

    /// The harts the graph was split for, one entry per split so far (on a tess runtime's
    /// harts a new split follows each resize of the cell).
    pub fn splits(&self) -> &[usize] {
        &self.splits
    }

    /// Number of tasks the graph was split into (after the first block).
    pub fn task_count(&self) -> usize {
        self.shared
            .as_ref()
            .map(|s| s.task_graph.tasks.len())
            .unwrap_or(0)
    }

    fn start(&mut self, g: &mut DspGraph) {
        self.splits.push(self.harts);
        let tg = Arc::new(TaskGraph::from_graph(g, self.harts));
        let mut task_of = vec![0; g.nodes.len()];
        for (t, nodes) in tg.tasks.iter().enumerate() {
            for &k in nodes {
                task_of[k] = t;
            }
        }
        g.plan_partial_sums(&task_of);
        let g: &DspGraph = g;
        let mut locals: Vec<Worker<u64>> = (0..self.harts).map(|_| Worker::new_lifo()).collect();
        let stealers = locals.iter().map(Worker::stealer).collect();
        let home = deal_home(g, &tg, self.harts);
        let shared = Arc::new(Shared::new(
            self.strategy,
            tg,
            home,
            stealers,
            g.background.clone(),
        ));
        shared
            .next_block_due
            .store(self.next_block_due, Ordering::Relaxed);
        self.hart0 = Some(Hart::new(0, locals.remove(0)));
        if let Some(host) = &self.host {
            // The runtime's worker tasks take their harts' state from here; nobody waits for
            // them (a hart that comes late finds its share taken over).
            let harts = locals
                .into_iter()
                .enumerate()
                .map(|(i, l)| Hart::new(i + 1, l))
                .collect();
            host.publish(shared.clone(), harts);
            self.shared = Some(shared);
            return;
        }
        let pin = self.pin_first_cpu;
        for (i, local) in locals.into_iter().enumerate() {
            let sh = shared.clone();
            self.threads.push(spawn_hart_thread(
                format!("tess-pd-hart{}", i + 1),
                pin.map(|f| f + i + 1),
                self.rt_priority,
                move || worker_loop(sh, Hart::new(i + 1, local)),
            ));
        }
        if let Some(first) = pin {
            pin_to(first);
        }
        self.shared = Some(shared);
    }

    /// Computes one block of `g`. The first block splits the graph into this executor's tasks
    /// and plans its partial sums for them ([`DspGraph::plan_partial_sums`]): an executor runs
    /// one graph for its life.
    pub fn run_block(&mut self, g: &mut DspGraph) {
        // tessd's messages are read here: this thread's whole life is one slice of the
        // runtime's vhart 0 (crate::cell).
        self.checkpoint();
        if self.strategy == Strategy::Serial {
            for k in 0..g.nodes.len() {
                // SAFETY: one thread, nodes in Pd's order (a topological order).
                unsafe { g.run_node(k) };
            }
            return;
        }
        if let Some(host) = &self.host {
            let (want, adaptations) = host.adapted();
            if adaptations != self.adaptations_seen && self.shared.is_some() {
                // The cell grew or shrank (even back to the same size: the vharts that left
                // took their parts of the split): between two blocks, with every task of the
                // last one done, so no hart runs a node, the old workers are sent back to the
                // host and the graph is split and dealt again for the harts there are now.
                self.retire();
            }
            self.adaptations_seen = adaptations;
            self.harts = want;
        }
        if self.shared.is_none() {
            self.start(g);
        }
        // from here on the harts share the graph
        let g: &DspGraph = g;
        let sh = self.shared.clone().expect("started");
        let tg: &TaskGraph = &sh.task_graph;
        let e = sh.epoch.load(Ordering::Relaxed) + 1;
        let p = (e % 2) as usize;
        // Only joins are counted down: a task with one predecessor is ready when that one is
        // done, and one without is ready at the start.
        for (r, &n) in sh.remaining[p]
            .iter()
            .zip(&tg.npreds)
            .filter(|(_, &n)| n > 1)
        {
            r.store(n, Ordering::Relaxed);
        }
        // Stored only when it changes: a store, even of the same value, takes the line from
        // every other hart's cache, and each would miss on its first task.
        let gp = g as *const DspGraph as *mut DspGraph;
        if sh.graph.load(Ordering::Relaxed) != gp {
            sh.graph.store(gp, Ordering::Relaxed);
        }
        // publishes the counts and the pointer to the harts that wake on it
        sh.epoch.store(e, Ordering::Release);
        let hart0 = self.hart0.as_mut().expect("started");
        if self.strategy == Strategy::GlobalQueue {
            for (t, &n) in tg.npreds.iter().enumerate() {
                if n == 0 {
                    sh.injector.push(item_of(e, t));
                }
            }
        }
        participate(&sh, hart0, e);
    }
}

fn item_of(epoch: u64, task: usize) -> u64 {
    ((epoch & 0xffff_ffff) << 32) | task as u64
}

impl Executor {
    /// Stops the harts of the current split: own threads are joined, a host's workers go back
    /// to it (they may still be leaving; the shared state lives as long as they hold it).
    fn retire(&mut self) {
        if let Some(sh) = self.shared.take() {
            sh.stop.store(true, Ordering::Release);
            sh.epoch.fetch_add(1, Ordering::Release);
        }
        if let Some(host) = &self.host {
            host.withdraw();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        self.hart0 = None;
    }
}

impl Drop for Executor {
    fn drop(&mut self) {
        self.retire();
    }
}

/// Pins the calling thread to one CPU (modulo the CPUs online); failures are ignored (the
/// engine still runs, only less predictably).
pub fn pin_to(cpu: usize) {
    // CPUs online, not `available_parallelism` (that is this thread's affinity, which an
    // earlier pin may already have narrowed)
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize;
    let mut set = nix::sched::CpuSet::new();
    if set.set(cpu % n).is_ok() {
        let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set);
    }
}

/// Spawns a thread that pins itself to `cpu` and runs `SCHED_FIFO` at `priority` (each if
/// given) before it runs `f`, and returns once the thread has done so.
///
/// A new thread inherits its creator's policy and CPUs: a creator spinning `SCHED_FIFO` on its
/// one CPU would keep the new thread from ever running (to pin itself elsewhere). So the thread
/// is spawned from an ordinary, unpinned state, and the creator's is restored once the thread
/// has settled.
pub(crate) fn spawn_hart_thread<T: Send + 'static>(
    name: String,
    cpu: Option<usize>,
    priority: Option<i32>,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    let saved = ThreadSched::save();
    ThreadSched::ordinary_everywhere();
    let settled = Arc::new(AtomicBool::new(false));
    let flag = settled.clone();
    let handle = std::thread::Builder::new()
        .name(name)
        .spawn(move || {
            if let Some(c) = cpu {
                pin_to(c);
            }
            if let Some(p) = priority {
                let _ = set_fifo(p);
            }
            flag.store(true, Ordering::Release);
            f()
        })
        .expect("spawning a DSP hart thread");
    while !settled.load(Ordering::Acquire) {
        std::thread::yield_now();
    }
    saved.restore();
    handle
}

fn worker_loop(sh: Arc<Shared>, mut hart: Hart) {
    let mut seen = 0u64;
    while worker_round(&sh, &mut hart, &mut seen, u32::MAX) {}
}

/// Waits for the next block (spinning, then yielding the CPU, up to `max_spins` polls) and
/// takes part in it. Returns false when the executor stopped this split of the graph, true
/// after a block or when the wait ran out.
pub(crate) fn worker_round(sh: &Shared, hart: &mut Hart, seen: &mut u64, max_spins: u32) -> bool {
    let mut spins = 0u32;
    let e = loop {
        let e = sh.epoch.load(Ordering::Acquire);
        if e != *seen {
            *seen = e;
            break e;
        }
        spins += 1;
        if spins >= max_spins {
            return true;
        }
        // Between blocks, background work (lower in priority than any block: a piece at a
        // time, checking for the next block in between, and none expected to end after it
        // once the host has said when it is due).
        if run_background_piece(sh, hart) {
            continue;
        }
        wait_a_little(spins);
    };
    if sh.stop.load(Ordering::Acquire) {
        return false;
    }
    participate(sh, hart, e);
    true
}

/// Polls a waiting hart makes before it yields its CPU between polls.
const SPINS_BEFORE_YIELD: u32 = 20_000;

/// Waits between two polls of a hart that has polled `spins` times: a pause while it is
/// likely that work comes soon, then a yield, so that two spinning `SCHED_FIFO` threads put
/// on one CPU cannot shut each other out.
pub(crate) fn wait_a_little(spins: u32) {
    if spins > SPINS_BEFORE_YIELD {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
}

/// One background piece for a hart waiting for the next block: one expected to end before
/// that block if the host said when it is due, else any. The first hart to see a new due
/// time has the gap looked at for tasks shut out of it ([`crate::graph::Background::note_gap`]:
/// under JACK, the workers are the only harts that run pieces).
fn run_background_piece(sh: &Shared, hart: &mut Hart) -> bool {
    match sh.next_block_due.load(Ordering::Relaxed) {
        0 => sh.background.run_piece(),
        due => {
            if hart.seen_due != due {
                hart.seen_due = due;
                sh.background.note_gap(tess_sched::clock::now_ns(), due);
            }
            sh.background.run_piece_before(due)
        }
    }
}

/// Home lists found empty in the current block, by hart (bit `h`): claims only accumulate
/// within a block, so a list once found claimed to the end stays so, and is not read again
/// (each read takes a line its owner writes out of the owner's cache).
#[derive(Default)]
struct DryHomes(u64);

impl DryHomes {
    fn is_dry(&self, h: usize) -> bool {
        h < 64 && self.0 & (1 << h) != 0
    }
    fn mark(&mut self, h: usize) {
        if h < 64 {
            self.0 |= 1 << h;
        }
    }
}

/// Work stealing: the next task for hart `hart`, from its deque, its home list, the others'
/// home lists (from the back), or the others' deques. (The global queue has its own loop in
/// [`participate`].)
fn find_task(sh: &Shared, hart: &mut Hart, e: u64, dry: &mut DryHomes) -> Option<u64> {
    let me = hart.me;
    // `pop` writes the deque's end (and fences) even when it finds nothing: a write to a line
    // the idle harts read when they look for work, which would make this hart wait for the
    // line to come back from their caches. Looking first only reads.
    if !hart.local.is_empty() {
        if let Some(t) = hart.local.pop() {
            return Some(t);
        }
    }
    if !dry.is_dry(me) {
        if let Some(&t) = sh.home[me].iter().find(|&&t| sh.claim(t, e, me)) {
            return Some(item_of(e, t));
        }
        dry.mark(me);
    }
    let n = sh.home.len();
    for h in (1..n).map(|k| (me + k) % n) {
        if dry.is_dry(h) {
            continue;
        }
        match sh.steal_home(h, me, e) {
            Some(t) => return Some(item_of(e, t)),
            None => dry.mark(h),
        }
    }
    loop {
        let mut retry = false;
        for h in (1..n).map(|k| (me + k) % n) {
            match sh.stealers[h].steal() {
                Steal::Success(t) => return Some(t),
                Steal::Retry => retry = true,
                Steal::Empty => {}
            }
        }
        if !retry {
            return None;
        }
    }
}

/// Runs tasks until block `e` is done (or, for a worker, until a newer block started: its
/// items are handled all the same, by the epoch they carry).
///
/// A hart that has work never looks at the other harts' lines: reading a line another hart
/// writes costs a transfer between caches (a few hundred ns on the 2-vCPU machine here), and
/// so does that hart's next write. Only a hart with nothing to run polls, and between its
/// polls of the others' queues (spaced out more and more) it watches only the count of sinks
/// done, which changes once per sink and block: the end of the block is seen within a pause.
fn participate(sh: &Shared, hart: &mut Hart, e: u64) {
    let me = hart.me;
    let mut backoff = 1u32;
    let mut dry = DryHomes::default();
    let mut item = None;
    loop {
        if item.is_none() {
            item = if sh.strategy == Strategy::GlobalQueue {
                loop {
                    match sh.injector.steal() {
                        Steal::Success(t) => break Some(t),
                        Steal::Retry => continue,
                        Steal::Empty => break None,
                    }
                }
            } else {
                find_task(sh, hart, e, &mut dry)
            };
        }
        if let Some(mut t) = item.take() {
            // a task, then the successor it readied, while there is one
            loop {
                let next = run_item(sh, hart, t);
                let ran = &sh.ran[me];
                ran.store(ran.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
                match next {
                    Some(n) => t = n,
                    None => break,
                }
            }
            backoff = 1;
            continue;
        }
        // Idle: poll the cheap lines (the sinks' counts; a worker also the epoch) between polls
        // of the queues, which are spaced out more and more.
        for _ in 0..backoff {
            if sh.block_done(e) || (me != 0 && sh.epoch.load(Ordering::Acquire) != e) {
                return;
            }
            std::hint::spin_loop();
        }
        backoff = (backoff * 2).min(32);
    }
}

/// How many nodes before a task's end its joins' counts are fetched for writing: late enough
/// that another predecessor's hart is unlikely to take the line back first, early enough for
/// the transfer to be done (on the bench patch the last voice's filter and what follows it).
/// On `tess bench graph` 3, 8 and 16 were alike (`speedup_2_harts` 1.69-1.77 in six runs
/// each), against 1.68-1.76 without the prefetch.
const JOIN_PREFETCH_NODES: usize = 3;

/// Asks for the line holding `x` in a writable state (`PREFETCHW`): a hint, the transfer runs
/// while this hart goes on computing.
#[inline(always)]
fn prefetch_for_write<T>(x: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHW neither reads nor writes memory and cannot fault; the address is a
    // live reference's.
    unsafe {
        std::arch::asm!("prefetchw [{0}]", in(reg) x as *const T, options(nostack, preserves_flags, readonly));
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}

/// One hart's own scheduling state.
pub(crate) struct Hart {
    me: usize,
    local: Worker<u64>,
    /// Work stealing: the ready task this hart runs next (see [`Hart::ready`]).
    next: Option<u64>,
    /// Sink tasks this hart finished (its `sinks_done`).
    sinks_done: u64,
    /// The next block's due time this hart last saw ([`Shared::next_block_due`]).
    seen_due: u64,
}

impl Hart {
    fn new(me: usize, local: Worker<u64>) -> Hart {
        Hart {
            me,
            local,
            next: None,
            sinks_done: 0,
            seen_due: 0,
        }
    }

    /// A task became ready. Work stealing keeps the first for this hart to run next (its
    /// inputs are in this hart's cache, and nothing goes through the deque) and pushes the
    /// others; the global queue pushes all.
    fn ready(&mut self, sh: &Shared, item: u64) {
        match sh.strategy {
            Strategy::WorkStealing if self.next.is_none() => self.next = Some(item),
            Strategy::WorkStealing => self.local.push(item),
            _ => sh.injector.push(item),
        }
    }
}

/// Runs one task and readies its successors; returns one of them for the caller to run next.
///
/// A join's count is counted down as soon as each predecessor is done, never held back for a
/// batch: a hart preempted after its task would otherwise keep the join (and the block) waiting
/// for it, where the other harts could have taken its share over. Holding a hart's decrements
/// back until it had claimed all its own voices was faster (`speedup_2_harts` 1.75-1.79 in six
/// runs, against 1.71-1.76 with the prefetch below, interleaved), and was dropped for that.
fn run_item(sh: &Shared, hart: &mut Hart, item: u64) -> Option<u64> {
    let te = item >> 32;
    let t = (item & 0xffff_ffff) as usize;
    // SAFETY: an item exists only between the moment its block stored the pointer (before the
    // release that made the item reachable) and the moment the block's last task is done, and
    // the calling thread stays in `run_block`, borrowing the graph, until then; this hart reads
    // the graph only before its decrements below, which are what may end the block.
    let g = unsafe { &*sh.graph.load(Ordering::Acquire) };
    let tg: &TaskGraph = &sh.task_graph;
    let p = (te % 2) as usize;
    let nodes = &tg.tasks[t];
    // A few nodes before the end, fetch the joins' count lines for writing, so that the
    // decrements below find them here instead of waiting for them to come from another cache.
    let claim_at = nodes.len().saturating_sub(JOIN_PREFETCH_NODES);
    for (i, &k) in nodes.iter().enumerate() {
        if i == claim_at {
            for &s in tg.succs[t].iter().filter(|&&s| tg.npreds[s] > 1) {
                prefetch_for_write(&*sh.remaining[p][s]);
            }
        }
        // SAFETY: task t became ready only when every predecessor task finished (its only
        // predecessor ran it on, or handed it over through a deque or queue, or the AcqRel
        // decrements of a join's count), and exactly one hart took its item.
        unsafe { g.run_node(k) };
    }
    for &s in &tg.succs[t] {
        let next = (te << 32) | s as u64;
        if tg.npreds[s] == 1 || sh.remaining[p][s].fetch_sub(1, Ordering::AcqRel) == 1 {
            hart.ready(sh, next);
        }
    }
    if tg.succs[t].is_empty() {
        // publishes what this sink and the tasks before it computed (their results reached it
        // through the hand-overs above); all sinks' counts together publish the block
        hart.sinks_done += 1;
        sh.sinks_done[hart.me].store(hart.sinks_done, Ordering::Release);
    }
    hart.next.take()
}

/// A thread's scheduling policy, priority and CPUs, to put back later.
struct ThreadSched {
    policy: i32,
    param: libc::sched_param,
    cpus: Option<nix::sched::CpuSet>,
}

impl ThreadSched {
    fn save() -> ThreadSched {
        let mut param = libc::sched_param { sched_priority: 0 };
        // SAFETY: pid 0 is this thread; `param` is valid for writing.
        let policy = unsafe { libc::sched_getscheduler(0) };
        // SAFETY: as above.
        unsafe { libc::sched_getparam(0, &mut param) };
        ThreadSched {
            policy,
            param,
            cpus: nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).ok(),
        }
    }

    /// SCHED_OTHER on every CPU.
    fn ordinary_everywhere() {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: valid sched_param; pid 0 is this thread.
        unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER, &param) };
        // SAFETY: sysconf has no preconditions.
        let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize;
        let mut set = nix::sched::CpuSet::new();
        for c in 0..n {
            let _ = set.set(c);
        }
        let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set);
    }

    fn restore(&self) {
        if let Some(c) = &self.cpus {
            let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), c);
        }
        if self.policy >= 0 {
            // SAFETY: valid sched_param; pid 0 is this thread.
            unsafe { libc::sched_setscheduler(0, self.policy, &self.param) };
        }
    }
}

/// Makes the calling thread `SCHED_FIFO` at `priority` (1-99).
pub fn set_fifo(priority: i32) -> std::io::Result<()> {
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: `param` is a valid sched_param for the duration of the call; pid 0 is this thread.
    let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Shared state for harts whose block-start tasks are `home`.
    fn shared(home: Vec<Vec<usize>>) -> Shared {
        let nt = home.iter().map(Vec::len).sum();
        let tg = TaskGraph {
            tasks: vec![Vec::new(); nt],
            npreds: vec![0; nt],
            succs: vec![Vec::new(); nt],
        };
        Shared::new(
            Strategy::WorkStealing,
            Arc::new(tg),
            home,
            Vec::new(),
            Arc::default(),
        )
    }

    /// Background work of one task whose pieces take no time and never run out; guessed at
    /// 1 ms a piece.
    #[derive(Debug)]
    struct Endless;

    impl crate::objects::BackgroundTask for Endless {
        fn run_piece(&mut self) -> bool {
            true
        }
        fn due_within_ns(&self) -> u64 {
            1_000_000_000
        }
        fn piece_ns_hint(&self) -> u64 {
            1_000_000
        }
    }

    #[test]
    fn waiting_harts_start_no_piece_past_the_next_block_once_told_when_it_is() {
        let tg = TaskGraph::default();
        let background = Arc::new(crate::graph::Background::new(vec![Box::new(Endless)]));
        let sh = Shared::new(
            Strategy::WorkStealing,
            Arc::new(tg),
            vec![Vec::new()],
            Vec::new(),
            background,
        );
        let mut hart = Hart::new(1, Worker::new_lifo());
        // due in 0.5 ms: the task's first guess (1 ms a piece) does not fit
        sh.next_block_due
            .store(tess_sched::clock::now_ns() + 500_000, Ordering::Relaxed);
        assert!(!run_background_piece(&sh, &mut hart));
        // not told: any piece
        sh.next_block_due.store(0, Ordering::Relaxed);
        assert!(run_background_piece(&sh, &mut hart));
        // the next block is due now: none (the first piece was timed at about nothing, so
        // the estimate cannot be what stops it)
        sh.next_block_due
            .store(tess_sched::clock::now_ns(), Ordering::Relaxed);
        assert!(!run_background_piece(&sh, &mut hart));
        // due in 10 s: one
        sh.next_block_due.store(
            tess_sched::clock::now_ns() + 10_000_000_000,
            Ordering::Relaxed,
        );
        assert!(run_background_piece(&sh, &mut hart));
    }

    #[test]
    fn a_late_hart_cannot_claim_the_next_blocks_tasks() {
        let sh = shared(vec![vec![0, 1], vec![2, 3]]);
        for (t, owner) in [(0, 0), (1, 0), (2, 1), (3, 1)] {
            assert!(
                sh.claim(t, 1, owner),
                "block 1: every task claimed by its owner"
            );
        }
        assert!(sh.claim(0, 2, 0), "hart 0 claims task 0 for block 2");
        // hart 1, still in block 1, finds task 0 taken for a later block
        assert!(!sh.claim(0, 1, 1));
        assert_eq!(sh.steal_home(0, 1, 1), None);
        // and a second claim in the same block fails
        assert!(!sh.claim(0, 2, 1));
    }

    #[test]
    fn thieves_take_from_the_end_until_they_meet_the_owner() {
        let sh = shared(vec![vec![0, 1, 2, 3], vec![]]);
        let e = 1;
        assert!(sh.claim(0, e, 0), "the owner starts at the front");
        assert_eq!(sh.steal_home(0, 1, e), Some(3));
        assert_eq!(sh.steal_home(0, 1, e), Some(2), "passes over its own claim");
        assert_eq!(sh.steal_home(0, 1, e), Some(1));
        assert_eq!(sh.steal_home(0, 1, e), None, "met the owner's claim");
        // next block: everything is free again
        assert_eq!(sh.steal_home(0, 1, e + 1), Some(3));
    }

    #[test]
    fn a_thief_passes_over_what_other_thieves_took() {
        let sh = shared(vec![vec![0, 1, 2, 3], vec![], vec![]]);
        let e = 1;
        assert_eq!(sh.steal_home(0, 2, e), Some(3));
        assert_eq!(
            sh.steal_home(0, 1, e),
            Some(2),
            "hart 2's claim is not the owner's"
        );
        assert!(sh.claim(0, e, 0));
        assert_eq!(sh.steal_home(0, 2, e), Some(1));
        assert_eq!(sh.steal_home(0, 1, e), None, "met the owner");
    }
}
