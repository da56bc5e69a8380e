//! When a node is schedulable (spec "When a node is schedulable"): seven checks, in the spec's
//! order, in Rust ([`capacity_bucket`]). The first failing check names the capacity bucket the
//! node's GPUs are reported in. The same predicate in SQL lives with every other query in the
//! store (`cpl-store`, which `nodes.list` and the placer use); `schedulable_tests` checks both
//! agree on every combination.

pub use bc_protocol::CapacityBucket;
use bc_protocol::{Connectivity, NodeRole, ProvisionState, Trust};
use cpl_store::NodeRecord;

/// The facts the predicate reads: the node's axes plus its pool's owner (for tenant-owned nodes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedulingFacts<'a> {
    pub role: NodeRole,
    pub trust: Trust,
    pub owner_tenant_id: Option<&'a str>,
    /// `pools.owner_tenant_id` of the node's pool; `None` when the pool has no owner or the node
    /// has no pool.
    pub pool_owner_tenant_id: Option<&'a str>,
    pub maintenance: bool,
    pub cordoned: bool,
    pub provision_state: ProvisionState,
    pub observed_generation: u64,
    pub connectivity: Connectivity,
    pub no_schedule_reasons_empty: bool,
}

impl<'a> SchedulingFacts<'a> {
    /// The facts of `node` in a pool owned by `pool_owner_tenant_id`.
    pub fn of(node: &'a NodeRecord, pool_owner_tenant_id: Option<&'a str>) -> Self {
        SchedulingFacts {
            role: node.role,
            trust: node.trust,
            owner_tenant_id: node.owner_tenant_id.as_deref(),
            pool_owner_tenant_id,
            maintenance: node.maintenance,
            cordoned: node.cordoned,
            provision_state: node.provision_state,
            observed_generation: node.observed_generation,
            connectivity: node.connectivity,
            no_schedule_reasons_empty: node.no_schedule_reasons.is_empty(),
        }
    }
}

/// The seven checks in the spec's order; the first that fails names the bucket.
pub fn capacity_bucket(f: &SchedulingFacts<'_>) -> CapacityBucket {
    // 1. role is host.
    if f.role != NodeRole::Host {
        return CapacityBucket::Excluded;
    }
    // 2. trust is platform, or tenant-owned in its owner's pool. A tenant-controlled node adds no
    //    capacity at all.
    let in_owners_pool = matches!((f.owner_tenant_id, f.pool_owner_tenant_id),
        (Some(node), Some(pool)) if node == pool);
    let trusted = f.trust == Trust::Platform || (f.trust == Trust::TenantOwned && in_owners_pool);
    if !trusted {
        return CapacityBucket::Excluded;
    }
    // 3. not in maintenance and not cordoned.
    if f.maintenance || f.cordoned {
        return CapacityBucket::Maintenance;
    }
    // 4. provisionState is adopted or deployed.
    if !matches!(
        f.provision_state,
        ProvisionState::Adopted | ProvisionState::Deployed
    ) {
        return CapacityBucket::Provisioning;
    }
    // 5. observedGeneration >= 1: the node converged its first spec.
    if f.observed_generation < 1 {
        return CapacityBucket::Provisioning;
    }
    // 6. connectivity is connected.
    if f.connectivity != Connectivity::Connected {
        return CapacityBucket::Unreachable;
    }
    // 7. noScheduleReasons is empty.
    if !f.no_schedule_reasons_empty {
        return CapacityBucket::Unhealthy;
    }
    CapacityBucket::Available
}

/// Whether placement may book the node's atoms.
pub fn is_schedulable(f: &SchedulingFacts<'_>) -> bool {
    capacity_bucket(f) == CapacityBucket::Available
}
