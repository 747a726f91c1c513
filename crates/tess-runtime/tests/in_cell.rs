//! The sample programs in a real cell (root, real kernel): the Rust (`examples/gang.rs`) and C
//! (`examples/c/gang.c`) gang programs run in a 2-hart time-triggered cell of a private tessd,
//! print both vhart ids, and survive `tess cell resize` from 2 harts to 1 and back, with `adapt`
//! called for each resize.
//!
//! Needs `cargo build --workspace` first (for `tess`, `tessd` and libtess, which the C example
//! links); `scripts/test` does that.
#![cfg(not(loom))]

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tess_testkit::{profile_dir, Tessd};

/// What a running program has printed so far, read line by line from its stdout.
struct Transcript {
    lines: std::sync::mpsc::Receiver<String>,
    text: String,
}

impl Transcript {
    fn follow(stdout: std::process::ChildStdout) -> Transcript {
        use std::io::BufRead;
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Transcript {
            lines,
            text: String::new(),
        }
    }

    /// Waits until `needle` has been printed `times` times (a slow machine makes the test
    /// slower, not flaky); panics with the transcript after a generous 30 s.
    fn wait_for(&mut self, needle: &str, times: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.text.matches(needle).count() < times {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.text.push_str(&line);
                    self.text.push('\n');
                }
                Err(_) => panic!("{needle:?} not printed {times} time(s) in:\n{}", self.text),
            }
        }
    }

    /// Everything printed, once the program's stdout is closed.
    fn finish(mut self) -> String {
        while let Ok(line) = self.lines.recv() {
            self.text.push_str(&line);
            self.text.push('\n');
        }
        self.text
    }
}

/// Runs `program` (which runs for 6 s) in a fresh 2-hart time-triggered cell: once both
/// vharts run, resizes the cell to 1 hart; once the program has adapted, back to 2; returns
/// what it printed.
fn run_in_cell(program: &Path, args: &[&str]) -> String {
    let d = Tessd::start();
    d.tess_ok(&[
        "cell",
        "create",
        "gang",
        "--policy",
        "time-triggered",
        "--period",
        "10ms",
        "--active",
        "2ms",
        "--harts",
        "2",
    ]);
    let mut run_args = vec!["run", "--cell", "gang", "--", program.to_str().unwrap()];
    run_args.extend_from_slice(args);
    let mut child = d
        .tess_command(&run_args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut transcript = Transcript::follow(child.stdout.take().unwrap());
    transcript.wait_for("vhart 1 on hart", 1);
    d.tess_ok(&["cell", "resize", "gang", "--harts", "1"]);
    transcript.wait_for("adapt(2 -> 1)", 1);
    d.tess_ok(&["cell", "resize", "gang", "--harts", "2"]);
    transcript.wait_for("adapt(1 -> 2)", 1);
    assert_windows_published(&d);
    let out = child.wait_with_output().unwrap();
    let text = transcript.finish();
    assert!(
        out.status.success(),
        "{} failed: {text}{}",
        program.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The runtime publishes how late each vhart entered each window and how long after the
/// window's first vhart (crate tess-stats), where tessd's metrics and `tess top` find them by
/// the cell's processes.
fn assert_windows_published(d: &Tessd) {
    let out = d.tess(&["cell", "show", "gang", "--json"]);
    let cell: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let procs: Vec<i32> = cell["processes"]
        .as_array()
        .unwrap_or_else(|| panic!("{cell}"))
        .iter()
        .map(|p| p.as_i64().unwrap() as i32)
        .collect();
    // The pages are made at the first window a vhart enters with work: poll for both.
    let t0 = std::time::Instant::now();
    let mut pages = Vec::new();
    let events = |pages: &[tess_stats::Published], name: &str| {
        pages
            .iter()
            .find(|p| p.name == name)
            .map_or(0, |p| p.events)
    };
    while t0.elapsed() < std::time::Duration::from_secs(5) {
        pages = tess_stats::for_processes(&tess_stats::default_dir(), &procs);
        if events(&pages, "gang-window") > 0 && events(&pages, "gang-skew") > 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    for name in ["gang-window", "gang-skew"] {
        let page = pages.iter().find(|p| p.name == name).unwrap_or_else(|| {
            let all = tess_stats::pages(&tess_stats::default_dir());
            panic!("no {name} page for {procs:?} among {all:?}")
        });
        assert!(page.events >= 1, "{page:?}");
        assert_eq!(page.buckets.iter().sum::<u64>(), page.events, "{page:?}");
    }
}

fn assert_gang_output(text: &str) {
    for want in [
        "vhart 0 on hart",
        "vhart 1 on hart",
        "adapt(2 -> 1)",
        "adapt(1 -> 2)",
    ] {
        assert!(text.contains(want), "no {want:?} in:\n{text}");
    }
    // vhart 1 starts twice: at the start and again after the cell grows back.
    assert_eq!(
        text.matches("vhart 1 on hart").count(),
        2,
        "vhart 1 should start twice:\n{text}"
    );
    assert_eq!(
        text.matches("adapt(").count(),
        2,
        "adapt once per resize:\n{text}"
    );
}

#[test]
#[ignore = "needs root: a private tessd on the real kernel"]
fn rust_gang_example_survives_resizes_in_a_cell() {
    let text = run_in_cell(&profile_dir().join("examples/gang"), &["--seconds", "6"]);
    assert_gang_output(&text);
}

#[test]
#[ignore = "needs root: a private tessd on the real kernel"]
fn c_gang_example_survives_resizes_in_a_cell() {
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("gang");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/c/gang.c");
    tess_testkit::c_lib::compile(&[&source], &exe, tess_testkit::c_lib::Link::Static);
    let text = run_in_cell(&exe, &["6"]);
    assert_gang_output(&text);
}
