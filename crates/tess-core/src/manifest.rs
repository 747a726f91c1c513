//! The declarative manifest of `tess apply FILE.toml`.
//!
//! ```toml
//! delete = ["old-cell"]          # optional: removed in the same transaction
//!
//! [cells.synth]
//! policy = "dedicated"           # dedicated | time-triggered | event-triggered | best-effort
//! hart-ids = [1]                 # or "1,3", or `harts = 2` for the daemon to choose
//! memory = "512M"                # optional memory limit
//! pids = 256                     # optional task limit
//! pinned = true                  # optional: no policy may change this allocation
//! idle = "spin"                  # halt (default: idle harts sleep) or spin (fast wake-ups, burns the hart)
//!
//! [cells.video]
//! policy = "time-triggered"
//! period = "33ms"
//! active = "4ms"
//! offset = "0ms"                 # optional window start within the period
//! broker-floor = 0.05            # optional: the broker never gives it less than this (harts)
//! broker-ceiling = 0.5           # optional: nor more (tess-broker's own file overrides both)
//!
//! [cells.control]
//! policy = "event-triggered"
//! period = "10ms"
//! budget = "2ms"
//!
//! [cells.batch]
//! policy = "best-effort"
//! weight = 100                   # optional CFS weight
//! ```
//!
//! Applying a manifest is idempotent: cells already as described are left alone.

use crate::spec::{
    BrokerLimits, CellSpec, HartRequest, Harts, IdleMode, Policy, SpecError, DEFAULT_WEIGHT,
};
use crate::units::{parse_bytes, parse_duration};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;
use tess_sched::HartSet;

/// A parsed manifest.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Manifest {
    /// Cells to create or update, in name order.
    pub cells: Vec<CellSpec>,
    /// Cells to delete.
    pub delete: Vec<String>,
}

/// A manifest that cannot be used, with where and why.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// TOML syntax or shape.
    #[error("{0}")]
    Toml(String),
    /// A cell entry is wrong.
    #[error("cells.{cell}: {what}")]
    Cell {
        /// Cell name.
        cell: String,
        /// What is wrong.
        what: String,
    },
    /// A spec is inconsistent.
    #[error(transparent)]
    Spec(#[from] SpecError),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawManifest {
    #[serde(default)]
    cells: BTreeMap<String, RawCell>,
    #[serde(default)]
    delete: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawCell {
    policy: String,
    harts: Option<usize>,
    hart_ids: Option<HartIds>,
    period: Option<String>,
    active: Option<String>,
    offset: Option<String>,
    budget: Option<String>,
    weight: Option<u32>,
    memory: Option<String>,
    pids: Option<u64>,
    #[serde(default)]
    pinned: bool,
    idle: Option<IdleMode>,
    broker_floor: Option<Harts>,
    broker_ceiling: Option<Harts>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum HartIds {
    List(Vec<usize>),
    Text(String),
}

/// Parses manifest text.
pub fn parse(text: &str) -> Result<Manifest, ManifestError> {
    let raw: RawManifest = toml::from_str(text).map_err(|e| ManifestError::Toml(e.to_string()))?;
    let mut cells = Vec::new();
    for (name, rc) in raw.cells {
        let spec = to_spec(&name, rc)?;
        spec.validate()?;
        cells.push(spec);
    }
    for name in &raw.delete {
        crate::spec::validate_name(name)?;
        if cells.iter().any(|c| &c.name == name) {
            return Err(ManifestError::Cell {
                cell: name.clone(),
                what: "listed both under [cells] and in delete".into(),
            });
        }
    }
    Ok(Manifest {
        cells,
        delete: raw.delete,
    })
}

fn to_spec(name: &str, rc: RawCell) -> Result<CellSpec, ManifestError> {
    let err = |what: String| ManifestError::Cell {
        cell: name.to_string(),
        what,
    };
    let dur = |field: &str, v: &Option<String>| -> Result<Option<Duration>, ManifestError> {
        v.as_deref()
            .map(|s| parse_duration(s).map_err(|e| err(format!("{field}: {e}"))))
            .transpose()
    };
    let period = dur("period", &rc.period)?;
    let active = dur("active", &rc.active)?;
    let offset = dur("offset", &rc.offset)?;
    let budget = dur("budget", &rc.budget)?;
    let need = |field: &str, v: Option<Duration>| {
        v.ok_or_else(|| err(format!("`{field}` is required for policy {}", rc.policy)))
    };
    let forbid = |field: &str, present: bool| -> Result<(), ManifestError> {
        if present {
            Err(err(format!(
                "`{field}` does not apply to policy {}",
                rc.policy
            )))
        } else {
            Ok(())
        }
    };
    let policy = match rc.policy.as_str() {
        "dedicated" => {
            forbid("period", period.is_some())?;
            forbid("active", active.is_some())?;
            forbid("budget", budget.is_some())?;
            forbid("offset", offset.is_some())?;
            forbid("weight", rc.weight.is_some())?;
            Policy::Dedicated
        }
        "time-triggered" => {
            forbid("budget", budget.is_some())?;
            forbid("weight", rc.weight.is_some())?;
            Policy::TimeTriggered {
                period: need("period", period)?,
                active: need("active", active)?,
                offset,
            }
        }
        "event-triggered" => {
            forbid("active", active.is_some())?;
            forbid("offset", offset.is_some())?;
            forbid("weight", rc.weight.is_some())?;
            Policy::EventTriggered { period: need("period", period)?, budget: need("budget", budget)? }
        }
        "best-effort" => {
            forbid("period", period.is_some())?;
            forbid("active", active.is_some())?;
            forbid("budget", budget.is_some())?;
            forbid("offset", offset.is_some())?;
            Policy::BestEffort { weight: rc.weight.unwrap_or(DEFAULT_WEIGHT) }
        }
        other => {
            return Err(err(format!(
                "unknown policy {other:?}: use dedicated, time-triggered, event-triggered or best-effort"
            )))
        }
    };
    let harts = match (rc.harts, rc.hart_ids) {
        (Some(_), Some(_)) => {
            return Err(err("give either `harts` or `hart-ids`, not both".into()))
        }
        (Some(n), None) => HartRequest::Count(n),
        (None, Some(HartIds::List(ids))) => HartRequest::Ids(ids.into_iter().collect()),
        (None, Some(HartIds::Text(t))) => {
            HartRequest::Ids(t.parse::<HartSet>().map_err(|e| err(e.to_string()))?)
        }
        (None, None) => HartRequest::Count(1),
    };
    let memory_max = rc
        .memory
        .as_deref()
        .map(|m| parse_bytes(m).map_err(|e| err(format!("memory: {e}"))))
        .transpose()?;
    let broker = BrokerLimits {
        floor: rc.broker_floor,
        ceiling: rc.broker_ceiling,
    };
    Ok(CellSpec {
        name: name.to_string(),
        policy,
        harts,
        memory_max,
        pids_max: rc.pids,
        pinned: rc.pinned,
        idle: rc.idle,
        broker,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"
delete = ["old"]

[cells.synth]
policy = "dedicated"
hart-ids = [1]
memory = "512M"
pinned = true

[cells.video]
policy = "time-triggered"
period = "33ms"
active = "4ms"

[cells.ctl]
policy = "event-triggered"
period = "10ms"
budget = "2ms"
hart-ids = "0"

[cells.batch]
policy = "best-effort"
harts = 2
"#;

    #[test]
    fn parses_the_documented_example() {
        let m = parse(EXAMPLE).unwrap();
        assert_eq!(m.delete, vec!["old".to_string()]);
        let names: Vec<&str> = m.cells.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, vec!["batch", "ctl", "synth", "video"]);
        let synth = &m.cells[2];
        assert_eq!(synth.policy, Policy::Dedicated);
        assert_eq!(synth.memory_max, Some(512 << 20));
        assert!(synth.pinned);
        assert_eq!(m.cells[0].harts, HartRequest::Count(2));
        assert_eq!(m.cells[1].harts, HartRequest::Ids(HartSet::single(0)));
    }

    #[test]
    fn errors_name_the_cell_and_field() {
        let cases = [
            (
                "[cells.a]\npolicy = \"time-triggered\"\nperiod = \"10ms\"\n",
                "cells.a: `active` is required",
            ),
            (
                "[cells.a]\npolicy = \"dedicated\"\nbudget = \"1ms\"\n",
                "cells.a: `budget` does not apply",
            ),
            ("[cells.a]\npolicy = \"sometimes\"\n", "unknown policy"),
            (
                "[cells.a]\npolicy = \"best-effort\"\ncolour = 1\n",
                "unknown field",
            ),
            (
                "[cells.a]\npolicy = \"event-triggered\"\nperiod = \"10 ms\"\nbudget = \"x\"\n",
                "budget: invalid duration",
            ),
            (
                "[cells.a]\npolicy = \"event-triggered\"\nperiod = \"10ms\"\nbudget = \"20ms\"\n",
                "exceeds the period",
            ),
            ("[cells.A]\npolicy = \"dedicated\"\n", "invalid cell name"),
            (
                "[cells.a]\npolicy = \"dedicated\"\nharts = 1\nhart-ids = [1]\n",
                "either `harts` or `hart-ids`",
            ),
            ("[cells.a\n", "TOML parse error"),
            (
                "delete = [\"a\"]\n[cells.a]\npolicy = \"dedicated\"\n",
                "both under [cells] and in delete",
            ),
        ];
        for (text, want) in cases {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: got {e:?}, want {want:?}");
        }
    }

    #[test]
    fn empty_manifest_is_valid() {
        assert_eq!(parse("").unwrap(), Manifest::default());
    }

    #[test]
    fn broker_limits_are_parsed_and_checked() {
        let m = parse(
            "[cells.enc]\npolicy = \"event-triggered\"\nperiod = \"10ms\"\nbudget = \"3ms\"\n\
             broker-floor = 0.05\nbroker-ceiling = 0.5\n",
        )
        .unwrap();
        let b = m.cells[0].broker;
        assert_eq!(
            (b.floor.map(Harts::get), b.ceiling.map(Harts::get)),
            (Some(0.05), Some(0.5))
        );
        // Without them, none (and the spec serialises as before).
        let plain = parse("[cells.b]\npolicy = \"best-effort\"\n").unwrap();
        assert!(plain.cells[0].broker.is_empty());
        let json = serde_json::to_string(&plain.cells[0]).unwrap();
        assert!(!json.contains("broker"), "{json}");
        // Through the store's JSON and back: the same spec.
        let again: CellSpec =
            serde_json::from_str(&serde_json::to_string(&m.cells[0]).unwrap()).unwrap();
        assert_eq!(again, m.cells[0]);
        for bad in [
            "broker-floor = 0.6\nbroker-ceiling = 0.5",
            "broker-floor = -1",
            "broker-ceiling = 1e9",
        ] {
            let text = format!(
                "[cells.enc]\npolicy = \"event-triggered\"\nperiod = \"10ms\"\nbudget = \"3ms\"\n{bad}\n"
            );
            assert!(parse(&text).is_err(), "{bad}");
        }
    }
}
