//! Rescue of a deployed machine (issue 16 item 3): `deployed -> rescue -> deployed`.
//!
//! # Design
//! - `nodes.rescue` ([`BareMetal::rescue`]) keeps the operator's SSH keys on the BMC row and
//!   moves the node to `rescue`, a ramdisk state: the controller boots the ramdisk with a
//!   one-time token (the boot device override is once: the disk stays the machine's boot device).
//! - After the ramdisk's first report (checked against the BMC's identifiers) the pass sends
//!   `rescue.start` with the keys; its success is the `Rescued` condition true, naming the
//!   ramdisk's addresses, the SSH port and the host key fingerprints. From then on the state has
//!   no deadline: a rescue lasts as long as the operator needs it. Before it, the pool's
//!   `acceptance.rescueDeadlineSeconds` (1,800 s by default) fails a machine that never came up.
//! - `nodes.unrescue` ([`BareMetal::unrescue`]) moves the node back to `deployed`, ends the
//!   rescue ramdisk's identity and has the lease holder reboot the machine from its disk
//!   (`bmc.power reboot` with a one-time `disk` boot device).

use std::time::Duration;

use bc_protocol::commands::bmc::{BootDevice, PowerAction};
use bc_protocol::commands::rescue::RescueResult;
use bc_protocol::{CommandName, ConditionStatus, ProvisionState};
use cpl_store::{BootRecord, CommandRecord, CommandState, NodeRecord, Tx};
use serde::Deserialize;
use utoipa::ToSchema;

use super::BareMetal;
use super::boot::OWNER;
use super::work::{condition, event, fail, failure, owner_of};
use crate::edit::Edit;
use crate::error::OpError;
use crate::ops::nodes::{apply_transition, bump_identity};

/// The condition rescue writes.
pub const RESCUED: &str = "Rescued";
/// Default of `acceptance.rescueDeadlineSeconds`.
pub const DEFAULT_RESCUE_DEADLINE: Duration = Duration::from_secs(1800);
/// `work_step` once the SSH server listens: the state's deadline no longer applies.
pub const RESCUE_READY: &str = "rescueReady";

/// `nodes.rescue` request.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RescueRequest {
    #[serde(alias = "id")]
    pub node_id: crate::text::Id,
    /// When given, the node must still be at this version.
    #[serde(default)]
    pub version: Option<u64>,
    /// The OpenSSH public keys the rescue's SSH server accepts (and nothing else), 1 to 64.
    pub ssh_keys: Vec<String>,
}

/// `nodes.unrescue` request.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UnrescueRequest {
    #[serde(alias = "id")]
    pub node_id: crate::text::Id,
    #[serde(default)]
    pub version: Option<u64>,
}

impl BareMetal {
    /// `nodes.rescue`: a `deployed` machine enrolled through its BMC goes to `rescue`.
    /// Errors: `NOT_FOUND`, `CONFLICT` on a stale version, `INVALID_ARGUMENT` for keys
    /// `rescue.start` would refuse, `INVALID_STATE` for a node without a BMC or not `deployed`.
    pub async fn rescue(&self, req: RescueRequest, actor: &str) -> Result<NodeRecord, OpError> {
        let args = serde_json::json!({ "sshKeys": req.ssh_keys });
        bc_protocol::commands::check_args(CommandName::RescueStart, &args)
            .map_err(|e| OpError::InvalidArgument(format!("nodes.rescue: {e}")))?;
        let actor = actor.to_owned();
        self.store
            .write(move |tx| {
                let mut edit = Edit::begin(tx, &req.node_id, req.version, &actor)?;
                let Some(mut bmc) = tx.bmc(&req.node_id)? else {
                    return Err(OpError::InvalidState(format!(
                        "node {} was not enrolled through a BMC: there is no machine to boot into a rescue",
                        req.node_id
                    )));
                };
                apply_transition(&mut edit, ProvisionState::Rescue, "nodes.rescue")?;
                bmc.rescue = Some(args);
                tx.put_bmc(&bmc)?;
                condition(
                    &mut edit,
                    ConditionStatus::False,
                    "Booting",
                    "waiting for the machine to boot the ramdisk and start its SSH server".into(),
                );
                edit.save(tx)
            })
            .await
    }

    /// `nodes.unrescue`: `rescue -> deployed`; the rescue ramdisk's identity ends and the
    /// site's lease holder reboots the machine from its disk. Errors: `NOT_FOUND`, `CONFLICT`,
    /// `INVALID_STATE` for a node not in `rescue` or a site whose lease nobody holds.
    pub async fn unrescue(&self, req: UnrescueRequest, actor: &str) -> Result<NodeRecord, OpError> {
        let (actor, bm) = (actor.to_owned(), self.clone());
        let timeout = super::ms(self.cfg.command_timeout);
        let (node, holder) = self
            .store
            .write(move |tx| {
                let mut edit = Edit::begin(tx, &req.node_id, req.version, &actor)?;
                let site = edit.node.site_id.clone().unwrap_or_default();
                let Ok((holder, epoch)) = super::power::live_holder(tx, &bm, &site) else {
                    return Err(OpError::InvalidState(format!(
                        "no site agent of site {site} holds its lease: nothing can reboot node {} from its disk",
                        req.node_id
                    )));
                };
                apply_transition(&mut edit, ProvisionState::Deployed, "nodes.unrescue")?;
                bump_identity(&mut edit, "nodes.unrescue: the rescue ramdisk's identity ends");
                condition_rescued(
                    &mut edit,
                    ConditionStatus::False,
                    "Unrescued",
                    "the machine is rebooted from its disk".to_owned(),
                );
                let args = serde_json::json!({
                    "nodeId": req.node_id.to_string(), "leaseEpoch": epoch,
                    "action": PowerAction::Reboot.as_str(), "bootDevice": BootDevice::Disk.as_str()
                });
                super::verify::queue(
                    tx,
                    &holder,
                    &req.node_id,
                    CommandName::BmcPower,
                    args,
                    timeout,
                    OWNER,
                )?;
                Ok((edit.save(tx)?, holder))
            })
            .await?;
        self.commands.dispatch(&holder, false).await;
        Ok(node)
    }
}

/// The `Rescued` condition, whatever state the node is in now.
fn condition_rescued(edit: &mut Edit, status: ConditionStatus, reason: &str, msg: String) {
    crate::conditions::apply_owned(edit, OWNER, RESCUED, status, reason, msg);
}

/// Queues `rescue.start` for the ramdisk of boot `b` with the node's keys.
pub(crate) fn queue_start(
    tx: &Tx<'_>,
    b: &BootRecord,
    now: i64,
    timeout_ms: i64,
) -> Result<String, OpError> {
    let args = tx
        .bmc(&b.node_id)?
        .and_then(|m| m.rescue)
        .ok_or_else(|| OpError::Internal(format!("node {} has no rescue keys", b.node_id)))?;
    let rec = super::work::insert_ramdisk_command(
        tx,
        &b.node_id,
        CommandName::RescueStart,
        args,
        now,
        timeout_ms,
    )?;
    let mut edit = Edit::report(tx, &b.node_id, OWNER)?;
    event(
        &mut edit,
        "running",
        format!("rescue.start ({}) sent to the ramdisk", rec.id),
    );
    edit.save(tx)?;
    Ok(rec.id)
}

/// A finished `rescue.start` that is the current boot's decides the rescue (in the transaction
/// that finished it).
pub fn on_command_final(tx: &Tx<'_>, cmd: &CommandRecord) -> Result<(), OpError> {
    if cmd.name != CommandName::RescueStart.as_str() {
        return Ok(());
    }
    let Some((mut b, mut edit)) = owner_of(tx, cmd)? else {
        return Ok(());
    };
    if edit.node.provision_state != ProvisionState::Rescue {
        return Ok(());
    }
    b.work_command_id = None;
    let parsed = match (cmd.state, cmd.result.clone()) {
        (CommandState::Succeeded, Some(r)) => serde_json::from_value::<RescueResult>(r)
            .map_err(|e| format!("the rescue.start result does not parse: {e}")),
        (CommandState::Succeeded, None) => Err("rescue.start returned no result".to_owned()),
        _ => Err(failure(cmd)),
    };
    match parsed {
        Ok(r) => {
            let at = if r.addresses.is_empty() {
                "the ramdisk".to_owned()
            } else {
                r.addresses
                    .iter()
                    .map(|a| a.split('/').next().unwrap_or(a))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let msg = format!(
                "SSH as root on {at}, port {}, with one of the {} key(s) given; host key(s) {}",
                r.port,
                r.authorized_keys,
                r.host_key_fingerprints.join(", ")
            );
            event(&mut edit, RESCUE_READY, msg.clone());
            condition(&mut edit, ConditionStatus::True, "SshReady", msg);
            b.work_step = Some(RESCUE_READY.to_owned());
        }
        Err(why) => {
            let why = format!("rescue failed: {why}");
            event(&mut edit, "failed", why.clone());
            fail(&mut edit, "StepFailed", why)?;
        }
    }
    tx.put_boot(&b)?;
    edit.save(tx)?;
    Ok(())
}
