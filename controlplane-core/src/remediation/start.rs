//! Starting a remediation of one node, in one transaction: the node still has a fault and no
//! open remediation, its pool remediates (`observe` records what it would do; `auto` acts), it
//! has not flapped past `maxAttemptsPerNode`, its ladder has a step, and the pool's circuit
//! breaker lets one more start (else the breaker trips and nothing starts).

use bc_protocol::ProvisionState;
use cpl_store::{RemediationMode, RemediationPhase, RemediationRecord, RemediationState, Tx};

use super::breaker::{self, HOUR_MS, Load};
use super::climb::{self, Dispatch};
use super::fault::{self, describe};
use super::finish::give_up;
use super::{Ctx, OWNER};
use crate::error::OpError;

/// What a start came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Started {
    /// Nothing to start (no fault, already open, out of service, the pool is off).
    Nothing,
    /// The pool's breaker is open: nothing starts in it until an operator resumes it.
    Paused,
    /// This start would have broken a limit: the breaker tripped.
    Tripped,
    /// A remediation was recorded (observed, given up at once, or started); the node whose
    /// queue to dispatch.
    Recorded(Dispatch),
}

/// A new remediation id: `rem_` and 20 characters of `[a-z0-9]`.
pub fn new_id() -> String {
    format!("rem_{}", cpl_store::random_lowercase(20))
}

/// Starts a remediation of `node_id` at `now` if it needs one and its pool allows it.
pub(crate) fn start(tx: &Tx<'_>, node_id: &str, ctx: &Ctx, now: i64) -> Result<Started, OpError> {
    let Some(node) = tx.node(node_id)? else {
        return Ok(Started::Nothing);
    };
    let in_service = matches!(
        node.provision_state,
        ProvisionState::Adopted | ProvisionState::Deployed
    );
    if !in_service
        || node.maintenance
        || tx.open_remediation(node_id)?.is_some()
        || tx.remediation_suspension(node_id)?.is_some()
    {
        return Ok(Started::Nothing);
    }
    let Some((pool, policy)) = super::policy::of_node(tx, &node)? else {
        return Ok(Started::Nothing);
    };
    let has_bmc = tx.bmc(node_id)?.is_some_and(|b| b.verified_at.is_some());
    let Some(fault) = fault::of(&node, &policy, has_bmc, now) else {
        return Ok(Started::Nothing);
    };
    let ladder = policy.ladder(fault.kind);
    let mut rem = RemediationRecord {
        id: new_id(),
        node_id: node_id.to_owned(),
        pool_id: Some(pool.id.clone()),
        mode: policy.mode,
        fault,
        ladder,
        step_index: 0,
        phase: RemediationPhase::Draining,
        command_id: None,
        verify_command_id: None,
        acted_at: None,
        cordoned: false,
        draining: false,
        waiting: None,
        state: RemediationState::Active,
        disruptive: false,
        started_at: now,
        phase_started_at: now,
        ended_at: None,
        outcome: None,
    };
    let ladder_text = if rem.ladder.is_empty() {
        "no step".to_owned()
    } else {
        rem.ladder
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if policy.mode == RemediationMode::Observe {
        tx.put_remediation(&rem)?;
        let message = format!(
            "{}: would cordon the node and try {ladder_text} for {} (the pool's remediation mode is observe: nothing is done)",
            rem.id,
            describe(&rem.fault)
        );
        event(tx, &rem, "observed", &message, now)?;
        return Ok(Started::Recorded(None));
    }
    let attempts =
        tx.node_remediations_since(node_id, now.saturating_sub(policy.attempt_window_ms))?;
    if attempts >= u64::from(policy.max_attempts_per_node) {
        tx.put_remediation(&rem)?;
        let why = format!(
            "the node was remediated {attempts} times within {} s (maxAttemptsPerNode {}): it flaps, and is not healed forever",
            policy.attempt_window_ms / 1000,
            policy.max_attempts_per_node
        );
        give_up(tx, &mut rem, "Flapping", &why, now)?;
        return Ok(Started::Recorded(None));
    }
    if rem.ladder.is_empty() {
        tx.put_remediation(&rem)?;
        let why = format!(
            "the pool's ladder for a {} fault has no step: a person must look at it",
            rem.fault.kind
        );
        give_up(tx, &mut rem, "Exhausted", &why, now)?;
        return Ok(Started::Recorded(None));
    }
    if breaker::paused(&pool) {
        return Ok(Started::Paused);
    }
    let since = now
        .saturating_sub(HOUR_MS)
        .max(pool.remediation_resumed_at.unwrap_or(i64::MIN));
    let (open, started_last_hour) = tx.pool_remediation_load(&pool.id, since)?;
    let load = Load {
        open,
        started_last_hour,
        pool_nodes: tx.pool_node_count(&pool.id)?,
    };
    if let Some(why) = breaker::refuses(&policy, load) {
        breaker::trip(tx, &pool, node_id, &describe(&rem.fault), &why, now)?;
        return Ok(Started::Tripped);
    }
    rem.disruptive = true;
    tx.put_remediation(&rem)?;
    let message = format!("{}: {}; ladder {ladder_text}", rem.id, describe(&rem.fault));
    event(tx, &rem, "active", &message, now)?;
    let id = rem.id.clone();
    Ok(Started::Recorded(climb::advance(tx, &id, ctx, now)?))
}

fn event(
    tx: &Tx<'_>,
    rem: &RemediationRecord,
    to: &str,
    message: &str,
    now: i64,
) -> Result<(), OpError> {
    tx.record_event(&cpl_store::NewEvent {
        node_id: &rem.node_id,
        at: now,
        kind: "remediation",
        from: None,
        to: Some(to),
        actor: OWNER,
        message,
    })?;
    Ok(())
}
