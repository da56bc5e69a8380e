//! `sites.*`: create, get, list, rename, delete. A `custom` site belongs to one tenant (its
//! nodes are `tenant-owned`); a `platform` site belongs to nobody.

use rusqlite::Connection;

use super::new_id;
use crate::model::error::OpError;
use crate::model::kinds::SiteKind;
use crate::store::now_ms;
use crate::store::sites::{self, Site};

/// `sites.create` request.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NewSite {
    pub name: String,
    pub kind: SiteKind,
    #[serde(default)]
    pub owner_tenant_id: Option<String>,
}

/// `sites.create`.
pub fn create(tx: &Connection, new: &NewSite) -> Result<Site, OpError> {
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
        owner_tenant_id: new.owner_tenant_id.clone(),
        version: 1,
        created_at: now_ms(),
    };
    sites::insert(tx, &site)?;
    Ok(site)
}

/// `sites.get`.
pub fn get(conn: &Connection, id: &str) -> Result<Site, OpError> {
    sites::get(conn, id)?.ok_or_else(|| OpError::NotFound {
        kind: "site",
        id: id.to_owned(),
    })
}

/// `sites.list`.
pub fn list(conn: &Connection) -> Result<Vec<Site>, OpError> {
    Ok(sites::list(conn)?)
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
pub fn rename(
    tx: &Connection,
    id: &str,
    expected_version: u64,
    name: &str,
) -> Result<Site, OpError> {
    if name.trim().is_empty() {
        return Err(OpError::InvalidArgument("site name is required".into()));
    }
    let site = get(tx, id)?;
    check_version(&site, expected_version)?;
    sites::rename(tx, id, expected_version, name.trim())?;
    get(tx, id)
}

/// `sites.delete`: refused (`INVALID_STATE`) while pools or nodes reference the site.
pub fn delete(tx: &Connection, id: &str, expected_version: u64) -> Result<Site, OpError> {
    let site = get(tx, id)?;
    check_version(&site, expected_version)?;
    let (pools, nodes) = sites::references(tx, id)?;
    if pools > 0 || nodes > 0 {
        return Err(OpError::InvalidState(format!(
            "site {id} still has {pools} pool(s) and {nodes} node(s)"
        )));
    }
    sites::delete(tx, id, expected_version)?;
    Ok(site)
}
