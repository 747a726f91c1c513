//! Daemon configuration: `/etc/tess/tessd.toml` (optional), overridden by command-line flags.
//!
//! ```toml
//! socket = "/run/tess/tessd.sock"
//! state-dir = "/var/lib/tess"
//! cgroup = "auto"           # auto | v1 | v2
//! cgroup-root = ""          # v2 mount point override (default: detected)
//! group = "tess"            # name of tess's cgroup subtree
//! harts = "0-63"            # harts tess manages (default: all online)
//! headroom = 0.05           # fraction of every hart left to the system
//! system-harts = 1          # harts that must stay shared (never dedicated)
//! raise-kernel-limit = true # raise sched_rt_runtime_us so SCHED_DEADLINE can use 1 - headroom
//! steer-irqs = true         # move IRQs off dedicated harts
//! group-servers = false     # experimental (cgroup v1): one RT group budget per event-triggered
//!                           # cell instead of splitting it between threads; off by default, as
//!                           # the kernel refills a group's budget only in the scheduling domain
//!                           # its timer fires in, and a group can freeze (docs/architecture.md)
//! sweep-interval-ms = 500   # how often stray tasks are moved out of the cgroup root (v1)
//! follow-interval-ms = 20   # how often a reserved cell's budget is re-divided between the
//!                           # threads that work (0: split evenly between all its threads)
//! budget-tick-us = 200     # where HRTICK_DL is off: a deadline tick per reserved hart ends
//!                           # budgets within this period (0: off; docs/tessd.md)
//! metrics-listen = "127.0.0.1:9464"  # serve Prometheus metrics here (default: off;
//!                           # docs/observability.md)
//!
//! [quota.default]           # every non-root user without a quota of their own
//! max-cells = 2
//! max-harts = 2
//! max-reserved = 0.5
//!
//! [quota.users.1000]
//! max-cells = 4
//! max-dedicated-harts = 1
//! max-reserved = 1.0
//! max-memory = 2147483648
//! allow-pinned = true
//! ```

use anyhow::{Context, Result};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tess_core::quota::Quota;
use tess_sched::HartSet;

/// Default config file.
pub const DEFAULT_CONFIG: &str = "/etc/tess/tessd.toml";
/// Default state directory.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/tess";

/// Which cgroup hierarchy to drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum CgroupChoice {
    /// Detect: v1 if it has cpuset and cpu, else v2.
    Auto,
    /// Legacy hierarchies.
    V1,
    /// Unified hierarchy.
    V2,
}

/// The effective configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// API socket.
    pub socket: PathBuf,
    /// State directory (database, lock).
    pub state_dir: PathBuf,
    /// Hierarchy choice.
    pub cgroup: CgroupChoice,
    /// Override of the v2 mount point.
    pub cgroup_root: Option<PathBuf>,
    /// Name of tess's cgroup subtree.
    pub group: String,
    /// Managed harts (`None` = all online).
    pub harts: Option<HartSet>,
    /// Fraction of each hart left to the system.
    pub headroom: f64,
    /// Harts that must stay shared.
    pub system_harts: usize,
    /// Raise the kernel's RT/DL limit to `1 - headroom` plus the fair server.
    pub raise_kernel_limit: bool,
    /// Steer IRQs off dedicated harts.
    pub steer_irqs: bool,
    /// Serve event-triggered cells by RT group bandwidth (experimental, cgroup v1).
    pub group_servers: bool,
    /// Sweep interval.
    pub sweep_interval_ms: u64,
    /// How often the budget of a reserved cell is re-divided between its working threads
    /// (`threads::demand`); 0 turns it off (even split).
    pub follow_interval_ms: u64,
    /// Period of the budget ticks (`budget_tick`) where the kernel cannot end budgets exactly;
    /// 0 turns them off.
    pub budget_tick_us: u64,
    /// Where to serve Prometheus metrics (`None`: nowhere).
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Default quota for non-root users.
    pub default_quota: Quota,
    /// Per-user quotas from the file (those set with `tess quota set` take precedence).
    pub user_quotas: BTreeMap<u32, Quota>,
    /// Root of /proc (tests point it elsewhere).
    pub proc_root: PathBuf,
    /// Root of /sys (tests point it elsewhere).
    pub sys_root: PathBuf,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            socket: PathBuf::from(tess_proto::DEFAULT_SOCKET),
            state_dir: PathBuf::from(DEFAULT_STATE_DIR),
            cgroup: CgroupChoice::Auto,
            cgroup_root: None,
            group: "tess".into(),
            harts: None,
            headroom: 0.05,
            system_harts: 1,
            raise_kernel_limit: true,
            steer_irqs: true,
            group_servers: false,
            sweep_interval_ms: 500,
            follow_interval_ms: 20,
            budget_tick_us: crate::budget_tick::DEFAULT_TICK.as_micros() as u64,
            metrics_listen: None,
            default_quota: Quota::default(),
            user_quotas: BTreeMap::new(),
            proc_root: PathBuf::from("/proc"),
            sys_root: PathBuf::from("/sys"),
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawConfig {
    socket: Option<PathBuf>,
    state_dir: Option<PathBuf>,
    cgroup: Option<CgroupChoice>,
    cgroup_root: Option<PathBuf>,
    group: Option<String>,
    harts: Option<String>,
    headroom: Option<f64>,
    system_harts: Option<usize>,
    raise_kernel_limit: Option<bool>,
    steer_irqs: Option<bool>,
    group_servers: Option<bool>,
    sweep_interval_ms: Option<u64>,
    follow_interval_ms: Option<u64>,
    budget_tick_us: Option<u64>,
    metrics_listen: Option<String>,
    quota: Option<RawQuotas>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawQuotas {
    default: Option<RawQuota>,
    #[serde(default)]
    users: BTreeMap<String, RawQuota>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawQuota {
    #[serde(default)]
    max_cells: u32,
    #[serde(default)]
    max_harts: u32,
    #[serde(default)]
    max_dedicated_harts: u32,
    #[serde(default)]
    max_reserved: f64,
    max_memory: Option<u64>,
    #[serde(default)]
    allow_pinned: bool,
}

impl From<RawQuota> for Quota {
    fn from(r: RawQuota) -> Quota {
        Quota {
            max_cells: r.max_cells,
            max_harts: r.max_harts,
            max_dedicated_harts: r.max_dedicated_harts,
            max_reserved: r.max_reserved,
            max_memory: r.max_memory,
            allow_pinned: r.allow_pinned,
        }
    }
}

impl Config {
    /// Reads `path` if it exists (a missing default file is fine; a missing explicit one is not).
    pub fn load(path: &Path, explicit: bool) -> Result<Config> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => {
                return Ok(Config::default())
            }
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        Config::parse(&text).with_context(|| format!("in {}", path.display()))
    }

    /// Parses config text.
    pub fn parse(text: &str) -> Result<Config> {
        let raw: RawConfig = toml::from_str(text)?;
        let mut c = Config::default();
        if let Some(v) = raw.socket {
            c.socket = v;
        }
        if let Some(v) = raw.state_dir {
            c.state_dir = v;
        }
        if let Some(v) = raw.cgroup {
            c.cgroup = v;
        }
        c.cgroup_root = raw.cgroup_root.filter(|p| !p.as_os_str().is_empty());
        if let Some(v) = raw.group {
            c.group = v;
        }
        if let Some(h) = raw.harts {
            c.harts = Some(h.parse().map_err(|e| anyhow::anyhow!("harts: {e}"))?);
        }
        if let Some(v) = raw.headroom {
            anyhow::ensure!((0.0..0.5).contains(&v), "headroom {v} must be in [0, 0.5)");
            c.headroom = v;
        }
        if let Some(v) = raw.system_harts {
            c.system_harts = v;
        }
        if let Some(v) = raw.raise_kernel_limit {
            c.raise_kernel_limit = v;
        }
        if let Some(v) = raw.group_servers {
            c.group_servers = v;
        }
        if let Some(v) = raw.steer_irqs {
            c.steer_irqs = v;
        }
        if let Some(v) = raw.sweep_interval_ms {
            c.sweep_interval_ms = v.max(10);
        }
        if let Some(v) = raw.follow_interval_ms {
            anyhow::ensure!(
                v == 0 || v >= 5,
                "follow-interval-ms {v}: use 0 (off) or at least 5 ms"
            );
            c.follow_interval_ms = v;
        }
        if let Some(v) = raw.budget_tick_us {
            let min = crate::budget_tick::MIN_TICK.as_micros() as u64;
            anyhow::ensure!(
                v == 0 || (min..=100_000).contains(&v),
                "budget-tick-us {v}: use 0 (off) or {min} to 100000 (the kernel's shortest deadline period is {min} us)"
            );
            c.budget_tick_us = v;
        }
        if let Some(v) = raw.metrics_listen.filter(|v| !v.is_empty()) {
            c.metrics_listen = Some(v.parse().map_err(|e| {
                anyhow::anyhow!("metrics-listen {v:?} is not an address like 127.0.0.1:9464: {e}")
            })?);
        }
        if let Some(q) = raw.quota {
            if let Some(d) = q.default {
                c.default_quota = d.into();
            }
            for (uid, rq) in q.users {
                let uid: u32 = uid.parse().map_err(|_| {
                    anyhow::anyhow!("quota.users.{uid}: the key must be a numeric uid")
                })?;
                c.user_quotas.insert(uid, rq.into());
            }
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_example() {
        let text = r#"
socket = "/tmp/t.sock"
harts = "0-3"
headroom = 0.1
[quota.default]
max-cells = 2
max-reserved = 0.5
[quota.users.1000]
max-cells = 4
allow-pinned = true
"#;
        let c = Config::parse(text).unwrap();
        assert_eq!(c.socket, PathBuf::from("/tmp/t.sock"));
        assert_eq!(c.harts.unwrap().to_string(), "0-3");
        assert_eq!(c.default_quota.max_cells, 2);
        assert!(c.user_quotas[&1000].allow_pinned);
    }

    #[test]
    fn rejects_bad_values() {
        assert!(Config::parse("headroom = 0.9").is_err());
        assert!(Config::parse("colour = 1").is_err());
        assert!(Config::parse("[quota.users.bob]\nmax-cells = 1").is_err());
        assert!(Config::parse("harts = \"3-1\"").is_err());
        assert!(Config::parse("metrics-listen = \"localhost\"").is_err());
    }

    #[test]
    fn metrics_listen_is_an_address() {
        let c = Config::parse("metrics-listen = \"127.0.0.1:9464\"").unwrap();
        assert_eq!(c.metrics_listen.unwrap().port(), 9464);
        assert!(Config::parse("").unwrap().metrics_listen.is_none());
    }
}
