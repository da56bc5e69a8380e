//! The Health controller: turns `diag.nvml` and `gpu.reset` results into the `GpuUnhealthy`
//! condition (NoSchedule, so it enters noScheduleReasons in the same transaction). Unhealthy is
//! never sticky: a passing diag or a verified reset clears it.

use bc_protocol::ConditionStatus;
use cpl_store::{CommandRecord, CommandState, NodeRecord, Store, Tx};
use serde_json::Value;

use crate::conditions::{ConditionUpdate, apply};
use crate::edit::Edit;
use crate::error::OpError;

/// The condition this controller owns.
pub const GPU_UNHEALTHY: &str = "GpuUnhealthy";

/// What a finished command says about the node's GPUs, if anything.
pub fn verdict(c: &CommandRecord) -> Option<ConditionUpdate> {
    let update = |status, reason: &str, message: String| ConditionUpdate {
        type_: GPU_UNHEALTHY.to_owned(),
        status,
        reason: reason.to_owned(),
        message,
        owner: "Health".to_owned(),
    };
    match (c.name.as_str(), c.state) {
        ("diag.nvml", CommandState::Succeeded) => {
            let r = c.result.as_ref()?;
            // A host without NVML says nothing about GPU health.
            if r.get("nvmlAvailable") == Some(&Value::Bool(false)) {
                return None;
            }
            let summary = r
                .get("summary")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            let action = r.get("action").and_then(Value::as_str).unwrap_or("none");
            match r.get("verdict").and_then(Value::as_str) {
                Some("fail") => Some(update(
                    ConditionStatus::True,
                    &format!("DiagFailed:{action}"),
                    summary,
                )),
                Some("pass") | Some("warn") => {
                    Some(update(ConditionStatus::False, "DiagPassed", summary))
                }
                _ => None,
            }
        }
        ("gpu.reset", CommandState::Succeeded) => Some(update(
            ConditionStatus::False,
            "ResetSucceeded",
            format!("gpu.reset {} verified", c.id),
        )),
        _ => None,
    }
}

/// The condition a critical XID sets (NoSchedule) until a reset or a passing diag.
pub const XID_CRITICAL: &str = "XidCritical";

/// What an XID event reported by the agent means for the node: reset- and reboot-required XIDs
/// set `XidCritical`; application faults and informational XIDs change nothing.
pub fn xid_update(event: &Value) -> Option<ConditionUpdate> {
    let class = event.get("class").and_then(Value::as_str)?;
    if !matches!(class, "resetRequired" | "rebootRequired") {
        return None;
    }
    let xid = event.get("xid").and_then(Value::as_u64).unwrap_or(0);
    let gpu = event
        .get("pciBusId")
        .and_then(Value::as_str)
        .unwrap_or("unknown GPU");
    let action = event
        .get("action")
        .and_then(Value::as_str)
        .unwrap_or("none");
    Some(ConditionUpdate {
        type_: XID_CRITICAL.to_owned(),
        status: ConditionStatus::True,
        reason: format!("Xid{xid}"),
        message: format!("Xid {xid} on {gpu}: {class}, action {action}"),
        owner: "Health".to_owned(),
    })
}

/// Applies an XID event from the node's agent (its own write transaction).
pub async fn on_xid(store: &Store, node_id: &str, event: &Value) {
    let Some(update) = xid_update(event) else {
        return;
    };
    let id = node_id.to_owned();
    match store
        .write(move |tx| apply_updates(tx, &id, &[update]))
        .await
    {
        Ok(Some(n)) => {
            tracing::info!(reasons = ?n.no_schedule_reasons, "Health: conditions updated")
        }
        Ok(None) => {}
        Err(e) => tracing::warn!(error = %e, "Health: condition not written"),
    }
}

/// Writes the conditions a finished command sets ([`updates_for`]) to its node, in the caller's
/// transaction. `None` when the command says nothing about the node's GPUs.
pub fn apply_command_result(tx: &Tx<'_>, c: &CommandRecord) -> Result<Option<NodeRecord>, OpError> {
    apply_updates(tx, &c.node_id, &updates_for(c))
}

/// Writes `updates` to the node in one save.
fn apply_updates(
    tx: &Tx<'_>,
    node_id: &str,
    updates: &[ConditionUpdate],
) -> Result<Option<NodeRecord>, OpError> {
    if updates.is_empty() {
        return Ok(None);
    }
    // XID events and command results are what the agent reported: they never move `version`.
    let mut edit = Edit::report(tx, node_id, "Health")?;
    for u in updates {
        apply(&mut edit, u);
    }
    edit.save(tx).map(Some)
}

/// The conditions a finished command sets. A passing diag or a verified reset also clears
/// `XidCritical`: unhealthy is never sticky.
pub fn updates_for(c: &CommandRecord) -> Vec<ConditionUpdate> {
    let Some(update) = verdict(c) else {
        return Vec::new();
    };
    let mut updates = vec![update.clone()];
    if update.status == ConditionStatus::False {
        updates.push(ConditionUpdate {
            type_: XID_CRITICAL.to_owned(),
            status: ConditionStatus::False,
            reason: update.reason.clone(),
            message: update.message.clone(),
            owner: "Health".to_owned(),
        });
    }
    updates
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(name: &str, state: CommandState, result: Option<Value>) -> CommandRecord {
        CommandRecord {
            id: "cmd_1".into(),
            node_id: "node_1".into(),
            name: name.into(),
            args: serde_json::json!({}),
            state,
            progress: 100,
            result,
            error_code: None,
            error_message: None,
            actor: "t".into(),
            created_at: 0,
            sent_at: None,
            started_at: None,
            finished_at: None,
            deadline_at: 1,
            subject_node_id: None,
        }
    }

    #[test]
    fn diag_and_reset_results_set_and_clear_gpu_unhealthy() {
        let fail = cmd(
            "diag.nvml",
            CommandState::Succeeded,
            Some(
                serde_json::json!({"nvmlAvailable": true, "verdict": "fail", "action": "resetGpu", "summary": "x"}),
            ),
        );
        let v = verdict(&fail).map(|u| (u.status, u.reason));
        assert_eq!(
            v,
            Some((ConditionStatus::True, "DiagFailed:resetGpu".to_owned()))
        );
        let pass = cmd(
            "diag.nvml",
            CommandState::Succeeded,
            Some(serde_json::json!({"nvmlAvailable": true, "verdict": "pass"})),
        );
        assert_eq!(
            verdict(&pass).map(|u| u.status),
            Some(ConditionStatus::False)
        );
        let no_nvml = cmd(
            "diag.nvml",
            CommandState::Succeeded,
            Some(serde_json::json!({"nvmlAvailable": false, "verdict": "fail"})),
        );
        assert!(verdict(&no_nvml).is_none());
        let reset = cmd("gpu.reset", CommandState::Succeeded, None);
        assert_eq!(
            verdict(&reset).map(|u| u.status),
            Some(ConditionStatus::False)
        );
        assert!(verdict(&cmd("gpu.reset", CommandState::Failed, None)).is_none());
    }
}
