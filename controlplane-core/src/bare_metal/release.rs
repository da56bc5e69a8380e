//! Release and retire of a bare-metal machine (issue 16): `deployed -> releasing -> ready` and
//! `ready | deployed | failed -> retiring -> retired`, each through the ramdisk's `disk.clean`.
//!
//! # Design
//! - `nodes.release` ([`release`]) and `nodes.retire` of an enrolled machine ([`start_retire`])
//!   move the node and end the identity it held (`identityGeneration + 1`): the tenant's OS, or
//!   a ramdisk still up, can present nothing that works afterwards; the verb closes its session.
//! - `releasing` and `retiring` are ramdisk states ([`super::boot::RAMDISK_STATES`]): the
//!   controller's pass boots the machine into the ramdisk with a one-time token as for an
//!   inspection. The ramdisk's first inventory ([`super::work::on_inventory`]) is checked
//!   against the BMC's identifiers again — a wrong machine is never cleaned — and marks the
//!   boot ready to clean.
//! - The pass then queues `disk.clean` ([`queue_clean`]) with the pool's
//!   `acceptance.cleaning` (`metadata` by default), its deadline what is left of the state's
//!   (`acceptance.cleaningDeadlineSeconds`, 3,600 s by default).
//! - Its result ([`on_command_final`], in the transaction that finished it) is one
//!   `cleaningStep` event per disk and the `Cleaned` condition. A disk that failed (or the
//!   command failing, timing out, being cancelled) fails the node (failedFrom `releasing` or
//!   `retiring`, maintenance on); `nodes.recover` boots and cleans again. A read-only disk is
//!   named and left. After a clean release, commissioning's inventory checks run again on the
//!   ramdisk's report ([`super::commission::recheck`]) → `ready`; a retire goes on to `retired`.
//!
//! # Limitations
//! Commissioning's `gpuDiag` (`diag.nvml`) is not re-run on release. A machine whose BMC cannot
//! be reached is not cleaned by anyone's guess: it stays `releasing` until the deadline fails it.

use std::time::Duration;

use bc_protocol::commands::clean::{CleanArgs, CleanMode, CleanResult, DiskOutcome};
use bc_protocol::{CommandName, ConditionStatus, ProvisionState};
use cpl_store::{BootRecord, CommandRecord, CommandState, NodeRecord, Pool, Tx};

use super::boot::OWNER;
use crate::edit::Edit;
use crate::error::OpError;
use crate::ops::nodes::{apply_transition, bump_identity, refuse_while_allocated};

/// The condition cleaning writes.
pub const CLEANED: &str = "Cleaned";
/// Default of `acceptance.cleaningDeadlineSeconds`.
pub const DEFAULT_CLEANING_DEADLINE: Duration = Duration::from_secs(3600);
/// The shortest deadline a `disk.clean` is sent with, however little of the state's is left.
const MIN_CLEAN_TIMEOUT_MS: i64 = 60_000;

/// Whether `s` is one of the cleaning states.
pub fn cleaning(s: ProvisionState) -> bool {
    matches!(s, ProvisionState::Releasing | ProvisionState::Retiring)
}

/// How much of each disk the pool erases.
pub fn mode(pool: Option<&Pool>) -> CleanMode {
    pool.and_then(|p| p.acceptance.cleaning).unwrap_or_default()
}

fn condition(edit: &mut Edit, status: ConditionStatus, reason: &str, msg: String) {
    crate::conditions::apply_owned(edit, OWNER, CLEANED, status, reason, msg);
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
    booting(&mut edit);
    edit.save(tx)
}

/// `nodes.retire` of a machine enrolled through its BMC, in `edit`: `ready`, `deployed` or
/// `failed` → `retiring`, its identity ended; the pass boots and cleans it.
pub(crate) fn start_retire(edit: &mut Edit) -> Result<(), OpError> {
    apply_transition(edit, ProvisionState::Retiring, "nodes.retire")?;
    bump_identity(
        edit,
        "nodes.retire: the machine is cleaned and retired; its identity ends",
    );
    booting(edit);
    Ok(())
}

/// Queues `disk.clean` for the ramdisk of `node_id` with the pool's mode, its deadline what is
/// left of the state's (at least a minute); returns the command's id.
pub(crate) fn queue_clean(
    tx: &Tx<'_>,
    b: &BootRecord,
    pool: Option<&Pool>,
    state: ProvisionState,
    now: i64,
) -> Result<String, OpError> {
    let left = super::work::time_left(b, pool, state, now, MIN_CLEAN_TIMEOUT_MS);
    let m = mode(pool);
    let rec = super::work::insert_ramdisk_command(
        tx,
        &b.node_id,
        CommandName::DiskClean,
        serde_json::json!({ "mode": m.as_str() }),
        now,
        left,
    )?;
    let mut edit = Edit::report(tx, &b.node_id, OWNER)?;
    edit.event(
        "cleaningStep",
        None,
        Some("running".to_owned()),
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

/// Kernel-name prefixes `disk.clean` does not count as disks (as the ramdisk's discovery).
const NOT_DISKS: &[&str] = &["loop", "ram", "zram", "dm-", "md", "sr", "nbd"];

/// `r` when it accounts for every disk the ramdisk's inventory (this boot's report) listed:
/// a ramdisk that saw fewer disks than it reported (a controller's driver missing, a disk gone
/// from its listing) must not leave a tenant's disk uncleaned while the node goes `ready`.
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
        .filter(|n| !NOT_DISKS.iter().any(|p| n.starts_with(p)))
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
        edit.event("cleaningStep", None, Some(to.to_owned()), msg);
    }
}

/// A finished `disk.clean` that is the current boot's decides the cleaning (in the transaction
/// that finished the command); anything else is ignored.
pub fn on_command_final(tx: &Tx<'_>, cmd: &CommandRecord) -> Result<(), OpError> {
    if cmd.name != CommandName::DiskClean.as_str() {
        return Ok(());
    }
    let Some((_, mut edit)) = super::work::owner_of(tx, cmd)? else {
        return Ok(());
    };
    let state = edit.node.provision_state;
    if !cleaning(state) {
        return Ok(());
    }
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
