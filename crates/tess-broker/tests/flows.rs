//! The broker's network pool with labelled flows, through its public API: real heartbeats
//! registered over a real socket, tessd and the network service replaced by recorders (what
//! the broker asks of them is what is checked; the root test `broker.rs` in tess-cli runs the
//! real ones).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tess_broker::config::Config;
use tess_broker::service::{Broker, Cells, Flows};
use tess_heartbeat::register::Listener;
use tess_heartbeat::{Heartbeat, Target};
use tess_proto::{CellInfo, CellUpdate};

/// Every process is in cell `video`; nothing else is asked of tessd for flows.
#[derive(Debug)]
struct OneCell;

impl Cells for OneCell {
    fn show(&mut self, name: &str) -> anyhow::Result<CellInfo> {
        anyhow::bail!("no cell {name} here")
    }
    fn cell_of(&mut self, _pid: i32) -> anyhow::Result<Option<String>> {
        Ok(Some("video".into()))
    }
    fn update(&mut self, name: &str, _: CellUpdate) -> anyhow::Result<()> {
        anyhow::bail!("no cell {name} here")
    }
}

/// One request to the network service: a flow and its share (`None`: cleared).
type Request = (String, Option<f64>);

/// What the broker asked of the network service, in order.
#[derive(Debug, Default, Clone)]
struct Recorder(Arc<Mutex<Vec<Request>>>);

impl Recorder {
    /// The latest request for `flow`.
    fn last(&self, flow: &str) -> Option<Option<f64>> {
        let v = self.0.lock().unwrap();
        v.iter().rev().find(|(f, _)| f == flow).map(|(_, s)| *s)
    }
}

impl Flows for Recorder {
    fn set(&mut self, flow: &str, mbps: f64) -> anyhow::Result<()> {
        self.0.lock().unwrap().push((flow.into(), Some(mbps)));
        Ok(())
    }
    fn clear(&mut self, flow: &str) -> anyhow::Result<()> {
        self.0.lock().unwrap().push((flow.into(), None));
        Ok(())
    }
}

fn accept_one(l: &Listener, b: &mut Broker<OneCell>) {
    let t0 = Instant::now();
    loop {
        if let Some(inc) = l.accept().unwrap() {
            b.admit(inc);
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no registration came"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn each_labelled_flow_is_brokered_on_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("broker.sock");
    let l = Listener::bind(&sock).unwrap();
    l.set_nonblocking(true).unwrap();
    let config = Config::parse(
        "policy = \"pacora\"\nperiod = \"200ms\"\n[network]\ncapacity = 10\nmargin = 0\n\
         [cells.\"video.net\"]\nfloor = 0.1\ninitial = 1\n[cells.\"video/s2.net\"]\ninitial = 2\n",
    )
    .unwrap();
    let rec = Recorder::default();
    let mut b = Broker::new(config, OneCell).with_flows(Box::new(rec.clone()));
    // 100 units a second each: stream 1's are 1250 bytes (1 Mbit/s), stream 2's 5000 (4 Mbit/s).
    let target = Some(Target::Rate(100.0));
    let s1 = Heartbeat::register_at("v@s1.net", target, &sock).unwrap();
    accept_one(&l, &mut b);
    let s2 = Heartbeat::register_at("v@s2.net", target, &sock).unwrap();
    accept_one(&l, &mut b);
    // The cell's own flow and its CPU beside them: heartbeats of their own.
    let own = Heartbeat::register_at("v.net", target, &sock).unwrap();
    accept_one(&l, &mut b);
    let cpu = Heartbeat::register_at("v", target, &sock).unwrap();
    accept_one(&l, &mut b);
    assert_eq!(rec.last("video"), Some(Some(1.0)));
    // Each flow starts at its own section's share, or at its cell's.
    assert_eq!(rec.last("video/s1"), Some(Some(1.0)));
    assert_eq!(rec.last("video/s2"), Some(Some(2.0)));
    // A second heartbeat of the same flow, and a label the service would refuse.
    let dup = Heartbeat::register_at("w@s1.net", target, &sock).unwrap();
    accept_one(&l, &mut b);
    let bad = Heartbeat::register_at("x@.net", target, &sock).unwrap();
    accept_one(&l, &mut b);
    // (Refused, they would try again every second.)
    drop((dup, bad));
    let st = b.status();
    assert_eq!(st.cells.len(), 4, "{:?}", st.refused);
    assert!(
        st.refused
            .iter()
            .any(|r| r.contains("flow 'video/s1' already has")),
        "{:?}",
        st.refused
    );
    assert!(
        st.refused.iter().any(|r| r.contains("flow label")),
        "{:?}",
        st.refused
    );
    let flows: Vec<_> = st.cells.iter().map(|c| c.flow.clone()).collect();
    let flow = |f: &str| Some(f.to_string());
    assert_eq!(
        flows,
        [flow("video/s1"), flow("video/s2"), flow("video"), None]
    );
    assert_eq!(st.cells[3].resource, "cpu");
    // Beyond 16 flow heartbeats a cell is refused.
    let more: Vec<Heartbeat> = (3..17)
        .map(|k| {
            let hb = Heartbeat::register_at(&format!("v@s{k}.net"), target, &sock).unwrap();
            accept_one(&l, &mut b);
            hb
        })
        .collect();
    let st = b.status();
    assert_eq!(st.cells.len(), 4 + 13, "{:?}", st.refused);
    assert!(
        st.refused.iter().any(|r| r.contains("16 flow heartbeats")),
        "{:?}",
        st.refused
    );
    drop(more);
    drop((own, cpu));
    let t0 = Instant::now();
    while b.status().cells.len() > 2 {
        b.reap();
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "heartbeats that went were not reaped"
        );
        std::thread::sleep(Duration::from_millis(10));
    }

    // Beat for a few periods: each flow is sized from its own units' sizes.
    let t0 = Instant::now();
    let mut rounds = 0;
    while t0.elapsed() < Duration::from_millis(1500) {
        s1.beat_with(1250);
        s2.beat_with(5000);
        if b.decide_due() {
            rounds += 1;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(rounds >= 3, "{rounds} rounds");
    let share = |f: &str| rec.last(f).flatten().unwrap_or(f64::NAN);
    let (a1, a2) = (share("video/s1"), share("video/s2"));
    assert!(
        (0.8..1.6).contains(&a1) && (3.2..6.4).contains(&a2),
        "stream 1 needs 1 Mbit/s and got {a1:.2}, stream 2 needs 4 and got {a2:.2}; {:?}",
        b.status()
    );

    // A stream that goes away gives its reservation back; the other keeps its own.
    drop(s1);
    let t0 = Instant::now();
    while rec.last("video/s1") != Some(None) {
        b.reap();
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "flow s1 was not cleared"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(b.status().cells.len(), 1);
    assert!(rec.last("video/s2").flatten().is_some());
    drop(s2);
}

#[test]
fn a_cell_whose_units_need_its_flow_holds_both_and_its_flow_needs_no_heartbeat() {
    // `network = true`: cell video's CPU heartbeat is an entry of both pools. Its flow starts
    // at the configured share when the heartbeat registers, a heartbeat of its own for that
    // flow is refused, and the flow is cleared when the CPU heartbeat goes.
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("broker.sock");
    let l = Listener::bind(&sock).unwrap();
    l.set_nonblocking(true).unwrap();
    let config = Config::parse(
        "policy = \"pacora\"\nperiod = \"200ms\"\n[network]\ncapacity = 10\n\
         [cells.video]\nnetwork = true\n[cells.\"video.net\"]\ninitial = 3\n",
    )
    .unwrap();
    let rec = Recorder::default();
    let mut b = Broker::new(config, OneCell).with_flows(Box::new(rec.clone()));
    let target = Some(Target::Rate(10.0));
    let cpu = Heartbeat::register_at("v", target, &sock).unwrap();
    accept_one(&l, &mut b);
    assert_eq!(rec.last("video"), Some(Some(3.0)));
    let own = Heartbeat::register_at("v.net", target, &sock).unwrap();
    accept_one(&l, &mut b);
    drop(own);
    let st = b.status();
    assert_eq!(st.cells.len(), 1, "{:?}", st.refused);
    let c = &st.cells[0];
    assert_eq!(
        (c.resource.as_str(), c.flow.as_deref(), c.flow_share),
        ("cpu+net", Some("video"), Some(3.0))
    );
    assert!(
        st.refused.iter().any(|r| r.contains("network = true")),
        "{:?}",
        st.refused
    );
    drop(cpu);
    let t0 = Instant::now();
    while rec.last("video") != Some(None) {
        b.reap();
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the flow was not cleared"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}
