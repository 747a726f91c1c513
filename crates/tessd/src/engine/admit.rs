//! Step 1 of a transaction: place the changed cells, admit the whole cluster, check the
//! caller's quota. Pure: it reads nothing but its arguments and changes nothing but `next`.

use super::error::EResult;
use std::collections::BTreeSet;
use tess_core::admission::{self, Capacity};
use tess_core::placement;
use tess_core::quota::{self, Quota};
use tess_core::state::Cluster;

/// Places the cells named in `changed` (and any without harts), then checks that the whole
/// cluster fits the machine and, for an unprivileged caller `(uid, quota)`, the quota.
pub fn place_and_admit(
    next: &mut Cluster,
    cap: &Capacity,
    changed: &BTreeSet<String>,
    unprivileged: Option<(u32, &Quota)>,
) -> EResult<()> {
    placement::place(next, cap, changed)?;
    admission::check(next, cap)?;
    if let Some((uid, q)) = unprivileged {
        quota::check(next, uid, q)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::tests::{cell, machine};
    use tess_core::spec::{HartRequest, Policy};
    use tess_proto::ErrorKind;

    #[test]
    fn changed_cells_get_harts() {
        let mut next = Cluster::default();
        next.cells.insert(
            "a".into(),
            cell("a", Policy::Dedicated, HartRequest::Count(1)),
        );
        place_and_admit(&mut next, &machine(4), &["a".to_string()].into(), None).unwrap();
        assert_eq!(next.cells["a"].harts.len(), 1);
    }

    #[test]
    fn over_commitment_is_an_admission_error_naming_the_resource() {
        let mut next = Cluster::default();
        for n in ["a", "b", "c"] {
            next.cells
                .insert(n.into(), cell(n, Policy::Dedicated, HartRequest::Count(1)));
        }
        // Two harts, one kept for the system: one dedicated cell fits, three do not.
        let changed = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        let e = place_and_admit(&mut next, &machine(2), &changed, None).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Admission, "{}", e.message);
        assert!(!e.message.is_empty());
    }

    #[test]
    fn quota_applies_only_to_unprivileged_callers() {
        let mut next = Cluster::default();
        let mut c = cell("a", Policy::Dedicated, HartRequest::Count(1));
        c.owner = 1000;
        next.cells.insert("a".into(), c);
        // The default quota allows nothing.
        let none = Quota::default();
        let changed = ["a".to_string()].into();
        place_and_admit(&mut next.clone(), &machine(4), &changed, None).unwrap();
        let e = place_and_admit(&mut next, &machine(4), &changed, Some((1000, &none))).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Admission, "{}", e.message);
    }
}
