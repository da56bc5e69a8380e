//! Stopping and restarting a bare-metal workflow. `nodes.abort` (issue 16 item 5) stops one in
//! flight: the node goes to `failed` (failedFrom the state it was in, maintenance on) with the
//! state's condition saying who aborted it and at which step; the commands its workflow entry
//! names are cancelled; the controller's pass then ends the boot, powers the machine off and
//! ends the ramdisk's identity, as for any failure. `nodes.recover` starts the state over.

use bc_protocol::{ConditionStatus, ProvisionState};
use cpl_store::{NodeRecord, Tx};

use super::boot::OWNER;
use crate::edit::Edit;
use crate::error::OpError;
use crate::ops::nodes::apply_transition;

/// `nodes.abort` in `tx`: the node fails from its workflow state. Returns the node and the
/// commands to cancel once committed (what the state's [`super::workflow::Workflow::abort`]
/// names: the boot's commands in flight, a pending `bmc.verify`). Errors: `NOT_FOUND`,
/// `CONFLICT` on a stale version, `INVALID_STATE` for a node without a BMC or not in a
/// bare-metal workflow.
pub fn abort(
    tx: &Tx<'_>,
    node_id: &str,
    expected_version: u64,
    actor: &str,
) -> Result<(NodeRecord, Vec<String>), OpError> {
    let mut edit = Edit::begin(tx, node_id, Some(expected_version), actor)?;
    let state = edit.node.provision_state;
    let Some(bmc) = tx.bmc(node_id)? else {
        return Err(OpError::InvalidState(format!(
            "node {node_id} was not enrolled through a BMC: nodes.abort stops bare-metal workflows"
        )));
    };
    let Some(workflow) = super::table::of(state) else {
        return Err(OpError::InvalidState(format!(
            "node {node_id} is {state}: no bare-metal workflow is in flight to abort"
        )));
    };
    let boot = tx.boot(node_id)?.filter(|b| b.ended_at.is_none());
    let step = match &boot {
        Some(b) => match (b.work_step, b.used_at, b.steps_at) {
            (Some(s), _, _) => format!(" after step {s}"),
            (None, Some(_), Some(_)) => " while the ramdisk worked".to_owned(),
            (None, Some(_), None) => " after the ramdisk joined".to_owned(),
            (None, None, _) => " before the ramdisk joined".to_owned(),
        },
        None => String::new(),
    };
    let cancel = (workflow.abort)(boot.as_ref(), &bmc);
    let why = format!("{state} aborted by {actor}{step}");
    crate::conditions::apply_owned(
        &mut edit,
        OWNER,
        workflow.condition,
        ConditionStatus::False,
        "Aborted",
        why.clone(),
    );
    apply_transition(&mut edit, ProvisionState::Failed, &why)?;
    Ok((edit.save(tx)?, cancel))
}

/// `nodes.recover` of a node: back to `failedFrom`, its open boot (whose power-on already went
/// out) ended so the controller's next pass begins a fresh one; an enrollment that failed is
/// verified again (its deadline counting anew). One edit, one `version` move.
pub fn recover(
    tx: &Tx<'_>,
    node_id: &str,
    expected_version: u64,
    actor: &str,
) -> Result<NodeRecord, OpError> {
    let mut edit = Edit::begin(tx, node_id, Some(expected_version), actor)?;
    crate::ops::nodes::recover_in(&mut edit)?;
    super::boot::end_open(tx, node_id, edit.now())?;
    if edit.node.provision_state == ProvisionState::Enrolling
        && let Some(mut b) = tx.bmc(node_id)?
    {
        b.verified_at = None;
        b.verify_command_id = None;
        b.verify_started_at = Some(edit.now());
        tx.put_bmc(&b)?;
        let site = edit.node.site_id.clone().unwrap_or_default();
        super::bmc::pending(&mut edit, &site);
    }
    edit.save(tx)
}
