//! Cell runtimes' control channels (`tess_proto::runtime`): which runtimes a change concerns,
//! and telling them.

use super::error::{Caller, EResult, EngineError};
use super::Engine;
use std::time::Instant;
use tess_core::state::Cluster;
use tess_proto::{Body, ErrorKind};

/// Runtimes to tell about a change (see `Engine::apply`).
#[derive(Debug, Default)]
pub(super) struct Adaptations {
    /// Fewer harts: told first, and waited for.
    pub(super) shrinking: Vec<String>,
    /// More harts, same timing: told before the kernel work.
    pub(super) gaining: Vec<String>,
    /// Other harts or other timing: told after the commit.
    pub(super) changing: Vec<String>,
}

impl Engine {
    /// Cells with a runtime that must adapt to `next`, by kind of change.
    pub(super) fn adaptations(&self, next: &Cluster) -> Adaptations {
        let mut a = Adaptations::default();
        for name in self.runtimes.keys() {
            let (Some(old), Some(new)) = (self.cluster.cells.get(name), next.cells.get(name))
            else {
                continue;
            };
            let same_policy = new.spec.policy == old.spec.policy;
            if new.harts.len() < old.harts.len() {
                a.shrinking.push(name.clone());
            } else if same_policy && old.harts.is_subset(&new.harts) && new.harts != old.harts {
                a.gaining.push(name.clone());
            } else if new.harts != old.harts || !same_policy {
                a.changing.push(name.clone());
            }
        }
        a
    }

    /// Tells a cell's runtime about its new harts; when `wait`, waits for it to finish adapting
    /// (bounded by [`tess_proto::runtime::ADAPT_ACK_TIMEOUT`]).
    pub(super) fn notify_runtime(&mut self, name: &str, next: &Cluster, wait: bool) {
        use tess_proto::runtime::{decode, encode, Control, Report, Window, ADAPT_ACK_TIMEOUT};
        let Some(cell) = next.cells.get(name) else {
            return;
        };
        self.adapt_seq += 1;
        let seq = self.adapt_seq;
        let window = cell
            .policy()
            .server()
            .filter(|_| cell.policy().is_reservation())
            .map(|s| Window {
                runtime_ns: s.budget.as_nanos() as u64,
                deadline_ns: s.deadline.as_nanos() as u64,
                period_ns: s.period.as_nanos() as u64,
                offset_ns: cell.window().map(|w| w.0.as_nanos() as u64),
            });
        let msg = encode(&Control::Adapt {
            seq,
            harts: cell.harts.iter().collect(),
            window,
        });
        let Some(ep) = self.runtimes.get_mut(name) else {
            return;
        };
        if let Err(e) = ep.try_send(&msg) {
            tracing::info!(cell = name, error = %e, "the cell's runtime is gone");
            self.runtimes.remove(name);
            return;
        }
        if !wait {
            return;
        }
        let deadline = Instant::now() + ADAPT_ACK_TIMEOUT;
        let mut buf = vec![0u8; 4096];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match ep.recv_timeout(&mut buf, left) {
                Ok(n) => {
                    if let Some(Report::Adapted { seq: s, .. }) = decode::<Report>(&buf[..n]) {
                        if s == seq {
                            return;
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(
                        cell = name,
                        "runtime did not confirm the adaptation ({e}); shrinking anyway"
                    );
                    return;
                }
            }
        }
    }

    /// Gives a cell's runtime its control channel (`tess_proto::runtime`); returns the reply and
    /// the runtime's channel end (tessd keeps the other).
    pub fn runtime_attach(
        &mut self,
        caller: &Caller,
        cell: &str,
    ) -> EResult<(Body, tess_channel::EndpointFds)> {
        self.visible(caller, cell)?;
        if self.kernel.cgroups().cell_of_pid(caller.pid).as_deref() != Some(cell) {
            return Err(EngineError::new(
                ErrorKind::Permission,
                format!("a runtime must run inside its cell: process {} is not in cell '{cell}' (start it with `tess run --cell {cell}`)", caller.pid),
            ));
        }
        let internal = |e: tess_channel::OpenError| {
            EngineError::new(
                ErrorKind::Internal,
                format!("creating a control channel: {e}"),
            )
        };
        let (ours, theirs) =
            tess_channel::Channel::create(&tess_channel::ChannelOptions::for_max_message(4096))
                .map_err(internal)?;
        let ep = tess_channel::Endpoint::from_fds(ours).map_err(internal)?;
        self.runtimes.insert(cell.to_string(), ep);
        Ok((
            Body::Cell(Box::new(self.info(&self.cluster.cells[cell]))),
            theirs,
        ))
    }

    /// A deleted cell's runtime is told to shut down (best effort: it may be gone already).
    pub(super) fn shut_down_runtime(&mut self, name: &str) {
        if let Some(mut ep) = self.runtimes.remove(name) {
            let _ = ep.try_send(&tess_proto::runtime::encode(
                &tess_proto::runtime::Control::Shutdown,
            ));
        }
    }
}
