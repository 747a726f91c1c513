//! Plumbing shared by the benchmarks: talking to tessd, running workloads in cells, cleaning up.

use std::process::{Child, Command, Stdio};
use tess_core::spec::CellSpec;
use tess_proto::{Body, Client, Request, StatusInfo};

/// A connection to tessd that deletes the cells it created when dropped, even on error.
pub struct Session {
    pub client: Client,
    created: Vec<String>,
}

impl Session {
    /// Connects, with a clear message if tessd is not running.
    pub fn connect() -> anyhow::Result<Session> {
        let client = Client::connect_default().map_err(|e| {
            anyhow::anyhow!(
                "{e}\nthe benchmarks run against a live tessd: start it first (sudo tessd &)"
            )
        })?;
        Ok(Session {
            client,
            created: Vec::new(),
        })
    }

    /// Daemon status.
    pub fn status(&mut self) -> anyhow::Result<StatusInfo> {
        match self.client.call(&Request::Status)? {
            Body::Status(s) => Ok(*s),
            other => anyhow::bail!("unexpected reply {other:?}"),
        }
    }

    /// Creates or updates cells in one transaction; they are deleted when the session ends.
    pub fn apply(&mut self, cells: Vec<CellSpec>) -> anyhow::Result<tess_proto::ApplyResult> {
        for c in &cells {
            if !self.created.contains(&c.name) {
                self.created.push(c.name.clone());
            }
        }
        match self.client.call(&Request::Apply {
            cells,
            delete: vec![],
            prune: false,
            dry_run: false,
        })? {
            Body::Applied(r) => Ok(r),
            other => anyhow::bail!("unexpected reply {other:?}"),
        }
    }

    /// Deletes cells now.
    pub fn delete(&mut self, names: &[&str]) -> anyhow::Result<()> {
        for n in names {
            let _ = self.client.call(&Request::DeleteCell {
                name: n.to_string(),
            });
            self.created.retain(|c| c != n);
        }
        Ok(())
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        for n in std::mem::take(&mut self.created) {
            let _ = self.client.call(&Request::DeleteCell { name: n });
        }
    }
}

/// The hart to measure on: the one asked for, or the highest managed hart.
pub fn pick_hart(asked: Option<usize>, status: &StatusInfo) -> anyhow::Result<usize> {
    match asked {
        Some(h) if status.managed.contains(h) => Ok(h),
        Some(h) => anyhow::bail!(
            "hart {h} is not managed by tessd (managed: {})",
            status.managed
        ),
        None => status
            .managed
            .iter()
            .last()
            .ok_or_else(|| anyhow::anyhow!("tessd manages no harts")),
    }
}

/// The `tess` executable (this one).
pub fn tess_exe() -> String {
    std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "tess".into())
}

/// Starts `tess work ARGS...`, inside `cell` when given (through `tess run`, as a user would).
pub fn spawn_work(cell: Option<&str>, args: &[String]) -> anyhow::Result<Child> {
    let exe = tess_exe();
    let mut cmd = Command::new(&exe);
    if let Some(cell) = cell {
        cmd.args(["run", "--cell", cell, "--", &exe]);
    }
    cmd.arg("work")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    Ok(cmd.spawn()?)
}

/// Waits for a workload and parses the JSON it printed.
pub fn collect<T: serde::de::DeserializeOwned>(child: Child, what: &str) -> anyhow::Result<T> {
    let out = child.wait_with_output()?;
    if !out.status.success() {
        anyhow::bail!("{what} failed ({})", out.status);
    }
    serde_json::from_slice(&out.stdout)
        .map_err(|e| anyhow::anyhow!("{what} printed something unexpected: {e}"))
}

/// Kills a child and reaps it.
pub fn stop(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Formats microseconds.
pub fn us(x: f64) -> String {
    if x >= 1000.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.1}")
    }
}
