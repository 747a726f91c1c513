//! The terminal UI of `tess top` (ratatui on crossterm), and its plain-text twin for `--once`.
//!
//! Screen, top to bottom, sized for 80x24 and up:
//! - one status line: cells, interval, sort, filter;
//! - one bar per hart (at most a third of the screen): busy, granted by admission, headroom;
//! - the cell table, one row per cell, the selected row highlighted;
//! - one line of keys.
//!
//! `Enter` opens the selected cell (tessd's `show-cell`: threads and how each is scheduled).

use super::{arrange, Sampler, SortKey};
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Paragraph, Row, Table, TableState, Wrap};
use ratatui::Frame;
use std::time::{Duration, Instant};
use tess_core::units::format_bytes;
use tess_observe::rates::{CellRate, HartRate, View};
use tess_proto::{Body, Request};

/// What the screen shows.
#[derive(Debug)]
pub struct App {
    /// The latest view, arranged.
    pub view: Option<View>,
    /// Sort column.
    pub sort: SortKey,
    /// Sort order flipped.
    pub reverse: bool,
    /// Name filter.
    pub filter: String,
    /// Typing a filter.
    pub editing: bool,
    /// Selected row.
    pub table: TableState,
    /// The opened cell's details.
    pub detail: Option<(String, Vec<String>)>,
    /// The last error (tessd went away), shown in the status line.
    pub error: Option<String>,
    /// Refresh interval.
    pub interval: Duration,
}

impl App {
    /// A screen with nothing measured yet.
    pub fn new(sort: SortKey, filter: String) -> App {
        App {
            view: None,
            sort,
            reverse: false,
            filter,
            editing: false,
            table: TableState::default().with_selected(Some(0)),
            detail: None,
            error: None,
            interval: Duration::from_secs(1),
        }
    }

    fn selected_cell(&self) -> Option<String> {
        let v = self.view.as_ref()?;
        v.cells.get(self.table.selected()?).map(|c| c.name.clone())
    }
}

fn policy_short(p: &str) -> &'static str {
    match p {
        "dedicated" => "ded",
        "time-triggered" => "tt",
        "event-triggered" => "et",
        "best-effort" => "be",
        _ => "?",
    }
}

fn harts_text(h: &[usize]) -> String {
    let mut set = tess_sched::HartSet::new();
    for &x in h {
        set.insert(x);
    }
    set.to_string()
}

fn mem_text(c: &CellRate) -> String {
    match (c.memory_bytes, c.memory_limit_bytes) {
        (Some(u), Some(l)) => format!("{}/{}", format_bytes(u), format_bytes(l)),
        (Some(u), None) => format_bytes(u),
        (None, Some(l)) => format!("-/{}", format_bytes(l)),
        (None, None) => "-".into(),
    }
}

/// The cell table's columns: header and text of each cell.
const HEADERS: [&str; 11] = [
    "NAME", "POL", "HARTS", "GRANT", "USED", "WAIT", "PRE/s", "MISS", "P99", "THR", "MEM",
];

/// A time in us as at most 6 characters: `850us`, `12.3ms`, `4.1s`.
fn short_time(us: f64) -> String {
    if us < 1e4 {
        format!("{us:.0}us")
    } else if us < 1e6 {
        format!("{:.1}ms", us / 1e3)
    } else {
        format!("{:.1}s", us / 1e6)
    }
}

fn cell_columns(c: &CellRate) -> [String; 11] {
    [
        c.name.clone(),
        policy_short(&c.policy).into(),
        harts_text(&c.harts),
        format!("{:.2}", c.granted_harts),
        format!("{:.2}", c.used_harts),
        c.wait_per_slice_us
            .map_or("-".into(), |w| format!("{w:.0}us")),
        format!("{:.0}", c.involuntary_switches_per_s),
        c.misses().map_or("-".into(), |m| m.to_string()),
        c.p99_us().map_or("-".into(), short_time),
        c.throttled_periods.map_or("-".into(), |t| t.to_string()),
        mem_text(c),
    ]
}

fn hart_line(h: &HartRate, width: u16) -> Line<'static> {
    // "h0 [||||||....] busy 30% grant 5% room 90% (ded synth)"
    let label = format!("h{:<3}", h.hart);
    let tail = match &h.dedicated_to {
        Some(c) => format!(" busy{:>4.0}% dedicated to {c}", h.busy * 100.0),
        None if !h.managed => format!(" busy{:>4.0}% (not managed)", h.busy * 100.0),
        None => format!(
            " busy{:>4.0}% grant{:>4.0}% room{:>4.0}%",
            h.busy * 100.0,
            h.granted * 100.0,
            h.headroom * 100.0
        ),
    };
    let bar_w = (width as usize)
        .saturating_sub(label.len() + tail.len() + 2)
        .clamp(4, 60);
    let busy = ((h.busy * bar_w as f64).round() as usize).min(bar_w);
    let granted = ((h.granted * bar_w as f64).round() as usize).min(bar_w);
    let mut bar = String::with_capacity(bar_w);
    for i in 0..bar_w {
        bar.push(if i < busy {
            '|'
        } else if i < granted {
            ':'
        } else {
            '.'
        });
    }
    let color = if h.busy > 0.9 {
        Color::Red
    } else if h.busy > 0.6 {
        Color::Yellow
    } else {
        Color::Green
    };
    Line::from(vec![
        Span::raw(label),
        Span::raw("["),
        Span::styled(bar, Style::default().fg(color)),
        Span::raw("]"),
        Span::raw(tail),
    ])
}

/// Draws the whole screen.
pub fn draw(f: &mut Frame<'_>, app: &mut App) {
    let area = f.area();
    let harts = app.view.as_ref().map_or(0, |v| v.harts.len()) as u16;
    let hart_rows = harts.min((area.height / 3).max(1));
    let [status, bars, table, keys] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(hart_rows),
        Constraint::Min(3),
        Constraint::Length(1),
    ])
    .areas(area);

    let mut head = match &app.view {
        Some(v) => format!(
            "tess top: {} cells, every {} ms, sort {:?}{}",
            v.cells.len(),
            app.interval.as_millis(),
            app.sort,
            if app.reverse { " (reversed)" } else { "" }
        ),
        None => "tess top: waiting for the first interval...".into(),
    };
    if app.editing || !app.filter.is_empty() {
        head.push_str(&format!(", filter /{}", app.filter));
        if app.editing {
            head.push('_');
        }
    }
    if let Some(e) = &app.error {
        head = format!("tessd: {e}");
    }
    f.render_widget(
        Paragraph::new(head).style(Style::default().add_modifier(Modifier::BOLD)),
        status,
    );

    if let Some(v) = &app.view {
        let lines: Vec<Line<'_>> = v
            .harts
            .iter()
            .take(hart_rows as usize)
            .map(|h| hart_line(h, bars.width))
            .collect();
        f.render_widget(Paragraph::new(lines), bars);

        let rows = v.cells.iter().map(|c| {
            let over = c.granted_harts > 0.0 && c.used_harts > c.granted_harts * 1.05;
            let style = if over {
                Style::default().fg(Color::Yellow)
            } else {
                Style::default()
            };
            Row::new(cell_columns(c)).style(style)
        });
        let widths = [
            Constraint::Min(8),
            Constraint::Length(3),
            Constraint::Length(5),
            Constraint::Length(5),
            Constraint::Length(5),
            Constraint::Length(7),
            Constraint::Length(6),
            Constraint::Length(5),
            Constraint::Length(6),
            Constraint::Length(4),
            Constraint::Length(12),
        ];
        let t = Table::new(rows, widths)
            .header(Row::new(HEADERS).style(Style::default().add_modifier(Modifier::REVERSED)))
            .row_highlight_style(
                Style::default().add_modifier(Modifier::BOLD | Modifier::REVERSED),
            );
        f.render_stateful_widget(t, table, &mut app.table);
    }

    f.render_widget(
        Paragraph::new("q quit  s sort  r reverse  / filter  Enter open  +/- speed")
            .style(Style::default().fg(Color::DarkGray)),
        keys,
    );

    if let Some((name, lines)) = &app.detail {
        let popup = centered(area, 90, 80);
        f.render_widget(Clear, popup);
        let text: Vec<Line<'_>> = lines.iter().map(|l| Line::raw(l.as_str())).collect();
        f.render_widget(
            Paragraph::new(text)
                .wrap(Wrap { trim: false })
                .block(Block::bordered().title(format!(" cell {name} (Esc back) "))),
            popup,
        );
    }
}

fn centered(area: Rect, pct_w: u16, pct_h: u16) -> Rect {
    let w = area.width * pct_w / 100;
    let h = area.height * pct_h / 100;
    Rect {
        x: area.x + (area.width - w) / 2,
        y: area.y + (area.height - h) / 2,
        width: w,
        height: h,
    }
}

/// The details of one cell, from tessd.
fn details(sampler: &mut Sampler, view: Option<&View>, name: &str) -> Vec<String> {
    let runtimes: Vec<String> = view
        .and_then(|v| v.cells.iter().find(|c| c.name == name))
        .map(|c| {
            c.runtimes
                .iter()
                .map(|r| {
                    let bytes = if r.bytes_per_s > 0.0 {
                        format!("  {}/s", format_bytes(r.bytes_per_s as u64))
                    } else {
                        String::new()
                    };
                    format!(
                        "  {:<12} pid {:<7} {:>7.0}/s{bytes}  missed {} ({} in all)  p99 {}  deadline {}",
                        r.name,
                        r.pid,
                        r.events_per_s,
                        r.misses,
                        r.misses_total,
                        r.p99_us.map_or("-".into(), short_time),
                        r.deadline_us.map_or("per event".into(), short_time),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let mut lines = cell_lines(sampler, name);
    if !runtimes.is_empty() {
        lines.push("runtimes (over the last refresh):".into());
        lines.extend(runtimes);
    }
    lines
}

fn cell_lines(sampler: &mut Sampler, name: &str) -> Vec<String> {
    match sampler
        .client()
        .call(&Request::ShowCell { name: name.into() })
    {
        Ok(Body::Cell(c)) => {
            let mut l = vec![
                format!("policy   {}", crate::output::policy(&c)),
                format!("harts    {} (asked {:?})", c.harts, c.request),
                format!(
                    "memory   {}",
                    c.memory_max.map_or("no limit".into(), format_bytes)
                ),
                format!(
                    "tasks    {}",
                    c.pids_max.map_or("no limit".into(), |p| p.to_string())
                ),
                format!("cgroup   {}", c.cgroup),
                format!("procs    {:?}", c.processes),
                format!("threads  {}:", c.threads.len()),
            ];
            l.extend(c.threads.iter().map(|t| {
                format!(
                    "  {:>7} on {:<6} {}",
                    t.tid,
                    t.affinity.to_string(),
                    t.sched
                )
            }));
            l
        }
        Ok(other) => vec![format!("unexpected reply {other:?}")],
        Err(e) => vec![format!("{e}")],
    }
}

/// Runs the interactive screen until `q`.
pub fn run(
    mut sampler: Sampler,
    interval: Duration,
    sort: SortKey,
    filter: String,
) -> anyhow::Result<()> {
    let mut terminal = ratatui::init();
    let mut app = App::new(sort, filter);
    app.interval = interval;
    let result = (|| -> anyhow::Result<()> {
        let mut next = Instant::now();
        loop {
            if Instant::now() >= next {
                match sampler.refresh() {
                    Ok(mut v) => {
                        arrange(&mut v, app.sort, app.reverse, &app.filter);
                        let n = v.cells.len();
                        app.view = Some(v);
                        app.error = None;
                        let sel = app.table.selected().unwrap_or(0).min(n.saturating_sub(1));
                        app.table.select(Some(sel));
                    }
                    Err(e) => app.error = Some(format!("{e:#}")),
                }
                next = Instant::now() + app.interval;
            }
            terminal.draw(|f| draw(f, &mut app))?;
            let wait = next.saturating_duration_since(Instant::now());
            if !event::poll(wait)? {
                continue;
            }
            let Event::Key(k) = event::read()? else {
                continue;
            };
            if k.kind != KeyEventKind::Press {
                continue;
            }
            if app.editing {
                match k.code {
                    KeyCode::Enter => app.editing = false,
                    KeyCode::Esc => {
                        app.editing = false;
                        app.filter.clear();
                    }
                    KeyCode::Backspace => {
                        app.filter.pop();
                    }
                    KeyCode::Char(c) => app.filter.push(c),
                    _ => {}
                }
                rearrange(&mut app);
                continue;
            }
            match k.code {
                KeyCode::Char('q') => return Ok(()),
                KeyCode::Esc if app.detail.is_some() => app.detail = None,
                KeyCode::Esc => return Ok(()),
                KeyCode::Char('s') => {
                    app.sort = app.sort.next();
                    rearrange(&mut app);
                }
                KeyCode::Char('r') => {
                    app.reverse = !app.reverse;
                    rearrange(&mut app);
                }
                KeyCode::Char('/') => app.editing = true,
                KeyCode::Down | KeyCode::Char('j') => app.table.select_next(),
                KeyCode::Up | KeyCode::Char('k') => app.table.select_previous(),
                KeyCode::Enter => {
                    if let Some(name) = app.selected_cell() {
                        let lines = details(&mut sampler, app.view.as_ref(), &name);
                        app.detail = Some((name, lines));
                    }
                }
                KeyCode::Char('+') => {
                    app.interval = (app.interval / 2).max(Duration::from_millis(100))
                }
                KeyCode::Char('-') => app.interval = (app.interval * 2).min(Duration::from_secs(1)),
                _ => {}
            }
        }
    })();
    ratatui::restore();
    result
}

/// Re-sorts and re-filters the current view without waiting for the next refresh. (Cells
/// filtered out come back at the next refresh if the filter lets them.)
fn rearrange(app: &mut App) {
    if let Some(v) = app.view.as_mut() {
        arrange(v, app.sort, app.reverse, &app.filter);
    }
}

/// Draws the screen into an off-screen buffer of `width` x `height` and returns its text, one
/// line per row (what a terminal of that size would show).
pub fn render_to_buffer(app: &mut App, width: u16, height: u16) -> Vec<String> {
    let backend = ratatui::backend::TestBackend::new(width, height);
    let mut term = ratatui::Terminal::new(backend).expect("an in-memory terminal");
    term.draw(|f| draw(f, app)).expect("drawing in memory");
    let buf = term.backend().buffer();
    (0..height)
        .map(|y| {
            (0..width)
                .map(|x| buf[(x, y)].symbol().to_string())
                .collect::<String>()
        })
        .collect()
}

/// The `--once` table: harts, then cells.
pub fn text(v: &View) -> String {
    let mut out = String::new();
    let mut t = tess_bench::Table::new(
        "",
        &["HART", "BUSY", "STEAL", "GRANTED", "HEADROOM", "DEDICATED"],
    );
    for h in &v.harts {
        t.row(&[
            h.hart.to_string(),
            format!("{:.0}%", h.busy * 100.0),
            format!("{:.0}%", h.steal * 100.0),
            format!("{:.0}%", h.granted * 100.0),
            format!("{:.0}%", h.headroom * 100.0),
            h.dedicated_to.clone().unwrap_or_else(|| "-".into()),
        ]);
    }
    out.push_str(&t.render());
    out.push('\n');
    let mut t = tess_bench::Table::new("", &HEADERS);
    for c in &v.cells {
        t.row(&cell_columns(c));
    }
    out.push_str(&t.render());
    out.push_str(&format!("(over {:.2} s)\n", v.interval_s));
    out
}

#[cfg(test)]
mod tests {
    use super::super::tests::{cell, view};
    use super::*;

    #[test]
    fn an_80x24_screen_shows_harts_and_every_cell_that_fits() {
        let mut app = App::new(SortKey::Name, String::new());
        let cells: Vec<CellRate> = (0..30)
            .map(|i| cell(&format!("cell-{i:02}"), 0.1))
            .collect();
        app.view = Some(view(cells));
        let screen = render_to_buffer(&mut app, 80, 24);
        assert_eq!(screen.len(), 24);
        let all = screen.join("\n");
        assert!(all.contains("tess top: 30 cells"), "{all}");
        assert!(
            all.contains("h0") && all.contains("dedicated to synth"),
            "{all}"
        );
        assert!(all.contains("NAME") && all.contains("MEM"), "{all}");
        assert!(all.contains("cell-00") && all.contains("12M/256M"), "{all}");
        assert!(screen[23].contains("q quit"), "{all}");
    }

    #[test]
    fn an_opened_cell_covers_the_table() {
        let mut app = App::new(SortKey::Name, String::new());
        app.view = Some(view(vec![cell("synth", 0.2)]));
        app.detail = Some(("synth".into(), vec!["policy   et".into()]));
        let all = render_to_buffer(&mut app, 80, 24).join("\n");
        assert!(all.contains("cell synth (Esc back)"), "{all}");
    }

    #[test]
    fn the_once_table_has_a_row_per_cell() {
        let t = text(&view(vec![cell("a", 0.1), cell("b", 0.2)]));
        assert!(t.contains("HEADROOM"), "{t}");
        assert!(t.lines().any(|l| l.trim_start().starts_with("b ")), "{t}");
    }
}
