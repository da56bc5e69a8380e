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
    /// The workload it belongs to: a job over several nodes books one allocation per node with
    /// one `workloadId` (`allocations.create`); absent: the allocation is its own workload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_id: Option<String>,
    /// Why it was released, when the control plane released it (health remediation evicting
    /// it from a node it must disrupt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_reason: Option<String>,
    /// The application-class XIDs its workload raised on several of its nodes at once: the
    /// workload's fault, not the nodes' (none of them is remediated for it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_fault: Option<WorkloadFault>,
}

/// A workload's fault, recorded on each of its allocations (issue 33).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct WorkloadFault {
    /// The XIDs seen (sorted, unique).
    pub xids: Vec<u64>,
    /// The nodes that saw them (sorted, unique).
    pub nodes: Vec<String>,
    /// The first and the last observation in the window, ms since the Unix epoch.
    pub first_at: i64,
    pub last_at: i64,
}

const ALLOCATION_COLUMNS: &str = "id, pool_id, node_id, gpus, tenant_id, created_by, created_at, \
    released_at, released_by, workload_id, release_reason, workload_fault";

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
        workload_id: row.get(9)?,
        release_reason: row.get(10)?,
        workload_fault: row
            .get::<Option<String>>(11)?
            .map(|j| super::from_json("allocations.workload_fault", &j))
            .transpose()?,
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
            "INSERT INTO allocations (id, pool_id, node_id, gpus, tenant_id, created_by, created_at, \
             workload_id) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![
                a.id,
                a.pool_id,
                a.node_id,
                i64::from(a.gpus),
                a.tenant_id,
                a.created_by,
                a.created_at,
                a.workload_id
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

    /// Marks `id` released (by `by`, for `reason` when the control plane released it) and
    /// frees its atoms.
    pub fn release_allocation(
        &self,
        id: &str,
        at: i64,
        by: &str,
        reason: Option<&str>,
    ) -> Result<(), StoreError> {
        let conn = self.db();
        conn.execute(
            "DELETE FROM allocation_atoms WHERE allocation_id = ?1",
            params![id],
        )?;
        conn.execute(
            "UPDATE allocations SET released_at = ?2, released_by = ?3, release_reason = ?4 \
             WHERE id = ?1",
            params![id, at, by, reason],
        )?;
        Ok(())
    }

    /// Records `fault` on allocation `id` (its workload's fault).
    pub fn set_workload_fault(&self, id: &str, fault: &WorkloadFault) -> Result<(), StoreError> {
        self.db().execute(
            "UPDATE allocations SET workload_fault = ?2 WHERE id = ?1",
            params![id, super::to_json(fault)],
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
             WHERE (CAST(?1 AS TEXT) IS NULL OR pool_id = ?1) AND (CAST(?2 AS TEXT) IS NULL OR node_id = ?2) \
             AND (?3 = 0 OR released_at IS NULL) ORDER BY created_at, id"
        ))?;
        let rows = stmt.query_map(params![f.pool_id, f.node_id, f.active_only], from_row)?;
        let mut out: Vec<Allocation> = rows.collect::<Result<_, _>>()?;
        for a in &mut out {
            a.atoms = atoms_of(conn, &a.id)?;
        }
        Ok(out)
    }

    /// The active allocations of workload `workload_id` (its `workloadId`, or an allocation's
    /// own id), oldest first, with atoms.
    pub fn workload_allocations(&self, workload_id: &str) -> Result<Vec<Allocation>, StoreError> {
        let conn = self.db();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {ALLOCATION_COLUMNS} FROM allocations WHERE released_at IS NULL \
             AND (workload_id = ?1 OR (workload_id IS NULL AND id = ?1)) ORDER BY created_at, id"
        ))?;
        let rows = stmt.query_map(params![workload_id], from_row)?;
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
