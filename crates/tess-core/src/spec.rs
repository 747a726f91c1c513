//! What a user asks for: a cell's policy, harts, and limits.
//!
//! The four time-multiplexing policies of Tessellation (seed 000 section 2.1, seed 004 section
//! 3.1), and what each costs one hart in the EDF admission test ([`Policy::server`]):
//!
//! | policy          | parameters              | per-hart server (C, D, T)         |
//! |-----------------|-------------------------|-----------------------------------|
//! | dedicated       | -                       | the whole hart                    |
//! | time-triggered  | period P, active A      | (A, A, P): A at the window start  |
//! | event-triggered | period P, budget B      | (B, P, P): a CBS of B every P     |
//! | best-effort     | weight                  | (5 ms, 100 ms, 100 ms) minimum    |
//!
//! Worked example: a time-triggered cell with `period = 10ms, active = 2ms` and an
//! event-triggered cell with `period = 20ms, budget = 5ms` on the same hart use
//! 2/10 + 5/20 = 0.45 of it; a best-effort cell beside them adds 5/100 = 0.05.

use crate::units::{format_duration, serde_ns, serde_opt_ns};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;
use tess_sched::HartSet;

/// Shortest period tess accepts (the kernel's default `sched_deadline_period_min_us`).
pub const MIN_PERIOD: Duration = Duration::from_micros(100);
/// Longest period tess accepts (the kernel allows 4 s; a window a second long is already coarse).
pub const MAX_PERIOD: Duration = Duration::from_secs(1);
/// Smallest budget or active time: below this the cost of switching dominates.
pub const MIN_BUDGET: Duration = Duration::from_micros(50);
/// The minimum a best-effort cell always gets, so it always progresses (seed 004: "a fixed
/// small reservation (e.g. 2% with active_time = 5 ms and period = 100 ms)"; the issue: 5 ms per
/// 100 ms).
pub const BEST_EFFORT_MIN_BUDGET: Duration = Duration::from_millis(5);
/// Period of the best-effort minimum.
pub const BEST_EFFORT_MIN_PERIOD: Duration = Duration::from_millis(100);
/// Default CFS weight of a best-effort cell (the kernel's default `cpu.weight`).
pub const DEFAULT_WEIGHT: u32 = 100;
/// Smallest memory limit accepted (smaller limits OOM-kill any real program at once).
pub const MIN_MEMORY: u64 = 1 << 20;

/// A cell's time-multiplexing policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Policy {
    /// Non-multiplexed: the harts belong to this cell alone.
    Dedicated,
    /// Active in the same periodic window `[k*period + offset, k*period + offset + active)` on
    /// all its harts.
    TimeTriggered {
        /// Window period.
        #[serde(with = "serde_ns")]
        period: Duration,
        /// Window length.
        #[serde(with = "serde_ns")]
        active: Duration,
        /// Window start within the period; `None` lets the daemon choose one that does not
        /// collide with other windows.
        #[serde(with = "serde_opt_ns", default)]
        offset: Option<Duration>,
    },
    /// A constant-bandwidth server of `budget` every `period` on each of its harts, usable
    /// whenever the cell has work.
    EventTriggered {
        /// Replenishment period.
        #[serde(with = "serde_ns")]
        period: Duration,
        /// Budget per period.
        #[serde(with = "serde_ns")]
        budget: Duration,
    },
    /// No time guarantee beyond a small minimum; shares what is left by weight.
    BestEffort {
        /// Relative CFS weight (1..=10000, default 100).
        #[serde(default = "default_weight")]
        weight: u32,
    },
}

fn default_weight() -> u32 {
    DEFAULT_WEIGHT
}

/// A sporadic server `(C, D, T)`: `budget` of CPU within `deadline` of each release, releases
/// at least `period` apart. The unit of the EDF demand-bound test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Server {
    /// C: execution budget.
    pub budget: Duration,
    /// D: relative deadline.
    pub deadline: Duration,
    /// T: period.
    pub period: Duration,
}

impl Server {
    /// C / T.
    pub fn utilization(&self) -> f64 {
        self.budget.as_secs_f64() / self.period.as_secs_f64()
    }
}

impl Policy {
    /// Kebab-case name as used on the command line.
    pub fn name(&self) -> &'static str {
        match self {
            Policy::Dedicated => "dedicated",
            Policy::TimeTriggered { .. } => "time-triggered",
            Policy::EventTriggered { .. } => "event-triggered",
            Policy::BestEffort { .. } => "best-effort",
        }
    }

    /// The EDF server this policy places on each of its harts; `None` for dedicated (it takes
    /// the whole hart).
    pub fn server(&self) -> Option<Server> {
        match *self {
            Policy::Dedicated => None,
            Policy::TimeTriggered { period, active, .. } => Some(Server {
                budget: active,
                deadline: active,
                period,
            }),
            Policy::EventTriggered { period, budget } => Some(Server {
                budget,
                deadline: period,
                period,
            }),
            Policy::BestEffort { .. } => Some(Server {
                budget: BEST_EFFORT_MIN_BUDGET,
                deadline: BEST_EFFORT_MIN_PERIOD,
                period: BEST_EFFORT_MIN_PERIOD,
            }),
        }
    }

    /// Fraction of each hart this policy claims (1.0 for dedicated).
    pub fn utilization(&self) -> f64 {
        self.server().map_or(1.0, |s| s.utilization())
    }

    /// Whether this is an event-triggered reservation (a sporadic server).
    pub fn is_event_triggered(&self) -> bool {
        matches!(self, Policy::EventTriggered { .. })
    }

    /// Whether the kernel enforces a reservation for this policy (`SCHED_DEADLINE`, or RT group
    /// bandwidth for event-triggered cells on cgroup v1).
    pub fn is_reservation(&self) -> bool {
        matches!(
            self,
            Policy::TimeTriggered { .. } | Policy::EventTriggered { .. }
        )
    }

    /// Whether the policy owns its harts outright.
    pub fn is_dedicated(&self) -> bool {
        matches!(self, Policy::Dedicated)
    }

    /// One-line description, e.g. `time-triggered 2ms/10ms`.
    pub fn describe(&self) -> String {
        match self {
            Policy::Dedicated => "dedicated".into(),
            Policy::TimeTriggered {
                period,
                active,
                offset,
            } => {
                let mut s = format!(
                    "time-triggered {}/{}",
                    format_duration(*active),
                    format_duration(*period)
                );
                if let Some(o) = offset {
                    s.push_str(&format!(" @{}", format_duration(*o)));
                }
                s
            }
            Policy::EventTriggered { period, budget } => {
                format!(
                    "event-triggered {}/{}",
                    format_duration(*budget),
                    format_duration(*period)
                )
            }
            Policy::BestEffort { weight } => format!("best-effort weight {weight}"),
        }
    }
}

/// How many harts, or which.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HartRequest {
    /// This many harts, placed by the daemon.
    Count(usize),
    /// Exactly these harts.
    Ids(HartSet),
}

impl HartRequest {
    /// Number of harts requested.
    pub fn count(&self) -> usize {
        match self {
            HartRequest::Count(n) => *n,
            HartRequest::Ids(s) => s.len(),
        }
    }
}

impl fmt::Display for HartRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HartRequest::Count(n) => write!(f, "{n} hart{}", if *n == 1 { "" } else { "s" }),
            HartRequest::Ids(s) => write!(f, "harts {s}"),
        }
    }
}

/// What a cell's harts do when nothing wants them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IdleMode {
    /// Stay busy: a `SCHED_IDLE` spinner per hart takes only time nothing in the cell wants, so
    /// the hart never enters an idle state and a waking thread runs at once (on a virtual
    /// machine an idle vCPU takes about 55 us longer to take a timer interrupt); the cell's
    /// threads also get a 1 ns timer slack, as real-time threads have. Tessellation's runtimes
    /// spin on their harts this way. The price is the whole idle time of every such hart: an
    /// idle machine burns one hart of power per dedicated cell (docs/architecture.md, "Idle
    /// harts: spin or halt", has the measured trade-off). On harts a cell shares, the spinner
    /// belongs to no cell: it runs in the system group, so it takes time only from nothing
    /// (`SCHED_IDLE`, nice 19).
    Spin,
    /// Let the harts idle (the default: saves power, a laptop's battery and a cloud bill;
    /// wake-ups from an idle state are slower, on a virtual machine by tens of microseconds).
    Halt,
}

/// Everything a user specifies about a cell.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CellSpec {
    /// Unique name: lowercase letters, digits, `-`, `_`, `.`; starts with a letter or digit.
    pub name: String,
    /// Time-multiplexing policy.
    pub policy: Policy,
    /// Harts: a count or explicit ids.
    pub harts: HartRequest,
    /// Memory limit in bytes.
    #[serde(default)]
    pub memory_max: Option<u64>,
    /// Limit on the number of tasks (processes and threads).
    #[serde(default)]
    pub pids_max: Option<u64>,
    /// The user fixed this allocation; no policy may change it (seed 000 section 2.3).
    #[serde(default)]
    pub pinned: bool,
    /// What idle harts do (`None`: [`IdleMode::Halt`], see [`CellSpec::idle_mode`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle: Option<IdleMode>,
    /// The floor and ceiling the broker (`tess-broker`) keeps this cell's share within.
    #[serde(default, skip_serializing_if = "BrokerLimits::is_empty")]
    pub broker: BrokerLimits,
}

/// A number of harts, exact to a millionth (so that specs compare exactly), written and read
/// as a number of harts (`0.25`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Harts(u64);

impl Harts {
    /// Most harts a share may name.
    pub const MAX: f64 = 4096.0;

    /// `harts` rounded to a millionth; `None` unless it is a number in `0..=MAX`.
    pub fn new(harts: f64) -> Option<Harts> {
        (harts.is_finite() && (0.0..=Harts::MAX).contains(&harts))
            .then(|| Harts((harts * 1e6).round() as u64))
    }

    /// The number of harts.
    pub fn get(self) -> f64 {
        self.0 as f64 / 1e6
    }
}

impl Serialize for Harts {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(self.get())
    }
}

impl<'de> Deserialize<'de> for Harts {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Harts, D::Error> {
        let x = f64::deserialize(d)?;
        Harts::new(x).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "{x} harts: a share is a number from 0 to {}",
                Harts::MAX
            ))
        })
    }
}

/// What the broker may do with a cell's share (seed 004 section 5.1: a floor and a ceiling per
/// cell), declared with the cell (`broker-floor`, `broker-ceiling` in a manifest). The
/// broker's own configuration overrides them field by field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct BrokerLimits {
    /// The least share it is ever given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floor: Option<Harts>,
    /// The most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ceiling: Option<Harts>,
}

impl BrokerLimits {
    /// Whether neither is set.
    pub fn is_empty(&self) -> bool {
        self.floor.is_none() && self.ceiling.is_none()
    }
}

/// A spec that is malformed in itself, before any question of resources.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum SpecError {
    /// Bad cell name.
    #[error("invalid cell name {0:?}: use 1-64 characters from a-z, 0-9, '-', '_', '.', starting with a letter or digit")]
    Name(String),
    /// A parameter is out of range.
    #[error("cell {cell}: {what}")]
    Parameter {
        /// Cell name.
        cell: String,
        /// What is wrong, with the values.
        what: String,
    },
}

/// Checks a cell name.
pub fn validate_name(name: &str) -> Result<(), SpecError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(SpecError::Name(name.to_string()))
    }
}

impl CellSpec {
    /// Checks the spec's own consistency (ranges, active < period, ...).
    pub fn validate(&self) -> Result<(), SpecError> {
        validate_name(&self.name)?;
        let bad = |what: String| {
            Err(SpecError::Parameter {
                cell: self.name.clone(),
                what,
            })
        };
        let fd = format_duration;
        let check_period = |period: Duration| -> Result<(), SpecError> {
            if period < MIN_PERIOD || period > MAX_PERIOD {
                return Err(SpecError::Parameter {
                    cell: self.name.clone(),
                    what: format!(
                        "period {} is outside {}..={}",
                        fd(period),
                        fd(MIN_PERIOD),
                        fd(MAX_PERIOD)
                    ),
                });
            }
            Ok(())
        };
        match &self.policy {
            Policy::Dedicated => {}
            Policy::TimeTriggered {
                period,
                active,
                offset,
            } => {
                check_period(*period)?;
                if *active < MIN_BUDGET {
                    return bad(format!(
                        "active time {} is below {}",
                        fd(*active),
                        fd(MIN_BUDGET)
                    ));
                }
                if active >= period {
                    return bad(format!(
                        "active time {} must be shorter than the period {}",
                        fd(*active),
                        fd(*period)
                    ));
                }
                if let Some(o) = offset {
                    if o >= period {
                        return bad(format!(
                            "window offset {} must be shorter than the period {}",
                            fd(*o),
                            fd(*period)
                        ));
                    }
                }
            }
            Policy::EventTriggered { period, budget } => {
                check_period(*period)?;
                if *budget < MIN_BUDGET {
                    return bad(format!(
                        "budget {} is below {}",
                        fd(*budget),
                        fd(MIN_BUDGET)
                    ));
                }
                if budget > period {
                    return bad(format!(
                        "budget {} exceeds the period {}",
                        fd(*budget),
                        fd(*period)
                    ));
                }
            }
            Policy::BestEffort { weight } => {
                if !(1..=10_000).contains(weight) {
                    return bad(format!("weight {weight} is outside 1..=10000"));
                }
            }
        }
        match &self.harts {
            HartRequest::Count(0) => return bad("needs at least one hart".into()),
            HartRequest::Ids(s) if s.is_empty() => return bad("the hart list is empty".into()),
            _ => {}
        }
        if let Some(m) = self.memory_max {
            if m < MIN_MEMORY {
                return bad(format!("memory limit {m} bytes is below 1M"));
            }
        }
        if self.pids_max == Some(0) {
            return bad("pids limit must be at least 1".into());
        }
        if let (Some(f), Some(c)) = (self.broker.floor, self.broker.ceiling) {
            if f > c {
                return bad(format!(
                    "broker floor {} harts is above the broker ceiling {} harts",
                    f.get(),
                    c.get()
                ));
            }
        }
        if self.idle == Some(IdleMode::Spin) && matches!(self.policy, Policy::BestEffort { .. }) {
            return bad(
                "idle = spin applies to dedicated, time-triggered and event-triggered cells (a best-effort cell has no wake-up to speed up)"
                    .into(),
            );
        }
        Ok(())
    }

    /// Whether two specs ask for the same allocation (ignoring the pin).
    pub fn same_allocation(&self, other: &CellSpec) -> bool {
        self.policy == other.policy
            && self.harts == other.harts
            && self.memory_max == other.memory_max
            && self.pids_max == other.pids_max
            && self.idle_mode() == other.idle_mode()
    }

    /// The idle mode in effect: what the cell asks for, else [`IdleMode::Halt`]. Spinning costs
    /// a whole hart per hart of the cell while it waits, so it is a choice a user makes for a
    /// cell whose wake-up latency matters more than that (a time-triggered window starts with
    /// a kernel wake-up on every hart, and a halted vCPU wakes late by a different amount on
    /// each: the gang skew).
    pub fn idle_mode(&self) -> IdleMode {
        self.idle.unwrap_or(IdleMode::Halt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(x: u64) -> Duration {
        Duration::from_millis(x)
    }

    fn spec(policy: Policy) -> CellSpec {
        CellSpec {
            name: "a".into(),
            policy,
            harts: HartRequest::Count(1),
            memory_max: None,
            pids_max: None,
            pinned: false,
            idle: None,
            broker: Default::default(),
        }
    }

    #[test]
    fn servers_follow_the_policy_table() {
        let tt = Policy::TimeTriggered {
            period: ms(10),
            active: ms(2),
            offset: None,
        };
        assert_eq!(tt.server().unwrap().deadline, ms(2));
        assert!((tt.utilization() - 0.2).abs() < 1e-12);
        let et = Policy::EventTriggered {
            period: ms(20),
            budget: ms(5),
        };
        assert_eq!(et.server().unwrap().deadline, ms(20));
        assert!((Policy::BestEffort { weight: 100 }.utilization() - 0.05).abs() < 1e-12);
        assert_eq!(Policy::Dedicated.utilization(), 1.0);
    }

    #[test]
    fn names() {
        for good in ["a", "audio", "synth-1", "net.svc", "x_y"] {
            assert!(validate_name(good).is_ok(), "{good}");
        }
        for bad in ["", "-a", "A", "a/b", "..", ".a", "a b", &"x".repeat(65)] {
            assert!(validate_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn rejects_inconsistent_parameters() {
        let bad = [
            Policy::TimeTriggered {
                period: ms(10),
                active: ms(10),
                offset: None,
            },
            Policy::TimeTriggered {
                period: ms(10),
                active: ms(2),
                offset: Some(ms(10)),
            },
            Policy::TimeTriggered {
                period: Duration::from_micros(50),
                active: ms(0),
                offset: None,
            },
            Policy::EventTriggered {
                period: ms(10),
                budget: ms(11),
            },
            Policy::EventTriggered {
                period: ms(2000),
                budget: ms(1),
            },
            Policy::EventTriggered {
                period: ms(10),
                budget: Duration::from_micros(10),
            },
            Policy::BestEffort { weight: 0 },
        ];
        for p in bad {
            assert!(
                spec(p.clone()).validate().is_err(),
                "{p:?} should be refused"
            );
        }
        assert!(spec(Policy::EventTriggered {
            period: ms(10),
            budget: ms(2)
        })
        .validate()
        .is_ok());
        let mut s = spec(Policy::Dedicated);
        s.harts = HartRequest::Count(0);
        assert!(s.validate().is_err());
        s.harts = HartRequest::Ids(HartSet::new());
        assert!(s.validate().is_err());
    }

    #[test]
    fn cells_halt_unless_asked_to_spin() {
        assert_eq!(spec(Policy::Dedicated).idle_mode(), IdleMode::Halt);
        let mut s = spec(Policy::Dedicated);
        s.idle = Some(IdleMode::Spin);
        assert_eq!(s.idle_mode(), IdleMode::Spin);
        assert!(!s.same_allocation(&spec(Policy::Dedicated)));
        let mut e = spec(Policy::EventTriggered {
            period: ms(10),
            budget: ms(2),
        });
        assert_eq!(e.idle_mode(), IdleMode::Halt);
        e.idle = Some(IdleMode::Spin);
        assert!(e.validate().is_ok());
        assert_eq!(e.idle_mode(), IdleMode::Spin);
        let t = spec(Policy::TimeTriggered {
            period: ms(10),
            active: ms(2),
            offset: None,
        });
        assert_eq!(t.idle_mode(), IdleMode::Halt);
        let mut b = spec(Policy::BestEffort { weight: 100 });
        assert_eq!(b.idle_mode(), IdleMode::Halt);
        b.idle = Some(IdleMode::Spin);
        assert!(b.validate().is_err());
    }

    #[test]
    fn json_round_trip() {
        let s = spec(Policy::TimeTriggered {
            period: ms(10),
            active: ms(2),
            offset: Some(ms(3)),
        });
        let text = serde_json::to_string(&s).unwrap();
        let back: CellSpec = serde_json::from_str(&text).unwrap();
        assert_eq!(back, s);
        assert!(text.contains("\"kind\":\"time-triggered\""));
    }
}
