//! What the broker reports (`tess broker status`): written by `tess-broker` as one JSON file
//! after every decision round (atomically, by rename), read by the CLI.

use crate::pota::Reason;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Default status file.
pub const DEFAULT_STATUS: &str = "/run/tess/broker-status.json";
/// Decisions kept per cell.
pub const KEEP_DECISIONS: usize = 8;

/// The status file: `$TESS_BROKER_STATUS`, or [`DEFAULT_STATUS`].
pub fn status_path() -> PathBuf {
    std::env::var_os("TESS_BROKER_STATUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_STATUS))
}

/// The whole broker.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct BrokerStatus {
    /// The broker's pid.
    pub pid: u32,
    /// When this was written (Unix time, ms).
    pub written_unix_ms: u64,
    /// Decision period (ms).
    pub period_ms: u64,
    /// `pota` or `pacora`.
    #[serde(default)]
    pub policy: String,
    /// Registrations refused so far, and why (the last few).
    pub refused: Vec<String>,
    /// Per heartbeat.
    pub cells: Vec<CellStatus>,
}

/// One brokered cell.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CellStatus {
    /// The cell.
    pub cell: String,
    /// The heartbeat's name.
    pub heartbeat: String,
    /// The process that registered it.
    pub pid: i32,
    /// What its share is of: `cpu` (harts), `net` (a flow of the cell, Mbit/s) or `cpu+net`
    /// (harts in `share` and the cell's own flow in `flow_share`, modelled together).
    #[serde(default = "cpu")]
    pub resource: String,
    /// The flow, for `net`: `CELL`, or `CELL/LABEL` for a labelled flow; `CELL` for `cpu+net`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flow: Option<String>,
    /// Demand per unit its beats carried over the last period, if they carry values: CPU time
    /// (ns) for a CPU heartbeat, the mean; size (bytes) for a flow heartbeat, the mean or the
    /// newer half's if more (`service::demand_of`).
    #[serde(default)]
    pub measured_value: Option<f64>,
    /// The response time per unit at the share in force, ms, when the beats carry demands
    /// (demand / share).
    #[serde(default)]
    pub measured_tau_ms: Option<f64>,
    /// Target rate (units per second), if the cell declared one.
    pub target_rate: Option<f64>,
    /// Rate over the last decision period.
    pub measured_rate: f64,
    /// Share in force (harts; Mbit/s for `net`).
    pub share: f64,
    /// For `cpu+net` (a cell whose units need its flow too, `network = true`): the Mbit/s its
    /// flow holds, allocated with `share`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flow_share: Option<f64>,
    /// Floor and ceiling (harts).
    pub floor: f64,
    /// Ceiling (harts).
    pub ceiling: f64,
    /// Model estimates `a` and `b` of `t(k+1) = a t(k) + b r(k)`.
    pub model_a: f64,
    /// See `model_a`.
    pub model_b: f64,
    /// PACORA's fitted response time per unit, seconds (policy `pacora`): `tau0 + w / share`,
    /// or for `cpu+net` `tau0 + w_cc / a_c + w_cn / sqrt(a_c a_n) + w_nn / a_n` with `a_c` the
    /// harts and `a_n` the flow's Mbit/s (weights in that order).
    #[serde(default)]
    pub response_model: Option<crate::pacora::ResponseModel>,
    /// Beats counted in total.
    pub beats: u64,
    /// Bad input seen from this cell: beats that could not be read, forged timestamps, a count
    /// that went back, an invalid target.
    pub anomalies: Anomalies,
    /// The last decisions, newest last.
    pub decisions: Vec<DecisionRecord>,
}

fn cpu() -> String {
    "cpu".into()
}

/// Counters of bad input.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Anomalies {
    /// Beats counted but not readable (overwritten before the broker looked, or torn).
    pub unreadable: u64,
    /// Beats with forged timestamps.
    pub bad_timestamps: u64,
    /// Times the count went back.
    pub count_went_back: u64,
    /// Decisions at which the target was invalid.
    pub bad_target: u64,
    /// Periods whose beats' values claimed more of the resource than the cell could use (its
    /// harts; the link): the values were ignored.
    #[serde(default)]
    pub impossible_values: u64,
}

/// One decision.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DecisionRecord {
    /// When (Unix time, ms).
    pub at_unix_ms: u64,
    /// Rate measured.
    pub rate: f64,
    /// Share before.
    pub from: f64,
    /// Share after (what is in force).
    pub to: f64,
    /// The controller's reason, or a broker reason (`pinned`, `refused`, `no-target`, ...).
    pub reason: String,
    /// Details (tessd's refusal, for example).
    pub note: String,
    /// Consecutive rounds this record stands for: PACORA's rounds that held for want of an
    /// event (`no-event`) collapse into one record, the time and rate of the latest.
    #[serde(default = "one_round")]
    pub rounds: u64,
}

fn one_round() -> u64 {
    1
}

impl DecisionRecord {
    /// The reason name of a controller decision.
    pub fn reason_name(r: Reason) -> String {
        serde_json::to_value(r)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_else(|| format!("{r:?}"))
    }
}

/// Writes the status atomically.
pub fn write(path: &Path, status: &BrokerStatus) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(status)?)?;
    std::fs::rename(&tmp, path)
}

/// Reads the status.
pub fn read(path: &Path) -> anyhow::Result<BrokerStatus> {
    let bytes = std::fs::read(path).map_err(|e| {
        anyhow::anyhow!(
            "reading {}: {e} (is tess-broker running? `tess run --cell broker -- tess-broker &`)",
            path.display()
        )
    })?;
    serde_json::from_slice(&bytes)
        .map_err(|e| anyhow::anyhow!("{} is not a broker status: {e}", path.display()))
}
