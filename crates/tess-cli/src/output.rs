//! Human-readable output.

use tess_bench::Table;
use tess_core::units::{format_bytes, format_duration};
use tess_proto::{ApplyResult, CellInfo};

/// Prints JSON of any serializable value.
pub fn json<T: serde::Serialize>(v: &T) {
    println!("{}", serde_json::to_string_pretty(v).expect("serializable"));
}

/// One-line policy description.
pub fn policy(c: &CellInfo) -> String {
    let mut s = c.policy.describe();
    if let (tess_core::Policy::TimeTriggered { offset: None, .. }, Some(o)) =
        (&c.policy, c.window_offset)
    {
        s.push_str(&format!(" @{}", format_duration(o)));
    }
    s
}

/// The cell table of `tess cell list`.
pub fn cell_table(cells: &[CellInfo]) -> String {
    let mut t = Table::new(
        "",
        &[
            "NAME", "POLICY", "HARTS", "SHARE", "MEMORY", "PROCS", "FLAGS",
        ],
    );
    for c in cells {
        let mut flags = Vec::new();
        if c.pinned {
            flags.push("pinned".to_string());
        }
        if let Some(p) = c.ephemeral_pid {
            flags.push(format!("ephemeral(pid {p})"));
        }
        t.row(&[
            c.name.clone(),
            policy(c),
            c.harts.to_string(),
            format!("{:.1}%", c.utilization * 100.0),
            c.memory_max.map(format_bytes).unwrap_or_else(|| "-".into()),
            c.processes.len().to_string(),
            flags.join(","),
        ]);
    }
    t.render()
}

/// Details of one cell.
pub fn cell_detail(c: &CellInfo) -> String {
    let mut out = String::new();
    let line = |out: &mut String, k: &str, v: String| out.push_str(&format!("{k:<12} {v}\n"));
    line(&mut out, "name", c.name.clone());
    line(&mut out, "owner", format!("uid {}", c.owner));
    line(&mut out, "policy", policy(c));
    line(
        &mut out,
        "harts",
        format!("{} (asked: {})", c.harts, c.request),
    );
    line(
        &mut out,
        "share",
        format!("{:.1}% of each hart", c.utilization * 100.0),
    );
    line(
        &mut out,
        "memory",
        c.memory_max
            .map(format_bytes)
            .unwrap_or_else(|| "unlimited".into()),
    );
    line(
        &mut out,
        "tasks",
        c.pids_max
            .map(|p| p.to_string())
            .unwrap_or_else(|| "unlimited".into()),
    );
    line(
        &mut out,
        "pinned",
        if c.pinned { "yes" } else { "no" }.into(),
    );
    if !c.broker.is_empty() {
        let harts = |h: Option<tess_core::spec::Harts>| {
            h.map_or("default".to_string(), |h| format!("{} harts", h.get()))
        };
        line(
            &mut out,
            "broker limits",
            format!(
                "floor {}, ceiling {}",
                harts(c.broker.floor),
                harts(c.broker.ceiling)
            ),
        );
    }
    if c.policy.is_dedicated() {
        let idle = if c.idle_spinners.is_empty() {
            "halt".to_string()
        } else {
            format!(
                "spin (spinner pids {})",
                c.idle_spinners
                    .iter()
                    .map(|p| p.to_string())
                    .collect::<Vec<_>>()
                    .join(" ")
            )
        };
        line(&mut out, "idle", idle);
    }
    if let Some(p) = c.ephemeral_pid {
        line(
            &mut out,
            "ephemeral",
            format!("removed when pid {p} and its children exit"),
        );
    }
    line(&mut out, "cgroup", c.cgroup.clone());
    line(
        &mut out,
        "processes",
        if c.processes.is_empty() {
            "none".into()
        } else {
            c.processes
                .iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join(" ")
        },
    );
    if !c.threads.is_empty() {
        let mut t = Table::new("threads", &["TID", "HARTS", "SCHEDULING"]);
        for th in &c.threads {
            t.row(&[
                th.tid.to_string(),
                th.affinity.to_string(),
                th.sched.clone(),
            ]);
        }
        out.push_str(&t.render());
    }
    out
}

/// Summary of a transaction.
pub fn applied(r: &ApplyResult) -> String {
    let mut out = String::new();
    let verb = if r.dry_run { "would be " } else { "" };
    for (what, names) in [
        ("created", &r.created),
        ("updated", &r.updated),
        ("deleted", &r.deleted),
        ("unchanged", &r.unchanged),
    ] {
        if !names.is_empty() {
            out.push_str(&format!("{verb}{what}: {}\n", names.join(", ")));
        }
    }
    for c in &r.cells {
        out.push_str(&format!(
            "  {:<16} {:<32} harts {}\n",
            c.name,
            policy(c),
            c.harts
        ));
    }
    if !r.dry_run && r.timing.total_us > 0.0 {
        out.push_str(&format!(
            "enforced in {:.0} us (admission {:.0} us, kernel {:.0} us, commit {:.0} us)\n",
            r.timing.total_us, r.timing.admit_us, r.timing.enforce_us, r.timing.commit_us
        ));
    }
    out
}
