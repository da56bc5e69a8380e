//! Bare metal (issue 14): the BMC of each enrolled node (`node_bmcs`: its address, TLS mode,
//! sealed credentials, what the BMC reported at verification) and the site lease that picks
//! which site agent does a site's BMC work (`site_leases`).
//!
//! The credentials columns hold what the core sealed (an AEAD ciphertext, never plaintext); the
//! store neither knows the key nor could open them.

use crate::db::{Db, OptionalExt, Row};
use crate::params;
use serde::{Deserialize, Serialize};

use super::{Reader, StoreError, Tx, from_json, sql_u64, to_json};

/// One identifier a BMC reported, as its digest (the hardware key's per-identifier digest of the
/// same `kind:value` line, `bc_protocol::hwid`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct BmcIdentifier {
    /// `system-uuid`, `system-serial` or `mac`.
    pub kind: String,
    /// Lowercase hex SHA-256 of the `kind:value` line.
    pub digest: String,
}

/// A node's BMC as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct BmcRecord {
    pub node_id: String,
    /// `redfish+https://…`, `redfish+http://…` or `ipmi://…`, as validated at enrollment.
    pub address: String,
    /// `pin`, `verify` or `insecure`.
    pub tls: String,
    /// The sealed credentials (the core's AEAD envelope).
    pub credentials: String,
    /// Sealed credentials under test by a rotation (`nodes.updateBmcCredentials`).
    pub candidate: Option<String>,
    /// SHA-256 of the BMC's leaf certificate, recorded at the first verification under `pin`.
    pub cert_sha256: Option<String>,
    /// What the BMC reported at the last verification (camelCase JSON), `None` before.
    pub facts: Option<serde_json::Value>,
    /// Digests of the identifiers the BMC reported.
    pub identifiers: Vec<BmcIdentifier>,
    /// MACs the operator gave at enrollment (lowercase).
    pub macs: Vec<String>,
    /// When the BMC was last verified; `None`: not (yet).
    pub verified_at: Option<i64>,
    /// The `bmc.verify` command in flight for this node, if any.
    pub verify_command_id: Option<String>,
    /// When the pending verification began (its deadline counts from here).
    pub verify_started_at: Option<i64>,
    /// What the BMC last answered when it failed (never a credential).
    pub last_error: Option<String>,
    /// The power state the control plane last asked for (`on`, `off`) and when: a change the
    /// BMC reports toward it is not out of band.
    pub power_expected: Option<String>,
    pub power_expected_at: Option<i64>,
    /// Whether the BMC answered the last time it was asked (power sync or a command).
    pub reachable: Option<bool>,
    pub created_at: i64,
    /// Whether the node goes on to `inspecting` by itself once the BMC is verified
    /// (`nodes.enroll`'s `inspect`, issue 15).
    pub inspect: bool,
    /// Enrolled as a machine that already runs its OS (`nodes.enroll`'s `deployed`, issue 16):
    /// a verified BMC moves the node `enrolling -> deployed`, with no network boot.
    pub deployed: bool,
    /// `nodes.deploy`'s image, root-device hints and config drive (camelCase JSON, as the
    /// ramdisk's `image.write` takes them), kept so `nodes.recover` deploys the same again.
    pub deployment: Option<serde_json::Value>,
    /// `nodes.rescue`'s arguments for the ramdisk's `rescue.start` (`{"sshKeys": [...]}`).
    pub rescue: Option<serde_json::Value>,
}

const BMC_COLUMNS: &str = "b.node_id, b.address, b.tls, b.credentials, b.candidate, b.cert_sha256, \
    b.facts, b.identifiers, b.macs, b.verified_at, b.verify_command_id, b.verify_started_at, \
    b.last_error, b.power_expected, b.power_expected_at, b.reachable, b.created_at, b.inspect, \
    b.deployed, b.deployment, b.rescue";

fn bmc_from_row(r: &Row<'_>) -> Result<BmcRecord, StoreError> {
    let facts: Option<String> = r.get(6)?;
    Ok(BmcRecord {
        node_id: r.get(0)?,
        address: r.get(1)?,
        tls: r.get(2)?,
        credentials: r.get(3)?,
        candidate: r.get(4)?,
        cert_sha256: r.get(5)?,
        facts: facts
            .map(|f| from_json("node_bmcs.facts", &f))
            .transpose()?,
        identifiers: from_json("node_bmcs.identifiers", &r.get::<String>(7)?)?,
        macs: from_json("node_bmcs.macs", &r.get::<String>(8)?)?,
        verified_at: r.get(9)?,
        verify_command_id: r.get(10)?,
        verify_started_at: r.get(11)?,
        last_error: r.get(12)?,
        power_expected: r.get(13)?,
        power_expected_at: r.get(14)?,
        reachable: r.get(15)?,
        created_at: r.get(16)?,
        inspect: r.get(17)?,
        deployed: r.get(18)?,
        deployment: r
            .get::<Option<String>>(19)?
            .map(|d| from_json("node_bmcs.deployment", &d))
            .transpose()?,
        rescue: r
            .get::<Option<String>>(20)?
            .map(|d| from_json("node_bmcs.rescue", &d))
            .transpose()?,
    })
}

fn query_bmcs(
    conn: Db<'_>,
    sql_tail: &str,
    p: crate::db::Params<'_>,
) -> Result<Vec<BmcRecord>, StoreError> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {BMC_COLUMNS} FROM node_bmcs b JOIN nodes n ON n.id = b.node_id {sql_tail}"
    ))?;
    stmt.query_map(p, bmc_from_row)?.collect()
}

/// A site's lease: which site agent does the site's BMC work. One row per site that ever had a
/// lease; `holder_node_id` is `None` while nobody holds it, and `epoch` only grows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SiteLease {
    pub site_id: String,
    pub holder_node_id: Option<String>,
    /// Bumped by every grant.
    pub epoch: u64,
    /// Milliseconds since the Unix epoch.
    pub granted_at: Option<i64>,
    /// Valid until then unless renewed (the holder's heartbeats renew it).
    pub expires_at: Option<i64>,
}

fn lease_from_row(r: &Row<'_>) -> Result<SiteLease, StoreError> {
    let epoch: i64 = r.get(2)?;
    Ok(SiteLease {
        site_id: r.get(0)?,
        holder_node_id: r.get(1)?,
        epoch: u64::try_from(epoch).unwrap_or(0),
        granted_at: r.get(3)?,
        expires_at: r.get(4)?,
    })
}

const LEASE_COLUMNS: &str = "site_id, holder_node_id, epoch, granted_at, expires_at";

impl Tx<'_> {
    /// Inserts or replaces the BMC row of `b.node_id`.
    pub fn put_bmc(&self, b: &BmcRecord) -> Result<(), StoreError> {
        self.db().execute(
            "INSERT INTO node_bmcs (node_id, address, tls, credentials, candidate, cert_sha256, \
             facts, identifiers, macs, verified_at, verify_command_id, verify_started_at, \
             last_error, power_expected, power_expected_at, reachable, created_at, inspect, deployed, deployment, rescue) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21) \
             ON CONFLICT (node_id) DO UPDATE SET address = excluded.address, tls = excluded.tls, \
             credentials = excluded.credentials, candidate = excluded.candidate, \
             cert_sha256 = excluded.cert_sha256, facts = excluded.facts, \
             identifiers = excluded.identifiers, macs = excluded.macs, \
             verified_at = excluded.verified_at, verify_command_id = excluded.verify_command_id, \
             verify_started_at = excluded.verify_started_at, last_error = excluded.last_error, \
             power_expected = excluded.power_expected, \
             power_expected_at = excluded.power_expected_at, reachable = excluded.reachable, \
             inspect = excluded.inspect, deployed = excluded.deployed, \
             deployment = excluded.deployment, rescue = excluded.rescue",
            params![
                b.node_id,
                b.address,
                b.tls,
                b.credentials,
                b.candidate,
                b.cert_sha256,
                b.facts.as_ref().map(to_json),
                to_json(&b.identifiers),
                to_json(&b.macs),
                b.verified_at,
                b.verify_command_id,
                b.verify_started_at,
                b.last_error,
                b.power_expected,
                b.power_expected_at,
                b.reachable,
                b.created_at,
                b.inspect,
                b.deployed,
                b.deployment.as_ref().map(to_json),
                b.rescue.as_ref().map(to_json)
            ],
        )?;
        Ok(())
    }

    /// Writes `lease` (inserting the site's row when it has none).
    pub fn put_site_lease(&self, lease: &SiteLease) -> Result<(), StoreError> {
        self.db().execute(
            "INSERT INTO site_leases (site_id, holder_node_id, epoch, granted_at, expires_at) \
             VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (site_id) DO UPDATE SET \
             holder_node_id = excluded.holder_node_id, epoch = excluded.epoch, \
             granted_at = excluded.granted_at, expires_at = excluded.expires_at",
            params![
                lease.site_id,
                lease.holder_node_id,
                sql_u64(lease.epoch),
                lease.granted_at,
                lease.expires_at
            ],
        )?;
        Ok(())
    }

    /// Renews the leases held by each `(holder, epoch, expires_at)`: `expires_at` moves up (never
    /// down) where the lease is still that holder's at that epoch. Returns how many renewed.
    pub fn renew_site_leases(&self, renewals: &[(String, u64, i64)]) -> Result<usize, StoreError> {
        let mut stmt = self.db().prepare_cached(
            "UPDATE site_leases SET expires_at = CASE WHEN COALESCE(expires_at, 0) > ?3 \
             THEN expires_at ELSE ?3 END \
             WHERE holder_node_id = ?1 AND epoch = ?2",
        )?;
        let mut n = 0;
        for (holder, epoch, at) in renewals {
            n += stmt.execute(params![holder, sql_u64(*epoch), at])?;
        }
        Ok(n)
    }
}

impl Reader<'_> {
    /// The BMC of `node_id`, if it was enrolled through one.
    pub fn bmc(&self, node_id: &str) -> Result<Option<BmcRecord>, StoreError> {
        Ok(
            query_bmcs(self.db(), "WHERE b.node_id = ?1", params![node_id])?
                .into_iter()
                .next(),
        )
    }

    /// One BMC row's node id and sealed credentials (the lowest node id), `None` when no
    /// machine was enrolled: what `bcctl serve` opens to check that its credentials key is the
    /// one this store's credentials were sealed under, in a store that recorded no digest yet.
    pub fn first_sealed_bmc(&self) -> Result<Option<(String, String)>, StoreError> {
        self.db()
            .query_row(
                "SELECT node_id, credentials FROM node_bmcs ORDER BY node_id LIMIT 1",
                params![],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
    }

    /// The BMCs of the nodes on `site_id`, by node id.
    pub fn site_bmcs(&self, site_id: &str) -> Result<Vec<BmcRecord>, StoreError> {
        query_bmcs(
            self.db(),
            "WHERE n.site_id = ?1 ORDER BY b.node_id",
            params![site_id],
        )
    }

    /// Every enrolled BMC of every site, by node id: an address or a machine is enrolled once
    /// across sites (issue 30.8).
    pub fn bmcs(&self) -> Result<Vec<BmcRecord>, StoreError> {
        query_bmcs(self.db(), "ORDER BY b.node_id", params![])
    }

    /// BMCs of nodes in `provisionState` `state`, by node id (the enrollment controller reads
    /// the `enrolling` ones).
    pub fn bmcs_in_state(&self, state: &str) -> Result<Vec<BmcRecord>, StoreError> {
        query_bmcs(
            self.db(),
            "WHERE n.provision_state = ?1 ORDER BY b.node_id",
            params![state],
        )
    }

    /// The ids of the site agents (`role: site`) of `site_id`, by id.
    pub fn site_agent_ids(&self, site_id: &str) -> Result<Vec<String>, StoreError> {
        let mut stmt = self.db().prepare_cached(
            "SELECT id FROM nodes WHERE role = 'site' AND site_id = ?1 ORDER BY id",
        )?;
        let rows = stmt.query_map(params![site_id], |r| r.get::<String>(0))?;
        rows.collect::<Result<_, _>>()
    }

    /// Every site that has a site agent or a lease row, by id.
    pub fn sites_with_agents(&self) -> Result<Vec<String>, StoreError> {
        let mut stmt = self.db().prepare_cached(
            "SELECT site_id FROM nodes WHERE role = 'site' AND site_id IS NOT NULL \
             UNION SELECT site_id FROM site_leases ORDER BY 1",
        )?;
        let rows = stmt.query_map(params![], |r| r.get::<String>(0))?;
        rows.collect::<Result<_, _>>()
    }

    /// The lease of `site_id`, if it ever had one.
    pub fn site_lease(&self, site_id: &str) -> Result<Option<SiteLease>, StoreError> {
        let mut stmt = self.db().prepare_cached(&format!(
            "SELECT {LEASE_COLUMNS} FROM site_leases WHERE site_id = ?1"
        ))?;
        stmt.query_row(params![site_id], |r| Ok(lease_from_row(r)))
            .optional()?
            .transpose()
    }

    /// Every lease row, by site.
    pub fn site_leases(&self) -> Result<Vec<SiteLease>, StoreError> {
        let mut stmt = self.db().prepare_cached(&format!(
            "SELECT {LEASE_COLUMNS} FROM site_leases ORDER BY site_id"
        ))?;
        stmt.query_map(params![], lease_from_row)?.collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{NewNode, Site};
    use bc_protocol::{NodeRole, ProvisionState, SiteKind};

    fn node(
        tx: &Tx<'_>,
        id: &str,
        role: NodeRole,
        state: ProvisionState,
    ) -> Result<(), StoreError> {
        let n = NewNode {
            site_id: Some("s1".into()),
            role,
            ..crate::testing::new_node(id)
        };
        tx.insert_node_in(&n, state, 1)
    }

    #[test]
    fn bmcs_and_leases_round_trip() -> Result<(), StoreError> {
        let store = crate::testing::store()?;
        store.write_blocking(|tx| {
            tx.insert_site(&Site {
                id: "s1".into(),
                name: "s1".into(),
                kind: SiteKind::Platform,
                owner_tenant_id: None,
                version: 1,
                created_at: 1,
            })?;
            node(tx, "node_site", NodeRole::Site, ProvisionState::Adopting)?;
            node(
                tx,
                "node_m",
                NodeRole::Unassigned,
                ProvisionState::Enrolling,
            )?;
            let b = BmcRecord {
                node_id: "node_m".into(),
                address: "ipmi://10.0.0.1".into(),
                tls: "pin".into(),
                credentials: "sealed".into(),
                candidate: None,
                cert_sha256: None,
                facts: None,
                identifiers: vec![BmcIdentifier {
                    kind: "mac".into(),
                    digest: "d".into(),
                }],
                macs: vec!["00:25:90:eb:96:28".into()],
                verified_at: None,
                verify_command_id: None,
                verify_started_at: Some(5),
                last_error: None,
                power_expected: None,
                power_expected_at: None,
                reachable: None,
                created_at: 1,
                inspect: true,
                deployed: false,
                deployment: Some(serde_json::json!({"image": {"url": "http://x/i"}})),
                rescue: None,
            };
            tx.put_bmc(&b)?;
            assert_eq!(tx.bmc("node_m")?.as_ref(), Some(&b));
            assert_eq!(tx.site_bmcs("s1")?.len(), 1);
            assert_eq!(tx.bmcs_in_state("enrolling")?.len(), 1);
            assert_eq!(tx.site_agent_ids("s1")?, vec!["node_site".to_owned()]);
            assert_eq!(tx.sites_with_agents()?, vec!["s1".to_owned()]);
            let mut lease = SiteLease {
                site_id: "s1".into(),
                holder_node_id: Some("node_site".into()),
                epoch: 1,
                granted_at: Some(10),
                expires_at: Some(20),
            };
            tx.put_site_lease(&lease)?;
            // A renewal of another epoch or holder changes nothing; the holder's moves it up only.
            assert_eq!(tx.renew_site_leases(&[("node_site".into(), 2, 99)])?, 0);
            assert_eq!(tx.renew_site_leases(&[("node_x".into(), 1, 99)])?, 0);
            assert_eq!(tx.renew_site_leases(&[("node_site".into(), 1, 30)])?, 1);
            tx.renew_site_leases(&[("node_site".into(), 1, 25)])?;
            lease.expires_at = Some(30);
            assert_eq!(tx.site_lease("s1")?, Some(lease));
            Ok(())
        })
    }
}
