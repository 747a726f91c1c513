//! `tess top`: watch every cell keep (or miss) its guarantee, refreshed 1-10 times a second.
//!
//! Each refresh takes a [`Snapshot`] (tessd's `status` and `list-cells` beside the kernel's
//! counters) and shows the [`View`] since the previous one: per cell the CPU granted and used,
//! the mean wait for a CPU per activation, preemptions (which include `SCHED_DEADLINE`
//! throttling) and CFS throttling; per hart what is busy, granted and still admissible.
//! `--once` measures one interval and prints it (a table, or JSON with `--json`) for scripts.

mod ui;

use crate::cmd::usage;
use clap::{Args, ValueEnum};
use std::io::IsTerminal;
use std::path::Path;
use std::time::{Duration, Instant};
use tess_observe::kernel::Mounts;
use tess_observe::rates::{self, View};
use tess_observe::snapshot::{self, Snapshot};
use tess_proto::Client;

/// `tess top` arguments.
#[derive(Args, Debug)]
#[command(
    after_help = "Keys: q quit, s sort column, r reverse, / filter by name, Up/Down select, \
Enter open the selected cell, Esc back, + / - refresh faster / slower.\n\n\
Columns: GRANT and USED in hart-equivalents (1.00 = one whole hart); WAIT is the mean time a \
thread waited for a CPU each time it got one; PRE/s counts involuntary switches (preemption, and \
SCHED_DEADLINE throttling at budget exhaustion); MISS and P99 are what the cell's runtimes \
report of themselves (the synthesizer, tess-pd play, Pulse EDF jobs, gang windows; '-' when none \
publishes): deadline misses in the interval and the worst 99th-percentile response time; THR \
the CFS periods the cell ran out of quota.\n\n\
Examples:\n  tess top\n  tess top --sort used --filter audio\n  tess top --once --json | jq '.cells[] | {name, used_harts}'"
)]
pub struct TopArgs {
    /// Time between refreshes (100ms-1s); with --once, the interval measured.
    #[arg(long, default_value = "1s", value_parser = parse_interval, value_name = "DURATION")]
    pub interval: Duration,
    /// Measure one interval, print it and exit (no terminal UI).
    #[arg(long)]
    pub once: bool,
    /// With --once: print JSON.
    #[arg(long, requires = "once")]
    pub json: bool,
    /// With --once: print the screen as an 80x24 terminal would show it (for logs and docs).
    #[arg(long, requires = "once", conflicts_with = "json")]
    pub screen: bool,
    /// Column to sort cells by.
    #[arg(long, value_enum, default_value = "name")]
    pub sort: SortKey,
    /// Show only cells whose name contains this text.
    #[arg(long, value_name = "TEXT")]
    pub filter: Option<String>,
}

/// What the cell table is sorted by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SortKey {
    /// Cell name.
    Name,
    /// CPU used.
    Used,
    /// CPU granted.
    Granted,
    /// Mean wait for a CPU.
    Wait,
    /// Preemptions per second.
    Preempt,
    /// Deadline misses its runtimes reported.
    Misses,
    /// The worst p99 response time its runtimes reported.
    P99,
    /// Throttled periods.
    Throttled,
    /// Memory used.
    Memory,
}

impl SortKey {
    /// The next key (the `s` key cycles through them).
    pub fn next(self) -> SortKey {
        use SortKey::*;
        match self {
            Name => Used,
            Used => Granted,
            Granted => Wait,
            Wait => Preempt,
            Preempt => Misses,
            Misses => P99,
            P99 => Throttled,
            Throttled => Memory,
            Memory => Name,
        }
    }
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = tess_core::units::parse_duration(s).map_err(|e| e.to_string())?;
    if d < Duration::from_millis(100) || d > Duration::from_secs(1) {
        return Err(format!(
            "{s} is outside 100ms-1s (tess top refreshes 1 to 10 times a second)"
        ));
    }
    Ok(d)
}

/// Sorts and filters a view's cells in place (`reverse` flips the order).
pub fn arrange(view: &mut View, sort: SortKey, reverse: bool, filter: &str) {
    view.cells.retain(|c| c.name.contains(filter));
    let key = |c: &rates::CellRate| -> f64 {
        match sort {
            SortKey::Name => 0.0,
            SortKey::Used => c.used_harts,
            SortKey::Granted => c.granted_harts,
            SortKey::Wait => c.wait_per_slice_us.unwrap_or(0.0),
            SortKey::Preempt => c.involuntary_switches_per_s,
            SortKey::Misses => c.misses().unwrap_or(0) as f64,
            SortKey::P99 => c.p99_us().unwrap_or(0.0),
            SortKey::Throttled => c.throttled_periods.unwrap_or(0) as f64,
            SortKey::Memory => c.memory_bytes.unwrap_or(0) as f64,
        }
    };
    view.cells.sort_by(|a, b| {
        let o = if sort == SortKey::Name {
            a.name.cmp(&b.name)
        } else {
            // Biggest first: the cell that needs attention is at the top.
            key(b).total_cmp(&key(a)).then_with(|| a.name.cmp(&b.name))
        };
        if reverse {
            o.reverse()
        } else {
            o
        }
    });
}

/// A source of snapshots: one connection to tessd, reused across refreshes.
pub struct Sampler {
    client: Client,
    kernel: snapshot::Sampler,
    last: Snapshot,
}

impl Sampler {
    /// Connects and takes the first snapshot.
    pub fn connect(socket: &Path) -> anyhow::Result<Sampler> {
        let mut client = Client::connect(socket)?;
        let mut kernel = snapshot::Sampler::new(Mounts::detect());
        let (status, cells) = snapshot::query(&mut client)?;
        let last = kernel.sample(&status, &cells);
        Ok(Sampler {
            client,
            kernel,
            last,
        })
    }

    /// Takes a snapshot and returns the view since the previous one.
    pub fn refresh(&mut self) -> anyhow::Result<View> {
        let (status, cells) = snapshot::query(&mut self.client)?;
        let now = self.kernel.sample(&status, &cells);
        let view = rates::between(&self.last, &now);
        self.last = now;
        Ok(view)
    }

    /// The connection, for other requests (`show-cell`).
    pub fn client(&mut self) -> &mut Client {
        &mut self.client
    }
}

/// Runs `tess top`.
pub fn run(a: TopArgs) -> anyhow::Result<i32> {
    let socket = tess_proto::client::socket_path();
    let filter = a.filter.clone().unwrap_or_default();
    if a.once {
        let mut s = Sampler::connect(&socket)?;
        std::thread::sleep(a.interval);
        let mut view = s.refresh()?;
        arrange(&mut view, a.sort, false, &filter);
        if a.json {
            crate::output::json(&view);
        } else if a.screen {
            let mut app = ui::App::new(a.sort, filter);
            app.interval = a.interval;
            app.view = Some(view);
            for line in ui::render_to_buffer(&mut app, 80, 24) {
                println!("{}", line.trim_end());
            }
        } else {
            print!("{}", ui::text(&view));
        }
        return Ok(0);
    }
    if !std::io::stdout().is_terminal() {
        return usage("tess top needs a terminal; for scripts use `tess top --once --json`");
    }
    let sampler = Sampler::connect(&socket)?;
    ui::run(sampler, a.interval, a.sort, filter)?;
    Ok(0)
}

/// How long one refresh takes without a terminal: snapshot, rates, and drawing an 80x24
/// screen (`tess bench observe`'s `top_refresh_ms`).
pub fn time_refresh(sampler: &mut Sampler) -> anyhow::Result<Duration> {
    let t0 = Instant::now();
    let view = sampler.refresh()?;
    let mut app = ui::App::new(SortKey::Name, String::new());
    app.view = Some(view);
    ui::render_to_buffer(&mut app, 80, 24);
    Ok(t0.elapsed())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tess_observe::rates::CellRate;

    pub(super) fn cell(name: &str, used: f64) -> CellRate {
        CellRate {
            name: name.into(),
            policy: "event-triggered".into(),
            harts: vec![1],
            granted_harts: 0.2,
            used_harts: used,
            wait_per_slice_us: Some(12.0),
            involuntary_switches_per_s: 100.0,
            throttled_periods: None,
            throttled_periods_total: None,
            memory_bytes: Some(12 << 20),
            memory_limit_bytes: Some(256 << 20),
            threads: 2,
            runtimes: vec![],
        }
    }

    pub(super) fn view(cells: Vec<CellRate>) -> View {
        View {
            interval_s: 1.0,
            unix_ms: 0,
            utilization_limit: 0.95,
            harts: vec![
                tess_observe::rates::HartRate {
                    hart: 0,
                    granted: 0.05,
                    headroom: 0.9,
                    busy: 0.3,
                    steal: 0.01,
                    managed: true,
                    dedicated_to: None,
                },
                tess_observe::rates::HartRate {
                    hart: 1,
                    granted: 1.0,
                    headroom: 0.0,
                    busy: 1.0,
                    steal: 0.0,
                    managed: true,
                    dedicated_to: Some("synth".into()),
                },
            ],
            cells,
            warnings: vec![],
        }
    }

    #[test]
    fn sorting_puts_the_busiest_first_and_filtering_keeps_matches() {
        let mut v = view(vec![cell("a", 0.1), cell("b", 0.5), cell("audio", 0.3)]);
        arrange(&mut v, SortKey::Used, false, "");
        let names: Vec<&str> = v.cells.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["b", "audio", "a"]);
        arrange(&mut v, SortKey::Name, true, "a");
        let names: Vec<&str> = v.cells.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["audio", "a"]);
    }

    #[test]
    fn the_interval_is_one_to_ten_hertz() {
        assert_eq!(parse_interval("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_interval("10ms").is_err());
        assert!(parse_interval("5s").is_err());
    }
}
