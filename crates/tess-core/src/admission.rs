//! Admission control: can this whole set of cells be guaranteed at once?
//!
//! Each hart runs its own EDF scheduler (Tessellation's per-hart muxers, seed 004 section 3.2;
//! Linux `SCHED_DEADLINE` on a per-hart root domain). On every hart `h` the cells placed there
//! contribute sporadic servers `(C_i, D_i, T_i)` ([`crate::spec::Policy::server`]). A hart is
//! admitted when all of these hold:
//!
//! 1. **Utilization**: `U_h = sum C_i / T_i <= 1 - headroom` (the headroom, 5% by default, is
//!    left to the system).
//! 2. **Kernel limit**: the `SCHED_DEADLINE` part (time- and event-triggered cells) fits what the
//!    kernel itself admits per hart (`sched_rt_runtime_us / sched_rt_period_us` minus the fair
//!    server), so that enforcement cannot fail after admission said yes.
//! 3. **Processor demand** (Baruah, Rosier and Howell 1990): time-triggered windows have
//!    deadlines shorter than their periods, so utilization alone is not enough. With the demand
//!    bound function `dbf_i(t) = max(0, floor((t - D_i) / T_i) + 1) * C_i`, EDF meets every
//!    deadline iff `sum_i dbf_i(t) <= t` at every absolute deadline `t` up to
//!    `L = max(D_max, sum_i (T_i - D_i) U_i / (1 - U))`.
//! 4. **Windows**: time-triggered windows on one hart never overlap. Windows
//!    `[o1 + j*P1, o1 + j*P1 + A1)` and `[o2 + k*P2, o2 + k*P2 + A2)` meet for some `j, k` iff
//!    `r = (o2 - o1) mod g` satisfies `r < A1` or `r > g - A2`, where `g = gcd(P1, P2)`
//!    (every difference `k*P2 - j*P1` is a multiple of `g`, Bezout).
//! 5. **Dedicated harts** belong to one cell, and at least `min_system_harts` harts stay shared.
//! 6. **Group servers** (cgroup v1 with RT group scheduling, [`Capacity::group_servers`]): an
//!    event-triggered cell is then served by its cpu cgroup's RT bandwidth `(B_g, P_g)` instead
//!    of per-thread `SCHED_DEADLINE` (see `docs/architecture.md`, "Reservations belong to
//!    cells"). Group servers run at rate-monotonic RT priorities ([`group_priority`]: the
//!    shorter the period, the higher). Every `SCHED_DEADLINE` thread preempts a group server,
//!    and so does every group server of the same or a higher priority on its hart, so it is
//!    guaranteed `B_g` in each of its periods when `B_g + sum_i W_i(P_g) <= P_g * limit` over
//!    those, with `W_i(t) = min(t, ceil((t + D_i) / T_i) * C_i)`
//!    the most a server `(C_i, D_i, T_i)` can run in any interval of length `t` (a job runs
//!    between its release and its deadline, releases are at least `T_i` apart). Best-effort
//!    cells (CFS) never delay it. The kernel checks RT bandwidth per cgroup, not per hart: the
//!    sum of `B_g / P_g` over all group servers must stay within the kernel's RT limit
//!    (`sched_rt_runtime_us / sched_rt_period_us`), whatever harts they sit on.
//!
//! Worked example of rule 6: a group server 2ms/10ms beside a time-triggered window
//! `(3ms, 3ms, 20ms)`: `W(10ms) = min(10, ceil(13/20) * 3) = 3ms`, and 2 + 3 = 5ms <= 9.5ms.
//!
//! Worked example of rule 3: a time-triggered cell `(2ms, 2ms, 10ms)` and an event-triggered
//! cell `(2.4ms, 5ms, 5ms)` use 0.2 + 0.48 = 0.68 of the hart, yet in the first 5 ms both must
//! finish work due by then: dbf(5ms) = 2 + 2.4 = 4.4ms <= 5ms, fine; with a 5 ms window
//! `(5ms, 5ms, 10ms)` instead, dbf(5ms) = 5 + 2.4 = 7.4ms > 5ms and the set is refused
//! although U = 0.98 alone would have passed a 100% limit.

use crate::spec::Server;
use crate::state::Cluster;
use crate::units::format_duration;
use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;
use tess_sched::HartSet;

/// What the machine offers.
#[derive(Debug, Clone, PartialEq)]
pub struct Capacity {
    /// Harts tess may hand out.
    pub harts: HartSet,
    /// Largest fraction of a hart the cells on it may claim (1 - headroom).
    pub utilization_limit: f64,
    /// Largest `SCHED_DEADLINE` bandwidth per hart that the kernel admits.
    pub kernel_reservation_limit: f64,
    /// Harts that must stay shared (not dedicated), for everything outside cells.
    pub min_system_harts: usize,
    /// `Some(limit)` when event-triggered cells are served by RT group bandwidth (cgroup v1
    /// with `CONFIG_RT_GROUP_SCHED`, rule 6): `limit` is the kernel's RT bandwidth ratio, which
    /// bounds the sum of `B / P` over all such cells. `None`: per-thread `SCHED_DEADLINE`.
    pub group_servers: Option<f64>,
}

impl Capacity {
    /// Default limits on `harts`: 5% headroom, kernel limit assumed equal, one system hart.
    pub fn new(harts: HartSet) -> Capacity {
        Capacity {
            harts,
            utilization_limit: 0.95,
            kernel_reservation_limit: 0.95,
            min_system_harts: 1,
            group_servers: None,
        }
    }
}

/// A request that cannot be guaranteed. Every message names the resource, the hart and the
/// amount.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AdmissionError {
    /// A hart that does not exist (or is not managed by tess).
    #[error("cell '{cell}' asks for hart {hart}, but the harts available are {available}")]
    UnknownHart {
        /// Cell.
        cell: String,
        /// Requested hart.
        hart: usize,
        /// What exists.
        available: HartSet,
    },
    /// Two dedicated cells want one hart.
    #[error("hart {hart} is dedicated to cell '{first}'; cell '{second}' asks for it too")]
    DedicatedTwice {
        /// Hart.
        hart: usize,
        /// Current owner.
        first: String,
        /// Second claimant.
        second: String,
    },
    /// A dedicated hart would also run another cell.
    #[error(
        "hart {hart} cannot be dedicated to cell '{dedicated}' while cell '{other}' runs there too"
    )]
    DedicatedShared {
        /// Hart.
        hart: usize,
        /// Dedicated owner.
        dedicated: String,
        /// The other cell.
        other: String,
    },
    /// Too many harts dedicated.
    #[error("dedicating harts {dedicated} would leave {left} shared hart(s) for the system; at least {needed} must stay shared")]
    NoSystemHart {
        /// All dedicated harts after the change.
        dedicated: HartSet,
        /// Shared harts left.
        left: usize,
        /// Required minimum.
        needed: usize,
    },
    /// Utilization over the limit.
    #[error("cpu time on hart {hart} over-committed by {:.1}%: cells need {:.1}% ({}), the limit is {:.1}%", (demand - limit) * 100.0, demand * 100.0, list_shares(cells), limit * 100.0)]
    Overcommitted {
        /// Hart.
        hart: usize,
        /// Total claimed fraction.
        demand: f64,
        /// Limit.
        limit: f64,
        /// Each cell's share.
        cells: Vec<(String, f64)>,
    },
    /// `SCHED_DEADLINE` bandwidth over what the kernel admits.
    #[error("SCHED_DEADLINE bandwidth on hart {hart} over-committed by {:.1}%: reservations need {:.1}% ({}), the kernel admits {:.1}% per hart", (demand - limit) * 100.0, demand * 100.0, list_shares(cells), limit * 100.0)]
    KernelLimit {
        /// Hart.
        hart: usize,
        /// Reserved fraction.
        demand: f64,
        /// Kernel's per-hart limit.
        limit: f64,
        /// Each reservation.
        cells: Vec<(String, f64)>,
    },
    /// EDF processor demand exceeds supply in some interval.
    #[error("cpu time on hart {hart} over-committed within {}: work due in the first {} adds up to {} ({}), {} more than the hart has", format_duration(*interval), format_duration(*interval), format_duration(*demand), list_durations(cells), format_duration(demand.saturating_sub(*interval)))]
    DemandBound {
        /// Hart.
        hart: usize,
        /// Interval length t at which dbf(t) > t.
        interval: Duration,
        /// dbf(t).
        demand: Duration,
        /// Each cell's part of dbf(t).
        cells: Vec<(String, Duration)>,
    },
    /// Time-triggered windows overlap.
    #[error("time-triggered windows collide on hart {hart}: cell '{a}' runs {} and cell '{b}' runs {}", describe_window(*a_window), describe_window(*b_window))]
    WindowCollision {
        /// Hart.
        hart: usize,
        /// First cell.
        a: String,
        /// Its window (offset, active, period).
        a_window: (Duration, Duration, Duration),
        /// Second cell.
        b: String,
        /// Its window.
        b_window: (Duration, Duration, Duration),
    },
    /// Not enough suitable harts for a count request.
    #[error("cell '{cell}' asks for {requested} {kind} hart(s) but only {found} can take it{}", if detail.is_empty() { String::new() } else { format!(": {detail}") })]
    NotEnoughHarts {
        /// Cell.
        cell: String,
        /// Harts asked for.
        requested: usize,
        /// Suitable harts found.
        found: usize,
        /// "dedicated" or the policy name.
        kind: String,
        /// Why the others cannot.
        detail: String,
    },
    /// A group server would not get its budget in every one of its periods (rule 6).
    #[error("cell '{cell}' on hart {hart} could be denied {} of its {} budget within one {} period: reservations that preempt it can take {} of it ({}), and {:.1}% of each period is the limit", format_duration((*budget + *interference).saturating_sub(Duration::from_secs_f64(period.as_secs_f64() * limit))), format_duration(*budget), format_duration(*period), format_duration(*interference), list_durations(cells), limit * 100.0)]
    GroupStarved {
        /// Hart.
        hart: usize,
        /// The group-served cell.
        cell: String,
        /// Its budget per period.
        budget: Duration,
        /// Its period.
        period: Duration,
        /// Most the others can run in one such period.
        interference: Duration,
        /// Each other cell's part.
        cells: Vec<(String, Duration)>,
        /// Fraction of the period available to reservations.
        limit: f64,
    },
    /// The group servers together exceed the kernel's RT bandwidth (rule 6).
    #[error("RT group bandwidth over-committed by {:.1}%: group-served cells need {:.1}% ({}) and the kernel's RT limit of {:.1}% counts them together, whatever harts they run on", (demand - limit) * 100.0, demand * 100.0, list_shares(cells), limit * 100.0)]
    GroupLimit {
        /// Sum of B / P.
        demand: f64,
        /// Kernel RT ratio.
        limit: f64,
        /// Each cell's share.
        cells: Vec<(String, f64)>,
    },
    /// Group servers on more than one hart (rule 6).
    #[error("cell '{cell}' (on harts {harts}) cannot be an RT group server beside '{other}' (on hart {other_hart}): the kernel's RT bandwidth timer refills a group only on the harts of the scheduling domain it fires in, and tess gives reserved harts domains of their own, so group servers on two harts would freeze one of them; put every event-triggered cell on hart {other_hart} (`--hart-ids {other_hart}`, `hart-ids = [{other_hart}]`)")]
    GroupHarts {
        /// The cell that would add a hart.
        cell: String,
        /// Its harts.
        harts: HartSet,
        /// A group server already placed.
        other: String,
        /// That cell's hart.
        other_hart: usize,
    },
    /// A pinned cell would change.
    #[error("cell '{cell}' is pinned: its allocation cannot change (unpin it first with `tess cell unpin {cell}`)")]
    Pinned {
        /// Cell.
        cell: String,
    },
    /// Over a user's quota.
    #[error("user {uid}'s quota allows {limit} of {resource}; this change would use {requested}")]
    Quota {
        /// User.
        uid: u32,
        /// Resource name.
        resource: String,
        /// Quota.
        limit: String,
        /// Amount after the change.
        requested: String,
    },
}

fn list_shares(cells: &[(String, f64)]) -> String {
    cells
        .iter()
        .map(|(n, u)| format!("{n} {:.1}%", u * 100.0))
        .collect::<Vec<_>>()
        .join(", ")
}

fn list_durations(cells: &[(String, Duration)]) -> String {
    cells
        .iter()
        .map(|(n, d)| format!("{n} {}", format_duration(*d)))
        .collect::<Vec<_>>()
        .join(", ")
}

fn describe_window(w: (Duration, Duration, Duration)) -> String {
    format!(
        "[{}, {}) every {}",
        format_duration(w.0),
        format_duration(w.0 + w.1),
        format_duration(w.2)
    )
}

/// Per-hart result of a successful admission.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct HartLoad {
    /// Claimed fraction (1.0 when dedicated).
    pub utilization: f64,
    /// `SCHED_DEADLINE` fraction.
    pub reserved: f64,
    /// Dedicated owner, if any.
    pub dedicated_to: Option<String>,
    /// Cells on the hart with their shares.
    pub cells: Vec<(String, f64)>,
}

/// Summary of an admitted cluster.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Admitted {
    /// Load per managed hart.
    pub harts: BTreeMap<usize, HartLoad>,
}

impl fmt::Display for Admitted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (h, l) in &self.harts {
            match &l.dedicated_to {
                Some(c) => writeln!(f, "hart {h}: dedicated to {c}")?,
                None => writeln!(
                    f,
                    "hart {h}: {:.1}% ({})",
                    l.utilization * 100.0,
                    list_shares(&l.cells)
                )?,
            }
        }
        Ok(())
    }
}

/// Checks every rule on every hart. `Ok` carries the per-hart load.
pub fn check(cluster: &Cluster, cap: &Capacity) -> Result<Admitted, AdmissionError> {
    let mut admitted = Admitted::default();
    let mut dedicated_owner: BTreeMap<usize, String> = BTreeMap::new();
    // Older cells first, so that a refusal names the incumbent as the owner.
    let mut by_age: Vec<&crate::state::Cell> = cluster.cells.values().collect();
    by_age.sort_by_key(|c| (c.created_ms, c.name().to_string()));
    for cell in by_age {
        for h in cell.harts.iter() {
            if !cap.harts.contains(h) {
                return Err(AdmissionError::UnknownHart {
                    cell: cell.name().into(),
                    hart: h,
                    available: cap.harts.clone(),
                });
            }
        }
        if cell.policy().is_dedicated() {
            for h in cell.harts.iter() {
                if let Some(first) = dedicated_owner.insert(h, cell.name().to_string()) {
                    return Err(AdmissionError::DedicatedTwice {
                        hart: h,
                        first,
                        second: cell.name().into(),
                    });
                }
            }
        }
    }
    let dedicated: HartSet = dedicated_owner.keys().copied().collect();
    let shared_left = cap.harts.difference(&dedicated).len();
    if !dedicated.is_empty() && shared_left < cap.min_system_harts {
        return Err(AdmissionError::NoSystemHart {
            dedicated,
            left: shared_left,
            needed: cap.min_system_harts,
        });
    }
    if let Some(limit) = cap.group_servers {
        let cells: Vec<(String, f64)> = cluster
            .cells
            .values()
            .filter(|c| c.policy().is_event_triggered())
            .map(|c| (c.name().to_string(), c.policy().utilization()))
            .collect();
        // One hart for all group servers: the kernel's RT period timer of a group (and of the
        // parents every group server shares) runs on one CPU and refills only the harts of that
        // CPU's root domain; a group server on a hart of another domain is never refilled and
        // freezes, SIGKILL included, once it has used its parents' runtime (seen in `tess bench
        // rtapp` with servers on harts 0 and 1). So every group server sits on one hart.
        let mut first: Option<(&str, usize)> = None;
        for c in cluster
            .cells
            .values()
            .filter(|c| c.policy().is_event_triggered())
        {
            let single = (c.harts.len() == 1)
                .then(|| c.harts.iter().next())
                .flatten();
            match (first, single) {
                (None, Some(h)) => first = Some((c.name(), h)),
                (Some((_, h0)), Some(h)) if h == h0 => {}
                (Some((other, h0)), _) => {
                    return Err(AdmissionError::GroupHarts {
                        cell: c.name().into(),
                        harts: c.harts.clone(),
                        other: other.into(),
                        other_hart: h0,
                    })
                }
                (None, None) => {
                    return Err(AdmissionError::GroupHarts {
                        cell: c.name().into(),
                        harts: c.harts.clone(),
                        other: c.name().into(),
                        other_hart: c.harts.iter().next().unwrap_or(0),
                    })
                }
            }
        }
        let demand = cells.iter().map(|c| c.1).sum::<f64>() + 0.0;
        if demand > limit + 1e-9 {
            return Err(AdmissionError::GroupLimit {
                demand,
                limit,
                cells,
            });
        }
    }
    for h in cap.harts.iter() {
        let mut load = HartLoad::default();
        if let Some(owner) = dedicated_owner.get(&h) {
            if let Some(other) = cluster.cells_on(h).find(|c| c.name() != owner) {
                return Err(AdmissionError::DedicatedShared {
                    hart: h,
                    dedicated: owner.clone(),
                    other: other.name().into(),
                });
            }
            load.utilization = 1.0;
            load.dedicated_to = Some(owner.clone());
            load.cells.push((owner.clone(), 1.0));
            admitted.harts.insert(h, load);
            continue;
        }
        check_hart(cluster, cap, h, &mut load)?;
        admitted.harts.insert(h, load);
    }
    Ok(admitted)
}

/// Rules 1-4 for one shared hart.
pub fn check_hart(
    cluster: &Cluster,
    cap: &Capacity,
    hart: usize,
    load: &mut HartLoad,
) -> Result<(), AdmissionError> {
    let mut servers: Vec<(String, Server)> = Vec::new();
    let mut offsets: Vec<Option<Duration>> = Vec::new();
    let mut reserved: Vec<(String, f64)> = Vec::new();
    // Rule 6: cells served by RT group bandwidth, and the deadline servers that preempt them.
    let mut groups: Vec<(String, Server)> = Vec::new();
    let mut preempting: Vec<(String, Server)> = Vec::new();
    for cell in cluster.cells_on(hart) {
        let Some(server) = cell.policy().server() else {
            continue;
        };
        load.cells.push((cell.name().into(), server.utilization()));
        if cap.group_servers.is_some() && cell.policy().is_event_triggered() {
            groups.push((cell.name().into(), server));
            continue;
        }
        if cell.policy().is_reservation() {
            reserved.push((cell.name().into(), server.utilization()));
            preempting.push((cell.name().into(), server));
        }
        servers.push((cell.name().into(), server));
        offsets.push(cell.window().map(|w| w.0));
    }
    // `+ 0.0` turns the empty sum's -0.0 into 0.0.
    load.utilization = load.cells.iter().map(|c| c.1).sum::<f64>() + 0.0;
    load.reserved = reserved.iter().map(|c| c.1).sum::<f64>() + 0.0;
    // A little slack for floating-point sums of exact decimal fractions.
    const EPS: f64 = 1e-9;
    if load.utilization > cap.utilization_limit + EPS {
        return Err(AdmissionError::Overcommitted {
            hart,
            demand: load.utilization,
            limit: cap.utilization_limit,
            cells: load.cells.clone(),
        });
    }
    if load.reserved > cap.kernel_reservation_limit + EPS {
        return Err(AdmissionError::KernelLimit {
            hart,
            demand: load.reserved,
            limit: cap.kernel_reservation_limit,
            cells: reserved,
        });
    }
    let windows: Vec<(&str, (Duration, Duration, Duration))> = cluster
        .cells_on(hart)
        .filter_map(|c| Some((c.name(), c.window()?)))
        .collect();
    for (i, (a, wa)) in windows.iter().enumerate() {
        for (b, wb) in &windows[i + 1..] {
            if windows_collide(*wa, *wb) {
                return Err(AdmissionError::WindowCollision {
                    hart,
                    a: a.to_string(),
                    a_window: *wa,
                    b: b.to_string(),
                    b_window: *wb,
                });
            }
        }
    }
    demand_bound(hart, &servers, &offsets)?;
    group_supply(hart, &groups, &preempting, cap.utilization_limit)
}

/// The highest RT priority tess gives a group server: below the `SCHED_FIFO` 50-99 range where
/// users' real-time programs (a dedicated cell's synthesizer at 99) and threaded interrupts live.
pub const GROUP_PRIORITY_MAX: u32 = 49;

/// The RT priority of a group server with period `period`, rate monotonic: one step down from
/// [`GROUP_PRIORITY_MAX`] for each doubling of the period above 100 us, three priorities a step,
/// never below 1. Worked example: 3 ms -> 37, 5 ms -> 34, 10 ms -> 31, 40 ms -> 25, 100 ms -> 22.
/// Servers whose periods fall in one doubling share a priority and are admitted as preempting
/// each other.
pub fn group_priority(period: Duration) -> u32 {
    let steps = (period.as_micros().max(100) / 100).ilog2();
    GROUP_PRIORITY_MAX.saturating_sub(3 * steps).max(1)
}

/// Rule 6 on one hart: each group server gets its budget in every one of its periods.
fn group_supply(
    hart: usize,
    groups: &[(String, Server)],
    preempting: &[(String, Server)],
    limit: f64,
) -> Result<(), AdmissionError> {
    for (g, sg) in groups {
        let p = sg.period.as_nanos();
        let rank = group_priority(sg.period);
        let cells: Vec<(String, Duration)> = preempting
            .iter()
            .chain(
                groups
                    .iter()
                    .filter(|(n, s)| n != g && group_priority(s.period) >= rank),
            )
            .map(|(n, s)| (n.clone(), Duration::from_nanos(max_work(s, p) as u64)))
            .collect();
        let interference: Duration = cells.iter().map(|c| c.1).sum();
        let supply = (p as f64 * limit).round() as u128;
        if sg.budget.as_nanos() + interference.as_nanos() > supply {
            return Err(AdmissionError::GroupStarved {
                hart,
                cell: g.clone(),
                budget: sg.budget,
                period: sg.period,
                interference,
                cells,
                limit,
            });
        }
    }
    Ok(())
}

/// `W(t) = min(t, ceil((t + D) / T) * C)`: the most server `s` can run in any interval of length
/// `t` (ns): only jobs released less than `D` before the interval or within it run in it.
fn max_work(s: &Server, t: u128) -> u128 {
    let (c, d, p) = (
        s.budget.as_nanos(),
        s.deadline.as_nanos(),
        s.period.as_nanos(),
    );
    ((t + d).div_ceil(p) * c).min(t)
}

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Whether two periodic windows `(offset, active, period)` ever overlap (rule 4).
pub fn windows_collide(
    a: (Duration, Duration, Duration),
    b: (Duration, Duration, Duration),
) -> bool {
    let (o1, a1, p1) = (a.0.as_nanos(), a.1.as_nanos(), a.2.as_nanos());
    let (o2, a2, p2) = (b.0.as_nanos(), b.1.as_nanos(), b.2.as_nanos());
    let g = gcd(p1, p2);
    // r = (o2 - o1) mod g in [0, g).
    let r = ((o2 % g) + g - (o1 % g)) % g;
    r < a1 || r + a2 > g
}

/// Upper bound on the number of demand checkpoints before falling back to the (sufficient)
/// density test; keeps admission well under a millisecond for any sane set of periods.
const MAX_CHECKPOINTS: usize = 200_000;

/// Rule 3: the processor-demand test on one hart.
///
/// `offsets[i]` is `Some` for time-triggered servers, whose windows are strictly periodic at
/// known offsets; the others are sporadic (an event may release them at any time). The worst
/// interval starts at a window release (moving its start forward to the next release loses no
/// window and only shortens it), with every sporadic server released at that instant. So the
/// test runs the demand bound from each window release in one hyperperiod of the windows;
/// without windows it is the classic synchronous test.
pub fn demand_bound(
    hart: usize,
    servers: &[(String, Server)],
    offsets: &[Option<Duration>],
) -> Result<(), AdmissionError> {
    if servers.is_empty() || servers.iter().all(|(_, s)| s.deadline >= s.period) {
        // Implicit deadlines: utilization <= 1 is exact (Liu and Layland), checked by rule 1.
        return Ok(());
    }
    let ns = |d: Duration| d.as_nanos() as f64;
    let u: f64 = servers.iter().map(|(_, s)| s.utilization()).sum();
    let d_max = servers
        .iter()
        .map(|(_, s)| ns(s.deadline))
        .fold(0.0, f64::max);
    let horizon = if u < 1.0 {
        let la: f64 = servers
            .iter()
            .map(|(_, s)| (ns(s.period) - ns(s.deadline)).max(0.0) * s.utilization())
            .sum::<f64>()
            / (1.0 - u);
        d_max.max(la)
    } else {
        f64::INFINITY
    };
    let windows: Vec<usize> = (0..servers.len())
        .filter(|&i| offsets.get(i).copied().flatten().is_some())
        .collect();
    // Releases of the windows within one hyperperiod, relative to which intervals start.
    let mut starts: Vec<u128> = vec![0];
    let mut periodic = vec![false; servers.len()];
    if !windows.is_empty() {
        let hyper = windows.iter().try_fold(1u128, |acc, &i| {
            let p = servers[i].1.period.as_nanos();
            let l = acc / gcd(acc, p) * p;
            (l <= 10_000_000_000).then_some(l)
        });
        if let Some(h) = hyper {
            let releases: u128 = windows
                .iter()
                .map(|&i| h / servers[i].1.period.as_nanos())
                .sum();
            if releases <= 2_000 {
                starts.clear();
                for &i in &windows {
                    periodic[i] = true;
                    let p = servers[i].1.period.as_nanos();
                    let o = offsets[i].expect("window").as_nanos() % p;
                    starts.extend((0..h / p).map(|k| o + k * p));
                }
                starts.sort_unstable();
                starts.dedup();
            }
        }
    }
    let mut checked = 0usize;
    for &t0 in &starts {
        // Next checkpoint (absolute deadline) of each server at or after t0: periodic windows
        // by their grid, sporadic servers released at t0.
        let mut next: Vec<u128> = servers
            .iter()
            .enumerate()
            .map(|(i, (_, s))| {
                let d = s.deadline.as_nanos();
                if periodic[i] {
                    let p = s.period.as_nanos();
                    let o = offsets[i].expect("window").as_nanos() % p;
                    // First window release >= t0.
                    let k = if t0 <= o { 0 } else { (t0 - o).div_ceil(p) };
                    o + k * p + d
                } else {
                    t0 + d
                }
            })
            .collect();
        loop {
            let (i, &t) = next
                .iter()
                .enumerate()
                .min_by_key(|(_, t)| **t)
                .expect("non-empty");
            let len = t - t0;
            if len as f64 > horizon {
                break;
            }
            checked += 1;
            if checked > MAX_CHECKPOINTS {
                return density_fallback(hart, servers);
            }
            let parts: Vec<(String, Duration)> = servers
                .iter()
                .enumerate()
                .map(|(j, (n, s))| {
                    let demand = if periodic[j] {
                        windows_within(s, offsets[j].expect("window"), t0, t)
                    } else {
                        dbf(s, len)
                    };
                    (n.clone(), Duration::from_nanos(demand as u64))
                })
                .collect();
            let demand: u128 = parts.iter().map(|p| p.1.as_nanos()).sum();
            if demand > len {
                return Err(AdmissionError::DemandBound {
                    hart,
                    interval: Duration::from_nanos(len as u64),
                    demand: Duration::from_nanos(demand as u64),
                    cells: parts.into_iter().filter(|p| !p.1.is_zero()).collect(),
                });
            }
            next[i] += servers[i].1.period.as_nanos();
        }
    }
    Ok(())
}

/// Demand of a strictly periodic window server: budget of every window released at or after
/// `t0` whose deadline falls at or before `t1`.
fn windows_within(s: &Server, offset: Duration, t0: u128, t1: u128) -> u128 {
    let (c, d, p) = (
        s.budget.as_nanos(),
        s.deadline.as_nanos(),
        s.period.as_nanos(),
    );
    let o = offset.as_nanos() % p;
    let first = if t0 <= o { 0 } else { (t0 - o).div_ceil(p) };
    if t1 < o + d {
        return 0;
    }
    let last = (t1 - o - d) / p;
    if last < first {
        0
    } else {
        (last - first + 1) * c
    }
}

/// Density `sum C / min(D, T) <= 1` is sufficient when the exact test would take too long.
fn density_fallback(hart: usize, servers: &[(String, Server)]) -> Result<(), AdmissionError> {
    let ns = |d: Duration| d.as_nanos() as f64;
    let density: f64 = servers
        .iter()
        .map(|(_, s)| ns(s.budget) / ns(s.deadline.min(s.period)))
        .sum();
    if density <= 1.0 {
        return Ok(());
    }
    let t = servers
        .iter()
        .map(|(_, s)| s.deadline)
        .min()
        .expect("non-empty");
    Err(AdmissionError::DemandBound {
        hart,
        interval: t,
        demand: Duration::from_secs_f64(t.as_secs_f64() * density),
        cells: servers.iter().map(|(n, s)| (n.clone(), s.budget)).collect(),
    })
}

/// `dbf(t)` of one server, in nanoseconds.
fn dbf(s: &Server, t: u128) -> u128 {
    let (c, d, p) = (
        s.budget.as_nanos(),
        s.deadline.as_nanos(),
        s.period.as_nanos(),
    );
    if t < d {
        0
    } else {
        ((t - d) / p + 1) * c
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{CellSpec, HartRequest, Policy};
    use crate::state::Cell;

    fn ms(x: f64) -> Duration {
        Duration::from_secs_f64(x / 1000.0)
    }

    fn cell(name: &str, policy: Policy, harts: &str) -> Cell {
        let harts: HartSet = harts.parse().unwrap();
        Cell {
            spec: CellSpec {
                name: name.into(),
                policy,
                harts: HartRequest::Ids(harts.clone()),
                memory_max: None,
                pids_max: None,
                pinned: false,
                idle: None,
                broker: Default::default(),
            },
            harts,
            window_offset: None,
            owner: 0,
            ephemeral_pid: None,
            created_ms: 0,
        }
    }

    fn tt(period: f64, active: f64, offset: f64) -> Policy {
        Policy::TimeTriggered {
            period: ms(period),
            active: ms(active),
            offset: Some(ms(offset)),
        }
    }

    fn et(period: f64, budget: f64) -> Policy {
        Policy::EventTriggered {
            period: ms(period),
            budget: ms(budget),
        }
    }

    fn cluster(cells: Vec<Cell>) -> Cluster {
        Cluster {
            cells: cells
                .into_iter()
                .map(|c| (c.name().to_string(), c))
                .collect(),
        }
    }

    fn cap() -> Capacity {
        Capacity::new("0-1".parse().unwrap())
    }

    #[test]
    fn dedicated_hart_twice_is_refused() {
        let c = cluster(vec![
            cell("a", Policy::Dedicated, "1"),
            cell("b", Policy::Dedicated, "1"),
        ]);
        let e = check(&c, &cap()).unwrap_err();
        assert!(
            matches!(e, AdmissionError::DedicatedTwice { hart: 1, .. }),
            "{e}"
        );
        assert_eq!(
            e.to_string(),
            "hart 1 is dedicated to cell 'a'; cell 'b' asks for it too"
        );
    }

    #[test]
    fn dedicated_hart_cannot_be_shared() {
        let c = cluster(vec![
            cell("a", Policy::Dedicated, "1"),
            cell("b", et(10.0, 1.0), "1"),
        ]);
        let e = check(&c, &cap()).unwrap_err();
        assert!(
            matches!(e, AdmissionError::DedicatedShared { hart: 1, .. }),
            "{e}"
        );
    }

    #[test]
    fn a_system_hart_must_remain() {
        let c = cluster(vec![cell("a", Policy::Dedicated, "0-1")]);
        let e = check(&c, &cap()).unwrap_err();
        assert!(
            matches!(
                e,
                AdmissionError::NoSystemHart {
                    left: 0,
                    needed: 1,
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn unknown_hart_is_refused() {
        let c = cluster(vec![cell("a", et(10.0, 1.0), "7")]);
        let e = check(&c, &cap()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "cell 'a' asks for hart 7, but the harts available are 0-1"
        );
    }

    #[test]
    fn utilization_limit_names_hart_and_amount() {
        let c = cluster(vec![
            cell("a", et(10.0, 5.0), "1"),
            cell("b", et(10.0, 4.8), "1"),
        ]);
        let e = check(&c, &cap()).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.starts_with("cpu time on hart 1 over-committed by 3.0%"),
            "{msg}"
        );
        assert!(msg.contains("a 50.0%, b 48.0%"), "{msg}");
        assert!(msg.contains("limit is 95.0%"), "{msg}");
    }

    #[test]
    fn exactly_at_the_limit_is_admitted() {
        let c = cluster(vec![
            cell("a", et(10.0, 5.0), "1"),
            cell("b", et(10.0, 4.5), "1"),
        ]);
        let admitted = check(&c, &cap()).unwrap();
        assert!((admitted.harts[&1].utilization - 0.95).abs() < 1e-9);
    }

    #[test]
    fn kernel_limit_is_respected() {
        let mut cap = cap();
        cap.kernel_reservation_limit = 0.90;
        let c = cluster(vec![cell("a", et(10.0, 9.2), "1")]);
        let e = check(&c, &cap).unwrap_err();
        assert!(
            matches!(e, AdmissionError::KernelLimit { hart: 1, .. }),
            "{e}"
        );
        // Best-effort minimums are CFS time, not SCHED_DEADLINE: they do not count here.
        let c = cluster(vec![
            cell("a", et(10.0, 8.9), "1"),
            cell("b", Policy::BestEffort { weight: 100 }, "1"),
        ]);
        assert!(check(&c, &cap).is_ok());
    }

    #[test]
    fn group_servers_leave_the_deadline_limit_but_must_get_their_budget() {
        let mut cap = cap();
        cap.kernel_reservation_limit = 0.90;
        cap.group_servers = Some(0.95);
        // Served by RT group bandwidth, so the SCHED_DEADLINE limit does not count it.
        let c = cluster(vec![cell("a", et(10.0, 9.2), "1")]);
        assert!(check(&c, &cap).is_ok());
        // Worked example of rule 6: 2 + W(10ms) = 2 + 3 <= 9.5.
        let c = cluster(vec![
            cell("g", et(10.0, 2.0), "1"),
            cell("w", tt(20.0, 3.0, 0.0), "1"),
        ]);
        assert!(check(&c, &cap).is_ok());
        // A 5ms-period server beside it can run twice (carry-in) in one 10ms period:
        // 2 + 3 + W(10ms) = 2 + 3 + ceil(15/5) * 1.5 = 9.5 fits; 1.6 each does not.
        let c = cluster(vec![
            cell("g", et(10.0, 2.0), "1"),
            cell("w", tt(20.0, 3.0, 0.0), "1"),
            cell("h", tt(5.0, 1.5, 3.0), "1"),
        ]);
        assert!(check(&c, &cap).is_ok(), "{:?}", check(&c, &cap));
        let mut d = cluster(vec![
            cell("g", et(10.0, 2.0), "1"),
            cell("w", tt(20.0, 3.0, 0.0), "1"),
            cell("h", tt(5.0, 1.6, 3.0), "1"),
        ]);
        let e = check(&d, &cap).unwrap_err();
        match &e {
            AdmissionError::GroupStarved {
                hart: 1,
                cell,
                interference,
                ..
            } => {
                assert_eq!(cell, "g");
                let want = ms(3.0).as_nanos() + 3 * ms(1.6).as_nanos();
                assert_eq!(interference.as_nanos(), want);
            }
            other => panic!("{other}"),
        }
        assert!(e.to_string().contains("hart 1"), "{e}");
        // Without group servers the same cells are a plain EDF set, which fits.
        cap.group_servers = None;
        d.cells.get_mut("h").unwrap().spec.policy = tt(5.0, 1.5, 3.0);
        assert!(check(&d, &cap).is_ok());
    }

    #[test]
    fn group_priorities_are_rate_monotonic() {
        assert_eq!(group_priority(ms(3.0)), 37);
        assert_eq!(group_priority(ms(5.0)), 34);
        assert_eq!(group_priority(ms(10.0)), 31);
        assert_eq!(group_priority(ms(40.0)), 25);
        assert_eq!(group_priority(ms(100.0)), 22);
        assert_eq!(
            group_priority(Duration::from_micros(10)),
            GROUP_PRIORITY_MAX
        );
        assert_eq!(group_priority(Duration::from_secs(100_000)), 1);
    }

    #[test]
    fn group_servers_sit_on_one_hart() {
        let mut cap = cap();
        cap.group_servers = Some(0.9);
        let c = cluster(vec![
            cell("a", et(10.0, 1.0), "0"),
            cell("b", et(10.0, 1.0), "1"),
        ]);
        let e = check(&c, &cap).unwrap_err();
        assert!(
            matches!(&e, AdmissionError::GroupHarts { cell, other_hart: 0, .. } if cell == "b"),
            "{e}"
        );
        assert!(e.to_string().contains("--hart-ids 0"), "{e}");
        cap.group_servers = None;
        assert!(check(&c, &cap).is_ok());
    }

    #[test]
    fn group_servers_share_one_kernel_rt_limit() {
        let mut cap = cap();
        cap.group_servers = Some(0.5);
        let c = cluster(vec![
            cell("a", et(10.0, 3.0), "1"),
            cell("b", et(10.0, 3.0), "1"),
        ]);
        let e = check(&c, &cap).unwrap_err();
        assert!(
            matches!(e, AdmissionError::GroupLimit { demand, .. } if (demand - 0.6).abs() < 1e-9),
            "{e}"
        );
        cap.group_servers = Some(0.6);
        assert!(check(&c, &cap).is_ok());
    }

    #[test]
    fn demand_bound_catches_what_utilization_misses() {
        // U = 0.5 + 0.48 = 0.98 <= 1, but dbf(5ms) = 5 + 2.4 > 5.
        let mut cap = cap();
        cap.utilization_limit = 1.0;
        cap.kernel_reservation_limit = 1.0;
        let c = cluster(vec![
            cell("w", tt(10.0, 5.0, 0.0), "0"),
            cell("e", et(5.0, 2.4), "0"),
        ]);
        let e = check(&c, &cap).unwrap_err();
        match &e {
            AdmissionError::DemandBound {
                hart: 0,
                interval,
                demand,
                ..
            } => {
                assert_eq!(*interval, ms(5.0));
                assert_eq!(*demand, ms(7.4));
            }
            other => panic!("unexpected {other}"),
        }
        assert!(
            e.to_string().contains("2400us more than the hart has"),
            "{e}"
        );
        // A shorter window fits.
        let c = cluster(vec![
            cell("w", tt(10.0, 2.0, 0.0), "0"),
            cell("e", et(5.0, 2.4), "0"),
        ]);
        assert!(check(&c, &cap).is_ok());
    }

    #[test]
    fn window_collision_rule() {
        let w = |o: f64, a: f64, p: f64| (ms(o), ms(a), ms(p));
        assert!(windows_collide(w(0.0, 2.0, 10.0), w(1.0, 2.0, 10.0)));
        assert!(!windows_collide(w(0.0, 2.0, 10.0), w(2.0, 2.0, 10.0)));
        assert!(windows_collide(w(0.0, 2.0, 10.0), w(9.0, 2.0, 10.0)));
        // Periods 10 and 15: gcd 5, so offsets that differ by 5 meet on some period.
        assert!(windows_collide(w(0.0, 1.0, 10.0), w(5.0, 1.0, 15.0)));
        assert!(!windows_collide(w(0.0, 1.0, 10.0), w(2.0, 1.0, 15.0)));
        // Brute force agrees on a grid of cases.
        for o2 in 0..20u64 {
            for a2 in 1..4u64 {
                let a = (
                    Duration::from_millis(0),
                    Duration::from_millis(2),
                    Duration::from_millis(6),
                );
                let b = (
                    Duration::from_millis(o2 % 9),
                    Duration::from_millis(a2),
                    Duration::from_millis(9),
                );
                assert_eq!(windows_collide(a, b), brute_collide(a, b), "{a:?} {b:?}");
            }
        }
    }

    fn brute_collide(a: (Duration, Duration, Duration), b: (Duration, Duration, Duration)) -> bool {
        let (o1, a1, p1) = (a.0.as_millis(), a.1.as_millis(), a.2.as_millis());
        let (o2, a2, p2) = (b.0.as_millis(), b.1.as_millis(), b.2.as_millis());
        let hyper = p1 * p2;
        (0..2 * hyper).any(|t| {
            let in_a = t >= o1 && (t - o1) % p1 < a1;
            let in_b = t >= o2 && (t - o2) % p2 < a2;
            in_a && in_b
        })
    }

    #[test]
    fn colliding_windows_are_refused() {
        let c = cluster(vec![
            cell("a", tt(10.0, 2.0, 0.0), "1"),
            cell("b", tt(10.0, 2.0, 1.0), "1"),
        ]);
        let e = check(&c, &cap()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "time-triggered windows collide on hart 1: cell 'a' runs [0ms, 2ms) every 10ms and cell 'b' runs [1ms, 3ms) every 10ms"
        );
        let c = cluster(vec![
            cell("a", tt(10.0, 2.0, 0.0), "1"),
            cell("b", tt(10.0, 2.0, 2.0), "1"),
        ]);
        assert!(check(&c, &cap()).is_ok());
    }

    #[test]
    fn disjoint_windows_leave_room_for_sporadic_servers() {
        // Windows [0,3) and [5,8) every 10ms plus a CBS of 3ms/10ms: U = 0.9, and between the
        // windows there is room: admitted.
        let c = cluster(vec![
            cell("a", tt(10.0, 3.0, 0.0), "1"),
            cell("b", tt(10.0, 3.0, 5.0), "1"),
            cell("e", et(10.0, 3.0), "1"),
        ]);
        assert!(check(&c, &cap()).is_ok());
        // A 2.5ms CBS every 4ms cannot get its budget when windows block most of [0,3) and [5,8).
        let c = cluster(vec![
            cell("a", tt(10.0, 3.0, 0.0), "1"),
            cell("b", tt(10.0, 3.0, 5.0), "1"),
            cell("e", et(4.0, 2.5), "1"),
        ]);
        let mut cap = cap();
        cap.utilization_limit = 1.3;
        cap.kernel_reservation_limit = 1.3;
        let e = check(&c, &cap).unwrap_err();
        assert!(
            matches!(e, AdmissionError::DemandBound { hart: 1, .. }),
            "{e}"
        );
    }

    #[test]
    fn best_effort_minimums_count() {
        let be = Policy::BestEffort { weight: 100 };
        let c = cluster(vec![
            cell("a", et(10.0, 9.1), "0"),
            cell("b", be.clone(), "0"),
        ]);
        let e = check(&c, &cap()).unwrap_err();
        assert!(
            matches!(e, AdmissionError::Overcommitted { hart: 0, .. }),
            "{e}"
        );
        let c = cluster(vec![
            cell("a", et(10.0, 8.5), "0"),
            cell("b", be.clone(), "0"),
            cell("c", be, "1"),
        ]);
        assert!(check(&c, &cap()).is_ok());
    }
}
