//! `nodes.abort` (issue 16 item 5): stops a bare-metal workflow in flight. The node goes to
//! `failed` (failedFrom the state it was in, maintenance on) with the state's condition saying
//! who aborted it and at which step; the workflow's command in flight is cancelled; the
//! controller's pass then ends the boot, powers the machine off and ends the ramdisk's identity,
//! as for any failure. `nodes.recover` starts the state over.

use bc_protocol::{ConditionStatus, ProvisionState};
use cpl_store::Tx;

use super::boot::OWNER;
use crate::edit::Edit;
use crate::error::OpError;
use crate::ops::nodes::apply_transition;

/// The condition a workflow state reports its progress in.
pub fn condition_of(s: ProvisionState) -> Option<&'static str> {
    Some(match s {
        ProvisionState::Enrolling => super::enroll::BMC_VERIFIED,
        ProvisionState::Inspecting => super::inspect::INSPECTED,
        ProvisionState::Commissioning => super::commission::COMMISSIONED,
        ProvisionState::Deploying => super::deploy::DEPLOYED,
        ProvisionState::Releasing | ProvisionState::Retiring => super::release::CLEANED,
        ProvisionState::Rescue => super::rescue::RESCUED,
        _ => return None,
    })
}

/// `nodes.abort` in `tx`: the node fails from its workflow state. Returns the node and the
/// commands to cancel once committed (the boot's command in flight, commissioning's
/// `diag.nvml`, a pending `bmc.verify`). Errors: `NOT_FOUND`, `CONFLICT` on a stale version,
/// `INVALID_STATE` for a node without a BMC or not in a bare-metal workflow.
pub fn abort(
    tx: &Tx<'_>,
    node_id: &str,
    expected_version: u64,
    actor: &str,
) -> Result<(cpl_store::NodeRecord, Vec<String>), OpError> {
    let mut edit = Edit::begin(tx, node_id, Some(expected_version), actor)?;
    let state = edit.node.provision_state;
    let Some(bmc) = tx.bmc(node_id)? else {
        return Err(OpError::InvalidState(format!(
            "node {node_id} was not enrolled through a BMC: nodes.abort stops bare-metal workflows"
        )));
    };
    let Some(type_) = condition_of(state) else {
        return Err(OpError::InvalidState(format!(
            "node {node_id} is {state}: no bare-metal workflow is in flight to abort"
        )));
    };
    let mut cancel = Vec::new();
    let mut step = String::new();
    if let Some(b) = tx.boot(node_id)?.filter(|b| b.ended_at.is_none()) {
        step = match (&b.work_step, b.used_at, b.steps_at) {
            (Some(s), _, _) => format!(" after step {s}"),
            (None, Some(_), Some(_)) => " while the ramdisk worked".to_owned(),
            (None, Some(_), None) => " after the ramdisk joined".to_owned(),
            (None, None, _) => " before the ramdisk joined".to_owned(),
        };
        cancel.extend(b.work_command_id.clone());
        cancel.extend(b.diag_command_id.clone());
    }
    if state == ProvisionState::Enrolling {
        cancel.extend(bmc.verify_command_id.clone());
    }
    let why = format!("{state} aborted by {actor}{step}");
    crate::conditions::apply_owned(
        &mut edit,
        OWNER,
        type_,
        ConditionStatus::False,
        "Aborted",
        why.clone(),
    );
    apply_transition(&mut edit, ProvisionState::Failed, &why)?;
    Ok((edit.save(tx)?, cancel))
}
