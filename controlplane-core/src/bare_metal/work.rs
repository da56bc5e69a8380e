//! The work a ramdisk does after inspection (issue 16): release and retire's cleaning
//! ([`super::release`]), deploy's image write and boot from disk ([`super::deploy`]) and
//! rescue's SSH server ([`super::rescue`]). What
//! they share lives here: the ramdisk's first report that makes a boot ready for work, the
//! controller's next step on a boot, and what a deadline names.
//!
//! # Design
//! A boot carries the workflow's command in flight (`work_command_id`) and its last finished
//! step (`work_step`). Transactions record results; the controller's pass ([`next`]) queues
//! the next command, so a step whose sender is missing (no live ramdisk session, no site agent
//! holding the lease) waits for the next pass instead of being guessed done.

use bc_protocol::commands::bmc::{BootDevice, PowerAction};
use bc_protocol::{CommandName, ConditionStatus, ProvisionState};
use cpl_store::{BootRecord, NodeRecord, Tx};

use super::boot::{self, OWNER};
use super::verify::queue;
use super::{BareMetal, deploy, release, rescue};
use crate::edit::Edit;
use crate::error::OpError;
use crate::ops::nodes::apply_transition;

/// Inserts a workflow command for `node_id`'s ramdisk (queued, actor `BareMetalWorkflow`, its
/// deadline `timeout_ms` after `now`); the pass dispatches it.
pub(crate) fn insert_ramdisk_command(
    tx: &Tx<'_>,
    node_id: &str,
    name: CommandName,
    args: serde_json::Value,
    now: i64,
    timeout_ms: i64,
) -> Result<cpl_store::CommandRecord, OpError> {
    let rec = cpl_store::CommandRecord {
        id: crate::commands::new_command_id(),
        node_id: node_id.to_owned(),
        name: name.as_str().to_owned(),
        args,
        state: cpl_store::CommandState::Queued,
        progress: 0,
        result: None,
        error_code: None,
        error_message: None,
        actor: OWNER.to_owned(),
        created_at: now,
        sent_at: None,
        started_at: None,
        finished_at: None,
        deadline_at: now.saturating_add(timeout_ms),
        subject_node_id: None,
    };
    tx.insert_command(&rec)?;
    Ok(rec)
}

/// What is left at `now` of boot `b`'s state deadline in `pool`, ms, at least `min_ms`: the
/// deadline a long ramdisk command (a clean, an image write) is sent with.
pub(crate) fn time_left(
    b: &BootRecord,
    pool: Option<&cpl_store::Pool>,
    state: ProvisionState,
    now: i64,
    min_ms: i64,
) -> i64 {
    let limit = super::inspect::deadline(pool, state);
    b.phase_started_at
        .saturating_add(super::ms(limit))
        .saturating_sub(now)
        .max(min_ms)
}

/// The ramdisk states whose work follows the ramdisk's first report.
pub fn works(s: ProvisionState) -> bool {
    release::cleaning(s) || matches!(s, ProvisionState::Deploying | ProvisionState::Rescue)
}

/// The event kind and condition type of `s`'s work.
pub fn names(s: ProvisionState) -> (&'static str, &'static str) {
    match s {
        ProvisionState::Deploying => ("deployStep", deploy::DEPLOYED),
        ProvisionState::Rescue => ("rescueStep", rescue::RESCUED),
        _ => ("cleaningStep", release::CLEANED),
    }
}

/// Sets the work's condition of the node's state.
pub(crate) fn condition(edit: &mut Edit, status: ConditionStatus, reason: &str, msg: String) {
    let (_, type_) = names(edit.node.provision_state);
    crate::conditions::apply_owned(edit, OWNER, type_, status, reason, msg);
}

/// Records a step of the work as an event of the state's kind.
pub(crate) fn event(edit: &mut Edit, to: &str, msg: String) {
    let (kind, _) = names(edit.node.provision_state);
    edit.event(kind, None, Some(to.to_owned()), msg);
}

/// Fails the node from its work state, the reason in its condition.
pub(crate) fn fail(edit: &mut Edit, reason: &str, why: String) -> Result<(), OpError> {
    condition(edit, ConditionStatus::False, reason, why.clone());
    apply_transition(edit, ProvisionState::Failed, &why)
}

/// The ramdisk's inventory on a node in a work state (in the report's transaction): the
/// identifiers are checked against the BMC's again — a wrong machine is never cleaned or
/// written — then the boot is marked ready for work.
pub(crate) fn on_inventory(
    tx: &Tx<'_>,
    edit: &mut Edit,
    b: &mut BootRecord,
) -> Result<(), OpError> {
    if b.steps_at.is_some() {
        return Ok(());
    }
    let Some(bmc) = tx.bmc(&edit.node.id)? else {
        return Ok(());
    };
    edit.act_as(OWNER);
    if let Some(why) = boot::report_differs(edit, &bmc, ", so nothing was erased or written") {
        return fail(edit, "HardwareMismatch", why);
    }
    b.steps_at = Some(edit.now());
    tx.put_boot(b)?;
    let next = match edit.node.provision_state {
        ProvisionState::Deploying => "image.write",
        ProvisionState::Rescue => "rescue.start",
        _ => "disk.clean",
    };
    event(
        edit,
        "ready",
        format!(
            "the ramdisk joined with boot token {} and reported; {next} is sent next",
            b.token_id
        ),
    );
    Ok(())
}

/// The next command of boot `b`'s work (the controller's pass, in its transaction), with the
/// node whose queue to dispatch: the ramdisk's for its own commands, the lease holder's for
/// `bmc.*`. `None` when nothing is due or its sender is missing.
pub(crate) fn next(
    tx: &Tx<'_>,
    bm: &BareMetal,
    b: &mut BootRecord,
    node: &NodeRecord,
    holder: Option<(String, u64)>,
    now: i64,
    timeout: i64,
) -> Result<Option<String>, OpError> {
    let state = node.provision_state;
    if !works(state) || b.work_command_id.is_some() || b.steps_at.is_none() {
        return Ok(None);
    }
    let live = bm.sessions.live_epoch(&b.node_id).is_some();
    let pool = match &node.pool_id {
        Some(p) => tx.pool(p)?,
        None => None,
    };
    let (id, dispatch) = match (state, b.work_step.as_deref()) {
        (ProvisionState::Releasing | ProvisionState::Retiring, None) if live => {
            let id = release::queue_clean(tx, b, pool.as_ref(), state, now)?;
            (id, b.node_id.clone())
        }
        (ProvisionState::Rescue, None) if live => {
            let id = rescue::queue_start(tx, b, now, timeout)?;
            (id, b.node_id.clone())
        }
        (ProvisionState::Deploying, None) if live => {
            let id = deploy::queue_write(tx, b, pool.as_ref(), now)?;
            (id, b.node_id.clone())
        }
        (ProvisionState::Deploying, Some(deploy::IMAGE_WRITTEN)) => {
            let Some((h, epoch)) = holder else {
                return Ok(None);
            };
            let args = serde_json::json!({
                "nodeId": b.node_id, "leaseEpoch": epoch,
                "device": BootDevice::Disk.as_str(), "persistent": true
            });
            let rec = queue(
                tx,
                &h,
                &b.node_id,
                CommandName::BmcSetBootDevice,
                args,
                timeout,
                OWNER,
            )?;
            (rec.id, h)
        }
        (ProvisionState::Deploying, Some(deploy::BOOT_DEVICE_SET)) => {
            let Some((h, epoch)) = holder else {
                return Ok(None);
            };
            let args = serde_json::json!({
                "nodeId": b.node_id, "leaseEpoch": epoch, "action": PowerAction::Reboot.as_str()
            });
            let rec = queue(
                tx,
                &h,
                &b.node_id,
                CommandName::BmcPower,
                args,
                timeout,
                OWNER,
            )?;
            (rec.id, h)
        }
        _ => return Ok(None),
    };
    b.work_command_id = Some(id);
    tx.put_boot(b)?;
    Ok(Some(dispatch))
}

/// The boot whose work command `cmd` is, with the node's edit, when `cmd` is the current boot's
/// command in flight and the node is still in the boot's work state.
pub(crate) fn owner_of(
    tx: &Tx<'_>,
    cmd: &cpl_store::CommandRecord,
) -> Result<Option<(BootRecord, Edit)>, OpError> {
    let node_id = cmd.subject_node_id.as_deref().unwrap_or(&cmd.node_id);
    let Some(b) = tx.boot(node_id)? else {
        return Ok(None);
    };
    if b.ended_at.is_some() || b.work_command_id.as_deref() != Some(cmd.id.as_str()) {
        return Ok(None);
    }
    let edit = Edit::report(tx, node_id, OWNER)?;
    let state = edit.node.provision_state;
    if !works(state) || state.as_str() != b.purpose {
        return Ok(None);
    }
    Ok(Some((b, edit)))
}

/// What a failed or lost command says, for messages: `<name> <state>: <code>: <message>`.
pub(crate) fn failure(cmd: &cpl_store::CommandRecord) -> String {
    format!(
        "{} {}: {}: {}",
        cmd.name,
        cmd.state.as_str(),
        cmd.error_code.as_deref().unwrap_or(""),
        cmd.error_message.as_deref().unwrap_or("")
    )
}

/// Why a node in a work state outlived its deadline of `secs`, from how far boot `b` got.
pub(crate) fn overdue_reason(b: &BootRecord, secs: u64) -> String {
    match (b.used_at, b.steps_at, b.work_command_id.as_deref()) {
        (_, Some(_), Some(id)) => format!(
            "its command {id} did not finish within {secs}s of the state's start (last step: {})",
            b.work_step.as_deref().unwrap_or("none")
        ),
        (Some(_), Some(_), None) => format!(
            "the ramdisk reported but the next step could not be sent within {secs}s (last step: {}; no ramdisk session or no site agent holding the lease)",
            b.work_step.as_deref().unwrap_or("none")
        ),
        (Some(_), None, _) => {
            format!("the ramdisk joined but did not report an inventory within {secs}s")
        }
        (None, _, _) if b.command_id.is_none() => format!(
            "the machine was never powered on into the ramdisk within {secs}s: no site agent of its site held the lease"
        ),
        (None, _, _) => format!(
            "the machine never booted the ramdisk within {secs}s: it was powered with PXE ({}), but no ramdisk joined with its boot token {}",
            b.command_id.as_deref().unwrap_or("?"),
            b.token_id
        ),
    }
}
