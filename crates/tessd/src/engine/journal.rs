//! Step 3 of a transaction: the journal commit. One SQLite transaction writes every created and
//! updated cell, removes every deleted one and bumps the generation; either all of it is durable
//! or none of it (WAL mode: a commit interrupted by SIGKILL is rolled back on the next open).

use crate::store::Store;
use anyhow::{Context, Result};
use tess_core::state::Cluster;
use tess_proto::ApplyResult;

/// Records in `store` the cells `result` names, as `next` has them, and `generation`.
pub fn commit(
    store: &mut Store,
    next: &Cluster,
    result: &ApplyResult,
    generation: u64,
) -> Result<()> {
    let txn = store.begin().context("starting the journal transaction")?;
    for name in result.created.iter().chain(result.updated.iter()) {
        let cell = next
            .cells
            .get(name)
            .with_context(|| format!("cell {name} is not in the new state"))?;
        txn.put_cell(cell)
            .with_context(|| format!("writing cell {name} to the journal"))?;
    }
    for name in &result.deleted {
        txn.delete_cell(name)
            .with_context(|| format!("deleting cell {name} from the journal"))?;
    }
    txn.set_generation(generation)?;
    txn.commit().context("committing the journal")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::tests::cell;
    use tess_core::spec::{HartRequest, Policy};

    #[test]
    fn a_commit_writes_created_updated_and_deleted_cells_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path()).unwrap();
        let mut next = Cluster::default();
        for n in ["a", "b"] {
            next.cells
                .insert(n.into(), cell(n, Policy::Dedicated, HartRequest::Count(1)));
        }
        let r = ApplyResult {
            created: vec!["a".into(), "b".into()],
            ..Default::default()
        };
        commit(&mut store, &next, &r, 1).unwrap();
        next.cells.remove("a");
        let r = ApplyResult {
            deleted: vec!["a".into()],
            ..Default::default()
        };
        commit(&mut store, &next, &r, 2).unwrap();
        let p = Store::open(dir.path()).unwrap().load().unwrap();
        assert_eq!(p.cluster.cells.keys().collect::<Vec<_>>(), ["b"]);
        assert_eq!(p.generation, 2);
    }

    #[test]
    fn a_failing_commit_leaves_the_journal_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path()).unwrap();
        let next = Cluster::default();
        // Names a cell the new state does not have: the transaction fails half-way.
        let r = ApplyResult {
            deleted: vec!["x".into()],
            created: vec!["ghost".into()],
            ..Default::default()
        };
        let e = commit(&mut store, &next, &r, 7).unwrap_err();
        assert!(format!("{e:#}").contains("ghost"), "{e:#}");
        let p = store.load().unwrap();
        assert_eq!(p.generation, 0);
    }
}
