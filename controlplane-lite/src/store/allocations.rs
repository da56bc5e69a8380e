//! Allocations: GPUs (atoms) of one node booked for one request. An active allocation owns one
//! `allocation_atoms` row per GPU; releasing it deletes those rows and stamps `released_at`.

use rusqlite::{Connection, Row, params};
use serde::Serialize;

use super::StoreError;

/// One allocation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
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

fn from_row(row: &Row<'_>) -> rusqlite::Result<Allocation> {
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

fn atoms_of(conn: &Connection, allocation_id: &str) -> Result<Vec<String>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT atom FROM allocation_atoms WHERE allocation_id = ?1 ORDER BY atom",
    )?;
    let rows = stmt.query_map(params![allocation_id], |r| r.get(0))?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// Inserts an active allocation and its atoms. The atoms' primary key `(node_id, atom)` refuses a
/// GPU that is already booked.
pub fn insert(conn: &Connection, a: &Allocation) -> Result<(), StoreError> {
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

/// One allocation with its atoms.
pub fn get(conn: &Connection, id: &str) -> Result<Option<Allocation>, StoreError> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {ALLOCATION_COLUMNS} FROM allocations WHERE id = ?1"
    ))?;
    let mut rows = stmt.query(params![id])?;
    let Some(row) = rows.next()? else {
        return Ok(None);
    };
    let mut a = from_row(row)?;
    a.atoms = atoms_of(conn, &a.id)?;
    Ok(Some(a))
}

/// Filters of [`list`]; `None` matches everything.
#[derive(Debug, Clone, Default)]
pub struct AllocationFilter {
    pub pool_id: Option<String>,
    pub node_id: Option<String>,
    /// Only allocations not yet released.
    pub active_only: bool,
}

/// Allocations matching `f`, oldest first, with atoms.
pub fn list(conn: &Connection, f: &AllocationFilter) -> Result<Vec<Allocation>, StoreError> {
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

/// Marks `id` released and frees its atoms.
pub fn release(conn: &Connection, id: &str, at: i64, by: &str) -> Result<(), StoreError> {
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

/// The node's booked atoms.
pub fn booked_atoms(conn: &Connection, node_id: &str) -> Result<Vec<String>, StoreError> {
    let mut stmt =
        conn.prepare_cached("SELECT atom FROM allocation_atoms WHERE node_id = ?1 ORDER BY atom")?;
    let rows = stmt.query_map(params![node_id], |r| r.get(0))?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// How many allocations on the node are still active.
pub fn active_count(conn: &Connection, node_id: &str) -> Result<u64, StoreError> {
    let n: i64 = conn.query_row(
        "SELECT COUNT(*) FROM allocations WHERE node_id = ?1 AND released_at IS NULL",
        params![node_id],
        |r| r.get(0),
    )?;
    Ok(u64::try_from(n).unwrap_or(0))
}
