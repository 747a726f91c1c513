//! Plumbing shared by the benchmarks: talking to tessd, running workloads in cells, cleaning up.

use std::process::{Child, Command, Stdio};
use tess_core::spec::{CellSpec, HartRequest, Policy};
use tess_proto::StatusInfo;
use tess_sched::HartSet;

/// A connection to tessd that deletes the cells it created when dropped, even on error.
pub use tess_proto::CellSession as Session;

/// A bench cell on one hart: `policy`, no memory or pid limits, not pinned, the default idle.
pub fn cell_on_hart(name: &str, policy: Policy, hart: usize) -> CellSpec {
    CellSpec {
        name: name.into(),
        policy,
        harts: HartRequest::Ids(HartSet::single(hart)),
        memory_max: None,
        pids_max: None,
        pinned: false,
        idle: None,
        broker: Default::default(),
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

/// A program built next to this executable (`target/<profile>/NAME`), else NAME on the `PATH`.
pub fn sibling_exe(name: &str) -> std::path::PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join(name)))
        .filter(|p| p.exists())
        .unwrap_or_else(|| std::path::PathBuf::from(name))
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

/// A bench's cache of generated inputs: `explicit`, or `$XDG_CACHE_HOME/tess/NAME`, else
/// `~/.cache/tess/NAME` (never in git).
pub fn cache_dir(name: &str, explicit: Option<&std::path::Path>) -> std::path::PathBuf {
    use std::path::PathBuf;
    if let Some(c) = explicit {
        return c.to_path_buf();
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("tess").join(name)
}
