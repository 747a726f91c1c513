//! `tess bench update`: how long a 3-cell change takes from request to enforced (seed 004
//! section 3.3: update_cells returns in 30 us, the whole swap takes under 2 ms).
//!
//! Three cells (event-triggered, time-triggered, best-effort), each holding a running process,
//! alternate between two shapes; each change is one `tess apply` transaction. The client times
//! the round trip: tessd replies only after the kernel holds the new budgets and the state is
//! durably committed.

use super::support::{pick_hart, spawn_work, stop, Session};
use super::Common;
use std::time::{Duration, Instant};
use tess_bench::{probe, Report, Summary, Table};
use tess_core::spec::{CellSpec, HartRequest, Policy};
use tess_proto::{Body, Request};
use tess_sched::HartSet;

const NAMES: [&str; 3] = ["upd-et", "upd-tt", "upd-be"];

fn cells(hart: usize, big: bool) -> Vec<CellSpec> {
    let ms = |x: u64| Duration::from_micros(x * 1000);
    let k = if big { 2 } else { 1 };
    let spec = |name: &str, policy| CellSpec {
        name: name.into(),
        policy,
        harts: HartRequest::Ids(HartSet::single(hart)),
        memory_max: Some(if big { 256 << 20 } else { 128 << 20 }),
        pids_max: None,
        pinned: false,
        idle: None,
        broker: Default::default(),
    };
    vec![
        spec(
            NAMES[0],
            Policy::EventTriggered {
                period: ms(10),
                budget: ms(k),
            },
        ),
        spec(
            NAMES[1],
            Policy::TimeTriggered {
                period: ms(10),
                active: ms(k),
                offset: Some(ms(5)),
            },
        ),
        spec(
            NAMES[2],
            Policy::BestEffort {
                weight: 100 * k as u32,
            },
        ),
    ]
}

/// Runs the benchmark.
pub fn run(c: &Common) -> anyhow::Result<Report> {
    let mut s = Session::connect()?;
    let status = s.status()?;
    let hart = pick_hart(c.hart, &status)?;
    let n = if c.quick { 20 } else { 100 };
    let floor = probe::noise_floor(hart, if c.quick { 1000 } else { 5000 })?;
    s.apply(cells(hart, false))?;
    let holders: Vec<_> = NAMES
        .iter()
        .map(|c| spawn_work(Some(c), &["idle".into()]))
        .collect::<Result<_, _>>()?;
    std::thread::sleep(Duration::from_millis(300));
    let mut round_trip = Vec::with_capacity(n);
    let (mut admit, mut enforce, mut commit, mut daemon) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut failure = None;
    for i in 0..n {
        let req = Request::Apply {
            cells: cells(hart, i % 2 == 0),
            delete: vec![],
            prune: false,
            dry_run: false,
        };
        let t0 = Instant::now();
        let body = s.client.call(&req);
        let dt = t0.elapsed();
        match body {
            Ok(Body::Applied(r)) => {
                anyhow::ensure!(
                    r.updated.len() == 3,
                    "expected 3 cells to change, got {:?}",
                    r.updated
                );
                round_trip.push(dt.as_secs_f64() * 1e6);
                admit.push(r.timing.admit_us);
                enforce.push(r.timing.enforce_us);
                commit.push(r.timing.commit_us);
                daemon.push(r.timing.total_us);
            }
            Ok(other) => {
                failure = Some(anyhow::anyhow!("unexpected reply {other:?}"));
                break;
            }
            Err(e) => {
                failure = Some(e.into());
                break;
            }
        }
    }
    for h in holders {
        stop(h);
    }
    s.delete(&NAMES);
    if let Some(e) = failure {
        return Err(e);
    }
    let rt = Summary::of(&round_trip);
    let mut r = Report::new("update");
    let mut t = Table::new(
        format!("{n} changes of 3 cells on hart {hart}, request to enforced (us)"),
        &["step", "median", "p99", "max"],
    );
    for (name, xs) in [
        ("round trip (client)", &round_trip),
        ("admission + placement", &admit),
        ("kernel enforcement", &enforce),
        ("durable commit", &commit),
        ("daemon total", &daemon),
    ] {
        let x = Summary::of(xs);
        t.row(&[
            name.to_string(),
            format!("{:.0}", x.median),
            format!("{:.0}", x.p99),
            format!("{:.0}", x.max),
        ]);
    }
    r.table(t);
    r.figure("update_median_us", rt.median);
    r.figure("update_max_us", rt.max);
    r.figure("noise_floor_max_us", floor.summary_us.max);
    r.target(
        "median change under 1 ms",
        rt.median < 1000.0,
        format!("{:.0} us", rt.median),
    );
    r.note("each change: event-triggered budget 1ms<->2ms, time-triggered window 1ms<->2ms, best-effort weight 100<->200, memory limits 128M<->256M; every cell holds a running process whose scheduling is changed");
    r.note("seed 004 (Tessellation): update_cells returns in 30 us on average; the whole redistribution takes under 2 ms with a 1 ms safety margin");
    r.detail("noise_floor_us", floor.summary_us);
    r.detail("round_trip_us", rt);
    Ok(r)
}
