//! Parallel execution of the DSP graph, per block (seed 001 section 2.2).
//!
//! **Tasks.** Running each object as its own task costs more in synchronisation than small
//! objects compute, so nodes are merged into tasks first (section 2.2: "aggregating multiple
//! nodes into a single executable unit"): every maximal chain where a node has exactly one
//! successor and that successor exactly one predecessor becomes one task (a voice
//! `osc~ -> vcf~ -> *~` is one task). Any grouping that keeps the dependencies is valid.
//!
//! **Scheduling.** Per block, each task's count of unfinished predecessors is reset; tasks at
//! zero are ready. Two dynamic strategies (section 2.2, [6] in the paper):
//! - [`Strategy::GlobalQueue`]: one shared ready queue every hart pops from and pushes to.
//! - [`Strategy::WorkStealing`]: a local deque per hart; a hart pushes the tasks it makes
//!   ready onto its own deque (LIFO, cache-warm) and steals from the others when empty
//!   (Blumofe and Leiserson [4]).
//!
//! The caller's thread is hart 0; `harts - 1` worker threads spin between blocks (a real-time
//! audio cell owns its harts, so spinning is its business), yielding after a while.

use crate::graph::DspGraph;
use crossbeam_deque::{Injector, Steal, Stealer, Worker};
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
    /// Merges chains of nodes into tasks.
    pub fn from_graph(g: &DspGraph) -> TaskGraph {
        let n = g.nodes.len();
        let mut task_of = vec![usize::MAX; n];
        let mut tasks: Vec<Vec<usize>> = Vec::new();
        for start in 0..n {
            if task_of[start] != usize::MAX {
                continue;
            }
            // a chain starts here unless its single predecessor would absorb it
            let p = &g.nodes[start].preds;
            if p.len() == 1 && g.nodes[p[0]].succs.len() == 1 && task_of[p[0]] == usize::MAX {
                continue; // will be reached from its head
            }
            let t = tasks.len();
            let mut chain = vec![start];
            task_of[start] = t;
            let mut cur = start;
            while g.nodes[cur].succs.len() == 1 {
                let s = g.nodes[cur].succs[0];
                if g.nodes[s].preds.len() != 1 || task_of[s] != usize::MAX {
                    break;
                }
                chain.push(s);
                task_of[s] = t;
                cur = s;
            }
            tasks.push(chain);
        }
        // anything left (cannot happen in a DAG, but stay total): its own task
        for (k, t) in task_of.iter_mut().enumerate() {
            if *t == usize::MAX {
                *t = tasks.len();
                tasks.push(vec![k]);
            }
        }
        let mut succs = vec![Vec::new(); tasks.len()];
        let mut npreds = vec![0usize; tasks.len()];
        for (k, node) in g.nodes.iter().enumerate() {
            for &s in &node.succs {
                let (a, b) = (task_of[k], task_of[s]);
                if a != b && !succs[a].contains(&b) {
                    succs[a].push(b);
                    npreds[b] += 1;
                }
            }
        }
        TaskGraph {
            tasks,
            npreds,
            succs,
        }
    }
}

struct Shared {
    graph: AtomicPtr<DspGraph>,
    tasks: AtomicPtr<TaskGraph>,
    epoch: AtomicU64,
    stop: AtomicBool,
    remaining: Vec<AtomicUsize>,
    done_tasks: AtomicUsize,
    workers_idle: AtomicUsize,
    injector: Injector<usize>,
    stealers: Vec<Stealer<usize>>,
    strategy: Strategy,
}

/// Runs blocks of a graph with a strategy on a number of harts.
pub struct Executor {
    strategy: Strategy,
    harts: usize,
    tasks: Option<Box<TaskGraph>>,
    shared: Option<Arc<Shared>>,
    local0: Option<Worker<usize>>,
    threads: Vec<std::thread::JoinHandle<()>>,
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
            harts: harts.max(1),
            tasks: None,
            shared: None,
            local0: None,
            threads: Vec::new(),
        }
    }

    /// Number of tasks the graph was split into (after the first block).
    pub fn task_count(&self) -> usize {
        self.tasks.as_ref().map(|t| t.tasks.len()).unwrap_or(0)
    }

    fn start(&mut self, g: &DspGraph) {
        let tg = Box::new(TaskGraph::from_graph(g));
        let nt = tg.tasks.len();
        let mut locals: Vec<Worker<usize>> = (0..self.harts).map(|_| Worker::new_lifo()).collect();
        let stealers = locals.iter().map(Worker::stealer).collect();
        let shared = Arc::new(Shared {
            graph: AtomicPtr::new(std::ptr::null_mut()),
            tasks: AtomicPtr::new(std::ptr::null_mut()),
            epoch: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            remaining: (0..nt).map(|_| AtomicUsize::new(0)).collect(),
            done_tasks: AtomicUsize::new(0),
            workers_idle: AtomicUsize::new(0),
            injector: Injector::new(),
            stealers,
            strategy: self.strategy,
        });
        self.local0 = Some(locals.remove(0));
        for (i, local) in locals.into_iter().enumerate() {
            let sh = shared.clone();
            self.threads.push(
                std::thread::Builder::new()
                    .name(format!("tess-pd-hart{}", i + 1))
                    .spawn(move || worker_loop(sh, local, i + 1))
                    .expect("spawning a DSP worker thread"),
            );
        }
        self.tasks = Some(tg);
        self.shared = Some(shared);
    }

    /// Computes one block of `g`.
    pub fn run_block(&mut self, g: &DspGraph) {
        if self.strategy == Strategy::Serial || self.harts == 1 && self.strategy == Strategy::Serial {
            for k in 0..g.nodes.len() {
                // SAFETY: one thread, nodes in Pd's order (a topological order).
                unsafe { g.run_node(k) };
            }
            return;
        }
        if self.shared.is_none() {
            self.start(g);
        }
        let sh = self.shared.clone().expect("started");
        let tg: &TaskGraph = self.tasks.as_deref().expect("started");
        let nt = tg.tasks.len();
        for (r, &n) in sh.remaining.iter().zip(&tg.npreds) {
            r.store(n, Ordering::Relaxed);
        }
        sh.done_tasks.store(0, Ordering::Relaxed);
        let local = self.local0.as_ref().expect("started");
        for (t, &n) in tg.npreds.iter().enumerate() {
            if n == 0 {
                match self.strategy {
                    Strategy::WorkStealing => local.push(t),
                    _ => sh.injector.push(t),
                }
            }
        }
        sh.graph.store(g as *const DspGraph as *mut DspGraph, Ordering::Relaxed);
        sh.tasks.store(tg as *const TaskGraph as *mut TaskGraph, Ordering::Relaxed);
        sh.epoch.fetch_add(1, Ordering::Release);
        participate(&sh, local, 0, nt);
        // wait until every worker has left this block (they may still hold the pointers)
        while sh.workers_idle.load(Ordering::Acquire) < self.harts - 1 {
            std::hint::spin_loop();
        }
        sh.workers_idle.store(0, Ordering::Relaxed);
    }
}

impl Drop for Executor {
    fn drop(&mut self) {
        if let Some(sh) = &self.shared {
            sh.stop.store(true, Ordering::Release);
            sh.epoch.fetch_add(1, Ordering::Release);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn worker_loop(sh: Arc<Shared>, local: Worker<usize>, me: usize) {
    let mut seen = 0u64;
    loop {
        let mut spins = 0u32;
        loop {
            let e = sh.epoch.load(Ordering::Acquire);
            if e != seen {
                seen = e;
                break;
            }
            spins += 1;
            if spins > 20_000 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        if sh.stop.load(Ordering::Acquire) {
            return;
        }
        let nt = sh.remaining.len();
        participate(&sh, &local, me, nt);
        sh.workers_idle.fetch_add(1, Ordering::AcqRel);
    }
}

fn find_task(sh: &Shared, local: &Worker<usize>, me: usize) -> Option<usize> {
    if let Some(t) = local.pop() {
        return Some(t);
    }
    loop {
        match sh.injector.steal_batch_and_pop(local) {
            Steal::Success(t) => return Some(t),
            Steal::Retry => continue,
            Steal::Empty => {}
        }
        if sh.strategy == Strategy::WorkStealing {
            let n = sh.stealers.len();
            let mut retry = false;
            for k in 1..n {
                match sh.stealers[(me + k) % n].steal() {
                    Steal::Success(t) => return Some(t),
                    Steal::Retry => retry = true,
                    Steal::Empty => {}
                }
            }
            if retry {
                continue;
            }
        }
        return None;
    }
}

/// Runs tasks until all `nt` tasks of the block are done.
fn participate(sh: &Shared, local: &Worker<usize>, me: usize, nt: usize) {
    // SAFETY: the pointers were stored before the epoch was bumped (release/acquire) and the
    // block's caller waits for every worker to report idle before it returns, so the graph and
    // task graph outlive this use.
    let (g, tg) = unsafe {
        (
            &*sh.graph.load(Ordering::Relaxed),
            &*sh.tasks.load(Ordering::Relaxed),
        )
    };
    while sh.done_tasks.load(Ordering::Acquire) < nt {
        let Some(t) = (if sh.strategy == Strategy::GlobalQueue {
            loop {
                match sh.injector.steal() {
                    Steal::Success(t) => break Some(t),
                    Steal::Retry => continue,
                    Steal::Empty => break None,
                }
            }
        } else {
            find_task(sh, local, me)
        }) else {
            std::hint::spin_loop();
            continue;
        };
        for &k in &tg.tasks[t] {
            // SAFETY: task t became ready only when every predecessor task finished (the
            // AcqRel decrement below), and it is popped by exactly one hart.
            unsafe { g.run_node(k) };
        }
        for &s in &tg.succs[t] {
            if sh.remaining[s].fetch_sub(1, Ordering::AcqRel) == 1 {
                match sh.strategy {
                    Strategy::WorkStealing => local.push(s),
                    _ => sh.injector.push(s),
                }
            }
        }
        sh.done_tasks.fetch_add(1, Ordering::AcqRel);
    }
}
