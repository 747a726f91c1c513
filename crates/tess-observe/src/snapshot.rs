//! One look at the machine: what tessd granted each cell and hart (`status`, `list-cells`) next
//! to what the kernel counted (see [`crate::kernel`]).
//!
//! A snapshot holds counters (CPU seconds, switches, throttled periods) as the kernel reports
//! them; rates come from two snapshots ([`crate::rates`]). Taking one costs two API calls and a
//! few small file reads per thread, and nothing on the real-time path: the kernel keeps these
//! counters anyway.

use crate::kernel::{self, Mounts};
use serde::{Deserialize, Serialize};
use std::path::Path;
use tess_core::spec::Policy;
use tess_proto::{Body, CellInfo, Client, Request, StatusInfo};

/// One hart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HartSample {
    /// Hart number.
    pub hart: usize,
    /// Fraction of the hart admission has promised to cells (1.0 when dedicated).
    pub granted: f64,
    /// Fraction admission could still promise (utilization limit minus granted; 0 when
    /// dedicated or unmanaged).
    pub headroom: f64,
    /// Whether tess manages this hart.
    pub managed: bool,
    /// The cell owning it, when dedicated.
    pub dedicated_to: Option<String>,
    /// CPU seconds spent running anything since boot (counter).
    pub busy_s: f64,
    /// CPU seconds the hypervisor took (counter).
    pub steal_s: f64,
}

/// One cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellSample {
    /// Cell name.
    pub name: String,
    /// Policy name (`dedicated`, `time-triggered`, `event-triggered`, `best-effort`).
    pub policy: String,
    /// Harts it was given.
    pub harts: Vec<usize>,
    /// CPU guaranteed, in hart-equivalents (CPU seconds per second): dedicated 1 per hart,
    /// reservations budget/period per hart, best-effort 0.
    pub granted_harts: f64,
    /// CPU seconds its live threads have run (counter; it drops when a thread exits).
    pub cpu_used_s: f64,
    /// Seconds its live threads spent runnable but waiting for a CPU (counter).
    pub runqueue_wait_s: f64,
    /// Times its live threads were given a CPU (counter).
    pub timeslices: u64,
    /// Threads in the cell (tessd's idle spinners excluded).
    pub threads: usize,
    /// Processes in the cell.
    pub processes: usize,
    /// Involuntary switches of its threads (counter): preemptions and `SCHED_DEADLINE`
    /// throttling at budget exhaustion.
    pub involuntary_switches: u64,
    /// Periods in which its CFS bandwidth ran out (counter; `None` without a `cpu` group).
    pub throttled_periods: Option<u64>,
    /// Seconds its tasks waited for the next CFS period (counter).
    pub throttled_s: Option<f64>,
    /// Memory charged to it, bytes.
    pub memory_bytes: Option<u64>,
    /// Its memory limit, bytes.
    pub memory_limit_bytes: Option<u64>,
    /// Pinned (kept at its harts by resizes of others).
    pub pinned: bool,
    /// What its runtimes publish about themselves (see [`RuntimeSample`]).
    #[serde(default)]
    pub runtimes: Vec<RuntimeSample>,
}

/// What one runtime of a cell published (crate `tess-stats`): the synthesizer's answers, a
/// graph engine's blocks, Pulse's EDF jobs, the gang windows' entry lateness.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeSample {
    /// The runtime's name (`synth`, `pd`, `pulse-edf`, `gang-window`).
    pub name: String,
    /// The process that publishes it.
    pub pid: i32,
    /// Its deadline, ns (0: none, or one per event).
    pub deadline_ns: u64,
    /// Events handled (counter).
    pub events: u64,
    /// Events past their deadline (counter).
    pub misses: u64,
    /// Sum of response times, ns (counter).
    pub sum_ns: u64,
    /// Largest response time, ns.
    pub max_ns: u64,
    /// Bytes its events carried (a network service's packets; counter).
    #[serde(default)]
    pub bytes: u64,
    /// Response-time bucket counts (`tess_stats::BOUNDS_NS`, then the overflow; counters).
    pub buckets: Vec<u64>,
}

impl From<tess_stats::Published> for RuntimeSample {
    fn from(p: tess_stats::Published) -> Self {
        RuntimeSample {
            name: p.name,
            pid: p.pid,
            deadline_ns: p.deadline_ns,
            events: p.events,
            misses: p.misses,
            sum_ns: p.sum_ns,
            max_ns: p.max_ns,
            bytes: p.bytes,
            buckets: p.buckets,
        }
    }
}

/// The whole machine at one instant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// `CLOCK_MONOTONIC` when taken, seconds (for rates between snapshots).
    pub monotonic_s: f64,
    /// Wall-clock time when taken, ms since the epoch.
    pub unix_ms: u64,
    /// tessd's pid.
    pub daemon_pid: i32,
    /// Seconds tessd has been up.
    pub daemon_uptime_s: f64,
    /// The most admission promises on one hart (fraction).
    pub utilization_limit: f64,
    /// Harts.
    pub harts: Vec<HartSample>,
    /// Cells.
    pub cells: Vec<CellSample>,
    /// Problems tessd reports (other software's cgroups in the way).
    pub warnings: Vec<String>,
}

/// `CLOCK_MONOTONIC` in seconds.
pub fn monotonic_s() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the kernel to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// CPU a cell is guaranteed, in hart-equivalents.
pub fn granted_harts(policy: &Policy, harts: usize) -> f64 {
    match policy {
        Policy::BestEffort { .. } => 0.0,
        p => p.utilization() * harts as f64,
    }
}

/// Asks tessd for its status and every cell the caller may see.
pub fn query(client: &mut Client) -> anyhow::Result<(StatusInfo, Vec<CellInfo>)> {
    let Body::Status(status) = client.call(&Request::Status)? else {
        anyhow::bail!("tessd answered status with something else");
    };
    let Body::Cells { cells } = client.call(&Request::ListCells)? else {
        anyhow::bail!("tessd answered list-cells with something else");
    };
    Ok((*status, cells))
}

/// Takes snapshot after snapshot, keeping the kernel's files open in between (a scrape then
/// costs a read per file instead of an open, a read and a close: see [`kernel::Files`]).
#[derive(Debug)]
pub struct Sampler {
    mounts: Mounts,
    files: kernel::Files,
}

impl Sampler {
    /// A sampler for the cgroup hierarchies `mounts`.
    pub fn new(mounts: Mounts) -> Sampler {
        Sampler {
            mounts,
            files: kernel::Files::new(),
        }
    }

    /// Reads the kernel's counters and the runtimes' pages for what tessd reported.
    pub fn sample(&mut self, status: &StatusInfo, cells: &[CellInfo]) -> Snapshot {
        let s = sample_with(status, cells, &self.mounts, &mut self.files);
        self.files.end_scrape();
        s
    }

    /// Asks tessd (at `socket`) and samples.
    pub fn take(&mut self, socket: &Path) -> anyhow::Result<Snapshot> {
        let mut client = Client::connect(socket)?;
        let (status, cells) = query(&mut client)?;
        Ok(self.sample(&status, &cells))
    }
}

fn sample_with(
    status: &StatusInfo,
    cells: &[CellInfo],
    mounts: &Mounts,
    files: &mut kernel::Files,
) -> Snapshot {
    let times = kernel::hart_times();
    // One directory read for every cell's runtime pages.
    let pages = tess_stats::pages(&tess_stats::default_dir());
    let harts = status
        .harts
        .iter()
        .map(|hart| {
            let load = status.load.iter().find(|l| l.hart == hart);
            let managed = status.managed.contains(hart);
            let dedicated_to = load.and_then(|l| l.dedicated_to.clone());
            let granted = if dedicated_to.is_some() {
                1.0
            } else {
                load.map_or(0.0, |l| l.utilization)
            };
            let headroom = if managed && dedicated_to.is_none() {
                (status.utilization_limit - granted).max(0.0)
            } else {
                0.0
            };
            let t = times.iter().find(|t| t.hart == hart).copied();
            HartSample {
                hart,
                granted,
                headroom,
                managed,
                dedicated_to,
                busy_s: t.map_or(0.0, |t| t.busy_s),
                steal_s: t.map_or(0.0, |t| t.steal_s),
            }
        })
        .collect();
    Snapshot {
        monotonic_s: monotonic_s(),
        unix_ms: unix_ms(),
        daemon_pid: status.pid,
        daemon_uptime_s: status.uptime_s,
        utilization_limit: status.utilization_limit,
        harts,
        cells: cells
            .iter()
            .map(|c| sample_cell(c, mounts, files, &pages))
            .collect(),
        warnings: status.warnings.clone(),
    }
}

fn sample_cell(
    c: &CellInfo,
    mounts: &Mounts,
    files: &mut kernel::Files,
    pages: &[tess_stats::Page],
) -> CellSample {
    let cpuset = Path::new(&c.cgroup);
    let cpu_dir = mounts.sibling(cpuset, mounts.cpu.as_deref());
    let mem_dir = mounts.sibling(cpuset, mounts.memory.as_deref());
    let mut st = kernel::SchedStat::default();
    let mut switches = 0u64;
    for t in &c.threads {
        if let Some(s) = kernel::thread_schedstat(files, t.tid) {
            st.run_ns += s.run_ns;
            st.wait_ns += s.wait_ns;
            st.timeslices += s.timeslices;
        }
        switches += kernel::thread_involuntary_switches(files, t.tid).unwrap_or(0);
    }
    // Dedicated cells stay in the cpu root on v1 (see tess-cgroup's v1 layout): the root's
    // cpu.stat is the machine's, not the cell's.
    let throttling = (cpu_dir != cpuset || mounts.cpu.is_none())
        .then(|| kernel::throttling(files, &cpu_dir))
        .flatten();
    CellSample {
        name: c.name.clone(),
        policy: c.policy.name().to_string(),
        harts: c.harts.iter().collect(),
        granted_harts: granted_harts(&c.policy, c.harts.len()),
        cpu_used_s: st.run_ns as f64 / 1e9,
        runqueue_wait_s: st.wait_ns as f64 / 1e9,
        timeslices: st.timeslices,
        threads: c.threads.len(),
        processes: c.processes.len(),
        involuntary_switches: switches,
        throttled_periods: throttling.map(|t| t.periods),
        throttled_s: throttling.map(|t| t.seconds),
        memory_bytes: kernel::memory_bytes(files, &mem_dir),
        memory_limit_bytes: c.memory_max,
        pinned: c.pinned,
        runtimes: pages
            .iter()
            .filter(|p| c.processes.contains(&p.pid))
            .filter_map(tess_stats::read_checked)
            .map(RuntimeSample::from)
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn granted_follows_the_policy() {
        let ms = Duration::from_millis;
        assert_eq!(granted_harts(&Policy::Dedicated, 2), 2.0);
        let et = Policy::EventTriggered {
            period: ms(10),
            budget: ms(2),
        };
        assert!((granted_harts(&et, 2) - 0.4).abs() < 1e-12);
        assert_eq!(granted_harts(&Policy::BestEffort { weight: 100 }, 1), 0.0);
    }
}
