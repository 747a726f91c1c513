//! Placement: which harts a cell that asked for a count gets, and where a time-triggered
//! window without an explicit offset goes.
//!
//! Cells whose spec did not change keep their harts (a resize of one cell never moves another).
//! New or changed cells are placed in this order: explicit hart ids, then dedicated counts
//! (highest-numbered free harts first, so hart 0, where the kernel and the system tend to live,
//! is the last to be taken), then the rest by decreasing utilization onto the least-loaded harts
//! that stay admissible (worst fit, which leaves the most slack everywhere).

use crate::admission::{check_hart, windows_collide, AdmissionError, Capacity, HartLoad};
use crate::spec::{HartRequest, Policy};
use crate::state::Cluster;
use std::collections::BTreeSet;
use std::time::Duration;
use tess_sched::HartSet;

/// Places every cell in `changed` (new cells and cells whose spec changed); others keep their
/// harts. On error the cluster is left partly placed and must be discarded.
pub fn place(
    cluster: &mut Cluster,
    cap: &Capacity,
    changed: &BTreeSet<String>,
) -> Result<(), AdmissionError> {
    // A changed cell keeps as many of its current harts as it can: resizing a cell should not
    // move the threads that stay.
    let mut previous: std::collections::BTreeMap<String, HartSet> =
        std::collections::BTreeMap::new();
    for name in changed {
        if let Some(c) = cluster.cells.get_mut(name) {
            previous.insert(name.clone(), std::mem::take(&mut c.harts));
            c.window_offset = None;
        }
    }
    // 1. Explicit ids.
    for name in changed {
        let Some(c) = cluster.cells.get_mut(name) else {
            continue;
        };
        if let HartRequest::Ids(ids) = &c.spec.harts {
            c.harts = ids.clone();
        }
    }
    for name in changed {
        if matches!(cluster.cells[name].spec.harts, HartRequest::Ids(_)) {
            choose_window_offset(cluster, name)?;
        }
    }
    // 2. Dedicated counts.
    for name in changed {
        let c = &cluster.cells[name];
        let HartRequest::Count(n) = c.spec.harts else {
            continue;
        };
        if !c.policy().is_dedicated() {
            continue;
        }
        let used = cluster
            .cells
            .values()
            .fold(HartSet::new(), |acc, c| acc.union(&c.harts));
        let free: Vec<usize> = cap.harts.difference(&used).iter().collect();
        let dedicated = cluster.dedicated_harts();
        let shared_now = cap.harts.difference(&dedicated).len();
        let can_take = free
            .len()
            .min(shared_now.saturating_sub(cap.min_system_harts));
        if can_take < n {
            return Err(AdmissionError::NotEnoughHarts {
                cell: name.clone(),
                requested: n,
                found: can_take,
                kind: "dedicated".into(),
                detail: format!(
                    "free harts: {}; {} must stay shared for the system",
                    if free.is_empty() {
                        "none".to_string()
                    } else {
                        free.iter().copied().collect::<HartSet>().to_string()
                    },
                    cap.min_system_harts
                ),
            });
        }
        let before = previous.get(name).cloned().unwrap_or_default();
        let mut order: Vec<usize> = free.clone();
        // Its own harts first, then the highest.
        order.sort_by_key(|h| (!before.contains(*h), std::cmp::Reverse(*h)));
        let chosen: HartSet = order.into_iter().take(n).collect();
        cluster.cells.get_mut(name).expect("exists").harts = chosen;
    }
    // 3. Shared counts, heaviest first.
    let mut rest: Vec<(String, f64)> = changed
        .iter()
        .filter(|n| {
            let c = &cluster.cells[*n];
            matches!(c.spec.harts, HartRequest::Count(_)) && !c.policy().is_dedicated()
        })
        .map(|n| (n.clone(), cluster.cells[n].policy().utilization()))
        .collect();
    rest.sort_by(|a, b| b.1.partial_cmp(&a.1).expect("finite").then(a.0.cmp(&b.0)));
    for (name, _) in rest {
        let before = previous.get(&name).cloned().unwrap_or_default();
        place_shared(cluster, cap, &name, &before)?;
    }
    Ok(())
}

fn place_shared(
    cluster: &mut Cluster,
    cap: &Capacity,
    name: &str,
    before: &HartSet,
) -> Result<(), AdmissionError> {
    let n = cluster.cells[name].spec.harts.count();
    let kind = cluster.cells[name].policy().name().to_string();
    let candidates = cap.harts.difference(&cluster.dedicated_harts());
    let mut feasible: Vec<(f64, usize)> = Vec::new();
    let mut reasons: Vec<String> = Vec::new();
    for h in candidates.iter() {
        let mut trial = cluster.clone();
        trial.cells.get_mut(name).expect("exists").harts = HartSet::single(h);
        let before = cluster.utilization_on(h);
        match choose_window_offset(&mut trial, name)
            .and_then(|_| check_hart(&trial, cap, h, &mut HartLoad::default()))
        {
            Ok(()) => feasible.push((before, h)),
            Err(e) => reasons.push(e.to_string()),
        }
    }
    // Group servers (event-triggered cells on cgroup v1) all sit on one hart (admission rule
    // 6): a new one goes where the others are.
    let group_hart = |h: usize| {
        cap.group_servers.is_some()
            && cluster.cells[name].policy().is_event_triggered()
            && cluster
                .cells_on(h)
                .any(|c| c.name() != name && c.policy().is_event_triggered())
    };
    // The cell's own harts first, lowest first (a resize moves nothing that can stay, and a
    // runtime's first threads sit on its lowest harts while shrinking retires the highest);
    // then a group server's hart for a group server; then the least loaded, on ties the higher
    // hart id (hart 0 is the system's favourite).
    feasible.sort_by(|a, b| match (before.contains(a.1), before.contains(b.1)) {
        (true, true) => a.1.cmp(&b.1),
        (true, false) => std::cmp::Ordering::Less,
        (false, true) => std::cmp::Ordering::Greater,
        (false, false) => group_hart(b.1)
            .cmp(&group_hart(a.1))
            .then(a.0.partial_cmp(&b.0).expect("finite"))
            .then(b.1.cmp(&a.1)),
    });
    if feasible.len() < n {
        return Err(AdmissionError::NotEnoughHarts {
            cell: name.into(),
            requested: n,
            found: feasible.len(),
            kind,
            detail: reasons.join("; "),
        });
    }
    let chosen: HartSet = feasible.iter().take(n).map(|f| f.1).collect();
    cluster.cells.get_mut(name).expect("exists").harts = chosen.clone();
    choose_window_offset(cluster, name)?;
    for h in chosen.iter() {
        check_hart(cluster, cap, h, &mut HartLoad::default())?;
    }
    Ok(())
}

/// For a time-triggered cell without an explicit offset, picks the earliest offset (0, or the
/// end of another window on its harts) at which its window collides with no other window on
/// any of its harts. Explicit offsets are kept as given.
fn choose_window_offset(cluster: &mut Cluster, name: &str) -> Result<(), AdmissionError> {
    let cell = &cluster.cells[name];
    let Policy::TimeTriggered {
        period,
        active,
        offset,
    } = cell.spec.policy
    else {
        return Ok(());
    };
    if let Some(o) = offset {
        cluster.cells.get_mut(name).expect("exists").window_offset = Some(o);
        return Ok(());
    }
    let others: Vec<(String, usize, (Duration, Duration, Duration))> = cell
        .harts
        .iter()
        .flat_map(|h| {
            cluster
                .cells_on(h)
                .filter(|c| c.name() != name)
                // Windows not yet placed (no offset chosen or given) do not constrain us.
                .filter(|c| c.window_offset.is_some())
                .filter_map(move |c| Some((c.name().to_string(), h, c.window()?)))
        })
        .collect();
    let mut candidates: Vec<Duration> = vec![Duration::ZERO];
    for (_, _, (o, a, _)) in &others {
        let end = (*o + *a).as_nanos() % period.as_nanos();
        candidates.push(Duration::from_nanos(end as u64));
    }
    candidates.sort();
    candidates.dedup();
    let mut last_clash = None;
    for cand in candidates {
        let mine = (cand, active, period);
        match others.iter().find(|(_, _, w)| windows_collide(mine, *w)) {
            None => {
                cluster.cells.get_mut(name).expect("exists").window_offset = Some(cand);
                return Ok(());
            }
            Some(clash) => last_clash = Some((clash.clone(), mine)),
        }
    }
    let ((other, hart, w), mine) = last_clash.expect("at least one candidate was tried");
    Err(AdmissionError::WindowCollision {
        hart,
        a: name.to_string(),
        a_window: mine,
        b: other,
        b_window: w,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::check;
    use crate::spec::CellSpec;
    use crate::state::Cell;

    fn ms(x: u64) -> Duration {
        Duration::from_millis(x)
    }

    fn add(c: &mut Cluster, name: &str, policy: Policy, harts: HartRequest) {
        c.cells.insert(
            name.into(),
            Cell {
                spec: CellSpec {
                    name: name.into(),
                    policy,
                    harts,
                    memory_max: None,
                    pids_max: None,
                    pinned: false,
                    idle: None,
                    broker: Default::default(),
                },
                harts: HartSet::new(),
                window_offset: None,
                owner: 0,
                ephemeral_pid: None,
                created_ms: 0,
            },
        );
    }

    fn names(xs: &[&str]) -> BTreeSet<String> {
        xs.iter().map(|s| s.to_string()).collect()
    }

    fn cap(n: usize) -> Capacity {
        Capacity::new(HartSet::first_n(n))
    }

    #[test]
    fn dedicated_takes_highest_free_harts_and_leaves_a_system_hart() {
        let mut c = Cluster::default();
        add(&mut c, "a", Policy::Dedicated, HartRequest::Count(2));
        place(&mut c, &cap(4), &names(&["a"])).unwrap();
        assert_eq!(c.cells["a"].harts.to_string(), "2-3");
        add(&mut c, "b", Policy::Dedicated, HartRequest::Count(2));
        let e = place(&mut c, &cap(4), &names(&["b"])).unwrap_err();
        assert!(
            e.to_string()
                .contains("asks for 2 dedicated hart(s) but only 1"),
            "{e}"
        );
    }

    #[test]
    fn shared_cells_spread_to_least_loaded() {
        let mut c = Cluster::default();
        let et = |b| Policy::EventTriggered {
            period: ms(10),
            budget: ms(b),
        };
        add(&mut c, "a", et(5), HartRequest::Count(1));
        add(&mut c, "b", et(4), HartRequest::Count(1));
        add(&mut c, "c", et(3), HartRequest::Count(1));
        place(&mut c, &cap(2), &names(&["a", "b", "c"])).unwrap();
        // a (50%) goes to hart 1 (ties prefer the higher id), b to hart 0, c to the emptier (0).
        assert_eq!(c.cells["a"].harts.to_string(), "1");
        assert_eq!(c.cells["b"].harts.to_string(), "0");
        assert_eq!(c.cells["c"].harts.to_string(), "0");
        assert!(check(&c, &cap(2)).is_ok());
    }

    #[test]
    fn a_resized_cell_keeps_its_harts() {
        let mut c = Cluster::default();
        let tt = Policy::TimeTriggered {
            period: ms(10),
            active: ms(4),
            offset: None,
        };
        add(&mut c, "gang", tt.clone(), HartRequest::Count(2));
        place(&mut c, &cap(4), &names(&["gang"])).unwrap();
        let two = c.cells["gang"].harts.clone();
        c.cells.get_mut("gang").unwrap().spec.harts = HartRequest::Count(1);
        place(&mut c, &cap(4), &names(&["gang"])).unwrap();
        let one = c.cells["gang"].harts.clone();
        assert!(one.is_subset(&two), "{one} not within {two}");
        c.cells.get_mut("gang").unwrap().spec.harts = HartRequest::Count(2);
        place(&mut c, &cap(4), &names(&["gang"])).unwrap();
        assert!(one.is_subset(&c.cells["gang"].harts));
        // Dedicated cells too.
        add(&mut c, "d", Policy::Dedicated, HartRequest::Count(1));
        place(&mut c, &cap(4), &names(&["d"])).unwrap();
        let d = c.cells["d"].harts.clone();
        place(&mut c, &cap(4), &names(&["d"])).unwrap();
        assert_eq!(c.cells["d"].harts, d);
    }

    #[test]
    fn a_multi_hart_cell_counts_once_per_hart() {
        // A 50% cell on 2 harts uses 50% of each, not 100% of either.
        let mut c = Cluster::default();
        let tt = Policy::TimeTriggered {
            period: ms(10),
            active: ms(5),
            offset: None,
        };
        add(&mut c, "gang", tt, HartRequest::Count(2));
        place(&mut c, &cap(2), &names(&["gang"])).unwrap();
        assert_eq!(c.cells["gang"].harts.to_string(), "0-1");
        assert!(check(&c, &cap(2)).is_ok());
    }

    #[test]
    fn count_beyond_feasible_harts_is_refused() {
        let mut c = Cluster::default();
        add(
            &mut c,
            "a",
            Policy::EventTriggered {
                period: ms(10),
                budget: ms(6),
            },
            HartRequest::Count(3),
        );
        let e = place(&mut c, &cap(2), &names(&["a"])).unwrap_err();
        assert!(
            e.to_string()
                .contains("asks for 3 event-triggered hart(s) but only 2"),
            "{e}"
        );
    }

    #[test]
    fn unchanged_cells_keep_their_harts() {
        let mut c = Cluster::default();
        let et = |b| Policy::EventTriggered {
            period: ms(10),
            budget: ms(b),
        };
        add(&mut c, "a", et(1), HartRequest::Count(1));
        place(&mut c, &cap(2), &names(&["a"])).unwrap();
        let before = c.cells["a"].harts.clone();
        add(&mut c, "b", et(8), HartRequest::Count(1));
        place(&mut c, &cap(2), &names(&["b"])).unwrap();
        assert_eq!(c.cells["a"].harts, before);
        assert_ne!(c.cells["b"].harts, before);
    }

    #[test]
    fn window_offsets_are_chosen_to_avoid_collisions() {
        let mut c = Cluster::default();
        let tt = |a| Policy::TimeTriggered {
            period: ms(10),
            active: ms(a),
            offset: None,
        };
        add(&mut c, "a", tt(3), HartRequest::Ids("1".parse().unwrap()));
        add(&mut c, "b", tt(3), HartRequest::Ids("1".parse().unwrap()));
        add(&mut c, "c", tt(3), HartRequest::Ids("1".parse().unwrap()));
        place(&mut c, &cap(2), &names(&["a", "b", "c"])).unwrap();
        let offs: Vec<Duration> = ["a", "b", "c"]
            .iter()
            .map(|n| c.cells[*n].window_offset.unwrap())
            .collect();
        assert_eq!(offs, vec![ms(0), ms(3), ms(6)]);
        assert!(check(&c, &cap(2)).is_ok());
        add(&mut c, "d", tt(3), HartRequest::Ids("1".parse().unwrap()));
        let e = place(&mut c, &cap(2), &names(&["d"])).unwrap_err();
        assert!(
            matches!(e, AdmissionError::WindowCollision { hart: 1, .. }),
            "{e}"
        );
    }
}
