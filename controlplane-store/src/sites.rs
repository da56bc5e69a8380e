//! The `sites` table: where nodes live. A `custom` site belongs to a tenant, and nodes that join
//! it are `tenant-owned` (spec "Identity, ownership and generations").

use crate::db::{OptionalExt, Row};
use crate::params;
use bc_protocol::SiteKind;
use serde::Serialize;

use super::{Reader, StoreError, Tx, parse_enum, sql_u64};

/// One site.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Site {
    pub id: String,
    pub name: String,
    pub kind: SiteKind,
    /// Set exactly for `custom` sites.
    pub owner_tenant_id: Option<String>,
    pub version: u64,
    /// Milliseconds since the Unix epoch.
    pub created_at: i64,
}

const SITE_COLUMNS: &str = "id, name, kind, owner_tenant_id, version, created_at";

fn from_row(row: &Row<'_>) -> Result<Site, StoreError> {
    let kind: String = row.get(2)?;
    let version: i64 = row.get(4)?;
    Ok(Site {
        id: row.get(0)?,
        name: row.get(1)?,
        kind: parse_enum("sites.kind", &kind)?,
        owner_tenant_id: row.get(3)?,
        version: u64::try_from(version).unwrap_or(0),
        created_at: row.get(5)?,
    })
}

impl Tx<'_> {
    /// Inserts `site` as given (version 1).
    pub fn insert_site(&self, site: &Site) -> Result<(), StoreError> {
        self.insert_site_sql(site, "").map(|_| ())
    }

    /// Inserts `site` unless a site with its id exists; returns whether it was inserted.
    pub fn insert_site_if_absent(&self, site: &Site) -> Result<bool, StoreError> {
        self.insert_site_sql(site, " ON CONFLICT (id) DO NOTHING")
    }

    fn insert_site_sql(&self, site: &Site, on_conflict: &str) -> Result<bool, StoreError> {
        let n = self.db().execute(
            &format!(
                "INSERT INTO sites (id, name, kind, owner_tenant_id, version, created_at) \
                 VALUES (?1, ?2, ?3, ?4, 1, ?5){on_conflict}"
            ),
            params![
                site.id,
                site.name,
                site.kind.as_str(),
                site.owner_tenant_id,
                site.created_at
            ],
        )?;
        Ok(n == 1)
    }

    /// Renames a site if it is still at `version`; returns whether a row changed.
    pub fn rename_site(&self, id: &str, version: u64, name: &str) -> Result<bool, StoreError> {
        let n = self.db().execute(
            "UPDATE sites SET name = ?3, version = version + 1 WHERE id = ?1 AND version = ?2",
            params![id, sql_u64(version), name],
        )?;
        Ok(n == 1)
    }

    /// Deletes a site if it is still at `version`; returns whether a row went.
    pub fn delete_site(&self, id: &str, version: u64) -> Result<bool, StoreError> {
        let n = self.db().execute(
            "DELETE FROM sites WHERE id = ?1 AND version = ?2",
            params![id, sql_u64(version)],
        )?;
        Ok(n == 1)
    }
}

impl Reader<'_> {
    /// One site by id.
    pub fn site(&self, id: &str) -> Result<Option<Site>, StoreError> {
        let mut stmt = self
            .db()
            .prepare_cached(&format!("SELECT {SITE_COLUMNS} FROM sites WHERE id = ?1"))?;
        stmt.query_map(params![id], from_row)?.next().transpose()
    }

    /// Every site, by id.
    pub fn sites(&self) -> Result<Vec<Site>, StoreError> {
        let mut stmt = self
            .db()
            .prepare_cached(&format!("SELECT {SITE_COLUMNS} FROM sites ORDER BY id"))?;
        stmt.query_map(params![], from_row)?.collect()
    }

    /// How many pools and nodes still reference the site.
    pub fn site_references(&self, id: &str) -> Result<(u64, u64), StoreError> {
        let conn = self.db();
        let pools: i64 = conn.query_row(
            "SELECT COUNT(*) FROM pools WHERE site_id = ?1",
            params![id],
            |r| r.get(0),
        )?;
        let nodes: i64 = conn
            .query_row(
                "SELECT COUNT(*) FROM nodes WHERE site_id = ?1",
                params![id],
                |r| r.get(0),
            )
            .optional()?
            .unwrap_or(0);
        Ok((
            u64::try_from(pools).unwrap_or(0),
            u64::try_from(nodes).unwrap_or(0),
        ))
    }
}
