//! One run set on disk: `meta.json` and every `NAME-REP.{json,status,log}`, read leniently (a
//! report lacking a field renders with it empty) and with every failed or missing run kept.

use super::machine::Meta;
use anyhow::Context as _;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

/// A bench report as read back (lenient: a field a report lacks is empty, so older or newer
/// reports still render).
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(default)]
pub struct ReportView {
    /// Bench name.
    pub bench: String,
    /// Figures. A `null` figure (a quantity with no value in that run, e.g. the response
    /// percentile of a scenario in which nothing was answered) is left out.
    #[serde(deserialize_with = "figures_without_nulls")]
    pub figures: BTreeMap<String, f64>,
    /// Targets with their outcome.
    pub targets: Vec<TargetView>,
    /// Human tables.
    pub tables: Vec<TableView>,
    /// Notes.
    pub notes: Vec<String>,
    /// Side-by-side rows.
    pub comparisons: Vec<ComparisonView>,
}

/// Reads a figure map, leaving out `null` values.
fn figures_without_nulls<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, f64>, D::Error> {
    let raw: BTreeMap<String, Option<f64>> = Deserialize::deserialize(d)?;
    Ok(raw.into_iter().filter_map(|(k, v)| Some((k, v?))).collect())
}

/// A target as read back.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(default)]
pub struct TargetView {
    /// What the target says.
    pub target: String,
    /// Whether the run met it.
    pub met: bool,
    /// What decided it.
    pub measured: String,
}

/// A table as read back.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(default)]
pub struct TableView {
    /// Title.
    pub title: String,
    /// Headers.
    pub headers: Vec<String>,
    /// Rows.
    pub rows: Vec<Vec<String>>,
}

/// A side-by-side row as read back.
#[derive(Debug, Clone, Deserialize, Default, PartialEq)]
#[serde(default)]
pub struct ComparisonView {
    /// The quantity and its unit.
    pub quantity: String,
    /// The paper's figure, as text.
    pub paper: Option<String>,
    /// Figure holding tess's value.
    pub ours: String,
    /// Figure holding the baseline's value.
    pub baseline: Option<String>,
    /// What the baseline is.
    pub baseline_is: Option<String>,
}

/// One repetition of one bench.
#[derive(Debug, Clone)]
pub enum Run {
    /// The bench exited 0 and printed a report.
    Ok(Box<ReportView>),
    /// The bench failed: why (exit status, unreadable JSON) and the last lines of its stderr.
    Failed {
        /// Why it counts as failed.
        why: String,
        /// The end of its stderr log.
        log_tail: String,
    },
    /// No file for this repetition (the run set was interrupted).
    Missing,
}

/// One run set: its stamp and, per bench, its repetitions in order.
#[derive(Debug, Clone, Default)]
pub struct RunSet {
    /// The stamp (empty if the run set has no meta.json).
    pub meta: Meta,
    /// Bench name -> repetitions (index 0 is repetition 1).
    pub benches: BTreeMap<String, Vec<Run>>,
}

impl RunSet {
    /// Reads `DIR/meta.json` and every `NAME-REP.{json,status,log}`.
    pub fn load(dir: &Path) -> anyhow::Result<RunSet> {
        let meta: Meta = match std::fs::read_to_string(dir.join("meta.json")) {
            Ok(s) => serde_json::from_str(&s).context("meta.json")?,
            Err(_) => Meta::default(),
        };
        // Every NAME-REP present, plus every run the stamp announced.
        let mut found: BTreeMap<String, u32> = BTreeMap::new();
        for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
            let name = e?.file_name().to_string_lossy().into_owned();
            let stem = name.rsplit_once('.').map_or(name.as_str(), |(s, _)| s);
            if let Some((bench, rep)) = stem.rsplit_once('-') {
                if let Ok(rep) = rep.parse::<u32>() {
                    let n = found.entry(bench.to_string()).or_default();
                    *n = (*n).max(rep);
                }
            }
        }
        for b in &meta.benches {
            let n = found.entry(b.clone()).or_default();
            *n = (*n).max(meta.reps_of(b));
        }
        let mut benches = BTreeMap::new();
        for (bench, reps) in found {
            let runs = (1..=reps).map(|rep| load_run(dir, &bench, rep)).collect();
            benches.insert(bench, runs);
        }
        Ok(RunSet { meta, benches })
    }

    /// Benches in the order the stamp lists them, then any others by name.
    pub(super) fn order(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self
            .meta
            .benches
            .iter()
            .map(String::as_str)
            .filter(|b| self.benches.contains_key(*b))
            .collect();
        for b in self.benches.keys() {
            if !v.contains(&b.as_str()) {
                v.push(b);
            }
        }
        v
    }
}

pub(super) fn load_run(dir: &Path, bench: &str, rep: u32) -> Run {
    let base = dir.join(format!("{bench}-{rep}"));
    let json = std::fs::read_to_string(base.with_extension("json")).ok();
    let status = std::fs::read_to_string(base.with_extension("status")).ok();
    let log = std::fs::read_to_string(base.with_extension("log")).unwrap_or_default();
    let log_tail = log
        .lines()
        .filter(|l| !l.trim().is_empty())
        .rev()
        .take(3)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join(" / ");
    if json.is_none() && status.is_none() {
        return Run::Missing;
    }
    let failed = |why: String| Run::Failed {
        why,
        log_tail: log_tail.clone(),
    };
    match status.as_deref().map(str::trim) {
        Some("0") | None => {}
        Some(code) => return failed(format!("exit status {code}")),
    }
    match json.as_deref().map(serde_json::from_str::<ReportView>) {
        Some(Ok(r)) => Run::Ok(Box::new(r)),
        Some(Err(e)) => failed(format!("no readable report ({e})")),
        None => failed("no report".into()),
    }
}

#[cfg(test)]
mod null_figures {
    use super::ReportView;

    #[test]
    fn a_null_figure_is_left_out_and_the_rest_is_read() {
        let r: ReportView = serde_json::from_str(
            r#"{"bench":"music","figures":{"E_linux_p999_us":null,"A_misses":3}}"#,
        )
        .unwrap();
        assert_eq!(r.figures.len(), 1);
        assert_eq!(r.figures["A_misses"], 3.0);
    }
}
