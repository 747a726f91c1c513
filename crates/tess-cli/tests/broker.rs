//! The broker closes the loop through tessd (issue 14): a program in a reserved cell beats
//! through `tess run --heartbeat-pipe`, `tess-broker` reads the beats and changes the cell's
//! budget with tessd transactions; a pinned cell is never changed; `tess broker status` says
//! what happened and why. Run as root; starts a private tessd.

mod common;

use common::{outcome, Daemon};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tess_testkit::Reaper;

fn budget_ns(d: &Daemon, cell: &str) -> u64 {
    let v = d.json(&["cell", "show", cell]);
    v["policy"]["budget"]
        .as_u64()
        .unwrap_or_else(|| panic!("no budget in {v}"))
}

/// Starts `yes | tess run --cell CELL --heartbeat-pipe 65536 ... -- cat > /dev/null`: the
/// rate is what the cell's CPU lets `cat` and the pump move.
fn feeder(d: &Daemon, cell: &str, target: &str, sock: &std::path::Path) -> Vec<Child> {
    let mut yes = Command::new("yes").stdout(Stdio::piped()).spawn().unwrap();
    let stdin = yes.stdout.take().unwrap();
    let run = Command::new(common::tess_bin())
        .args([
            "run",
            "--cell",
            cell,
            "--heartbeat-pipe",
            "65536",
            "--heartbeat-target",
            target,
            "--",
            "cat",
        ])
        .env("TESS_SOCKET", &d.socket)
        .env("TESS_BROKER_SOCKET", sock)
        .stdin(stdin)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    vec![run, yes]
}

/// Creates event-triggered cells of 3 ms every 10 ms on hart 1 (`true`: pinned).
fn create_cells(d: &Daemon, cells: &[(&str, bool)]) {
    for &(cell, pinned) in cells {
        let mut args = vec![
            "cell",
            "create",
            cell,
            "--policy",
            "event-triggered",
            "--period",
            "10ms",
            "--budget",
            "3ms",
            "--hart-ids",
            "1",
        ];
        if pinned {
            args.push("--pinned");
        }
        let o = d.tess(&args);
        assert_eq!(outcome(&o).0, 0, "{}", outcome(&o).1);
    }
}

/// A `tess-broker` with configuration `config`, its socket and status file in a private
/// directory: (the directory, the socket, the status file, the broker).
fn start_broker(
    d: &Daemon,
    config: &str,
) -> (
    tempfile::TempDir,
    std::path::PathBuf,
    std::path::PathBuf,
    Child,
) {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("broker.sock");
    let status = dir.path().join("status.json");
    let file = dir.path().join("broker.toml");
    std::fs::write(&file, config).unwrap();
    let broker = Command::new(tess_testkit::built("tess-broker"))
        .arg("--config")
        .arg(&file)
        .arg("--socket")
        .arg(&sock)
        .arg("--status")
        .arg(&status)
        .env("TESS_SOCKET", &d.socket)
        .spawn()
        .unwrap();
    (dir, sock, status, broker)
}

/// `tess broker status [--json] --file STATUS`'s standard output.
fn broker_status(status: &std::path::Path, json: bool) -> String {
    let mut args = vec!["broker", "status"];
    if json {
        args.push("--json");
    }
    let o = Command::new(common::tess_bin())
        .args(args)
        .arg("--file")
        .arg(status)
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Cell `name`'s entry in a parsed broker status.
fn status_cell<'a>(s: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    s["cells"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["cell"] == name)
        .unwrap_or_else(|| panic!("{name} not in {s}"))
}

/// The reasons of a status cell's recent decisions, oldest first.
fn reasons(cell: &serde_json::Value) -> Vec<&str> {
    cell["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["reason"].as_str().unwrap())
        .collect()
}

#[test]
#[ignore = "needs root: a private tessd on the real kernel"]
fn the_broker_moves_a_budget_and_leaves_a_pinned_cell_alone() {
    let d = Daemon::start();
    create_cells(&d, &[("enc", false), ("fixed", true)]);
    let (_dir, sock, status, broker) = start_broker(
        &d,
        "period = \"300ms\"\n[cells.enc]\nfloor = 0.02\nceiling = 0.5\n",
    );
    let broker_pid = broker.id() as i32;
    let mut kill = Reaper::default();
    kill.push(broker);
    // A target of 1 frame per second: far below what 3 ms per 10 ms moves, so the broker must
    // take budget away, down to the floor.
    kill.extend(feeder(&d, "enc", "1/s", &sock));
    kill.extend(feeder(&d, "fixed", "1/s", &sock));
    let t0 = Instant::now();
    let initial = 3_000_000;
    loop {
        let enc = budget_ns(&d, "enc");
        if enc < initial / 2 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the broker did not lower the budget (still {enc} ns); status: {}",
            std::fs::read_to_string(&status).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(budget_ns(&d, "fixed"), initial, "a pinned cell changed");
    let s: serde_json::Value = serde_json::from_str(&broker_status(&status, true)).unwrap();
    let enc = status_cell(&s, "enc");
    assert_eq!(enc["target_rate"].as_f64(), Some(1.0));
    assert!(enc["beats"].as_u64().unwrap() > 0);
    assert!(enc["measured_rate"].as_f64().unwrap() > 1.0);
    let fixed = reasons(status_cell(&s, "fixed"));
    assert!(
        !fixed.is_empty() && fixed.iter().all(|r| *r == "pinned"),
        "{fixed:?}"
    );
    let text = broker_status(&status, false);
    assert!(text.contains("enc") && text.contains("fixed"), "{text}");
    // Each decision period is published (crate tess-stats) under the broker's process: the
    // mean time between beats, a miss when the rate fell below 95% of the target (1/s here,
    // far below what either cell beats).
    let pages = tess_stats::for_processes(&tess_stats::default_dir(), &[broker_pid]);
    for name in ["hb-enc", "hb-fixed"] {
        let p = pages
            .iter()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("no {name} in {pages:?}"));
        assert!(p.events >= 1, "{p:?}");
        assert_eq!(p.misses, 0, "{p:?}");
        assert!(
            p.max_ns < 1_000_000_000,
            "beats every {} ns: {p:?}",
            p.max_ns
        );
    }
}

#[test]
#[ignore = "needs root: a private tessd on the real kernel"]
fn a_manifests_broker_limits_bound_the_share() {
    // The cell's manifest says the broker may give it 0.15 to 0.4 harts; the broker's own file
    // says nothing of it. Far above its target, the cell is lowered to the manifest's floor
    // and no further; a manifest that raises the floor raises the cell.
    let d = Daemon::start();
    let dir = tempfile::tempdir().unwrap();
    let manifest = |floor: f64| {
        let path = dir.path().join("cells.toml");
        std::fs::write(
            &path,
            format!(
                "[cells.enc]\npolicy = \"event-triggered\"\nperiod = \"10ms\"\nbudget = \"3ms\"\n\
                 hart-ids = [1]\nbroker-floor = {floor}\nbroker-ceiling = 0.4\n"
            ),
        )
        .unwrap();
        let o = d.tess(&["apply", path.to_str().unwrap()]);
        assert_eq!(outcome(&o).0, 0, "{}", outcome(&o).1);
    };
    manifest(0.15);
    let shown = d.json(&["cell", "show", "enc"]);
    assert_eq!(shown["broker"]["floor"].as_f64(), Some(0.15), "{shown}");
    let (_bdir, sock, status, broker) = start_broker(&d, "period = \"300ms\"\n");
    let mut kill = Reaper::default();
    kill.push(broker);
    kill.extend(feeder(&d, "enc", "1/s", &sock));
    let wait_for = |what: &str, ok: &dyn Fn(u64) -> bool| {
        let t0 = Instant::now();
        while !ok(budget_ns(&d, "enc")) {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "{what}: budget {} ns; status: {}",
                budget_ns(&d, "enc"),
                std::fs::read_to_string(&status).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    // 0.15 harts of a 10 ms period on one hart: 1.5 ms (a last step under the hysteresis may
    // stop it up to 0.01 harts above).
    wait_for("not lowered to the manifest's floor", &|b| b <= 1_600_000);
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(150));
        assert!(
            budget_ns(&d, "enc") >= 1_490_000,
            "below the manifest's floor"
        );
    }
    let s: serde_json::Value = serde_json::from_str(&broker_status(&status, true)).unwrap();
    let enc = status_cell(&s, "enc");
    assert_eq!(
        (enc["floor"].as_f64(), enc["ceiling"].as_f64()),
        (Some(0.15), Some(0.4)),
        "{enc}"
    );
    // A new manifest with a higher floor (applying it also puts the budget back at 3 ms): the
    // broker lowers the cell to the new floor, not to the old one.
    manifest(0.25);
    wait_for("not lowered to the new floor", &|b| b <= 2_600_000);
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(150));
        assert!(budget_ns(&d, "enc") >= 2_490_000, "below the new floor");
    }
}

#[test]
#[ignore = "needs root: a private tessd on the real kernel"]
fn the_pacora_policy_sizes_cells_through_tessd() {
    // policy = "pacora": two cells beat far above their targets (1/s); the policy learns each
    // cell's response time at two budgets, then gives each the least share its model says
    // meets the target: down to the floor, through tessd transactions.
    let d = Daemon::start();
    create_cells(&d, &[("enc", false), ("idx", false)]);
    let (_dir, sock, status, broker) = start_broker(
        &d,
        "period = \"300ms\"\npolicy = \"pacora\"\n[cells.enc]\nfloor = 0.02\nslope = 2\n\
         [cells.idx]\nfloor = 0.02\n",
    );
    let mut kill = Reaper::default();
    kill.push(broker);
    kill.extend(feeder(&d, "enc", "1/s", &sock));
    kill.extend(feeder(&d, "idx", "1/s", &sock));
    let t0 = Instant::now();
    let floor_ns = 200_000; // 0.02 harts of a 10 ms period
    while budget_ns(&d, "enc") > 2 * floor_ns || budget_ns(&d, "idx") > 2 * floor_ns {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "PACORA did not size the cells down; status: {}",
            std::fs::read_to_string(&status).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Then each cell is modelled (two samples at shares apart: at the floor, learning moves up
    // by `explore` to get the second) and sized by its model.
    let read =
        || -> serde_json::Value { serde_json::from_str(&broker_status(&status, true)).unwrap() };
    let sized = |s: &serde_json::Value| {
        s["cells"].as_array().is_some_and(|cells| {
            cells.len() == 2
                && cells.iter().all(|c| {
                    // The last round that solved (a round with no event holds the share).
                    c["response_model"].is_object()
                        && c["decisions"]
                            .as_array()
                            .and_then(|d| d.iter().rev().find(|d| d["reason"] != "no-event"))
                            .map(|d| &d["reason"])
                            == Some(&serde_json::json!("meets-target"))
                })
        })
    };
    let mut s = read();
    while !sized(&s) {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "PACORA did not model and size both cells: {s}"
        );
        std::thread::sleep(Duration::from_millis(200));
        s = read();
    }
    assert!(budget_ns(&d, "enc") <= 2 * floor_ns && budget_ns(&d, "idx") <= 2 * floor_ns);
    assert_eq!(s["policy"], "pacora", "{s}");
    let allowed = [
        "learning",
        "meets-target",
        "trade-off",
        "no-rate",
        "no-event",
    ];
    for c in s["cells"].as_array().unwrap() {
        let reasons: Vec<&str> = c["decisions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["reason"].as_str().unwrap())
            .collect();
        assert!(
            !reasons.is_empty() && reasons.iter().all(|r| allowed.contains(r)),
            "{}: {reasons:?}",
            c["cell"]
        );
    }
    let text = broker_status(&status, false);
    assert!(text.contains("policy pacora"), "{text}");
}

/// A TCP server on loopback that sends zeros to whoever connects, as fast as they read.
fn zero_source() -> std::net::SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for c in l.incoming().flatten() {
            std::thread::spawn(move || {
                use std::io::Write;
                let mut c = c;
                let buf = vec![0u8; 64 * 1024];
                while c.write_all(&buf).is_ok() {}
            });
        }
    });
    addr
}

/// The reservation and the limit of `flow` at the service, bits per second.
fn flow_spec(d: &Daemon, service: &str, flow: &str) -> Option<(u64, u64)> {
    let v = d.json(&["net", "flows", "--service", service]);
    let f = v["flows"]
        .as_array()?
        .iter()
        .find(|f| f["key"] == flow)?
        .clone();
    let spec = &f["spec"];
    Some((
        spec["reservation"]["bps"].as_u64()?,
        spec["limit"]["bps"].as_u64()?,
    ))
}

/// Starts a `tess-netd` named `name` with a 100 Mbit/s link under `d`, and waits until it
/// serves.
fn start_netd(d: &Daemon, name: &str) -> Reaper {
    d.start_netd_with(
        name,
        &["--max-datagram", "1500", "--capacity", "100mbit,100kpps"],
    )
}

#[test]
#[ignore = "needs root: a private tessd on the real kernel"]
fn the_pacora_policy_gives_a_flow_its_share_of_the_link() {
    // policy = "pacora" with a [network] pool of 40 Mbit/s: a download in cell "hog" through a
    // real tess-netd beats `conf-hog.net` with each 64 KiB it receives and a target no share
    // meets. Its flow starts at the configured 5 Mbit/s (reservation and limit) and, alone in
    // the pool, is then given all of it.
    let d = Daemon::start();
    let o = d.tess(&[
        "cell",
        "create",
        "hog",
        "--policy",
        "best-effort",
        "--hart-ids",
        "0",
    ]);
    assert_eq!(outcome(&o).0, 0, "{}", outcome(&o).1);
    let mut kill = start_netd(&d, "net-brk");
    let (_bdir, sock, status, broker) = start_broker(
        &d,
        "policy = \"pacora\"\nperiod = \"300ms\"\n[network]\nservice = \"net-brk\"\ncapacity = 40\n[cells.\"hog.net\"]\nfloor = 1\ninitial = 5\n",
    );
    kill.push(broker);
    let source = zero_source();
    let now_ns = tess_heartbeat::clock::now_ns();
    let hog = Command::new(common::tess_bin())
        .args(["run", "--cell", "hog", "--"])
        .arg(common::tess_bin())
        .args(["bench", "conference", "--role", "hog", "--secs", "60"])
        .args(["--t0", &now_ns.to_string(), "--addr", &source.to_string()])
        .args(["--net-service", "net-brk", "--out", "/dev/null"])
        .env("TESS_SOCKET", &d.socket)
        .env("TESS_BROKER_SOCKET", &sock)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut download = Reaper::default();
    download.push(hog);
    let mut seen_initial = false;
    let t0 = Instant::now();
    loop {
        match flow_spec(&d, "net-brk", "cell:hog") {
            Some((5_000_000, 5_000_000)) => seen_initial = true,
            Some((40_000_000, 40_000_000)) => break,
            _ => {}
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the broker did not give the flow the link: {:?}; status: {}",
            flow_spec(&d, "net-brk", "cell:hog"),
            std::fs::read_to_string(&status).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let s: serde_json::Value = serde_json::from_str(&broker_status(&status, true)).unwrap();
    let hog = status_cell(&s, "hog");
    assert_eq!(hog["resource"], "net", "{hog}");
    assert_eq!(hog["measured_value"].as_f64(), Some(65536.0), "{hog}");
    let reasons = reasons(hog);
    assert!(
        seen_initial || reasons.contains(&"initial"),
        "the flow never held its initial share: {reasons:?}"
    );
    assert!(reasons.contains(&"trade-off"), "{reasons:?}");
    // The download ends: its heartbeat goes, and the broker gives the reservation back.
    drop(download);
    let t0 = Instant::now();
    while flow_spec(&d, "net-brk", "cell:hog").is_some() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the flow kept its reservation after its heartbeat went: {:?}; status: {}",
            flow_spec(&d, "net-brk", "cell:hog"),
            std::fs::read_to_string(&status).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `tess net fetch`'s server on loopback: answers each 4-byte length with that many bytes.
fn fetch_server(d: &Daemon) -> (std::net::SocketAddr, Reaper) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    let server = Command::new(common::tess_bin())
        .args(["net", "fetch", "--serve", &addr.to_string()])
        .env("TESS_SOCKET", &d.socket)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(10), "no fetch server");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut reaper = Reaper::default();
    reaper.push(server);
    (addr, reaper)
}

#[test]
#[ignore = "needs root: a private tessd on the real kernel"]
fn the_pacora_policy_sizes_a_cells_harts_and_flow_together() {
    // A cell marked `network = true` runs `tess net fetch`: every unit is 16 KiB fetched
    // through a real tess-netd (its flow, shaped by the reservation and limit the broker
    // sets) and then hashed (its CPU budget, set by tessd transactions). Its one heartbeat
    // measures both: the broker learns one model over the two shares and sizes both to meet
    // the target.
    let d = Daemon::start();
    create_cells(&d, &[("fetch", false)]);
    let mut kill = start_netd(&d, "net-jnt");
    let (addr, server) = fetch_server(&d);
    kill.append(server);
    let fetch_args = |target: &str| -> Vec<String> {
        let mut a: Vec<String> = ["net", "fetch", &addr.to_string(), "--chunk", "16384"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        a.extend(["--passes", "64", "--service", "net-jnt", "--target", target].map(String::from));
        a
    };
    // The unit's time with a whole hart and no network service: the target asks for a fifth
    // of that rate, which the cell's starting 0.3 harts and 2 Mbit/s do not reach and the
    // pools (0.6 harts, 40 Mbit/s) do.
    let o = Command::new(common::tess_bin())
        .args(fetch_args("1/s"))
        .args(["--kernel", "--duration", "2s", "--json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let full: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let target = (full["rate"].as_f64().unwrap() / 5.0)
        .clamp(1.0, 60.0)
        .round();
    let (_bdir, sock, status, broker) = start_broker(
        &d,
        "policy = \"pacora\"\nperiod = \"1s\"\n[pacora]\ncapacity = 0.6\n\
         [network]\nservice = \"net-jnt\"\ncapacity = 40\n\
         [cells.fetch]\nnetwork = true\nfloor = 0.1\nceiling = 0.6\n\
         [cells.\"fetch.net\"]\nfloor = 0.5\ninitial = 2\n",
    );
    kill.push(broker);
    let run = Command::new(common::tess_bin())
        .args(["run", "--cell", "fetch", "--"])
        .arg(common::tess_bin())
        .args(fetch_args(&format!("{target}/s")))
        .env("TESS_SOCKET", &d.socket)
        .env("TESS_BROKER_SOCKET", &sock)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    kill.push(run);
    let read = || -> serde_json::Value {
        serde_json::from_str(&broker_status(&status, true)).unwrap_or_default()
    };
    let sized = |s: &serde_json::Value| {
        s["cells"].as_array().is_some_and(|cells| {
            cells.iter().any(|c| {
                c["cell"] == "fetch"
                    && c["response_model"]["resources"] == 2
                    && c["decisions"]
                        .as_array()
                        .and_then(|d| d.iter().rev().find(|d| d["reason"] != "no-event"))
                        .is_some_and(|d| d["reason"] == "meets-target")
            })
        })
    };
    let t0 = Instant::now();
    let mut s = read();
    while !sized(&s) {
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "PACORA did not model and size fetch's harts and flow together (target {target}/s): {s}"
        );
        std::thread::sleep(Duration::from_millis(300));
        s = read();
    }
    let c = status_cell(&s, "fetch");
    assert_eq!(c["resource"], "cpu+net", "{c}");
    // What the broker says it gave is what tessd and the network service hold.
    let share = c["share"].as_f64().unwrap();
    let mbps = c["flow_share"].as_f64().unwrap();
    let budget = budget_ns(&d, "fetch") as f64;
    assert!(
        (budget - share * 10e6).abs() <= 0.02 * 10e6,
        "{budget} ns vs {share} harts"
    );
    let (reserve, limit) = flow_spec(&d, "net-jnt", "cell:fetch").expect("fetch's flow");
    assert!(
        (reserve as f64 - mbps * 1e6).abs() <= 0.01 * mbps * 1e6 && reserve == limit,
        "{reserve} bit/s vs {mbps} Mbit/s"
    );
    assert!(share <= 0.6 + 1e-9 && mbps <= 40.0 + 1e-9, "{c}");
    // Sized by its model, the cell meets its target in most of the next periods (the model's
    // margin is 10%; a period can still fall short on a loaded host). The decision period is
    // 1 s: at 20 to 30 units a second a shorter one counts too few units to measure a rate
    // (at 300 ms, one unit more or less was 11 to 28% of it, and the fits followed the noise).
    let mut on_target = 0;
    let mut seen = Vec::new();
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(1000));
        let s = read();
        let c = status_cell(&s, "fetch");
        seen.push(c["decisions"].clone());
        on_target += (c["measured_rate"].as_f64().unwrap() >= 0.9 * target) as u32;
    }
    // (Shown with --nocapture: how the broker got there.)
    eprintln!(
        "at sizing: {}\nsince: {}",
        c["decisions"],
        serde_json::Value::Array(seen.clone())
    );
    assert!(
        on_target >= 6,
        "on target in {on_target} of 10 periods: {}\nat sizing: {}\nsince: {}",
        broker_status(&status, false),
        c["decisions"],
        serde_json::Value::Array(seen)
    );
}
