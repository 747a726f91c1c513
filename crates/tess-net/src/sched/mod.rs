//! The per-flow scheduler of the network service: mClock (Gulati, Merchant and Varman, "mClock:
//! Handling Throughput Variability for Hypervisor IO Scheduling", OSDI 2010) adapted to packets,
//! plus latency bounds served by deadline (the future work of seed 000 section 4.2).
//!
//! # What it decides
//! The service is one server of fixed capacity, a **link** of `C_pps` packets/s and `C_bps`
//! bits/s. Each time the link is free, [`Scheduler::pick`] chooses which backlogged entity (a
//! flow with a QoS spec, or the best-effort aggregate) sends or delivers its next packet.
//!
//! # Link time
//! Everything is measured in link time. A packet of `b` payload bits occupies the link for
//! ```text
//! cost(b) = max(1 / C_pps, b / C_bps)        seconds
//! ```
//! A reservation `(r_pps, r_bps)` is a share of the link's time,
//! ```text
//! u = max(r_pps / C_pps, r_bps / C_bps)
//! ```
//! so that a flow served at its share gets `r_pps` packets/s when its packets are small and
//! `r_bps` bits/s when they are large, and admission is one sum (see [`admission`]).
//!
//! # Tags (per entity, for the packet at the head of its queue, which arrived at `a`)
//! ```text
//! R = max(R' , a)      R' <- R + cost(b) / u              reservation   (served under R or D)
//! L = max(L' , a)      L' <- L + max(1/l_pps, b/l_bps)    limit         (served in any phase)
//! P = P'               P' <- P + cost(b) / w              proportional  (served under P only)
//! D = a + d                                               deadline, flows with latency bound d
//! ```
//! Primes are the values kept between packets, advanced when a packet is served; `b` is the
//! size of the packet just served (tags are charged after service, which for FIFO queues is
//! the same as mClock's tagging at arrival). When an entity becomes backlogged, its `P'` is
//! raised to the virtual time `V` (the `P` of the latest packet served by weight), so that an
//! entity that was idle neither hoards credit nor starves others: mClock's idle-VM adjustment,
//! written as start-time fair queueing's virtual clock.
//!
//! # Choosing, at time `t`
//! 1. **Reservation phase**: among entities that are *eligible*, the smallest key wins:
//!    - with a latency bound `d`: eligible when `R <= t + d` (the reservation, allowed to run up
//!      to `d` ahead: a burst of `u * d` link time), key `D = a + d`;
//!    - with a reservation only: eligible when `R <= t`, key `R` (mClock's constraint phase).
//!
//!    This is earliest-deadline-first over reservation tags and deadlines together. The
//!    packet's `R'` advances; `P'` does not (reserved service is not part of the excess).
//! 2. **Weight phase**: among entities with `L <= t`, the smallest `P` wins. `P'` and `L'`
//!    advance; `R'` stays (mClock's "subtract 1/r from the R tags" after weight-based service),
//!    so the excess comes on top of the reservation: an entity gets its reservation plus a
//!    share of what the reservations leave, in proportion to its weight, up to its limit.
//! 3. Otherwise every backlogged entity is at its limit: wait until the earliest `L`.
//!
//! Flows without a spec form one **best-effort** entity (weight `w_be`, no reservation); inside
//! it the service serves their packets first come, first served, as a network stack without QoS
//! does. A flow that sends as fast as it can therefore gets what the reservations leave, shared
//! with the other flows by weight.
//!
//! # Glossary
//! - **entity**: what the scheduler sees: one flow with a spec, or the best-effort aggregate.
//! - **backlogged**: has a packet waiting (a send in its channel, or a datagram in its socket
//!   with room in its channel).
//! - **head**: the oldest waiting packet of an entity; `a` is its arrival (the client's send time
//!   or when the service saw the socket readable).
//! - **link time**: seconds of the server's capacity a packet uses, `cost(b)`.
//! - **share `u`**: fraction of link time reserved.
//! - **blocking time**: the longest the service is committed to others when a packet arrives
//!   (one dispatch: a batch of at most the quantum, or one maximal packet).
//!
//! # Worked example
//! Link 1 Gbit/s and 250 kpps (`cost` = 4 us for packets up to 500 bytes, `b`/1e9 above). The
//! synthesizer's flow reserves 240 Mbit/s (`u` = max(0, 0.24) = 0.24) with a latency bound of
//! 500 us; an abusive flow without a spec streams 1472-byte datagrams (cost 11.8 us).
//! - A 792-byte input packet of the synthesizer (6336 bits, cost 6.3 us) arrives at
//!   `a` = 1000 us with `R'` = 990 us: `R` = 1000 us <= t + 500 us, so it is eligible with key
//!   `D` = 1500 us and goes before any best-effort packet; `R'` becomes 1000 + 6.3 / 0.24 =
//!   1026.4 us. At 22,050 packets/s (one every 45.35 us) `R'` never runs ahead: the flow is
//!   always eligible, and waits at most for the dispatch in progress.
//! - The abusive flow is always backlogged and is served in the weight phase whenever the
//!   synthesizer has nothing eligible: it gets the 1 Gbit/s minus the synthesizer's 151 Mbit/s.
//! - Had the synthesizer reserved 150 Mbit/s without a latency bound (`u` = 0.15, spacing
//!   42.2 us per input packet, 55.9 us per answer), its `R'` would creep ahead of real time by
//!   about 5 us per package and its packets would wait for the weight phase, sharing the excess
//!   with the abuser by weight.
//!
//! # Cost
//! [`Scheduler::pick`] scans the entities: O(n) per packet, fine for the tens of flows of a
//! machine; a heap per phase would make it O(log n).

pub mod admission;
#[cfg(test)]
mod tests;

use tess_net_client::Throughput;

/// The server the scheduler shares: packets/s and bits/s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Link {
    /// Packets per second.
    pub pps: f64,
    /// Bits per second.
    pub bps: f64,
}

impl Link {
    /// A link of `capacity` (both fields must be positive).
    pub fn new(capacity: Throughput) -> Link {
        Link {
            pps: capacity.pps.max(1) as f64,
            bps: capacity.bps.max(1) as f64,
        }
    }

    /// Link time of a packet of `bits` payload bits, in nanoseconds.
    #[inline]
    pub fn cost_ns(&self, bits: u64) -> f64 {
        (1e9 / self.pps).max(bits as f64 * 1e9 / self.bps)
    }

    /// The share of link time a reservation takes: `max(r_pps / C_pps, r_bps / C_bps)`.
    pub fn share(&self, r: Throughput) -> f64 {
        (r.pps as f64 / self.pps).max(r.bps as f64 / self.bps)
    }
}

/// What the scheduler needs of a spec.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct EntitySpec {
    /// Reserved share of link time, 0 for none.
    pub share: f64,
    /// Weight for the excess (>= 1).
    pub weight: u32,
    /// Limit; zero fields are unlimited.
    pub limit: Throughput,
    /// Latency bound, ns.
    pub latency_ns: Option<u64>,
}

impl EntitySpec {
    /// The spec of a QoS spec on `link`.
    pub fn from_qos(link: &Link, q: &tess_net_client::QosSpec) -> EntitySpec {
        EntitySpec {
            share: link.share(q.reservation),
            weight: q.weight.max(1),
            limit: q.limit.unwrap_or(Throughput::ZERO),
            latency_ns: q.latency_ns.filter(|&d| d > 0),
        }
    }

    /// Best effort with weight `w`.
    pub fn best_effort(weight: u32) -> EntitySpec {
        EntitySpec {
            share: 0.0,
            weight: weight.max(1),
            limit: Throughput::ZERO,
            latency_ns: None,
        }
    }

    fn limit_spacing_ns(&self, bits: u64) -> f64 {
        let p = if self.limit.pps > 0 {
            1e9 / self.limit.pps as f64
        } else {
            0.0
        };
        let b = if self.limit.bps > 0 {
            bits as f64 * 1e9 / self.limit.bps as f64
        } else {
            0.0
        };
        p.max(b)
    }
}

/// Handle of an entity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EntityId(pub usize);

/// Under which rule a packet is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// By deadline, within the reservation (latency-bound flows).
    Deadline,
    /// By reservation tag.
    Reservation,
    /// By proportional tag, sharing the excess.
    Weight,
}

impl Phase {
    /// Whether the packet counts as reserved service.
    pub fn is_reserved(self) -> bool {
        matches!(self, Phase::Deadline | Phase::Reservation)
    }
}

/// The outcome of [`Scheduler::pick`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pick {
    /// Serve the head of this entity under this phase.
    Serve(EntityId, Phase),
    /// Everything backlogged is at its limit until this time (ns).
    WaitUntil(u64),
    /// Nothing is backlogged.
    Idle,
}

#[derive(Debug, Clone)]
struct Entity {
    spec: EntitySpec,
    /// Head arrival, ns; `None` when idle.
    head: Option<u64>,
    r_next: f64,
    l_next: f64,
    p_next: f64,
}

/// mClock with deadlines over a set of entities (module docs).
#[derive(Debug, Clone)]
pub struct Scheduler {
    link: Link,
    entities: Vec<Option<Entity>>,
    /// Virtual time: the P tag of the latest packet served by weight.
    vtime: f64,
}

impl Scheduler {
    /// A scheduler for `link`.
    pub fn new(link: Link) -> Scheduler {
        Scheduler {
            link,
            entities: Vec::new(),
            vtime: 0.0,
        }
    }

    /// The link.
    pub fn link(&self) -> &Link {
        &self.link
    }

    /// Adds an idle entity.
    pub fn add(&mut self, spec: EntitySpec) -> EntityId {
        let e = Entity {
            spec,
            head: None,
            r_next: 0.0,
            l_next: 0.0,
            p_next: self.vtime,
        };
        if let Some(i) = self.entities.iter().position(Option::is_none) {
            self.entities[i] = Some(e);
            EntityId(i)
        } else {
            self.entities.push(Some(e));
            EntityId(self.entities.len() - 1)
        }
    }

    /// Changes an entity's spec (its tags stay).
    pub fn update(&mut self, id: EntityId, spec: EntitySpec) {
        if let Some(Some(e)) = self.entities.get_mut(id.0) {
            e.spec = spec;
        }
    }

    /// Removes an entity.
    pub fn remove(&mut self, id: EntityId) {
        if let Some(slot) = self.entities.get_mut(id.0) {
            *slot = None;
        }
    }

    /// The spec of an entity.
    pub fn spec(&self, id: EntityId) -> Option<&EntitySpec> {
        self.entities.get(id.0)?.as_ref().map(|e| &e.spec)
    }

    /// Says whether an entity has a packet waiting and when its head arrived (ns). An entity
    /// that becomes backlogged has its proportional tag raised to the virtual time.
    pub fn set_head(&mut self, id: EntityId, arrival_ns: Option<u64>) {
        let vtime = self.vtime;
        let Some(Some(e)) = self.entities.get_mut(id.0) else {
            return;
        };
        if e.head.is_none() && arrival_ns.is_some() {
            e.p_next = e.p_next.max(vtime);
        }
        e.head = arrival_ns;
    }

    /// Whether an entity is backlogged.
    pub fn is_backlogged(&self, id: EntityId) -> bool {
        matches!(
            self.entities.get(id.0),
            Some(Some(Entity { head: Some(_), .. }))
        )
    }

    /// Chooses what to serve at `now_ns` (module docs, "Choosing").
    pub fn pick(&self, now_ns: u64) -> Pick {
        let t = now_ns as f64;
        let mut best_res: Option<(f64, usize, Phase)> = None;
        let mut best_w: Option<(f64, usize)> = None;
        let mut wait = f64::INFINITY;
        let mut any = false;
        for (i, e) in self.entities.iter().enumerate() {
            let Some(e) = e else { continue };
            let Some(a) = e.head else { continue };
            any = true;
            let a = a as f64;
            if e.spec.share > 0.0 {
                let r = e.r_next.max(a);
                let (eligible_at, key, phase) = match e.spec.latency_ns {
                    Some(d) => (r - d as f64, a + d as f64, Phase::Deadline),
                    None => (r, r, Phase::Reservation),
                };
                if eligible_at <= t {
                    if best_res.is_none_or(|(k, _, _)| key < k) {
                        best_res = Some((key, i, phase));
                    }
                } else {
                    wait = wait.min(eligible_at);
                }
            }
            let l = e.l_next.max(a);
            if l <= t {
                let p = e.p_next;
                if best_w.is_none_or(|(k, _)| p < k) {
                    best_w = Some((p, i));
                }
            } else {
                wait = wait.min(l);
            }
        }
        if let Some((_, i, phase)) = best_res {
            return Pick::Serve(EntityId(i), phase);
        }
        if let Some((_, i)) = best_w {
            return Pick::Serve(EntityId(i), Phase::Weight);
        }
        if !any {
            return Pick::Idle;
        }
        Pick::WaitUntil(wait.ceil().max(t) as u64)
    }

    /// Charges one packet of `bits` payload bits served from `id` under `phase`. Call it once
    /// per packet, then [`set_head`](Self::set_head) with the next head (or `None`).
    pub fn charge(&mut self, id: EntityId, phase: Phase, bits: u64) {
        let cost = self.link.cost_ns(bits);
        let Some(Some(e)) = self.entities.get_mut(id.0) else {
            return;
        };
        let a = e.head.unwrap_or(0) as f64;
        let r = e.r_next.max(a);
        let l = e.l_next.max(a);
        e.l_next = l + e.spec.limit_spacing_ns(bits);
        match phase {
            Phase::Deadline | Phase::Reservation => {
                if e.spec.share > 0.0 {
                    e.r_next = r + cost / e.spec.share;
                }
            }
            Phase::Weight => {
                e.r_next = r;
                let p = e.p_next;
                e.p_next = p + cost / f64::from(e.spec.weight.max(1));
                self.vtime = self.vtime.max(p);
            }
        }
    }
}
