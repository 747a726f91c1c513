//! Latency histograms drawn as standalone SVG files (like Figs. 7 and 8 of the audio paper).

use crate::Summary;
use std::fmt::Write as _;

/// Options for [`svg`].
#[derive(Debug, Clone)]
pub struct HistogramOptions {
    /// Title at the top.
    pub title: String,
    /// X-axis label (with unit).
    pub x_label: String,
    /// Number of bins.
    pub bins: usize,
    /// Optional vertical line (e.g. the deadline), with its label.
    pub marker: Option<(f64, String)>,
    /// Fixed x range; `None` fits the data.
    pub x_range: Option<(f64, f64)>,
    /// Logarithmic y axis (so rare tail events stay visible).
    pub log_y: bool,
}

impl Default for HistogramOptions {
    fn default() -> Self {
        HistogramOptions {
            title: String::new(),
            x_label: "response time (us)".into(),
            bins: 60,
            marker: None,
            x_range: None,
            log_y: true,
        }
    }
}

/// Bins `samples` into `bins` equal-width buckets over `[lo, hi]`; samples outside are clamped
/// into the first or last bucket.
pub fn bin_counts(samples: &[f64], lo: f64, hi: f64, bins: usize) -> Vec<u64> {
    let bins = bins.max(1);
    let mut counts = vec![0u64; bins];
    let width = if hi > lo {
        (hi - lo) / bins as f64
    } else {
        1.0
    };
    for &s in samples {
        if s.is_nan() {
            continue;
        }
        let i = ((s - lo) / width).floor();
        let i = if i < 0.0 {
            0
        } else {
            (i as usize).min(bins - 1)
        };
        counts[i] += 1;
    }
    counts
}

/// Renders a histogram of `samples` as an SVG document, with first-order statistics in the
/// caption the way the paper's figures print them.
pub fn svg(samples: &[f64], opts: &HistogramOptions) -> String {
    let (w, h) = (760.0, 420.0);
    let (ml, mr, mt, mb) = (70.0, 20.0, 50.0, 70.0);
    let pw = w - ml - mr;
    let ph = h - mt - mb;
    let s = Summary::of(samples);
    let (lo, hi) = opts.x_range.unwrap_or_else(|| {
        let lo = s.min.min(opts.marker.as_ref().map_or(s.min, |m| m.0));
        let hi = s.max.max(opts.marker.as_ref().map_or(s.max, |m| m.0));
        let pad = ((hi - lo) * 0.05).max(1.0);
        ((lo - pad).max(0.0), hi + pad)
    });
    let counts = bin_counts(samples, lo, hi, opts.bins);
    let cmax = counts.iter().copied().max().unwrap_or(0).max(1) as f64;
    let yval = |c: u64| -> f64 {
        if c == 0 {
            return 0.0;
        }
        if opts.log_y {
            (c as f64).log10().max(0.0) + 0.3
        } else {
            c as f64
        }
    };
    let ymax = if opts.log_y { cmax.log10() + 0.3 } else { cmax };
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{}" y="20" text-anchor="middle" font-size="15">{}</text>"#,
        w / 2.0,
        escape(&opts.title)
    );
    let caption = format!(
        "n = {}, mean = {:.2}, stdev = {:.2}, p99 = {:.1}, p99.9 = {:.1}, max = {:.1}",
        s.count, s.mean, s.stdev, s.p99, s.p999, s.max
    );
    let _ = writeln!(
        out,
        r#"<text x="{}" y="38" text-anchor="middle">{}</text>"#,
        w / 2.0,
        escape(&caption)
    );
    let bw = pw / counts.len() as f64;
    for (i, &c) in counts.iter().enumerate() {
        if c == 0 {
            continue;
        }
        let bh = ph * yval(c) / ymax;
        let _ = writeln!(
            out,
            r##"<rect x="{:.2}" y="{:.2}" width="{:.2}" height="{:.2}" fill="#3b6ea5"><title>{c}</title></rect>"##,
            ml + i as f64 * bw,
            mt + ph - bh,
            (bw - 1.0).max(0.5),
            bh
        );
    }
    // Axes and ticks.
    let _ = writeln!(
        out,
        r#"<line x1="{ml}" y1="{}" x2="{}" y2="{}" stroke="black"/>"#,
        mt + ph,
        ml + pw,
        mt + ph
    );
    let _ = writeln!(
        out,
        r#"<line x1="{ml}" y1="{mt}" x2="{ml}" y2="{}" stroke="black"/>"#,
        mt + ph
    );
    for k in 0..=5 {
        let x = lo + (hi - lo) * k as f64 / 5.0;
        let px = ml + pw * k as f64 / 5.0;
        let _ = writeln!(
            out,
            r#"<text x="{px:.1}" y="{}" text-anchor="middle">{x:.0}</text>"#,
            mt + ph + 18.0
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        ml + pw / 2.0,
        h - 25.0,
        escape(&opts.x_label)
    );
    let ylabel = if opts.log_y {
        "count (log scale)"
    } else {
        "count"
    };
    let _ = writeln!(
        out,
        r#"<text x="18" y="{}" text-anchor="middle" transform="rotate(-90 18 {})">{ylabel}</text>"#,
        mt + ph / 2.0,
        mt + ph / 2.0
    );
    if let Some((x, label)) = &opts.marker {
        if *x >= lo && *x <= hi {
            let px = ml + pw * (x - lo) / (hi - lo);
            let _ = writeln!(
                out,
                r#"<line x1="{px:.1}" y1="{mt}" x2="{px:.1}" y2="{}" stroke="red" stroke-dasharray="4 3"/>"#,
                mt + ph
            );
            let _ = writeln!(
                out,
                r#"<text x="{:.1}" y="{}" fill="red">{}</text>"#,
                px + 4.0,
                mt + 12.0,
                escape(label)
            );
        }
    }
    out.push_str("</svg>\n");
    out
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bins_cover_all_samples() {
        let xs: Vec<f64> = (0..100).map(|x| x as f64).collect();
        let c = bin_counts(&xs, 0.0, 100.0, 10);
        assert_eq!(c, vec![10; 10]);
        let c = bin_counts(&[-5.0, 500.0], 0.0, 100.0, 4);
        assert_eq!(c, vec![1, 0, 0, 1]);
    }

    #[test]
    fn svg_is_well_formed_enough() {
        let xs: Vec<f64> = (0..1000).map(|x| 900.0 + (x % 200) as f64).collect();
        let opts = HistogramOptions {
            title: "A <alone>".into(),
            marker: Some((1405.9, "deadline".into())),
            ..Default::default()
        };
        let doc = svg(&xs, &opts);
        assert!(doc.starts_with("<svg"));
        assert!(doc.trim_end().ends_with("</svg>"));
        assert!(doc.contains("A &lt;alone&gt;"));
        assert!(doc.contains("deadline"));
    }
}
