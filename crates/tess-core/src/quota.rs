//! Per-user quotas: what a non-root user may reserve (this is what rtkit cannot do: bound a
//! user's real-time share instead of granting or refusing priority).

use crate::admission::AdmissionError;
use crate::state::Cluster;
use crate::units::format_bytes;
use serde::{Deserialize, Serialize};

/// Limits for one user. The default is zero everywhere: a user with no quota may create nothing.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Quota {
    /// Number of cells.
    #[serde(default)]
    pub max_cells: u32,
    /// Harts over all cells (a 2-hart cell counts 2).
    #[serde(default)]
    pub max_harts: u32,
    /// Harts in dedicated cells.
    #[serde(default)]
    pub max_dedicated_harts: u32,
    /// Sum over harts of reserved fractions (time- and event-triggered), in hart-equivalents:
    /// 0.5 allows, for example, one 50% cell or two 25% cells.
    #[serde(default)]
    pub max_reserved: f64,
    /// Sum of memory limits; cells without a memory limit are refused when this is set.
    #[serde(default)]
    pub max_memory: Option<u64>,
    /// Whether the user may pin cells.
    #[serde(default)]
    pub allow_pinned: bool,
}

/// What a user holds.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Usage {
    /// Cells.
    pub cells: u32,
    /// Harts over all cells.
    pub harts: u32,
    /// Dedicated harts.
    pub dedicated_harts: u32,
    /// Reserved hart-equivalents.
    pub reserved: f64,
    /// Sum of memory limits.
    pub memory: u64,
    /// Cells without a memory limit.
    pub unlimited_memory_cells: u32,
    /// Pinned cells.
    pub pinned: u32,
}

/// Usage of `uid` in `cluster`.
pub fn usage_of(cluster: &Cluster, uid: u32) -> Usage {
    let mut u = Usage::default();
    for c in cluster.owned_by(uid) {
        u.cells += 1;
        u.harts += c.harts.len() as u32;
        if c.policy().is_dedicated() {
            u.dedicated_harts += c.harts.len() as u32;
        }
        if c.policy().is_reservation() {
            u.reserved += c.policy().utilization() * c.harts.len() as f64;
        }
        match c.spec.memory_max {
            Some(m) => u.memory += m,
            None => u.unlimited_memory_cells += 1,
        }
        if c.spec.pinned {
            u.pinned += 1;
        }
    }
    u
}

/// Checks `uid`'s usage in `cluster` against `quota`. Root is never limited.
pub fn check(cluster: &Cluster, uid: u32, quota: &Quota) -> Result<Usage, AdmissionError> {
    let u = usage_of(cluster, uid);
    if uid == 0 {
        return Ok(u);
    }
    let over = |resource: &str, limit: String, requested: String| AdmissionError::Quota {
        uid,
        resource: resource.into(),
        limit,
        requested,
    };
    if u.cells > quota.max_cells {
        return Err(over(
            "cells",
            quota.max_cells.to_string(),
            u.cells.to_string(),
        ));
    }
    if u.harts > quota.max_harts {
        return Err(over(
            "harts",
            quota.max_harts.to_string(),
            u.harts.to_string(),
        ));
    }
    if u.dedicated_harts > quota.max_dedicated_harts {
        return Err(over(
            "dedicated harts",
            quota.max_dedicated_harts.to_string(),
            u.dedicated_harts.to_string(),
        ));
    }
    if u.reserved > quota.max_reserved + 1e-9 {
        return Err(over(
            "reserved cpu (hart-equivalents)",
            format!("{:.3}", quota.max_reserved),
            format!("{:.3}", u.reserved),
        ));
    }
    if let Some(max) = quota.max_memory {
        if u.unlimited_memory_cells > 0 {
            return Err(over(
                "memory",
                format_bytes(max),
                "a cell without a memory limit (set --memory)".into(),
            ));
        }
        if u.memory > max {
            return Err(over("memory", format_bytes(max), format_bytes(u.memory)));
        }
    }
    if u.pinned > 0 && !quota.allow_pinned {
        return Err(over("pinned cells", "0".into(), u.pinned.to_string()));
    }
    Ok(u)
}
