//! The transaction (module docs of [`crate::engine`]): place and admit, plan, apply to the
//! kernel, commit to the journal, publish. Each step is its own module; this one orders them and
//! undoes the kernel side when a later step fails.
//!
//! Crash points (see [`crate::fault`]) sit between the steps. Wherever the daemon dies, the
//! journal holds either the old state (death before the commit returns) or the new one, and
//! start-up converges the kernel to what the journal holds: the transaction is all or nothing.

use super::admit::place_and_admit;
use super::error::{us, Caller, EResult, EngineError};
use super::runtimes::Adaptations;
use super::view::quota_of;
use super::{journal, Engine};
use crate::fault::{self, Point};
use std::collections::BTreeSet;
use std::time::Instant;
use tess_core::state::Cluster;
use tess_proto::{ApplyResult, ErrorKind, Timing};

impl Engine {
    /// Runs one transaction from the current state to `next` (`changed`: cells to re-place).
    pub(super) fn transact(
        &mut self,
        caller: &Caller,
        mut next: Cluster,
        changed: BTreeSet<String>,
        mut result: ApplyResult,
        dry_run: bool,
    ) -> EResult<ApplyResult> {
        let t0 = Instant::now();
        let quota = (!caller.is_root()).then(|| quota_of(&self.quotas, &self.config, caller.uid));
        place_and_admit(
            &mut next,
            &self.cap,
            &changed,
            quota.as_ref().map(|q| (caller.uid, q)),
        )?;
        let t1 = Instant::now();
        let mut named: Vec<String> = result
            .created
            .iter()
            .chain(result.updated.iter())
            .cloned()
            .collect();
        named.sort();
        result.dry_run = dry_run;
        if dry_run {
            result.cells = named
                .iter()
                .filter_map(|n| next.cells.get(n))
                .map(|c| self.info(c))
                .collect();
            result.timing = Timing {
                admit_us: us(t1 - t0),
                total_us: us(t1 - t0),
                ..Default::default()
            };
            return Ok(result);
        }
        let next_layout = self.kernel.plan(&next);
        let generation = self.generation + 1;
        fault::reached(Point::AfterPlan);
        // Runtimes of shrinking cells retire their threads before the kernel takes harts away.
        // This is the one wait inside a transaction on something outside the daemon; it is
        // bounded by ADAPT_ACK_TIMEOUT and readers never wait for it (they use snapshots).
        let Adaptations {
            shrinking,
            gaining,
            changing,
        } = self.adaptations(&next);
        for name in &shrinking {
            self.notify_runtime(name, &next, true);
        }
        // Runtimes that only gain harts hear of it before the kernel work rather than after: a
        // runtime acts on it at its next window, and the thread it then starts is placed on the
        // new hart by the sync below or by the fork watcher. Overlapping the two saves the
        // runtime up to a period. If the change fails they are told the old harts again.
        for name in &gaining {
            self.notify_runtime(name, &next, false);
        }
        let undo_gains = |engine: &mut Engine| {
            let old = engine.cluster.clone();
            for name in &gaining {
                engine.notify_runtime(name, &old, false);
            }
        };
        // Apply first, then commit: a daemon killed in between restarts from the old committed
        // state and converges the kernel back to it.
        let applied = self
            .kernel
            .converge(Some(&self.layout), &next_layout, &self.store);
        let t2 = Instant::now();
        match applied {
            Ok(rephase) => self.rephase_due.extend(rephase),
            Err(e) => {
                self.roll_back(&next_layout);
                undo_gains(self);
                return Err(EngineError::new(
                    ErrorKind::Kernel,
                    format!("the kernel refused the change, which was rolled back: {e:#}"),
                ));
            }
        }
        fault::reached(Point::BeforeCommit);
        if let Err(e) = journal::commit(&mut self.store, &next, &result, generation) {
            self.roll_back(&next_layout);
            undo_gains(self);
            return Err(EngineError::new(
                ErrorKind::Internal,
                format!("the change could not be recorded in the state directory, so it was rolled back: {e:#}"),
            ));
        }
        fault::reached(Point::AfterCommit);
        let t3 = Instant::now();
        for name in &result.deleted {
            self.shut_down_runtime(name);
        }
        self.cluster = next;
        self.layout = next_layout;
        self.generation = generation;
        // Runtimes whose harts move or whose timing changes hear of it once the kernel has it.
        for name in &changing {
            let next = self.cluster.clone();
            self.notify_runtime(name, &next, false);
        }
        tracing::info!(
            generation,
            created = ?result.created,
            updated = ?result.updated,
            deleted = ?result.deleted,
            uid = caller.uid,
            "committed in {:.0} us",
            us(t3 - t0)
        );
        result.cells = named
            .iter()
            .filter_map(|n| self.cluster.cells.get(n))
            .map(|c| self.info(c))
            .collect();
        result.timing = Timing {
            admit_us: us(t1 - t0),
            enforce_us: us(t2 - t1),
            commit_us: us(t3 - t2),
            total_us: us(t3 - t0),
        };
        Ok(result)
    }

    /// Converges the kernel from a failed `attempted` layout back to the committed one.
    fn roll_back(&mut self, attempted: &tess_core::layout::Layout) {
        if let Err(back) = self
            .kernel
            .converge(Some(attempted), &self.layout, &self.store)
        {
            tracing::error!("rolling back a failed change also failed: {back:#}");
        }
    }
}
