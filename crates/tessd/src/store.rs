//! Durable state: cell definitions, quotas and saved kernel settings, in SQLite.
//!
//! The database runs in WAL mode with `synchronous = NORMAL`: a committed transaction survives
//! the daemon being killed at any instant (SIGKILL), and one in flight is rolled back on the next
//! open. The engine keeps a transaction open while it changes the kernel and commits only when
//! the kernel matches, so "committed" always means "was enforced".

use anyhow::{Context, Result};
use rusqlite::{params, Connection, OptionalExtension, Transaction};
use std::collections::BTreeMap;
use std::path::Path;
use tess_core::quota::Quota;
use tess_core::state::{Cell, Cluster};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS cells (name TEXT PRIMARY KEY, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS quotas (uid INTEGER PRIMARY KEY, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS saved (key TEXT PRIMARY KEY, value TEXT NOT NULL);
";

/// Schema version stored in `meta`.
const SCHEMA_VERSION: &str = "1";

/// The state database.
#[derive(Debug)]
pub struct Store {
    conn: Connection,
}

/// Everything persisted.
#[derive(Debug, Default, Clone)]
pub struct Persisted {
    /// Cells.
    pub cluster: Cluster,
    /// Quotas by uid.
    pub quotas: BTreeMap<u32, Quota>,
    /// Generation counter (incremented by every committed change).
    pub generation: u64,
}

impl Store {
    /// Opens (creating if needed) `dir/state.db`.
    pub fn open(dir: &Path) -> Result<Store> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating state directory {}", dir.display()))?;
        let path = dir.join("state.db");
        let conn = Connection::open(&path)
            .with_context(|| format!("opening state database {}", path.display()))?;
        let unreadable = || {
            format!(
                "state database {} is unreadable (corrupt, or not a tess state file); tessd leaves it untouched: restore it from a backup, or move it away to start with no cells",
                path.display()
            )
        };
        conn.pragma_update(None, "journal_mode", "WAL")
            .with_context(unreadable)?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.execute_batch(SCHEMA).with_context(unreadable)?;
        let version: Option<String> = conn
            .query_row("SELECT value FROM meta WHERE key = 'schema'", [], |r| {
                r.get(0)
            })
            .optional()?;
        match version.as_deref() {
            None => {
                conn.execute(
                    "INSERT INTO meta (key, value) VALUES ('schema', ?1)",
                    [SCHEMA_VERSION],
                )?;
            }
            Some(SCHEMA_VERSION) => {}
            Some(v) => anyhow::bail!(
                "state database {} has schema version {v}; this tessd understands {SCHEMA_VERSION}",
                path.display()
            ),
        }
        Ok(Store { conn })
    }

    /// Loads everything. A row that does not decode is an error naming the row (the daemon then
    /// refuses to start rather than silently dropping a cell).
    pub fn load(&self) -> Result<Persisted> {
        let mut p = Persisted::default();
        let mut stmt = self
            .conn
            .prepare("SELECT name, data FROM cells ORDER BY name")?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
        for row in rows {
            let (name, data) = row?;
            let cell: Cell = serde_json::from_str(&data).with_context(|| {
                format!("cell {name:?} in the state database is unreadable (tessd refuses to start rather than drop it; `tessd --forget {name}` removes it)")
            })?;
            p.cluster.cells.insert(name, cell);
        }
        let mut stmt = self.conn.prepare("SELECT uid, data FROM quotas")?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, u32>(0)?, r.get::<_, String>(1)?)))?;
        for row in rows {
            let (uid, data) = row?;
            let q: Quota = serde_json::from_str(&data).with_context(|| {
                format!("quota of uid {uid} in the state database is unreadable")
            })?;
            p.quotas.insert(uid, q);
        }
        p.generation = self
            .conn
            .query_row("SELECT value FROM meta WHERE key = 'generation'", [], |r| {
                r.get::<_, String>(0)
            })
            .optional()?
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        Ok(p)
    }

    /// Names of the stored cells, without decoding them (works on a row that does not decode).
    pub fn cell_names(&self) -> Result<Vec<String>> {
        let mut stmt = self.conn.prepare("SELECT name FROM cells ORDER BY name")?;
        let rows = stmt.query_map([], |r| r.get::<_, String>(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Starts a transaction.
    pub fn begin(&mut self) -> Result<StoreTxn<'_>> {
        Ok(StoreTxn {
            tx: self.conn.transaction()?,
        })
    }

    /// Reads a saved kernel setting (what tess changed, to restore it later).
    pub fn saved(&self, key: &str) -> Result<Option<String>> {
        Ok(self
            .conn
            .query_row("SELECT value FROM saved WHERE key = ?1", [key], |r| {
                r.get(0)
            })
            .optional()?)
    }

    /// All saved settings with a key prefix.
    pub fn saved_with_prefix(&self, prefix: &str) -> Result<Vec<(String, String)>> {
        let mut stmt = self
            .conn
            .prepare("SELECT key, value FROM saved WHERE key LIKE ?1 || '%'")?;
        let rows = stmt.query_map([prefix], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Saves a kernel setting unless one is already saved under `key` (the first value is the
    /// original).
    pub fn save_original(&self, key: &str, value: &str) -> Result<()> {
        self.conn.execute(
            "INSERT OR IGNORE INTO saved (key, value) VALUES (?1, ?2)",
            params![key, value],
        )?;
        Ok(())
    }

    /// Makes every later cell write fail as a full disk would (unit tests of the rollback).
    #[cfg(test)]
    pub(crate) fn fail_writes_for_test(&self) {
        self.conn
            .execute_batch(
                "CREATE TEMP TRIGGER full_disk BEFORE INSERT ON cells \
                 BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END;",
            )
            .expect("creating the failing trigger");
    }

    /// Forgets a saved setting (after restoring it).
    pub fn forget_saved(&self, key: &str) -> Result<()> {
        self.conn
            .execute("DELETE FROM saved WHERE key = ?1", [key])?;
        Ok(())
    }
}

/// An open transaction.
#[derive(Debug)]
pub struct StoreTxn<'a> {
    tx: Transaction<'a>,
}

impl StoreTxn<'_> {
    /// Writes (inserts or replaces) a cell.
    pub fn put_cell(&self, cell: &Cell) -> Result<()> {
        self.tx.execute(
            "INSERT OR REPLACE INTO cells (name, data) VALUES (?1, ?2)",
            params![cell.spec.name, serde_json::to_string(cell)?],
        )?;
        Ok(())
    }

    /// Deletes a cell.
    pub fn delete_cell(&self, name: &str) -> Result<()> {
        self.tx
            .execute("DELETE FROM cells WHERE name = ?1", [name])?;
        Ok(())
    }

    /// Writes or removes a quota.
    pub fn put_quota(&self, uid: u32, quota: Option<&Quota>) -> Result<()> {
        match quota {
            Some(q) => self.tx.execute(
                "INSERT OR REPLACE INTO quotas (uid, data) VALUES (?1, ?2)",
                params![uid, serde_json::to_string(q)?],
            )?,
            None => self
                .tx
                .execute("DELETE FROM quotas WHERE uid = ?1", [uid])?,
        };
        Ok(())
    }

    /// Records the generation number.
    pub fn set_generation(&self, g: u64) -> Result<()> {
        self.tx.execute(
            "INSERT OR REPLACE INTO meta (key, value) VALUES ('generation', ?1)",
            [g.to_string()],
        )?;
        Ok(())
    }

    /// Makes the transaction durable.
    pub fn commit(self) -> Result<()> {
        self.tx.commit()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tess_core::spec::{CellSpec, HartRequest, Policy};
    use tess_sched::HartSet;

    fn cell(name: &str) -> Cell {
        Cell {
            spec: CellSpec {
                name: name.into(),
                policy: Policy::Dedicated,
                harts: HartRequest::Count(1),
                memory_max: None,
                pids_max: None,
                pinned: false,
                idle: None,
                broker: Default::default(),
            },
            harts: HartSet::single(1),
            window_offset: None,
            owner: 0,
            ephemeral_pid: None,
            created_ms: 1,
        }
    }

    #[test]
    fn committed_changes_persist_and_uncommitted_do_not() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut s = Store::open(dir.path()).unwrap();
            let tx = s.begin().unwrap();
            tx.put_cell(&cell("a")).unwrap();
            tx.set_generation(1).unwrap();
            tx.commit().unwrap();
            let tx = s.begin().unwrap();
            tx.put_cell(&cell("b")).unwrap();
            drop(tx); // rolled back
        }
        let s = Store::open(dir.path()).unwrap();
        let p = s.load().unwrap();
        assert_eq!(p.cluster.cells.keys().collect::<Vec<_>>(), vec!["a"]);
        assert_eq!(p.generation, 1);
        assert_eq!(p.cluster.cells["a"], cell("a"));
    }

    #[test]
    fn saved_settings_keep_the_first_value() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        s.save_original("irq/26", "0-1").unwrap();
        s.save_original("irq/26", "0").unwrap();
        assert_eq!(s.saved("irq/26").unwrap().as_deref(), Some("0-1"));
        assert_eq!(s.saved_with_prefix("irq/").unwrap().len(), 1);
        s.forget_saved("irq/26").unwrap();
        assert_eq!(s.saved("irq/26").unwrap(), None);
    }

    #[test]
    fn corrupt_rows_are_reported_not_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        s.conn
            .execute(
                "INSERT INTO cells (name, data) VALUES ('x', '{not json')",
                [],
            )
            .unwrap();
        let e = s.load().unwrap_err();
        assert!(format!("{e:#}").contains("cell \"x\""), "{e:#}");
    }
}
