//! The engine on a tess cell's harts (issue 15; seed 001 section 4, seed 004 section 4): the
//! system hands the cell harts, the engine schedules its graph on them, and it is told when
//! they change.
//!
//! [`run_on_harts`] runs a program (`tess-pd play`, `device`, `render`, `jack`) on a
//! [`tess_runtime::Runtime`]: the runtime runs one kernel thread per hart of the cell, placed
//! by tessd (a reserved cell's threads become its `SCHED_DEADLINE` threads; other cells' pin
//! themselves), and calls the cell's scheduler, [`EngineHarts`]:
//!
//! ```text
//!   vhart 0        the program: its loop calls Executor::run_block once per block; the
//!                  executor's hart 0 is this thread, and each block starts with a runtime
//!                  checkpoint (Handle::checkpoint: tessd's messages are read)
//!   vharts 1..n    worker tasks: each slice waits for the next block (spinning, as the
//!                  executor's own threads do), takes part in it, and yields, so the runtime
//!                  gets the hart back between blocks
//!   adapt(o, n)    the cell grew or shrank: the executor is told; before its next block it
//!                  sends the workers of the old split back, splits the graph into tasks for
//!                  n harts and deals them out again (a retired hart's share of the blocks in
//!                  between is taken over by the others: work is never waited for)
//! ```
//!
//! Outside a cell the same code runs standalone (`Builder::standalone`), which is how the
//! tests resize it.
//!
//! Costs and limits: a shrink that vhart 0 completes (to one hart) joins the retired thread on
//! vhart 0, up to a few milliseconds once; a program that waits without running blocks calls
//! [`Executor::checkpoint`] in its wait (the device does, between receive timeouts); the
//! runtime stopping (tessd deleted the cell) ends `play` and `device` through
//! [`Executor::stop_requested`]; a panic in a node's code on a worker hart leaves that block
//! waiting for the task, as it does on the executor's own threads.

use crate::sched::{worker_round, Executor, Hart as ExecHart, Shared, Strategy};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use tess_runtime::{Hart, Scheduler, Step, Task};

/// Polls of the next block's epoch a worker slice waits before it yields its hart back to the
/// runtime (the wait spins, then yields the CPU; a few milliseconds either way, longer when
/// the polls run background pieces: up to one piece each, and the slice still ends at the
/// next block).
const SPINS_PER_SLICE: u32 = 50_000;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the executor and the runtime's worker tasks share: the runtime's count of harts and
/// the current split of the graph.
pub(crate) struct Host {
    /// Harts the runtime has now (from its start, then from each `adapt`).
    harts: AtomicUsize,
    /// Adaptations so far (bumped after `harts` is stored).
    adaptations: AtomicU64,
    /// The current split's shared state and the state of each worker's hart (index: vhart
    /// - 1), each taken by its worker.
    current: Mutex<Option<Split>>,
    /// Bumped at each new split or withdrawal, so that a worker knows whether its split is
    /// still the current one.
    generation: AtomicU64,
    handle: OnceLock<tess_runtime::Handle>,
}

struct Split {
    shared: Arc<Shared>,
    harts: Vec<Option<ExecHart>>,
}

impl Host {
    fn new(harts: usize) -> Host {
        Host {
            harts: AtomicUsize::new(harts.max(1)),
            adaptations: AtomicU64::new(0),
            current: Mutex::new(None),
            generation: AtomicU64::new(0),
            handle: OnceLock::new(),
        }
    }

    /// Harts to split the graph for.
    pub(crate) fn harts(&self) -> usize {
        self.harts.load(Ordering::Acquire)
    }

    /// Harts to split the graph for, and the adaptations so far (a split made before the last
    /// one is stale even if the count is back where it was).
    pub(crate) fn adapted(&self) -> (usize, u64) {
        let n = self.adaptations.load(Ordering::Acquire);
        (self.harts.load(Ordering::Acquire), n)
    }

    /// A new split: `harts[i]` is vhart `i + 1`'s.
    pub(crate) fn publish(&self, shared: Arc<Shared>, harts: Vec<ExecHart>) {
        let mut c = lock(&self.current);
        *c = Some(Split {
            shared,
            harts: harts.into_iter().map(Some).collect(),
        });
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// The split is over (its shared state was told to stop).
    pub(crate) fn withdraw(&self) {
        *lock(&self.current) = None;
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// The runtime, once it started.
    pub(crate) fn handle(&self) -> Option<tess_runtime::Handle> {
        self.handle.get().cloned()
    }

    /// Whether the runtime was told to stop.
    pub(crate) fn stopping(&self) -> bool {
        self.handle.get().is_some_and(|h| h.is_stopping())
    }

    /// Lets the runtime read tessd's messages (called by hart 0 before each block).
    pub(crate) fn checkpoint(&self) {
        if let Some(h) = self.handle.get() {
            h.checkpoint();
        }
    }

    /// Vhart `v`'s part of the current split, and the split's generation.
    fn take(&self, v: usize) -> (u64, Option<(Arc<Shared>, ExecHart)>) {
        let mut c = lock(&self.current);
        let generation = self.generation.load(Ordering::Acquire);
        let part = c.as_mut().and_then(|s| {
            let h = s.harts.get_mut(v.checked_sub(1)?)?.take()?;
            Some((s.shared.clone(), h))
        });
        (generation, part)
    }
}

/// The cell's scheduler: vhart 0 runs the program, every other vhart a worker of the
/// executor (module docs).
pub struct EngineHarts {
    host: Arc<Host>,
    main: Mutex<Option<Task>>,
}

impl std::fmt::Debug for EngineHarts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineHarts")
            .field("harts", &self.host.harts())
            .finish_non_exhaustive()
    }
}

impl EngineHarts {
    fn worker(&self, vhart: usize) -> Task {
        let host = self.host.clone();
        let mut generation = u64::MAX;
        let mut part: Option<(Arc<Shared>, ExecHart)> = None;
        let mut seen = 0u64;
        Task::new(move |_hart| {
            if host.generation.load(Ordering::Acquire) != generation {
                (generation, part) = host.take(vhart);
                seen = 0;
            }
            match part.as_mut() {
                Some((shared, hart)) => {
                    if !worker_round(shared, hart, &mut seen, SPINS_PER_SLICE) {
                        part = None;
                    }
                }
                // No part for this hart yet (the cell grew and the graph is split again
                // before the next block), or none left: wait a little.
                None => std::thread::sleep(std::time::Duration::from_micros(200)),
            }
            Step::Yield
        })
    }
}

impl Scheduler for EngineHarts {
    fn start(&self, handle: &tess_runtime::Handle) {
        self.host.harts.store(handle.harts(), Ordering::Release);
        let _ = self.host.handle.set(handle.clone());
    }

    fn enter(&self, hart: &Hart<'_>) -> Option<Task> {
        match hart.vhart_id() {
            0 => lock(&self.main).take(),
            v => Some(self.worker(v)),
        }
    }

    fn r#yield(&self, _hart: &Hart<'_>, task: Task) -> Option<Task> {
        Some(task)
    }

    fn done(&self, _hart: &Hart<'_>) -> Option<Task> {
        None
    }

    fn adapt(&self, _old_n: usize, new_n: usize, orphans: Vec<Task>) {
        // The retired harts' workers hold nothing the executor needs: their split's state is
        // shared, and it is replaced before the next block.
        drop(orphans);
        self.host.harts.store(new_n.max(1), Ordering::Release);
        self.host.adaptations.fetch_add(1, Ordering::AcqRel);
    }
}

/// Why [`run_on_harts`] failed.
#[derive(Debug, thiserror::Error)]
pub enum CellError {
    /// The runtime could not start (not in a cell, tessd unreachable, no harts).
    #[error(transparent)]
    Runtime(#[from] tess_runtime::RuntimeError),
    /// The runtime stopped before the program ran (tessd deleted the cell, or shut the
    /// runtime down, while it started).
    #[error("the runtime stopped before the program ran (was the cell deleted?)")]
    NotRun,
}

/// Runs `program` as vhart 0 of a tess runtime built by `builder` (the cell the process runs
/// in, or standalone), with an executor of strategy `strategy` whose other harts are the
/// runtime's (module docs); returns what `program` returned once every hart has stopped. A
/// panic of `program` stops the runtime's harts and is resumed here, after they stopped.
pub fn run_on_harts<R: Send + 'static>(
    builder: tess_runtime::Builder,
    strategy: Strategy,
    program: impl FnOnce(&mut Executor) -> R + Send + 'static,
) -> Result<R, CellError> {
    let host = Arc::new(Host::new(1));
    type Outcome<R> = std::thread::Result<R>;
    let out: Arc<Mutex<Option<Outcome<R>>>> = Arc::new(Mutex::new(None));
    let (h, o) = (host.clone(), out.clone());
    let main = Task::once(move |hart| {
        // A panic is caught, so that however the program ends the runtime's other harts are
        // stopped and joined before it goes on (unwinding through the runtime would leave
        // them running).
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut exec = Executor::hosted(strategy, h);
            program(&mut exec)
        }));
        *lock(&o) = Some(r);
        hart.handle().stop();
    });
    let sched = EngineHarts {
        host,
        main: Mutex::new(Some(main)),
    };
    builder.build(sched)?.run()?;
    let r = lock(&out).take();
    match r {
        Some(Ok(r)) => Ok(r),
        Some(Err(panic)) => std::panic::resume_unwind(panic),
        None => Err(CellError::NotRun),
    }
}
