//! Global round robin (GRR): one FIFO run queue shared by all harts; every tick (1 ms by
//! default) the running thread goes to the back and the front one runs. This is Listing 2 of
//! seed 004 in Rust.
//!
//! Worked example: threads A, B, C on one hart with a 1 ms tick: A runs 0-1 ms, B 1-2 ms,
//! C 2-3 ms, A again 3-4 ms; a thread that yields early gives the rest of its slice to the next.

use crate::lock::SpinLock;
use crate::sched::{Hart, Scheduler};
use crate::thread::Thread;
use std::collections::VecDeque;

/// The GRR scheduler.
#[derive(Debug)]
pub struct Grr {
    queue: SpinLock<VecDeque<Thread>>,
}

impl Grr {
    /// A GRR scheduler with room for `max_threads` runnable threads before its queue grows.
    pub fn new(max_threads: usize) -> Grr {
        Grr {
            queue: SpinLock::new(VecDeque::with_capacity(max_threads)),
        }
    }

    fn next(&self) -> Option<Thread> {
        self.queue.lock().pop_front()
    }

    /// Runnable threads waiting in the queue.
    pub fn queued(&self) -> usize {
        self.queue.lock().len()
    }
}

impl Default for Grr {
    fn default() -> Grr {
        Grr::new(1024)
    }
}

impl Scheduler for Grr {
    fn enter(&self, _: &Hart<'_>) -> Option<Thread> {
        self.next()
    }

    fn tick(&self, _: &Hart<'_>, current: Thread) -> Option<Thread> {
        let mut q = self.queue.lock();
        if q.is_empty() {
            return Some(current);
        }
        q.push_back(current);
        q.pop_front()
    }

    fn r#yield(&self, hart: &Hart<'_>, current: Thread) -> Option<Thread> {
        self.tick(hart, current)
    }

    fn adapt(&self, _: usize, _: usize, running: Vec<Thread>) {
        let mut q = self.queue.lock();
        for t in running {
            q.push_back(t);
        }
    }

    fn wake(&self, thread: Thread) -> bool {
        self.queue.lock().push_back(thread);
        false
    }
}
