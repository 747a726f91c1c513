//! Thread stacks: one `mmap` each, with a guard page below (stacks grow down), kept in a pool so
//! that creating a thread on the fast path makes no system call.
//!
//! A stack that overflows touches its guard page; the fault handler (`fault.rs`) looks the
//! address up in the running thread's guard range and names the thread.
//!
//! Locking: the pool is a `std::sync::Mutex` (a futex: no system call when uncontended). Pulse
//! only takes it with ticks off, so its holder is never preempted at user level and a scheduler
//! that frees a stack never waits for a thread that is not running.

use std::sync::Mutex;

/// Smallest stack Pulse hands out: the preemption trampoline needs up to ~3 KiB (registers and
/// the `xsave` area) on the interrupted stack, on top of what the thread uses.
pub const MIN_STACK: usize = 16 * 1024;

/// Default stack size of a thread.
pub const DEFAULT_STACK: usize = 256 * 1024;

/// Stacks kept per size for reuse.
const POOL_LIMIT: usize = 1024;

/// Errors allocating a stack.
#[derive(Debug, thiserror::Error)]
pub enum StackError {
    /// `mmap` or `mprotect` failed.
    #[error("cannot map a {size}-byte thread stack: {source}")]
    Map {
        /// Requested usable size.
        size: usize,
        /// The kernel's answer.
        #[source]
        source: std::io::Error,
    },
}

pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// A mapped stack: `[base, base + guard)` is the guard page, `[base + guard, base + len)` is
/// usable.
#[derive(Debug)]
pub struct Stack {
    base: usize,
    len: usize,
    guard: usize,
}

impl Stack {
    /// Maps a new stack with `size` usable bytes (rounded up to pages, at least [`MIN_STACK`]).
    pub fn map(size: usize) -> Result<Stack, StackError> {
        let page = page_size();
        let usable = size.max(MIN_STACK).div_ceil(page) * page;
        let len = usable + page;
        // SAFETY: an anonymous private mapping at an address of the kernel's choosing touches no
        // existing memory.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(StackError::Map {
                size: usable,
                source: std::io::Error::last_os_error(),
            });
        }
        // SAFETY: the first page of the mapping we just made; nothing points into it yet.
        if unsafe { libc::mprotect(base, page, libc::PROT_NONE) } != 0 {
            let source = std::io::Error::last_os_error();
            // SAFETY: unmapping the mapping we made above.
            unsafe { libc::munmap(base, len) };
            return Err(StackError::Map {
                size: usable,
                source,
            });
        }
        Ok(Stack {
            base: base as usize,
            len,
            guard: page,
        })
    }

    /// Usable bytes.
    pub fn usable(&self) -> usize {
        self.len - self.guard
    }

    /// One past the highest usable byte (where a fresh context starts).
    pub fn top(&self) -> *mut u8 {
        (self.base + self.len) as *mut u8
    }

    /// The guard page's address range.
    pub fn guard_range(&self) -> std::ops::Range<usize> {
        self.base..self.base + self.guard
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: the mapping is ours and nothing runs on it any more (a stack is dropped only
        // when its thread finished or was never started).
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

/// Reusable stacks, by usable size.
#[derive(Debug, Default)]
pub(crate) struct StackPool {
    free: Mutex<Vec<Stack>>,
}

impl StackPool {
    pub(crate) const fn new() -> StackPool {
        StackPool {
            free: Mutex::new(Vec::new()),
        }
    }

    fn rounded(size: usize) -> usize {
        let page = page_size();
        size.max(MIN_STACK).div_ceil(page) * page
    }

    /// A stack of `size` usable bytes: from the pool if one of that size is free (no system
    /// call), else freshly mapped.
    pub(crate) fn take(&self, size: usize) -> Result<Stack, StackError> {
        let want = Self::rounded(size);
        {
            let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(i) = free.iter().rposition(|s| s.usable() == want) {
                return Ok(free.swap_remove(i));
            }
        }
        Stack::map(want)
    }

    /// Returns a stack for reuse (unmaps it if the pool is full).
    pub(crate) fn give(&self, s: Stack) {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        if free.len() < POOL_LIMIT {
            if free.capacity() == free.len() {
                // Growing would call malloc, which a scheduler context must not (a preempted
                // thread may hold malloc's lock on this kernel thread): drop the stack instead.
                drop(free);
                drop(s);
                return;
            }
            free.push(s);
        }
    }

    /// Maps `n` stacks of `size` bytes ahead of time so that later creations hit the pool.
    pub(crate) fn reserve(&self, n: usize, size: usize) -> Result<(), StackError> {
        let want = Self::rounded(size);
        let mut fresh = Vec::with_capacity(n);
        for _ in 0..n {
            fresh.push(Stack::map(want)?);
        }
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let room = POOL_LIMIT.saturating_sub(free.len());
        free.reserve(room);
        free.extend(fresh);
        Ok(())
    }
}

/// The process-wide pool.
pub(crate) static POOL: StackPool = StackPool::new();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stacks_are_rounded_and_reused() {
        let pool = StackPool::new();
        pool.reserve(2, 20_000).unwrap();
        let a = pool.take(20_000).unwrap();
        assert_eq!(a.usable() % page_size(), 0);
        assert!(a.usable() >= 20_000);
        let top = a.top();
        pool.give(a);
        let b = pool.take(20_000).unwrap();
        assert_eq!(b.top(), top, "the freed stack is handed out again");
        assert!(b.guard_range().end <= b.top() as usize - b.usable());
    }

    #[test]
    fn guard_page_is_not_accessible() {
        let s = Stack::map(MIN_STACK).unwrap();
        let g = s.guard_range();
        let mut vec = [0u8; 1];
        // SAFETY: mincore only reports on the pages; it does not touch them.
        let r = unsafe { libc::mincore(g.start as *mut _, g.end - g.start, vec.as_mut_ptr()) };
        assert_eq!(r, 0, "the guard page is mapped");
        // The protection is checked through /proc/self/maps: the guard is ---p.
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let line = maps
            .lines()
            .find(|l| l.starts_with(&format!("{:x}-", g.start)))
            .expect("the guard page has its own line in /proc/self/maps");
        assert!(line.contains("---p"), "{line}");
    }
}
