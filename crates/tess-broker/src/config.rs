//! The broker's configuration (`tess-broker --config FILE`, TOML): the decision period, the
//! controller's pole, and per cell its floor and ceiling.
//!
//! ```toml
//! period = "1s"          # decision period (default 1s)
//! pole = 0.5             # POTA pole p in (0, 1) (default 0.5)
//! min-step = 0.01        # hysteresis, harts (default 0.01)
//!
//! [cells.enc]
//! floor = 0.05           # harts (default 0.05)
//! ceiling = 1.0          # harts (default: 95% of the cell's harts)
//! lower-pole = 0.8       # pole when giving CPU back (default: max(0.8, pole))
//! lower-step = 0.05      # a lowering under this fraction of the share waits (default 0.05)
//! margin = 0.05          # setpoint headroom above the target, fraction (default 0.05)
//! noise-z = 2.0          # headroom per unit of measured relative noise (default 2)
//! max-margin = 0.5       # largest headroom (default 0.5)
//! slope = 1.0            # PACORA: penalty per second over the deadline (default 1)
//! ```
//!
//! `policy = "pacora"` (default `"pota"`) makes the broker allocate all brokered cells together
//! with PACORA ([`crate::pacora::policy`]) instead of one POTA controller per cell:
//!
//! ```toml
//! policy = "pacora"
//! [pacora]
//! capacity = 1.5         # harts the brokered cells share (default: what they held on joining)
//! margin = 0.1           # each cell is sized for target x (1 + margin) (default 0.1)
//! explore = 0.2          # a learning cell's smallest move, fraction of its share (default 0.2)
//! keep = 12              # samples per cell for the fit (default 12)
//! decide = "events"      # solve again on events only, or every "period" (default "events")
//! ```
//!
//! With PACORA, network bandwidth is a second resource: a heartbeat named `NAME.net` measures
//! the cell's network flow, and the broker divides the network service's link among the flows
//! that beat one (each gets its share as the reservation and the limit of its flow, in Mbit/s).
//! A heartbeat named `NAME@LABEL.net` measures the cell's labelled flow `LABEL` (its sockets
//! opened with that flow label, `tess_net_client::Net::flow`): a cell with several streams
//! beats one per stream, and each stream gets a share of its own.
//!
//! ```toml
//! [network]
//! service = "net"        # the network service's name at tessd's nameserver (default "net")
//! capacity = 20.0        # Mbit/s of the link the brokered flows share (required)
//! margin = 0.25          # flows are sized for target x (1 + margin) (default: [pacora] margin)
//!
//! [cells."video.net"]    # limits of cell video's flow, Mbit/s (default floor 0.05, ceiling: capacity)
//! floor = 0.1            # (and of each of its labelled flows that has no section of its own)
//! initial = 2.0          # its share until the first decision (default: the floor)
//! slope = 10
//!
//! [cells."video/s3.net"] # limits of cell video's flow labelled s3
//! floor = 0.2
//! ```
//!
//! A cell whose units of work need its own flow as well as its CPU (it fetches, then
//! computes) is marked `network = true`: its CPU heartbeat then measures both, and PACORA fits
//! one model over its harts and its flow's Mbit/s and allocates them together (the flow's
//! limits from `[cells."CELL.net"]`; the flow needs no heartbeat of its own).
//!
//! ```toml
//! [cells.fetch]
//! network = true
//! ```

use crate::pacora::policy::{DecideOn, PacoraConfig, Pool};
use crate::pota::PotaConfig;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// Per-cell limits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct CellLimits {
    /// Smallest share, harts.
    pub floor: Option<f64>,
    /// Largest share, harts.
    pub ceiling: Option<f64>,
    /// Pole for this cell (raising the share).
    pub pole: Option<f64>,
    /// Pole for lowering the share (default: 0.8, or the pole if that is larger).
    pub lower_pole: Option<f64>,
    /// A lowering smaller than this fraction of the share is not applied (default 0.05).
    pub lower_step: Option<f64>,
    /// Headroom always kept above the target, fraction of it (default 0.05).
    pub margin: Option<f64>,
    /// Headroom per unit of measured relative noise (default 2).
    pub noise_z: Option<f64>,
    /// Largest headroom, fraction of the target (default 0.5).
    pub max_margin: Option<f64>,
    /// PACORA: penalty per second of response time over the deadline (default 1).
    pub slope: Option<f64>,
    /// A flow's share when its heartbeat registers (`[cells."CELL.net"]`, Mbit/s; default:
    /// its floor).
    pub initial: Option<f64>,
    /// PACORA with `[network]`: the cell's CPU heartbeat measures units of work that need its
    /// own flow too (`[cells.CELL]`; default false). Its CPU share and its flow's Mbit/s are
    /// then modelled and allocated together, the flow's limits taken from
    /// `[cells."CELL.net"]`.
    pub network: Option<bool>,
}

/// Which policy allocates the brokered cells.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// One POTA controller per cell (seed 004 section 5.2).
    #[default]
    Pota,
    /// All cells together by PACORA (section 5.3).
    Pacora,
}

/// `[pacora]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawPacora {
    capacity: Option<f64>,
    margin: Option<f64>,
    explore: Option<f64>,
    keep: Option<usize>,
    decide: Option<String>,
}

/// `[network]`: the link the brokered flows share.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct NetworkConfig {
    /// The network service's name at tessd's nameserver.
    #[serde(default = "default_net_service")]
    pub service: String,
    /// Mbit/s of its link the brokered flows share.
    pub capacity: f64,
    /// Each flow is sized for its target x (1 + margin) (default: `[pacora] margin`).
    #[serde(default)]
    pub margin: Option<f64>,
}

fn default_net_service() -> String {
    "net".into()
}

/// The whole configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Decision period.
    pub period: Duration,
    /// Default pole.
    pub pole: f64,
    /// Hysteresis, harts.
    pub min_step: f64,
    /// Per cell.
    pub cells: BTreeMap<String, CellLimits>,
    /// The policy.
    pub policy: Policy,
    /// PACORA's settings.
    pub pacora: PacoraConfig,
    /// The network as a second resource (policy `pacora`), if configured.
    pub network: Option<NetworkConfig>,
}

/// The file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawConfig {
    period: Option<String>,
    #[serde(default = "default_pole")]
    pole: f64,
    #[serde(default = "default_step")]
    min_step: f64,
    #[serde(default)]
    cells: BTreeMap<String, CellLimits>,
    #[serde(default)]
    policy: Policy,
    pacora: Option<RawPacora>,
    network: Option<NetworkConfig>,
}

fn default_period() -> Duration {
    Duration::from_secs(1)
}
fn default_pole() -> f64 {
    0.5
}
fn default_step() -> f64 {
    0.01
}

impl Default for Config {
    fn default() -> Self {
        Config {
            period: default_period(),
            pole: default_pole(),
            min_step: default_step(),
            cells: BTreeMap::new(),
            policy: Policy::default(),
            pacora: PacoraConfig::default(),
            network: None,
        }
    }
}

impl Config {
    /// Parses and checks a configuration.
    pub fn parse(text: &str) -> anyhow::Result<Config> {
        let raw: RawConfig = toml::from_str(text)?;
        let period = match &raw.period {
            Some(p) => {
                tess_core::units::parse_duration(p).map_err(|e| anyhow::anyhow!("period: {e}"))?
            }
            None => default_period(),
        };
        let rp = raw.pacora.unwrap_or_default();
        let d = PacoraConfig::default();
        let pacora = PacoraConfig {
            capacity: rp.capacity,
            margin: rp.margin.unwrap_or(d.margin),
            explore: rp.explore.unwrap_or(d.explore),
            keep: rp.keep.unwrap_or(d.keep),
            decide: match rp.decide.as_deref() {
                Some(s) => DecideOn::parse(s).map_err(|e| anyhow::anyhow!(e))?,
                None => d.decide,
            },
        };
        pacora.validate().map_err(|e| anyhow::anyhow!(e))?;
        let c = Config {
            period,
            pole: raw.pole,
            min_step: raw.min_step,
            cells: raw.cells,
            policy: raw.policy,
            pacora,
            network: raw.network,
        };
        if let Some(n) = &c.network {
            if !(n.capacity.is_finite() && n.capacity > 0.0) {
                anyhow::bail!(
                    "network capacity {} must be a positive number of Mbit/s",
                    n.capacity
                );
            }
            if let Some(m) = n.margin {
                if !(0.0..=1.0).contains(&m) {
                    anyhow::bail!("network margin {m} must lie in [0, 1]");
                }
            }
            if c.policy != Policy::Pacora {
                anyhow::bail!("[network] is allocated by policy = \"pacora\" only");
            }
        }
        if c.period < Duration::from_millis(100) {
            anyhow::bail!("period {:?} is shorter than 100ms", c.period);
        }
        for (name, l) in &c.cells {
            if let Some(s) = l.slope {
                if !(s.is_finite() && s >= 0.0) {
                    anyhow::bail!("cell {name}: slope {s} must be a number >= 0");
                }
            }
            if let Some(i) = l.initial {
                if !(i.is_finite() && i >= 0.0) {
                    anyhow::bail!("cell {name}: initial {i} must be a number >= 0");
                }
            }
            if l.network == Some(true) && c.network.is_none() {
                anyhow::bail!(
                    "cell {name}: network = true needs a [network] section (and policy = \"pacora\")"
                );
            }
            let least = crate::pacora::policy::joint_keep(2);
            if l.network == Some(true) && c.pacora.keep < least {
                anyhow::bail!(
                    "cell {name}: network = true needs [pacora] keep of at least {least} (its model over two pools is fitted from {} samples or more, with room to drop an outlier)",
                    crate::pacora::policy::joint_samples(2)
                );
            }
            if l.network.is_some() && name.ends_with(crate::service::NET_SUFFIX) {
                anyhow::bail!("cell {name}: network = true belongs in the cell's own section");
            }
            if let (Some(f), Some(ce)) = (l.floor, l.ceiling) {
                if f > ce {
                    anyhow::bail!("cell {name}: floor {f} is above the ceiling {ce}");
                }
            }
            c.controller(name, 1)
                .validate()
                .map_err(|e| anyhow::anyhow!("cell {name}: {e}"))?;
        }
        c.controller("", 1)
            .validate()
            .map_err(|e| anyhow::anyhow!(e))?;
        Ok(c)
    }

    /// PACORA's pools: the harts ([`crate::service::CPU_POOL`]) and, with `[network]`, the
    /// link in Mbit/s ([`crate::service::NET_POOL`]).
    pub fn pools(&self) -> Vec<Pool> {
        let cpu = Pool {
            capacity: self.pacora.capacity,
            margin: self.pacora.margin,
        };
        let net = self.network.as_ref().map(|n| Pool {
            capacity: Some(n.capacity),
            margin: n.margin.unwrap_or(self.pacora.margin),
        });
        std::iter::once(cpu).chain(net).collect()
    }

    /// Whether cell `cell`'s CPU heartbeat measures units that need its flow too (`network =
    /// true`).
    pub fn joint(&self, cell: &str) -> bool {
        self.cells
            .get(cell)
            .and_then(|l| l.network)
            .unwrap_or(false)
    }

    /// The share flow `flow` (`CELL`, or `CELL/LABEL` for a labelled flow) starts with, Mbit/s.
    pub fn flow_initial(&self, flow: &str) -> f64 {
        let (floor, ceiling) = self.flow_limits(flow);
        self.flow_section(flow)
            .and_then(|l| l.initial)
            .map_or(floor, |i| i.clamp(floor, ceiling))
    }

    /// Floor and ceiling of flow `flow` (`[cells."CELL.net"]`, `[cells."CELL/LABEL.net"]`),
    /// Mbit/s.
    pub fn flow_limits(&self, flow: &str) -> (f64, f64) {
        let cap = self.network.as_ref().map_or(f64::INFINITY, |n| n.capacity);
        let l = self.flow_section(flow).copied().unwrap_or_default();
        let ceiling = l.ceiling.unwrap_or(cap).min(cap);
        (l.floor.unwrap_or(0.05).min(ceiling), ceiling)
    }

    /// PACORA's penalty slope for flow `flow`.
    pub fn flow_slope(&self, flow: &str) -> f64 {
        self.flow_section(flow).and_then(|l| l.slope).unwrap_or(1.0)
    }

    /// The section of flow `flow`: `[cells."CELL/LABEL.net"]` for a labelled flow if there is
    /// one, else its cell's `[cells."CELL.net"]` (the limits of each of the cell's flows).
    fn flow_section(&self, flow: &str) -> Option<&CellLimits> {
        let net = crate::service::NET_SUFFIX;
        self.cells.get(&format!("{flow}{net}")).or_else(|| {
            let (cell, _label) = flow.split_once('/')?;
            self.cells.get(&format!("{cell}{net}"))
        })
    }

    /// PACORA's penalty slope for `cell`.
    pub fn slope(&self, cell: &str) -> f64 {
        self.cells.get(cell).and_then(|l| l.slope).unwrap_or(1.0)
    }

    /// The controller settings for `cell` with `harts` harts.
    pub fn controller(&self, cell: &str, harts: usize) -> PotaConfig {
        self.controller_with(cell, harts, &tess_core::spec::BrokerLimits::default())
    }

    /// [`Config::controller`] for a cell whose manifest gives `declared` limits: a floor or
    /// ceiling in the broker's own file wins, the manifest's comes next, then the default.
    pub fn controller_with(
        &self,
        cell: &str,
        harts: usize,
        declared: &tess_core::spec::BrokerLimits,
    ) -> PotaConfig {
        let mut l = self.cells.get(cell).copied().unwrap_or_default();
        l.floor = l.floor.or(declared.floor.map(|h| h.get()));
        l.ceiling = l.ceiling.or(declared.ceiling.map(|h| h.get()));
        let ceiling = l
            .ceiling
            .unwrap_or(harts.max(1) as f64 * crate::share::MAX_FRACTION);
        let d = PotaConfig::default();
        let pole = l.pole.unwrap_or(self.pole);
        PotaConfig {
            pole,
            lower_pole: l.lower_pole.unwrap_or(d.lower_pole.max(pole)),
            floor: l.floor.unwrap_or(0.05).min(ceiling),
            ceiling,
            min_step: self.min_step,
            lower_step: l.lower_step.unwrap_or(d.lower_step),
            forgetting: 0.9,
            margin: l.margin.unwrap_or(d.margin),
            noise_z: l.noise_z.unwrap_or(d.noise_z),
            max_margin: l
                .max_margin
                .unwrap_or(d.max_margin.max(l.margin.unwrap_or(0.0))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_parses_with_defaults_and_refuses_nonsense() {
        let c = Config::parse("[cells.enc]\nfloor = 0.1\nceiling = 0.8\n").unwrap();
        assert_eq!(c.period, Duration::from_secs(1));
        let p = c.controller("enc", 2);
        assert_eq!((p.floor, p.ceiling, p.pole), (0.1, 0.8, 0.5));
        let p = c.controller("other", 2);
        assert_eq!((p.floor, p.ceiling), (0.05, 1.9));
        assert!(Config::parse("pole = 1.5").is_err());
        assert!(Config::parse("period = \"10ms\"").is_err());
        assert!(Config::parse("[cells.x]\nfloor = 2.0\nceiling = 1.0").is_err());
        assert!(Config::parse("bogus = 1").is_err());
        let c =
            Config::parse("pole = 0.9\n[cells.enc]\nmargin = 0.2\nlower-pole = 0.95\n").unwrap();
        let p = c.controller("enc", 2);
        assert_eq!((p.margin, p.lower_pole, p.max_margin), (0.2, 0.95, 0.5));
        // The default lower pole is never faster than the pole.
        assert_eq!(c.controller("other", 2).lower_pole, 0.9);
        assert!(Config::parse("[cells.enc]\nlower-pole = 0.1\n").is_err());
        assert!(Config::parse("[cells.enc]\nmargin = -1\n").is_err());
        assert_eq!(c.policy, Policy::Pota);
    }

    #[test]
    fn a_pacora_config_parses_and_refuses_nonsense() {
        let c = Config::parse(
            "policy = \"pacora\"\n[pacora]\ncapacity = 1.5\nmargin = 0.2\n[cells.enc]\nslope = 3\n",
        )
        .unwrap();
        assert_eq!(c.policy, Policy::Pacora);
        assert_eq!((c.pacora.capacity, c.pacora.margin), (Some(1.5), 0.2));
        assert_eq!((c.slope("enc"), c.slope("other")), (3.0, 1.0));
        assert!(Config::parse("policy = \"magic\"").is_err());
        assert!(Config::parse("[pacora]\ncapacity = 0").is_err());
        assert!(Config::parse("[pacora]\nbogus = 1").is_err());
        assert_eq!(c.pacora.decide, DecideOn::Events, "the default");
        let every = Config::parse("policy = \"pacora\"\n[pacora]\ndecide = \"period\"\n").unwrap();
        assert_eq!(every.pacora.decide, DecideOn::Period);
        let e = Config::parse("[pacora]\ndecide = \"often\"").unwrap_err();
        assert!(
            format!("{e:#}").contains("\"events\" or \"period\""),
            "{e:#}"
        );
        assert!(Config::parse("[cells.enc]\nslope = -1").is_err());
    }

    #[test]
    fn a_network_pool_needs_pacora_and_a_capacity() {
        let c = Config::parse(
            "policy = \"pacora\"\n[network]\nservice = \"conf-net\"\ncapacity = 20\n[cells.\"video.net\"]\nfloor = 0.5\nslope = 10\n[cells.\"video/s3.net\"]\nfloor = 0.2\n",
        )
        .unwrap();
        let n = c.network.as_ref().unwrap();
        assert_eq!((n.service.as_str(), n.capacity), ("conf-net", 20.0));
        assert_eq!(c.flow_limits("video"), (0.5, 20.0));
        assert_eq!(c.flow_limits("hog"), (0.05, 20.0));
        assert_eq!(c.flow_slope("video"), 10.0);
        // A labelled flow has its own section, or takes its cell's.
        assert_eq!(c.flow_limits("video/s3"), (0.2, 20.0));
        assert_eq!(c.flow_slope("video/s3"), 1.0);
        assert_eq!(c.flow_limits("video/s4"), (0.5, 20.0));
        assert_eq!(c.flow_slope("video/s4"), 10.0);
        assert_eq!(c.flow_limits("hog/s4"), (0.05, 20.0));
        assert_eq!(c.pools()[1].capacity, Some(20.0));
        assert!(!c.joint("video"));
        let j = Config::parse(
            "policy = \"pacora\"\n[network]\ncapacity = 20\n[cells.fetch]\nnetwork = true\n",
        )
        .unwrap();
        assert!(j.joint("fetch") && !j.joint("other"));
        let e = Config::parse(
            "policy = \"pacora\"\n[pacora]\nkeep = 4\n[network]\ncapacity = 20\n[cells.fetch]\nnetwork = true\n",
        )
        .unwrap_err();
        assert!(format!("{e:#}").contains("keep of at least 8"), "{e:#}");
        let e = Config::parse("policy = \"pacora\"\n[cells.fetch]\nnetwork = true\n").unwrap_err();
        assert!(
            format!("{e:#}").contains("needs a [network] section"),
            "{e:#}"
        );
        assert!(Config::parse(
            "policy = \"pacora\"\n[network]\ncapacity = 20\n[cells.\"fetch.net\"]\nnetwork = true\n"
        )
        .is_err());
        assert!(Config::parse("policy = \"pacora\"\n[network]\ncapacity = 0\n").is_err());
        assert!(Config::parse("policy = \"pacora\"\n[network]\nservice = \"x\"\n").is_err());
        assert!(Config::parse("[network]\ncapacity = 10\n").is_err());
        assert!(Config::parse("[cells.\"v.net\"]\ninitial = -1\n").is_err());
    }

    #[test]
    fn a_manifests_limits_apply_unless_the_file_sets_its_own() {
        use tess_core::spec::{BrokerLimits, Harts};
        let declared = BrokerLimits {
            floor: Harts::new(0.2),
            ceiling: Harts::new(0.6),
        };
        let c = Config::parse("[cells.enc]\nceiling = 0.8\n").unwrap();
        let p = c.controller_with("enc", 2, &declared);
        assert_eq!((p.floor, p.ceiling), (0.2, 0.8));
        let p = c.controller_with("other", 2, &declared);
        assert_eq!((p.floor, p.ceiling), (0.2, 0.6));
        let p = c.controller_with("other", 2, &BrokerLimits::default());
        assert_eq!((p.floor, p.ceiling), (0.05, 1.9));
    }
}
