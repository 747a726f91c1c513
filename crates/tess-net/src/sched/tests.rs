//! Property tests of the scheduler on a simulated link: reservations met under overload,
//! proportional shares of the excess, limits respected, deadlines met when admission says they
//! are feasible.

use super::admission;
use super::*;
use proptest::prelude::*;
use std::collections::VecDeque;
use tess_net_client::{QosSpec, Throughput};

const LINK: Throughput = Throughput {
    pps: 250_000,
    bps: 1_000_000_000,
};

#[derive(Debug, Clone)]
enum Arrivals {
    /// Always has a packet waiting.
    Greedy,
    /// `burst` packets every `period_ns`, starting at `phase_ns`.
    Periodic {
        period_ns: u64,
        burst: usize,
        phase_ns: u64,
    },
}

#[derive(Debug, Clone)]
struct SimFlow {
    spec: EntitySpec,
    arrivals: Arrivals,
    bits: u64,
}

#[derive(Debug, Default, Clone)]
struct Outcome {
    link_ns: f64,
    bits: u64,
    packets: u64,
    late: u64,
    worst_slack_ns: f64,
    reserved: u64,
}

/// Serves the flows on a link for `duration_ns`, one packet at a time (non-preemptive).
fn simulate(flows: &[SimFlow], duration_ns: u64) -> Vec<Outcome> {
    let link = Link::new(LINK);
    let mut s = Scheduler::new(link);
    let ids: Vec<EntityId> = flows.iter().map(|f| s.add(f.spec)).collect();
    let mut queues: Vec<VecDeque<u64>> = vec![VecDeque::new(); flows.len()];
    let mut next_arrival: Vec<u64> = flows
        .iter()
        .map(|f| match f.arrivals {
            Arrivals::Greedy => 0,
            Arrivals::Periodic { phase_ns, .. } => phase_ns,
        })
        .collect();
    let mut out = vec![
        Outcome {
            worst_slack_ns: f64::INFINITY,
            ..Outcome::default()
        };
        flows.len()
    ];
    let mut t: u64 = 0;
    while t < duration_ns {
        for (i, f) in flows.iter().enumerate() {
            match f.arrivals {
                Arrivals::Greedy => {
                    // A sender that keeps its channel full: a deep queue of old requests.
                    while queues[i].len() < GREEDY_DEPTH {
                        queues[i].push_back(t);
                    }
                }
                Arrivals::Periodic {
                    period_ns, burst, ..
                } => {
                    while next_arrival[i] <= t {
                        for _ in 0..burst {
                            queues[i].push_back(next_arrival[i]);
                        }
                        next_arrival[i] += period_ns;
                    }
                }
            }
            s.set_head(ids[i], queues[i].front().copied());
        }
        let next_periodic = flows
            .iter()
            .enumerate()
            .filter(|(_, f)| matches!(f.arrivals, Arrivals::Periodic { .. }))
            .map(|(i, _)| next_arrival[i])
            .min()
            .unwrap_or(u64::MAX);
        match s.pick(t) {
            Pick::Serve(id, phase) => {
                let i = ids.iter().position(|&x| x == id).unwrap();
                let a = queues[i].pop_front().unwrap();
                let cost = link.cost_ns(flows[i].bits);
                s.charge(id, phase, flows[i].bits);
                s.set_head(id, queues[i].front().copied());
                let done = t as f64 + cost;
                let o = &mut out[i];
                o.link_ns += cost;
                o.bits += flows[i].bits;
                o.packets += 1;
                if phase.is_reserved() {
                    o.reserved += 1;
                }
                if let Some(d) = flows[i].spec.latency_ns {
                    let slack = a as f64 + d as f64 - done;
                    o.worst_slack_ns = o.worst_slack_ns.min(slack);
                    if slack < -1.0 {
                        o.late += 1;
                    }
                }
                t = done.ceil() as u64;
            }
            Pick::WaitUntil(w) => t = w.min(next_periodic).max(t + 1),
            Pick::Idle => t = next_periodic.max(t + 1),
        }
    }
    out
}

fn share_of(o: &Outcome, duration_ns: u64) -> f64 {
    o.link_ns / duration_ns as f64
}

fn reserved(share: f64, weight: u32) -> EntitySpec {
    EntitySpec {
        share,
        weight,
        limit: Throughput::ZERO,
        latency_ns: None,
    }
}

const SIM_NS: u64 = 200_000_000;
const GREEDY_DEPTH: usize = 64;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Every flow keeps its reserved share of link time while all of them, and a best-effort
    /// hog, send as fast as they can.
    #[test]
    fn reservations_are_met_under_overload(
        raw in proptest::collection::vec((1u32..100, 1u32..8, 64u64..1500), 1..5),
        total in 0.3f64..0.95,
    ) {
        let sum: u32 = raw.iter().map(|r| r.0).sum();
        let mut flows: Vec<SimFlow> = raw
            .iter()
            .map(|&(part, w, bytes)| SimFlow {
                spec: reserved(total * f64::from(part) / f64::from(sum), w),
                arrivals: Arrivals::Greedy,
                bits: bytes * 8,
            })
            .collect();
        flows.push(SimFlow {
            spec: EntitySpec::best_effort(100),
            arrivals: Arrivals::Greedy,
            bits: 1472 * 8,
        });
        let out = simulate(&flows, SIM_NS);
        for (f, o) in flows.iter().zip(&out) {
            let got = share_of(o, SIM_NS);
            prop_assert!(got + 0.005 >= f.spec.share, "share {} got {got}", f.spec.share);
        }
    }

    /// Without reservations, greedy flows split the link in proportion to their weights.
    #[test]
    fn excess_is_shared_by_weight(
        raw in proptest::collection::vec((1u32..10, 64u64..1500), 2..5),
    ) {
        let flows: Vec<SimFlow> = raw
            .iter()
            .map(|&(w, bytes)| SimFlow {
                spec: EntitySpec::best_effort(w),
                arrivals: Arrivals::Greedy,
                bits: bytes * 8,
            })
            .collect();
        let wsum: u32 = raw.iter().map(|r| r.0).sum();
        let out = simulate(&flows, SIM_NS);
        for (f, o) in flows.iter().zip(&out) {
            let want = f64::from(f.spec.weight) / f64::from(wsum);
            let got = share_of(o, SIM_NS);
            prop_assert!((got - want).abs() < 0.01, "weight {} want {want} got {got}", f.spec.weight);
        }
    }

    /// Reserved flows get their reservation plus a weighted share of what is left.
    #[test]
    fn reservation_plus_excess(
        u in 0.05f64..0.6,
        w_res in 1u32..5,
        w_be in 1u32..5,
    ) {
        let flows = vec![
            SimFlow { spec: reserved(u, w_res), arrivals: Arrivals::Greedy, bits: 800 * 8 },
            SimFlow { spec: EntitySpec::best_effort(w_be), arrivals: Arrivals::Greedy, bits: 1472 * 8 },
        ];
        let out = simulate(&flows, SIM_NS);
        let excess = 1.0 - u;
        let want = u + excess * f64::from(w_res) / f64::from(w_res + w_be);
        let got = share_of(&out[0], SIM_NS);
        prop_assert!((got - want).abs() < 0.01, "want {want} got {got}");
    }

    /// A limited flow never exceeds its limit, however much it sends, and the link stays busy
    /// for the others.
    #[test]
    fn limits_are_respected(
        limit_mbit in 10u64..600,
        bytes in 200u64..1500,
        w in 1u32..20,
    ) {
        let limit = Throughput::bits(limit_mbit * 1_000_000);
        let flows = vec![
            SimFlow {
                spec: EntitySpec { limit, ..EntitySpec::best_effort(w) },
                arrivals: Arrivals::Greedy,
                bits: bytes * 8,
            },
            SimFlow { spec: EntitySpec::best_effort(1), arrivals: Arrivals::Greedy, bits: 1000 * 8 },
        ];
        let out = simulate(&flows, SIM_NS);
        let allowed = limit.bps as f64 * SIM_NS as f64 / 1e9 + (bytes * 8) as f64;
        prop_assert!(out[0].bits as f64 <= allowed, "{} > {allowed}", out[0].bits);
        let busy = (out[0].link_ns + out[1].link_ns) / SIM_NS as f64;
        prop_assert!(busy > 0.99, "link busy {busy}");
    }

    /// Latency-bound flows whose traffic stays within their reservation meet every deadline
    /// when admission accepts them, beside greedy flows with large packets.
    #[test]
    fn deadlines_are_met_when_feasible(
        raw in proptest::collection::vec((5u64..25, 1usize..4, 100u64..1500, 0u64..1000), 1..4),
        d_us in proptest::collection::vec(150u64..2000, 4),
        hog_bytes in 500u64..1500,
    ) {
        let link = Link::new(LINK);
        let mut flows = Vec::new();
        let mut specs = Vec::new();
        for (k, &(pct, burst, bytes, phase_us)) in raw.iter().enumerate() {
            let share = pct as f64 / 100.0;
            let cost = link.cost_ns(bytes * 8);
            // The flow's own traffic: `burst` packets every period, exactly its reservation.
            let period_ns = (burst as f64 * cost / share).ceil() as u64;
            let d = d_us[k] * 1000;
            flows.push(SimFlow {
                spec: EntitySpec { share, weight: 1, limit: Throughput::ZERO, latency_ns: Some(d) },
                arrivals: Arrivals::Periodic { period_ns, burst, phase_ns: phase_us * 1000 },
                bits: bytes * 8,
            });
            specs.push((format!("f{k}"), QosSpec {
                // Expressed in packets/s at the link's packet rate, the share is exact.
                reservation: Throughput { pps: (share * LINK.pps as f64).round() as u64, bps: 0 },
                latency_ns: Some(d),
                ..QosSpec::default()
            }));
        }
        flows.push(SimFlow {
            spec: EntitySpec::best_effort(1),
            arrivals: Arrivals::Greedy,
            bits: hog_bytes * 8,
        });
        let blocking = link.cost_ns(1500 * 8).ceil() as u64;
        let feasible = admission::check(
            "net",
            &link,
            blocking,
            specs.iter().map(|(k, s)| (k.as_str(), s)),
        )
        .is_ok();
        prop_assume!(feasible);
        let out = simulate(&flows, SIM_NS);
        for (f, o) in flows.iter().zip(&out) {
            if f.spec.latency_ns.is_some() {
                prop_assert!(o.packets > 0);
                prop_assert_eq!(o.late, 0, "worst slack {} ns", o.worst_slack_ns);
            }
        }
    }
}

#[test]
fn an_idle_flow_does_not_hoard_credit() {
    // Flow 0 sleeps for the first half, then both are greedy: from then on they split evenly
    // rather than flow 0 catching up on what it did not use.
    let link = Link::new(LINK);
    let mut s = Scheduler::new(link);
    let a = s.add(EntitySpec::best_effort(1));
    let b = s.add(EntitySpec::best_effort(1));
    let cost = link.cost_ns(1000 * 8);
    let mut t = 0.0f64;
    s.set_head(b, Some(0));
    while t < 1e7 {
        let Pick::Serve(id, ph) = s.pick(t as u64) else {
            panic!()
        };
        assert_eq!(id, b);
        s.charge(id, ph, 8000);
        t += cost;
    }
    s.set_head(a, Some(t as u64));
    let mut served = [0u32; 2];
    for _ in 0..1000 {
        let Pick::Serve(id, ph) = s.pick(t as u64) else {
            panic!()
        };
        served[id.0] += 1;
        s.charge(id, ph, 8000);
        t += cost;
    }
    assert!(
        (served[0] as i32 - served[1] as i32).abs() <= 2,
        "{served:?}"
    );
}

#[test]
fn limited_flows_wait_rather_than_exceed() {
    let link = Link::new(LINK);
    let mut s = Scheduler::new(link);
    let a = s.add(EntitySpec {
        limit: Throughput { pps: 1000, bps: 0 },
        ..EntitySpec::best_effort(1)
    });
    s.set_head(a, Some(0));
    assert_eq!(s.pick(0), Pick::Serve(a, Phase::Weight));
    s.charge(a, Phase::Weight, 800);
    assert_eq!(s.pick(10), Pick::WaitUntil(1_000_000));
    s.set_head(a, None);
    assert_eq!(s.pick(10), Pick::Idle);
}

#[test]
fn deadline_flows_go_first_within_their_reservation() {
    let link = Link::new(LINK);
    let mut s = Scheduler::new(link);
    let be = s.add(EntitySpec::best_effort(100));
    let rt = s.add(EntitySpec {
        share: 0.2,
        weight: 1,
        limit: Throughput::ZERO,
        latency_ns: Some(500_000),
    });
    s.set_head(be, Some(0));
    s.set_head(rt, Some(1_000));
    assert_eq!(s.pick(2_000), Pick::Serve(rt, Phase::Deadline));
    // A burst: the reservation may run ahead by the latency bound (0.2 x 500 us = 100 us of
    // link time = 12 packets of 8 us), then the flow competes by weight only.
    let mut reserved = 0;
    for _ in 0..40 {
        match s.pick(2_000) {
            Pick::Serve(id, Phase::Deadline) if id == rt => {
                s.charge(rt, Phase::Deadline, 8000);
                reserved += 1;
            }
            _ => break,
        }
    }
    assert!((12..=14).contains(&reserved), "{reserved}");
    assert_eq!(s.pick(2_000), Pick::Serve(be, Phase::Weight));
}
