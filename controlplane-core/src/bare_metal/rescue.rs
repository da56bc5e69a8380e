//! Rescue of a deployed machine (issue 16 item 3): `deployed -> rescue -> deployed`.
//!
//! # Design
//! - `nodes.rescue` ([`rescue`]) keeps the operator's SSH keys on the BMC row and
//!   moves the node to `rescue`, a ramdisk state: the controller boots the ramdisk with a
//!   one-time token (the boot device override is once: the disk stays the machine's boot device).
//! - After the ramdisk's first report (checked against the BMC's identifiers) the pass sends
//!   `rescue.start` with the keys; its success is the `Rescued` condition true, naming the
//!   ramdisk's addresses, the SSH port and the host key fingerprints. From then on the state has
//!   no deadline: a rescue lasts as long as the operator needs it. Before it, the pool's
//!   `acceptance.rescueDeadlineSeconds` (1,800 s by default) fails a machine that never came up.
//! - `nodes.unrescue` ([`unrescue`]) moves the node back to `deployed`, ends the
//!   rescue ramdisk's identity and has the lease holder reboot the machine from its disk
//!   (`bmc.power reboot` with a one-time `disk` boot device).

use std::time::Duration;

use bc_protocol::commands::CommandArgs;
use bc_protocol::commands::bmc::{BootDevice, PowerAction, PowerArgs};
use bc_protocol::commands::rescue::{RescueArgs, RescueResult};
use bc_protocol::{CommandName, ConditionStatus, ProvisionState};
use cpl_store::{BootRecord, CommandRecord, CommandState, NodeRecord, Tx, WorkStep};
use serde::Deserialize;
use utoipa::ToSchema;

use super::boot::OWNER;
use super::workflow::{Deadline, Ramdisk, Turn, Workflow, failure};
use crate::edit::Edit;
use crate::error::OpError;
use crate::ops::nodes::{apply_transition, bump_identity};
use crate::port::AgentSessions;

/// The condition rescue writes.
pub const RESCUED: &str = "Rescued";
/// Default of `acceptance.rescueDeadlineSeconds`.
pub const DEFAULT_RESCUE_DEADLINE: Duration = Duration::from_secs(1800);

/// `rescue`: boot the ramdisk, start its SSH server with the operator's keys; then no deadline.
pub const WORKFLOW: Workflow = Workflow {
    state: ProvisionState::Rescue,
    condition: RESCUED,
    steps: Some("rescueStep"),
    deadline: Deadline::Pool {
        seconds: |a| a.rescue_deadline_seconds,
        default: DEFAULT_RESCUE_DEADLINE,
    },
    ramdisk: Some(Ramdisk {
        power_on_condition: RESCUED,
        open_ended_after: Some(WorkStep::RescueReady),
        on_report: |tx, edit, b| WORKFLOW.ready_for_work(tx, edit, b, CommandName::RescueStart),
        next,
        finished,
        overdue: |b, secs| ("RescueDeadline", super::workflow::overdue_work(b, secs)),
    }),
    abort: super::workflow::boot_commands,
};

fn condition(edit: &mut Edit, status: ConditionStatus, reason: &str, msg: String) {
    WORKFLOW.condition(edit, status, reason, msg);
}

fn event(edit: &mut Edit, to: &str, msg: String) {
    WORKFLOW.step(edit, to, msg);
}

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

/// `nodes.rescue` in `tx` by `actor`: a `deployed` machine enrolled through its BMC goes to
/// `rescue`, its keys kept for `rescue.start`. Errors: `NOT_FOUND`, `CONFLICT` on a stale
/// version, `INVALID_ARGUMENT` for keys `rescue.start` would refuse, `INVALID_STATE` for a node
/// without a BMC or not `deployed`.
pub fn rescue(tx: &Tx<'_>, req: &RescueRequest, actor: &str) -> Result<NodeRecord, OpError> {
    let args = CommandArgs::RescueStart(RescueArgs {
        ssh_keys: req.ssh_keys.clone(),
    })
    .to_value();
    CommandArgs::parse(CommandName::RescueStart, &args)
        .map_err(|e| OpError::InvalidArgument(format!("nodes.rescue: {e}")))?;
    let mut edit = Edit::begin(tx, &req.node_id, req.version, actor)?;
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
}

/// `nodes.unrescue` in `tx` by `actor`: `rescue -> deployed`; the rescue ramdisk's identity
/// ends and the site's lease holder (live in `sessions`) gets `bmc.power reboot` from the disk,
/// with a deadline of `timeout_ms`. Returns the node and the holder to dispatch. Errors:
/// `NOT_FOUND`, `CONFLICT`, `INVALID_STATE` for a node not in `rescue` or a site whose lease
/// nobody holds.
pub fn unrescue(
    tx: &Tx<'_>,
    req: &UnrescueRequest,
    actor: &str,
    sessions: &dyn AgentSessions,
    timeout_ms: i64,
) -> Result<(NodeRecord, String), OpError> {
    let mut edit = Edit::begin(tx, &req.node_id, req.version, actor)?;
    let site = edit.node.site_id.clone().unwrap_or_default();
    let Ok((holder, epoch)) = super::bmc::live_holder(tx, sessions, &site) else {
        return Err(OpError::InvalidState(format!(
            "no site agent of site {site} holds its lease: nothing can reboot node {} from its disk",
            req.node_id
        )));
    };
    apply_transition(&mut edit, ProvisionState::Deployed, "nodes.unrescue")?;
    bump_identity(
        &mut edit,
        "nodes.unrescue: the rescue ramdisk's identity ends",
    );
    condition_rescued(
        &mut edit,
        ConditionStatus::False,
        "Unrescued",
        "the machine is rebooted from its disk".to_owned(),
    );
    let args = CommandArgs::BmcPower(PowerArgs {
        node_id: req.node_id.to_string(),
        lease_epoch: epoch,
        action: PowerAction::Reboot,
        boot_device: Some(BootDevice::Disk),
        network_boot: None,
    });
    super::bmc::queue(tx, &holder, &req.node_id, args, timeout_ms, OWNER)?;
    Ok((edit.save(tx)?, holder))
}

/// The `Rescued` condition, whatever state the node is in now.
fn condition_rescued(edit: &mut Edit, status: ConditionStatus, reason: &str, msg: String) {
    crate::conditions::apply_owned(edit, OWNER, RESCUED, status, reason, msg);
}

/// Once the ramdisk reported (and its session is live), `rescue.start` with the node's keys.
fn next(tx: &Tx<'_>, t: &mut Turn<'_>) -> Result<Option<String>, OpError> {
    if t.boot.steps_at.is_none()
        || t.boot.work_command_id.is_some()
        || t.boot.work_step.is_some()
        || !t.live
    {
        return Ok(None);
    }
    let id = queue_start(tx, t.boot, t.now, t.timeout)?;
    t.boot.work_command_id = Some(id);
    tx.put_boot(t.boot)?;
    Ok(Some(t.boot.node_id.clone()))
}

/// Queues `rescue.start` for the ramdisk of boot `b` with the node's keys; returns its id.
pub(crate) fn queue_start(
    tx: &Tx<'_>,
    b: &BootRecord,
    now: i64,
    timeout_ms: i64,
) -> Result<String, OpError> {
    let keys: RescueArgs = tx
        .bmc(&b.node_id)?
        .and_then(|m| m.rescue)
        .and_then(|v| serde_json::from_value(v).ok())
        .ok_or_else(|| OpError::Internal(format!("node {} has no rescue keys", b.node_id)))?;
    let args = CommandArgs::RescueStart(keys);
    let rec = super::workflow::send_to_ramdisk(tx, &b.node_id, args, now, timeout_ms)?;
    let mut edit = Edit::report(tx, &b.node_id, OWNER)?;
    event(
        &mut edit,
        "running",
        format!("rescue.start ({}) sent to the ramdisk", rec.id),
    );
    edit.save(tx)?;
    Ok(rec.id)
}

/// The boot's `rescue.start` is over: it decides the rescue (in the transaction that ended it).
fn finished(
    tx: &Tx<'_>,
    cmd: &CommandRecord,
    mut b: BootRecord,
    mut edit: Edit,
) -> Result<(), OpError> {
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
            event(&mut edit, WorkStep::RescueReady.as_str(), msg.clone());
            condition(&mut edit, ConditionStatus::True, "SshReady", msg);
            b.work_step = Some(WorkStep::RescueReady);
        }
        Err(why) => {
            let why = format!("rescue failed: {why}");
            event(&mut edit, "failed", why.clone());
            WORKFLOW.fail(&mut edit, "StepFailed", why)?;
        }
    }
    tx.put_boot(&b)?;
    edit.save(tx)?;
    Ok(())
}
