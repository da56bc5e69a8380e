//! Release and retire of a bare-metal machine (issue 16): `deployed -> releasing -> ready` and
//! `ready | deployed | failed -> retiring -> retired`, each through the ramdisk's `disk.clean`.
//!
//! # Design
//! - `nodes.release` ([`release`]) and `nodes.retire` of an enrolled machine (`start_retire`)
//!   move the node and end the identity it held (`identityGeneration + 1`): the tenant's OS, or
//!   a ramdisk still up, can present nothing that works afterwards; the verb closes its session.
//! - `releasing` and `retiring` are ramdisk states ([`RELEASING`], [`RETIRING`]): the
//!   controller's pass boots the machine into the ramdisk with a one-time token as for an
//!   inspection. The ramdisk's first inventory
//!   ([`super::workflow::Workflow::ready_for_work`]) is checked against the BMC's identifiers
//!   again — a wrong machine is never cleaned — and marks the boot ready to clean.
//! - The pass then queues `disk.clean` (`next`) with the pool's
//!   `acceptance.cleaning` (`metadata` by default), its deadline what is left of the state's
//!   (`acceptance.cleaningDeadlineSeconds`, 3,600 s by default).
//! - Its result (`finished`, in the transaction that finished it) is one
//!   `cleaningStep` event per disk and the `Cleaned` condition. A disk that failed (or the
//!   command failing, timing out, being cancelled) fails the node (failedFrom `releasing` or
//!   `retiring`, maintenance on); `nodes.recover` boots and cleans again. A read-only disk is
//!   named and left. After a clean release, commissioning's inventory checks run again on the
//!   ramdisk's report (`super::commission::recheck`) → `ready`; a retire goes on to `retired`.
//!
//! # Limitations
//! Commissioning's `gpuDiag` (`diag.nvml`) is not re-run on release. A machine whose BMC cannot
//! be reached is not cleaned by anyone's guess: it stays `releasing` until the deadline fails it.

use std::time::Duration;

use bc_protocol::commands::CommandArgs;
use bc_protocol::commands::clean::{CleanArgs, CleanMode, CleanResult, DiskOutcome};
use bc_protocol::{CommandName, ConditionStatus, ProvisionState};
use cpl_store::{BootRecord, CommandRecord, CommandState, NodeRecord, Pool, Tx};

use super::workflow::{Deadline, Ramdisk, Turn, Workflow};
use crate::edit::Edit;
use crate::error::OpError;
use crate::ops::nodes::{apply_transition, bump_identity, refuse_while_allocated};

/// The condition cleaning writes.
pub const CLEANED: &str = "Cleaned";
/// Default of `acceptance.cleaningDeadlineSeconds`.
pub const DEFAULT_CLEANING_DEADLINE: Duration = Duration::from_secs(3600);
/// The shortest deadline a `disk.clean` is sent with, however little of the state's is left.
const MIN_CLEAN_TIMEOUT_MS: i64 = 60_000;

/// `releasing`: boot the ramdisk, clean every disk, check the machine again, `ready`.
pub const RELEASING: Workflow = Workflow {
    state: ProvisionState::Releasing,
    condition: CLEANED,
    steps: Some("cleaningStep"),
    deadline: Deadline::Pool {
        seconds: |a| a.cleaning_deadline_seconds,
        default: DEFAULT_CLEANING_DEADLINE,
    },
    ramdisk: Some(Ramdisk {
        power_on_condition: CLEANED,
        open_ended_after: None,
        on_report: |tx, edit, b| RELEASING.ready_for_work(tx, edit, b, CommandName::DiskClean),
        next,
        finished,
        overdue: |b, secs| ("CleaningDeadline", super::workflow::overdue_work(b, secs)),
    }),
    abort: super::workflow::boot_commands,
};

/// `retiring`: as [`RELEASING`], but a clean ends in `retired` (no identity, powered off).
pub const RETIRING: Workflow = Workflow {
    state: ProvisionState::Retiring,
    ..RELEASING
};

/// How much of each disk the pool erases.
pub fn mode(pool: Option<&Pool>) -> CleanMode {
    pool.and_then(|p| p.acceptance.cleaning).unwrap_or_default()
}

fn condition(edit: &mut Edit, status: ConditionStatus, reason: &str, msg: String) {
    RELEASING.condition(edit, status, reason, msg);
}

fn booting(edit: &mut Edit) {
    condition(
        edit,
        ConditionStatus::False,
        "Booting",
        "waiting for the machine to boot the ramdisk and clean its disks".to_owned(),
    );
}

/// `nodes.release`: a `deployed` machine enrolled through its BMC goes to `releasing`; its
/// identity ends at once. Errors: `NOT_FOUND`, `CONFLICT` on a stale version, `INVALID_STATE`
/// for a node without a BMC, one that holds allocations, or one not `deployed`.
pub fn release(
    tx: &Tx<'_>,
    node_id: &str,
    expected_version: u64,
    actor: &str,
) -> Result<NodeRecord, OpError> {
    let mut edit = Edit::begin(tx, node_id, Some(expected_version), actor)?;
    if tx.bmc(node_id)?.is_none() {
        return Err(OpError::InvalidState(format!(
            "node {node_id} was not enrolled through a BMC: there is no machine to boot and clean; a server you run yourself is retired (nodes.retire)"
        )));
    }
    refuse_while_allocated(tx, node_id, "drain it before releasing it")?;
    apply_transition(&mut edit, ProvisionState::Releasing, "nodes.release")?;
    bump_identity(
        &mut edit,
        "nodes.release: the deployed system's identity ends; nothing the tenant held keeps working",
    );
    tx.delete_deploy_identity(node_id)?;
    booting(&mut edit);
    edit.save(tx)
}

/// `nodes.retire` of a machine enrolled through its BMC, in `edit`: `ready`, `deployed` or
/// `failed` → `retiring`, its identity ended (the deploy's identity dropped); the pass boots and
/// cleans it.
pub(crate) fn start_retire(tx: &Tx<'_>, edit: &mut Edit) -> Result<(), OpError> {
    apply_transition(edit, ProvisionState::Retiring, "nodes.retire")?;
    bump_identity(
        edit,
        "nodes.retire: the machine is cleaned and retired; its identity ends",
    );
    tx.delete_deploy_identity(&edit.node.id)?;
    booting(edit);
    Ok(())
}

/// Once the ramdisk reported, `disk.clean` with the pool's mode, its deadline what is left of
/// the state's (at least a minute), when the ramdisk's session is live.
fn next(tx: &Tx<'_>, t: &mut Turn<'_>) -> Result<Option<String>, OpError> {
    if t.boot.steps_at.is_none()
        || t.boot.work_command_id.is_some()
        || t.boot.work_step.is_some()
        || !t.live
    {
        return Ok(None);
    }
    let id = queue_clean(tx, t.boot, t.pool, t.now)?;
    t.boot.work_command_id = Some(id);
    tx.put_boot(t.boot)?;
    Ok(Some(t.boot.node_id.clone()))
}

/// Queues `disk.clean` for the ramdisk of boot `b` with the pool's mode, its deadline what is
/// left of the state's (at least a minute), with a `cleaningStep` event and the `Cleaned`
/// condition unknown; returns the command's id.
pub(crate) fn queue_clean(
    tx: &Tx<'_>,
    b: &BootRecord,
    pool: Option<&Pool>,
    now: i64,
) -> Result<String, OpError> {
    let left = RELEASING.time_left(b, pool, now, MIN_CLEAN_TIMEOUT_MS);
    let m = mode(pool);
    let args = CommandArgs::DiskClean(CleanArgs { mode: m });
    let rec = super::workflow::send_to_ramdisk(tx, &b.node_id, args, now, left)?;
    let mut edit = Edit::report(tx, &b.node_id, super::boot::OWNER)?;
    RELEASING.step(
        &mut edit,
        "running",
        format!("disk.clean ({}, mode {m}) sent to the ramdisk", rec.id),
    );
    condition(
        &mut edit,
        ConditionStatus::Unknown,
        "Cleaning",
        format!("the ramdisk is cleaning every disk (mode {m}, {})", rec.id),
    );
    edit.save(tx)?;
    Ok(rec.id)
}

/// What a finished `disk.clean` says: `Ok(result)` when every disk is clean or read-only in
/// the mode the command asked for, `Err(why)` otherwise (a `metadata` erase reported for a
/// `full` one asked is no full erase).
fn verdict(cmd: &CommandRecord) -> Result<CleanResult, String> {
    match (cmd.state, cmd.result.as_ref()) {
        (CommandState::Succeeded, Some(r)) => {
            let res: CleanResult = serde_json::from_value(r.clone())
                .map_err(|e| format!("the disk.clean result does not parse: {e}"))?;
            let asked = serde_json::from_value::<CleanArgs>(cmd.args.clone())
                .map_err(|e| format!("the disk.clean args do not parse: {e}"))?
                .mode;
            if res.mode != asked {
                return Err(format!(
                    "disk.clean reports mode {} where {asked} was asked",
                    res.mode
                ));
            }
            if res.failed().next().is_some() {
                return Err(res.summary());
            }
            Ok(res)
        }
        (CommandState::Succeeded, None) => Err("disk.clean returned no result".to_owned()),
        (state, _) => Err(format!(
            "disk.clean {}: {}: {}",
            state.as_str(),
            cmd.error_code.as_deref().unwrap_or(""),
            cmd.error_message.as_deref().unwrap_or("")
        )),
    }
}

/// `r` when it accounts for every disk the ramdisk's inventory (this boot's report) listed:
/// a ramdisk that saw fewer disks than it reported (a controller's driver missing, a disk gone
/// from its listing) must not leave a tenant's disk uncleaned while the node goes `ready`.
/// The inventory lists what the one disk rule calls a disk (`bcd_probes::inventory::disk_rule`,
/// decided from sysfs, the rule `disk.clean` applies too): no listed name is excused here.
fn all_listed(r: CleanResult, inventory: Option<&str>) -> Result<CleanResult, String> {
    let doc: serde_json::Value = inventory
        .and_then(|t| serde_json::from_str(t).ok())
        .unwrap_or(serde_json::Value::Null);
    let missing: Vec<String> = doc["disks"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|d| d["name"].as_str())
                .collect::<Vec<_>>()
        })
        .unwrap_or_default()
        .into_iter()
        .filter(|n| !r.disks.iter().any(|d| d.name == *n))
        .map(str::to_owned)
        .collect();
    if missing.is_empty() {
        Ok(r)
    } else {
        Err(format!(
            "the ramdisk's inventory lists {} but disk.clean did not clean {}: nothing says they hold no tenant data",
            if missing.len() == 1 {
                "a disk"
            } else {
                "disks"
            },
            missing.join(", ")
        ))
    }
}

/// One `cleaningStep` event per disk of a parsed result.
fn disk_events(edit: &mut Edit, r: &serde_json::Value) {
    let Ok(res) = serde_json::from_value::<CleanResult>(r.clone()) else {
        return;
    };
    for d in &res.disks {
        let mut msg = format!(
            "{}{}: {} ({} ms, {} bytes erased)",
            d.name,
            d.serial
                .as_deref()
                .map(|s| format!(" (serial {s})"))
                .unwrap_or_default(),
            d.outcome.as_str(),
            d.duration_ms,
            d.bytes_erased
        );
        if !d.steps.is_empty() {
            msg.push_str(&format!("; steps: {}", d.steps.join(", ")));
        }
        if let Some(e) = &d.error {
            msg.push_str(&format!("; {e}"));
        }
        let to = match d.outcome {
            DiskOutcome::Cleaned => "cleaned",
            DiskOutcome::ReadOnly => "readOnly",
            DiskOutcome::Failed => "failed",
        };
        RELEASING.step(edit, to, msg);
    }
}

/// The boot's `disk.clean` is over: it decides the cleaning (in the transaction that ended it).
fn finished(
    tx: &Tx<'_>,
    cmd: &CommandRecord,
    _: BootRecord,
    mut edit: Edit,
) -> Result<(), OpError> {
    let state = edit.node.provision_state;
    if let Some(r) = &cmd.result {
        disk_events(&mut edit, r);
    }
    let inventory = edit.node.inventory_json.clone();
    match verdict(cmd).and_then(|r| all_listed(r, inventory.as_deref())) {
        Err(why) => {
            let why = format!("cleaning failed: {why}");
            condition(
                &mut edit,
                ConditionStatus::False,
                "CleanFailed",
                why.clone(),
            );
            apply_transition(&mut edit, ProvisionState::Failed, &why)?;
        }
        Ok(res) => {
            let summary = res.summary();
            condition(
                &mut edit,
                ConditionStatus::True,
                "Cleaned",
                format!("{summary} in {} ms", res.duration_ms),
            );
            if state == ProvisionState::Retiring {
                apply_transition(
                    &mut edit,
                    ProvisionState::Retired,
                    &format!("retired: {summary}"),
                )?;
                bump_identity(
                    &mut edit,
                    "retired: the ramdisk's identity ends, and a retired node holds none",
                );
            } else {
                super::commission::recheck(tx, &mut edit, &summary)?;
            }
        }
    }
    edit.save(tx)?;
    Ok(())
}
