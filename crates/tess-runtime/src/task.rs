//! Application work: a task is run in slices on a hart until it says it is done.
//!
//! Harts in Pulse switch between user-level thread contexts (seed 004 section 4.2). Here an
//! application context is a [`Task`]: a closure the runtime calls once per *slice*. A slice
//! returns a [`Step`]: run me again (`Yield`, Pulse's `yield(ctx)`), I finished (`Done`, Pulse's
//! `done()`), or I am done for this window (`NextWindow`: the hart goes idle until the next
//! window and resumes me there, through the scheduler's `tick`). Slices are cooperative: a slice
//! should end before [`crate::Hart::time_left`] runs out, because the runtime can only give the
//! hart back between slices.

use crate::Hart;
use std::fmt;
use std::time::Duration;

/// What a task slice asks for next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub enum Step {
    /// Not finished; run again when the scheduler says so.
    Yield = 0,
    /// Finished; the task is dropped.
    Done = 1,
    /// Finished for this window; resume at the next one (time-triggered cells) or after the
    /// next budget replenishment (event-triggered cells).
    NextWindow = 2,
}

type Body = Box<dyn FnMut(&Hart<'_>) -> Step + Send + 'static>;

/// An application context: a resumable piece of work.
pub struct Task {
    body: Body,
    /// Absolute deadline (ns of `CLOCK_MONOTONIC`) for EDF schedulers; `u64::MAX` if none.
    pub deadline_ns: u64,
    /// An id for the application's own bookkeeping.
    pub id: u64,
}

impl fmt::Debug for Task {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Task")
            .field("id", &self.id)
            .field("deadline_ns", &self.deadline_ns)
            .finish_non_exhaustive()
    }
}

impl Task {
    /// A task without a deadline.
    pub fn new(body: impl FnMut(&Hart<'_>) -> Step + Send + 'static) -> Task {
        Task {
            body: Box::new(body),
            deadline_ns: u64::MAX,
            id: 0,
        }
    }

    /// A one-shot task: runs `f` once and is done.
    pub fn once(f: impl FnOnce(&Hart<'_>) + Send + 'static) -> Task {
        let mut f = Some(f);
        Task::new(move |h| {
            if let Some(f) = f.take() {
                f(h);
            }
            Step::Done
        })
    }

    /// Sets the absolute deadline (ns of `CLOCK_MONOTONIC`).
    pub fn with_deadline_ns(mut self, deadline_ns: u64) -> Task {
        self.deadline_ns = deadline_ns;
        self
    }

    /// Sets the deadline `d` from now.
    pub fn with_deadline_in(self, d: Duration) -> Task {
        let at = tess_sched::clock::now_ns().saturating_add(tess_sched::clock::ns(d));
        self.with_deadline_ns(at)
    }

    /// Sets the id.
    pub fn with_id(mut self, id: u64) -> Task {
        self.id = id;
        self
    }

    /// Runs one slice.
    pub fn run(&mut self, hart: &Hart<'_>) -> Step {
        (self.body)(hart)
    }
}
