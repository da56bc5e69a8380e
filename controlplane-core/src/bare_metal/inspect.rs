//! The `inspecting` workflow (issue 15): a verified enrollment (or `nodes.inspect` of a `ready`
//! machine) boots the ramdisk with a one-time token; its first inventory ends the inspection:
//! the identifiers are checked again against the BMC's, the node goes to `commissioning`
//! ([`super::commission`]), or `failed` saying what differed or what never happened.
//!
//! # Limitations
//! A machine that reboots inside the ramdisk after its join finds its token spent and is
//! failed by the deadline. SATA/SAS disk health needs a tool the image does not ship
//! (smartctl): such disks are named as having no health log.

use std::time::Duration;

use bc_protocol::{ConditionStatus, ProvisionState};
use cpl_store::{BootRecord, CommandRecord, NodeRecord, Tx};
use serde::Deserialize;
use utoipa::ToSchema;

use super::boot::{self, OWNER};
use super::workflow::{Deadline, Ramdisk, Turn, Workflow};
use crate::edit::Edit;
use crate::error::OpError;
use crate::ops::nodes::apply_transition;

/// The condition inspection writes.
pub const INSPECTED: &str = "Inspected";
/// Default of `acceptance.inspectionDeadlineSeconds`.
pub const DEFAULT_INSPECTION_DEADLINE: Duration = Duration::from_secs(1800);

/// `inspecting`: boot the ramdisk, check the machine against its BMC, hand it to
/// commissioning. It sends no command of its own.
pub const WORKFLOW: Workflow = Workflow {
    state: ProvisionState::Inspecting,
    condition: INSPECTED,
    steps: None,
    deadline: Deadline::Pool {
        seconds: |a| a.inspection_deadline_seconds,
        default: DEFAULT_INSPECTION_DEADLINE,
    },
    ramdisk: Some(Ramdisk {
        power_on_condition: INSPECTED,
        open_ended_after: None,
        on_report,
        next: nothing_next,
        finished: nothing_finished,
        overdue,
    }),
    abort: super::workflow::boot_commands,
};

/// `nodes.inspect` request.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InspectRequest {
    #[serde(alias = "id")]
    pub node_id: crate::text::Id,
    /// When given, the node must still be at this version.
    #[serde(default)]
    pub version: Option<u64>,
}

/// `enrolling` (verified) or `ready` → `inspecting`, in `edit`. The controller boots it.
pub(crate) fn start(edit: &mut Edit, why: &str) -> Result<(), OpError> {
    apply_transition(edit, ProvisionState::Inspecting, why)?;
    WORKFLOW.condition(
        edit,
        ConditionStatus::False,
        "Booting",
        "waiting for the machine to boot the ramdisk and report".to_owned(),
    );
    Ok(())
}

/// `nodes.inspect` in `tx` by `actor`: a verified `enrolling` node, or a `ready` one, goes to
/// `inspecting`; the controller boots it into the ramdisk. Errors: `NOT_FOUND`, `CONFLICT` on a
/// stale `version`, `INVALID_STATE` for any other state or an unverified BMC.
pub fn inspect(tx: &Tx<'_>, req: &InspectRequest, actor: &str) -> Result<NodeRecord, OpError> {
    let mut edit = Edit::begin(tx, &req.node_id, req.version, actor)?;
    let verified = tx
        .bmc(&req.node_id)?
        .is_some_and(|b| b.verified_at.is_some());
    if !verified {
        return Err(OpError::InvalidState(format!(
            "node {} has no verified BMC: only a machine enrolled through its BMC (nodes.enroll) and verified can be inspected",
            req.node_id
        )));
    }
    start(&mut edit, "nodes.inspect")?;
    edit.save(tx)
}

/// The ramdisk's first inventory (after the profile conditions were refreshed): the machine is
/// checked again against its BMC, and commissioning's steps decide `ready` or `failed`.
fn on_report(tx: &Tx<'_>, edit: &mut Edit, b: &mut BootRecord) -> Result<(), OpError> {
    let Some(bmc) = tx.bmc(&edit.node.id)? else {
        return Ok(());
    };
    edit.act_as(OWNER);
    if let Some(why) = boot::report_differs(edit, &bmc, "") {
        WORKFLOW.condition(
            edit,
            ConditionStatus::False,
            "HardwareMismatch",
            why.clone(),
        );
        return apply_transition(edit, ProvisionState::Failed, &why);
    }
    WORKFLOW.condition(
        edit,
        ConditionStatus::True,
        "Inspected",
        format!(
            "the ramdisk reported the machine's inventory with boot token {}",
            b.token_id
        ),
    );
    super::commission::begin(tx, edit, b)
}

/// Inspection sends nothing after the power-on.
fn nothing_next(_: &Tx<'_>, _: &mut Turn<'_>) -> Result<Option<String>, OpError> {
    Ok(None)
}

/// Inspection has no command in flight.
fn nothing_finished(_: &Tx<'_>, _: &CommandRecord, _: BootRecord, _: Edit) -> Result<(), OpError> {
    Ok(())
}

/// What never happened within `secs`: the power-on, the ramdisk's join, or its report.
fn overdue(b: &BootRecord, secs: u64) -> (&'static str, String) {
    let why = match (b.used_at, b.command_id.as_deref()) {
        (Some(_), _) => format!(
            "the ramdisk joined but did not report an inventory within {secs}s of the inspection's start"
        ),
        (None, None) => format!(
            "the machine was never powered on into the ramdisk within {secs}s: no site agent of its site held the lease"
        ),
        (None, Some(id)) => format!(
            "the machine never booted the ramdisk within {secs}s: it was powered on with PXE ({id}), but no ramdisk joined with its boot token {}",
            b.token_id
        ),
    };
    ("InspectionDeadline", why)
}
