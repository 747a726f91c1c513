//! Requests and responses.

use serde::{Deserialize, Serialize};
use std::time::Duration;
use tess_core::quota::{Quota, Usage};
use tess_core::spec::{CellSpec, HartRequest, Policy};
use tess_sched::HartSet;

/// A call to the daemon.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Request {
    /// First message on a connection: the protocol version.
    Hello {
        /// [`crate::PROTOCOL_VERSION`].
        version: u32,
    },
    /// Daemon and machine status.
    Status,
    /// The caller's cells (root sees all).
    ListCells,
    /// One cell in detail.
    ShowCell {
        /// Cell name.
        name: String,
    },
    /// Creates a cell; fails if the name exists.
    CreateCell {
        /// The cell.
        spec: CellSpec,
    },
    /// Changes an existing cell (the fields given replace the current ones).
    UpdateCell {
        /// Cell name.
        name: String,
        /// What changes.
        update: CellUpdate,
    },
    /// Pins or unpins a cell.
    SetPinned {
        /// Cell name.
        name: String,
        /// New pin state.
        pinned: bool,
    },
    /// Deletes a cell; its processes move to the system group.
    DeleteCell {
        /// Cell name.
        name: String,
    },
    /// Applies a manifest as one transaction.
    Apply {
        /// Cells to create or update.
        cells: Vec<CellSpec>,
        /// Cells to delete.
        delete: Vec<String>,
        /// Also delete the caller's cells not named in `cells` (never pinned or ephemeral ones).
        prune: bool,
        /// Validate and place, but change nothing.
        dry_run: bool,
    },
    /// Moves the calling process (identified by `SO_PEERCRED`) into a cell.
    Attach {
        /// Cell name.
        cell: String,
    },
    /// Creates an ephemeral event-triggered cell for the calling process and moves it in; the
    /// cell is removed when that process exits (`tess run --reserve`).
    Reserve {
        /// Budget per period.
        #[serde(with = "tess_core::units::serde_ns")]
        budget: Duration,
        /// Period.
        #[serde(with = "tess_core::units::serde_ns")]
        period: Duration,
        /// Harts (default: one, placed by the daemon).
        harts: Option<HartRequest>,
    },
    /// Sets (or with `None` removes) a user's quota. Root only.
    SetQuota {
        /// User id.
        uid: u32,
        /// The quota.
        quota: Option<Quota>,
    },
    /// Lists quotas and usage (root: everyone; others: themselves).
    ListQuotas,
    /// Registers the calling process as the service `name` (nameserver). On success the
    /// connection becomes the service's: tessd pushes one [`crate::ns::Push::Incoming`] frame,
    /// followed by a channel end, per client; the service sends nothing more on it, and the name
    /// is freed when the connection closes (the service exits).
    Register {
        /// Service name, e.g. `net`, `console`, `audio/engine`.
        name: String,
        /// Who may connect.
        access: crate::ns::Access,
        /// Shape of each client's channel.
        channel: crate::ns::ChannelShape,
    },
    /// Asks for a channel to service `name`. On success the reply is followed by the client's
    /// channel end on this connection.
    Connect {
        /// Service name.
        name: String,
    },
    /// Lists registered services.
    ListNames,
    /// A cell runtime asks for its cell's control channel: tessd sends adaptation events on it
    /// ([`crate::runtime`]). The reply ([`Body::Cell`]) is followed by the channel end.
    RuntimeAttach {
        /// The cell the caller runs in.
        cell: String,
    },
}

/// Fields of a cell that `tess cell resize` / `update` may change; `None` keeps the current value.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CellUpdate {
    /// New hart request.
    pub harts: Option<HartRequest>,
    /// New policy kind with all its parameters (replaces the policy).
    pub policy: Option<Policy>,
    /// New period (time- or event-triggered).
    #[serde(with = "tess_core::units::serde_opt_ns", default)]
    pub period: Option<Duration>,
    /// New active time (time-triggered).
    #[serde(with = "tess_core::units::serde_opt_ns", default)]
    pub active: Option<Duration>,
    /// New window offset (time-triggered).
    #[serde(with = "tess_core::units::serde_opt_ns", default)]
    pub offset: Option<Duration>,
    /// New budget (event-triggered).
    #[serde(with = "tess_core::units::serde_opt_ns", default)]
    pub budget: Option<Duration>,
    /// New weight (best-effort).
    pub weight: Option<u32>,
    /// New memory limit, or its removal.
    pub memory_max: Option<LimitChange>,
    /// New task limit, or its removal.
    pub pids_max: Option<LimitChange>,
}

/// A change to an optional limit. (An `Option<Option<u64>>` would not survive JSON: `Some(None)`
/// and `None` both become `null`.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LimitChange {
    /// No limit any more.
    Remove,
    /// This limit.
    Set(u64),
}

impl LimitChange {
    /// The limit after the change.
    pub fn value(self) -> Option<u64> {
        match self {
            LimitChange::Remove => None,
            LimitChange::Set(v) => Some(v),
        }
    }
}

impl CellUpdate {
    /// Whether nothing would change.
    pub fn is_empty(&self) -> bool {
        *self == CellUpdate::default()
    }
}

/// The daemon's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "kebab-case")]
pub enum Response {
    /// Success.
    Ok {
        /// Payload.
        body: Body,
    },
    /// Failure.
    Error {
        /// Category (decides the CLI's exit status).
        kind: ErrorKind,
        /// Human-readable message.
        message: String,
    },
}

/// Successful payloads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum Body {
    /// Nothing to report.
    Done,
    /// Greeting.
    Hello {
        /// Daemon version.
        daemon: String,
        /// Caller as the daemon sees it.
        uid: u32,
    },
    /// Status.
    Status(Box<StatusInfo>),
    /// Cells.
    Cells {
        /// The cells.
        cells: Vec<CellInfo>,
    },
    /// One cell.
    Cell(Box<CellInfo>),
    /// Result of a change.
    Applied(ApplyResult),
    /// Quotas.
    Quotas {
        /// Per user.
        quotas: Vec<QuotaInfo>,
    },
    /// A service name was registered.
    Registered {
        /// The name.
        name: String,
    },
    /// A channel to a service follows this reply.
    Connected {
        /// The service.
        service: crate::ns::NameInfo,
    },
    /// Registered services.
    Names {
        /// Services.
        names: Vec<crate::ns::NameInfo>,
    },
}

/// Error categories, each with its CLI exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorKind {
    /// Malformed request or input (exit 2).
    Usage,
    /// Cannot be guaranteed (exit 3).
    Admission,
    /// Not allowed for this caller (exit 4).
    Permission,
    /// No such cell (exit 5).
    NotFound,
    /// Name already taken (exit 6).
    Exists,
    /// The kernel refused to enforce an admitted change; it was rolled back (exit 8).
    Kernel,
    /// Anything else (exit 1).
    Internal,
}

impl ErrorKind {
    /// Exit status of the CLI for this error.
    pub fn exit_code(self) -> i32 {
        match self {
            ErrorKind::Internal => 1,
            ErrorKind::Usage => 2,
            ErrorKind::Admission => 3,
            ErrorKind::Permission => 4,
            ErrorKind::NotFound => 5,
            ErrorKind::Exists => 6,
            ErrorKind::Kernel => 8,
        }
    }
}

/// Exit status when the daemon cannot be reached.
pub const EXIT_UNREACHABLE: i32 = 7;

/// A cell as reported.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellInfo {
    /// Name.
    pub name: String,
    /// Owner uid.
    pub owner: u32,
    /// Policy.
    pub policy: Policy,
    /// What was asked for.
    pub request: HartRequest,
    /// What was given.
    pub harts: HartSet,
    /// Window offset in effect (time-triggered).
    #[serde(with = "tess_core::units::serde_opt_ns", default)]
    pub window_offset: Option<Duration>,
    /// Memory limit.
    pub memory_max: Option<u64>,
    /// Task limit.
    pub pids_max: Option<u64>,
    /// Pinned.
    pub pinned: bool,
    /// Removed when this process exits.
    pub ephemeral_pid: Option<i32>,
    /// Fraction of each of its harts.
    pub utilization: f64,
    /// Processes in the cell (not counting idle spinners).
    pub processes: Vec<i32>,
    /// tessd's idle spinners in the cell (dedicated cells with `idle = spin`), one per hart.
    #[serde(default)]
    pub idle_spinners: Vec<i32>,
    /// Threads and how they are scheduled.
    pub threads: Vec<ThreadInfo>,
    /// Cgroup directory (cpuset).
    pub cgroup: String,
    /// Creation time (ms since the epoch).
    pub created_ms: u64,
    /// The floor and ceiling its manifest gives the broker.
    #[serde(
        default,
        skip_serializing_if = "tess_core::spec::BrokerLimits::is_empty"
    )]
    pub broker: tess_core::spec::BrokerLimits,
}

/// A thread in a cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThreadInfo {
    /// Thread id.
    pub tid: i32,
    /// Harts it may run on.
    pub affinity: HartSet,
    /// Scheduling, e.g. `SCHED_DEADLINE 1ms/10ms/10ms`.
    pub sched: String,
}

/// Result of a transaction.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ApplyResult {
    /// Cells created.
    pub created: Vec<String>,
    /// Cells changed.
    pub updated: Vec<String>,
    /// Cells deleted.
    pub deleted: Vec<String>,
    /// Cells already as asked.
    pub unchanged: Vec<String>,
    /// Whether this was a dry run.
    pub dry_run: bool,
    /// Where the cells are now (for the ones named in the request).
    pub cells: Vec<CellInfo>,
    /// How long each step took inside the daemon.
    pub timing: Timing,
}

/// Daemon-side timing of a transaction, in microseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    /// Admission control and placement.
    pub admit_us: f64,
    /// Kernel enforcement (cgroups, scheduling attributes, IRQs).
    pub enforce_us: f64,
    /// Durable commit of the new state.
    pub commit_us: f64,
    /// From request decoded to reply ready.
    pub total_us: f64,
}

/// Quota of one user with current usage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuotaInfo {
    /// User.
    pub uid: u32,
    /// Quota (`None`: the default, which allows nothing).
    pub quota: Option<Quota>,
    /// Usage.
    pub usage: Option<UsageInfo>,
}

/// Serializable mirror of [`Usage`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UsageInfo {
    /// Cells.
    pub cells: u32,
    /// Harts.
    pub harts: u32,
    /// Dedicated harts.
    pub dedicated_harts: u32,
    /// Reserved hart-equivalents.
    pub reserved: f64,
    /// Memory limits summed.
    pub memory: u64,
}

impl From<Usage> for UsageInfo {
    fn from(u: Usage) -> Self {
        UsageInfo {
            cells: u.cells,
            harts: u.harts,
            dedicated_harts: u.dedicated_harts,
            reserved: u.reserved,
            memory: u.memory,
        }
    }
}

/// Daemon status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusInfo {
    /// Daemon version.
    pub version: String,
    /// Daemon pid.
    pub pid: i32,
    /// Seconds since start.
    pub uptime_s: f64,
    /// cgroup backend description.
    pub cgroup: String,
    /// Online harts.
    pub harts: HartSet,
    /// Harts tess manages.
    pub managed: HartSet,
    /// Dedicated harts.
    pub dedicated: HartSet,
    /// Harts with reservations.
    pub reserved: HartSet,
    /// Where tasks outside cells run.
    pub system: HartSet,
    /// Utilization limit per hart.
    pub utilization_limit: f64,
    /// Kernel's `SCHED_DEADLINE` limit per hart.
    pub kernel_reservation_limit: f64,
    /// Per-hart load: (hart, utilization, cells).
    pub load: Vec<HartLoadInfo>,
    /// Number of cells.
    pub cells: usize,
    /// IRQs steered off dedicated harts.
    pub irqs_steered: usize,
    /// Problems tess cannot fix itself (other software's cgroups in the way).
    #[serde(default)]
    pub warnings: Vec<String>,
    /// State directory.
    pub state_dir: String,
}

/// Load of one hart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HartLoadInfo {
    /// Hart.
    pub hart: usize,
    /// Claimed fraction.
    pub utilization: f64,
    /// Dedicated owner.
    pub dedicated_to: Option<String>,
    /// Cells and shares.
    pub cells: Vec<(String, f64)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_as_json() {
        let reqs = vec![
            Request::Hello { version: 1 },
            Request::Reserve {
                budget: Duration::from_millis(2),
                period: Duration::from_millis(10),
                harts: None,
            },
            Request::UpdateCell {
                name: "a".into(),
                update: CellUpdate {
                    memory_max: Some(LimitChange::Remove),
                    pids_max: Some(LimitChange::Set(8)),
                    ..Default::default()
                },
            },
        ];
        for r in reqs {
            let s = serde_json::to_string(&r).unwrap();
            let back: Request = serde_json::from_str(&s).unwrap();
            assert_eq!(back, r, "{s}");
        }
    }

    #[test]
    fn unknown_ops_are_rejected() {
        assert!(serde_json::from_str::<Request>(r#"{"op":"format-disk"}"#).is_err());
    }

    #[test]
    fn exit_codes_are_distinct() {
        use ErrorKind::*;
        let kinds = [
            Usage, Admission, Permission, NotFound, Exists, Kernel, Internal,
        ];
        let mut codes: Vec<i32> = kinds.iter().map(|k| k.exit_code()).collect();
        codes.push(EXIT_UNREACHABLE);
        codes.sort();
        codes.dedup();
        assert_eq!(codes.len(), kinds.len() + 1);
        assert_eq!(Admission.exit_code(), 3);
        assert_eq!(Usage.exit_code(), 2);
    }
}
