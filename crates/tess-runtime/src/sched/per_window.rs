//! The simplest gang program: one function, called on every hart at the start of every window.

use super::Scheduler;
use crate::{Hart, Step, Task};
use std::sync::Arc;

type WindowFn = dyn Fn(&Hart<'_>) + Send + Sync + 'static;
type AdaptFn = dyn Fn(usize, usize) + Send + Sync + 'static;

/// Calls a function on every hart once per window (time-triggered cells: at the gang-aligned
/// window start; event-triggered cells: once per budget replenishment; other cells: back to
/// back). The function should return before [`Hart::time_left`] runs out.
#[derive(Clone)]
pub struct PerWindow {
    work: Arc<WindowFn>,
    on_adapt: Option<Arc<AdaptFn>>,
}

impl std::fmt::Debug for PerWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PerWindow")
            .field("on_adapt", &self.on_adapt.is_some())
            .finish_non_exhaustive()
    }
}

impl PerWindow {
    /// Runs `work` on every hart in every window.
    pub fn new(work: impl Fn(&Hart<'_>) + Send + Sync + 'static) -> PerWindow {
        PerWindow {
            work: Arc::new(work),
            on_adapt: None,
        }
    }

    /// Also calls `hook(old_n, new_n)` when the cell changes size (once per adaptation).
    pub fn on_adapt(mut self, hook: impl Fn(usize, usize) + Send + Sync + 'static) -> PerWindow {
        self.on_adapt = Some(Arc::new(hook));
        self
    }

    fn task(&self) -> Task {
        let work = self.work.clone();
        Task::new(move |h| {
            work(h);
            Step::NextWindow
        })
    }
}

impl Scheduler for PerWindow {
    fn enter(&self, _hart: &Hart<'_>) -> Option<Task> {
        Some(self.task())
    }

    fn r#yield(&self, _hart: &Hart<'_>, task: Task) -> Option<Task> {
        Some(task)
    }

    fn done(&self, _hart: &Hart<'_>) -> Option<Task> {
        Some(self.task())
    }

    fn adapt(&self, old_n: usize, new_n: usize, orphans: Vec<Task>) {
        // Every hart has its own copy of the window task; a retired hart's copy is not work.
        drop(orphans);
        if let Some(hook) = &self.on_adapt {
            hook(old_n, new_n);
        }
    }
}
