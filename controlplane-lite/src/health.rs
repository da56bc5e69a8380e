//! The Health controller: turns `diag.nvml` and `gpu.reset` results into the `GpuUnhealthy`
//! condition (NoSchedule, so it enters noScheduleReasons in the same transaction). Unhealthy is
//! never sticky: a passing diag or a verified reset clears it.

use bc_protocol::ConditionStatus;
use serde_json::Value;

use crate::model::conditions::{ConditionUpdate, set_condition};
use crate::model::ops::write_tx;
use crate::store::Store;
use crate::store::commands::{CommandRecord, CommandState};

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

/// Applies a finished command's verdict to the node.
pub async fn on_command_result(store: &Store, c: &CommandRecord) {
    let Some(update) = verdict(c) else { return };
    let node_id = c.node_id.clone();
    let r = store
        .run(move |conn| Ok(write_tx(conn, |tx| set_condition(tx, &node_id, &update))))
        .await;
    match r {
        Ok(Ok(n)) => {
            tracing::info!(node_id = %n.id, reasons = ?n.no_schedule_reasons, "Health: GpuUnhealthy updated")
        }
        Ok(Err(e)) => {
            tracing::warn!(node_id = %c.node_id, error = %e, "Health: condition not written")
        }
        Err(e) => tracing::error!(node_id = %c.node_id, error = %e, "Health: store failed"),
    }
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
