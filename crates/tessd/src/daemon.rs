//! The daemon's concurrency model: one writer at a time, readers never wait.
//!
//! - **Transactions** (cell changes, attach, quotas, runtime attach) and the two background
//!   writers (housekeeping, fork events) take the [`Engine`] through [`TxnLock`], one at a time.
//!   A writer that cannot get it within [`TXN_WAIT`] gets a clear "busy" error instead of
//!   queueing without bound.
//! - **Reads** (`status`, `cell list`, `cell show`, `quota list`, `hello`, and the nameserver's
//!   peer lookups) are answered from the published [`Snapshot`]: an `Arc` behind an `RwLock`
//!   that is held only to clone or swap the pointer, never across any work. A writer publishes a
//!   new snapshot after every change, while it still holds the transaction lock, so snapshots
//!   appear in commit order and always show a committed state.
//! - A transaction runs ahead of readers: while it holds the lock, its thread is `SCHED_FIFO` 1
//!   ([`Urgent`]), the lowest real-time priority (below every reserved cell's threads and every
//!   real-time program), so that hundreds of busy readers or batch work on the system harts do not
//!   stretch a change from milliseconds to hundreds of milliseconds. A transaction is bounded
//!   work (its waits sleep), so it cannot monopolise a hart.
//! - Waits inside a transaction (a runtime's acknowledgement, a time-triggered window, the
//!   kernel) hold only the transaction lock, and each has a deadline: `ADAPT_ACK_TIMEOUT` for
//!   runtimes, one period for windows.

use crate::engine::view::{self, Snapshot};
use crate::engine::{Caller, Engine};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};
use tess_proto::{ErrorKind, Request, Response};

/// Longest a writer waits for the transaction lock before it is told the daemon is busy.
pub const TXN_WAIT: Duration = Duration::from_secs(10);

/// A mutex whose acquisition can time out (std's cannot): a flag under a short-held mutex plus
/// a condition variable, guarding the value in a second mutex that is only ever taken
/// uncontended.
#[derive(Debug)]
pub struct TxnLock<T> {
    busy: Mutex<bool>,
    freed: Condvar,
    value: Mutex<T>,
}

/// Exclusive access to the value of a [`TxnLock`].
#[derive(Debug)]
pub struct TxnGuard<'a, T> {
    lock: &'a TxnLock<T>,
    value: Option<MutexGuard<'a, T>>,
}

/// [`TxnLock::lock_timeout`] gave up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Busy {
    /// How long it waited.
    pub waited: Duration,
}

impl std::fmt::Display for Busy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "tessd is busy: another change has held the transaction lock for {:.1} s; try again",
            self.waited.as_secs_f64()
        )
    }
}

impl<T> TxnLock<T> {
    /// A lock around `value`.
    pub fn new(value: T) -> Self {
        TxnLock {
            busy: Mutex::new(false),
            freed: Condvar::new(),
            value: Mutex::new(value),
        }
    }

    /// Waits at most `timeout` for exclusive access.
    pub fn lock_timeout(&self, timeout: Duration) -> Result<TxnGuard<'_, T>, Busy> {
        let t0 = Instant::now();
        let mut busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        while *busy {
            let left = timeout.saturating_sub(t0.elapsed());
            if left.is_zero() {
                return Err(Busy {
                    waited: t0.elapsed(),
                });
            }
            busy = self
                .freed
                .wait_timeout(busy, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        *busy = true;
        drop(busy);
        Ok(TxnGuard {
            lock: self,
            value: Some(self.value.lock().unwrap_or_else(|p| p.into_inner())),
        })
    }

    /// Waits as long as it takes (background writers, which have nobody to answer).
    pub fn lock(&self) -> TxnGuard<'_, T> {
        loop {
            if let Ok(g) = self.lock_timeout(Duration::from_secs(3600)) {
                return g;
            }
        }
    }
}

impl<T> std::ops::Deref for TxnGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.value.as_ref().expect("held until drop")
    }
}

impl<T> std::ops::DerefMut for TxnGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.value.as_mut().expect("held until drop")
    }
}

impl<T> Drop for TxnGuard<'_, T> {
    fn drop(&mut self) {
        self.value = None;
        *self.lock.busy.lock().unwrap_or_else(|p| p.into_inner()) = false;
        self.lock.freed.notify_one();
    }
}

/// Real-time priority of a thread running a transaction (see the module docs).
pub const TXN_FIFO_PRIORITY: u32 = 1;

/// The calling thread runs as `SCHED_FIFO` [`TXN_FIFO_PRIORITY`] until dropped, then gets its
/// previous policy back. Where the kernel refuses (RT group scheduling without RT runtime for
/// tessd's group), it stays as it was.
#[derive(Debug)]
pub struct Urgent {
    previous: Option<(tess_sched::Policy, u64)>,
}

impl Urgent {
    /// Raises the calling thread.
    pub fn raise() -> Urgent {
        use tess_sched::{attr, Policy};
        let previous = attr::get_policy(0).ok().filter(|_| {
            attr::set_policy(
                0,
                Policy::Fifo {
                    priority: TXN_FIFO_PRIORITY,
                },
                0,
            )
            .is_ok()
        });
        Urgent { previous }
    }
}

impl Drop for Urgent {
    fn drop(&mut self) {
        if let Some((policy, flags)) = self.previous.take() {
            if let Err(e) = tess_sched::attr::set_policy(0, policy, flags) {
                tracing::warn!("restoring a connection thread's policy: {e}");
            }
        }
    }
}

/// The engine behind its transaction lock, and the published snapshot.
#[derive(Debug)]
pub struct Daemon {
    engine: TxnLock<Engine>,
    view: RwLock<Arc<Snapshot>>,
}

impl Daemon {
    /// Wraps a started engine and publishes its first snapshot.
    pub fn new(engine: Engine) -> Daemon {
        let view = RwLock::new(Arc::new(engine.snapshot()));
        Daemon {
            engine: TxnLock::new(engine),
            view,
        }
    }

    /// The committed state as last published (a pointer clone).
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.view.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn publish(&self, engine: &Engine) {
        let next = Arc::new(engine.snapshot());
        *self.view.write().unwrap_or_else(|p| p.into_inner()) = next;
    }

    /// Runs `f` as a transaction: under the transaction lock (at most [`TXN_WAIT`] to get it),
    /// then publishes the resulting state.
    pub fn transact<R>(&self, f: impl FnOnce(&mut Engine) -> R) -> Result<R, Busy> {
        let mut e = self.engine.lock_timeout(TXN_WAIT)?;
        let _urgent = Urgent::raise();
        let r = f(&mut e);
        self.publish(&e);
        Ok(r)
    }

    /// Like [`Daemon::transact`], waiting as long as it takes (housekeeping, fork events).
    pub fn background<R>(&self, f: impl FnOnce(&mut Engine) -> R) -> R {
        let mut e = self.engine.lock();
        let g0 = e.generation();
        let r = f(&mut e);
        // Housekeeping may have committed (ephemeral cells) or moved spinners: publish then.
        if e.generation() != g0 {
            self.publish(&e);
        }
        r
    }

    /// Publishes a fresh snapshot (after housekeeping, whose thread lists and spinners the
    /// snapshot does not follow by itself).
    pub fn refresh(&self) {
        let e = self.engine.lock();
        self.publish(&e);
    }

    /// Handles one request: reads from the snapshot, writes as a transaction.
    pub fn handle(&self, caller: &Caller, req: Request) -> Response {
        if view::is_read(&req) {
            return self
                .snapshot()
                .handle(caller, &req)
                .expect("is_read requests are answered by snapshots");
        }
        match self.transact(|e| e.handle(caller, req)) {
            Ok(r) => r,
            Err(busy) => Response::Error {
                kind: ErrorKind::Internal,
                message: busy.to_string(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_lock_times_out_with_how_long_it_waited() {
        let l = TxnLock::new(0u32);
        let g = l.lock_timeout(Duration::from_millis(10)).unwrap();
        let e = l.lock_timeout(Duration::from_millis(20)).unwrap_err();
        assert!(e.waited >= Duration::from_millis(20), "{e:?}");
        assert!(e.to_string().contains("busy"), "{e}");
        drop(g);
        *l.lock_timeout(Duration::from_millis(10)).unwrap() += 1;
        assert_eq!(*l.lock(), 1);
    }

    #[test]
    fn writers_are_serialised() {
        let l = Arc::new(TxnLock::new(Vec::new()));
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let l = l.clone();
                std::thread::spawn(move || {
                    for _ in 0..100 {
                        let mut g = l.lock();
                        // A second writer inside would interleave its pushes with ours.
                        g.push(i);
                        std::thread::yield_now();
                        g.push(i);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let v = l.lock();
        assert_eq!(v.len(), 1600);
        assert!(v.chunks(2).all(|p| p[0] == p[1]));
    }
}
