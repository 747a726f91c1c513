//! `tess quota ...`

use super::{call, usage};
use crate::output;
use clap::{Args, Subcommand};
use tess_bench::Table;
use tess_core::quota::Quota;
use tess_core::units::{format_bytes, parse_bytes};
use tess_proto::{Body, Request};

/// Quota subcommands.
#[derive(Subcommand, Debug)]
pub enum QuotaCmd {
    /// Set a user's quota (root only). Unset fields are zero: the user may use none of it.
    Set(SetArgs),
    /// Remove a user's quota (root only); the configured default applies again.
    Clear(UserArg),
    /// Show quotas and usage (yours, or everyone's for root).
    List(ListArgs),
}

/// `tess quota set`.
#[derive(Args, Debug)]
pub struct SetArgs {
    /// User name or numeric uid.
    pub user: String,
    /// Cells the user may hold.
    #[arg(long, default_value_t = 0)]
    pub max_cells: u32,
    /// Harts over all the user's cells.
    #[arg(long, default_value_t = 0)]
    pub max_harts: u32,
    /// Harts in dedicated cells.
    #[arg(long, default_value_t = 0)]
    pub max_dedicated_harts: u32,
    /// Reserved CPU in hart-equivalents (0.5 = half a hart of time- and event-triggered cells).
    #[arg(long, default_value_t = 0.0)]
    pub max_reserved: f64,
    /// Sum of memory limits (cells must then set --memory).
    #[arg(long)]
    pub max_memory: Option<String>,
    /// May pin cells.
    #[arg(long)]
    pub allow_pinned: bool,
}

/// A user.
#[derive(Args, Debug)]
pub struct UserArg {
    /// User name or numeric uid.
    pub user: String,
}

/// `tess quota list`.
#[derive(Args, Debug)]
pub struct ListArgs {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

fn uid_of(user: &str) -> anyhow::Result<u32> {
    if let Ok(n) = user.parse() {
        return Ok(n);
    }
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    for line in passwd.lines() {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() > 2 && f[0] == user {
            if let Ok(uid) = f[2].parse() {
                return Ok(uid);
            }
        }
    }
    usage(format!("no user named {user:?}"))
}

/// Runs a quota subcommand.
pub fn run(cmd: QuotaCmd) -> anyhow::Result<i32> {
    let body = match cmd {
        QuotaCmd::Set(a) => {
            let max_memory = match &a.max_memory {
                None => None,
                Some(s) => match parse_bytes(s) {
                    Ok(b) => Some(b),
                    Err(e) => return usage(format!("--max-memory: {e}")),
                },
            };
            if !(a.max_reserved >= 0.0 && a.max_reserved.is_finite()) {
                return usage("--max-reserved must be a non-negative number");
            }
            let quota = Quota {
                max_cells: a.max_cells,
                max_harts: a.max_harts,
                max_dedicated_harts: a.max_dedicated_harts,
                max_reserved: a.max_reserved,
                max_memory,
                allow_pinned: a.allow_pinned,
            };
            call(Request::SetQuota {
                uid: uid_of(&a.user)?,
                quota: Some(quota),
            })?
        }
        QuotaCmd::Clear(a) => call(Request::SetQuota {
            uid: uid_of(&a.user)?,
            quota: None,
        })?,
        QuotaCmd::List(a) => {
            let body = call(Request::ListQuotas)?;
            if a.json {
                if let Body::Quotas { quotas } = &body {
                    output::json(quotas);
                }
                return Ok(0);
            }
            body
        }
    };
    let Body::Quotas { quotas } = body else {
        anyhow::bail!("unexpected reply")
    };
    let mut t = Table::new(
        "",
        &[
            "UID",
            "CELLS",
            "HARTS",
            "DEDICATED",
            "RESERVED",
            "MEMORY",
            "PIN",
        ],
    );
    for q in quotas {
        let quota = q.quota.unwrap_or_default();
        let u = q.usage;
        let used = |f: &dyn Fn(&tess_proto::UsageInfo) -> String| {
            u.as_ref().map(f).unwrap_or_else(|| "0".into())
        };
        t.row(&[
            q.uid.to_string(),
            format!("{}/{}", used(&|u| u.cells.to_string()), quota.max_cells),
            format!("{}/{}", used(&|u| u.harts.to_string()), quota.max_harts),
            format!(
                "{}/{}",
                used(&|u| u.dedicated_harts.to_string()),
                quota.max_dedicated_harts
            ),
            format!(
                "{}/{:.2}",
                used(&|u| format!("{:.2}", u.reserved)),
                quota.max_reserved
            ),
            format!(
                "{}/{}",
                used(&|u| format_bytes(u.memory)),
                quota
                    .max_memory
                    .map(format_bytes)
                    .unwrap_or_else(|| "-".into())
            ),
            if quota.allow_pinned { "yes" } else { "no" }.to_string(),
        ]);
    }
    print!("{}", t.render());
    Ok(0)
}
