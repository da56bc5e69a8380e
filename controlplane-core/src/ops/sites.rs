//! `sites.*`: create, get, list, rename, delete. A `custom` site belongs to one tenant (its
//! nodes are `tenant-owned`); a `platform` site belongs to nobody.

use bc_protocol::SiteKind;
use cpl_store::{Reader, Site, Tx, now_ms};

use super::new_id;
use crate::error::OpError;
use crate::text::{Id, Name};

/// `sites.create` request.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NewSite {
    pub name: Name,
    pub kind: SiteKind,
    #[serde(default)]
    pub owner_tenant_id: Option<Id>,
}

/// `sites.create`.
pub fn create(tx: &Tx<'_>, new: &NewSite) -> Result<Site, OpError> {
    if new.name.trim().is_empty() {
        return Err(OpError::InvalidArgument("site name is required".into()));
    }
    match (new.kind, &new.owner_tenant_id) {
        (SiteKind::Custom, None) => {
            return Err(OpError::InvalidArgument(
                "a custom site needs ownerTenantId".into(),
            ));
        }
        (SiteKind::Platform, Some(_)) => {
            return Err(OpError::InvalidArgument(
                "a platform site has no ownerTenantId".into(),
            ));
        }
        _ => {}
    }
    let site = Site {
        id: new_id("site"),
        name: new.name.trim().to_owned(),
        kind: new.kind,
        owner_tenant_id: new.owner_tenant_id.clone().map(Id::into_string),
        version: 1,
        created_at: now_ms(),
    };
    tx.insert_site(&site)?;
    Ok(site)
}

/// `sites.get`.
pub fn get(conn: &Reader<'_>, id: &str) -> Result<Site, OpError> {
    conn.site(id)?.ok_or_else(|| OpError::NotFound {
        kind: "site",
        id: id.to_owned(),
    })
}

/// `sites.list`.
pub fn list(conn: &Reader<'_>) -> Result<Vec<Site>, OpError> {
    Ok(conn.sites()?)
}

fn check_version(site: &Site, expected: u64) -> Result<(), OpError> {
    if site.version == expected {
        Ok(())
    } else {
        Err(OpError::Conflict {
            kind: "site",
            id: site.id.clone(),
            expected,
            actual: site.version,
        })
    }
}

/// `sites.rename`.
pub fn rename(tx: &Tx<'_>, id: &str, expected_version: u64, name: &str) -> Result<Site, OpError> {
    if name.trim().is_empty() {
        return Err(OpError::InvalidArgument("site name is required".into()));
    }
    let site = get(tx, id)?;
    check_version(&site, expected_version)?;
    tx.rename_site(id, expected_version, name.trim())?;
    get(tx, id)
}

/// `sites.delete`: refused (`INVALID_STATE`) while pools or nodes reference the site.
pub fn delete(tx: &Tx<'_>, id: &str, expected_version: u64) -> Result<Site, OpError> {
    let site = get(tx, id)?;
    check_version(&site, expected_version)?;
    let (pools, nodes) = tx.site_references(id)?;
    if pools > 0 || nodes > 0 {
        return Err(OpError::InvalidState(format!(
            "site {id} still has {pools} pool(s) and {nodes} node(s)"
        )));
    }
    tx.delete_site(id, expected_version)?;
    Ok(site)
}
