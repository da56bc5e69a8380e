//! `sites.get`'s answer: the site, its appliances (site agents) with their connectivity, and
//! who holds its lease.

use bc_protocol::Connectivity;
use cpl_store::{Reader, Site};
use serde::Serialize;
use utoipa::ToSchema;

use crate::conditions::rfc3339_ms;
use crate::error::OpError;

/// One site agent of a site.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Appliance {
    pub node_id: String,
    pub hostname: Option<String>,
    pub connectivity: Connectivity,
    /// RFC 3339 of its last heartbeat written.
    pub last_seen: Option<String>,
    pub agent_version: Option<String>,
    /// Whether it holds the site's lease.
    pub holds_lease: bool,
}

/// The site's lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SiteLeaseView {
    /// The site agent holding it; absent while nobody does.
    pub holder_node_id: Option<String>,
    /// Bumped by every grant.
    pub epoch: u64,
    /// RFC 3339.
    pub granted_at: Option<String>,
    /// RFC 3339: valid until then unless the holder's heartbeats renew it.
    pub expires_at: Option<String>,
}

/// `sites.get` answer: the site's fields, plus its appliances and lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SiteDetail {
    #[serde(flatten)]
    pub site: Site,
    /// Its site agents (`role: site`), by id.
    pub appliances: Vec<Appliance>,
    /// Absent until a site agent first held it.
    pub lease: Option<SiteLeaseView>,
}

/// `sites.get`.
pub fn get(r: &Reader<'_>, site_id: &str) -> Result<SiteDetail, OpError> {
    let site = r.site(site_id)?.ok_or_else(|| OpError::NotFound {
        kind: "site",
        id: site_id.to_owned(),
    })?;
    let lease = r.site_lease(site_id)?;
    let holder = lease.as_ref().and_then(|l| l.holder_node_id.clone());
    let mut appliances = Vec::new();
    for id in r.site_agent_ids(site_id)? {
        if let Some(n) = r.node(&id)? {
            appliances.push(Appliance {
                holds_lease: holder.as_deref() == Some(n.id.as_str()),
                node_id: n.id,
                hostname: n.hostname,
                connectivity: n.connectivity,
                last_seen: n.last_seen.map(rfc3339_ms),
                agent_version: n.agent_version,
            });
        }
    }
    Ok(SiteDetail {
        site,
        appliances,
        lease: lease.map(|l| SiteLeaseView {
            holder_node_id: l.holder_node_id,
            epoch: l.epoch,
            granted_at: l.granted_at.map(rfc3339_ms),
            expires_at: l.expires_at.map(rfc3339_ms),
        }),
    })
}
