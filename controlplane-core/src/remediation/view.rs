//! The operator's side of remediation: `remediations.list` and `remediations.get` (node, fault,
//! step, since, attempts, next step, why waiting), a pool's policy (`pools.setRemediation`) and
//! its breaker's resume (`pools.resumeRemediation`, in [`super::breaker`]), and a node's
//! suspension (`nodes.setRemediation`).

use cpl_store::{
    Fault, NodeRecord, Pool, Reader, RemediationFilter, RemediationMode, RemediationPhase,
    RemediationPolicy, RemediationRecord, RemediationState, RemediationStep, StepOutcome,
    Suspension, Tx,
};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::finish::{current, stop};
use super::policy;
use crate::conditions::rfc3339_ms;
use crate::edit::Edit;
use crate::error::OpError;
use crate::text::{Id, Text};

/// `remediations.list` filters; absent matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RemediationListRequest {
    #[serde(default)]
    pub pool_id: Option<Id>,
    #[serde(default)]
    pub node_id: Option<Id>,
    /// Only remediations that have not ended.
    #[serde(default)]
    pub open_only: bool,
    /// Default 100, at most 1000; newest first.
    #[serde(default)]
    pub limit: Option<u32>,
}

/// `remediations.get`: one remediation by id, or a node's newest.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RemediationRef {
    #[serde(default, alias = "id")]
    pub remediation_id: Option<Id>,
    #[serde(default)]
    pub node_id: Option<Id>,
}

/// `nodes.setRemediation`: suspend remediation on a node (an open one is cancelled; nothing
/// new starts) or lift the suspension.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SetRemediationRequest {
    #[serde(alias = "id")]
    pub node_id: Id,
    pub version: u64,
    pub suspended: bool,
    #[serde(default)]
    pub reason: Option<Text>,
}

/// `pools.setRemediation`: the pool's whole policy (absent keys take their defaults).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolRemediationRequest {
    #[serde(alias = "id")]
    pub pool_id: Id,
    pub version: u64,
    pub remediation: RemediationPolicy,
}

/// `pools.resumeRemediation`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResumeRemediationRequest {
    #[serde(alias = "id")]
    pub pool_id: Id,
    pub version: u64,
}

/// One step as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StepView {
    pub step: RemediationStep,
    pub outcome: StepOutcome,
    pub command_id: Option<String>,
    /// RFC 3339.
    pub at: String,
    pub message: String,
}

/// A remediation as the API shows it. Times are RFC 3339.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RemediationView {
    pub id: String,
    pub node_id: String,
    pub pool_id: Option<String>,
    /// `observe` or `auto`.
    pub mode: RemediationMode,
    pub state: RemediationState,
    pub fault: Fault,
    pub ladder: Vec<RemediationStep>,
    /// The rung in progress; absent once the ladder is exhausted or the remediation ended.
    pub step: Option<RemediationStep>,
    /// The rung after it, if the current one does not help.
    pub next_step: Option<RemediationStep>,
    pub phase: RemediationPhase,
    /// When the current phase began.
    pub since: String,
    pub started_at: String,
    pub ended_at: Option<String>,
    /// Steps that acted (skipped ones are not attempts).
    pub attempts: u32,
    pub tried: Vec<StepView>,
    /// Why it waits, when it does.
    pub waiting: Option<String>,
    pub command_id: Option<String>,
    pub verify_command_id: Option<String>,
    /// Whether the controller cordoned the node (it uncordons it on success).
    pub cordoned: bool,
    pub outcome: Option<String>,
    /// The operator's suspension of remediation on the node, if any.
    pub suspended: Option<Suspension>,
}

/// `remediations.list` answer, newest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RemediationList {
    pub remediations: Vec<RemediationView>,
}

/// The API view of `rem`.
pub fn view(r: &Reader<'_>, rem: &RemediationRecord) -> Result<RemediationView, OpError> {
    let steps = r.remediation_steps(&rem.id)?;
    let open = rem.ended_at.is_none();
    let step = current(rem).filter(|_| open);
    let next_step = usize::try_from(rem.step_index)
        .ok()
        .and_then(|i| rem.ladder.get(i + 1).copied())
        .filter(|_| open);
    Ok(RemediationView {
        id: rem.id.clone(),
        node_id: rem.node_id.clone(),
        pool_id: rem.pool_id.clone(),
        mode: rem.mode,
        state: rem.state,
        fault: rem.fault.clone(),
        ladder: rem.ladder.clone(),
        step,
        next_step,
        phase: rem.phase,
        since: rfc3339_ms(rem.phase_started_at),
        started_at: rfc3339_ms(rem.started_at),
        ended_at: rem.ended_at.map(rfc3339_ms),
        attempts: u32::try_from(
            steps
                .iter()
                .filter(|s| s.outcome != StepOutcome::Skipped)
                .count(),
        )
        .unwrap_or(u32::MAX),
        tried: steps
            .into_iter()
            .map(|s| StepView {
                step: s.step,
                outcome: s.outcome,
                command_id: s.command_id,
                at: rfc3339_ms(s.at),
                message: s.message,
            })
            .collect(),
        waiting: rem.waiting.clone(),
        command_id: rem.command_id.clone(),
        verify_command_id: rem.verify_command_id.clone(),
        cordoned: rem.cordoned,
        outcome: rem.outcome.clone(),
        suspended: r.remediation_suspension(&rem.node_id)?,
    })
}

/// `remediations.list`.
pub fn list(r: &Reader<'_>, req: &RemediationListRequest) -> Result<RemediationList, OpError> {
    let limit = req.limit.unwrap_or(100);
    if limit == 0 || limit > 1000 {
        return Err(OpError::InvalidArgument(format!(
            "limit must be between 1 and 1000, got {limit}"
        )));
    }
    let rows = r.remediations(&RemediationFilter {
        pool_id: req.pool_id.clone().map(Id::into_string),
        node_id: req.node_id.clone().map(Id::into_string),
        open_only: req.open_only,
        limit,
    })?;
    let remediations = rows
        .iter()
        .map(|rem| view(r, rem))
        .collect::<Result<_, _>>()?;
    Ok(RemediationList { remediations })
}

/// `remediations.get`: by id, or the node's newest. Errors: `INVALID_ARGUMENT` unless exactly
/// one of the two is given, `NOT_FOUND`.
pub fn get(r: &Reader<'_>, req: &RemediationRef) -> Result<RemediationView, OpError> {
    let rem = match (&req.remediation_id, &req.node_id) {
        (Some(id), None) => r.remediation(id)?.ok_or_else(|| OpError::NotFound {
            kind: "remediation",
            id: id.to_string(),
        })?,
        (None, Some(node)) => r
            .remediations(&RemediationFilter {
                node_id: Some(node.to_string()),
                limit: 1,
                ..Default::default()
            })?
            .into_iter()
            .next()
            .ok_or_else(|| OpError::NotFound {
                kind: "remediation of node",
                id: node.to_string(),
            })?,
        _ => {
            return Err(OpError::InvalidArgument(
                "remediations.get takes remediationId or nodeId, exactly one".to_owned(),
            ));
        }
    };
    view(r, &rem)
}

/// `pools.setRemediation`: replaces the pool's policy (checked first). Errors: `NOT_FOUND`,
/// `CONFLICT` on a stale `version`, `INVALID_ARGUMENT` naming the key out of range.
pub fn set_policy(tx: &Tx<'_>, req: &PoolRemediationRequest) -> Result<Pool, OpError> {
    policy::check(&req.remediation)?;
    let pool = crate::ops::pools::get(tx, &req.pool_id)?;
    if !tx.update_pool_remediation(&req.pool_id, req.version, &req.remediation)? {
        return Err(OpError::Conflict {
            kind: "pool",
            id: pool.id,
            expected: req.version,
            actual: pool.version,
        });
    }
    crate::ops::pools::get(tx, &req.pool_id)
}

/// `nodes.setRemediation` by `actor`: suspends remediation on the node (its open remediation,
/// if any, is cancelled: the cordon it set is lifted, a command in flight runs out) or lifts
/// the suspension, with a `remediation` event. Errors: `NOT_FOUND`, `CONFLICT` on a stale
/// `version`.
pub fn set_suspension(
    tx: &Tx<'_>,
    req: &SetRemediationRequest,
    actor: &str,
) -> Result<NodeRecord, OpError> {
    let node = tx
        .node(&req.node_id)?
        .ok_or_else(|| OpError::node_not_found(&req.node_id))?;
    if node.version != req.version {
        return Err(OpError::Conflict {
            kind: "node",
            id: node.id,
            expected: req.version,
            actual: node.version,
        });
    }
    let now = cpl_store::now_ms();
    let reason = req
        .reason
        .as_ref()
        .map_or("nodes.setRemediation", |r| r.as_str())
        .to_owned();
    let was = tx.remediation_suspension(&req.node_id)?.is_some();
    if req.suspended {
        tx.set_remediation_suspension(
            &req.node_id,
            Some(&Suspension {
                reason: reason.clone(),
                by: actor.to_owned(),
                at: now,
            }),
        )?;
        if let Some(mut rem) = tx.open_remediation(&req.node_id)? {
            let why = format!("remediation of the node was suspended by {actor}: {reason}");
            stop(tx, &mut rem, RemediationState::Cancelled, &why, now)?;
        }
    } else {
        tx.set_remediation_suspension(&req.node_id, None)?;
    }
    let mut edit = Edit::begin(tx, &req.node_id, None, actor)?;
    if was != req.suspended {
        let (from, to) = if req.suspended {
            ("enabled", "suspended")
        } else {
            ("suspended", "enabled")
        };
        edit.event(
            "remediation",
            Some(from.to_owned()),
            Some(to.to_owned()),
            format!("nodes.setRemediation: {reason}"),
        );
    }
    edit.save(tx)
}
