//! The placer (`allocations.create`, `allocations.release`) and pool capacity (`pools.capacity`).
//!
//! `create` reads the pool's nodes through the SQL predicate ([`schedulable_sql`]) inside the
//! caller's write transaction, so the rows it books are the rows it checked: a cordon committed
//! before it is seen, one committed after it waits for the lock. On SQLite the lock is the
//! database write lock of `BEGIN IMMEDIATE` ([`super::ops::write_tx`]); on PostgreSQL the node
//! query takes `FOR UPDATE OF n`.

use std::collections::{BTreeMap, BTreeSet};

use rusqlite::{Connection, params};
use serde::Serialize;

use super::error::OpError;
use super::inventory::gpu_atoms;
use super::ops::{Edit, new_id, nodes::REASON_DRAINING};
use super::schedulable::{CapacityBucket, capacity_bucket_sql, schedulable_sql};
use crate::store::allocations::{self, Allocation, AllocationFilter};
use crate::store::{events, now_ms, pools};

/// `allocations.create` request.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AllocationRequest {
    pub pool_id: String,
    /// GPUs wanted on one node, at least 1.
    pub gpus: u32,
    #[serde(default)]
    pub tenant_id: Option<String>,
}

fn pool_or_not_found(conn: &Connection, id: &str) -> Result<pools::Pool, OpError> {
    pools::get(conn, id)?.ok_or_else(|| OpError::NotFound {
        kind: "pool",
        id: id.to_owned(),
    })
}

/// Free atoms of every schedulable node of `pool_id`, by node id. Must run in a write
/// transaction for its answer to hold until commit.
fn free_atoms(conn: &Connection, pool_id: &str) -> Result<Vec<(String, Vec<String>)>, OpError> {
    // PostgreSQL: append `FOR UPDATE OF n`.
    let sql = format!(
        "SELECT n.id, n.inventory FROM nodes n LEFT JOIN pools p ON p.id = n.pool_id \
         WHERE n.pool_id = ?1 AND {} ORDER BY n.id",
        schedulable_sql()
    );
    let mut stmt = conn.prepare_cached(&sql)?;
    let rows = stmt.query_map(params![pool_id], |r| {
        Ok((r.get::<_, String>(0)?, r.get::<_, Option<String>>(1)?))
    })?;
    let rows: Vec<(String, Option<String>)> = rows.collect::<Result<_, _>>()?;
    let mut out = Vec::with_capacity(rows.len());
    for (id, inv) in rows {
        // A corrupt inventory document books nothing rather than failing the whole pool.
        let inv: Option<serde_json::Value> = inv.and_then(|s| serde_json::from_str(&s).ok());
        let booked: BTreeSet<String> = allocations::booked_atoms(conn, &id)?.into_iter().collect();
        let free = gpu_atoms(inv.as_ref())
            .into_iter()
            .filter(|a| !booked.contains(a))
            .collect();
        out.push((id, free));
    }
    Ok(out)
}

/// `allocations.create`: books `gpus` atoms on one schedulable node of the pool, best fit (the
/// node with the fewest free atoms that still fits, then by id), and logs `allocation` on the
/// node.
///
/// Errors: `NOT_FOUND` (pool), `INVALID_ARGUMENT` (gpus 0), `PERMISSION_DENIED` (a tenant asking
/// for another tenant's pool), `UNAVAILABLE` when no node fits.
pub fn create(
    tx: &Connection,
    req: &AllocationRequest,
    actor: &str,
) -> Result<Allocation, OpError> {
    if req.gpus == 0 {
        return Err(OpError::InvalidArgument("gpus must be at least 1".into()));
    }
    let pool = pool_or_not_found(tx, &req.pool_id)?;
    if let (Some(owner), Some(tenant)) = (&pool.owner_tenant_id, &req.tenant_id)
        && owner != tenant
    {
        return Err(OpError::PermissionDenied(format!(
            "pool {} belongs to another tenant",
            pool.id
        )));
    }
    let want = req.gpus as usize;
    let candidates = free_atoms(tx, &req.pool_id)?;
    let largest_free = candidates.iter().map(|(_, f)| f.len()).max().unwrap_or(0);
    let Some((node_id, free)) = candidates
        .into_iter()
        .filter(|(_, f)| f.len() >= want)
        .min_by(|a, b| a.1.len().cmp(&b.1.len()).then_with(|| a.0.cmp(&b.0)))
    else {
        return Err(OpError::InsufficientCapacity {
            pool_id: req.pool_id.clone(),
            requested: req.gpus,
            largest_free: u32::try_from(largest_free).unwrap_or(u32::MAX),
        });
    };
    let now = now_ms();
    let allocation = Allocation {
        id: new_id("alloc"),
        pool_id: req.pool_id.clone(),
        node_id: node_id.clone(),
        gpus: req.gpus,
        atoms: free.into_iter().take(want).collect(),
        tenant_id: req.tenant_id.clone(),
        created_by: actor.to_owned(),
        created_at: now,
        released_at: None,
        released_by: None,
    };
    allocations::insert(tx, &allocation)?;
    events::record(
        tx,
        &node_id,
        now,
        "allocation",
        None,
        Some(&allocation.id),
        actor,
        &format!("booked {}", allocation.atoms.join(",")),
    )?;
    Ok(allocation)
}

/// `allocations.release`: frees the atoms; when it was the node's last allocation and the node
/// is draining, removes `draining` in the same transaction.
///
/// Errors: `NOT_FOUND`; `INVALID_STATE` if already released.
pub fn release(tx: &Connection, allocation_id: &str, actor: &str) -> Result<Allocation, OpError> {
    let a = allocations::get(tx, allocation_id)?.ok_or_else(|| OpError::NotFound {
        kind: "allocation",
        id: allocation_id.to_owned(),
    })?;
    if a.released_at.is_some() {
        return Err(OpError::InvalidState(format!(
            "allocation {allocation_id} is already released"
        )));
    }
    let now = now_ms();
    allocations::release(tx, allocation_id, now, actor)?;
    if crate::store::nodes::exists(tx, &a.node_id)? {
        events::record(
            tx,
            &a.node_id,
            now,
            "allocation",
            Some(allocation_id),
            None,
            actor,
            &format!("released {}", a.atoms.join(",")),
        )?;
        if allocations::active_count(tx, &a.node_id)? == 0 {
            let mut edit = Edit::begin_unversioned(tx, &a.node_id, actor)?;
            edit.set_reason(REASON_DRAINING, false);
            edit.save()?;
        }
    }
    Ok(Allocation {
        atoms: Vec::new(),
        released_at: Some(now),
        released_by: Some(actor.to_owned()),
        ..a
    })
}

/// `allocations.get`.
pub fn get(conn: &Connection, id: &str) -> Result<Allocation, OpError> {
    allocations::get(conn, id)?.ok_or_else(|| OpError::NotFound {
        kind: "allocation",
        id: id.to_owned(),
    })
}

/// `allocations.list`.
pub fn list(conn: &Connection, f: &AllocationFilter) -> Result<Vec<Allocation>, OpError> {
    Ok(allocations::list(conn, f)?)
}

/// `pools.capacity`: GPU counts of a pool per capacity bucket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolCapacity {
    pub pool_id: String,
    /// Every GPU of every node in the pool.
    pub total: u32,
    /// GPUs per bucket; every bucket is present (0 when empty).
    pub buckets: BTreeMap<CapacityBucket, u32>,
    /// GPUs booked by active allocations, whatever their node's bucket now.
    pub allocated: u32,
    /// Available GPUs not booked: what `allocations.create` can still hand out.
    pub free: u32,
}

/// Computes [`PoolCapacity`] with the SQL bucket expression. A tenant-owned node outside its
/// owner's pool and a tenant-controlled node count as `excluded`, never as capacity.
pub fn capacity(conn: &Connection, pool_id: &str) -> Result<PoolCapacity, OpError> {
    pool_or_not_found(conn, pool_id)?;
    let sql = format!(
        "SELECT n.id, n.inventory, {} FROM nodes n LEFT JOIN pools p ON p.id = n.pool_id \
         WHERE n.pool_id = ?1 ORDER BY n.id",
        capacity_bucket_sql()
    );
    let mut stmt = conn.prepare_cached(&sql)?;
    let rows = stmt.query_map(params![pool_id], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, Option<String>>(1)?,
            r.get::<_, String>(2)?,
        ))
    })?;
    let rows: Vec<(String, Option<String>, String)> = rows.collect::<Result<_, _>>()?;
    let mut cap = PoolCapacity {
        pool_id: pool_id.to_owned(),
        total: 0,
        buckets: CapacityBucket::ALL.iter().map(|b| (*b, 0)).collect(),
        allocated: 0,
        free: 0,
    };
    for (id, inv, bucket) in rows {
        let inv: Option<serde_json::Value> = inv.and_then(|s| serde_json::from_str(&s).ok());
        let atoms = u32::try_from(gpu_atoms(inv.as_ref()).len()).unwrap_or(u32::MAX);
        let booked = u32::try_from(allocations::booked_atoms(conn, &id)?.len()).unwrap_or(0);
        let bucket = CapacityBucket::parse(&bucket).unwrap_or(CapacityBucket::Excluded);
        cap.total = cap.total.saturating_add(atoms);
        *cap.buckets.entry(bucket).or_default() += atoms;
        cap.allocated = cap.allocated.saturating_add(booked);
        if bucket == CapacityBucket::Available {
            cap.free = cap.free.saturating_add(atoms.saturating_sub(booked));
        }
    }
    Ok(cap)
}
