//! The workflow table: one [`Workflow`] entry per bare-metal provision state, and what is
//! decided through it in a transaction — the ramdisk's report (`on_report`), a command that
//! ended ([`on_final`], [`on_power_on_final`]), a state past its deadline (`fail_overdue`).
//! The controller's pass (`super::controller`) and `nodes.abort` read the same entries.
//!
//! Adding a workflow is adding its module (the entry and the functions it names) and one line
//! in [`WORKFLOWS`]; a test holds the table to one entry per state and one per ramdisk state.

use std::time::Duration;

use bc_protocol::commands::CommandErrorCode;
use bc_protocol::{ConditionStatus, ProvisionState};
use cpl_store::{BootRecord, CommandRecord, CommandState, Pool, Tx};

use super::boot::OWNER;
use super::workflow::{Ramdisk, Workflow};
use super::{commission, deploy, inspect, release, rescue, verify};
use crate::edit::Edit;
use crate::error::OpError;
use crate::ops::nodes::apply_transition;

/// Every bare-metal workflow, one per provision state.
pub static WORKFLOWS: &[&Workflow] = &[
    &verify::WORKFLOW,
    &inspect::WORKFLOW,
    &commission::WORKFLOW,
    &deploy::WORKFLOW,
    &rescue::WORKFLOW,
    &release::RELEASING,
    &release::RETIRING,
];

/// The workflow of `state`, `None` for a state no workflow owns (`ready`, `failed`, …).
pub fn of(state: ProvisionState) -> Option<&'static Workflow> {
    WORKFLOWS.iter().copied().find(|w| w.state == state)
}

/// What `state`'s boot into the ramdisk does; `None` when the state boots nothing.
pub fn ramdisk(state: ProvisionState) -> Option<&'static Ramdisk> {
    of(state).and_then(|w| w.ramdisk.as_ref())
}

/// Whether a node in `state` runs the ramdisk.
pub fn in_ramdisk(state: ProvisionState) -> bool {
    ramdisk(state).is_some()
}

/// The states a machine spends in the ramdisk, in the table's order.
pub fn ramdisk_states() -> impl Iterator<Item = ProvisionState> {
    WORKFLOWS
        .iter()
        .filter(|w| w.ramdisk.is_some())
        .map(|w| w.state)
}

/// How long `state` may last for a node of `pool`; `None` for a state without a workflow or
/// with the control plane's deadline (`enrolling`: `--bmc-verify-deadline`).
pub fn deadline(pool: Option<&Pool>, state: ProvisionState) -> Option<Duration> {
    of(state).and_then(|w| w.limit(pool))
}

/// The ramdisk's inventory arrived (in the report's transaction, after the profile conditions
/// were refreshed): a node in a ramdisk state whose boot the ramdisk used is handed to its
/// workflow's [`Ramdisk::on_report`].
pub(crate) fn on_report(tx: &Tx<'_>, edit: &mut Edit) -> Result<(), OpError> {
    let state = edit.node.provision_state;
    let Some(r) = ramdisk(state) else {
        return Ok(());
    };
    // The workflows' steps create commands, end boots and read the site's records: not one
    // node's report alone (cpl_store::Store::write_node).
    tx.require_write_lock()?;
    let Some(mut b) = tx.boot(&edit.node.id)? else {
        return Ok(());
    };
    if b.used_at.is_none() || b.ended_at.is_some() || b.purpose != state {
        return Ok(());
    }
    (r.on_report)(tx, edit, &mut b)
}

/// A command that just ended and was its node's boot's command in flight (a workflow step:
/// `diag.nvml`, `disk.clean`, `image.write`, `rescue.start`, a deploy's `bmc.*`) is handed to
/// the workflow of the boot's state ([`Ramdisk::finished`]), while the node is still in it.
/// Anything else is ignored.
pub fn on_final(tx: &Tx<'_>, cmd: &CommandRecord) -> Result<(), OpError> {
    let node_id = cmd.subject_node_id.as_deref().unwrap_or(&cmd.node_id);
    let Some(b) = tx.boot(node_id)? else {
        return Ok(());
    };
    let in_flight = |id: &Option<String>| id.as_deref() == Some(cmd.id.as_str());
    if b.ended_at.is_some() || !(in_flight(&b.work_command_id) || in_flight(&b.diag_command_id)) {
        return Ok(());
    }
    let edit = Edit::report(tx, node_id, OWNER)?;
    let state = edit.node.provision_state;
    let Some(r) = ramdisk(state).filter(|_| state == b.purpose) else {
        return Ok(());
    };
    (r.finished)(tx, cmd, b, edit)
}

/// A failed power-on of a pending boot fails the node at once with what the BMC answered (the
/// condition its workflow names: reason `NetworkBootNotRequested` when the machine never asked
/// the site's boot service for its script, `PowerOnFailed` otherwise), instead of waiting for
/// the deadline; a `LEASE_LOST` only clears it, so the next pass powers the machine on through
/// the new holder. A ramdisk that joined already came up, whatever the command says late.
pub fn on_power_on_final(tx: &Tx<'_>, cmd: &CommandRecord) -> Result<(), OpError> {
    if cmd.state == CommandState::Succeeded {
        return Ok(());
    }
    let Some(node_id) = cmd.subject_node_id.as_deref() else {
        return Ok(());
    };
    let Some(mut b) = tx.boot(node_id)? else {
        return Ok(());
    };
    if b.ended_at.is_some()
        || b.used_at.is_some()
        || b.command_id.as_deref() != Some(cmd.id.as_str())
    {
        return Ok(());
    }
    let code = cmd.error_code.as_deref().unwrap_or("");
    if code == CommandErrorCode::LeaseLost.as_str() {
        b.command_id = None;
        tx.put_boot(&b)?;
        return Ok(());
    }
    let mut edit = Edit::begin(tx, node_id, None, OWNER)?;
    let state = edit.node.provision_state;
    let Some(r) = ramdisk(state).filter(|_| state == b.purpose) else {
        return Ok(());
    };
    let (reason, why) = if code == CommandErrorCode::NetworkBootNotRequested.as_str() {
        (
            "NetworkBootNotRequested",
            format!(
                "the machine was powered on with PXE but never asked for its script ({}): {}",
                cmd.name,
                cmd.error_message.as_deref().unwrap_or("")
            ),
        )
    } else {
        (
            "PowerOnFailed",
            format!(
                "the BMC did not power the machine on into the ramdisk: {} {}: {code}: {}",
                cmd.name,
                cmd.state.as_str(),
                cmd.error_message.as_deref().unwrap_or("")
            ),
        )
    };
    crate::conditions::apply_owned(
        &mut edit,
        OWNER,
        r.power_on_condition,
        ConditionStatus::False,
        reason,
        why.clone(),
    );
    apply_transition(&mut edit, ProvisionState::Failed, &why)?;
    edit.save(tx)?;
    Ok(())
}

/// Fails the node of boot `b` when its ramdisk state outlived its deadline at `now`, saying
/// what never happened ([`Ramdisk::overdue`]); `Ok(false)` when it moved on, has time left, or
/// its work made the state open-ended.
pub(crate) fn fail_overdue(tx: &Tx<'_>, b: &BootRecord, now: i64) -> Result<bool, OpError> {
    let mut edit = Edit::begin(tx, &b.node_id, None, OWNER)?;
    let state = edit.node.provision_state;
    let Some(w) = of(state).filter(|_| state == b.purpose) else {
        return Ok(false);
    };
    let Some(r) = &w.ramdisk else {
        return Ok(false);
    };
    if r.open_ended_after.is_some() && b.work_step == r.open_ended_after {
        return Ok(false);
    }
    let pool = match &edit.node.pool_id {
        Some(p) => tx.pool(p)?,
        None => None,
    };
    let Some(limit) = w.limit(pool.as_ref()) else {
        return Ok(false);
    };
    if now
        < b.phase_started_at
            .saturating_add(cpl_store::duration_ms(limit))
    {
        return Ok(false);
    }
    let (reason, mut why) = (r.overdue)(b, limit.as_secs());
    if b.mismatches > 0 && b.used_at.is_none() {
        why.push_str(&format!(
            "; {} join(s) with its boot token came from a machine that does not show its BMC's identifiers (HardwareMismatch says what differed)",
            b.mismatches
        ));
    }
    w.condition(&mut edit, ConditionStatus::False, reason, why.clone());
    apply_transition(&mut edit, ProvisionState::Failed, &why)?;
    edit.save(tx)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bare_metal_state_has_exactly_one_workflow_and_every_ramdisk_state_one_boot() {
        for s in ProvisionState::ALL {
            let n = WORKFLOWS.iter().filter(|w| w.state == *s).count();
            assert!(n <= 1, "{s} has {n} workflows");
        }
        // The states the spec's bare-metal workflows run in, and those among them that boot
        // the ramdisk: each has its one entry, and nothing else boots.
        let workflows = [
            ProvisionState::Enrolling,
            ProvisionState::Inspecting,
            ProvisionState::Commissioning,
            ProvisionState::Deploying,
            ProvisionState::Rescue,
            ProvisionState::Releasing,
            ProvisionState::Retiring,
        ];
        for s in workflows {
            assert!(of(s).is_some(), "{s} has no workflow");
        }
        assert_eq!(WORKFLOWS.len(), workflows.len());
        let mut ramdisk: Vec<ProvisionState> = ramdisk_states().collect();
        ramdisk.sort();
        let mut want = workflows[1..].to_vec();
        want.sort();
        assert_eq!(ramdisk, want, "the ramdisk states");
        assert!(!in_ramdisk(ProvisionState::Enrolling));
        // Every ramdisk state has a pool deadline (a boot nobody finishes must fail), and its
        // steps have an event kind of their own.
        for s in ramdisk_states() {
            let w = of(s).map(|w| (w.limit(None), w.condition));
            assert!(matches!(w, Some((Some(_), c)) if !c.is_empty()), "{s}");
        }
        let kinds: Vec<&str> = WORKFLOWS.iter().filter_map(|w| w.steps).collect();
        assert!(kinds.contains(&"cleaningStep") && kinds.contains(&"deployStep"));
    }

    #[test]
    fn the_deadline_of_a_state_is_its_pools_or_its_default() {
        assert_eq!(
            deadline(None, ProvisionState::Inspecting),
            Some(inspect::DEFAULT_INSPECTION_DEADLINE)
        );
        let pool = Pool {
            id: "pool_p".into(),
            site_id: None,
            name: "p".into(),
            kind: bc_protocol::PoolKind::MetalHost,
            agent: bc_protocol::PoolAgent::Bcd,
            owner_tenant_id: None,
            hardware_profile: Default::default(),
            acceptance: cpl_store::Acceptance {
                deploy_deadline_seconds: Some(60),
                ..Default::default()
            },
            remediation: Default::default(),
            conditions: Vec::new(),
            remediation_resumed_at: None,
            remediation_trips: 0,
            version: 1,
            created_at: 1,
        };
        assert_eq!(
            deadline(Some(&pool), ProvisionState::Deploying),
            Some(Duration::from_secs(60))
        );
        assert_eq!(
            deadline(Some(&pool), ProvisionState::Releasing),
            Some(release::DEFAULT_CLEANING_DEADLINE)
        );
        assert_eq!(deadline(None, ProvisionState::Enrolling), None);
        assert_eq!(deadline(None, ProvisionState::Ready), None);
    }
}
