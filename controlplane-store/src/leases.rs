//! Dedicated-root leases: while one is active on a node the node's trust is `tenant-controlled`
//! (spec "Identity, ownership and generations": trust). At most one active lease per node (a
//! partial unique index).

use crate::db::Row;
use crate::params;
use serde::Serialize;

use super::{Reader, StoreError, Tx, parse_enum};
use bc_protocol::Trust;

/// One lease, active while `ended_at` is `None`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct DedicatedRootLease {
    pub id: String,
    pub node_id: String,
    pub tenant_id: String,
    /// The node's trust before the lease, restored when it ends.
    pub trust_before: Trust,
    /// Milliseconds since the Unix epoch.
    pub started_at: i64,
    pub started_by: String,
    pub ended_at: Option<i64>,
    pub ended_by: Option<String>,
}

const LEASE_COLUMNS: &str =
    "id, node_id, tenant_id, trust_before, started_at, started_by, ended_at, ended_by";

fn from_row(row: &Row<'_>) -> Result<DedicatedRootLease, StoreError> {
    let trust: String = row.get(3)?;
    Ok(DedicatedRootLease {
        id: row.get(0)?,
        node_id: row.get(1)?,
        tenant_id: row.get(2)?,
        trust_before: parse_enum("dedicated_root_leases.trust_before", &trust)?,
        started_at: row.get(4)?,
        started_by: row.get(5)?,
        ended_at: row.get(6)?,
        ended_by: row.get(7)?,
    })
}

impl Tx<'_> {
    /// Inserts an active lease.
    pub fn insert_lease(&self, lease: &DedicatedRootLease) -> Result<(), StoreError> {
        self.db().execute(
            "INSERT INTO dedicated_root_leases (id, node_id, tenant_id, trust_before, started_at, \
             started_by) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![
                lease.id,
                lease.node_id,
                lease.tenant_id,
                lease.trust_before.as_str(),
                lease.started_at,
                lease.started_by
            ],
        )?;
        Ok(())
    }

    /// Ends the lease `id`.
    pub fn end_lease(&self, id: &str, at: i64, by: &str) -> Result<(), StoreError> {
        self.db().execute(
            "UPDATE dedicated_root_leases SET ended_at = ?2, ended_by = ?3 WHERE id = ?1",
            params![id, at, by],
        )?;
        Ok(())
    }
}

impl Reader<'_> {
    /// The node's active lease, if any.
    pub fn active_lease(&self, node_id: &str) -> Result<Option<DedicatedRootLease>, StoreError> {
        let mut stmt = self.db().prepare_cached(&format!(
            "SELECT {LEASE_COLUMNS} FROM dedicated_root_leases WHERE node_id = ?1 AND ended_at IS NULL"
        ))?;
        stmt.query_map(params![node_id], from_row)?
            .next()
            .transpose()
    }
}
