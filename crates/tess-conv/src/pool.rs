//! The workers that run long levels preemptively (seed 001 section 3.3, approach 1): one thread
//! per level index, all on the audio thread's hart, each at a lower `SCHED_FIFO` priority than
//! the one before (rate-monotonic: a shorter level has the shorter period and the higher
//! priority). When the next audio block arrives the kernel preempts whatever long level is
//! running, and resumes it when the block's work is done.

use crate::level::{InputHalves, LevelJob};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use tess_sched::attr::Policy;

/// One level's job, handed between the audio thread and a worker.
///
/// Ownership protocol: the audio thread owns `job` whenever `done == posted`; it fills the
/// input and then raises `posted` (release; to the number of the period the step runs in),
/// which hands the job to the worker. The worker owns it while `posted > done`, runs the
/// step, and stores `done = posted` (release), which hands it back. Neither side touches `job` while the other owns it.
pub(crate) struct JobCell {
    job: UnsafeCell<LevelJob>,
    /// The level's input; shared without hand-over (see [`InputHalves`]).
    pub(crate) halves: InputHalves,
    pub(crate) posted: AtomicU64,
    pub(crate) done: AtomicU64,
    /// The level's geometry (a copy of the job's, readable without owning the job).
    pub(crate) level: crate::plan::Level,
}

// SAFETY: `job` is only accessed by the side that owns it under the protocol above, and every
// hand-over is a release store observed with an acquire load.
unsafe impl Sync for JobCell {}

impl JobCell {
    pub(crate) fn new(job: LevelJob) -> JobCell {
        let halves = InputHalves::new(job.level.size);
        JobCell {
            level: job.level,
            job: UnsafeCell::new(job),
            halves,
            posted: AtomicU64::new(0),
            done: AtomicU64::new(0),
        }
    }

    /// The job, for the audio thread while it owns it (see the protocol) or for a mode in
    /// which no worker ever sees the cell.
    ///
    /// # Safety
    /// The caller must own the job: `done == posted`, or the cell is not registered with a
    /// pool; and must not hold two references at once.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn job(&self) -> &mut LevelJob {
        // SAFETY: exclusive ownership is the caller's contract.
        unsafe { &mut *self.job.get() }
    }

    pub(crate) fn is_idle(&self) -> bool {
        self.done.load(Ordering::Acquire) == self.posted.load(Ordering::Relaxed)
    }
}

struct Worker {
    jobs: Mutex<Vec<Arc<JobCell>>>,
}

/// Worker threads for the long levels of any number of convolvers on one hart.
pub struct Pool {
    workers: Vec<Arc<Worker>>,
    threads: Vec<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("levels", &self.workers.len())
            .finish()
    }
}

/// Where and how a pool's workers run.
#[derive(Debug, Clone, Copy)]
pub struct PoolOptions {
    /// Pin every worker to this hart (the audio thread's).
    pub hart: Option<usize>,
    /// `SCHED_FIFO` priority of the worker for level 1; level `k` runs at this minus `k - 1`.
    /// `None`: ordinary threads (tests, offline use).
    pub top_priority: Option<i32>,
    /// Number of long levels served (workers started).
    pub levels: usize,
}

/// Why a pool could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot start convolution worker {level}: {reason}")]
pub struct PoolError {
    level: usize,
    reason: String,
}

impl Pool {
    /// Starts one worker per long level.
    pub fn new(o: PoolOptions) -> Result<Pool, PoolError> {
        // Built up in place, so that an error below drops it and stops the workers started.
        let mut pool = Pool {
            workers: Vec::new(),
            threads: Vec::new(),
            stop: Arc::new(AtomicBool::new(false)),
        };
        for k in 1..=o.levels {
            let policy = match o.top_priority {
                Some(top) if top - (k as i32 - 1) < 1 => {
                    return Err(PoolError {
                        level: k,
                        reason: format!("priority {top} leaves no room for {} levels", o.levels),
                    })
                }
                Some(top) => Some(Policy::Fifo {
                    priority: (top - (k as i32 - 1)) as u32,
                }),
                None => None,
            };
            let worker = Arc::new(Worker {
                jobs: Mutex::new(Vec::new()),
            });
            let (tx, rx) = std::sync::mpsc::channel();
            let w = worker.clone();
            let stop = pool.stop.clone();
            let handle = std::thread::Builder::new()
                .name(format!("conv-level-{k}"))
                .spawn(move || {
                    let placed = tess_sched::rt::place_current_thread(o.hart, policy);
                    let ok = placed.is_ok();
                    let _ = tx.send(placed.map_err(|e| e.to_string()));
                    if ok {
                        work(&w, &stop);
                    }
                })
                .map_err(|e| PoolError {
                    level: k,
                    reason: e.to_string(),
                })?;
            match rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(reason)) => return Err(PoolError { level: k, reason }),
                Err(_) => {
                    return Err(PoolError {
                        level: k,
                        reason: "thread died".into(),
                    })
                }
            }
            pool.threads.push(handle);
            pool.workers.push(worker);
        }
        Ok(pool)
    }

    /// Number of long levels it serves.
    pub fn levels(&self) -> usize {
        self.workers.len()
    }

    pub(crate) fn register(&self, level: usize, cell: Arc<JobCell>) {
        self.workers[level - 1]
            .jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(cell);
    }

    pub(crate) fn unregister(&self, level: usize, cell: &Arc<JobCell>) {
        let mut jobs = self.workers[level - 1]
            .jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        jobs.retain(|c| !Arc::ptr_eq(c, cell));
    }

    /// Holds the worker of `level` back until the guard drops (it cannot start its next pass).
    #[cfg(test)]
    pub(crate) fn hold(&self, level: usize) -> std::sync::MutexGuard<'_, Vec<Arc<JobCell>>> {
        self.workers[level - 1]
            .jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Wakes the worker of `level` (a futex wake; call once per block, after posting).
    pub(crate) fn wake(&self, level: usize) {
        self.threads[level - 1].thread().unpark();
    }
}

fn work(w: &Worker, stop: &AtomicBool) {
    // The registered jobs, copied out under the lock so that registering or dropping a
    // convolver never waits for a pass of this (low-priority) worker.
    let mut jobs: Vec<Arc<JobCell>> = Vec::new();
    while !stop.load(Ordering::Acquire) {
        std::thread::park();
        jobs.clear();
        jobs.extend(
            w.jobs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .cloned(),
        );
        for cell in jobs.iter() {
            let posted = cell.posted.load(Ordering::Acquire);
            if posted != cell.done.load(Ordering::Relaxed) {
                // SAFETY: posted > done: the audio thread handed this job over (the acquire
                // load above pairs with its release) and will not touch it until `done` moves.
                let job = unsafe { cell.job() };
                job.gather(&cell.halves);
                job.run();
                cell.done.store(posted, Ordering::Release);
            }
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        for t in &self.threads {
            t.thread().unpark();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
