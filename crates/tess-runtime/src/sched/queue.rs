//! A global work queue served by every hart: round-robin (seed 004 Listing 2) or
//! earliest-deadline-first (the Pulse EDF scheduler of section 4.2).
//!
//! One queue, one lock (Pulse's `push_lock` / `pop_lock`). Round-robin pushes a yielding task to
//! the tail; EDF keeps tasks ordered by absolute deadline (ties in arrival order) and, at each
//! window start (`tick`), lets an earlier-deadline task that arrived meanwhile preempt the
//! current one. On adaptation, the tasks of retired harts go back into the queue, so no work is
//! lost.

use super::Scheduler;
use crate::{Handle, Hart, Task};
use std::cmp::Ordering as CmpOrdering;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// How a [`WorkQueue`] orders its tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueuePolicy {
    /// First in, first out; a yielding task goes to the back.
    RoundRobin,
    /// Earliest [`Task::deadline_ns`] first.
    Edf,
}

struct ByDeadline {
    task: Task,
    seq: u64,
}

impl PartialEq for ByDeadline {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == CmpOrdering::Equal
    }
}
impl Eq for ByDeadline {}
impl PartialOrd for ByDeadline {
    fn partial_cmp(&self, o: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(o))
    }
}
impl Ord for ByDeadline {
    // BinaryHeap is a max-heap: the earliest deadline (then the oldest) is the greatest.
    fn cmp(&self, o: &Self) -> CmpOrdering {
        (o.task.deadline_ns, o.seq).cmp(&(self.task.deadline_ns, self.seq))
    }
}

#[derive(Default)]
struct State {
    fifo: VecDeque<Task>,
    heap: BinaryHeap<ByDeadline>,
    seq: u64,
}

type AdaptFn = dyn Fn(usize, usize) + Send + Sync + 'static;

struct Inner {
    policy: QueuePolicy,
    state: Mutex<State>,
    /// Tasks taken from the queue and not yet finished or returned.
    running: AtomicUsize,
    handle: OnceLock<Handle>,
    stop_when_drained: bool,
    on_adapt: Option<Arc<AdaptFn>>,
}

/// A global queue of tasks served by every hart. Clones share the queue.
#[derive(Clone)]
pub struct WorkQueue {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for WorkQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkQueue")
            .field("policy", &self.inner.policy)
            .field("queued", &self.len())
            .finish_non_exhaustive()
    }
}

impl WorkQueue {
    /// An empty queue.
    pub fn new(policy: QueuePolicy) -> WorkQueue {
        WorkQueue::build(policy, false, None)
    }

    fn build(policy: QueuePolicy, stop: bool, on_adapt: Option<Arc<AdaptFn>>) -> WorkQueue {
        WorkQueue {
            inner: Arc::new(Inner {
                policy,
                state: Mutex::new(State::default()),
                running: AtomicUsize::new(0),
                handle: OnceLock::new(),
                stop_when_drained: stop,
                on_adapt,
            }),
        }
    }

    /// Stops the runtime when the queue is empty and no task is running (set before
    /// [`crate::Runtime::run`], on a queue with tasks already pushed).
    pub fn stop_when_drained(self) -> WorkQueue {
        let w = WorkQueue::build(self.inner.policy, true, self.inner.on_adapt.clone());
        w.take_from(&self);
        w
    }

    /// Also calls `hook(old_n, new_n)` on adaptation, after the orphans are back in the queue.
    pub fn on_adapt(self, hook: impl Fn(usize, usize) + Send + Sync + 'static) -> WorkQueue {
        let w = WorkQueue::build(
            self.inner.policy,
            self.inner.stop_when_drained,
            Some(Arc::new(hook)),
        );
        w.take_from(&self);
        w
    }

    fn take_from(&self, other: &WorkQueue) {
        let mut from = other.lock();
        let mut to = self.lock();
        to.fifo.append(&mut from.fifo);
        to.heap.append(&mut from.heap);
        to.seq = from.seq;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a task and wakes an idle hart.
    pub fn push(&self, task: Task) {
        self.put(task);
        if let Some(h) = self.inner.handle.get() {
            h.notify();
        }
    }

    fn put(&self, task: Task) {
        let mut s = self.lock();
        match self.inner.policy {
            QueuePolicy::RoundRobin => s.fifo.push_back(task),
            QueuePolicy::Edf => {
                s.seq += 1;
                let seq = s.seq;
                s.heap.push(ByDeadline { task, seq });
            }
        }
    }

    fn pop(&self) -> Option<Task> {
        let t = {
            let mut s = self.lock();
            match self.inner.policy {
                QueuePolicy::RoundRobin => s.fifo.pop_front(),
                QueuePolicy::Edf => s.heap.pop().map(|b| b.task),
            }
        };
        if t.is_some() {
            self.inner.running.fetch_add(1, Ordering::AcqRel);
        }
        t
    }

    /// Puts a running task back and takes the next (possibly the same one).
    fn requeue(&self, task: Task) -> Option<Task> {
        self.inner.running.fetch_sub(1, Ordering::AcqRel);
        self.put(task);
        self.pop()
    }

    /// Tasks waiting in the queue.
    pub fn len(&self) -> usize {
        let s = self.lock();
        s.fifo.len() + s.heap.len()
    }

    /// Whether no task waits in the queue.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn maybe_stop(&self) {
        if self.inner.stop_when_drained
            && self.inner.running.load(Ordering::Acquire) == 0
            && self.is_empty()
        {
            if let Some(h) = self.inner.handle.get() {
                h.stop();
            }
        }
    }
}

impl Scheduler for WorkQueue {
    fn start(&self, handle: &Handle) {
        let _ = self.inner.handle.set(handle.clone());
        self.maybe_stop();
    }

    fn enter(&self, _hart: &Hart<'_>) -> Option<Task> {
        let t = self.pop();
        if t.is_none() {
            self.maybe_stop();
        }
        t
    }

    fn tick(&self, _hart: &Hart<'_>, task: Task) -> Option<Task> {
        match self.inner.policy {
            // Non-preemptive round-robin: a task keeps its hart across windows until it yields.
            QueuePolicy::RoundRobin => Some(task),
            QueuePolicy::Edf => self.requeue(task),
        }
    }

    fn r#yield(&self, _hart: &Hart<'_>, task: Task) -> Option<Task> {
        self.requeue(task)
    }

    fn done(&self, _hart: &Hart<'_>) -> Option<Task> {
        self.inner.running.fetch_sub(1, Ordering::AcqRel);
        let t = self.pop();
        if t.is_none() {
            self.maybe_stop();
        }
        t
    }

    fn adapt(&self, old_n: usize, new_n: usize, orphans: Vec<Task>) {
        for t in orphans {
            self.inner.running.fetch_sub(1, Ordering::AcqRel);
            self.put(t);
        }
        if let Some(hook) = &self.inner.on_adapt {
            hook(old_n, new_n);
        }
        if let Some(h) = self.inner.handle.get() {
            h.notify();
        }
    }
}
