//! The placer (`allocations.create`, `allocations.release`) and pool capacity (`pools.capacity`).
//!
//! `create` reads the pool's nodes through the SQL predicate (the store's
//! `Tx::lock_schedulable_nodes`) inside the caller's write transaction, so the rows it books are
//! the rows it checked: a cordon committed before it is seen, one committed after it waits for the
//! lock (SQLite: the database write lock of `BEGIN IMMEDIATE`; PostgreSQL: `FOR UPDATE OF n`).

use std::collections::{BTreeMap, BTreeSet};

use bc_protocol::CapacityBucket;
use cpl_store::{Allocation, AllocationFilter, NewEvent, Pool, Reader, Tx, now_ms};
use serde::Serialize;

use crate::edit::Edit;
use crate::error::OpError;
use crate::inventory::gpu_atoms;
use crate::ops::{new_id, nodes::REASON_DRAINING};

/// `allocations.create` request.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AllocationRequest {
    pub pool_id: crate::text::Id,
    /// GPUs wanted on one node, at least 1.
    pub gpus: u32,
    #[serde(default)]
    pub tenant_id: Option<crate::text::Id>,
    /// The workload the allocation belongs to: a job over several nodes books one allocation
    /// per node with one `workloadId`, so health remediation can tell the workload's fault (the
    /// same application-class XID on several of its nodes) from a node's. Absent: the
    /// allocation is its own workload.
    #[serde(default)]
    pub workload_id: Option<crate::text::Id>,
}

fn pool_or_not_found(conn: &Reader<'_>, id: &str) -> Result<Pool, OpError> {
    conn.pool(id)?.ok_or_else(|| OpError::NotFound {
        kind: "pool",
        id: id.to_owned(),
    })
}

/// Free atoms of every schedulable node of `pool_id`, by node id. Must run in a write
/// transaction for its answer to hold until commit.
fn free_atoms(tx: &Tx<'_>, pool_id: &str) -> Result<Vec<(String, Vec<String>)>, OpError> {
    let rows = tx.lock_schedulable_nodes(pool_id)?;
    let mut out = Vec::with_capacity(rows.len());
    for (id, inv) in rows {
        // A corrupt inventory document books nothing rather than failing the whole pool.
        let inv = inv.as_deref().and_then(crate::inventory::parse);
        let booked: BTreeSet<String> = tx.booked_atoms(&id)?.into_iter().collect();
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
pub fn create(tx: &Tx<'_>, req: &AllocationRequest, actor: &str) -> Result<Allocation, OpError> {
    if req.gpus == 0 {
        return Err(OpError::InvalidArgument("gpus must be at least 1".into()));
    }
    let pool = pool_or_not_found(tx, &req.pool_id)?;
    if let (Some(owner), Some(tenant)) = (&pool.owner_tenant_id, &req.tenant_id)
        && owner.as_str() != tenant.as_str()
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
            pool_id: req.pool_id.to_string(),
            requested: req.gpus,
            largest_free: u32::try_from(largest_free).unwrap_or(u32::MAX),
        });
    };
    let now = now_ms();
    let allocation = Allocation {
        id: new_id("alloc"),
        pool_id: req.pool_id.to_string(),
        node_id: node_id.clone(),
        gpus: req.gpus,
        atoms: free.into_iter().take(want).collect(),
        tenant_id: req.tenant_id.clone().map(crate::text::Id::into_string),
        created_by: actor.to_owned(),
        created_at: now,
        released_at: None,
        released_by: None,
        workload_id: req.workload_id.clone().map(crate::text::Id::into_string),
        release_reason: None,
        workload_fault: None,
    };
    tx.insert_allocation(&allocation)?;
    tx.record_event(&NewEvent {
        node_id: &node_id,
        at: now,
        kind: "allocation",
        from: None,
        to: Some(&allocation.id),
        actor,
        message: &format!("booked {}", allocation.atoms.join(",")),
    })?;
    Ok(allocation)
}

/// `allocations.release`: frees the atoms; when it was the node's last allocation and the node
/// is draining, removes `draining` in the same transaction.
///
/// Errors: `NOT_FOUND`; `INVALID_STATE` if already released.
pub fn release(tx: &Tx<'_>, allocation_id: &str, actor: &str) -> Result<Allocation, OpError> {
    release_for(tx, allocation_id, actor, None)
}

/// [`release`] by the control plane, `reason` recorded on the allocation and in the node's
/// event (health remediation evicting it).
pub fn release_for(
    tx: &Tx<'_>,
    allocation_id: &str,
    actor: &str,
    reason: Option<&str>,
) -> Result<Allocation, OpError> {
    let a = tx
        .allocation(allocation_id)?
        .ok_or_else(|| OpError::NotFound {
            kind: "allocation",
            id: allocation_id.to_owned(),
        })?;
    if a.released_at.is_some() {
        return Err(OpError::InvalidState(format!(
            "allocation {allocation_id} is already released"
        )));
    }
    let now = now_ms();
    tx.release_allocation(allocation_id, now, actor, reason)?;
    if tx.node_exists(&a.node_id)? {
        tx.record_event(&NewEvent {
            node_id: &a.node_id,
            at: now,
            kind: "allocation",
            from: Some(allocation_id),
            to: None,
            actor,
            message: &match reason {
                Some(r) => format!("released {}: {r}", a.atoms.join(",")),
                None => format!("released {}", a.atoms.join(",")),
            },
        })?;
        if tx.active_allocation_count(&a.node_id)? == 0 {
            let mut edit = Edit::begin(tx, &a.node_id, None, actor)?;
            edit.set_reason(REASON_DRAINING, false);
            edit.save(tx)?;
        }
    }
    Ok(Allocation {
        atoms: Vec::new(),
        released_at: Some(now),
        released_by: Some(actor.to_owned()),
        release_reason: reason.map(str::to_owned),
        ..a
    })
}

/// `allocations.get`.
pub fn get(conn: &Reader<'_>, id: &str) -> Result<Allocation, OpError> {
    conn.allocation(id)?.ok_or_else(|| OpError::NotFound {
        kind: "allocation",
        id: id.to_owned(),
    })
}

/// `allocations.list`.
pub fn list(conn: &Reader<'_>, f: &AllocationFilter) -> Result<Vec<Allocation>, OpError> {
    Ok(conn.allocations(f)?)
}

/// `pools.capacity`: GPU counts of a pool per capacity bucket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
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
pub fn capacity(conn: &Reader<'_>, pool_id: &str) -> Result<PoolCapacity, OpError> {
    pool_or_not_found(conn, pool_id)?;
    let rows = conn.capacity_rows(pool_id)?;
    let mut cap = PoolCapacity {
        pool_id: pool_id.to_owned(),
        total: 0,
        buckets: CapacityBucket::ALL.iter().map(|b| (*b, 0)).collect(),
        allocated: 0,
        free: 0,
    };
    for (id, inv, bucket) in rows {
        let inv = inv.as_deref().and_then(crate::inventory::parse);
        let atoms = u32::try_from(gpu_atoms(inv.as_ref()).len()).unwrap_or(u32::MAX);
        let booked = u32::try_from(conn.booked_atoms(&id)?.len()).unwrap_or(0);
        cap.total = cap.total.saturating_add(atoms);
        *cap.buckets.entry(bucket).or_default() += atoms;
        cap.allocated = cap.allocated.saturating_add(booked);
        if bucket == CapacityBucket::Available {
            cap.free = cap.free.saturating_add(atoms.saturating_sub(booked));
        }
    }
    Ok(cap)
}
