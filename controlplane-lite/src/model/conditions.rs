//! Typed conditions (spec "State is several axes": conditions owned by Inventory, Health,
//! Liveness, NodeLifecycle) and the helper every owner writes them through, which keeps
//! `noScheduleReasons` in step in the same transaction.

use bc_protocol::{Condition, ConditionStatus};
use rusqlite::Connection;

use super::error::OpError;
use super::ops::Edit;
use crate::store::nodes::NodeRecord;
use crate::store::pools::HardwareProfile;

/// Condition types that, while `true`, keep new work off the node: their type name is put into
/// `noScheduleReasons` (spec: "a NoSchedule condition (GpuCountMismatch)").
pub const NO_SCHEDULE_CONDITIONS: &[&str] = &[
    "GpuCountMismatch",
    "GpuModelMismatch",
    "GpuUnhealthy",
    "XidCritical",
];

/// Whether `type_` is a NoSchedule condition.
pub fn is_no_schedule(type_: &str) -> bool {
    NO_SCHEDULE_CONDITIONS.contains(&type_)
}

/// A condition as its owner reports it; `lastTransitionTime` is filled in by [`set_condition`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionUpdate {
    pub type_: String,
    pub status: ConditionStatus,
    pub reason: String,
    pub message: String,
    /// The owning controller: `Inventory`, `Health`, `Liveness` or `NodeLifecycle`.
    pub owner: String,
}

/// RFC 3339 (UTC, milliseconds) of a Unix time in milliseconds.
pub fn rfc3339_ms(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Sets condition `update.type_` on `edit`'s node. `lastTransitionTime` moves only when the status
/// changes; a NoSchedule condition adds its type to `noScheduleReasons` while `true` and removes
/// it otherwise. One event per status change.
pub fn apply(edit: &mut Edit<'_>, update: &ConditionUpdate) {
    let now = rfc3339_ms(edit.now());
    let conditions = &mut edit.node.conditions;
    let previous = conditions.iter().position(|c| c.type_ == update.type_);
    let before = previous.map(|i| conditions[i].status);
    let changed_status = before != Some(update.status);
    let next = Condition {
        type_: update.type_.clone(),
        status: update.status,
        reason: update.reason.clone(),
        message: update.message.clone(),
        last_transition_time: match previous {
            Some(i) if !changed_status => conditions[i].last_transition_time.clone(),
            _ => now,
        },
        owner: update.owner.clone(),
    };
    let differs = previous.map(|i| conditions[i] != next).unwrap_or(true);
    match previous {
        Some(i) => conditions[i] = next,
        None => {
            conditions.push(next);
            conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
        }
    }
    // A reason or message change without a status change is saved too, so the version moves.
    if changed_status || differs {
        edit.event(
            &format!("condition:{}", update.type_),
            before.map(|s| s.to_string()),
            Some(update.status.to_string()),
            format!("{}: {}", update.reason, update.message),
        );
    }
    if is_no_schedule(&update.type_) {
        edit.set_reason(&update.type_, update.status == ConditionStatus::True);
    }
}

/// [`apply`] as one controller write on the current row (no version check; bumps `version` when
/// something changed).
pub fn set_condition(
    tx: &Connection,
    node_id: &str,
    update: &ConditionUpdate,
) -> Result<NodeRecord, OpError> {
    let mut edit = Edit::begin_unversioned(tx, node_id, &update.owner)?;
    apply(&mut edit, update);
    edit.save()
}

/// The Inventory controller's hardware-profile checks: `GpuCountMismatch` and `GpuModelMismatch`
/// from the pool's profile and the reported GPUs. Each is `unknown` while there is no inventory,
/// and absent from the result when the profile sets no expectation.
pub fn profile_conditions(
    profile: &HardwareProfile,
    inventory: Option<&serde_json::Value>,
) -> Vec<ConditionUpdate> {
    let mut out = Vec::new();
    let gpus = super::inventory::gpu_atoms(inventory).len();
    let models = super::inventory::gpu_models(inventory);
    let make = |type_: &str, status, reason: &str, message: String| ConditionUpdate {
        type_: type_.to_owned(),
        status,
        reason: reason.to_owned(),
        message,
        owner: "Inventory".to_owned(),
    };
    if let Some(expected) = profile.expected_gpu_count {
        out.push(match inventory {
            None => make(
                "GpuCountMismatch",
                ConditionStatus::Unknown,
                "NoInventory",
                "no inventory reported yet".into(),
            ),
            Some(_) if gpus == expected as usize => make(
                "GpuCountMismatch",
                ConditionStatus::False,
                "CountMatches",
                format!("{gpus} GPUs as the profile expects"),
            ),
            Some(_) => make(
                "GpuCountMismatch",
                ConditionStatus::True,
                "CountDiffers",
                format!("profile expects {expected} GPUs, inventory reports {gpus}"),
            ),
        });
    }
    if let Some(expected) = &profile.expected_gpu_model {
        let wrong: Vec<&String> = models.iter().filter(|m| *m != expected).collect();
        out.push(match inventory {
            None => make(
                "GpuModelMismatch",
                ConditionStatus::Unknown,
                "NoInventory",
                "no inventory reported yet".into(),
            ),
            Some(_) if wrong.is_empty() => make(
                "GpuModelMismatch",
                ConditionStatus::False,
                "ModelMatches",
                format!("every GPU is {expected}"),
            ),
            Some(_) => make(
                "GpuModelMismatch",
                ConditionStatus::True,
                "ModelDiffers",
                format!("profile expects {expected}, inventory reports {wrong:?}"),
            ),
        });
    }
    out
}
