//! `tess cell ...`

use super::{call, usage};
use crate::output;
use clap::{Args, Subcommand, ValueEnum};
use std::time::Duration;
use tess_core::spec::{CellSpec, HartRequest, IdleMode, Policy, DEFAULT_WEIGHT};
use tess_core::units::{parse_bytes, parse_duration};
use tess_proto::{Body, CellUpdate, LimitChange, Request};
use tess_sched::HartSet;

/// Cell subcommands.
#[derive(Subcommand, Debug)]
pub enum CellCmd {
    /// Create a cell.
    #[command(
        after_help = "Examples:\n  tess cell create synth --policy dedicated --hart-ids 1 --pinned\n  tess cell create video --policy time-triggered --period 33ms --active 4ms\n  tess cell create ctl --policy event-triggered --period 10ms --budget 2ms --harts 1\n  tess cell create batch --policy best-effort --harts 2 --memory 2G"
    )]
    Create(CreateArgs),
    /// List cells (yours; root sees all).
    List(JsonArg),
    /// Show one cell: policy, harts, processes and how each thread is scheduled.
    Show(NameJson),
    /// Change a cell's harts, timing or limits (one transaction; refused if pinned).
    #[command(alias = "update")]
    Resize(ResizeArgs),
    /// Delete cells; their processes move to the system's harts and keep running.
    Delete(DeleteArgs),
    /// Pin a cell: its allocation is fixed and no policy may change it.
    Pin(NameJson),
    /// Unpin a cell.
    Unpin(NameJson),
}

/// `--json`.
#[derive(Args, Debug)]
pub struct JsonArg {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// A cell name and `--json`.
#[derive(Args, Debug)]
pub struct NameJson {
    /// Cell name.
    pub name: String,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Policies on the command line.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyArg {
    /// The harts belong to this cell alone.
    Dedicated,
    /// Active in the same periodic window (--period, --active) on all its harts.
    TimeTriggered,
    /// A CPU budget (--budget) every --period on each of its harts.
    EventTriggered,
    /// No guarantee beyond 5 ms per 100 ms; shares what is left by --weight.
    BestEffort,
}

/// Placement and limits shared by create and resize.
#[derive(Args, Debug, Default)]
pub struct Shape {
    /// Number of harts, placed by the daemon.
    #[arg(long, value_name = "N", conflicts_with = "hart_ids")]
    pub harts: Option<usize>,
    /// Exactly these harts, e.g. 1 or 2-3 or 1,3.
    #[arg(long, value_name = "LIST")]
    pub hart_ids: Option<String>,
    /// Period of the window or budget (e.g. 10ms).
    #[arg(long, value_name = "DURATION")]
    pub period: Option<String>,
    /// Window length of a time-triggered cell (e.g. 2ms).
    #[arg(long, value_name = "DURATION")]
    pub active: Option<String>,
    /// Window start within the period (time-triggered; default: chosen to avoid other windows).
    #[arg(long, value_name = "DURATION")]
    pub offset: Option<String>,
    /// CPU budget per period of an event-triggered cell (e.g. 2ms).
    #[arg(long, value_name = "DURATION")]
    pub budget: Option<String>,
    /// CFS weight of a best-effort cell (1-10000, default 100).
    #[arg(long, value_name = "W")]
    pub weight: Option<u32>,
    /// Memory limit (e.g. 512M, 2G; `none` to remove on resize).
    #[arg(long, value_name = "SIZE")]
    pub memory: Option<String>,
    /// Limit on tasks (processes + threads; `none` to remove on resize).
    #[arg(long, value_name = "N")]
    pub pids: Option<String>,
}

/// `tess cell create`.
#[derive(Args, Debug)]
pub struct CreateArgs {
    /// Cell name (a-z, 0-9, '-', '_', '.').
    pub name: String,
    /// Time-multiplexing policy.
    #[arg(long, value_enum)]
    pub policy: PolicyArg,
    #[command(flatten)]
    pub shape: Shape,
    /// Fix this allocation: no policy may change it.
    #[arg(long)]
    pub pinned: bool,
    /// Dedicated, time-triggered and event-triggered cells: keep idle harts spinning for fast
    /// wake-ups (spin: tens of microseconds sooner on a virtual machine) or let them halt to
    /// save power (halt, the default).
    #[arg(long, value_enum)]
    pub idle: Option<IdleArg>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Idle modes on the command line.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdleArg {
    /// Keep idle harts busy with a lowest-priority spinner; 1 ns timer slack.
    Spin,
    /// Let idle harts halt.
    Halt,
}

impl From<IdleArg> for IdleMode {
    fn from(a: IdleArg) -> IdleMode {
        match a {
            IdleArg::Spin => IdleMode::Spin,
            IdleArg::Halt => IdleMode::Halt,
        }
    }
}

/// `tess cell resize`.
#[derive(Args, Debug)]
pub struct ResizeArgs {
    /// Cell name.
    pub name: String,
    /// Change the policy too (all its parameters must then be given).
    #[arg(long, value_enum)]
    pub policy: Option<PolicyArg>,
    #[command(flatten)]
    pub shape: Shape,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `tess cell delete`.
#[derive(Args, Debug)]
pub struct DeleteArgs {
    /// Cell names.
    #[arg(required = true)]
    pub names: Vec<String>,
}

fn dur(flag: &str, v: &Option<String>) -> anyhow::Result<Option<Duration>> {
    match v {
        None => Ok(None),
        Some(s) => match parse_duration(s) {
            Ok(d) => Ok(Some(d)),
            Err(e) => usage(format!("--{flag}: {e}")),
        },
    }
}

fn harts_of(shape: &Shape) -> anyhow::Result<Option<HartRequest>> {
    if let Some(n) = shape.harts {
        return Ok(Some(HartRequest::Count(n)));
    }
    match &shape.hart_ids {
        None => Ok(None),
        Some(s) => match s.parse::<HartSet>() {
            Ok(h) => Ok(Some(HartRequest::Ids(h))),
            Err(e) => usage(format!("--hart-ids: {e}")),
        },
    }
}

fn optional_limit(
    flag: &str,
    v: &Option<String>,
    parse: fn(&str) -> Option<u64>,
) -> anyhow::Result<Option<LimitChange>> {
    match v.as_deref() {
        None => Ok(None),
        Some("none") => Ok(Some(LimitChange::Remove)),
        Some(s) => match parse(s) {
            Some(n) => Ok(Some(LimitChange::Set(n))),
            None => usage(format!("--{flag}: invalid value {s:?}")),
        },
    }
}

fn policy_from(p: PolicyArg, shape: &Shape) -> anyhow::Result<Policy> {
    let period = dur("period", &shape.period)?;
    let active = dur("active", &shape.active)?;
    let offset = dur("offset", &shape.offset)?;
    let budget = dur("budget", &shape.budget)?;
    let need = |flag: &str, v: Option<Duration>, policy: &str| match v {
        Some(d) => Ok(d),
        None => usage(format!("--{flag} is required with --policy {policy}")),
    };
    let refuse = |flag: &str, present: bool, policy: &str| {
        if present {
            usage(format!("--{flag} does not apply to --policy {policy}"))
        } else {
            Ok(())
        }
    };
    Ok(match p {
        PolicyArg::Dedicated => {
            for (f, v) in [
                ("period", period.is_some()),
                ("active", active.is_some()),
                ("budget", budget.is_some()),
                ("offset", offset.is_some()),
                ("weight", shape.weight.is_some()),
            ] {
                refuse(f, v, "dedicated")?;
            }
            Policy::Dedicated
        }
        PolicyArg::TimeTriggered => {
            refuse("budget", budget.is_some(), "time-triggered")?;
            refuse("weight", shape.weight.is_some(), "time-triggered")?;
            Policy::TimeTriggered {
                period: need("period", period, "time-triggered")?,
                active: need("active", active, "time-triggered")?,
                offset,
            }
        }
        PolicyArg::EventTriggered => {
            refuse("active", active.is_some(), "event-triggered")?;
            refuse("offset", offset.is_some(), "event-triggered")?;
            refuse("weight", shape.weight.is_some(), "event-triggered")?;
            Policy::EventTriggered {
                period: need("period", period, "event-triggered")?,
                budget: need("budget", budget, "event-triggered")?,
            }
        }
        PolicyArg::BestEffort => {
            for (f, v) in [
                ("period", period.is_some()),
                ("active", active.is_some()),
                ("budget", budget.is_some()),
                ("offset", offset.is_some()),
            ] {
                refuse(f, v, "best-effort")?;
            }
            Policy::BestEffort {
                weight: shape.weight.unwrap_or(DEFAULT_WEIGHT),
            }
        }
    })
}

fn parse_mem(s: &str) -> Option<u64> {
    parse_bytes(s).ok()
}

fn parse_count(s: &str) -> Option<u64> {
    s.parse().ok()
}

/// Runs a cell subcommand.
pub fn run(cmd: CellCmd) -> anyhow::Result<i32> {
    match cmd {
        CellCmd::Create(a) => {
            let spec = CellSpec {
                name: a.name.clone(),
                policy: policy_from(a.policy, &a.shape)?,
                harts: harts_of(&a.shape)?.unwrap_or(HartRequest::Count(1)),
                memory_max: optional_limit("memory", &a.shape.memory, parse_mem)?
                    .and_then(LimitChange::value),
                pids_max: optional_limit("pids", &a.shape.pids, parse_count)?
                    .and_then(LimitChange::value),
                pinned: a.pinned,
                idle: a.idle.map(Into::into),
                broker: Default::default(),
            };
            if let Err(e) = spec.validate() {
                return usage(e.to_string());
            }
            print_applied(call(Request::CreateCell { spec })?, a.json)
        }
        CellCmd::List(a) => {
            let Body::Cells { cells } = call(Request::ListCells)? else {
                anyhow::bail!("unexpected reply")
            };
            if a.json {
                output::json(&cells);
            } else if cells.is_empty() {
                println!("no cells (create one with `tess cell create NAME --policy ...`)");
            } else {
                print!("{}", output::cell_table(&cells));
            }
            Ok(0)
        }
        CellCmd::Show(a) => {
            let Body::Cell(c) = call(Request::ShowCell { name: a.name })? else {
                anyhow::bail!("unexpected reply")
            };
            if a.json {
                output::json(&c);
            } else {
                print!("{}", output::cell_detail(&c));
            }
            Ok(0)
        }
        CellCmd::Resize(a) => {
            let policy = match a.policy {
                Some(p) => Some(policy_from(p, &a.shape)?),
                None => None,
            };
            let update = CellUpdate {
                harts: harts_of(&a.shape)?,
                period: if policy.is_some() {
                    None
                } else {
                    dur("period", &a.shape.period)?
                },
                active: if policy.is_some() {
                    None
                } else {
                    dur("active", &a.shape.active)?
                },
                offset: if policy.is_some() {
                    None
                } else {
                    dur("offset", &a.shape.offset)?
                },
                budget: if policy.is_some() {
                    None
                } else {
                    dur("budget", &a.shape.budget)?
                },
                weight: if policy.is_some() {
                    None
                } else {
                    a.shape.weight
                },
                policy,
                memory_max: optional_limit("memory", &a.shape.memory, parse_mem)?,
                pids_max: optional_limit("pids", &a.shape.pids, parse_count)?,
            };
            print_applied(
                call(Request::UpdateCell {
                    name: a.name,
                    update,
                })?,
                a.json,
            )
        }
        CellCmd::Delete(a) => {
            let mut c = tess_proto::Client::connect_default()?;
            for name in a.names {
                c.call(&Request::DeleteCell { name: name.clone() })?;
                println!("deleted {name}");
            }
            Ok(0)
        }
        CellCmd::Pin(a) => print_applied(
            call(Request::SetPinned {
                name: a.name,
                pinned: true,
            })?,
            a.json,
        ),
        CellCmd::Unpin(a) => print_applied(
            call(Request::SetPinned {
                name: a.name,
                pinned: false,
            })?,
            a.json,
        ),
    }
}

fn print_applied(body: Body, json: bool) -> anyhow::Result<i32> {
    let Body::Applied(r) = body else {
        anyhow::bail!("unexpected reply")
    };
    if json {
        output::json(&r);
    } else {
        print!("{}", output::applied(&r));
    }
    Ok(0)
}
