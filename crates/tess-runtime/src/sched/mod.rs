//! User-level schedulers in the style of Pulse (seed 004 section 4.2) and Lithe's harts (seed
//! 001 section 4.3).
//!
//! A cell's runtime is handed harts, not threads: the [`Scheduler`] decides what each hart runs.
//! Pulse's five callbacks map as follows (a "context" is a [`Task`]):
//!
//! | Pulse             | here                                   | called when                     |
//! |-------------------|----------------------------------------|---------------------------------|
//! | `enter()`         | [`Scheduler::enter`]                   | a hart has nothing to run: when |
//! |                   |                                        | it starts, and when it comes    |
//! |                   |                                        | back from idle                  |
//! | `tick(ctx)`       | [`Scheduler::tick`]                    | a window starts with a task     |
//! |                   |                                        | still current (the muxer        |
//! |                   |                                        | preempted it at the last end)   |
//! | `yield(ctx)`      | [`Scheduler::yield`](Scheduler::r#yield) | a slice returned `Step::Yield` |
//! | `done()`          | [`Scheduler::done`]                    | a slice returned `Step::Done`   |
//! | `adapt(o, n, c[])`| [`Scheduler::adapt`]                   | the cell grew or shrank: once,  |
//! |                   |                                        | with the tasks of retired harts |
//!
//! Each callback that returns `Option<Task>` hands the hart its next task (Pulse's
//! `run_next_thread`); `None` idles the hart until new work is announced
//! ([`crate::Handle::notify`]) or the next window. Callbacks run on the hart that needs the
//! decision, concurrently on different harts, so shared scheduler state needs locks; a callback
//! should not block for long (the hart is not running application work meanwhile).
//!
//! Two schedulers come with the runtime so that applications need not write one:
//! [`PerWindow`] (a function called on every hart in every window: the gang-scheduled SPMD
//! pattern) and [`WorkQueue`] (a global queue served round-robin or earliest-deadline-first,
//! Listing 2 of seed 004 and its EDF variant).

mod per_window;
mod queue;

pub use per_window::PerWindow;
pub use queue::{QueuePolicy, WorkQueue};

use crate::{Handle, Hart, Task};

/// A user-level scheduler: decides what each hart of the cell runs (module docs).
pub trait Scheduler: Send + Sync + 'static {
    /// Called once before any hart runs, with a handle to the runtime.
    fn start(&self, handle: &Handle) {
        let _ = handle;
    }

    /// A hart has nothing to run: return its next task, or `None` to idle.
    fn enter(&self, hart: &Hart<'_>) -> Option<Task>;

    /// A window starts and `task` was current at the end of the last one: return the task to
    /// run (the same one by default; a preemptive scheduler may queue it and pick another).
    fn tick(&self, hart: &Hart<'_>, task: Task) -> Option<Task> {
        let _ = hart;
        Some(task)
    }

    /// `task` yielded (`Step::Yield`): return the next task.
    fn r#yield(&self, hart: &Hart<'_>, task: Task) -> Option<Task>;

    /// The current task finished (`Step::Done`): return the next task.
    fn done(&self, hart: &Hart<'_>) -> Option<Task>;

    /// The cell changed from `old_n` to `new_n` harts. Called once, on one surviving hart,
    /// after retired harts have stopped (their unfinished tasks are in `orphans`) or new harts
    /// have started, and before new harts run anything.
    fn adapt(&self, old_n: usize, new_n: usize, orphans: Vec<Task>);
}
