//! Allocations: GPUs (atoms) of one node booked for one request. An active allocation owns one
//! `allocation_atoms` row per GPU; releasing it deletes those rows and stamps `released_at`.
//! Also the placer's two queries over a pool's nodes: the schedulable candidates it books from
//! (read under the write lock) and the per-node capacity bucket.

use crate::db::{Db, Row};
use crate::params;
use bc_protocol::CapacityBucket;
use serde::Serialize;

use super::{Reader, StoreError, Tx, parse_enum};

/// One allocation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Allocation {
    pub id: String,
    pub pool_id: String,
    pub node_id: String,
    pub gpus: u32,
    /// The booked atoms (GPU uuid or `gpu<index>`), sorted; empty once released.
    pub atoms: Vec<String>,
    pub tenant_id: Option<String>,
    pub created_by: String,
    /// Milliseconds since the Unix epoch.
    pub created_at: i64,
    pub released_at: Option<i64>,
    pub released_by: Option<String>,
}

const ALLOCATION_COLUMNS: &str =
    "id, pool_id, node_id, gpus, tenant_id, created_by, created_at, released_at, released_by";

fn from_row(row: &Row<'_>) -> Result<Allocation, StoreError> {
    let gpus: i64 = row.get(3)?;
    Ok(Allocation {
        id: row.get(0)?,
        pool_id: row.get(1)?,
        node_id: row.get(2)?,
        gpus: u32::try_from(gpus).unwrap_or(0),
        atoms: Vec::new(),
        tenant_id: row.get(4)?,
        created_by: row.get(5)?,
        created_at: row.get(6)?,
        released_at: row.get(7)?,
        released_by: row.get(8)?,
    })
}

fn atoms_of(conn: Db<'_>, allocation_id: &str) -> Result<Vec<String>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT atom FROM allocation_atoms WHERE allocation_id = ?1 ORDER BY atom",
    )?;
    let rows = stmt.query_map(params![allocation_id], |r| r.get(0))?;
    rows.collect::<Result<_, _>>()
}

/// Filters of [`Reader::allocations`]; `None` matches everything.
#[derive(Debug, Clone, Default)]
pub struct AllocationFilter {
    pub pool_id: Option<String>,
    pub node_id: Option<String>,
    /// Only allocations not yet released.
    pub active_only: bool,
}

impl Tx<'_> {
    /// Inserts an active allocation and its atoms. The atoms' primary key `(node_id, atom)`
    /// refuses a GPU that is already booked.
    pub fn insert_allocation(&self, a: &Allocation) -> Result<(), StoreError> {
        let conn = self.db();
        conn.execute(
            "INSERT INTO allocations (id, pool_id, node_id, gpus, tenant_id, created_by, created_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![
                a.id,
                a.pool_id,
                a.node_id,
                i64::from(a.gpus),
                a.tenant_id,
                a.created_by,
                a.created_at
            ],
        )?;
        let mut stmt = conn.prepare_cached(
            "INSERT INTO allocation_atoms (node_id, atom, allocation_id) VALUES (?1, ?2, ?3)",
        )?;
        for atom in &a.atoms {
            stmt.execute(params![a.node_id, atom, a.id])?;
        }
        Ok(())
    }

    /// Marks `id` released and frees its atoms.
    pub fn release_allocation(&self, id: &str, at: i64, by: &str) -> Result<(), StoreError> {
        let conn = self.db();
        conn.execute(
            "DELETE FROM allocation_atoms WHERE allocation_id = ?1",
            params![id],
        )?;
        conn.execute(
            "UPDATE allocations SET released_at = ?2, released_by = ?3 WHERE id = ?1",
            params![id, at, by],
        )?;
        Ok(())
    }

    /// The placer's candidates: `(id, inventory document)` of every node of `pool_id` the SQL
    /// predicate calls schedulable, by id. Read inside the write transaction, so the rows booked
    /// are the rows checked (SQLite: the database write lock of `BEGIN IMMEDIATE`; PostgreSQL
    /// appends `FOR UPDATE OF n`).
    pub fn lock_schedulable_nodes(
        &self,
        pool_id: &str,
    ) -> Result<Vec<(String, Option<String>)>, StoreError> {
        let sql = format!(
            "SELECT n.id, n.inventory FROM nodes n LEFT JOIN pools p ON p.id = n.pool_id \
             WHERE n.pool_id = ?1 AND {} ORDER BY n.id",
            super::schedulable::schedulable_sql()
        );
        let mut stmt = self.db().prepare_cached(&sql)?;
        let rows = stmt.query_map(params![pool_id], |r| {
            Ok((r.get::<String>(0)?, r.get::<Option<String>>(1)?))
        })?;
        rows.collect::<Result<_, _>>()
    }
}

impl Reader<'_> {
    /// One allocation with its atoms.
    pub fn allocation(&self, id: &str) -> Result<Option<Allocation>, StoreError> {
        let conn = self.db();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {ALLOCATION_COLUMNS} FROM allocations WHERE id = ?1"
        ))?;
        let Some(mut a) = stmt.query_map(params![id], from_row)?.next().transpose()? else {
            return Ok(None);
        };
        a.atoms = atoms_of(conn, &a.id)?;
        Ok(Some(a))
    }

    /// Allocations matching `f`, oldest first, with atoms.
    pub fn allocations(&self, f: &AllocationFilter) -> Result<Vec<Allocation>, StoreError> {
        let conn = self.db();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {ALLOCATION_COLUMNS} FROM allocations \
             WHERE (?1 IS NULL OR pool_id = ?1) AND (?2 IS NULL OR node_id = ?2) \
             AND (?3 = 0 OR released_at IS NULL) ORDER BY created_at, id"
        ))?;
        let rows = stmt.query_map(params![f.pool_id, f.node_id, f.active_only], from_row)?;
        let mut out: Vec<Allocation> = rows.collect::<Result<_, _>>()?;
        for a in &mut out {
            a.atoms = atoms_of(conn, &a.id)?;
        }
        Ok(out)
    }

    /// The node's booked atoms.
    pub fn booked_atoms(&self, node_id: &str) -> Result<Vec<String>, StoreError> {
        let mut stmt = self
            .db()
            .prepare_cached("SELECT atom FROM allocation_atoms WHERE node_id = ?1 ORDER BY atom")?;
        let rows = stmt.query_map(params![node_id], |r| r.get(0))?;
        rows.collect::<Result<_, _>>()
    }

    /// How many allocations on the node are still active.
    pub fn active_allocation_count(&self, node_id: &str) -> Result<u64, StoreError> {
        let n: i64 = self.db().query_row(
            "SELECT COUNT(*) FROM allocations WHERE node_id = ?1 AND released_at IS NULL",
            params![node_id],
            |r| r.get(0),
        )?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// `(id, inventory document, capacity bucket)` of every node of `pool_id`, by id, the bucket
    /// computed by the SQL form of the predicate (`pools.capacity`).
    pub fn capacity_rows(
        &self,
        pool_id: &str,
    ) -> Result<Vec<(String, Option<String>, CapacityBucket)>, StoreError> {
        let sql = format!(
            "SELECT n.id, n.inventory, {} FROM nodes n LEFT JOIN pools p ON p.id = n.pool_id \
             WHERE n.pool_id = ?1 ORDER BY n.id",
            super::schedulable::capacity_bucket_sql()
        );
        let mut stmt = self.db().prepare_cached(&sql)?;
        let rows = stmt.query_map(params![pool_id], |r| {
            Ok((
                r.get::<String>(0)?,
                r.get::<Option<String>>(1)?,
                r.get::<String>(2)?,
            ))
        })?;
        let rows: Vec<(String, Option<String>, String)> = rows.collect::<Result<_, _>>()?;
        rows.into_iter()
            .map(|(id, inv, bucket)| Ok((id, inv, parse_enum("capacity bucket", &bucket)?)))
            .collect()
    }
}
