//! Node verbs of the operator API (`nodes.cordon`, `nodes.drain`, `nodes.taint`, ...) and the
//! node writes of workflows and controllers (provision transitions, connectivity). Each takes the
//! caller's transaction and returns the saved [`NodeRecord`].

use bc_protocol::{Connectivity, Power, ProvisionState, Trust};
use cpl_store::{DedicatedRootLease, NodeRecord, Taint, Tx};

use super::{new_id, valid_key};
use crate::edit::Edit;
use crate::error::OpError;
use crate::provision;

/// The `noScheduleReasons` entry `nodes.drain` adds until the node's allocations are released.
pub const REASON_DRAINING: &str = "draining";
/// The `noScheduleReasons` entry present while connectivity is `unreachable` or `lost`.
pub const REASON_UNREACHABLE: &str = "unreachable";

/// The `noScheduleReasons` entry of the operator taint `key`.
pub fn taint_reason(key: &str) -> String {
    format!("taint:{key}")
}

fn bool_event(edit: &mut Edit, kind: &str, from: bool, to: bool, message: &str) {
    edit.event(kind, Some(from.to_string()), Some(to.to_string()), message);
}

fn set_cordoned(edit: &mut Edit, on: bool, message: &str) {
    let was = edit.node.cordoned;
    if was != on {
        bool_event(edit, "cordoned", was, on, message);
        edit.node.cordoned = on;
    }
}

/// `nodes.cordon`: no new work lands on the node. Cordoning a cordoned node changes nothing.
pub fn cordon(
    tx: &Tx<'_>,
    node_id: &str,
    expected_version: u64,
    actor: &str,
) -> Result<NodeRecord, OpError> {
    let mut edit = Edit::begin(tx, node_id, Some(expected_version), actor)?;
    set_cordoned(&mut edit, true, "nodes.cordon");
    edit.save(tx)
}

/// `nodes.uncordon`: clears `cordoned`, and `draining` with it (uncordoning cancels a drain).
pub fn uncordon(
    tx: &Tx<'_>,
    node_id: &str,
    expected_version: u64,
    actor: &str,
) -> Result<NodeRecord, OpError> {
    let mut edit = Edit::begin(tx, node_id, Some(expected_version), actor)?;
    set_cordoned(&mut edit, false, "nodes.uncordon");
    edit.set_reason(REASON_DRAINING, false);
    edit.save(tx)
}

/// `nodes.drain`: cordon, plus `draining` in `noScheduleReasons` while the node still holds
/// allocations; releasing the last one removes it ([`crate::placer::release`]).
pub fn drain(
    tx: &Tx<'_>,
    node_id: &str,
    expected_version: u64,
    actor: &str,
) -> Result<NodeRecord, OpError> {
    let mut edit = Edit::begin(tx, node_id, Some(expected_version), actor)?;
    set_cordoned(&mut edit, true, "nodes.drain");
    let active = tx.active_allocation_count(node_id)?;
    edit.set_reason(REASON_DRAINING, active > 0);
    edit.save(tx)
}

/// `nodes.taint`: adds or replaces the operator taint `key` (with `taint:<key>` in
/// `noScheduleReasons`).
pub fn taint(
    tx: &Tx<'_>,
    node_id: &str,
    expected_version: u64,
    actor: &str,
    key: &str,
    value: &str,
) -> Result<NodeRecord, OpError> {
    valid_key("taint key", key)?;
    let mut edit = Edit::begin(tx, node_id, Some(expected_version), actor)?;
    let before = tx
        .taints(node_id)?
        .into_iter()
        .find(|t| t.key == key)
        .map(|t| t.value);
    if before.as_deref() != Some(value) {
        let taint = Taint {
            key: key.to_owned(),
            value: value.to_owned(),
            created_by: actor.to_owned(),
            created_at: edit.now(),
        };
        tx.put_taint(node_id, &taint)?;
        edit.event(
            &format!("taint:{key}"),
            before,
            Some(value.to_owned()),
            "nodes.taint",
        );
    }
    edit.set_reason(&taint_reason(key), true);
    edit.save(tx)
}

/// `nodes.untaint`: removes the taint `key`; `NOT_FOUND` if the node has no such taint.
pub fn untaint(
    tx: &Tx<'_>,
    node_id: &str,
    expected_version: u64,
    actor: &str,
    key: &str,
) -> Result<NodeRecord, OpError> {
    let mut edit = Edit::begin(tx, node_id, Some(expected_version), actor)?;
    let before = tx
        .taints(node_id)?
        .into_iter()
        .find(|t| t.key == key)
        .ok_or_else(|| OpError::NotFound {
            kind: "taint",
            id: format!("{node_id}/{key}"),
        })?;
    tx.remove_taint(node_id, key)?;
    edit.event(
        &format!("taint:{key}"),
        Some(before.value),
        None,
        "nodes.untaint",
    );
    edit.set_reason(&taint_reason(key), false);
    edit.save(tx)
}

/// Applies a legal `provisionState` move to `edit` (with `failedFrom` and maintenance on a
/// failure). Errors: `INVALID_STATE` naming from and to for a move the table lacks.
pub fn apply_transition(edit: &mut Edit, to: ProvisionState, message: &str) -> Result<(), OpError> {
    let from = edit.node.provision_state;
    let t = provision::transition(from, edit.node.failed_from, to)?;
    edit.node.provision_state = t.to;
    edit.node.failed_from = t.failed_from;
    edit.event(
        "provisionState",
        Some(from.to_string()),
        Some(to.to_string()),
        message,
    );
    if t.maintenance_on {
        let reason = format!("failed in {from}: {message}");
        if !edit.node.maintenance {
            bool_event(edit, "maintenance", false, true, &reason);
        }
        edit.node.maintenance = true;
        edit.node.maintenance_reason = Some(reason);
    }
    Ok(())
}

/// A provision move by a workflow or controller (JoinService, NodeLifecycle acceptance,
/// bare-metal workflows). `expected_version: None` acts on the current row. Moving to `failed`
/// records `failedFrom` and turns maintenance on with `message` as the reason.
///
/// Errors: `INVALID_STATE` naming from and to for a move the table lacks.
pub fn transition(
    tx: &Tx<'_>,
    node_id: &str,
    expected_version: Option<u64>,
    actor: &str,
    to: ProvisionState,
    message: &str,
) -> Result<NodeRecord, OpError> {
    let mut edit = Edit::begin(tx, node_id, expected_version, actor)?;
    apply_transition(&mut edit, to, message)?;
    edit.save(tx)
}

/// `nodes.adopt`: the operator's acceptance of an `adopting` node (`adopting -> adopted`), the
/// same move NodeLifecycle makes when acceptance passes.
pub fn adopt(
    tx: &Tx<'_>,
    node_id: &str,
    expected_version: u64,
    actor: &str,
) -> Result<NodeRecord, OpError> {
    let mut edit = Edit::begin(tx, node_id, Some(expected_version), actor)?;
    apply_transition(&mut edit, ProvisionState::Adopted, "nodes.adopt")?;
    crate::conditions::apply(&mut edit, &crate::acceptance::accepted_by_operator());
    edit.save(tx)
}

/// `nodes.recover`: moves a `failed` node back to `failedFrom` and clears it. Maintenance stays
/// on: it is its own axis, turned off with `nodes.setMaintenance`.
pub fn recover(
    tx: &Tx<'_>,
    node_id: &str,
    expected_version: u64,
    actor: &str,
) -> Result<NodeRecord, OpError> {
    let mut edit = Edit::begin(tx, node_id, Some(expected_version), actor)?;
    recover_in(&mut edit)?;
    edit.save(tx)
}

/// The move of `nodes.recover` on an edit: `failed` back to `failedFrom`. Errors:
/// `INVALID_STATE` when the node is not failed with a failedFrom.
pub fn recover_in(edit: &mut Edit) -> Result<(), OpError> {
    let state = edit.node.provision_state;
    let Some(back) = edit
        .node
        .failed_from
        .filter(|_| state == ProvisionState::Failed)
    else {
        return Err(OpError::InvalidState(format!(
            "node {} is {state}, not failed with a failedFrom: nothing to recover",
            edit.node.id
        )));
    };
    apply_transition(edit, back, "nodes.recover")
}

/// `nodes.setMaintenance`: turns maintenance on (with `reason`) or off.
pub fn set_maintenance(
    tx: &Tx<'_>,
    node_id: &str,
    expected_version: u64,
    actor: &str,
    on: bool,
    reason: Option<&str>,
) -> Result<NodeRecord, OpError> {
    let mut edit = Edit::begin(tx, node_id, Some(expected_version), actor)?;
    let reason = on.then(|| reason.unwrap_or("nodes.setMaintenance").to_owned());
    if edit.node.maintenance != on || edit.node.maintenance_reason != reason {
        let msg = reason
            .clone()
            .unwrap_or_else(|| "nodes.setMaintenance".into());
        let was = edit.node.maintenance;
        bool_event(&mut edit, "maintenance", was, on, &msg);
        edit.node.maintenance = on;
        edit.node.maintenance_reason = reason;
    }
    edit.save(tx)
}

/// `nodes.revokeIdentity`: `identityGeneration + 1`, so certificates of earlier generations
/// never work again. The gateway closes the node's open stream (it checks the generation).
pub fn revoke_identity(
    tx: &Tx<'_>,
    node_id: &str,
    expected_version: u64,
    actor: &str,
) -> Result<NodeRecord, OpError> {
    let mut edit = Edit::begin(tx, node_id, Some(expected_version), actor)?;
    bump_identity(&mut edit, "nodes.revokeIdentity");
    edit.save(tx)
}

/// identityGeneration + 1 with its event: every certificate of the node stops working.
pub(crate) fn bump_identity(edit: &mut Edit, message: &str) {
    let from = edit.node.identity_generation;
    edit.node.identity_generation = from.saturating_add(1);
    edit.event(
        "identityGeneration",
        Some(from.to_string()),
        Some(edit.node.identity_generation.to_string()),
        message,
    );
}

/// `INVALID_STATE` while `node_id` holds allocations; `what_to_do` ends the message.
pub(crate) fn refuse_while_allocated(
    tx: &Tx<'_>,
    node_id: &str,
    what_to_do: &str,
) -> Result<(), OpError> {
    let active = tx.active_allocation_count(node_id)?;
    if active > 0 {
        return Err(OpError::InvalidState(format!(
            "node {node_id} still holds {active} allocation(s); {what_to_do}"
        )));
    }
    Ok(())
}

/// `nodes.delete`: bumps `identityGeneration`, ends any dedicated-root lease, records `deleted`
/// and removes the row (taints go with it; events stay). Refused (`INVALID_STATE`) while the
/// node holds allocations. Returns the record as it was last saved.
pub fn delete(
    tx: &Tx<'_>,
    node_id: &str,
    expected_version: u64,
    actor: &str,
) -> Result<NodeRecord, OpError> {
    let mut edit = Edit::begin(tx, node_id, Some(expected_version), actor)?;
    refuse_while_allocated(tx, node_id, "drain it first")?;
    if let Some(lease) = tx.active_lease(node_id)? {
        tx.end_lease(&lease.id, edit.now(), actor)?;
    }
    bump_identity(&mut edit, "nodes.delete");
    edit.event("deleted", None, None, "nodes.delete");
    let record = edit.save(tx)?;
    tx.delete_node(node_id)?;
    Ok(record)
}

/// `nodes.updateSpec`: replaces the desired spec and bumps `generation`; the node reports
/// `observedGeneration` once it converged.
pub fn update_spec(
    tx: &Tx<'_>,
    node_id: &str,
    expected_version: u64,
    actor: &str,
    spec: serde_json::Value,
) -> Result<NodeRecord, OpError> {
    if !spec.is_object() {
        return Err(OpError::InvalidArgument(
            "spec must be a JSON object".to_owned(),
        ));
    }
    let mut edit = Edit::begin(tx, node_id, Some(expected_version), actor)?;
    let from = edit.node.generation;
    edit.node.generation = from.saturating_add(1);
    edit.node.spec = spec;
    edit.event(
        "generation",
        Some(from.to_string()),
        Some(edit.node.generation.to_string()),
        "nodes.updateSpec",
    );
    edit.save(tx)
}

/// Starts a dedicated-root lease for `tenant_id`: trust becomes `tenant-controlled` (no capacity,
/// no platform secrets). Refused while another lease is active or the node holds allocations.
pub fn start_dedicated_root(
    tx: &Tx<'_>,
    node_id: &str,
    expected_version: u64,
    actor: &str,
    tenant_id: &str,
) -> Result<(NodeRecord, DedicatedRootLease), OpError> {
    if tenant_id.trim().is_empty() {
        return Err(OpError::InvalidArgument("tenantId is required".to_owned()));
    }
    let mut edit = Edit::begin(tx, node_id, Some(expected_version), actor)?;
    if let Some(l) = tx.active_lease(node_id)? {
        return Err(OpError::InvalidState(format!(
            "node {node_id} is already under dedicated-root lease {} of tenant {}",
            l.id, l.tenant_id
        )));
    }
    let active = tx.active_allocation_count(node_id)?;
    if active > 0 {
        return Err(OpError::InvalidState(format!(
            "node {node_id} still holds {active} allocation(s); drain it before a dedicated-root lease"
        )));
    }
    let lease = DedicatedRootLease {
        id: new_id("lease"),
        node_id: node_id.to_owned(),
        tenant_id: tenant_id.to_owned(),
        trust_before: edit.node.trust,
        started_at: edit.now(),
        started_by: actor.to_owned(),
        ended_at: None,
        ended_by: None,
    };
    tx.insert_lease(&lease)?;
    let from = edit.node.trust;
    edit.node.trust = Trust::TenantControlled;
    edit.event(
        "trust",
        Some(from.to_string()),
        Some(Trust::TenantControlled.to_string()),
        format!("dedicated-root lease {} for tenant {tenant_id}", lease.id),
    );
    // A tenant-controlled node holds no platform break-glass keys: a new generation without them
    // makes the agent remove the ones it installed.
    if let Some(spec) = edit.node.spec.as_object_mut()
        && spec.remove("breakGlassSsh").is_some()
    {
        let before = edit.node.generation;
        edit.node.generation = before.saturating_add(1);
        edit.event(
            "generation",
            Some(before.to_string()),
            Some(edit.node.generation.to_string()),
            "break-glass keys removed for the dedicated-root lease".to_owned(),
        );
    }
    Ok((edit.save(tx)?, lease))
}

/// Ends the node's dedicated-root lease and restores the trust it had before.
pub fn end_dedicated_root(
    tx: &Tx<'_>,
    node_id: &str,
    expected_version: u64,
    actor: &str,
) -> Result<NodeRecord, OpError> {
    let mut edit = Edit::begin(tx, node_id, Some(expected_version), actor)?;
    let Some(lease) = tx.active_lease(node_id)? else {
        return Err(OpError::InvalidState(format!(
            "node {node_id} has no active dedicated-root lease"
        )));
    };
    tx.end_lease(&lease.id, edit.now(), actor)?;
    let from = edit.node.trust;
    edit.node.trust = lease.trust_before;
    edit.event(
        "trust",
        Some(from.to_string()),
        Some(lease.trust_before.to_string()),
        format!("dedicated-root lease {} ended", lease.id),
    );
    edit.save(tx)
}

/// The connectivity writer's helper (gateway, Liveness): sets `connectivity` and keeps
/// `unreachable` in `noScheduleReasons` exactly while it is `unreachable` or `lost`, in the same
/// transaction.
pub fn set_connectivity(
    tx: &Tx<'_>,
    node_id: &str,
    actor: &str,
    to: Connectivity,
    message: &str,
) -> Result<NodeRecord, OpError> {
    let mut edit = Edit::begin(tx, node_id, None, actor)?;
    apply_connectivity(&mut edit, to, message);
    edit.save(tx)
}

/// [`set_connectivity`] on an edit in progress (session open and close change session fields in
/// the same save).
pub fn apply_connectivity(edit: &mut Edit, to: Connectivity, message: &str) {
    let from = edit.node.connectivity;
    if from != to {
        edit.node.connectivity = to;
        edit.event(
            "connectivity",
            Some(from.to_string()),
            Some(to.to_string()),
            message,
        );
    }
    let unreachable = matches!(to, Connectivity::Unreachable | Connectivity::Lost);
    edit.set_reason(REASON_UNREACHABLE, unreachable);
}

/// The power writer's helper (bare-metal power control through the BMC): sets `power`. Power
/// is an axis of its own: it never touches `noScheduleReasons` and is not in NodeDetail.
pub fn set_power(
    tx: &Tx<'_>,
    node_id: &str,
    actor: &str,
    to: Power,
) -> Result<NodeRecord, OpError> {
    let mut edit = Edit::begin(tx, node_id, None, actor)?;
    let from = edit.node.power;
    if from != to {
        edit.node.power = to;
        edit.event("power", Some(from.to_string()), Some(to.to_string()), "BMC");
    }
    edit.save(tx)
}

/// The node's taints (for `nodes.get` callers that want them beside NodeDetail).
pub fn list_taints(tx: &Tx<'_>, node_id: &str) -> Result<Vec<Taint>, OpError> {
    Ok(tx.taints(node_id)?)
}
