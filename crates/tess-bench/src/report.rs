//! Benchmark reports: tables for people, named figures for scripts.

use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// A titled table of strings.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Table {
    /// Title printed above the table.
    pub title: String,
    /// Column headers.
    pub headers: Vec<String>,
    /// Rows; each as long as `headers`.
    pub rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with a title and headers.
    pub fn new(title: impl Into<String>, headers: &[&str]) -> Table {
        Table {
            title: title.into(),
            headers: headers.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row.
    pub fn row<S: ToString>(&mut self, cells: &[S]) -> &mut Self {
        self.rows
            .push(cells.iter().map(|c| c.to_string()).collect());
        self
    }

    /// Renders with aligned columns (first column left, others right).
    pub fn render(&self) -> String {
        let ncol = self
            .headers
            .len()
            .max(self.rows.iter().map(Vec::len).max().unwrap_or(0));
        let mut width = vec![0usize; ncol];
        for row in std::iter::once(&self.headers).chain(self.rows.iter()) {
            for (i, c) in row.iter().enumerate() {
                width[i] = width[i].max(c.chars().count());
            }
        }
        let mut out = String::new();
        if !self.title.is_empty() {
            let _ = writeln!(out, "{}", self.title);
        }
        let line = |out: &mut String, row: &[String]| {
            for (i, w) in width.iter().enumerate() {
                let c = row.get(i).map(String::as_str).unwrap_or("");
                if i == 0 {
                    let _ = write!(out, "  {c:<w$}");
                } else {
                    let _ = write!(out, "  {c:>w$}");
                }
            }
            out.push('\n');
        };
        line(&mut out, &self.headers);
        let total: usize = width.iter().sum::<usize>() + 2 * ncol;
        let _ = writeln!(out, "  {}", "-".repeat(total.saturating_sub(2)));
        for r in &self.rows {
            line(&mut out, r);
        }
        out
    }
}

/// The result of one `tess bench NAME` run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Benchmark name (`mux`, `channel`, ...).
    pub bench: String,
    /// Figure name -> value, with the names the issues use.
    pub figures: BTreeMap<String, f64>,
    /// Targets checked, as `figure -> description` with pass/fail, when the bench knows them.
    pub targets: Vec<TargetCheck>,
    /// Human tables.
    pub tables: Vec<Table>,
    /// Free-form notes: hart layout, machine caveats, shortfalls.
    pub notes: Vec<String>,
    /// Side-by-side rows: one measured quantity, the paper's figure for it, ours, and the best
    /// plain-Linux baseline measured in the same run (`docs/benchmarks.md` is generated from
    /// these, see `scripts/bench-all`).
    pub comparisons: Vec<Comparison>,
    /// Bench-specific detail (raw summaries, parameters).
    pub detail: serde_json::Value,
}

/// One row of a side-by-side comparison: what the seed paper reports, what tess measured and
/// what the best plain-Linux configuration measured in the same run (each a figure name of this
/// report, so repetitions can be summarised per figure).
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    /// The quantity, with its unit, e.g. `music response p99.9 beside interference (us)`.
    pub quantity: String,
    /// The paper's value and where it is (`seed 000 Fig. 7: max 1405`), if the paper has one.
    pub paper: Option<String>,
    /// Figure name holding tess's value.
    pub ours: String,
    /// Figure name holding the baseline's value, if one ran.
    pub baseline: Option<String>,
    /// What the baseline is (`SCHED_FIFO 99 pinned, same preparation`).
    pub baseline_is: Option<String>,
}

/// A target from an issue and whether this run met it.
#[derive(Debug, Clone, Serialize)]
pub struct TargetCheck {
    /// What the target says, e.g. `iso_cell_median_us <= 2 x iso_fifo_median_us`.
    pub target: String,
    /// Whether this run met it.
    pub met: bool,
    /// The measured value(s) that decided it.
    pub measured: String,
}

impl Report {
    /// An empty report for bench `name`.
    pub fn new(name: &str) -> Report {
        Report {
            bench: name.to_string(),
            figures: BTreeMap::new(),
            targets: Vec::new(),
            tables: Vec::new(),
            notes: Vec::new(),
            comparisons: Vec::new(),
            detail: serde_json::Value::Object(Default::default()),
        }
    }

    /// Records a figure.
    pub fn figure(&mut self, name: impl Into<String>, value: f64) -> &mut Self {
        self.figures.insert(name.into(), value);
        self
    }

    /// Records a note line.
    pub fn note(&mut self, text: impl Into<String>) -> &mut Self {
        self.notes.push(text.into());
        self
    }

    /// Records a target check.
    pub fn target(&mut self, target: impl Into<String>, met: bool, measured: impl Into<String>) {
        self.targets.push(TargetCheck {
            target: target.into(),
            met,
            measured: measured.into(),
        });
    }

    /// Records a side-by-side row (see [`Comparison`]); `ours` and `baseline` name figures
    /// of this report.
    pub fn compare(
        &mut self,
        quantity: impl Into<String>,
        paper: Option<&str>,
        ours: impl Into<String>,
        baseline: Option<(&str, &str)>,
    ) -> &mut Self {
        self.comparisons.push(Comparison {
            quantity: quantity.into(),
            paper: paper.map(str::to_string),
            ours: ours.into(),
            baseline: baseline.map(|(f, _)| f.to_string()),
            baseline_is: baseline.map(|(_, what)| what.to_string()),
        });
        self
    }

    /// Adds a table.
    pub fn table(&mut self, t: Table) -> &mut Self {
        self.tables.push(t);
        self
    }

    /// Stores bench-specific detail under `key`.
    pub fn detail(&mut self, key: &str, value: impl Serialize) -> &mut Self {
        if let serde_json::Value::Object(map) = &mut self.detail {
            map.insert(
                key.to_string(),
                serde_json::to_value(value).unwrap_or_default(),
            );
        }
        self
    }

    /// Whether every recorded target was met.
    pub fn all_targets_met(&self) -> bool {
        self.targets.iter().all(|t| t.met)
    }

    /// Renders the human form: tables, figures, targets, notes.
    pub fn render_text(&self) -> String {
        let mut out = format!("tess bench {}\n\n", self.bench);
        for t in &self.tables {
            out.push_str(&t.render());
            out.push('\n');
        }
        if !self.figures.is_empty() {
            let mut t = Table::new("figures", &["figure", "value"]);
            for (k, v) in &self.figures {
                t.row(&[k.clone(), format_value(*v)]);
            }
            out.push_str(&t.render());
            out.push('\n');
        }
        if !self.comparisons.is_empty() {
            let mut t = Table::new(
                "side by side (paper, tess, best plain-Linux baseline in this run)",
                &["quantity", "paper", "tess", "baseline"],
            );
            let fig = |name: &str| {
                self.figures
                    .get(name)
                    .map_or_else(|| "-".to_string(), |v| format_value(*v))
            };
            for c in &self.comparisons {
                t.row(&[
                    c.quantity.clone(),
                    c.paper.clone().unwrap_or_else(|| "-".into()),
                    fig(&c.ours),
                    match (&c.baseline, &c.baseline_is) {
                        (Some(b), Some(what)) => format!("{} ({what})", fig(b)),
                        _ => "-".into(),
                    },
                ]);
            }
            out.push_str(&t.render());
            out.push('\n');
        }
        if !self.targets.is_empty() {
            let mut t = Table::new("targets", &["target", "measured", "met"]);
            for c in &self.targets {
                t.row(&[
                    c.target.clone(),
                    c.measured.clone(),
                    if c.met { "yes" } else { "NO" }.into(),
                ]);
            }
            out.push_str(&t.render());
            out.push('\n');
        }
        for n in &self.notes {
            let _ = writeln!(out, "note: {n}");
        }
        out
    }

    /// Renders the report as one JSON object.
    pub fn render_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("report serialises")
    }
}

/// Formats a figure: integers without decimals, small numbers with three significant decimals.
pub fn format_value(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else if v.abs() >= 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_has_figures_object() {
        let mut r = Report::new("demo");
        r.figure("update_median_us", 123.5)
            .figure("update_max_us", 900.0);
        r.target("update_median_us < 1000", true, "123.5");
        let v: serde_json::Value = serde_json::from_str(&r.render_json()).unwrap();
        assert_eq!(v["bench"], "demo");
        assert_eq!(v["figures"]["update_median_us"], 123.5);
        assert_eq!(v["targets"][0]["met"], true);
    }

    #[test]
    fn table_aligns_columns() {
        let mut t = Table::new("t", &["name", "value"]);
        t.row(&["a", "1"]).row(&["longer", "12345"]);
        let text = t.render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[1].len(), lines[3].len());
        assert!(text.contains("longer"));
    }
}
