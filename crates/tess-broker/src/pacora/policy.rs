//! PACORA as the broker's live policy (`policy = "pacora"` in the broker's configuration).
//!
//! The policy divides one or more *pools*, one per resource type: the harts the brokered
//! cells share and, with a `[network]` section, the Mbit/s of the network service's link. An
//! *entry* is what one heartbeat measures and what it is given: a cell's CPU share (it uses
//! the harts), a flow's bandwidth (it uses the link), or, for a cell whose unit of work needs
//! both (a cell marked `network = true`: it fetches over its flow what it then computes on),
//! both at once.
//!
//! Every decision round the broker hands this module what each entry held during the last
//! period (its share of each pool it uses) and the rate its heartbeat measured under it. The
//! module turns each period into a sample of the entry's response time `tau = 1 / rate`
//! (seconds per unit of work) at those shares, fits the entry's response-time function (seed
//! 004 section 5.3) by non-negative least squares over its recent samples:
//!
//! ```text
//!   one pool:   tau(a) = tau0 + w / a
//!   two pools:  tau(a) = tau0 + w_cc / a_c + w_cn / sqrt(a_c a_n) + w_nn / a_n
//! ```
//!
//! and allocates the pools (each group of pools that entries of several join is one
//! decision; pools no such entry joins are decided apart):
//!
//! - **Every target can be met**: each entry gets the least-reserving allocation whose
//!   predicted response time meets its target with `margin` to spare (`d = 1 / (target (1 +
//!   margin))`). With one pool that is `a_min = w / (d - tau0)`. With two it is the point of
//!   the level set `tau(a) = d` that reserves the smallest fraction of the pools, `a_c / C_c +
//!   a_n / C_n` ([`least_point`]): the sub-level set is convex, so this is a one-dimensional
//!   convex search along the level set. The penalties are all zero there, so this is an
//!   optimum of PACORA's problem, and of all the optima it reserves the least.
//! - **They cannot all be met**: the allocation that minimises the total penalty `sum_p
//!   max(0, (tau_p - d_p) s_p)` under every pool's capacity, solved exactly by the
//!   interior-point method ([`super::interior_point`]) as *one* problem across all pools: an
//!   entry that needs both resources can be given more of the one that is plentiful so that
//!   it takes less of the one others need ("selects the allocations for all resources and
//!   resource types at once", seed 004 section 5.3). An entry whose solved allocation meets
//!   its deadline with more than its least-reserving point in every pool gets that point.
//!
//! Shares are then clamped to each entry's floor and ceiling per pool. An entry without a
//! model yet (one pool: fewer than 2 samples; several: fewer than [`joint_samples`], or no
//! fit that explains them all within [`PHASE_CHANGE`]; or samples not spread by `explore / 2`
//! in every pool it uses) is *learning*: it moves to the shares a one-point model `tau = w /
//! a` through its last sample predicts, one pool per round in turn if it uses several
//! ([`learning_step`]), so that the next sample can be learned from. Two periods in a row whose
//! response times a one-pool model misses by more than [`PHASE_CHANGE`] on the same side start
//! a new phase: the older samples are dropped, the entry learns again from those two (one such
//! period alone is noise, fitted with the others). A model of several pools is first refitted
//! with that sample ([`fit_several`]), since an allocation outside the samples is where it
//! knows least, and trusted only up to [`TRUST`] beyond its samples (`approaching`: the
//! entry moves that far and is solved again next round). An entry whose heartbeat did not beat in the period (rate
//! 0) keeps its shares: no sample, nothing learned, nothing moved (`no-rate`). An entry whose
//! view carries a `known` model (its beats carried each unit's demand: `tau = w / a` with `w`
//! measured this period, the broker's `demand_model`) takes that model as is, with no samples
//! or learning.
//!
//! A pool's capacity: as configured, otherwise what the entries using it held when they joined
//! (each brings its share in and takes its last share out when it leaves), so the policy
//! redistributes reservations it was given and never asks tessd for more in total.
//!
//! **When it decides** (`decide`, [`DecideOn`]): every round observes every entry (a sample,
//! a refit), but by default the allocation is solved again only on an *event*: the paper's
//! broker "reallocates resources ... when a cell starts or finishes or when a cell
//! significantly changes performance", trading adaptability for stability (seed 004 section
//! 2.4). An entry joins or leaves; its target, floor, ceiling or slope changes; it is learning
//! (it moves every round until it has a model) or its model was dropped by a phase change; the
//! least-reserving allocation that meets its target moved by more than [`MODEL_DRIFT`] in any
//! pool since the last solve (for an entry no allocation within its ceilings satisfies: its
//! model's prediction at its shares moved by that much); an entry that the last solve sized to
//! meet its target missed it; or the last solve moved an entry only part of the way
//! (`approaching`). Between events every entry keeps the shares in force (`no-event`), so a steady system
//! makes no transactions and its allocations do not follow the noise of its measurements.
//! `decide = "period"` solves every round.

use super::interior_point::Workspace;
use super::model::{pairs, weight_count};
use super::{CellDemand, Problem, ResponseModel, Sample};
use std::collections::{BTreeMap, VecDeque};

/// A prediction off by more than this fraction of the measured response time is a miss: two
/// in a row on the same side start a new phase for an entry of one pool; for several pools a
/// miss that no fit explains does ([`observe`]).
pub const PHASE_CHANGE: f64 = 0.3;

/// A change of an entry's least share in a pool (the share its model says meets its target)
/// by more than this fraction since the last solve is an event: half the default margin, so
/// that a model that drifts is re-solved before the margin it was sized with is used up.
pub const MODEL_DRIFT: f64 = 0.05;

/// An entry the last solve sized to meet its target that measures less than this fraction of
/// the target rate in a period is an event (the broker's own "on target" bound).
pub const MISSED: f64 = 0.95;

/// A fitted model of several pools is trusted this far beyond the shares it was measured at
/// (a factor, each way): an allocation further out is approached in steps, each of which
/// adds a sample there.
pub const TRUST: f64 = 2.0;

/// When PACORA solves the allocation again (`[pacora] decide`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DecideOn {
    /// On events (module docs); between them the allocation in force stays.
    #[default]
    Events,
    /// Every decision round.
    Period,
}

impl DecideOn {
    /// `events` or `period`.
    pub fn parse(s: &str) -> Result<DecideOn, String> {
        match s {
            "events" => Ok(DecideOn::Events),
            "period" => Ok(DecideOn::Period),
            other => Err(format!(
                "pacora decide {other:?} must be \"events\" or \"period\""
            )),
        }
    }
}

/// The policy's settings (`[pacora]` in the broker's configuration).
#[derive(Debug, Clone, PartialEq)]
pub struct PacoraConfig {
    /// Harts the brokered cells share; `None`: what they held when they joined.
    pub capacity: Option<f64>,
    /// Each cell is sized to meet `target (1 + margin)`.
    pub margin: f64,
    /// Relative move a learning cell makes when its one-point model would not move it enough.
    pub explore: f64,
    /// Samples kept per cell (the fit uses them all).
    pub keep: usize,
    /// When the allocation is solved again.
    pub decide: DecideOn,
}

impl Default for PacoraConfig {
    fn default() -> Self {
        PacoraConfig {
            capacity: None,
            margin: 0.1,
            explore: 0.2,
            keep: 12,
            decide: DecideOn::Events,
        }
    }
}

impl PacoraConfig {
    /// Checks the numbers.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(c) = self.capacity {
            if !(c.is_finite() && c > 0.0) {
                return Err(format!(
                    "pacora capacity {c} must be a positive number of harts"
                ));
            }
        }
        if !(0.0..=1.0).contains(&self.margin) {
            return Err(format!("pacora margin {} must lie in [0, 1]", self.margin));
        }
        if !(self.explore > 0.0 && self.explore <= 0.5) {
            return Err(format!(
                "pacora explore {} must lie in (0, 0.5]",
                self.explore
            ));
        }
        if self.keep < 2 {
            return Err(format!("pacora keep {} must be at least 2", self.keep));
        }
        Ok(())
    }
}

/// One resource the policy divides.
#[derive(Debug, Clone, PartialEq)]
pub struct Pool {
    /// Its capacity; `None`: what the entries using it held when they joined.
    pub capacity: Option<f64>,
    /// Entries whose first pool this is are sized to meet `target (1 + margin)`.
    pub margin: f64,
}

/// An entry at a decision round: what it held and measured over the last period, and its
/// limits. Per-pool fields (`share`, `floor`, `ceiling`) follow the order of `uses`.
#[derive(Debug, Clone, PartialEq)]
pub struct CellView {
    /// The entry's name (a cell, or a flow).
    pub cell: String,
    /// The pools it uses, ascending (indices into [`Pacora::with_pools`]'s pools).
    pub uses: Vec<usize>,
    /// Share of each pool in force during the period (harts; Mbit/s).
    pub share: Vec<f64>,
    /// Units of work per second its heartbeat measured in the period.
    pub rate: f64,
    /// Target rate, units per second.
    pub target_rate: f64,
    /// Smallest share of each pool.
    pub floor: Vec<f64>,
    /// Largest share of each pool.
    pub ceiling: Vec<f64>,
    /// Penalty per second of response time over the deadline (relative to other cells).
    pub slope: f64,
    /// A response-time function (over `uses`) the caller knows exactly (a flow's transmission
    /// time per unit, `8 bytes / b`, from the unit sizes it measured this period): used as
    /// is, in place of one fitted from the samples.
    pub known: Option<ResponseModel>,
}

impl CellView {
    /// An entry that uses one pool.
    #[allow(clippy::too_many_arguments)]
    pub fn single(
        cell: &str,
        pool: usize,
        share: f64,
        rate: f64,
        target_rate: f64,
        floor: f64,
        ceiling: f64,
        slope: f64,
    ) -> CellView {
        CellView {
            cell: cell.into(),
            uses: vec![pool],
            share: vec![share],
            rate,
            target_rate,
            floor: vec![floor],
            ceiling: vec![ceiling],
            slope,
            known: None,
        }
    }

    /// The period's response time per unit, seconds: `1 / rate`.
    pub fn response_time(&self) -> f64 {
        1.0 / self.rate
    }

    /// The response time to meet: the target's time per unit with `margin` to spare.
    fn deadline(&self, margin: f64) -> f64 {
        1.0 / (self.target_rate * (1.0 + margin))
    }

    fn silent(&self) -> bool {
        !(self.rate > 0.0 && self.rate.is_finite())
    }

    /// Whether the per-pool fields agree with `uses` and `uses` names pools of `pools`.
    fn well_formed(&self, pools: usize) -> bool {
        let n = self.uses.len();
        n > 0
            && self.share.len() == n
            && self.floor.len() == n
            && self.ceiling.len() == n
            && self.uses.windows(2).all(|w| w[0] < w[1])
            && self.uses.iter().all(|&p| p < pools)
            && self
                .known
                .as_ref()
                .is_none_or(|m| m.resources == n && m.w.len() == weight_count(n))
    }
}

/// Why the policy gave an entry its allocation. [`AllocationReason::as_str`] is the name
/// `tess broker status` shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocationReason {
    /// No model yet: a step that brings a new sample.
    Learning,
    /// No beats this round: the shares in force stay.
    NoRate,
    /// Every target is met: the least-reserving shares.
    MeetsTarget,
    /// Not every target fits: the solver's least total penalty.
    TradeOff,
    /// An entry of several pools whose allocation lies more than [`TRUST`] beyond the shares
    /// its model was measured at, moved that far.
    Approaching,
    /// The solver failed: the shares in force stay.
    SolverFailed,
    /// Its view's per-pool fields disagree, or an earlier view of the round has its name: it
    /// keeps its shares.
    BadView,
    /// Nothing changed since the last solve: the shares in force stay.
    NoEvent,
}

impl AllocationReason {
    /// The reason's name, as the broker's status and trace show it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Learning => "learning",
            Self::NoRate => "no-rate",
            Self::MeetsTarget => "meets-target",
            Self::TradeOff => "trade-off",
            Self::Approaching => "approaching",
            Self::SolverFailed => "solver-failed",
            Self::BadView => "bad-view",
            Self::NoEvent => "no-event",
        }
    }

    /// A step the policy takes to learn, or towards an allocation beyond its samples: applied
    /// however small, since held back it would bring no new sample and be asked for again.
    pub fn is_step(self) -> bool {
        matches!(self, Self::Learning | Self::Approaching)
    }
}

impl std::fmt::Display for AllocationReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the policy wants for one entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Allocation {
    /// The entry.
    pub cell: String,
    /// The shares it should hold, in the order of its view's `uses`.
    pub share: Vec<f64>,
    /// Why.
    pub reason: AllocationReason,
    /// The model's response time at `share` (seconds per unit), once there is a model.
    pub predicted_tau: Option<f64>,
    /// The fitted model, if any.
    pub model: Option<ResponseModel>,
}

#[derive(Debug, Default)]
struct CellState {
    /// The pools it uses (a change is a new entry).
    uses: Vec<usize>,
    samples: VecDeque<Sample>,
    model: Option<ResponseModel>,
    /// Shares it brought into the pools when it joined.
    brought: Vec<f64>,
    /// Its shares at the last round (taken out of the pools when it leaves).
    last_share: Vec<f64>,
    /// What its allocation was last solved for (none: not solved with a model yet).
    solved_for: Option<Basis>,
    /// Learning rounds so far: which pool a learning entry of several moves next.
    turn: usize,
    /// The side its one-pool model missed the last period on by more than [`PHASE_CHANGE`]
    /// (the sign of the error), if it did: a second miss on that side is a new phase.
    missed_side: Option<f64>,
}

/// Per entry of a round, the least-reserving shares meeting its target under its model
/// ([`least_point`], computed once the round's samples are observed: its model, target,
/// limits and the pools' capacities are fixed from there on); `None`: no model, or no shares
/// within its ceilings meet the target.
type RoundLeast = BTreeMap<String, Option<Vec<f64>>>;

/// What an entry's allocation was solved for; a change of any of it is an event.
#[derive(Debug, Clone, PartialEq)]
struct Basis {
    target_rate: f64,
    floor: Vec<f64>,
    ceiling: Vec<f64>,
    slope: f64,
    /// The least-reserving shares that met the target under the model of that round, each
    /// raised to its floor (infinite: none met it). Below the floor a model may move freely:
    /// the entry holds its floor either way.
    least: Vec<f64>,
    /// Whether the solve sized the entry to meet its target (`meets-target`).
    meets: bool,
    /// Whether the solve moved it only part of the way (`approaching`): solved again next
    /// round.
    approaching: bool,
    /// The model it was solved with.
    model: ResponseModel,
    /// The shares it was given.
    share: Vec<f64>,
}

impl Basis {
    fn limits_differ(&self, v: &CellView) -> bool {
        self.target_rate != v.target_rate
            || self.floor != v.floor
            || self.ceiling != v.ceiling
            || self.slope != v.slope
    }
}

/// Whether a model's prediction at `share` moved by more than [`MODEL_DRIFT`] (its
/// parameters alone would: a weight a fit moves between 0 and a trace changes nothing).
fn prediction_drifted(was: &ResponseModel, now: &ResponseModel, share: &[f64]) -> bool {
    drifted(was.eval(share), now.eval(share))
}

/// Whether a least share moved from `was` to `now` by more than [`MODEL_DRIFT`].
fn drifted(was: f64, now: f64) -> bool {
    match (was.is_finite(), now.is_finite()) {
        (true, true) => (now - was).abs() > MODEL_DRIFT * was.max(now).max(1e-9),
        (a, b) => a != b,
    }
}

/// The live policy: per entry its samples and model, and the pools.
#[derive(Debug)]
pub struct Pacora {
    config: PacoraConfig,
    pools: Vec<Pool>,
    cells: BTreeMap<String, CellState>,
    /// Per pool, shares given back by entries that left (with no configured capacity).
    pool_adjust: Vec<f64>,
    workspace: Workspace,
    /// Entries that left since the last round, and the pools they used.
    departed: Vec<(String, Vec<usize>)>,
    /// The events of the last round (empty: nothing changed).
    events: Vec<String>,
}

impl Pacora {
    /// A policy with one pool (`config.capacity`, `config.margin`) and no entries yet.
    pub fn new(config: PacoraConfig) -> Pacora {
        let pool = Pool {
            capacity: config.capacity,
            margin: config.margin,
        };
        Pacora::with_pools(config, vec![pool])
    }

    /// A policy over `pools` (`config`'s own capacity and margin are not used).
    pub fn with_pools(config: PacoraConfig, pools: Vec<Pool>) -> Pacora {
        Pacora {
            config,
            pool_adjust: vec![0.0; pools.len()],
            pools,
            cells: BTreeMap::new(),
            workspace: Workspace::default(),
            departed: Vec::new(),
            events: Vec::new(),
        }
    }

    /// How many pools it allocates.
    pub fn pools(&self) -> usize {
        self.pools.len()
    }

    /// What pool `pool` holds now.
    pub fn capacity(&self, pool: usize) -> f64 {
        self.pools[pool].capacity.unwrap_or_else(|| {
            self.cells
                .values()
                .flat_map(|c| c.uses.iter().zip(&c.brought))
                .filter(|(&p, _)| p == pool)
                .map(|(_, b)| b)
                .sum::<f64>()
                + self.pool_adjust[pool]
        })
    }

    /// The fitted model of `cell`, if it has one.
    pub fn model(&self, cell: &str) -> Option<&ResponseModel> {
        self.cells.get(cell).and_then(|c| c.model.as_ref())
    }

    /// Forgets entries that are no longer brokered; with no configured capacity, each pool
    /// keeps what they brought minus what they held last (an entry that grew leaves the pool
    /// smaller).
    pub fn retain(&mut self, present: &[&str]) {
        let gone: Vec<String> = self
            .cells
            .keys()
            .filter(|c| !present.contains(&c.as_str()))
            .cloned()
            .collect();
        for c in gone {
            let uses = self.cells[&c].uses.clone();
            self.forget(&c);
            self.departed.push((c, uses));
        }
    }

    fn forget(&mut self, cell: &str) {
        if let Some(s) = self.cells.remove(cell) {
            for (k, &p) in s.uses.iter().enumerate() {
                self.pool_adjust[p] += s.brought[k] - s.last_share[k];
            }
        }
    }

    /// What changed before the last round, one phrase each (`enc joined`, `enc: target or
    /// limits changed`, ...); empty if nothing did. Under [`DecideOn::Events`] the round solved
    /// the pools these events are in (and the pools joined to them by entries of several),
    /// and held the others.
    pub fn last_events(&self) -> &[String] {
        &self.events
    }

    /// The margin entry `v` is sized with: its first pool's.
    fn margin(&self, v: &CellView) -> f64 {
        self.pools[v.uses[0]].margin
    }

    /// The capacity of each pool `v` uses, in its order.
    /// The least-reserving shares meeting `v`'s target under its model this round, each
    /// raised to its floor; infinite where none does.
    fn least_raised(least: &RoundLeast, v: &CellView) -> Vec<f64> {
        match least.get(&v.cell).and_then(Option::as_ref) {
            Some(a) => a.iter().zip(&v.floor).map(|(a, f)| a.max(*f)).collect(),
            None => vec![f64::INFINITY; v.uses.len()],
        }
    }

    /// The event entry `v` raises this round, if any (after its sample was observed).
    fn event_of(&self, v: &CellView, least: &RoundLeast) -> Option<String> {
        let st = &self.cells[&v.cell];
        if v.silent() {
            // Silent: nothing measured, nothing to act on.
            return None;
        }
        let Some(m) = &st.model else {
            return Some(format!("{}: learning", v.cell));
        };
        let least = Self::least_raised(least, v);
        let show = |l: &[f64]| {
            l.iter()
                .map(|x| format!("{x:.3}"))
                .collect::<Vec<_>>()
                .join("+")
        };
        match &st.solved_for {
            None => Some(format!("{}: first model", v.cell)),
            Some(b) if b.limits_differ(v) => Some(format!("{}: target or limits changed", v.cell)),
            Some(b) if b.approaching => Some(format!("{}: approaching its allocation", v.cell)),
            Some(b)
                if b.least.iter().zip(&least).any(|(w, n)| drifted(*w, *n)) || {
                    // No shares within its ceilings meet its target (then and now): the split of
                    // a trade-off still depends on its model.
                    let out_of_reach = |l: &[f64]| l.iter().any(|x| !x.is_finite());
                    out_of_reach(&b.least)
                        && out_of_reach(&least)
                        && prediction_drifted(&b.model, m, &b.share)
                } =>
            {
                Some(format!(
                    "{}: least share {} -> {}",
                    v.cell,
                    show(&b.least),
                    show(&least)
                ))
            }
            Some(b) if b.meets && v.rate < MISSED * v.target_rate => Some(format!(
                "{}: missed its target ({:.2}/s of {:.2}/s)",
                v.cell, v.rate, v.target_rate
            )),
            _ => None,
        }
    }

    /// Records that `cell` now holds `share` of pool `pool` (tessd or the network service
    /// applied a decision), so that the pool gets back what it holds if it leaves.
    pub fn applied(&mut self, cell: &str, pool: usize, share: f64) {
        if let Some(c) = self.cells.get_mut(cell) {
            if let Some(k) = c.uses.iter().position(|&p| p == pool) {
                c.last_share[k] = share;
            }
        }
    }

    /// One decision round over `views` (the entries decided now; entries brokered but not
    /// decided this round keep their samples until [`Pacora::retain`] drops them). Returns one
    /// allocation per view, in the same order. A view whose per-pool fields disagree with its
    /// `uses` is answered `bad-view` with its shares unchanged and takes no part.
    pub fn decide(&mut self, all: &[CellView]) -> Vec<Allocation> {
        let pools = self.pools.len();
        // A view is taken if its fields agree and no earlier view has its name.
        let mut seen = std::collections::BTreeSet::new();
        let taken: Vec<bool> = all
            .iter()
            .map(|v| v.well_formed(pools) && seen.insert(v.cell.as_str()))
            .collect();
        let good: Vec<CellView> = all
            .iter()
            .zip(&taken)
            .filter(|(_, &t)| t)
            .map(|(v, _)| v.clone())
            .collect();
        let mut decided = self.decide_well_formed(&good).into_iter();
        all.iter()
            .zip(taken)
            .map(|(v, taken)| {
                if taken {
                    decided.next().expect("one allocation per good view")
                } else {
                    Allocation {
                        cell: v.cell.clone(),
                        share: v.share.clone(),
                        reason: AllocationReason::BadView,
                        predicted_tau: None,
                        model: None,
                    }
                }
            })
            .collect()
    }

    fn decide_well_formed(&mut self, views: &[CellView]) -> Vec<Allocation> {
        // Pools with an event this round: their entries are solved again.
        let mut hot = vec![self.config.decide == DecideOn::Period; self.pools.len()];
        let mut heat = |uses: &[usize]| uses.iter().for_each(|&p| hot[p] = true);
        let mut events = Vec::new();
        for (c, uses) in std::mem::take(&mut self.departed) {
            heat(&uses);
            events.push(format!("{c} left"));
        }
        for v in views {
            if let Some(c) = self.cells.get(&v.cell).filter(|c| c.uses != v.uses) {
                // Its pools changed: it leaves and joins again.
                heat(&c.uses.clone());
                self.forget(&v.cell);
            }
            if !self.cells.contains_key(&v.cell) {
                heat(&v.uses);
                events.push(format!("{} joined", v.cell));
            }
            let st = self
                .cells
                .entry(v.cell.clone())
                .or_insert_with(|| CellState {
                    uses: v.uses.clone(),
                    brought: v.share.clone(),
                    last_share: v.share.clone(),
                    ..Default::default()
                });
            st.last_share = v.share.clone();
            let had_model = st.model.is_some();
            match &v.known {
                Some(m) => {
                    st.model = Some(m.clone());
                    // Not observed: the next miss is not in a row with the last.
                    st.missed_side = None;
                }
                None => observe(st, v, &self.config),
            }
            if had_model && st.model.is_none() {
                st.solved_for = None;
                heat(&v.uses);
                events.push(format!("{}: phase change", v.cell));
            }
        }
        // Each model's least-reserving point, once a round: its model, target and limits, and
        // the pools' capacities, are fixed from here on.
        let capacity: Vec<f64> = (0..self.pools.len()).map(|p| self.capacity(p)).collect();
        let least: RoundLeast = views
            .iter()
            .map(|v| {
                let m = self.cells[&v.cell].model.as_ref();
                let of_v: Vec<f64> = v.uses.iter().map(|&p| capacity[p]).collect();
                let point = m.and_then(|m| least_point(m, v, self.margin(v), &of_v));
                (v.cell.clone(), point)
            })
            .collect();
        for v in views {
            if let Some(e) = self.event_of(v, &least) {
                heat(&v.uses);
                if !events.contains(&e) {
                    events.push(e);
                }
            }
        }
        self.events = events;
        // Pools joined by entries of several pools are solved together, and an event in one
        // heats its whole group. Pools that no entry joins are solved apart (their own
        // targets, their own trade-off), each on its own events; entries of pools without one
        // keep their shares (`no-event`). Each entry is solved with the group of its first
        // pool.
        let group = pool_groups(self.pools.len(), views);
        let mut hot_group = vec![false; self.pools.len()];
        for (p, &h) in hot.iter().enumerate() {
            hot_group[group[p]] |= h;
        }
        let mut out: Vec<Option<Allocation>> = vec![None; views.len()];
        let mut to_solve = Vec::new();
        let mut solved = Vec::new();
        for g in 0..self.pools.len() {
            if group[g] != g || !hot_group[g] {
                continue;
            }
            let members: Vec<usize> = (0..views.len())
                .filter(|&i| group[views[i].uses[0]] == g)
                .collect();
            if members.is_empty() {
                continue;
            }
            let solving: Vec<CellView> = members.iter().map(|&i| views[i].clone()).collect();
            solved.extend(self.solve(&solving, &least));
            to_solve.extend(members);
        }
        for (i, v) in views.iter().enumerate() {
            if !to_solve.contains(&i) {
                out[i] = Some(self.hold(v));
            }
        }
        let solving: Vec<&CellView> = to_solve.iter().map(|&i| &views[i]).collect();
        for (v, a) in solving.into_iter().zip(&solved) {
            let least = self.cells[&v.cell]
                .model
                .as_ref()
                .map(|m| (Self::least_raised(&least, v), m.clone()));
            let st = self.cells.get_mut(&v.cell).expect("observed above");
            st.solved_for = least.map(|(least, model)| Basis {
                model,
                target_rate: v.target_rate,
                floor: v.floor.clone(),
                ceiling: v.ceiling.clone(),
                slope: v.slope,
                least,
                meets: a.reason == AllocationReason::MeetsTarget,
                approaching: a.reason == AllocationReason::Approaching,
                share: a.share.clone(),
            });
        }
        for (i, a) in to_solve.into_iter().zip(solved) {
            out[i] = Some(a);
        }
        out.into_iter()
            .map(|a| a.expect("every view solved or held"))
            .collect()
    }

    /// Entry `v` keeps the shares in force: nothing changed since the last solve.
    fn hold(&self, v: &CellView) -> Allocation {
        let model = self.cells[&v.cell].model.clone();
        Allocation {
            cell: v.cell.clone(),
            share: v.share.clone(),
            reason: AllocationReason::NoEvent,
            predicted_tau: model.as_ref().map(|m| m.eval(&v.share)),
            model,
        }
    }

    /// Solves the allocation of every entry of `views` (the module docs' two cases).
    fn solve(&mut self, views: &[CellView], least: &RoundLeast) -> Vec<Allocation> {
        let pools = self.pools.len();
        let capacity: Vec<f64> = (0..pools).map(|p| self.capacity(p)).collect();
        let mut out: Vec<Option<Allocation>> = vec![None; views.len()];
        // Learning and silent entries first: what they take comes off the pools. A learning
        // entry raises into what is left when silent and learning entries keep what they hold
        // and modelled ones what meets their targets, even where that is more than they hold
        // now, or their floors if nothing does (those are re-allocated from what is left this
        // round anyway; a learning entry starved by a pool the others hold must still be able
        // to grow, but never into a target's need: a learning batch job once took the room a
        // video cell had to grow into after a resize, and the video missed its frame rate).
        let mut held = vec![0.0; pools];
        for v in views {
            let modelled = self.cells[&v.cell].model.is_some() && !v.silent();
            for (k, &p) in v.uses.iter().enumerate() {
                held[p] += if modelled {
                    need(least[&v.cell].as_deref(), v, k)
                } else {
                    v.share[k]
                };
            }
        }
        let mut left = capacity.clone();
        let mut free: Vec<f64> = (0..pools)
            .map(|p| (capacity[p] - held[p]).max(0.0))
            .collect();
        let mut modelled = Vec::new();
        let mut learned = Vec::new();
        for (i, v) in views.iter().enumerate() {
            let st = &self.cells[&v.cell];
            let (share, reason) = match &st.model {
                _ if v.silent() => (v.share.clone(), AllocationReason::NoRate),
                None => {
                    let share = learning_step(v, st, &self.config, self.margin(v), &free);
                    learned.push(v.cell.clone());
                    for (k, &p) in v.uses.iter().enumerate() {
                        free[p] = (free[p] - (share[k] - v.share[k]).max(0.0)).max(0.0);
                    }
                    (share, AllocationReason::Learning)
                }
                Some(m) => {
                    modelled.push((i, m.clone()));
                    continue;
                }
            };
            for (k, &p) in v.uses.iter().enumerate() {
                left[p] -= share[k];
            }
            out[i] = Some(Allocation {
                cell: v.cell.clone(),
                predicted_tau: st.model.as_ref().map(|m| m.eval(&share)),
                share,
                reason,
                model: st.model.clone(),
            });
        }
        for c in learned {
            if let Some(st) = self.cells.get_mut(&c) {
                st.turn += 1;
            }
        }
        // The least-reserving shares meeting each modelled entry's deadline (none: no shares
        // within its ceilings do).
        let a_min: Vec<Option<Vec<f64>>> = modelled
            .iter()
            .map(|(i, _)| least[&views[*i].cell].clone())
            .collect();
        // Every target is met only if each entry has such shares and, each raised to its
        // floor, they fit every pool together.
        let mut clamped = vec![0.0; pools];
        for ((i, _), a) in modelled.iter().zip(&a_min) {
            let v = &views[*i];
            for (k, &p) in v.uses.iter().enumerate() {
                clamped[p] += need(a.as_deref(), v, k);
            }
        }
        let all_fit = a_min.iter().all(Option::is_some)
            && (0..pools).all(|p| clamped[p] <= left[p].max(0.0) + 1e-9);
        let solved: Result<Vec<Vec<f64>>, _> = if all_fit || modelled.is_empty() {
            Ok(a_min.iter().flatten().cloned().collect())
        } else {
            self.trade_off(views, &modelled, &left)
        };
        let mut decided: Vec<(Vec<f64>, AllocationReason)> = modelled
            .iter()
            .enumerate()
            .map(|(k, (i, _))| {
                let v = &views[*i];
                let (share, reason) = match &solved {
                    Ok(alloc) if all_fit => (alloc[k].clone(), AllocationReason::MeetsTarget),
                    Ok(alloc) => {
                        // More than the least-reserving shares in every pool (a deadline
                        // met with room, as tau falls in every share): the least-reserving
                        // shares, whose penalty is zero as well.
                        let a = &alloc[k];
                        let least = a_min[k]
                            .as_ref()
                            .filter(|l| l.iter().zip(a).all(|(l, a)| l <= a));
                        (least.unwrap_or(a).clone(), AllocationReason::TradeOff)
                    }
                    Err(_) => (v.share.clone(), AllocationReason::SolverFailed),
                };
                let mut share: Vec<f64> = share
                    .iter()
                    .zip(v.floor.iter().zip(&v.ceiling))
                    .map(|(s, (f, c))| s.clamp(*f, *c))
                    .collect();
                let st = &self.cells[&v.cell];
                let mut reason = reason;
                if v.uses.len() > 1 && v.known.is_none() && reason != AllocationReason::SolverFailed
                {
                    for (k, s) in share.iter_mut().enumerate() {
                        let Some((lo, hi)) = sampled_range(&st.samples, k) else {
                            // No samples (a model that was given): nothing to be near.
                            continue;
                        };
                        // Near the samples, but never outside the limits.
                        let near = s
                            .clamp(lo / TRUST, hi * TRUST)
                            .clamp(v.floor[k], v.ceiling[k]);
                        if near != *s {
                            *s = near;
                            reason = AllocationReason::Approaching;
                        }
                    }
                }
                (share, reason)
            })
            .collect();
        if solved.is_ok() {
            // The solver knows no floors: an entry it starved is raised to its floor, and the
            // others give that back in proportion to what they hold above theirs, pool by pool.
            for (p, left) in left.iter().enumerate() {
                let mut at = Vec::new();
                let (mut shares, mut floors) = (Vec::new(), Vec::new());
                for (k, (i, _)) in modelled.iter().enumerate() {
                    let v = &views[*i];
                    if let Some(j) = v.uses.iter().position(|&q| q == p) {
                        at.push((k, j));
                        shares.push(decided[k].0[j]);
                        floors.push(v.floor[j]);
                    }
                }
                fit_to_pool(&mut shares, &floors, left.max(0.0));
                for ((k, j), s) in at.into_iter().zip(shares) {
                    decided[k].0[j] = s;
                }
            }
        }
        for ((i, m), (share, reason)) in modelled.iter().zip(decided) {
            let v = &views[*i];
            out[*i] = Some(Allocation {
                cell: v.cell.clone(),
                predicted_tau: Some(m.eval(&share)),
                share,
                reason,
                model: Some(m.clone()),
            });
        }
        out.into_iter()
            .map(|a| a.expect("every view decided"))
            .collect()
    }

    /// The allocation minimising the total penalty of the `modelled` entries under what is
    /// `left` of each pool: one problem over every pool any of them uses, each entry's model
    /// placed on its pools' columns (zero weight on the others).
    fn trade_off(
        &mut self,
        views: &[CellView],
        modelled: &[(usize, ResponseModel)],
        left: &[f64],
    ) -> Result<Vec<Vec<f64>>, super::SolveError> {
        let mut columns: Vec<usize> = modelled
            .iter()
            .flat_map(|(i, _)| views[*i].uses.iter().copied())
            .collect();
        columns.sort_unstable();
        columns.dedup();
        let col = |p: usize| columns.iter().position(|&q| q == p).expect("a used pool");
        let n = columns.len();
        let cells = modelled
            .iter()
            .map(|(i, m)| {
                let v = &views[*i];
                let mut w = vec![0.0; weight_count(n)];
                for ((a, b), wk) in pairs(v.uses.len()).zip(&m.w) {
                    let (ga, gb) = (col(v.uses[a]), col(v.uses[b]));
                    let (ga, gb) = (ga.min(gb), ga.max(gb));
                    let at = pairs(n)
                        .position(|pair| pair == (ga, gb))
                        .expect("a pair of columns");
                    w[at] += wk;
                }
                CellDemand {
                    model: ResponseModel {
                        tau0: m.tau0,
                        w,
                        resources: n,
                    },
                    deadline: v.deadline(self.margin(v)),
                    slope: v.slope,
                }
            })
            .collect();
        let problem = Problem {
            cells,
            capacity: columns.iter().map(|&p| left[p].max(1e-6)).collect(),
        };
        let s = self.workspace.solve(&problem)?;
        Ok(modelled
            .iter()
            .zip(&s.alloc)
            .map(|((i, _), a)| views[*i].uses.iter().map(|&p| a[col(p)]).collect())
            .collect())
    }
}

/// For each pool, the smallest pool it is joined to by entries that use several (pools joined
/// by a chain of such entries share one group).
fn pool_groups(pools: usize, views: &[CellView]) -> Vec<usize> {
    let mut group: Vec<usize> = (0..pools).collect();
    loop {
        let mut changed = false;
        for v in views {
            let least = v.uses.iter().map(|&p| group[p]).min().unwrap_or(0);
            for &p in &v.uses {
                if group[p] != least {
                    group[p] = least;
                    changed = true;
                }
            }
        }
        // A pool whose group's own group is smaller follows it.
        for p in 0..pools {
            let g = group[group[p]];
            if g != group[p] {
                group[p] = g;
                changed = true;
            }
        }
        if !changed {
            return group;
        }
    }
}

/// The least-reserving shares (in the order of `v.uses`) at which `m` meets `v`'s target
/// with `margin` to spare, or `None` if no shares within `v`'s ceilings do.
///
/// One pool: `w / (d - tau0)` (below the floor if the model allows; the floor if the entry
/// needs none of it). Two pools: the point of the level set `tau(a) = d`, within the floors
/// and ceilings, that reserves the least of the pools, `a_0 / C_0 + a_1 / C_1` with `C` the
/// pools' `capacity`: for each `a_0` the least `a_1` that meets `d` is a root of a quadratic
/// in `1 / sqrt(a_1)` ([`least_second`]), convex and falling in `a_0` (the sub-level set is
/// convex), so the reservation along it is convex and a golden-section search finds its
/// minimum. More pools: the ceilings scaled down together until the deadline is just met (a
/// point that meets it, not necessarily the least-reserving one; the broker makes entries of
/// at most two pools).
pub fn least_point(
    m: &ResponseModel,
    v: &CellView,
    margin: f64,
    capacity: &[f64],
) -> Option<Vec<f64>> {
    let d = v.deadline(margin);
    match v.uses.len() {
        1 => {
            let w = m.w[0];
            let a = if w <= 0.0 {
                if m.tau0 <= d {
                    v.floor[0]
                } else {
                    f64::INFINITY
                }
            } else if d > m.tau0 {
                w / (d - m.tau0)
            } else {
                f64::INFINITY
            };
            (a.is_finite() && a <= v.ceiling[0]).then(|| vec![a])
        }
        2 => {
            let (lo0, hi0) = (v.floor[0], v.ceiling[0]);
            let second = |a0: f64| least_second(m, d, a0, v.floor[1], v.ceiling[1]);
            second(hi0)?;
            // The smallest a_0 with a feasible a_1.
            let mut lo = lo0;
            if second(lo0).is_none() {
                let (mut bad, mut good) = (lo0, hi0);
                for _ in 0..100 {
                    let mid = 0.5 * (bad + good);
                    if second(mid).is_some() {
                        good = mid;
                    } else {
                        bad = mid;
                    }
                    if good - bad <= 1e-12 * good.max(1e-12) {
                        break;
                    }
                }
                lo = good;
            }
            let cost = |a0: f64| {
                second(a0).map_or(f64::INFINITY, |a1| {
                    a0 / capacity[0].max(1e-12) + a1 / capacity[1].max(1e-12)
                })
            };
            let a0 = golden_min(cost, lo, hi0);
            Some(vec![a0, second(a0)?])
        }
        _ => {
            let at = |t: f64| v.ceiling.iter().map(|c| c * t).collect::<Vec<f64>>();
            if m.eval(&v.ceiling) > d {
                return None;
            }
            let (mut bad, mut good) = (0.0, 1.0);
            for _ in 0..100 {
                let mid = 0.5 * (bad + good);
                if m.eval(&at(mid)) <= d {
                    good = mid;
                } else {
                    bad = mid;
                }
            }
            Some(
                at(good)
                    .iter()
                    .zip(&v.floor)
                    .map(|(a, f)| a.max(*f))
                    .collect(),
            )
        }
    }
}

/// The least `a_1` in `[floor, ceiling]` at which the two-pool model `m` meets `d` with `a_0`
/// of the first pool, or `None`. With `y = 1 / sqrt(a_1)`, `tau <= d` is `w_11 y^2 + (w_01 /
/// sqrt(a_0)) y + (tau0 + w_00 / a_0 - d) <= 0`, which holds for `y` up to the quadratic's
/// positive root.
fn least_second(m: &ResponseModel, d: f64, a0: f64, floor: f64, ceiling: f64) -> Option<f64> {
    if a0 <= 0.0 {
        return None;
    }
    let (w00, w01, w11) = (m.w[0], m.w[1], m.w[2]);
    let c = m.tau0 + w00 / a0 - d;
    let b = w01 / a0.sqrt();
    let a1 = if w11 <= 0.0 && b <= 0.0 {
        // The second pool does not matter: the floor, if the first meets the deadline.
        if c <= 0.0 {
            floor
        } else {
            return None;
        }
    } else {
        if c >= 0.0 {
            return None;
        }
        // The positive root in the form without cancellation (c < 0, b >= 0): a tiny w11
        // left by a fit would otherwise round it to 0.
        let y = -2.0 * c / (b + (b * b - 4.0 * w11 * c).sqrt());
        1.0 / (y * y)
    };
    let a1 = a1.max(floor);
    (a1.is_finite() && a1 <= ceiling).then_some(a1)
}

/// The minimum of a convex `f` on `[lo, hi]` by golden-section search.
fn golden_min(f: impl Fn(f64) -> f64, lo: f64, hi: f64) -> f64 {
    const INV_PHI: f64 = 0.618_033_988_749_894_8;
    let (mut a, mut b) = (lo, hi);
    let mut x1 = b - INV_PHI * (b - a);
    let mut x2 = a + INV_PHI * (b - a);
    let (mut f1, mut f2) = (f(x1), f(x2));
    for _ in 0..200 {
        if b - a <= 1e-10 * b.abs().max(1e-12) {
            break;
        }
        if f1 <= f2 {
            b = x2;
            x2 = x1;
            f2 = f1;
            x1 = b - INV_PHI * (b - a);
            f1 = f(x1);
        } else {
            a = x1;
            x1 = x2;
            f1 = f2;
            x2 = a + INV_PHI * (b - a);
            f2 = f(x2);
        }
    }
    let mid = 0.5 * (a + b);
    // The ends, in case the minimum sits on one (f is flat there within the tolerance).
    [lo, mid, hi]
        .into_iter()
        .min_by(|x, y| f(*x).total_cmp(&f(*y)))
        .unwrap_or(mid)
}

/// Lowers `shares` (each at or above its floor) so that they sum to at most `pool`, taking
/// from each in proportion to what it holds above its floor; floors are kept even if they
/// alone exceed the pool.
fn fit_to_pool(shares: &mut [f64], floors: &[f64], pool: f64) {
    let total: f64 = shares.iter().sum();
    if total <= pool + 1e-12 {
        return;
    }
    let base: f64 = floors.iter().sum();
    let above = total - base;
    let keep = if above > 0.0 {
        ((pool - base) / above).clamp(0.0, 1.0)
    } else {
        0.0
    };
    for (s, f) in shares.iter_mut().zip(floors) {
        *s = f + (*s - f).max(0.0) * keep;
    }
}

/// The smallest and largest share of pool `k` among `samples`, if there are any.
fn sampled_range(samples: &VecDeque<Sample>, k: usize) -> Option<(f64, f64)> {
    let (lo, hi) = samples.iter().fold((f64::MAX, 0.0f64), |(lo, hi), s| {
        (lo.min(s.alloc[k]), hi.max(s.alloc[k]))
    });
    (lo <= hi).then_some((lo, hi))
}

/// How spread an entry's samples are in each of its pools: the largest share over the
/// smallest.
fn spread(samples: &VecDeque<Sample>, pools: usize) -> Vec<f64> {
    (0..pools)
        .map(|k| {
            let (lo, hi) = sampled_range(samples, k).unwrap_or((f64::MAX, 0.0));
            hi / lo
        })
        .collect()
}

/// What a modelled entry needs in its pool `k` this round: its least-reserving share `least`
/// meeting its target, within its limits, whatever it holds now; its floor where no shares
/// within its ceilings meet its target (`None`).
fn need(least: Option<&[f64]>, v: &CellView, k: usize) -> f64 {
    least.map_or(v.floor[k], |a| a[k].clamp(v.floor[k], v.ceiling[k]))
}

/// Adds the period's sample, drops the old phase when the model missed it (one pool: twice in
/// a row on the same side), refits.
fn observe(st: &mut CellState, v: &CellView, cfg: &PacoraConfig) {
    if v.silent() || !v.share.iter().all(|s| *s > 0.0) {
        // Nothing measured: the next miss is not in a row with the last.
        st.missed_side = None;
        return;
    }
    let tau = v.response_time();
    // The model's error, relative to the measured response time (positive: it predicted
    // slower than measured), if it missed by more than PHASE_CHANGE.
    let miss = st
        .model
        .as_ref()
        .map(|m| (m.eval(&v.share) - tau) / tau)
        .filter(|e| e.abs() > PHASE_CHANGE);
    let missed = miss.is_some();
    let n = v.uses.len();
    st.samples.push_back(Sample {
        alloc: v.share.clone(),
        tau,
    });
    if n == 1 {
        // One pool: a new phase is two misses in a row on the same side. A single one is
        // noise until the next period says otherwise (a batch job's throughput varies by
        // several times at one share, with its input): it is fitted with the others. The
        // second starts the new phase from both periods.
        let side = miss.map(f64::signum);
        if side.is_some() && side == st.missed_side {
            while st.samples.len() > 2 {
                st.samples.pop_front();
            }
            // No fit in this round, even from two spread samples: the model is gone, so the
            // round reports the phase change and solves again (a learning step).
            st.model = None;
            st.missed_side = None;
            return;
        }
        st.missed_side = side;
    }
    while st.samples.len() > cfg.keep {
        st.samples.pop_front();
    }
    if n == 1 {
        if st.samples.len() >= 2 && spread_enough(&st.samples, 1, cfg) {
            let samples: Vec<Sample> = st.samples.iter().cloned().collect();
            if let Some(m) = ResponseModel::fit(1, &samples) {
                st.model = Some(m);
            }
        }
        return;
    }
    // Several pools: a sample the model missed is news from where it was not measured (its
    // allocation moved beyond its samples) as often as a new phase, so it is fitted with the
    // others first; only if no fit explains it with enough of them does a new phase start.
    // On a copy: samples dropped by a fit that fails anyway still support the model in force.
    let mut kept = st.samples.clone();
    match fit_several(&mut kept, n, cfg) {
        Some(m) => {
            st.samples = kept;
            st.model = Some(m);
        }
        None if missed => {
            let newest = st.samples.pop_back().expect("just added");
            st.samples.clear();
            st.samples.push_back(newest);
            st.model = None;
        }
        // Still learning, or the samples bunched: the model in force stays.
        None => {}
    }
}

/// A model of `n > 1` pools fitted to `samples`: `tau0` and `n (n + 1) / 2` weights, fitted
/// only from two samples more than that ([`joint_samples`]; with exactly as many the fit goes
/// through every sample's noise) spread in every pool, and taken only if it explains each
/// sample within [`PHASE_CHANGE`]. While it misses one by more, the worst of the older samples
/// is dropped and the rest fitted again (a period the host stalled, a share so small that the
/// cell's throttling costs more than `w / a`, or an older phase); the newest sample is always
/// kept, as what the entry does now. `None` when too few samples are left.
fn fit_several(
    samples: &mut VecDeque<Sample>,
    n: usize,
    cfg: &PacoraConfig,
) -> Option<ResponseModel> {
    while samples.len() >= joint_samples(n) && spread_enough(samples, n, cfg) {
        let all: Vec<Sample> = samples.iter().cloned().collect();
        let m = ResponseModel::fit(n, &all)?;
        let miss = |s: &Sample| ((m.eval(&s.alloc) - s.tau) / s.tau).abs();
        if all.iter().all(|s| miss(s) <= PHASE_CHANGE) {
            return Some(m);
        }
        let older = all.len() - 1;
        let worst = (0..older)
            .max_by(|&a, &b| miss(&all[a]).total_cmp(&miss(&all[b])))
            .expect("more than one sample");
        samples.remove(worst);
    }
    None
}

/// Samples a model of `n > 1` pools is fitted from, at least: two more than its parameters.
pub const fn joint_samples(n: usize) -> usize {
    weight_count(n) + 3
}

/// Samples an entry of `n > 1` pools must be allowed to keep (`[pacora] keep`): room to drop
/// an outlier and still fit ([`fit_several`]). The configuration refuses less.
pub const fn joint_keep(n: usize) -> usize {
    joint_samples(n) + 2
}

/// Whether samples spread by `explore / 2` in each of `n` pools: bunched at one share they
/// cannot separate `tau0` from the weights, so the model is refitted only when they spread,
/// and kept otherwise (once converged, an entry's samples all sit at its shares).
fn spread_enough(samples: &VecDeque<Sample>, n: usize, cfg: &PacoraConfig) -> bool {
    spread(samples, n)
        .iter()
        .all(|s| *s >= 1.0 + cfg.explore / 2.0)
}

/// Where an entry without a model goes next, raised by at most what each pool has `free`.
///
/// One pool: the share the one-point model `tau = w / a` through its last period predicts for
/// the target with margin, moved at least `explore` so that the next sample can be learned
/// from. Several pools: one pool moves per round, in turn, the others keep their shares, so
/// that the samples vary each pool on its own (moving all together would put every sample on
/// one ray from the origin, along which the pools' weights cannot be told apart: the first
/// live runs fitted all of a fetch's time to its CPU and starved its flow). The pool that
/// moves goes where the one-point model says, at most by a factor of 2, at least `explore`.
fn learning_step(
    v: &CellView,
    st: &CellState,
    cfg: &PacoraConfig,
    margin: f64,
    free: &[f64],
) -> Vec<f64> {
    let scale = v.response_time() / v.deadline(margin);
    let n = v.uses.len();
    let (push, scale) = if n == 1 {
        (0, scale)
    } else {
        (st.turn % n, scale.clamp(0.5, 2.0))
    };
    (0..n)
        .map(|k| {
            let share = v.share[k];
            // Bounds: the floor, and the ceiling or what the free pool allows above the share
            // (never below the share itself, which may already sit under the floor).
            let hi = v.ceiling[k]
                .min(share + free[v.uses[k]])
                .max(v.floor[k].min(share));
            let lo = v.floor[k].min(hi);
            if k != push {
                return share.clamp(lo, hi);
            }
            let want = share * scale;
            let step = share * cfg.explore;
            let towards = if want >= share {
                want.max(share + step)
            } else {
                want.min(share - step)
            };
            let next = towards.clamp(lo, hi);
            if (next - share).abs() >= step / 2.0 {
                return next;
            }
            // Pinned against a limit: move the other way to learn.
            let other = if share + step <= hi {
                share + step
            } else {
                share - step
            };
            other.clamp(lo, hi)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A simulated cell: its true response time per unit `tau0 + w / a`, seconds.
    struct Plant {
        tau0: f64,
        w: f64,
    }

    impl Plant {
        fn rate(&self, share: f64, k: u64) -> f64 {
            // +-2% deterministic noise.
            let noise = 1.0 + 0.02 * (((k * 7919) % 11) as f64 / 5.0 - 1.0);
            noise / (self.tau0 + self.w / share)
        }
    }

    fn view(cell: &str, share: f64, rate: f64, target: f64, slope: f64) -> CellView {
        CellView::single(cell, 0, share, rate, target, 0.05, 1.9, slope)
    }

    /// Encoder: 2 ms fixed + 12 ms per hart (a frame at 0.4 harts takes 32 ms). Indexer: 50 ms
    /// per hart.
    fn encoder_and_indexer() -> (Plant, Plant) {
        (
            Plant {
                tau0: 0.002,
                w: 0.012,
            },
            Plant { tau0: 0.0, w: 0.05 },
        )
    }

    /// Whether `a` was decided for `reason`, or held (`no-event`) since a round that was.
    fn settled(a: &Allocation, reason: AllocationReason) -> bool {
        a.reason == reason || a.reason == AllocationReason::NoEvent
    }

    /// Runs `rounds` rounds of the policy against `plants`; returns the last allocations.
    fn run(
        pacora: &mut Pacora,
        plants: &[(&str, &Plant, f64, f64)],
        shares: &mut [f64],
        rounds: u64,
        from: u64,
    ) -> Vec<Allocation> {
        let mut last = Vec::new();
        for k in from..from + rounds {
            let views: Vec<CellView> = plants
                .iter()
                .zip(shares.iter())
                .map(|((c, p, target, slope), &s)| view(c, s, p.rate(s, k), *target, *slope))
                .collect();
            last = pacora.decide(&views);
            for (s, a) in shares.iter_mut().zip(&last) {
                *s = a.share[0];
            }
        }
        last
    }

    #[test]
    fn cells_that_fit_get_just_what_meets_their_targets() {
        // Encoder: 2 ms fixed + 12 ms per hart (a frame at 0.4 harts takes 32 ms); target
        // 30 fps. Indexer: 50 ms per hart, target 10/s. Plenty of pool (1.8 harts).
        let (enc, idx) = encoder_and_indexer();
        let mut p = Pacora::new(PacoraConfig::default());
        let mut shares = [0.9, 0.9];
        let last = run(
            &mut p,
            &[("enc", &enc, 30.0, 1.0), ("idx", &idx, 10.0, 1.0)],
            &mut shares,
            12,
            0,
        );
        assert!(
            last.iter()
                .all(|a| settled(a, AllocationReason::MeetsTarget)),
            "{last:?}"
        );
        // The least shares with 10% margin: enc 0.012 / (1/33 - 0.002) = 0.421, idx 0.55.
        assert!((shares[0] - 0.421).abs() < 0.03, "{shares:?}");
        assert!((shares[1] - 0.55).abs() < 0.03, "{shares:?}");
        // Both hold their targets with what they were given, and less is reserved than before.
        assert!(enc.rate(shares[0], 0) >= 30.0 && idx.rate(shares[1], 0) >= 10.0);
        assert!(shares.iter().sum::<f64>() < 1.8);
    }

    #[test]
    fn a_learning_cell_grows_into_what_insatiable_cells_hold_above_their_floors() {
        // "idx" is modelled and holds the whole pool; "video" starts learning at its floor,
        // far below what it needs (its response time is 20 times its target's).
        let idx = Plant { tau0: 0.0, w: 0.05 };
        let mut p = Pacora::new(PacoraConfig {
            capacity: Some(0.9),
            ..Default::default()
        });
        let mut shares = [0.45, 0.45];
        run(
            &mut p,
            &[("idx", &idx, 1000.0, 1.0), ("other", &idx, 1000.0, 1.0)],
            &mut shares,
            4,
            0,
        );
        assert!(p.model("idx").is_some());
        let mut v = view("video", 0.05, 1.5, 30.0, 100.0);
        v.floor = vec![0.05];
        let a = p.decide(&[
            view("idx", 0.85, idx.rate(0.85, 9), 1000.0, 1.0),
            view("other", 0.0001, idx.rate(0.0001, 9), 1000.0, 1.0),
            v,
        ]);
        assert_eq!(a[2].reason, AllocationReason::Learning);
        assert!(a[2].share[0] > 0.5, "{a:?}");
    }

    #[test]
    fn a_learning_flow_grows_into_a_hog_s_share_and_floors_are_never_overbooked() {
        // A hog with a demand model no share within its ceiling satisfies holds 9.0 of 9.5;
        // a new flow learning at 0.5 wants 7.4 and may take what the hog holds above its floor.
        let mut p = Pacora::new(PacoraConfig {
            capacity: Some(9.5),
            ..Default::default()
        });
        let hog_model = ResponseModel {
            tau0: 0.0,
            w: vec![0.524],
            resources: 1,
        };
        let mut hog = view("hog", 9.0, 10.0, 1e6, 1.0);
        hog.ceiling = vec![9.5];
        hog.known = Some(hog_model.clone());
        p.decide(&[hog.clone()]);
        let mut video = view("video", 0.5, 40.0, 270.0, 100.0);
        video.ceiling = vec![9.5];
        let a = p.decide(&[hog.clone(), video.clone()]);
        assert_eq!(a[1].reason, AllocationReason::Learning);
        assert!(a[1].share[0] > 2.0, "{a:?}");
        let total: f64 = a.iter().map(|x| x.share[0]).sum();
        assert!(total <= 9.5 + 1e-9, "{a:?}");
        // A modelled cell below its floor (its first share was refused) is counted at its
        // floor: the learning cell cannot take that part of the pool.
        let mut low = view("low", 0.1, 30.0, 30.0, 1.0);
        low.floor = vec![0.21];
        low.known = Some(ResponseModel {
            tau0: 0.0,
            w: vec![0.001],
            resources: 1,
        });
        let mut p = Pacora::new(PacoraConfig {
            capacity: Some(2.416),
            ..Default::default()
        });
        p.decide(&[low.clone()]);
        let mut learner = view("learner", 0.3, 1.0, 30.0, 1.0);
        learner.ceiling = vec![2.4];
        let a = p.decide(&[low, learner]);
        let total: f64 = a.iter().map(|x| x.share[0]).sum();
        assert!(total <= 2.416 + 1e-9, "{a:?}");
    }

    #[test]
    fn a_known_model_is_used_from_the_first_round() {
        // A flow of 270 units/s of 8,000 bits each: 2.16 Mbit/s, 2.376 with 10% margin.
        let m = ResponseModel {
            tau0: 0.0,
            w: vec![0.008],
            resources: 1,
        };
        let mut p = Pacora::new(PacoraConfig {
            capacity: Some(9.5),
            ..Default::default()
        });
        let mut v = view("video", 4.0, 270.0, 270.0, 1.0);
        v.ceiling = vec![9.5];
        v.known = Some(m);
        let a = p.decide(&[v]);
        assert_eq!(a[0].reason, AllocationReason::MeetsTarget);
        assert!((a[0].share[0] - 2.376).abs() < 1e-9, "{a:?}");
    }

    #[test]
    fn a_cell_whose_target_needs_more_than_its_ceiling_is_a_trade_off() {
        // 0.5 Mbit per unit at 1,000,000 units/s: no share within the 40 Mbit/s ceiling meets
        // it, so it gets the ceiling as a trade-off, not as a met target.
        let m = ResponseModel {
            tau0: 0.0,
            w: vec![0.5],
            resources: 1,
        };
        let mut p = Pacora::new(PacoraConfig {
            capacity: Some(40.0),
            ..Default::default()
        });
        let mut v = view("hog", 5.0, 10.0, 1e6, 1.0);
        v.ceiling = vec![40.0];
        v.known = Some(m);
        let a = p.decide(&[v]);
        assert_eq!(a[0].reason, AllocationReason::TradeOff, "{a:?}");
        assert!((a[0].share[0] - 40.0).abs() < 1e-6, "{a:?}");
    }

    #[test]
    fn floors_are_paid_for_by_the_cells_above_theirs() {
        // The solver gave the second nothing; raised to its floor, it is paid for by the first.
        let mut shares = [9.5, 1.0];
        fit_to_pool(&mut shares, &[0.1, 1.0], 9.5);
        let sum: f64 = shares.iter().sum();
        assert!((sum - 9.5).abs() < 1e-9, "{shares:?}");
        assert!(shares[1] >= 1.0 && shares[0] >= 0.1);
        // Within the pool: unchanged.
        let mut ok = [1.0, 2.0];
        fit_to_pool(&mut ok, &[0.5, 0.5], 4.0);
        assert_eq!(ok, [1.0, 2.0]);
    }

    #[test]
    fn an_overloaded_pool_is_split_where_the_penalties_trade_off() {
        // Two identical cells that each need 0.55 harts for their target; the pool is 0.8.
        // The cell whose lateness costs three times as much gets more.
        let plant = Plant { tau0: 0.0, w: 0.05 };
        let mut p = Pacora::new(PacoraConfig {
            capacity: Some(0.8),
            ..Default::default()
        });
        let mut shares = [0.4, 0.4];
        let last = run(
            &mut p,
            &[("a", &plant, 10.0, 3.0), ("b", &plant, 10.0, 1.0)],
            &mut shares,
            16,
            0,
        );
        assert!(
            last.iter().all(|a| settled(a, AllocationReason::TradeOff)),
            "{last:?}"
        );
        assert!(shares.iter().sum::<f64>() <= 0.8 + 1e-6, "{shares:?}");
        assert!(shares[0] > shares[1] + 0.05, "{shares:?}");
        // The optimum of the true problem (Clarabel) within a few percent.
        let truth = crate::pacora::socp::solve(&Problem {
            cells: [3.0, 1.0]
                .iter()
                .map(|&s| CellDemand {
                    model: ResponseModel {
                        tau0: 0.0,
                        w: vec![0.05],
                        resources: 1,
                    },
                    deadline: 1.0 / 11.0,
                    slope: s,
                })
                .collect(),
            capacity: vec![0.8],
        })
        .unwrap();
        for (got, want) in shares.iter().zip(&truth.alloc) {
            assert!(
                (got - want[0]).abs() < 0.04,
                "{shares:?} vs {:?}",
                truth.alloc
            );
        }
    }

    #[test]
    fn a_phase_change_is_learned_again() {
        let light = Plant { tau0: 0.0, w: 0.01 };
        let heavy = Plant { tau0: 0.0, w: 0.02 };
        let mut p = Pacora::new(PacoraConfig::default());
        let mut shares = [1.0];
        run(&mut p, &[("enc", &light, 30.0, 1.0)], &mut shares, 10, 0);
        assert!((shares[0] - 0.33).abs() < 0.03, "{shares:?}");
        let last = run(&mut p, &[("enc", &heavy, 30.0, 1.0)], &mut shares, 10, 10);
        assert!(settled(&last[0], AllocationReason::MeetsTarget), "{last:?}");
        assert!((shares[0] - 0.66).abs() < 0.05, "{shares:?}");
    }

    #[test]
    fn one_outlying_period_is_noise_and_two_on_one_side_are_a_new_phase() {
        let plant = Plant { tau0: 0.0, w: 0.01 };
        let mut p = Pacora::new(PacoraConfig::default());
        let mut shares = [1.0];
        run(&mut p, &[("job", &plant, 30.0, 1.0)], &mut shares, 10, 0);
        assert!(p.model("job").is_some());
        let phase_change = |p: &Pacora| p.last_events().iter().any(|e| e == "job: phase change");
        let s = shares[0];
        // One period at half the rate, one at twice: each alone is noise, the model stays.
        for (k, factor) in [(10, 0.5), (11, 2.0), (12, 1.0)] {
            p.decide(&[view("job", s, factor * plant.rate(s, k), 30.0, 1.0)]);
            assert!(!phase_change(&p), "{:?}", p.last_events());
            assert!(p.model("job").is_some(), "period {k}");
        }
        // Two in a row at half the rate: a new phase, learned from those two periods.
        p.decide(&[view("job", s, 0.5 * plant.rate(s, 13), 30.0, 1.0)]);
        assert!(!phase_change(&p), "{:?}", p.last_events());
        p.decide(&[view("job", s, 0.5 * plant.rate(s, 14), 30.0, 1.0)]);
        assert!(phase_change(&p), "{:?}", p.last_events());
        assert_eq!(p.cells["job"].samples.len(), 2);
        // The same at two shares far enough apart to fit: still a phase change, reported.
        run(&mut p, &[("job", &plant, 30.0, 1.0)], &mut shares, 10, 20);
        assert!(p.model("job").is_some());
        let s = shares[0];
        p.decide(&[view("job", s, 0.5 * plant.rate(s, 30), 30.0, 1.0)]);
        assert!(!phase_change(&p), "{:?}", p.last_events());
        let t = 1.5 * s;
        p.decide(&[view("job", t, 0.5 * plant.rate(t, 31), 30.0, 1.0)]);
        assert!(phase_change(&p), "{:?}", p.last_events());
        // A period with no beats between two misses: not in a row.
        run(&mut p, &[("job", &plant, 30.0, 1.0)], &mut shares, 10, 40);
        let s = shares[0];
        p.decide(&[view("job", s, 0.5 * plant.rate(s, 50), 30.0, 1.0)]);
        p.decide(&[view("job", s, 0.0, 30.0, 1.0)]);
        p.decide(&[view("job", s, 0.5 * plant.rate(s, 52), 30.0, 1.0)]);
        assert!(!phase_change(&p), "{:?}", p.last_events());
        assert!(p.model("job").is_some());
        // Nor with a period between them whose model was given, not observed.
        let mut given = view("job", s, plant.rate(s, 53), 30.0, 1.0);
        given.known = p.model("job").cloned();
        p.decide(&[given]);
        p.decide(&[view("job", s, 0.5 * plant.rate(s, 54), 30.0, 1.0)]);
        assert!(!phase_change(&p), "{:?}", p.last_events());
        assert!(p.model("job").is_some());
    }

    #[test]
    fn limits_hold_and_silent_cells_keep_their_share() {
        let plant = Plant { tau0: 0.0, w: 0.05 };
        let mut p = Pacora::new(PacoraConfig::default());
        for k in 0..10 {
            let mut v = view("capped", 0.3, plant.rate(0.3, k), 10.0, 1.0);
            v.ceiling = vec![0.3];
            let quiet = view("quiet", 0.2, 0.0, 10.0, 1.0);
            let out = p.decide(&[v, quiet]);
            assert!(out[0].share[0] <= 0.3 + 1e-12, "{out:?}");
            assert_eq!(out[1].share[0], 0.2);
            assert!(settled(&out[1], AllocationReason::NoRate), "{out:?}");
        }
    }

    #[test]
    fn the_pool_is_what_the_cells_brought() {
        let plant = Plant { tau0: 0.0, w: 0.05 };
        let mut p = Pacora::new(PacoraConfig::default());
        p.decide(&[view("a", 0.5, plant.rate(0.5, 0), 10.0, 1.0)]);
        assert!((p.capacity(0) - 0.5).abs() < 1e-12);
        p.decide(&[
            view("a", 0.5, plant.rate(0.5, 1), 10.0, 1.0),
            view("b", 0.3, plant.rate(0.3, 1), 10.0, 1.0),
        ]);
        assert!((p.capacity(0) - 0.8).abs() < 1e-12);
        // b was raised to 0.4 and leaves: the pool is a's 0.5 less the 0.1 b took with it.
        p.applied("b", 0, 0.4);
        p.retain(&["a"]);
        assert!((p.capacity(0) - 0.4).abs() < 1e-12);
    }

    #[test]
    fn learning_raises_only_into_the_free_pool() {
        // Pool 0.6 held whole by two cells below their targets: a learning cell that wants more
        // than the pool has left moves down to learn instead of overbooking it.
        let plant = Plant { tau0: 0.0, w: 0.05 };
        let mut p = Pacora::new(PacoraConfig {
            capacity: Some(0.6),
            ..Default::default()
        });
        let out = p.decide(&[
            view("a", 0.3, plant.rate(0.3, 0), 10.0, 1.0),
            view("b", 0.3, plant.rate(0.3, 0), 10.0, 1.0),
        ]);
        assert!(
            out.iter().all(|a| a.reason == AllocationReason::Learning),
            "{out:?}"
        );
        assert!(
            out.iter().map(|a| a.share[0]).sum::<f64>() <= 0.6 + 1e-9,
            "{out:?}"
        );
    }

    #[test]
    fn a_steady_system_is_solved_again_only_when_something_changes() {
        let (enc, idx) = encoder_and_indexer();
        let mut p = Pacora::new(PacoraConfig::default());
        let mut shares = [0.9, 0.9];
        let cells = [("enc", &enc, 30.0, 1.0), ("idx", &idx, 10.0, 1.0)];
        run(&mut p, &cells, &mut shares, 12, 0);
        // Settled: rounds of measurements with noise change nothing and solve nothing.
        let before = shares;
        let last = run(&mut p, &cells, &mut shares, 6, 12);
        assert!(
            last.iter().all(|a| a.reason == AllocationReason::NoEvent),
            "{last:?}"
        );
        assert!(p.last_events().is_empty(), "{:?}", p.last_events());
        assert_eq!(shares, before);
        // A new target is an event: the round solves again and says why.
        let faster = [("enc", &enc, 40.0, 1.0), ("idx", &idx, 10.0, 1.0)];
        let a = run(&mut p, &faster, &mut shares, 1, 18);
        assert_eq!(a[0].reason, AllocationReason::MeetsTarget, "{a:?}");
        assert!(shares[0] > before[0] + 0.05, "{shares:?} vs {before:?}");
        assert_eq!(p.last_events(), ["enc: target or limits changed"]);
        // A cell that joins, and one that leaves, are events.
        let extra = Plant { tau0: 0.0, w: 0.01 };
        let views = [
            view("enc", shares[0], enc.rate(shares[0], 19), 40.0, 1.0),
            view("idx", shares[1], idx.rate(shares[1], 19), 10.0, 1.0),
            view("new", 0.1, extra.rate(0.1, 19), 10.0, 1.0),
        ];
        p.decide(&views);
        assert!(p.last_events().contains(&"new joined".to_string()));
        p.retain(&["enc", "idx"]);
        let a = p.decide(&views[..2]);
        assert_eq!(p.last_events()[0], "new left");
        assert!(
            a.iter().all(|a| a.reason != AllocationReason::NoEvent),
            "{a:?}"
        );
    }

    #[test]
    fn a_model_that_drifts_or_a_sized_cell_that_misses_is_solved_again() {
        let known = |w: f64| ResponseModel {
            tau0: 0.0,
            w: vec![w],
            resources: 1,
        };
        let mut p = Pacora::new(PacoraConfig {
            capacity: Some(9.5),
            ..Default::default()
        });
        let mut v = view("video", 4.0, 270.0, 270.0, 1.0);
        v.ceiling = vec![9.5];
        v.known = Some(known(0.008));
        let a = p.decide(&[v.clone()]);
        assert_eq!(a[0].reason, AllocationReason::MeetsTarget);
        v.share = vec![a[0].share[0]];
        // 3% more demand: within the margin's half, held.
        v.known = Some(known(0.008 * 1.03));
        assert_eq!(p.decide(&[v.clone()])[0].reason, AllocationReason::NoEvent);
        // 10% more than when it was solved: solved again, sized for the new demand.
        v.known = Some(known(0.008 * 1.10));
        let a = p.decide(&[v.clone()]);
        assert_eq!(
            a[0].reason,
            AllocationReason::MeetsTarget,
            "{:?}",
            p.last_events()
        );
        assert!(p.last_events()[0].starts_with("video: least share"));
        assert!((a[0].share[0] - 2.376 * 1.10).abs() < 1e-9, "{a:?}");
        v.share = vec![a[0].share[0]];
        // Sized to meet its target, it measured 90% of it: solved again.
        v.rate = 0.9 * 270.0;
        p.decide(&[v.clone()]);
        assert!(
            p.last_events()[0].starts_with("video: missed its target"),
            "{:?}",
            p.last_events()
        );
    }

    #[test]
    fn decide_every_period_solves_every_round() {
        let idx = Plant { tau0: 0.0, w: 0.05 };
        let mut p = Pacora::new(PacoraConfig {
            decide: DecideOn::Period,
            ..Default::default()
        });
        let mut shares = [0.9];
        let last = run(&mut p, &[("idx", &idx, 10.0, 1.0)], &mut shares, 20, 0);
        assert_eq!(last[0].reason, AllocationReason::MeetsTarget, "{last:?}");
        assert_eq!(DecideOn::parse("period"), Ok(DecideOn::Period));
        assert_eq!(DecideOn::parse("events"), Ok(DecideOn::Events));
        assert!(DecideOn::parse("sometimes").is_err());
    }

    #[test]
    fn bad_settings_are_refused() {
        for c in [
            PacoraConfig {
                capacity: Some(-1.0),
                ..Default::default()
            },
            PacoraConfig {
                margin: 2.0,
                ..Default::default()
            },
            PacoraConfig {
                explore: 0.0,
                ..Default::default()
            },
            PacoraConfig {
                keep: 1,
                ..Default::default()
            },
        ] {
            assert!(c.validate().is_err(), "{c:?}");
        }
        assert!(PacoraConfig::default().validate().is_ok());
    }

    /// A cell that fetches each unit over its flow, then computes on it: `w_c / a_c` seconds
    /// of CPU at `a_c` harts after `w_n / a_n` seconds of transfer at `a_n` Mbit/s.
    struct Fetch {
        w_c: f64,
        w_n: f64,
    }

    impl Fetch {
        fn rate(&self, a: &[f64], k: u64) -> f64 {
            let noise = 1.0 + 0.02 * (((k * 7919) % 11) as f64 / 5.0 - 1.0);
            noise / (self.w_c / a[0] + self.w_n / a[1])
        }

        fn model(&self) -> ResponseModel {
            ResponseModel {
                tau0: 0.0,
                w: vec![self.w_c, 0.0, self.w_n],
                resources: 2,
            }
        }
    }

    /// An entry of both pools: harts (floor 0.05, ceiling 1.9) and Mbit/s (floor 1, ceiling
    /// 200).
    fn joint_view(cell: &str, share: [f64; 2], rate: f64, target: f64) -> CellView {
        CellView {
            cell: cell.into(),
            uses: vec![0, 1],
            share: share.to_vec(),
            rate,
            target_rate: target,
            floor: vec![0.05, 1.0],
            ceiling: vec![1.9, 200.0],
            slope: 1.0,
            known: None,
        }
    }

    fn two_pools(cpu: f64, net: f64) -> Pacora {
        let pool = |c: f64| Pool {
            capacity: Some(c),
            margin: 0.1,
        };
        Pacora::with_pools(PacoraConfig::default(), vec![pool(cpu), pool(net)])
    }

    #[test]
    fn the_least_reserving_point_is_where_the_pools_marginal_costs_meet() {
        // tau = 0.02 / a_c + 8 / a_n, d = 1 / 11: minimising a_c / 2 + a_n / 200 on the level
        // set gives (Lagrange) a_c = 0.2 s, a_n = 40 s with 0.1 / s + 0.2 / s = 1 / 11.
        let f = Fetch {
            w_c: 0.02,
            w_n: 8.0,
        };
        let v = joint_view("fetch", [1.0, 10.0], 1.0, 10.0);
        let s = 0.3 * 11.0;
        let a = least_point(&f.model(), &v, 0.1, &[2.0, 200.0]).unwrap();
        assert!((a[0] - 0.2 * s).abs() < 1e-6, "{a:?}");
        assert!((a[1] - 40.0 * s).abs() < 1e-4, "{a:?}");
        assert!((f.model().eval(&a) - 1.0 / 11.0).abs() < 1e-9);
        // The link dearer (capacity 50): more harts, fewer Mbit/s, still on the level set.
        let b = least_point(&f.model(), &v, 0.1, &[2.0, 50.0]).unwrap();
        assert!(b[0] > a[0] && b[1] < a[1], "{a:?} {b:?}");
        assert!((f.model().eval(&b) - 1.0 / 11.0).abs() < 1e-9);
        // A cross term and a fixed part: the point found is on the level set, and no point of
        // a grid over the box that meets the deadline reserves less.
        let m = ResponseModel {
            tau0: 0.01,
            w: vec![0.01, 0.3, 4.0],
            resources: 2,
        };
        let c = least_point(&m, &v, 0.1, &[2.0, 200.0]).unwrap();
        assert!((m.eval(&c) - 1.0 / 11.0).abs() < 1e-9, "{c:?}");
        let cost = |a: &[f64]| a[0] / 2.0 + a[1] / 200.0;
        for i in 1..=100 {
            for j in 1..=100 {
                let g = [
                    0.05 + 1.85 * i as f64 / 100.0,
                    1.0 + 199.0 * j as f64 / 100.0,
                ];
                if m.eval(&g) <= 1.0 / 11.0 {
                    assert!(cost(&g) >= cost(&c) - 1e-9, "{g:?} beats {c:?}");
                }
            }
        }
        // Nothing within the ceilings meets it: none.
        let slow = Fetch { w_c: 1.0, w_n: 8.0 };
        assert_eq!(least_point(&slow.model(), &v, 0.1, &[2.0, 200.0]), None);
        // The link does not matter: the first pool's least share and the second's floor.
        let cpu_only = ResponseModel {
            tau0: 0.0,
            w: vec![0.05, 0.0, 0.0],
            resources: 2,
        };
        let d = least_point(&cpu_only, &v, 0.1, &[2.0, 200.0]).unwrap();
        assert!((d[0] - 0.55).abs() < 1e-6 && d[1] == 1.0, "{d:?}");
    }

    #[test]
    fn a_cell_of_both_pools_learns_its_joint_model_and_gets_the_least_reserving_shares() {
        let f = Fetch {
            w_c: 0.02,
            w_n: 8.0,
        };
        let mut p = two_pools(2.0, 200.0);
        let mut share = [0.3, 20.0];
        let mut last = Vec::new();
        let mut learning_rounds = 0;
        for k in 0..30 {
            let v = joint_view("fetch", share, f.rate(&share, k), 10.0);
            last = p.decide(&[v]);
            learning_rounds += (last[0].reason == AllocationReason::Learning) as u32;
            share = [last[0].share[0], last[0].share[1]];
        }
        assert!(settled(&last[0], AllocationReason::MeetsTarget), "{last:?}");
        assert!(learning_rounds <= 8, "{learning_rounds} rounds learning");
        let m = p.model("fetch").unwrap();
        assert_eq!(m.resources, 2);
        // The least-reserving point of the true model, within the fit's noise.
        let s = 0.3 * 11.0;
        assert!(
            (share[0] - 0.2 * s).abs() < 0.05 * 0.2 * s,
            "{share:?} {m:?}"
        );
        assert!(
            (share[1] - 40.0 * s).abs() < 0.05 * 40.0 * s,
            "{share:?} {m:?}"
        );
        assert!(f.rate(&share, 0) >= 0.98 * 10.0, "{share:?}");
    }

    #[test]
    fn one_solve_across_both_pools_gives_the_plentiful_link_to_spare_the_scarce_harts() {
        // "idx" needs 1.1 harts of a 0.8-hart pool; "fetch" needs harts and the link, which
        // no one else uses. Solved together, fetch is given far more of the link than its
        // least-reserving point so that it needs fewer harts, which go to idx.
        let f = Fetch {
            w_c: 0.02,
            w_n: 8.0,
        };
        let mut p = two_pools(0.8, 200.0);
        let mut idx = CellView::single("idx", 0, 0.4, 8.0, 20.0, 0.05, 1.9, 1.0);
        idx.known = Some(ResponseModel {
            tau0: 0.0,
            w: vec![0.05],
            resources: 1,
        });
        let mut fetch = joint_view("fetch", [0.4, 100.0], 5.0, 10.0);
        fetch.known = Some(f.model());
        let a = p.decide(&[idx.clone(), fetch.clone()]);
        assert!(
            a.iter().all(|a| a.reason == AllocationReason::TradeOff),
            "{a:?}"
        );
        let joint_penalty = |a: &[Allocation]| {
            let idx_tau = 0.05 / a[0].share[0];
            let fetch_tau = f.model().eval(&a[1].share);
            (idx_tau - 1.0 / 22.0).max(0.0) + (fetch_tau - 1.0 / 11.0).max(0.0)
        };
        // Clarabel's optimum of the same problem.
        let truth = crate::pacora::socp::solve(&Problem {
            cells: vec![
                CellDemand {
                    model: ResponseModel {
                        tau0: 0.0,
                        w: vec![0.05, 0.0, 0.0],
                        resources: 2,
                    },
                    deadline: 1.0 / 22.0,
                    slope: 1.0,
                },
                CellDemand {
                    model: f.model(),
                    deadline: 1.0 / 11.0,
                    slope: 1.0,
                },
            ],
            capacity: vec![0.8, 200.0],
        })
        .unwrap();
        let got = joint_penalty(&a);
        assert!(
            (got - truth.penalty).abs() <= 1e-4 * truth.penalty.max(1.0),
            "{got} vs {}",
            truth.penalty
        );
        assert!(
            (a[0].share[0] + a[1].share[0]) <= 0.8 + 1e-9,
            "harts overbooked: {a:?}"
        );
        assert!(a[1].share[1] <= 200.0 + 1e-9, "{a:?}");
        let alone = least_point(&f.model(), &fetch, 0.1, &[0.8, 200.0]).unwrap();
        assert!(a[1].share[1] > 1.2 * alone[1], "{a:?} vs {alone:?}");
        // Solved pool by pool instead (fetch's link fixed at its least-reserving share, the
        // harts split on their own), the total penalty is higher.
        let separate = crate::pacora::socp::solve(&Problem {
            cells: vec![
                CellDemand {
                    model: ResponseModel {
                        tau0: 0.0,
                        w: vec![0.05],
                        resources: 1,
                    },
                    deadline: 1.0 / 22.0,
                    slope: 1.0,
                },
                CellDemand {
                    model: ResponseModel {
                        tau0: f.w_n / alone[1],
                        w: vec![f.w_c],
                        resources: 1,
                    },
                    deadline: 1.0 / 11.0,
                    slope: 1.0,
                },
            ],
            capacity: vec![0.8],
        })
        .unwrap();
        assert!(
            got < 0.9 * separate.penalty,
            "{got} vs {}",
            separate.penalty
        );
    }

    #[test]
    fn a_view_whose_fields_disagree_is_answered_bad_view_and_changes_nothing() {
        let mut p = two_pools(2.0, 200.0);
        let mut v = joint_view("fetch", [0.5, 10.0], 5.0, 10.0);
        v.floor.pop();
        let on_a_missing_pool = CellView::single("x", 2, 0.5, 5.0, 10.0, 0.05, 1.9, 1.0);
        let ok = view("ok", 0.5, 5.0, 10.0, 1.0);
        let a = p.decide(&[v.clone(), on_a_missing_pool, ok]);
        assert_eq!(
            (a[0].reason, a[1].reason),
            (AllocationReason::BadView, AllocationReason::BadView)
        );
        assert_eq!(a[0].share, v.share);
        assert_eq!(a[2].reason, AllocationReason::Learning);
        assert!(p.model("fetch").is_none());
    }

    #[test]
    fn an_event_in_one_pool_solves_only_the_pools_joined_to_it() {
        let known = |w: f64| ResponseModel {
            tau0: 0.0,
            w: vec![w],
            resources: 1,
        };
        let mut p = two_pools(2.0, 200.0);
        let mut cpu = CellView::single("enc", 0, 0.5, 30.0, 30.0, 0.05, 1.9, 1.0);
        cpu.known = Some(known(0.01));
        let mut flow = CellView::single("enc.net", 1, 5.0, 30.0, 30.0, 1.0, 200.0, 1.0);
        flow.known = Some(known(0.1));
        let a = p.decide(&[cpu.clone(), flow.clone()]);
        assert!(
            a.iter().all(|a| a.reason == AllocationReason::MeetsTarget),
            "{a:?}"
        );
        cpu.share = a[0].share.clone();
        flow.share = a[1].share.clone();
        // The flow's demand doubles: the link is solved again, the harts are not.
        flow.known = Some(known(0.2));
        let a = p.decide(&[cpu.clone(), flow.clone()]);
        assert_eq!(
            (a[0].reason, a[1].reason),
            (AllocationReason::NoEvent, AllocationReason::MeetsTarget),
            "{a:?}"
        );
        flow.share = a[1].share.clone();
        // An entry of both pools joins them: a flow's event now solves the harts too.
        let mut fetch = joint_view("fetch", [0.3, 20.0], 5.0, 10.0);
        fetch.known = Some(
            Fetch {
                w_c: 0.02,
                w_n: 8.0,
            }
            .model(),
        );
        let a = p.decide(&[cpu.clone(), flow.clone(), fetch.clone()]);
        assert!(
            a.iter().all(|a| a.reason == AllocationReason::MeetsTarget),
            "{a:?}"
        );
        cpu.share = a[0].share.clone();
        flow.share = a[1].share.clone();
        fetch.share = a[2].share.clone();
        fetch.rate = 10.0;
        assert_eq!(
            p.decide(&[cpu.clone(), flow.clone(), fetch.clone()])[0].reason,
            AllocationReason::NoEvent
        );
        flow.known = Some(known(0.4));
        let a = p.decide(&[cpu, flow, fetch]);
        assert!(
            a.iter().all(|a| a.reason == AllocationReason::MeetsTarget),
            "{a:?}"
        );
    }

    #[test]
    fn an_allocation_far_beyond_the_samples_is_approached_within_the_limits() {
        // Learned at around 1 hart and 20 Mbit/s, the model's least-reserving point is about
        // 0.66 harts and 132 Mbit/s: the flow goes at most to twice its largest sample.
        let f = Fetch {
            w_c: 0.02,
            w_n: 8.0,
        };
        let mut p = two_pools(2.0, 200.0);
        let mut share = [1.0, 20.0];
        let mut last = Vec::new();
        for k in 0..40 {
            let v = joint_view("fetch", share, f.rate(&share, k), 10.0);
            last = p.decide(&[v]);
            if last[0].reason == AllocationReason::Approaching {
                break;
            }
            share = [last[0].share[0], last[0].share[1]];
        }
        assert_eq!(last[0].reason, AllocationReason::Approaching, "{last:?}");
        let most = p.cells["fetch"]
            .samples
            .iter()
            .map(|s| s.alloc[1])
            .fold(0.0, f64::max);
        assert!(last[0].share[1] <= TRUST * most + 1e-9, "{last:?} {most}");
        // Approaching is an event: the next round solves again from the new sample.
        share = [last[0].share[0], last[0].share[1]];
        let v = joint_view("fetch", share, f.rate(&share, 41), 10.0);
        let next = p.decide(&[v]);
        assert_ne!(next[0].reason, AllocationReason::NoEvent, "{next:?}");
        // A ceiling far below the samples holds: the step never leaves the limits.
        let mut low = joint_view("fetch", share, f.rate(&share, 42), 10.0);
        low.ceiling = vec![0.1, 200.0];
        let a = p.decide(&[low]);
        assert!(a[0].share[0] <= 0.1 + 1e-12, "{a:?}");
    }
}
