//! The BMC of a bare-metal machine as the control plane keeps it: its conditions
//! (`BmcVerified`, `BmcReachable`), what it reported at verification and how `nodes.get` shows
//! it ([`BmcView`], never a credential), the `bmc.*` commands a site agent runs on it
//! (`queue`, with a `bmcCommand` event on the machine), and the power axis it reports.

use bc_protocol::commands::CommandArgs;
use bc_protocol::commands::bmc::PowerState;
use bc_protocol::{ConditionStatus, Power};
use cpl_store::{
    BmcIdentifier, BmcRecord, CommandRecord, NewEvent, NodeRecord, Reader, Tx, now_ms,
};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::commands::record::{self, Queue};
use crate::conditions::{ConditionUpdate, rfc3339_ms};
use crate::edit::Edit;
use crate::error::OpError;
use crate::port::AgentSessions;

/// The condition a verification sets.
pub const BMC_VERIFIED: &str = "BmcVerified";
/// The condition the power sync sets.
pub const BMC_REACHABLE: &str = "BmcReachable";
/// The owner of the enrollment's conditions.
pub const OWNER: &str = "Enrollment";

/// What a BMC reported at verification, as `nodes.get` shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BmcFactsView {
    #[serde(default)]
    pub system_path: String,
    #[serde(default)]
    pub uuid: Option<String>,
    #[serde(default)]
    pub serial: Option<String>,
    #[serde(default)]
    pub manufacturer: Option<String>,
    #[serde(default)]
    pub model: Option<String>,
    /// The system's NIC MACs as the BMC lists them.
    #[serde(default)]
    pub macs: Vec<String>,
}

/// A node's BMC in `nodes.get` (never its credentials).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BmcView {
    pub address: String,
    /// `pin`, `verify` or `insecure`.
    pub tls: String,
    /// SHA-256 of the BMC's certificate, recorded at the first verification under `pin`.
    pub cert_sha256: Option<String>,
    /// RFC 3339; absent until verified.
    pub verified_at: Option<String>,
    pub facts: Option<BmcFactsView>,
    /// Digests of the BMC-reported identifiers (what the ramdisk's hardware key must match).
    pub identifiers: Vec<BmcIdentifier>,
    /// MACs given at enrollment.
    pub macs: Vec<String>,
    /// The `power` axis: as the BMC last reported it (`on`, `off`, `unknown`).
    pub power: String,
    /// Whether the BMC answered when last asked; absent before the first answer.
    pub reachable: Option<bool>,
    /// What the BMC last answered when something failed.
    pub last_error: Option<String>,
    /// A credential rotation (`nodes.updateBmcCredentials`) is being verified.
    pub rotation_pending: bool,
}

impl BmcView {
    /// The view of `b` on node `node`.
    pub fn new(b: &BmcRecord, node: &NodeRecord) -> Self {
        Self {
            address: b.address.clone(),
            tls: b.tls.clone(),
            cert_sha256: b.cert_sha256.clone(),
            verified_at: b.verified_at.map(rfc3339_ms),
            facts: b
                .facts
                .as_ref()
                .and_then(|f| serde_json::from_value(f.clone()).ok()),
            identifiers: b.identifiers.clone(),
            macs: b.macs.clone(),
            power: node.power.to_string(),
            reachable: b.reachable,
            last_error: b.last_error.clone(),
            rotation_pending: b.candidate.is_some(),
        }
    }

    /// The view of `node`'s BMC read in `r`, if it has one.
    pub fn of(r: &Reader<'_>, node: &NodeRecord) -> Result<Option<Self>, OpError> {
        Ok(r.bmc(&node.id)?.map(|b| Self::new(&b, node)))
    }
}

/// `BmcVerified: unknown` while the verification waits or runs.
pub(crate) fn pending(edit: &mut Edit, site_id: &str) {
    crate::conditions::apply(
        edit,
        &ConditionUpdate {
            type_: BMC_VERIFIED.to_owned(),
            status: ConditionStatus::Unknown,
            reason: "Pending".to_owned(),
            message: format!(
                "waiting for the site agent holding site {site_id}'s lease to verify the BMC"
            ),
            owner: OWNER.to_owned(),
            gpus: Vec::new(),
        },
    );
}

/// A `bmc.*` command (`args`) for site agent `holder` about bare-metal node `subject`, queued in
/// `tx` by `actor` with a deadline `timeout_ms` from now, with a `bmcCommand` event on the
/// subject so its log shows what was asked of its BMC.
pub(crate) fn queue(
    tx: &Tx<'_>,
    holder: &str,
    subject: &str,
    args: CommandArgs,
    timeout_ms: i64,
    actor: &str,
) -> Result<CommandRecord, OpError> {
    let now = now_ms();
    let what = describe(&args);
    let to = Queue {
        node_id: holder,
        subject: Some(subject),
        actor,
        timeout_ms,
    };
    let rec = record::queued(to, args.into(), now);
    tx.insert_command(&rec)?;
    tx.record_event(&NewEvent {
        node_id: subject,
        at: now,
        kind: "bmcCommand",
        from: None,
        to: Some("queued"),
        actor,
        message: &format!("{} {what} ({}) for site agent {holder}", rec.name, rec.id),
    })?;
    Ok(rec)
}

/// The arguments worth a log line (`action off`, `device pxe persistent`), never a credential
/// (none travels in `bmc.*` args).
fn describe(args: &CommandArgs) -> String {
    let mut parts = Vec::new();
    let epoch = match args {
        CommandArgs::BmcPower(a) => {
            parts.push(format!("action {}", a.action.as_str()));
            a.lease_epoch
        }
        CommandArgs::BmcSetBootDevice(a) => {
            parts.push(format!("device {}", a.device.as_str()));
            if a.persistent {
                parts.push("persistent".to_owned());
            }
            a.lease_epoch
        }
        CommandArgs::BmcVerify(a) => {
            if a.candidate {
                parts.push("candidate credentials".to_owned());
            }
            a.lease_epoch
        }
        _ => return String::new(),
    };
    parts.push(format!("lease epoch {epoch}"));
    parts.join(", ")
}

/// `BMC_AUTH_FAILED` as a condition reason: `BmcAuthFailed`.
pub fn reason_of(code: &str) -> String {
    code.split('_')
        .filter(|w| !w.is_empty())
        .map(|w| {
            let lower = w.to_ascii_lowercase();
            let mut c = lower.chars();
            match c.next() {
                Some(f) => f.to_ascii_uppercase().to_string() + c.as_str(),
                None => String::new(),
            }
        })
        .collect()
}

/// The power axis's value of what a BMC reported.
pub(crate) fn power_of(p: PowerState) -> Power {
    match p {
        PowerState::On => Power::On,
        PowerState::Off => Power::Off,
        PowerState::Unknown => Power::Unknown,
    }
}

/// Sets the power axis on `edit` with a `power` event when it changes.
pub(crate) fn set_power(edit: &mut Edit, to: Power, message: &str) {
    let from = edit.node.power;
    if from != to {
        edit.node.power = to;
        edit.event(
            "power",
            Some(from.to_string()),
            Some(to.to_string()),
            message,
        );
    }
}

/// Records that the control plane asked the BMC of `node_id` for `power` (a change toward it
/// within [`super::power::EXPECTED_WINDOW_MS`] is not out of band).
pub(crate) fn mark_expected(tx: &Tx<'_>, node_id: &str, power: Power) -> Result<(), OpError> {
    if let Some(mut bmc) = tx.bmc(node_id)? {
        bmc.power_expected = Some(power.as_str().to_owned());
        bmc.power_expected_at = Some(now_ms());
        tx.put_bmc(&bmc)?;
    }
    Ok(())
}

/// The holder of `site_id`'s lease and its epoch, read in `tx`, when it has a live session in
/// `sessions`. Errors: `UNAVAILABLE` naming the site when nobody can reach its BMCs.
pub(crate) fn live_holder(
    tx: &Tx<'_>,
    sessions: &dyn AgentSessions,
    site_id: &str,
) -> Result<(String, u64), OpError> {
    let lease = tx.site_lease(site_id)?;
    match lease.and_then(|l| l.holder_node_id.map(|h| (h, l.epoch))) {
        Some((h, e)) if sessions.live_epoch(&h).is_some() => Ok((h, e)),
        _ => Err(OpError::Unavailable(format!(
            "no site agent of site {site_id} holds the site's lease right now: nothing can reach the BMC; start or reconnect a bcd site on that site and retry"
        ))),
    }
}
