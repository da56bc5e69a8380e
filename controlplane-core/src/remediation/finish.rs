//! How a step and a remediation end, in the deciding transaction: a step that did not help
//! (the next rung follows), a success (what the controller set is cleared, and only that), a
//! give-up (maintenance on, naming the fault and every step tried), a cancel or a fault that
//! went away by itself (what the controller set is cleared).

use bc_protocol::ConditionStatus;
use cpl_store::{
    NewEvent, RemediationPhase, RemediationRecord, RemediationState, StepOutcome, StepRecord, Tx,
};

use super::fault::describe;
use super::{OWNER, REMEDIATED};
use crate::conditions::apply_owned;
use crate::edit::Edit;
use crate::error::OpError;
use crate::ops::nodes::REASON_DRAINING;

/// The current step of `rem`, if its ladder has one left.
pub(crate) fn current(rem: &RemediationRecord) -> Option<cpl_store::RemediationStep> {
    usize::try_from(rem.step_index)
        .ok()
        .and_then(|i| rem.ladder.get(i).copied())
}

/// Records `outcome` of the current step with `message` and, for a step that did not fix the
/// fault, moves to the next rung (`draining` again: the next pass drains, acts, or gives up).
pub(crate) fn step_over(
    tx: &Tx<'_>,
    rem: &mut RemediationRecord,
    outcome: StepOutcome,
    message: &str,
    now: i64,
) -> Result<(), OpError> {
    let Some(step) = current(rem) else {
        return Ok(());
    };
    tx.add_remediation_step(
        &rem.id,
        &StepRecord {
            step,
            outcome,
            command_id: rem.command_id.clone(),
            at: now,
            message: message.to_owned(),
        },
    )?;
    tx.record_event(&NewEvent {
        node_id: &rem.node_id,
        at: now,
        kind: "remediationStep",
        from: Some(step.as_str()),
        to: Some(outcome.as_str()),
        actor: OWNER,
        message: &format!("{}: {step} {outcome}: {message}", rem.id),
    })?;
    if outcome != StepOutcome::Succeeded {
        rem.step_index = rem.step_index.saturating_add(1);
        rem.phase = RemediationPhase::Draining;
        rem.command_id = None;
        rem.verify_command_id = None;
        rem.acted_at = None;
        rem.phase_started_at = now;
        rem.waiting = None;
        tx.put_remediation(rem)?;
    }
    Ok(())
}

/// Every step `rem` took, for people: `resetGpu (failed: …), rebootNode (skipped: …)`.
pub(crate) fn tried(tx: &Tx<'_>, rem: &RemediationRecord) -> Result<String, OpError> {
    let steps = tx.remediation_steps(&rem.id)?;
    if steps.is_empty() {
        return Ok("no step".to_owned());
    }
    Ok(steps
        .iter()
        .map(|s| format!("{} ({}: {})", s.step, s.outcome, s.message))
        .collect::<Vec<_>>()
        .join(", "))
}

/// Clears what the controller set on the node in `edit`: its cordon (only if it cordoned the
/// node and the node is still cordoned) and its `draining`.
fn undo(edit: &mut Edit, rem: &RemediationRecord, why: &str) {
    if rem.cordoned && edit.node.cordoned {
        edit.node.cordoned = false;
        edit.event(
            "cordoned",
            Some("true".to_owned()),
            Some("false".to_owned()),
            format!(
                "{}: {why}; uncordoned (the remediation had cordoned it)",
                rem.id
            ),
        );
    }
    if rem.draining {
        edit.set_reason(REASON_DRAINING, false);
    }
}

fn end(
    tx: &Tx<'_>,
    mut edit: Edit,
    rem: &mut RemediationRecord,
    state: RemediationState,
    outcome: String,
    now: i64,
) -> Result<(), OpError> {
    edit.event(
        "remediation",
        Some(RemediationState::Active.as_str().to_owned()),
        Some(state.as_str().to_owned()),
        format!("{}: {outcome}", rem.id),
    );
    edit.save(tx)?;
    rem.state = state;
    rem.phase = RemediationPhase::Ended;
    rem.ended_at = Some(now);
    rem.waiting = None;
    rem.outcome = Some(outcome);
    tx.put_remediation(rem)?;
    Ok(())
}

/// The current step fixed the fault (`how`): the step and the remediation succeed, the node's
/// `Remediated` condition says so, and the cordon and `draining` the controller set are cleared.
pub(crate) fn succeed(
    tx: &Tx<'_>,
    rem: &mut RemediationRecord,
    how: &str,
    now: i64,
) -> Result<(), OpError> {
    let step = current(rem).map_or("?", |s| s.as_str());
    step_over(tx, rem, StepOutcome::Succeeded, how, now)?;
    let mut edit = Edit::begin(tx, &rem.node_id, None, OWNER)?;
    let outcome = format!("{step} fixed {}: {how}", describe(&rem.fault));
    apply_owned(
        &mut edit,
        OWNER,
        REMEDIATED,
        ConditionStatus::True,
        "Healed",
        format!("{}: {outcome}", rem.id),
    );
    undo(&mut edit, rem, "the fault is fixed");
    end(tx, edit, rem, RemediationState::Succeeded, outcome, now)
}

/// Gives up on the node (`reason`: `Exhausted`, `Flapping`): maintenance on, its reason naming
/// the fault and every step tried, `Remediated` `false`, a `remediation` event. The node stays
/// cordoned: a person takes it from here.
pub(crate) fn give_up(
    tx: &Tx<'_>,
    rem: &mut RemediationRecord,
    reason: &str,
    why: &str,
    now: i64,
) -> Result<(), OpError> {
    let tried = tried(tx, rem)?;
    let message = format!(
        "remediation {} gave up on {}: {why}; tried {tried}",
        rem.id,
        describe(&rem.fault)
    );
    let mut edit = Edit::begin(tx, &rem.node_id, None, OWNER)?;
    if !edit.node.maintenance {
        edit.event(
            "maintenance",
            Some("false".to_owned()),
            Some("true".to_owned()),
            message.clone(),
        );
    }
    edit.node.maintenance = true;
    edit.node.maintenance_reason = Some(message.clone());
    apply_owned(
        &mut edit,
        OWNER,
        REMEDIATED,
        ConditionStatus::False,
        reason,
        message.clone(),
    );
    tracing::warn!(node_id = %rem.node_id, remediation = %rem.id, %message, "remediation gave up");
    end(tx, edit, rem, RemediationState::GaveUp, message, now)
}

/// Ends `rem` without a verdict (`Cancelled`: suspended, turned off, the node left service;
/// `Cleared`: the fault went away by itself), clearing what the controller set. A node that no
/// longer exists only has its remediation ended.
pub(crate) fn stop(
    tx: &Tx<'_>,
    rem: &mut RemediationRecord,
    state: RemediationState,
    why: &str,
    now: i64,
) -> Result<(), OpError> {
    if tx.node(&rem.node_id)?.is_none() {
        rem.state = state;
        rem.phase = RemediationPhase::Ended;
        rem.ended_at = Some(now);
        rem.outcome = Some(why.to_owned());
        tx.put_remediation(rem)?;
        return Ok(());
    }
    let mut edit = Edit::begin(tx, &rem.node_id, None, OWNER)?;
    undo(&mut edit, rem, why);
    end(tx, edit, rem, state, why.to_owned(), now)
}
