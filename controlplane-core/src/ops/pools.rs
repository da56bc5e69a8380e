//! `pools.*`: create, get, list, update, delete (capacity is in [`crate::placer`]).
//! Kind, agent, site and owner are fixed at creation: the nodes in the pool derived role,
//! adapter and trust from them.

use bc_protocol::{PoolAgent, PoolKind, SiteKind};
use cpl_store::{Acceptance, HardwareProfile, Pool, Reader, Tx, now_ms};

use super::new_id;
use crate::error::OpError;
use crate::text::{Id, Name};

/// `pools.create` request.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NewPool {
    pub name: Name,
    pub kind: PoolKind,
    #[serde(default = "default_agent")]
    #[schema(default = "bcd")]
    pub agent: PoolAgent,
    #[serde(default)]
    pub site_id: Option<Id>,
    #[serde(default)]
    pub owner_tenant_id: Option<Id>,
    #[serde(default, deserialize_with = "crate::text::profile")]
    pub hardware_profile: HardwareProfile,
    /// How the pool accepts joining nodes (`crate::acceptance`); absent keys take the kind's
    /// defaults.
    #[serde(default)]
    pub acceptance: Acceptance,
}

fn default_agent() -> PoolAgent {
    PoolAgent::Bcd
}

/// `pools.create`. A pool on a custom site belongs to the site's tenant (given or not); naming
/// another owner is `INVALID_ARGUMENT`.
pub fn create(tx: &Tx<'_>, new: &NewPool) -> Result<Pool, OpError> {
    if new.name.trim().is_empty() {
        return Err(OpError::InvalidArgument("pool name is required".into()));
    }
    crate::acceptance::check_settings(&new.acceptance)?;
    let mut owner = new.owner_tenant_id.clone().map(Id::into_string);
    if let Some(site_id) = &new.site_id {
        let site = tx.site(site_id)?.ok_or_else(|| OpError::NotFound {
            kind: "site",
            id: site_id.to_string(),
        })?;
        if site.kind == SiteKind::Custom {
            if owner.is_some() && owner != site.owner_tenant_id {
                return Err(OpError::InvalidArgument(format!(
                    "site {site_id} belongs to another tenant than ownerTenantId"
                )));
            }
            owner = site.owner_tenant_id;
        }
    }
    let pool = Pool {
        id: new_id("pool"),
        site_id: new.site_id.clone().map(Id::into_string),
        name: new.name.trim().to_owned(),
        kind: new.kind,
        agent: new.agent,
        owner_tenant_id: owner,
        hardware_profile: new.hardware_profile.clone(),
        acceptance: new.acceptance,
        remediation: Default::default(),
        conditions: Vec::new(),
        remediation_resumed_at: None,
        remediation_trips: 0,
        version: 1,
        created_at: now_ms(),
    };
    tx.insert_pool(&pool)?;
    Ok(pool)
}

/// `pools.get`.
pub fn get(conn: &Reader<'_>, id: &str) -> Result<Pool, OpError> {
    conn.pool(id)?.ok_or_else(|| OpError::NotFound {
        kind: "pool",
        id: id.to_owned(),
    })
}

/// `pools.list`.
pub fn list(conn: &Reader<'_>) -> Result<Vec<Pool>, OpError> {
    Ok(conn.pools()?)
}

fn check_version(pool: &Pool, expected: u64) -> Result<(), OpError> {
    if pool.version == expected {
        Ok(())
    } else {
        Err(OpError::Conflict {
            kind: "pool",
            id: pool.id.clone(),
            expected,
            actual: pool.version,
        })
    }
}

/// `pools.update`: name, hardware profile and (when given) acceptance rules. Nodes already in
/// the pool keep the drivers they inherited at join.
pub fn update(
    tx: &Tx<'_>,
    id: &str,
    expected_version: u64,
    name: &str,
    profile: &HardwareProfile,
    acceptance: Option<&Acceptance>,
) -> Result<Pool, OpError> {
    if name.trim().is_empty() {
        return Err(OpError::InvalidArgument("pool name is required".into()));
    }
    if let Some(a) = acceptance {
        crate::acceptance::check_settings(a)?;
    }
    let pool = get(tx, id)?;
    check_version(&pool, expected_version)?;
    let acceptance = acceptance.copied().unwrap_or(pool.acceptance);
    tx.update_pool(id, expected_version, name.trim(), profile, &acceptance)?;
    get(tx, id)
}

/// `pools.delete`: refused (`INVALID_STATE`) while nodes are in the pool.
pub fn delete(tx: &Tx<'_>, id: &str, expected_version: u64) -> Result<Pool, OpError> {
    let pool = get(tx, id)?;
    check_version(&pool, expected_version)?;
    let n = tx.pool_node_count(id)?;
    if n > 0 {
        return Err(OpError::InvalidState(format!(
            "pool {id} still has {n} node(s)"
        )));
    }
    tx.delete_pool(id, expected_version)?;
    Ok(pool)
}
