//! `tess trace`: who ran where, cell by cell, as a Chrome / Perfetto trace.
//!
//! The kernel's `sched:sched_switch` tracepoint, recorded in a tracefs instance of our own
//! (`/sys/kernel/tracing/instances/tess-PID`, so that nobody else's tracing is disturbed), says
//! for every context switch which thread left which hart, in what state, and which came in.
//! A switch *from the idle task* is not always recorded (on this kernel, a `SCHED_DEADLINE`
//! thread replenished on an idle hart appears only when it leaves), so a slice's start is taken
//! from `sched:sched_stat_runtime` when the switch in is missing: the CPU time the thread was
//! charged since it last left, counted back from when it leaves.
//! Joined with tessd's threads-to-cells map this gives:
//!
//! - one *process* per cell (`cell synth`), one *thread* track per thread, and a complete event
//!   (`ph: "X"`) for every slice a thread ran: the cell's activations;
//! - one *process* `harts` with a track per hart showing which cell held it;
//! - an instant event (`ph: "i"`) `throttled` whenever a `SCHED_DEADLINE` thread (priority -1)
//!   was switched out while still runnable: its budget ran out (or an earlier deadline arrived;
//!   the tracepoint cannot tell the two apart).
//!
//! - for every event a runtime published while the trace ran (crate `tess-stats`: the
//!   synthesizer's answers, `tess-pd play`'s blocks, Pulse's EDF jobs, gang-window entries, the
//!   network service's packets, the broker's decision periods), a complete event on the thread
//!   that recorded it, named after the runtime and spanning its response time (or, for a gang
//!   window, the vhart's lateness into it), and an instant `missed` when it missed its
//!   deadline. The tracer asks each runtime for them through its page; the runtime then writes
//!   one line per event to this instance's `trace_marker` until the trace ends.
//!
//! The format is the Trace Event Format (`{"traceEvents": [...]}`, times in microseconds) that
//! ui.perfetto.dev and chrome://tracing open.

use serde::Serialize;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// One `sched_switch` record.
#[derive(Debug, Clone, PartialEq)]
pub struct Switch {
    /// Time, seconds (trace clock).
    pub ts_s: f64,
    /// Hart.
    pub hart: usize,
    /// Thread leaving.
    pub prev_pid: i32,
    /// Its name.
    pub prev_comm: String,
    /// Its kernel priority (-1: `SCHED_DEADLINE`).
    pub prev_prio: i32,
    /// Its state (`R`, `R+`: still runnable, i.e. preempted or throttled; `S`, `D`: blocked).
    pub prev_state: String,
    /// Thread coming in.
    pub next_pid: i32,
    /// Its name.
    pub next_comm: String,
}

/// One record the trace uses.
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    /// A context switch.
    Switch(Switch),
    /// CPU time charged to a thread (`sched_stat_runtime`).
    Runtime {
        /// Thread.
        pid: i32,
        /// Time charged, ns.
        runtime_ns: u64,
    },
    /// A runtime's event, written to the instance's `trace_marker` when it was recorded.
    Mark(Mark),
}

/// One runtime event (`tess-stats NAME RESPONSE_NS MISSED` in the trace marker).
#[derive(Debug, Clone, PartialEq)]
pub struct Mark {
    /// When it was recorded (its end), seconds.
    pub ts_s: f64,
    /// The thread that recorded it.
    pub tid: i32,
    /// The runtime (`synth`, `pd`, `pulse-edf`, `gang-window`, ...).
    pub runtime: String,
    /// Its response time, ns.
    pub response_ns: u64,
    /// Whether it missed its deadline.
    pub missed: bool,
}

/// Parses a runtime's marker line.
///
/// ```text
///            synth-4242    [001] ..... 12345.678901: tracing_mark_write: tess-stats synth 700000 0
/// ```
pub fn parse_mark(line: &str) -> Option<Mark> {
    let (head, body) = line.split_once(": tracing_mark_write: tess-stats ")?;
    let (task, _, ts_s) = parse_head(head)?;
    let tid = task.rsplit_once('-')?.1.parse().ok()?;
    let mut f = body.split_whitespace();
    Some(Mark {
        ts_s,
        tid,
        runtime: f.next()?.to_string(),
        response_ns: f.next()?.parse().ok()?,
        missed: f.next()? == "1",
    })
}

/// Parses one line of the `trace` file into a [`Record`] (`None` for other lines).
pub fn parse_record(line: &str) -> Option<Record> {
    if let Some(s) = parse_switch(line) {
        return Some(Record::Switch(s));
    }
    if let Some(m) = parse_mark(line) {
        return Some(Record::Mark(m));
    }
    let (_, body) = line.split_once(": sched_stat_runtime: ")?;
    Some(Record::Runtime {
        pid: field(body, "pid", None)?.parse().ok()?,
        runtime_ns: field(body, "runtime", None)?.parse().ok()?,
    })
}

/// The value after `key=` up to the next ` word=` (names may hold spaces).
fn field<'a>(text: &'a str, key: &str, next: Option<&str>) -> Option<&'a str> {
    let start = text.find(&format!("{key}="))? + key.len() + 1;
    let rest = &text[start..];
    let end = match next {
        Some(n) => rest.find(&format!(" {n}="))?,
        None => rest.find(' ').unwrap_or(rest.len()),
    };
    Some(&rest[..end])
}

/// The part of a `trace` line before the event name: the task (`comm-tid`), the hart in
/// brackets, flags, and the time in seconds.
fn parse_head(head: &str) -> Option<(&str, usize, f64)> {
    let open = head.rfind('[')?;
    let close = head[open..].find(']')? + open;
    let hart = head[open + 1..close].trim().parse().ok()?;
    let ts_s = head
        .rsplit(' ')
        .next()?
        .trim_end_matches(':')
        .parse()
        .ok()?;
    Some((head[..open].trim(), hart, ts_s))
}

/// Parses one line of tracefs' `trace` file; `None` for anything but a `sched_switch`.
///
/// ```text
///           <idle>-0       [001] d..2. 12345.678901: sched_switch: prev_comm=swapper/1 prev_pid=0 prev_prio=120 prev_state=R ==> next_comm=sh next_pid=1234 next_prio=-1
/// ```
pub fn parse_switch(line: &str) -> Option<Switch> {
    let (head, body) = line.split_once(": sched_switch: ")?;
    let (_, hart, ts_s) = parse_head(head)?;
    let (prev, next) = body.split_once(" ==> ")?;
    Some(Switch {
        ts_s,
        hart,
        prev_comm: field(prev, "prev_comm", Some("prev_pid"))?.to_string(),
        prev_pid: field(prev, "prev_pid", None)?.parse().ok()?,
        prev_prio: field(prev, "prev_prio", None)?.parse().ok()?,
        prev_state: field(prev, "prev_state", None)?.to_string(),
        next_comm: field(next, "next_comm", Some("next_pid"))?.to_string(),
        next_pid: field(next, "next_pid", None)?.parse().ok()?,
    })
}

/// Whether the leaving thread was still runnable (preempted or throttled, not blocked).
fn still_runnable(state: &str) -> bool {
    state.starts_with('R')
}

/// Trace statistics, printed by `tess trace`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Summary {
    /// Context switches read.
    pub switches: usize,
    /// Run slices of cell threads.
    pub cell_slices: usize,
    /// Throttling (or deadline preemption) events of `SCHED_DEADLINE` cell threads.
    pub throttles: usize,
    /// Per cell: run slices, CPU seconds and throttles.
    pub cells: BTreeMap<String, CellTotals>,
    /// Events runtimes published while the trace ran (on threads of cells).
    pub runtime_events: usize,
    /// Those that missed their deadline.
    pub runtime_misses: usize,
}

/// One cell's totals over the trace.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CellTotals {
    /// Run slices.
    pub slices: usize,
    /// CPU seconds.
    pub cpu_s: f64,
    /// Throttles.
    pub throttles: usize,
}

/// Process id of the `harts` process in the trace (cells get 1, 2, ...).
const HARTS_PID: u64 = 0;

/// Builds the Chrome trace from records in time order; `cells` maps a thread id to its cell.
pub fn chrome_trace(records: &[Record], cells: &HashMap<i32, String>) -> (Value, Summary) {
    let switches: Vec<&Switch> = records
        .iter()
        .filter_map(|r| match r {
            Record::Switch(s) => Some(s),
            Record::Runtime { .. } | Record::Mark(_) => None,
        })
        .collect();
    let mut names: Vec<&String> = cells.values().collect();
    names.sort();
    names.dedup();
    let pid_of: HashMap<&str, u64> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), i as u64 + 1))
        .collect();
    let mut events = Vec::new();
    let mut summary = Summary {
        switches: switches.len(),
        ..Summary::default()
    };
    events.push(json!({"ph": "M", "name": "process_name", "pid": HARTS_PID, "tid": 0, "args": {"name": "harts"}}));
    for (name, pid) in &pid_of {
        events.push(json!({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": format!("cell {name}")}}));
    }
    let mut named_threads: HashMap<i32, ()> = HashMap::new();
    let mut named_harts: HashMap<usize, ()> = HashMap::new();
    // Per hart: the cell thread seen switching in, and when.
    let mut running: HashMap<usize, (i32, f64)> = HashMap::new();
    // Per cell thread: CPU time charged since it last left a hart, ns.
    let mut charged: HashMap<i32, u64> = HashMap::new();
    let t0 = switches.first().map_or(0.0, |s| s.ts_s);
    let us = |t: f64| (t - t0) * 1e6;
    for r in records {
        let s = match r {
            Record::Runtime { pid, runtime_ns } => {
                if cells.contains_key(pid) {
                    *charged.entry(*pid).or_default() += runtime_ns;
                }
                continue;
            }
            Record::Mark(m) => {
                let Some(cell) = cells.get(&m.tid) else {
                    continue;
                };
                let pid = pid_of[cell.as_str()];
                let dur = m.response_ns as f64 / 1e3;
                let end = us(m.ts_s);
                events.push(json!({"ph": "X", "name": m.runtime, "cat": "runtime", "pid": pid, "tid": m.tid, "ts": (end - dur).max(0.0), "dur": dur.min(end.max(0.0)), "args": {"response_us": dur, "missed": m.missed}}));
                if m.missed {
                    events.push(json!({"ph": "i", "s": "t", "name": "missed", "cat": "miss", "pid": pid, "tid": m.tid, "ts": end, "args": {"runtime": m.runtime, "response_us": dur}}));
                    summary.runtime_misses += 1;
                }
                summary.runtime_events += 1;
                continue;
            }
            Record::Switch(s) => s,
        };
        if named_harts.insert(s.hart, ()).is_none() {
            events.push(json!({"ph": "M", "name": "thread_name", "pid": HARTS_PID, "tid": s.hart, "args": {"name": format!("hart {}", s.hart)}}));
        }
        let seen_in = running
            .remove(&s.hart)
            .filter(|(tid, _)| *tid == s.prev_pid)
            .map(|(_, since)| since);
        let charged_ns = charged.remove(&s.prev_pid).unwrap_or(0);
        let since = seen_in
            .or_else(|| (charged_ns > 0).then(|| (s.ts_s - charged_ns as f64 / 1e9).max(t0)));
        if let (Some(since), Some(cell)) = (since, cells.get(&s.prev_pid)) {
            let tid = s.prev_pid;
            let pid = pid_of[cell.as_str()];
            let dur = us(s.ts_s) - us(since);
            events.push(json!({"ph": "X", "name": cell, "cat": "run", "pid": pid, "tid": tid, "ts": us(since), "dur": dur, "args": {"hart": s.hart}}));
            events.push(json!({"ph": "X", "name": cell, "cat": "hart", "pid": HARTS_PID, "tid": s.hart, "ts": us(since), "dur": dur, "args": {"tid": tid}}));
            if named_threads.insert(tid, ()).is_none() {
                events.push(json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": format!("{} ({tid})", s.prev_comm)}}));
            }
            let totals = summary.cells.entry(cell.clone()).or_default();
            totals.slices += 1;
            totals.cpu_s += dur / 1e6;
            summary.cell_slices += 1;
            if s.prev_prio == -1 && still_runnable(&s.prev_state) {
                events.push(json!({"ph": "i", "s": "t", "name": "throttled", "cat": "throttle", "pid": pid, "tid": tid, "ts": us(s.ts_s), "args": {"hart": s.hart, "state": s.prev_state, "note": "SCHED_DEADLINE thread switched out while runnable: budget exhausted, or an earlier deadline arrived"}}));
                totals.throttles += 1;
                summary.throttles += 1;
            }
        }
        if let Some(cell) = cells.get(&s.next_pid) {
            running.insert(s.hart, (s.next_pid, s.ts_s));
            if named_threads.insert(s.next_pid, ()).is_none() {
                let pid = pid_of[cell.as_str()];
                events.push(json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": s.next_pid, "args": {"name": format!("{} ({})", s.next_comm, s.next_pid)}}));
            }
        }
    }
    (
        json!({"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"source": "tess trace: sched_switch from tracefs, threads mapped to cells by tessd"}}),
        summary,
    )
}

/// A tracefs instance of our own, removed when dropped.
#[derive(Debug)]
pub struct Instance {
    dir: PathBuf,
}

/// Where tracefs is (mounted there if it is not yet).
pub const TRACEFS: &str = "/sys/kernel/tracing";

fn write(path: &Path, value: &str) -> anyhow::Result<()> {
    std::fs::write(path, value)
        .map_err(|e| anyhow::anyhow!("failed to write {value:?} to {}: {e}", path.display()))
}

impl Instance {
    /// Creates `instances/tess-PID` with a ring buffer of `buffer_kb` per hart, recording
    /// `sched_switch` (not yet enabled).
    pub fn create(buffer_kb: usize) -> anyhow::Result<Instance> {
        let root = Path::new(TRACEFS);
        if !root.join("instances").exists() {
            let c = std::ffi::CString::new(TRACEFS).expect("no NUL");
            let t = std::ffi::CString::new("tracefs").expect("no NUL");
            // SAFETY: valid NUL-terminated strings; a null data pointer means no options.
            let rc =
                unsafe { libc::mount(t.as_ptr(), c.as_ptr(), t.as_ptr(), 0, std::ptr::null()) };
            anyhow::ensure!(
                rc == 0,
                "tracefs is not mounted at {TRACEFS} and mounting it failed: {} (tess trace needs root)",
                std::io::Error::last_os_error()
            );
        }
        let dir = root
            .join("instances")
            .join(format!("tess-{}", std::process::id()));
        std::fs::create_dir(&dir).map_err(|e| {
            anyhow::anyhow!(
                "cannot create the tracefs instance {}: {e} (tess trace needs root)",
                dir.display()
            )
        })?;
        let inst = Instance { dir };
        write(&inst.dir.join("buffer_size_kb"), &buffer_kb.to_string())?;
        write(&inst.dir.join("events/sched/sched_switch/enable"), "1")?;
        write(
            &inst.dir.join("events/sched/sched_stat_runtime/enable"),
            "1",
        )?;
        Ok(inst)
    }

    /// Starts recording.
    pub fn start(&self) -> anyhow::Result<()> {
        write(&self.dir.join("trace"), "")?;
        write(&self.dir.join("tracing_on"), "1")
    }

    /// Stops recording and returns the records, in time order.
    pub fn stop(&self) -> anyhow::Result<Vec<Record>> {
        write(&self.dir.join("tracing_on"), "0")?;
        let text = std::fs::read_to_string(self.dir.join("trace"))?;
        Ok(text.lines().filter_map(parse_record).collect())
    }

    /// Records for `d`; the runtimes publishing now (crate `tess-stats`) write their events
    /// to this instance's `trace_marker` meanwhile.
    pub fn record(&self, d: Duration) -> anyhow::Result<Vec<Record>> {
        let pages = tess_stats::pages(&tess_stats::default_dir());
        self.start()?;
        let me = std::process::id();
        let asked: Vec<_> = pages
            .iter()
            .filter(|p| tess_stats::request_trace(&p.path, me).is_ok())
            .collect();
        std::thread::sleep(d);
        for p in asked {
            let _ = tess_stats::request_trace(&p.path, 0);
        }
        self.stop()
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = std::fs::write(self.dir.join("tracing_on"), "0");
        if let Err(e) = std::fs::remove_dir(&self.dir) {
            eprintln!("tess: could not remove {}: {e}", self.dir.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
# tracer: nop
            bash-1200    [001] d..2.   100.000000: sched_switch: prev_comm=bash prev_pid=1200 prev_prio=120 prev_state=S ==> next_comm=sh x next_pid=42 next_prio=-1
            sh x-42      [001] d..2.   100.002000: sched_switch: prev_comm=sh x prev_pid=42 prev_prio=-1 prev_state=R+ ==> next_comm=swapper/1 next_pid=0 next_prio=120
          <idle>-0       [001] d..2.   100.010000: sched_switch: prev_comm=swapper/1 prev_pid=0 prev_prio=120 prev_state=R ==> next_comm=sh x next_pid=42 next_prio=-1
            sh x-42      [001] d..2.   100.011000: sched_switch: prev_comm=sh x prev_pid=42 prev_prio=-1 prev_state=S ==> next_comm=swapper/1 next_pid=0 next_prio=120
";

    fn switches() -> Vec<Switch> {
        TEXT.lines().filter_map(parse_switch).collect()
    }

    fn records(text: &str) -> Vec<Record> {
        text.lines().filter_map(parse_record).collect()
    }

    #[test]
    fn switch_lines_parse_with_spaces_in_names() {
        let s = switches();
        assert_eq!(s.len(), 4);
        assert_eq!(s[0].hart, 1);
        assert_eq!(s[0].next_comm, "sh x");
        assert_eq!(s[1].prev_pid, 42);
        assert_eq!(s[1].prev_prio, -1);
        assert_eq!(s[1].prev_state, "R+");
        assert!((s[1].ts_s - 100.002).abs() < 1e-9);
    }

    #[test]
    fn slices_become_complete_events_and_runnable_exits_throttles() {
        let cells = HashMap::from([(42, "synth".to_string())]);
        let (trace, sum) = chrome_trace(&records(TEXT), &cells);
        assert_eq!(sum.cell_slices, 2);
        assert_eq!(sum.throttles, 1, "only the exit while runnable");
        assert!((sum.cells["synth"].cpu_s - 0.003).abs() < 1e-9);
        let ev = trace["traceEvents"].as_array().unwrap();
        let runs: Vec<&Value> = ev
            .iter()
            .filter(|e| e["ph"] == "X" && e["cat"] == "run")
            .collect();
        assert_eq!(runs.len(), 2);
        assert_eq!(runs[0]["ts"], 0.0);
        assert!((runs[0]["dur"].as_f64().unwrap() - 2000.0).abs() < 1e-3);
        assert!(ev
            .iter()
            .any(|e| e["ph"] == "M" && e["args"]["name"] == "cell synth"));
        assert!(ev
            .iter()
            .any(|e| e["ph"] == "i" && e["name"] == "throttled"));
    }

    #[test]
    fn runtime_events_become_spans_and_misses_on_their_threads() {
        let text = "\
            bash-1200    [001] d..2.   100.000000: sched_switch: prev_comm=bash prev_pid=1200 prev_prio=120 prev_state=S ==> next_comm=sh x next_pid=42 next_prio=-1
            sh x-42      [001] .....   100.001000: tracing_mark_write: tess-stats synth 700000 0
            sh x-42      [001] .....   100.003000: tracing_mark_write: tess-stats synth 1600000 1
           other-7       [000] .....   100.003500: tracing_mark_write: tess-stats pd 10000 1
";
        let m = parse_mark(text.lines().nth(1).unwrap()).unwrap();
        assert_eq!(
            (m.tid, m.runtime.as_str(), m.response_ns, m.missed),
            (42, "synth", 700_000, false)
        );
        let cells = HashMap::from([(42, "synth".to_string())]);
        let (trace, sum) = chrome_trace(&records(text), &cells);
        // Thread 7 is in no cell: its event is not shown.
        assert_eq!((sum.runtime_events, sum.runtime_misses), (2, 1));
        let ev = trace["traceEvents"].as_array().unwrap();
        let spans: Vec<&Value> = ev.iter().filter(|e| e["cat"] == "runtime").collect();
        assert_eq!(spans.len(), 2);
        // The second answer ended at 3000 us and took 1600 us.
        assert!(
            (spans[1]["ts"].as_f64().unwrap() - 1400.0).abs() < 1e-6,
            "{}",
            spans[1]
        );
        assert!((spans[1]["dur"].as_f64().unwrap() - 1600.0).abs() < 1e-6);
        assert!(ev.iter().any(|e| e["name"] == "missed" && e["tid"] == 42));
    }

    #[test]
    fn an_untraced_switch_in_is_dated_by_the_charged_runtime() {
        // As recorded on hart 1: the thread's switch in from idle is missing, its ticks are not.
        let text = "\
     bash-1   [000] d..2.   50.000000: sched_switch: prev_comm=bash prev_pid=1 prev_prio=120 prev_state=S ==> next_comm=x next_pid=2 next_prio=120
       sh-42  [001] d.h1.   50.004000: sched_stat_runtime: comm=sh pid=42 runtime=1000000 [ns]
       sh-42  [001] d.h1.   50.008000: sched_stat_runtime: comm=sh pid=42 runtime=4000000 [ns]
       sh-42  [001] d..2.   50.008010: sched_switch: prev_comm=sh prev_pid=42 prev_prio=-1 prev_state=R ==> next_comm=swapper/1 next_pid=0 next_prio=120
";
        let cells = HashMap::from([(42, "synth".to_string())]);
        let (trace, sum) = chrome_trace(&records(text), &cells);
        assert_eq!(sum.cell_slices, 1);
        assert_eq!(sum.throttles, 1);
        let run = trace["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["cat"] == "run")
            .unwrap()
            .clone();
        assert!(
            (run["dur"].as_f64().unwrap() - 5000.0).abs() < 1e-3,
            "{run}"
        );
        assert!((run["ts"].as_f64().unwrap() - 3010.0).abs() < 1e-3, "{run}");
    }
}
