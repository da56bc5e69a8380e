//! The schedulable predicate in SQL (spec "When a node is schedulable": "The same predicate exists
//! in SQL (schedulableSql), and the placer applies it to rows it locks"). The core crate holds the
//! Rust form (`cpl_core::schedulable`); a test there checks both agree on every combination.
//!
//! The SQL is written against `nodes n LEFT JOIN pools p ON p.id = n.pool_id` and uses only
//! portable SQL (CASE, IN, IS NOT NULL); booleans are the schema's `INTEGER` 0/1 columns and an
//! empty `noScheduleReasons` is the exact text `[]` (every writer stores the sorted JSON array).

use bc_protocol::{CapacityBucket, Connectivity, NodeRole, ProvisionState, Trust};

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
/// for a `WHERE` clause: true exactly when the Rust predicate says schedulable.
pub(crate) fn schedulable_sql() -> String {
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

/// The bucket as a SQL `CASE` expression (same join as `schedulable_sql`), yielding
/// `CapacityBucket::as_str` spellings, checks in the spec's order.
pub(crate) fn capacity_bucket_sql() -> String {
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
