//! When a node is schedulable (spec "When a node is schedulable"): seven checks, in the spec's
//! order, in Rust ([`capacity_bucket`]) and in SQL ([`schedulable_sql`], [`capacity_bucket_sql`]).
//! The first failing check names the capacity bucket the node's GPUs are reported in.
//!
//! The SQL is written against `nodes n LEFT JOIN pools p ON p.id = n.pool_id` and uses only
//! portable SQL (CASE, IN, IS NOT NULL); booleans are the schema's `INTEGER` 0/1 columns and an
//! empty `noScheduleReasons` is the exact text `[]` (every writer stores the sorted JSON array).

use bc_protocol::{Connectivity, NodeRole, ProvisionState, Trust};
use serde::Serialize;

use crate::store::nodes::NodeRecord;

/// The bucket of a pool's capacity a node's GPUs count in (spec "When a node is schedulable").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum CapacityBucket {
    /// Not a host, or its trust keeps its hardware out of this pool.
    Excluded,
    /// In maintenance or cordoned.
    Maintenance,
    /// Not `adopted`/`deployed`, or has not converged its first spec.
    Provisioning,
    /// Connectivity is anything but `connected`.
    Unreachable,
    /// Some `noScheduleReasons` entry holds.
    Unhealthy,
    /// Schedulable.
    Available,
}

impl CapacityBucket {
    /// Every bucket, in check order.
    pub const ALL: &'static [CapacityBucket] = &[
        CapacityBucket::Excluded,
        CapacityBucket::Maintenance,
        CapacityBucket::Provisioning,
        CapacityBucket::Unreachable,
        CapacityBucket::Unhealthy,
        CapacityBucket::Available,
    ];

    /// The spelling used in JSON and in [`capacity_bucket_sql`].
    pub const fn as_str(self) -> &'static str {
        match self {
            CapacityBucket::Excluded => "excluded",
            CapacityBucket::Maintenance => "maintenance",
            CapacityBucket::Provisioning => "provisioning",
            CapacityBucket::Unreachable => "unreachable",
            CapacityBucket::Unhealthy => "unhealthy",
            CapacityBucket::Available => "available",
        }
    }

    /// Parses [`CapacityBucket::as_str`]'s spelling.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|b| b.as_str() == s)
    }
}

impl std::fmt::Display for CapacityBucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

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

/// Check 2 as SQL. Both owner columns are tested for NULL first so the comparison is never
/// NULL (a NULL inside `NOT (...)` would silently pass the check).
fn trusted_sql() -> String {
    format!(
        "(n.trust = '{platform}' OR (n.trust = '{owned}' AND n.owner_tenant_id IS NOT NULL \
         AND p.owner_tenant_id IS NOT NULL AND p.owner_tenant_id = n.owner_tenant_id))",
        platform = Trust::Platform.as_str(),
        owned = Trust::TenantOwned.as_str(),
    )
}

fn settled_sql() -> String {
    format!(
        "n.provision_state IN ('{}', '{}')",
        ProvisionState::Adopted.as_str(),
        ProvisionState::Deployed.as_str()
    )
}

/// The predicate as a boolean SQL expression over `nodes n LEFT JOIN pools p ON p.id = n.pool_id`,
/// for a `WHERE` clause: true exactly when [`is_schedulable`] is.
pub fn schedulable_sql() -> String {
    format!(
        "(n.role = '{host}' AND {trusted} AND n.maintenance = 0 AND n.cordoned = 0 AND {settled} \
         AND n.observed_generation >= 1 AND n.connectivity = '{connected}' \
         AND n.no_schedule_reasons = '[]')",
        host = NodeRole::Host.as_str(),
        trusted = trusted_sql(),
        settled = settled_sql(),
        connected = Connectivity::Connected.as_str(),
    )
}

/// The bucket as a SQL `CASE` expression (same join as [`schedulable_sql`]), yielding
/// [`CapacityBucket::as_str`] spellings, checks in the spec's order.
pub fn capacity_bucket_sql() -> String {
    format!(
        "(CASE \
         WHEN n.role <> '{host}' THEN '{excluded}' \
         WHEN NOT {trusted} THEN '{excluded}' \
         WHEN n.maintenance <> 0 OR n.cordoned <> 0 THEN '{maintenance}' \
         WHEN NOT {settled} THEN '{provisioning}' \
         WHEN n.observed_generation < 1 THEN '{provisioning}' \
         WHEN n.connectivity <> '{connected}' THEN '{unreachable}' \
         WHEN n.no_schedule_reasons <> '[]' THEN '{unhealthy}' \
         ELSE '{available}' END)",
        host = NodeRole::Host.as_str(),
        trusted = trusted_sql(),
        settled = settled_sql(),
        connected = Connectivity::Connected.as_str(),
        excluded = CapacityBucket::Excluded.as_str(),
        maintenance = CapacityBucket::Maintenance.as_str(),
        provisioning = CapacityBucket::Provisioning.as_str(),
        unreachable = CapacityBucket::Unreachable.as_str(),
        unhealthy = CapacityBucket::Unhealthy.as_str(),
        available = CapacityBucket::Available.as_str(),
    )
}
