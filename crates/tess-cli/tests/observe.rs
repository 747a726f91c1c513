//! Observability against a private tessd: the Prometheus endpoint (checked by `promtool`),
//! `tess top --once --json`, `tess trace` and the web dashboard.

mod common;

use common::{outcome, Daemon};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tess_testkit::Reaper;

/// Two cells: a reservation running a busy loop, and a best-effort cell with a memory limit.
const MANIFEST: &str = "[cells.synth]\npolicy = \"event-triggered\"\nperiod = \"10ms\"\nbudget = \"2ms\"\nhart-ids = [1]\n\n[cells.batch]\npolicy = \"best-effort\"\nharts = 1\nmemory = \"256M\"\n";

/// A free TCP port on localhost (bound, read, released).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET path` over HTTP/1.0; returns (status line, body).
fn http_get(port: u16, path: &str) -> (String, String) {
    http_get_accepting(port, path, "*/*")
}

/// `GET path` with an `Accept` header.
fn http_get_accepting(port: u16, path: &str, accept: &str) -> (String, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: localhost\r\nAccept: {accept}\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    )
}

/// Applies [`MANIFEST`] and starts a busy loop in `synth`.
fn cells_with_work(d: &Daemon, reaper: &mut Reaper) {
    let m = d.manifest("cells.toml", MANIFEST);
    let o = d.tess(&["apply", m.to_str().unwrap()]);
    assert_eq!(outcome(&o).0, 0, "{}", outcome(&o).1);
    let child = Command::new(common::tess_bin())
        .args([
            "run",
            "--cell",
            "synth",
            "--",
            "sh",
            "-c",
            "while :; do :; done",
        ])
        .env("TESS_SOCKET", &d.socket)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    reaper.push(child);
}

/// The value of the first sample line starting with `prefix`.
fn sample(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
#[ignore = "needs root: a private tessd on the real kernel"]
fn metrics_endpoint_passes_promtool_and_counts_what_happens() {
    let port = free_port();
    let d = Daemon::start_configured(&format!("metrics-listen = \"127.0.0.1:{port}\"\n"));
    let mut reaper = Reaper::default();
    cells_with_work(&d, &mut reaper);
    // Let the busy loop run through a few of its periods.
    std::thread::sleep(Duration::from_millis(600));

    let (status, body) = http_get(port, "/metrics");
    assert!(status.contains("200"), "{status}\n{body}\n{}", d.log());
    for want in [
        "tess_cell_cpu_granted_harts{cell=\"synth\",policy=\"event-triggered\"} 0.2",
        "tess_cell_cpu_granted_harts{cell=\"batch\",policy=\"best-effort\"} 0",
        "tess_cell_memory_limit_bytes{cell=\"batch\",policy=\"best-effort\"} 268435456",
        "tess_hart_admission_headroom_ratio{hart=\"1\"}",
        "tess_transactions_total{op=\"apply\",result=\"ok\"} 1",
        "tess_transaction_duration_seconds_bucket{le=\"+Inf\",op=\"apply\"} 1",
    ] {
        assert!(body.contains(want), "missing {want:?} in\n{body}");
    }
    // The busy loop ran, within its reservation of 2 ms per 10 ms (plus the scrape's slack).
    let used = sample(&body, "tess_cell_cpu_used_seconds_total{cell=\"synth\"").unwrap();
    assert!(used > 0.0, "synth used no CPU:\n{body}");
    let headroom = sample(&body, "tess_hart_admission_headroom_ratio{hart=\"1\"}").unwrap();
    assert!(headroom < 0.95 - 0.19, "hart 1 headroom {headroom}");

    // promtool reads the exposition and lints names, units and help texts.
    promtool_accepts(&body);

    // A deleted cell leaves the next scrape, and the delete is counted.
    let o = d.tess(&["cell", "delete", "batch"]);
    assert_eq!(outcome(&o).0, 0, "{}", outcome(&o).1);
    let (_, body) = http_get(port, "/metrics");
    assert!(!body.contains("cell=\"batch\""), "{body}");
    assert!(body.contains("tess_transactions_total{op=\"delete-cell\",result=\"ok\"} 1"));
    // Prometheus asks for OpenMetrics and gets it.
    let (_, om) = http_get_accepting(
        port,
        "/metrics",
        "application/openmetrics-text;version=1.0.0",
    );
    assert!(om.ends_with("# EOF\n"), "{om}");
    assert!(
        om.contains("# UNIT tess_cell_cpu_used_seconds seconds"),
        "{om}"
    );
    let (status, _) = http_get(port, "/nothing");
    assert!(status.contains("404"), "{status}");
}

/// A patch light enough to play in real time anywhere: a sine into both outputs.
const SINE_PATCH: &str =
    "#N canvas 0 0 400 300 12;\n#X obj 10 10 osc~ 440;\n#X obj 10 40 *~ 0.1;\n\
#X obj 10 70 dac~;\n#X connect 0 0 1 0;\n#X connect 1 0 2 0;\n#X connect 1 0 2 1;\n";

/// Starts `tess-pd play` of [`SINE_PATCH`] for 30 s in `cell`: a runtime that publishes every
/// 1.33 ms block (crate tess-stats) where tessd's endpoint, tess top, tess web and tess trace
/// read it.
fn play_in_cell(d: &Daemon, reaper: &mut Reaper, cell: &str) {
    let patch = d.manifest("sine.pd", SINE_PATCH);
    let pd = common::tess_bin().with_file_name("tess-pd");
    assert!(
        pd.exists(),
        "{} is missing: build the workspace first (scripts/test does)",
        pd.display()
    );
    let child = Command::new(common::tess_bin())
        .args(["run", "--cell", cell, "--"])
        .arg(&pd)
        .args(["play", patch.to_str().unwrap(), "--seconds", "30"])
        .env("TESS_SOCKET", &d.socket)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    reaper.push(child);
}

#[test]
#[ignore = "needs root: a private tessd on the real kernel"]
fn a_runtimes_misses_and_tail_reach_metrics_and_top() {
    let port = free_port();
    let d = Daemon::start_configured(&format!("metrics-listen = \"127.0.0.1:{port}\"\n"));
    let mut reaper = Reaper::default();
    let m = d.manifest(
        "audio.toml",
        "[cells.audio]\npolicy = \"event-triggered\"\nperiod = \"10ms\"\nbudget = \"3ms\"\nharts = 1\n",
    );
    let o = d.tess(&["apply", m.to_str().unwrap()]);
    assert_eq!(outcome(&o).0, 0, "{}", outcome(&o).1);
    // tess-pd plays the patch in real time in the cell, one 1.33 ms block at a time.
    play_in_cell(&d, &mut reaper, "audio");

    let labels = "cell=\"audio\",policy=\"event-triggered\",runtime=\"pd\"";
    let events = format!("tess_runtime_events_total{{{labels}}}");
    let mut body = String::new();
    let seen = wait_for(Duration::from_secs(15), || {
        body = http_get(port, "/metrics").1;
        sample(&body, &events).is_some_and(|n| n >= 200.0)
    });
    assert!(seen, "no pd events in the scrape:\n{body}\n{}", d.log());
    for want in [
        format!("tess_runtime_deadline_seconds{{{labels}}} 0.001333333"),
        format!("tess_runtime_deadline_misses_total{{{labels}}}"),
        format!("tess_runtime_response_seconds_bucket{{le=\"+Inf\",{labels}}}"),
        "# TYPE tess_runtime_response_seconds histogram".to_string(),
    ] {
        assert!(body.contains(&want), "missing {want:?} in\n{body}");
    }
    // The histogram counts every event (one scrape reads both from the same page).
    let count = sample(
        &body,
        &format!("tess_runtime_response_seconds_count{{{labels}}}"),
    )
    .unwrap();
    assert!(count >= 200.0, "{body}");
    promtool_accepts(&body);

    // tess top: the cell's runtime, its rate (48000 / 64 = 750 blocks a second) and its tail.
    let v = d.json(&["top", "--once", "--interval", "1s"]);
    let cell = v["cells"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "audio")
        .unwrap_or_else(|| panic!("{v}"));
    let rt = &cell["runtimes"][0];
    assert_eq!(rt["name"], "pd", "{v}");
    let rate = rt["events_per_s"].as_f64().unwrap();
    assert!((300.0..=800.0).contains(&rate), "{rate} blocks/s: {v}");
    assert!(rt["p99_us"].as_f64().unwrap() > 0.0, "{v}");
    assert!(
        (rt["deadline_us"].as_f64().unwrap() - 1333.333).abs() < 0.001,
        "{v}"
    );
    let o = d.tess(&["top", "--once", "--screen", "--interval", "300ms"]);
    let screen = String::from_utf8(o.stdout).unwrap();
    assert!(
        screen.contains("MISS") && screen.contains("P99"),
        "{screen}"
    );
    let row = screen
        .lines()
        .find(|l| l.contains("audio"))
        .unwrap_or_else(|| panic!("{screen}"));
    // NAME POL HARTS GRANT USED WAIT PRE/s MISS P99 THR MEM: MISS a count, P99 a time.
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert!(cols[7].parse::<u64>().is_ok(), "MISS in {row:?}");
    assert!(cols[8].ends_with('s') && cols[8] != "-", "P99 in {row:?}");
}

/// `promtool check metrics` accepts an exposition.
fn promtool_accepts(body: &str) {
    let mut check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian prometheus, installed by scripts/setup)");
    check
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = check.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}\n--- exposition ---\n{body}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Waits for `cond`, polling every 50 ms, for at most `limit`.
fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

#[test]
#[ignore = "needs root: a private tessd on the real kernel"]
fn top_once_json_reports_grants_use_and_headroom() {
    let d = Daemon::start();
    let mut reaper = Reaper::default();
    cells_with_work(&d, &mut reaper);
    std::thread::sleep(Duration::from_millis(300));
    let v = d.json(&["top", "--once", "--interval", "500ms", "--sort", "used"]);
    assert!(v["interval_s"].as_f64().unwrap() >= 0.5, "{v}");
    let cells = v["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 2, "{v}");
    // Sorted by CPU used: the busy loop first.
    assert_eq!(cells[0]["name"], "synth", "{v}");
    assert_eq!(cells[0]["granted_harts"], 0.2);
    let used = cells[0]["used_harts"].as_f64().unwrap();
    // A busy loop alone would take the whole hart; the reservation holds it near 2 ms / 10 ms.
    assert!(used > 0.0 && used < 0.5, "synth used {used} harts: {v}");
    assert_eq!(cells[1]["memory_limit_bytes"], 256u64 << 20);
    let hart1 = v["harts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["hart"] == 1)
        .unwrap();
    let headroom = hart1["headroom"].as_f64().unwrap();
    assert!((headroom - 0.75).abs() < 0.01, "hart 1: {hart1}");

    // The filter keeps matching cells; the text screen fits 80x24.
    let v = d.json(&["top", "--once", "--interval", "100ms", "--filter", "bat"]);
    assert_eq!(v["cells"].as_array().unwrap().len(), 1, "{v}");
    let o = d.tess(&["top", "--once", "--screen", "--interval", "200ms"]);
    assert_eq!(outcome(&o).0, 0, "{}", outcome(&o).1);
    let screen = String::from_utf8(o.stdout).unwrap();
    assert_eq!(screen.lines().count(), 24, "{screen}");
    assert!(screen.lines().all(|l| l.chars().count() <= 80), "{screen}");
    assert!(
        screen.contains("synth") && screen.contains("batch"),
        "{screen}"
    );
    // docs/observability.md shows this screen.
    write_doc_image("tess-top-80x24.txt", screen.as_bytes());
    // Without a terminal the UI refuses with a usage error that names --once.
    let o = d.tess(&["top"]);
    assert_eq!(outcome(&o).0, 2);
    assert!(outcome(&o).1.contains("--once"), "{}", outcome(&o).1);
    // Bad intervals are refused by name.
    let o = d.tess(&["top", "--once", "--interval", "5s"]);
    assert_eq!(outcome(&o).0, 2);
}

#[test]
#[ignore = "needs root: tracefs and a private tessd on the real kernel"]
fn trace_writes_chrome_json_with_cells_slices_and_throttles() {
    let d = Daemon::start();
    let mut reaper = Reaper::default();
    cells_with_work(&d, &mut reaper);
    // A runtime in the batch cell: its blocks become spans in the trace.
    play_in_cell(&d, &mut reaper, "batch");
    std::thread::sleep(Duration::from_millis(500));
    let out = d.dir.path().join("trace.json");
    let s = d.json(&[
        "trace",
        "--seconds",
        "1",
        "--out",
        out.to_str().unwrap(),
        "--buffer-kb",
        "4096",
    ]);
    let sum = &s["summary"];
    assert!(sum["switches"].as_u64().unwrap() > 0, "{s}");
    // The busy loop under 2 ms / 10 ms runs about 100 slices a second and is throttled at the
    // end of most of them.
    let synth = &sum["cells"]["synth"];
    assert!(synth["slices"].as_u64().unwrap_or(0) > 10, "{s}");
    assert!(synth["throttles"].as_u64().unwrap_or(0) > 10, "{s}");
    // tess-pd play's 750 blocks a second, each a span on the thread that computed it.
    assert!(sum["runtime_events"].as_u64().unwrap_or(0) > 100, "{s}");

    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().expect("traceEvents array");
    assert!(events
        .iter()
        .any(|e| e["ph"] == "M" && e["args"]["name"] == "cell synth"));
    assert!(events
        .iter()
        .any(|e| e["ph"] == "M" && e["args"]["name"] == "harts"));
    assert!(
        events
            .iter()
            .any(|e| e["cat"] == "runtime" && e["name"] == "pd" && e["dur"].as_f64() > Some(0.0)),
        "no pd spans"
    );
    // The tracer withdrew its request from the runtime's page.
    for p in tess_stats::pages(&tess_stats::default_dir()) {
        if let Ok(page) = tess_stats::read_file(&p.path) {
            assert_eq!(page.tracer, 0, "{page:?}");
        }
    }
    // The Trace Event Format's required fields, with the types viewers expect.
    for e in events {
        let ph = e["ph"].as_str().expect("ph");
        assert!(e["pid"].is_u64() && e["tid"].is_number(), "{e}");
        match ph {
            "X" => {
                assert!(e["ts"].as_f64().unwrap() >= 0.0, "{e}");
                assert!(e["dur"].as_f64().unwrap() >= 0.0, "{e}");
                assert!(e["name"].is_string(), "{e}");
            }
            "i" => assert!(e["ts"].is_number() && e["s"] == "t", "{e}"),
            "M" => assert!(e["args"]["name"].is_string(), "{e}"),
            other => panic!("unexpected phase {other}: {e}"),
        }
    }
    // Our tracefs instance is gone.
    let left: Vec<_> = std::fs::read_dir("/sys/kernel/tracing/instances")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("tess-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    // Bad input is refused by name.
    let o = d.tess(&["trace", "--seconds", "0", "--out", out.to_str().unwrap()]);
    assert_eq!(outcome(&o).0, 2, "{}", outcome(&o).1);
}

/// Reads one HTTP response's body by its Content-Length (Chromium's DevTools server keeps the
/// connection open, so reading to the end would wait forever).
fn read_http_body(s: &mut TcpStream) -> String {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&buf).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())
                        .flatten()
                })
                .unwrap_or(0);
            if body.len() >= len {
                return body.to_string();
            }
        }
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return String::new(),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// A page of headless Chromium driven over the DevTools protocol.
struct Browser {
    ws: tungstenite::WebSocket<tungstenite::stream::MaybeTlsStream<TcpStream>>,
    next_id: u64,
}

impl Browser {
    /// Starts Chromium (killed by pid through `reaper`) and attaches to its first page.
    fn start(reaper: &mut Reaper, profile: &std::path::Path) -> Browser {
        let port = free_port();
        let child = Command::new("chromium")
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--window-size=1280,1000",
                &format!("--remote-debugging-port={port}"),
                &format!("--user-data-dir={}", profile.display()),
                "about:blank",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromium (Debian chromium, installed by scripts/setup)");
        reaper.push(child);
        let mut url = None;
        assert!(
            wait_for(Duration::from_secs(30), || {
                let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
                    return false;
                };
                let _ = write!(
                    s,
                    "GET /json/list HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n"
                );
                let body = read_http_body(&mut s);
                let body = body.as_str();
                let Ok(v) = serde_json::from_str::<serde_json::Value>(body) else {
                    return false;
                };
                url = v.as_array().and_then(|pages| {
                    pages
                        .iter()
                        .find(|p| p["type"] == "page")
                        .and_then(|p| p["webSocketDebuggerUrl"].as_str())
                        .map(String::from)
                });
                url.is_some()
            }),
            "chromium did not offer a page to debug"
        );
        let (ws, _) = tungstenite::connect(url.unwrap()).expect("DevTools WebSocket");
        if let tungstenite::stream::MaybeTlsStream::Plain(s) = ws.get_ref() {
            // A command that is never answered fails the test instead of hanging it.
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        }
        Browser { ws, next_id: 1 }
    }

    /// Sends a DevTools command and returns its result (events in between are skipped).
    fn call(&mut self, method: &str, params: serde_json::Value) -> serde_json::Value {
        let id = self.next_id;
        self.next_id += 1;
        let msg = serde_json::json!({"id": id, "method": method, "params": params});
        self.ws
            .send(tungstenite::Message::Text(msg.to_string()))
            .unwrap();
        loop {
            let m = self
                .ws
                .read()
                .unwrap_or_else(|e| panic!("no reply to {method}: {e}"));
            let tungstenite::Message::Text(t) = m else {
                continue;
            };
            let v: serde_json::Value = serde_json::from_str(&t).unwrap();
            if v["id"] == id {
                assert!(v.get("error").is_none(), "{method}: {v}");
                return v["result"].clone();
            }
        }
    }

    /// Evaluates a JavaScript expression in the page and returns its value.
    fn eval(&mut self, expr: &str) -> serde_json::Value {
        let r = self.call(
            "Runtime.evaluate",
            serde_json::json!({"expression": expr, "returnByValue": true}),
        );
        r["result"]["value"].clone()
    }
}

/// The cells the dashboard's table shows.
const SHOWN_CELLS: &str =
    "Array.from(document.querySelectorAll('#cells tr[data-cell]')).map(r => r.dataset.cell).join(',')";

#[test]
#[ignore = "needs root: a private tessd on the real kernel, and headless chromium"]
fn web_dashboard_shows_cells_live_in_a_real_browser() {
    let d = Daemon::start();
    let mut reaper = Reaper::default();
    cells_with_work(&d, &mut reaper);
    let port = free_port();
    let web = Command::new(common::tess_bin())
        .args([
            "web",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--interval",
            "500ms",
        ])
        .env("TESS_SOCKET", &d.socket)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    reaper.push(web);
    assert!(
        wait_for(Duration::from_secs(10), || TcpStream::connect((
            "127.0.0.1",
            port
        ))
        .is_ok()),
        "tess web did not listen"
    );
    // Read-only: anything but GET is refused.
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(s, "POST /api/view HTTP/1.0\r\nContent-Length: 0\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    assert!(
        text.starts_with("HTTP/1.1 405") || text.starts_with("HTTP/1.0 405"),
        "{text}"
    );

    let profile = d.dir.path().join("chromium");
    let mut b = Browser::start(&mut reaper, &profile);
    b.call("Page.enable", serde_json::json!({}));
    b.call(
        "Page.navigate",
        serde_json::json!({"url": format!("http://127.0.0.1:{port}/")}),
    );
    assert!(
        wait_for(Duration::from_secs(20), || {
            let shown = b.eval(SHOWN_CELLS);
            shown == "batch,synth" || shown == "synth,batch"
        }),
        "the page does not show the manifest's cells: {:?}",
        b.eval("document.body.innerText")
    );
    // Mark this document: the update below must arrive without a reload.
    b.eval("window.tessMark = 42");
    let o = d.tess(&[
        "cell",
        "create",
        "late",
        "--policy",
        "best-effort",
        "--harts",
        "1",
    ]);
    assert_eq!(outcome(&o).0, 0, "{}", outcome(&o).1);
    assert!(
        wait_for(Duration::from_secs(10), || b
            .eval(SHOWN_CELLS)
            .as_str()
            .is_some_and(|s| s.split(',').any(|c| c == "late"))),
        "the new cell did not appear: {:?}",
        b.eval(SHOWN_CELLS)
    );
    assert_eq!(b.eval("window.tessMark"), 42, "the page was reloaded");
    // The harts and the plot are drawn too.
    assert!(b
        .eval("document.getElementById('harts').innerText")
        .as_str()
        .unwrap()
        .contains("hart 1"));
    // A runtime in the new cell: its misses and p99 reach the table, its response times the
    // live histogram.
    play_in_cell(&d, &mut reaper, "late");
    assert!(
        wait_for(Duration::from_secs(15), || b
            .eval("document.querySelectorAll('#rt-hist rect').length")
            .as_u64()
            .is_some_and(|n| n > 0)),
        "no runtime histogram: {:?}",
        b.eval("document.body.innerText")
    );
    assert_eq!(
        b.eval("document.getElementById('rt-names').textContent"),
        "late/pd"
    );
    // The late cell's row: misses a count, p99 a time.
    let row = b.eval(
        "Array.from(document.querySelectorAll('#cells tr[data-cell=late] td')).map(t => t.textContent).join('|')",
    );
    let cols: Vec<&str> = row.as_str().unwrap().split('|').collect();
    assert!(cols[7].parse::<u64>().is_ok(), "misses in {row}");
    assert!(
        cols[8].ends_with("us") || cols[8].ends_with("ms"),
        "p99 in {row}"
    );
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        b.eval("document.querySelectorAll('#plot polyline').length")
            .as_u64()
            .unwrap()
            >= 2
    );
    // docs/observability.md shows this screenshot.
    let shot = b.call(
        "Page.captureScreenshot",
        serde_json::json!({"format": "png"}),
    );
    use base64::Engine;
    let png = base64::engine::general_purpose::STANDARD
        .decode(shot["data"].as_str().unwrap())
        .unwrap();
    assert!(png.starts_with(b"\x89PNG"));
    write_doc_image("tess-web.png", &png);
}

/// Writes an image that docs/observability.md shows: into `docs/img/` when `TESS_DOCS_BLESS`
/// is set (`TESS_DOCS_BLESS=1 cargo test -p tess-cli --test observe -- --include-ignored`
/// refreshes them), otherwise beside the test's other output, so that a test run leaves the
/// checkout as it found it.
fn write_doc_image(name: &str, bytes: &[u8]) {
    let dir = if std::env::var_os("TESS_DOCS_BLESS").is_some() {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/img")
    } else {
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("docs-img")
    };
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(name), bytes).unwrap();
}
