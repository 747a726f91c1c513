//! Creating threads from Rust: options and the common path of `Pulse::spawn` and `spawn`.

use crate::runtime::PulseError;
use crate::stack::DEFAULT_STACK;
use crate::thread::{Entry, PulseThread};
use std::time::Duration;

/// How a thread is created.
#[derive(Debug, Clone, Default)]
pub struct ThreadOptions {
    /// Name used in reports (at most 31 bytes kept).
    pub name: Option<String>,
    /// Stack size in bytes (default 256 KiB; at least 16 KiB).
    pub stack_size: Option<usize>,
    /// EDF: the period and the relative deadline of each job.
    pub timing: Option<(Duration, Duration)>,
}

impl ThreadOptions {
    /// Options with a name.
    pub fn named(name: impl Into<String>) -> ThreadOptions {
        ThreadOptions {
            name: Some(name.into()),
            ..Default::default()
        }
    }

    /// Sets the EDF period and relative deadline.
    pub fn timing(mut self, period: Duration, deadline: Duration) -> ThreadOptions {
        self.timing = Some((period, deadline));
        self
    }

    /// Sets the stack size.
    pub fn stack_size(mut self, bytes: usize) -> ThreadOptions {
        self.stack_size = Some(bytes);
        self
    }
}

/// Allocates and prepares a thread (not yet handed to a scheduler).
pub(crate) fn build(opts: ThreadOptions, entry: Entry) -> Result<*mut PulseThread, PulseError> {
    let p = PulseThread::alloc(opts.stack_size.unwrap_or(DEFAULT_STACK))?.as_ptr();
    // SAFETY: p is new and exclusively ours.
    let t = unsafe { &mut *p };
    if let Some(n) = &opts.name {
        t.set_name(n);
    }
    if let Some((period, deadline)) = opts.timing {
        t.set_timing(period, deadline);
    }
    t.make(entry);
    Ok(p)
}
