//! Where a joining node lands and what follows from it (spec "Identity, ownership and
//! generations"): `role` from the pool kind, `trust` from the site kind, `adapter` from the pool's
//! agent, `drivers` from the pool's hardware profile. JoinService calls [`placement_for_join`]
//! with what the join token is bound to.

use bc_protocol::{Adapter, NodeRole, PoolAgent, PoolKind, SiteKind, Trust};
use cpl_store::{Pool, Reader, Site};
use serde::Serialize;

use crate::error::OpError;

/// The role a node gets: `host` in a `metal-host`, `vps-host` or `provider` pool, `dedicated` in
/// a `metal-dedicated` pool, `site` for a site agent, `unassigned` with no pool.
pub fn role_for(pool_kind: Option<PoolKind>, site_agent: bool) -> NodeRole {
    if site_agent {
        return NodeRole::Site;
    }
    match pool_kind {
        Some(PoolKind::MetalHost | PoolKind::VpsHost | PoolKind::Provider) => NodeRole::Host,
        Some(PoolKind::MetalDedicated) => NodeRole::Dedicated,
        None => NodeRole::Unassigned,
    }
}

/// The trust a node gets at join: `tenant-owned` on a tenant's `custom` site, else `platform`.
/// (`tenant-controlled` comes only from a dedicated-root lease.)
pub fn trust_for(site_kind: Option<SiteKind>) -> Trust {
    match site_kind {
        Some(SiteKind::Custom) => Trust::TenantOwned,
        Some(SiteKind::Platform) | None => Trust::Platform,
    }
}

/// The adapter: `provider-api/v1` for pools with `agent: none`, else `bcd/v1`.
pub fn adapter_for(agent: Option<PoolAgent>) -> Adapter {
    match agent {
        Some(PoolAgent::None) => Adapter::ProviderApiV1,
        Some(PoolAgent::Bcd) | None => Adapter::BcdV1,
    }
}

/// Everything a new node inherits from its site and pool.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    pub site_id: Option<String>,
    pub pool_id: Option<String>,
    /// The custom site's tenant, else the pool's.
    pub owner_tenant_id: Option<String>,
    pub role: NodeRole,
    pub trust: Trust,
    pub adapter: Adapter,
    /// Driver per concern from the pool's hardware profile.
    pub drivers: serde_json::Map<String, serde_json::Value>,
}

/// Derives a [`Placement`] from the pool and site objects.
pub fn placement(pool: Option<&Pool>, site: Option<&Site>, site_agent: bool) -> Placement {
    let drivers = pool
        .map(|p| {
            p.hardware_profile
                .drivers
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                .collect()
        })
        .unwrap_or_default();
    let owner = match site {
        Some(s) if s.kind == SiteKind::Custom => s.owner_tenant_id.clone(),
        _ => pool.and_then(|p| p.owner_tenant_id.clone()),
    };
    Placement {
        site_id: site
            .map(|s| s.id.clone())
            .or_else(|| pool.and_then(|p| p.site_id.clone())),
        pool_id: if site_agent {
            None
        } else {
            pool.map(|p| p.id.clone())
        },
        owner_tenant_id: owner,
        role: role_for(pool.map(|p| p.kind).filter(|_| !site_agent), site_agent),
        trust: trust_for(site.map(|s| s.kind)),
        adapter: adapter_for(pool.map(|p| p.agent)),
        drivers,
    }
}

/// The placement of a node joining with a token bound to `pool_id` and/or `site_id`; the site is
/// the pool's when only the pool is given. A site agent (`site_agent`) gets role `site` and no
/// pool.
///
/// Errors: `NOT_FOUND` for a pool or site that no longer exists; `INVALID_ARGUMENT` when the
/// token's pool lies on another site than its site.
pub fn placement_for_join(
    conn: &Reader<'_>,
    pool_id: Option<&str>,
    site_id: Option<&str>,
    site_agent: bool,
) -> Result<Placement, OpError> {
    let pool = pool_id
        .map(|id| {
            conn.pool(id)?.ok_or_else(|| OpError::NotFound {
                kind: "pool",
                id: id.to_owned(),
            })
        })
        .transpose()?;
    let site_id = site_id
        .map(str::to_owned)
        .or_else(|| pool.as_ref().and_then(|p| p.site_id.clone()));
    if let (Some(p), Some(s)) = (&pool, &site_id)
        && let Some(ps) = p.site_id.as_deref().filter(|ps| ps != s)
    {
        return Err(OpError::InvalidArgument(format!(
            "pool {} is on site {ps}, not {s}",
            p.id
        )));
    }
    let site = site_id
        .as_deref()
        .map(|id| {
            conn.site(id)?.ok_or_else(|| OpError::NotFound {
                kind: "site",
                id: id.to_owned(),
            })
        })
        .transpose()?;
    Ok(placement(pool.as_ref(), site.as_ref(), site_agent))
}
