//! `tess bench pulse`: Pulse's costs on one CPU (`tess_pulse::bench`, no tessd needed), and
//! adaptation driven by tessd (issue 13: "from tessd's hart change to the scheduler's adapt
//! returning").
//!
//! The tessd-driven part runs `pulse-cell` (crates/tess-pulse/src/bin/pulse-cell.rs: four
//! spinning threads under GRR) with `tess run` in a 2-hart time-triggered cell (1 ms period,
//! 400 us window, the gang bench's cell), and resizes the cell 2 -> 1 -> 2 harts with
//! `UpdateCell`, what `tess cell resize` sends. Each resize is timed from just before the
//! request, what a user sees, to the scheduler's `adapt` returning in the program (the `t_ns`
//! of its adapt line; both processes read the same `CLOCK_MONOTONIC`):
//!
//! | figure | what |
//! |---|---|
//! | `adapt_tessd_ms`, `adapt_tessd_max_ms` | median and max over all resizes |
//! | `adapt_tessd_shrink_ms`, `adapt_tessd_grow_ms` | medians of 2 -> 1 and of 1 -> 2 |
//! | `adapt_tessd_pulse_ms`, `adapt_tessd_pulse_max_ms` | Pulse's own part: from the hart that read tessd's `Adapt` to `adapt` returning (the program's `adapt_ns` line, printed when the cell is deleted) |
//!
//! A shrink includes tessd's placement and admission before it sends `Adapt`, Pulse's poll (at
//! a hart's next tick or idle wake-up, inside the cell's windows), the hand-over and `adapt`;
//! tessd waits for the acknowledgement, which follows once the retired hart's kernel thread is
//! gone. A growth's `Adapt` is sent before tessd grows the cell in the kernel, so `adapt` may
//! return before the request does. Without a reachable tessd the part is skipped with a note.

use super::support::{tess_exe, Session};
use super::Common;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tess_bench::{Report, Summary, Table};
use tess_core::spec::{CellSpec, HartRequest, Policy};
use tess_proto::{CellUpdate, Request};
use tess_sched::clock;

/// The benchmark's cell.
const CELL: &str = "pulse-bench";

/// Runs the benchmark.
pub fn run(c: &Common) -> anyhow::Result<Report> {
    let o = tess_pulse::bench::BenchOptions {
        quick: c.quick,
        cpu: c.hart,
    };
    let mut r = tess_pulse::bench::run(&o).map_err(|e| anyhow::anyhow!("pulse bench: {e}"))?;
    match in_cell(if c.quick { 6 } else { 40 }) {
        Ok(m) => m.report(&mut r),
        Err(e) => {
            r.note(format!(
                "adaptation driven by tessd not measured: {e:#} (run against a tessd, e.g. scripts/with-tessd)"
            ));
        }
    }
    Ok(r)
}

/// `pulse-cell`: next to this executable (`target/<profile>/`), else on the `PATH`.
fn pulse_cell() -> PathBuf {
    super::support::sibling_exe("pulse-cell")
}

/// The program in the cell, its adapt lines `(new_n, t_ns)` and its final `adapt_ns` line.
struct Program {
    child: Child,
    adapts: mpsc::Receiver<(usize, u64)>,
    pulse_ns: mpsc::Receiver<Vec<u64>>,
}

impl Program {
    fn start() -> anyhow::Result<Program> {
        let prog = pulse_cell();
        let mut child = Command::new(tess_exe())
            .args(["run", "--cell", CELL, "--"])
            .arg(&prog)
            .args(["--threads", "4"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| anyhow::anyhow!("starting {}: {e}", prog.display()))?;
        let out = child.stdout.take().expect("piped");
        let (ready_tx, ready) = mpsc::channel();
        let (tx, adapts) = mpsc::channel();
        let (ns_tx, pulse_ns) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if line.starts_with("vhart 1 runs on") {
                    let _ = ready_tx.send(());
                } else if let Some(a) = parse_adapt(&line) {
                    let _ = tx.send(a);
                } else if let Some(ns) = parse_adapt_ns(&line) {
                    let _ = ns_tx.send(ns);
                }
            }
        });
        if ready.recv_timeout(Duration::from_secs(10)).is_err() {
            anyhow::bail!(
                "{} did not run threads on both harts of cell {CELL} within 10 s",
                prog.display()
            );
        }
        Ok(Program {
            child,
            adapts,
            pulse_ns,
        })
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `adapt(2 -> 1) handed=2 on vhart 0 t_ns=123` -> `(1, 123)`.
fn parse_adapt(line: &str) -> Option<(usize, u64)> {
    let rest = line.strip_prefix("adapt(")?;
    let (counts, rest) = rest.split_once(')')?;
    let new_n = counts.split_once("->")?.1.trim().parse().ok()?;
    let t_ns = rest.split_once("t_ns=")?.1.trim().parse().ok()?;
    Some((new_n, t_ns))
}

/// `adapt_ns=[1, 2]` -> `[1, 2]`.
fn parse_adapt_ns(line: &str) -> Option<Vec<u64>> {
    let list = line.strip_prefix("adapt_ns=[")?.strip_suffix(']')?;
    list.split(',')
        .filter(|x| !x.trim().is_empty())
        .map(|x| x.trim().parse().ok())
        .collect()
}

/// Resize latencies, request to `adapt` returned (ms).
struct Measured {
    shrink_ms: Vec<f64>,
    grow_ms: Vec<f64>,
    /// Pulse's own part of each adaptation, `Adapt` read to `adapt` returned (ms).
    pulse_ms: Vec<f64>,
    /// The resize that was not reported within 5 s, if any.
    lost: Option<usize>,
}

fn in_cell(resizes: usize) -> anyhow::Result<Measured> {
    // Owns the bench cell: deleted when this returns, even on error.
    let mut session = Session::connect()?;
    session.apply(vec![CellSpec {
        name: CELL.into(),
        policy: Policy::TimeTriggered {
            period: Duration::from_millis(1),
            active: Duration::from_micros(400),
            offset: None,
        },
        harts: HartRequest::Count(2),
        memory_max: None,
        pids_max: None,
        pinned: false,
        idle: None,
        broker: Default::default(),
    }])?;
    let program = Program::start()?;
    let mut m = Measured {
        shrink_ms: Vec::new(),
        grow_ms: Vec::new(),
        pulse_ms: Vec::new(),
        lost: None,
    };
    for i in 0..resizes {
        let target = if i % 2 == 0 { 1 } else { 2 };
        let t0 = clock::now_ns();
        session.client.call(&Request::UpdateCell {
            name: CELL.into(),
            update: CellUpdate {
                harts: Some(HartRequest::Count(target)),
                ..Default::default()
            },
        })?;
        let until = Instant::now() + Duration::from_secs(5);
        let t = loop {
            let left = until.saturating_duration_since(Instant::now());
            match program.adapts.recv_timeout(left) {
                Ok((n, t)) if n == target => break Some(t),
                Ok(_) => continue,
                Err(_) => break None,
            }
        };
        let Some(t) = t else {
            m.lost = Some(i);
            break;
        };
        let ms = t.saturating_sub(t0) as f64 / 1e6;
        if target == 1 {
            &mut m.shrink_ms
        } else {
            &mut m.grow_ms
        }
        .push(ms);
        // Let the new hart be placed and settle before the next change.
        std::thread::sleep(Duration::from_millis(20));
    }
    // Deleting the cell makes tessd send Shutdown: the program's run returns and it prints
    // Pulse's own latencies.
    drop(session);
    if let Ok(ns) = program.pulse_ns.recv_timeout(Duration::from_secs(5)) {
        m.pulse_ms = ns.iter().map(|&x| x as f64 / 1e6).collect();
    }
    drop(program);
    Ok(m)
}

impl Measured {
    fn report(&self, r: &mut Report) {
        let all: Vec<f64> = self
            .shrink_ms
            .iter()
            .chain(&self.grow_ms)
            .copied()
            .collect();
        let a = Summary::of(&all);
        let s = Summary::of(&self.shrink_ms);
        let g = Summary::of(&self.grow_ms);
        r.figure("adapt_tessd_ms", a.median);
        r.figure("adapt_tessd_max_ms", a.max);
        r.figure("adapt_tessd_shrink_ms", s.median);
        r.figure("adapt_tessd_grow_ms", g.median);
        let p = Summary::of(&self.pulse_ms);
        if p.count > 0 {
            r.figure("adapt_tessd_pulse_ms", p.median);
            r.figure("adapt_tessd_pulse_max_ms", p.max);
        }
        let mut t = Table::new(
            format!(
                "adaptation driven by tessd: {} resizes of a 2-hart time-triggered cell (1 ms / 400 us), request to adapt returned (ms)",
                all.len()
            ),
            &["resize", "median", "p99", "max", "count"],
        );
        for (name, x) in [
            ("all", &a),
            ("shrink 2 -> 1", &s),
            ("grow 1 -> 2", &g),
            ("Pulse's part: Adapt read -> adapt returned", &p),
        ] {
            t.row(&[
                name.to_string(),
                format!("{:.3}", x.median),
                format!("{:.3}", x.p99),
                format!("{:.3}", x.max),
                x.count.to_string(),
            ]);
        }
        r.table(t);
        r.target(
            "adapt_tessd_ms median < 2",
            a.count > 0 && a.median < 2.0,
            format!("{:.3} ms (max {:.3})", a.median, a.max),
        );
        if p.count == 0 {
            r.note("the program did not report Pulse's own adaptation latencies when its cell was deleted");
        }
        if let Some(i) = self.lost {
            r.note(format!(
                "resize {} was not reported done within 5 s; the tessd-driven figures cover the {i} before it",
                i + 1
            ));
        }
        r.detail("adapt_tessd_ms", a);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_the_adapt_line() {
        assert_eq!(
            super::parse_adapt("adapt(2 -> 1) handed=2 on vhart 0 t_ns=123"),
            Some((1, 123))
        );
        assert_eq!(super::parse_adapt("vhart 1 runs on kernel thread 7"), None);
        assert_eq!(
            super::parse_adapt_ns("adapt_ns=[61234, 48211]"),
            Some(vec![61234, 48211])
        );
        assert_eq!(super::parse_adapt_ns("adapt_ns=[]"), Some(vec![]));
    }
}
