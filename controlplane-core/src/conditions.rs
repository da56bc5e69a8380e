//! Typed conditions (spec "State is several axes": conditions owned by Inventory, Health,
//! Liveness, NodeLifecycle) and the helper every owner writes them through, which keeps
//! `noScheduleReasons` in step in the same transaction.

use bc_protocol::limits::{Field, bound};
use bc_protocol::{Condition, ConditionStatus};
use cpl_store::{HardwareProfile, NodeRecord, Tx};

use crate::edit::Edit;
use crate::error::OpError;

/// Condition types that, while `true`, keep new work off the node: their type name is put into
/// `noScheduleReasons` (spec: "a NoSchedule condition (GpuCountMismatch)").
pub const NO_SCHEDULE_CONDITIONS: &[&str] = &[
    "GpuCountMismatch",
    "GpuModelMismatch",
    "GpuUnhealthy",
    "XidCritical",
    "P2pDrainRequired",
    "RepeatedWorkloadXid",
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
    /// The GPUs (PCI bus ids) the condition is about; empty for the whole node.
    pub gpus: Vec<String>,
}

/// Applies the whole-node condition `type_` of `owner` to `edit` ([`apply`]).
pub fn apply_owned(
    edit: &mut Edit,
    owner: &str,
    type_: &str,
    status: ConditionStatus,
    reason: &str,
    message: String,
) {
    apply(
        edit,
        &ConditionUpdate {
            type_: type_.to_owned(),
            status,
            reason: reason.to_owned(),
            message,
            owner: owner.to_owned(),
            gpus: Vec::new(),
        },
    );
}

/// RFC 3339 (UTC, milliseconds) of a Unix time in milliseconds.
pub fn rfc3339_ms(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Sets condition `update.type_` on `edit`'s node: the one function every condition of every owner
/// is written through. `lastTransitionTime` moves only when the status changes; a NoSchedule
/// condition adds its type to `noScheduleReasons` while `true` and removes it otherwise. One event
/// (by the condition's owner) when the condition changes.
pub fn apply(edit: &mut Edit, update: &ConditionUpdate) {
    let actor = edit.actor().to_owned();
    edit.act_as(&update.owner);
    apply_as_owner(edit, update);
    edit.act_as(&actor);
}

fn apply_as_owner(edit: &mut Edit, update: &ConditionUpdate) {
    // The last guard before the store: a reason or message built from what a node reported (a
    // SpecStatus, the GPU names of an inventory) is cut to its limit (bc_protocol::limits).
    let mut update = update.clone();
    bound(Field::ConditionReason, &mut update.reason);
    bound(Field::ConditionMessage, &mut update.message);
    let update = &update;
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
        gpus: update.gpus.clone(),
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
    tx: &Tx<'_>,
    node_id: &str,
    update: &ConditionUpdate,
) -> Result<NodeRecord, OpError> {
    let mut edit = Edit::begin(tx, node_id, None, &update.owner)?;
    apply(&mut edit, update);
    edit.save(tx)
}

/// The Inventory controller's hardware-profile checks: `GpuCountMismatch` and `GpuModelMismatch`
/// from the pool's profile and the reported GPUs. Each is `unknown` while there is no inventory,
/// and absent from the result when the profile sets no expectation.
pub fn profile_conditions(
    profile: &HardwareProfile,
    inventory: Option<&bc_protocol::inventory::Inventory>,
) -> Vec<ConditionUpdate> {
    let mut out = Vec::new();
    let gpus = crate::inventory::gpu_atoms(inventory).len();
    let models = crate::inventory::gpu_models(inventory);
    let make = |type_: &str, status, reason: &str, message: String| ConditionUpdate {
        type_: type_.to_owned(),
        status,
        reason: reason.to_owned(),
        message,
        owner: "Inventory".to_owned(),
        gpus: Vec::new(),
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
        // The profile names a model ("H100"); NVML names the product ("NVIDIA H100 80GB HBM3").
        let want = expected.to_ascii_lowercase();
        let wrong: Vec<&String> = models
            .iter()
            .filter(|m| !m.to_ascii_lowercase().contains(&want))
            .collect();
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
                format!("every GPU is a {expected}"),
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

/// The Inventory controller's part of a report: re-derives the pool profile's conditions
/// ([`profile_conditions`]) on `edit`, with their `noScheduleReasons`, and applies the profile's
/// `pcieLinkDegraded` setting to the node's `PcieLinkDegraded` condition
/// ([`crate::pcie::set_no_schedule`]).
pub fn refresh_profile_conditions(tx: &Tx<'_>, edit: &mut Edit) -> Result<(), OpError> {
    let profile = match &edit.node.pool_id {
        Some(p) => tx.pool(p)?.map(|p| p.hardware_profile).unwrap_or_default(),
        None => HardwareProfile::default(),
    };
    crate::pcie::set_no_schedule(edit, &profile);
    if profile.expected_gpu_count.is_none() && profile.expected_gpu_model.is_none() {
        // Nothing to compare: the document is not even parsed (every session open lands here).
        return Ok(());
    }
    let inventory = crate::inventory::of(&edit.node);
    for update in profile_conditions(&profile, inventory.as_ref()) {
        apply(edit, &update);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::pools::{NewPool, create};
    use crate::schedulable::{CapacityBucket, SchedulingFacts, capacity_bucket};
    use crate::test_utils::{node, ready_host};
    use bc_protocol::{PoolAgent, PoolKind};

    #[test]
    fn gpu_count_mismatch_from_the_profile_makes_the_node_unhealthy()
    -> Result<(), Box<dyn std::error::Error>> {
        let store = cpl_store::testing::store()?;
        let n = store.write_blocking(|c| -> Result<NodeRecord, OpError> {
            let p = create(
                c,
                &NewPool {
                    name: "h100".into(),
                    kind: PoolKind::MetalHost,
                    agent: PoolAgent::Bcd,
                    site_id: None,
                    owner_tenant_id: None,
                    hardware_profile: HardwareProfile {
                        expected_gpu_count: Some(8),
                        expected_gpu_model: None,
                        ..Default::default()
                    },
                    acceptance: Default::default(),
                },
            )?;
            node(c, "node_a", Some(&p.id))?;
            ready_host(c, "node_a", 4)?;
            let mut edit = Edit::begin(c, "node_a", None, "Inventory")?;
            refresh_profile_conditions(c, &mut edit)?;
            edit.save(c)
        })?;
        assert_eq!(n.no_schedule_reasons, vec!["GpuCountMismatch"]);
        let cond = &n.conditions[0];
        assert_eq!(
            (cond.status, cond.owner.as_str()),
            (ConditionStatus::True, "Inventory")
        );
        assert!(cond.message.contains("expects 8") && cond.message.contains("reports 4"));
        assert_eq!(
            capacity_bucket(&SchedulingFacts::of(&n, None)),
            CapacityBucket::Unhealthy
        );
        Ok(())
    }

    #[test]
    fn a_condition_reason_and_message_are_cut_before_they_are_stored() -> Result<(), OpError> {
        let store = cpl_store::testing::store()?;
        let n = store.write_blocking(|c| -> Result<NodeRecord, OpError> {
            node(c, "node_a", None)?;
            set_condition(
                c,
                "node_a",
                &ConditionUpdate {
                    type_: "SpecConverged".into(),
                    status: ConditionStatus::False,
                    reason: "R".repeat(500),
                    message: "m".repeat(15 * 1024 * 1024),
                    owner: "NodeLifecycle".into(),
                    gpus: Vec::new(),
                },
            )
        })?;
        let c = &n.conditions[0];
        assert_eq!(c.message.chars().count(), 1024);
        assert!(c.message.ends_with(bc_protocol::limits::MARKER));
        assert_eq!(c.reason.chars().count(), 128);
        Ok(())
    }

    #[test]
    fn profile_conditions_are_unknown_without_inventory_and_absent_without_expectation() {
        let profile = HardwareProfile {
            expected_gpu_count: Some(2),
            expected_gpu_model: Some("NVIDIA H100 80GB HBM3".into()),
            ..Default::default()
        };
        let none = profile_conditions(&profile, None);
        assert!(none.iter().all(|c| c.status == ConditionStatus::Unknown));
        assert_eq!(none.len(), 2);
        let inv: bc_protocol::inventory::Inventory = serde_json::from_value(serde_json::json!({
            "schemaVersion": 1,
            "gpus": [
                {"uuid": "GPU-1", "name": "NVIDIA H100 80GB HBM3", "pciBusId": "0000:01:00.0", "source": "nvml"},
                {"uuid": "GPU-2", "name": "NVIDIA A100-SXM4-40GB", "pciBusId": "0000:02:00.0", "source": "nvml"}
            ]
        }))
        .unwrap_or_default();
        let got = profile_conditions(&profile, Some(&inv));
        assert_eq!(got[0].status, ConditionStatus::False, "count matches");
        assert_eq!(
            got[1].status,
            ConditionStatus::True,
            "one GPU of another model"
        );
        assert!(profile_conditions(&HardwareProfile::default(), Some(&inv)).is_empty());
    }
}
