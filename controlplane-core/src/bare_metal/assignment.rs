//! `SiteAssignment`: what a site agent may do. The only message that carries BMC credentials,
//! decrypted here for the lease holder alone; a standby gets `lease_held = false` and no BMC.
//! Never logged: the log lines here name the site, the epoch and counts.

use bc_protocol::NodeRole;
use bc_protocol::pb::{
    BmcEndpoint, BmcTlsMode, BootPlan, GatewayMessage, ManagedBmc, RamdiskBoot, SiteAssignment,
    gateway_message::Msg,
};
use cpl_store::{BmcRecord, Reader};
use tracing::Instrument;

use super::bmc::BmcFactsView;
use super::credentials::CredentialKey;
use super::{BareMetal, table};
use crate::error::OpError;

/// The wire's TLS mode of a stored one (`pin`, `verify`, `insecure`).
pub fn tls_mode(tls: &str) -> BmcTlsMode {
    match tls {
        "verify" => BmcTlsMode::Verify,
        "insecure" => BmcTlsMode::Insecure,
        _ => BmcTlsMode::Pin,
    }
}

fn endpoint(
    key: &CredentialKey,
    b: &BmcRecord,
    sealed: &str,
) -> Result<BmcEndpoint, super::CredentialError> {
    let c = key.open(&b.node_id, sealed)?;
    Ok(BmcEndpoint {
        address: b.address.clone(),
        username: c.username,
        password: c.password,
        tls: tls_mode(&b.tls).into(),
        cert_sha256: b.cert_sha256.clone().unwrap_or_default(),
    })
}

/// The MACs the boot service knows a machine by: those its BMC reported and those the operator
/// gave, lowercase, sorted.
fn macs_of(b: &BmcRecord) -> Vec<String> {
    let mut macs: Vec<String> = b.macs.iter().map(|m| m.to_ascii_lowercase()).collect();
    if let Some(f) = b
        .facts
        .clone()
        .and_then(|f| serde_json::from_value::<BmcFactsView>(f).ok())
    {
        macs.extend(f.macs.iter().map(|m| m.to_ascii_lowercase()));
    }
    macs.sort();
    macs.dedup();
    macs
}

/// MACs that more than one machine of the site claims (a copy-pasted `--mac`, a BMC listing a
/// shared port): the boot service answers none of them, or it would serve one machine another's
/// boot token. Each is logged with its claimants.
fn shared_macs(bmcs: &[BmcRecord]) -> std::collections::BTreeSet<String> {
    let mut by_mac: std::collections::BTreeMap<String, Vec<&str>> = Default::default();
    for b in bmcs {
        for m in macs_of(b) {
            by_mac.entry(m).or_default().push(&b.node_id);
        }
    }
    by_mac
        .into_iter()
        .filter(|(_, nodes)| nodes.len() > 1)
        .map(|(mac, nodes)| {
            tracing::error!(mac = %mac, nodes = ?nodes, "a MAC claimed by several machines: the boot service answers none of them for it");
            mac
        })
        .collect()
}

/// How the boot service answers the machine of `b` (issue 15): the ramdisk with its kernel
/// arguments while a boot is pending (unused, unexpired, its node in the state it is for),
/// else `exit` (boot from disk). `None` for a machine with no known MAC or an unverified BMC.
fn boot_plan(r: &Reader<'_>, bm: &BareMetal, b: &BmcRecord) -> Result<Option<BootPlan>, OpError> {
    let macs = macs_of(b);
    if macs.is_empty() || b.verified_at.is_none() {
        return Ok(None);
    }
    let Some(node) = r.node(&b.node_id)? else {
        return Ok(None);
    };
    let state = node.provision_state;
    let now = cpl_store::now_ms();
    let pending = r.boot(&b.node_id)?.filter(|boot| {
        boot.used_at.is_none()
            && boot.ended_at.is_none()
            && boot.expires_at > now
            && boot.purpose == state
    });
    let (ramdisk, reason) = match pending {
        Some(boot) => match super::boot::kernel_args(&bm.key, &bm.boot, &boot) {
            Ok(args) => (
                Some(RamdiskBoot {
                    kernel_args: args,
                    purpose: boot.purpose.as_str().to_owned(),
                    expires_at_ms: boot.expires_at,
                }),
                format!("{state}: boot token {} pending", boot.token_id),
            ),
            Err(e) => {
                tracing::error!(node_id = %b.node_id, error = %e, "boot token left out of the site assignment");
                (None, format!("{state}: the boot token does not open"))
            }
        },
        None if table::in_ramdisk(state) => (
            None,
            format!("{state}: no boot pending (the ramdisk already joined, or its token expired)"),
        ),
        None => (None, format!("{state}: boot from disk")),
    };
    Ok(Some(BootPlan {
        macs,
        ramdisk,
        reason,
    }))
}

/// The assignment of site agent `node_id`, read in `r`; `None` when it is not a site agent.
/// A BMC whose credentials do not open is left out, with an error log naming the node.
pub fn build(
    r: &Reader<'_>,
    bm: &BareMetal,
    node_id: &str,
) -> Result<Option<SiteAssignment>, OpError> {
    let Some(node) = r.node(node_id)? else {
        return Ok(None);
    };
    let (NodeRole::Site, Some(site_id)) = (node.role, node.site_id) else {
        return Ok(None);
    };
    let lease = r.site_lease(&site_id)?;
    let epoch = lease.as_ref().map_or(0, |l| l.epoch);
    let held = lease
        .as_ref()
        .is_some_and(|l| l.holder_node_id.as_deref() == Some(node_id));
    let mut bmcs = Vec::new();
    if held {
        let site_bmcs = r.site_bmcs(&site_id)?;
        let shared = shared_macs(&site_bmcs);
        for b in site_bmcs {
            let current = match endpoint(&bm.key, &b, &b.credentials) {
                Ok(e) => e,
                Err(e) => {
                    tracing::error!(node_id = %b.node_id, error = %e, "BMC left out of the site assignment");
                    continue;
                }
            };
            let candidate = match b.candidate.as_deref() {
                Some(c) => endpoint(&bm.key, &b, c).ok(),
                None => None,
            };
            bmcs.push(ManagedBmc {
                node_id: b.node_id.clone(),
                endpoint: Some(current),
                candidate,
                sync_power: b.verified_at.is_some(),
                boot: boot_plan(r, bm, &b)?.map(|mut p| {
                    p.macs.retain(|m| !shared.contains(m));
                    p
                }),
            });
        }
    }
    let u32ms = |d| u32::try_from(cpl_store::duration_ms(d)).unwrap_or(u32::MAX);
    Ok(Some(SiteAssignment {
        site_id,
        lease_held: held,
        lease_epoch: epoch,
        lease_ttl_ms: u32ms(bm.cfg.lease_ttl),
        bmcs,
        power_sync_interval_ms: u32ms(bm.cfg.power_sync_interval),
        max_requests_per_bmc: bm.cfg.max_requests_per_bmc,
        max_requests_per_site: bm.cfg.max_requests_per_site,
    }))
}

impl BareMetal {
    /// The assignment message of site agent `node_id`, `None` for any other node.
    pub async fn assignment(&self, node_id: &str) -> Option<GatewayMessage> {
        let bm = self.clone();
        let id = node_id.to_owned();
        match self.store.read(move |r| build(r, &bm, &id)).await {
            Ok(Some(a)) => {
                tracing::debug!(site_id = %a.site_id, held = a.lease_held, epoch = a.lease_epoch, bmcs = a.bmcs.len(), "site assignment");
                Some(GatewayMessage {
                    msg: Some(Msg::SiteAssignment(a)),
                })
            }
            Ok(None) => None,
            Err(e) => {
                tracing::error!(error = %e, "building the site assignment failed");
                None
            }
        }
    }

    /// Sends site agent `node_id` its assignment, if it has a live session.
    pub async fn push_assignment(&self, node_id: &str) {
        if self.sessions.live_epoch(node_id).is_none() {
            return;
        }
        let span = tracing::info_span!("node", node_id = %node_id);
        if let Some(msg) = self.assignment(node_id).instrument(span.clone()).await {
            let _ = self.sessions.send(node_id, msg).instrument(span).await;
        }
    }

    /// Sends the holder of `site_id`'s lease its assignment (after the site's BMCs changed).
    pub async fn push_site(&self, site_id: &str) {
        if let Some((holder, _)) = self.leases.holder_of(site_id) {
            self.push_assignment(&holder).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bmc(node: &str, operator: &[&str], reported: &[&str]) -> BmcRecord {
        BmcRecord {
            node_id: node.into(),
            address: "redfish+http://127.0.0.1:1".into(),
            tls: "pin".into(),
            credentials: String::new(),
            candidate: None,
            cert_sha256: None,
            facts: Some(serde_json::json!({ "macs": reported })),
            identifiers: vec![],
            macs: operator.iter().map(|m| (*m).to_owned()).collect(),
            verified_at: Some(1),
            verify_command_id: None,
            verify_started_at: None,
            last_error: None,
            power_expected: None,
            power_expected_at: None,
            reachable: None,
            created_at: 1,
            inspect: true,
            deployed: false,
            deployment: None,
            rescue: None,
        }
    }

    #[test]
    fn a_mac_two_machines_claim_is_answered_for_neither() {
        let a = bmc("a", &["00:1b:21:aa:bb:01"], &["00:1B:21:AA:BB:02"]);
        let b = bmc("b", &[], &["00:1b:21:aa:bb:02", "00:1b:21:aa:bb:03"]);
        assert_eq!(
            macs_of(&a),
            ["00:1b:21:aa:bb:01", "00:1b:21:aa:bb:02"],
            "lowercase, the operator's and the BMC's"
        );
        let shared = shared_macs(&[a, b]);
        assert_eq!(
            shared.into_iter().collect::<Vec<_>>(),
            ["00:1b:21:aa:bb:02"]
        );
    }
}
