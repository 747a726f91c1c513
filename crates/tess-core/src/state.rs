//! The admitted state: every cell with its placement and owner.

use crate::spec::{CellSpec, Policy};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;
use tess_sched::HartSet;

/// A cell as the daemon holds it: the user's spec plus what the daemon decided.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cell {
    /// What the user asked for.
    pub spec: CellSpec,
    /// The harts the cell was given.
    pub harts: HartSet,
    /// For time-triggered cells: the window offset in effect (the spec's, or one the daemon
    /// chose so that windows do not collide).
    #[serde(with = "crate::units::serde_opt_ns", default)]
    pub window_offset: Option<Duration>,
    /// Owner's uid.
    pub owner: u32,
    /// For `tess run --reserve` cells: the process whose exit removes the cell.
    #[serde(default)]
    pub ephemeral_pid: Option<i32>,
    /// Creation time, milliseconds since the Unix epoch.
    #[serde(default)]
    pub created_ms: u64,
}

impl Cell {
    /// The cell's name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// The cell's policy.
    pub fn policy(&self) -> &Policy {
        &self.spec.policy
    }

    /// For a time-triggered cell: `(offset, active, period)` of its window.
    pub fn window(&self) -> Option<(Duration, Duration, Duration)> {
        match self.spec.policy {
            Policy::TimeTriggered {
                period,
                active,
                offset,
            } => Some((
                self.window_offset.or(offset).unwrap_or_default(),
                active,
                period,
            )),
            _ => None,
        }
    }
}

/// All admitted cells, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cluster {
    /// Cells by name.
    pub cells: BTreeMap<String, Cell>,
}

impl Cluster {
    /// Cells placed on `hart`.
    pub fn cells_on(&self, hart: usize) -> impl Iterator<Item = &Cell> {
        self.cells.values().filter(move |c| c.harts.contains(hart))
    }

    /// Harts owned by dedicated cells.
    pub fn dedicated_harts(&self) -> HartSet {
        self.cells
            .values()
            .filter(|c| c.policy().is_dedicated())
            .fold(HartSet::new(), |acc, c| acc.union(&c.harts))
    }

    /// Harts carrying at least one `SCHED_DEADLINE` reservation (time- or event-triggered).
    pub fn reserved_harts(&self) -> HartSet {
        self.cells
            .values()
            .filter(|c| c.policy().is_reservation())
            .fold(HartSet::new(), |acc, c| acc.union(&c.harts))
    }

    /// Fraction of `hart` claimed by its cells.
    pub fn utilization_on(&self, hart: usize) -> f64 {
        self.cells_on(hart).map(|c| c.policy().utilization()).sum()
    }

    /// Cells owned by `uid`.
    pub fn owned_by(&self, uid: u32) -> impl Iterator<Item = &Cell> {
        self.cells.values().filter(move |c| c.owner == uid)
    }
}
