//! The ramdisk workflow of a bare-metal machine (issue 15): `enrolling -> inspecting ->
//! commissioning -> ready`, or `failed` with what went wrong.
//!
//! # Design
//! Transactions only move states and write rows; the controller ([`BareMetal::boot_pass`], run
//! every second beside the lease sweep) does everything that leaves the control plane, so a
//! move made anywhere (a verification's result, `nodes.inspect`, an inventory report) takes
//! effect within a pass:
//! - a node in a ramdisk state without a boot gets one ([`super::boot::begin`]); the site's lease
//!   holder gets its assignment (the boot service learns the machine's MACs and kernel
//!   arguments) and then `bmc.power {on | reboot, bootDevice: pxe}`;
//! - a boot whose node left the ramdisk states ends: the holder powers the machine off (when
//!   `ready` and the pool's `acceptance.powerOffWhenReady`, the default, or when `failed`), and
//!   its boot service forgets the token;
//! - a node past its state's deadline (`acceptance.inspectionDeadlineSeconds`,
//!   `commissioningDeadlineSeconds`) fails, saying what never happened.
//!
//! The ramdisk's first inventory ([`on_inventory`], in the report's transaction) ends the
//! inspection: the identifiers are checked again against the BMC's, the node goes to
//! `commissioning`, and commissioning checks the pool's hardware profile against the inventory
//! (each step an event with its result, the verdict the `Commissioned` condition) → `ready`, or
//! `failed` naming the step and the value.
//!
//! # Limitations
//! Every decision is taken on the row as it is in the deciding transaction; the pass only picks
//! what to look at. A machine that reboots inside the ramdisk after its join finds its token
//! spent and is failed by the deadline. SATA/SAS disk health needs a tool the image does not
//! ship (smartctl): such disks are named as having no health log.

use std::time::Duration;

use bc_protocol::commands::bmc::{BootDevice, PowerAction};
use bc_protocol::{CommandName, ConditionStatus, Power, ProvisionState};
use cpl_store::{BootRecord, NodeRecord, Pool, Tx};
use serde::Deserialize;
use utoipa::ToSchema;

use super::boot::{self, OWNER, in_ramdisk};
use super::verify::queue;
use super::{BareMetal, ms};
use crate::edit::Edit;
use crate::error::OpError;
use crate::ops::nodes::apply_transition;

pub use super::commission::COMMISSIONED;
/// The condition inspection writes.
pub const INSPECTED: &str = "Inspected";
/// Default of `acceptance.inspectionDeadlineSeconds`.
pub const DEFAULT_INSPECTION_DEADLINE: Duration = Duration::from_secs(1800);
/// Default of `acceptance.commissioningDeadlineSeconds`.
pub const DEFAULT_COMMISSIONING_DEADLINE: Duration = Duration::from_secs(3600);

/// `nodes.inspect` request.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InspectRequest {
    #[serde(alias = "id")]
    pub node_id: crate::text::Id,
    /// When given, the node must still be at this version.
    #[serde(default)]
    pub version: Option<u64>,
}

/// The deadline of ramdisk state `s` in `pool` (`None`: a node without a pool).
pub fn deadline(pool: Option<&Pool>, s: ProvisionState) -> Duration {
    let a = pool.map(|p| p.acceptance).unwrap_or_default();
    match s {
        ProvisionState::Commissioning => a
            .commissioning_deadline_seconds
            .map_or(DEFAULT_COMMISSIONING_DEADLINE, Duration::from_secs),
        ProvisionState::Releasing | ProvisionState::Retiring => a.cleaning_deadline_seconds.map_or(
            super::release::DEFAULT_CLEANING_DEADLINE,
            Duration::from_secs,
        ),
        ProvisionState::Deploying => a
            .deploy_deadline_seconds
            .map_or(super::deploy::DEFAULT_DEPLOY_DEADLINE, Duration::from_secs),
        ProvisionState::Rescue => a
            .rescue_deadline_seconds
            .map_or(super::rescue::DEFAULT_RESCUE_DEADLINE, Duration::from_secs),
        _ => a
            .inspection_deadline_seconds
            .map_or(DEFAULT_INSPECTION_DEADLINE, Duration::from_secs),
    }
}

fn condition(edit: &mut Edit, type_: &str, status: ConditionStatus, reason: &str, msg: String) {
    crate::conditions::apply_owned(edit, OWNER, type_, status, reason, msg);
}

/// `enrolling` (verified) or `ready` → `inspecting`, in `edit`. The controller boots it.
pub(crate) fn start(edit: &mut Edit, why: &str) -> Result<(), OpError> {
    apply_transition(edit, ProvisionState::Inspecting, why)?;
    condition(
        edit,
        INSPECTED,
        ConditionStatus::False,
        "Booting",
        "waiting for the machine to boot the ramdisk and report".to_owned(),
    );
    Ok(())
}

fn pool_of(tx: &Tx<'_>, node: &NodeRecord) -> Result<Option<Pool>, OpError> {
    Ok(match &node.pool_id {
        Some(p) => tx.pool(p)?,
        None => None,
    })
}

/// The ramdisk's inventory arrived (in the report's transaction, after the profile conditions
/// were refreshed): a node `inspecting` on a used boot is checked again against its BMC,
/// moves to `commissioning`, and commissioning's steps decide `ready` or `failed`.
pub(crate) fn on_inventory(tx: &Tx<'_>, edit: &mut Edit) -> Result<(), OpError> {
    let state = edit.node.provision_state;
    if !in_ramdisk(state) {
        return Ok(());
    }
    // The workflows' steps create commands, end boots and read the site's records: not one
    // node's report alone (cpl_store::Store::write_node).
    tx.require_write_lock()?;
    let Some(mut b) = tx.boot(&edit.node.id)? else {
        return Ok(());
    };
    if b.used_at.is_none() || b.ended_at.is_some() || b.purpose != state.as_str() {
        return Ok(());
    }
    if super::work::works(state) {
        return super::work::on_inventory(tx, edit, &mut b);
    }
    if state == ProvisionState::Commissioning {
        // A boot that began in commissioning (nodes.recover): its first report runs the steps.
        if b.steps_at.is_none() {
            edit.act_as(OWNER);
            super::commission::run_steps(tx, edit, &mut b)?;
        }
        return Ok(());
    }
    let Some(bmc) = tx.bmc(&edit.node.id)? else {
        return Ok(());
    };
    edit.act_as(OWNER);
    if let Some(why) = boot::report_differs(edit, &bmc, "") {
        condition(
            edit,
            INSPECTED,
            ConditionStatus::False,
            "HardwareMismatch",
            why.clone(),
        );
        return apply_transition(edit, ProvisionState::Failed, &why);
    }
    condition(
        edit,
        INSPECTED,
        ConditionStatus::True,
        "Inspected",
        format!(
            "the ramdisk reported the machine's inventory with boot token {}",
            b.token_id
        ),
    );
    super::commission::begin(tx, edit, &mut b)
}

/// A failed power-on of a pending boot fails the inspection at once with what the BMC answered,
/// instead of waiting for the deadline (in the transaction that finished the command).
pub fn on_power_final(tx: &Tx<'_>, cmd: &cpl_store::CommandRecord) -> Result<(), OpError> {
    if cmd.name != "bmc.power" || cmd.state == cpl_store::CommandState::Succeeded {
        return Ok(());
    }
    let Some(node_id) = cmd.subject_node_id.as_deref() else {
        return Ok(());
    };
    let Some(b) = tx.boot(node_id)? else {
        return Ok(());
    };
    // A ramdisk that joined already came up, whatever the command says late.
    if b.ended_at.is_some()
        || b.used_at.is_some()
        || b.command_id.as_deref() != Some(cmd.id.as_str())
    {
        return Ok(());
    }
    let code = cmd.error_code.as_deref().unwrap_or("");
    if code == bc_protocol::commands::CommandErrorCode::LeaseLost.as_str() {
        // Another site agent took the lease: the next pass powers the machine on through it.
        let mut b = b;
        b.command_id = None;
        tx.put_boot(&b)?;
        return Ok(());
    }
    let mut edit = Edit::begin(tx, node_id, None, OWNER)?;
    if edit.node.provision_state.as_str() != b.purpose {
        return Ok(());
    }
    let why = format!(
        "the BMC did not power the machine on into the ramdisk: {} {}: {code}: {}",
        cmd.name,
        cmd.state.as_str(),
        cmd.error_message.as_deref().unwrap_or("")
    );
    let state = edit.node.provision_state;
    let type_ = if super::work::works(state) {
        super::work::names(state).1
    } else {
        INSPECTED
    };
    condition(
        &mut edit,
        type_,
        ConditionStatus::False,
        "PowerOnFailed",
        why.clone(),
    );
    apply_transition(&mut edit, ProvisionState::Failed, &why)?;
    edit.save(tx)?;
    Ok(())
}

/// Fails `node_id` whose ramdisk state outlived its deadline; `Ok(false)` when it moved on.
fn fail_overdue(tx: &Tx<'_>, node_id: &str, now: i64) -> Result<bool, OpError> {
    let Some(b) = tx.boot(node_id)?.filter(|b| b.ended_at.is_none()) else {
        return Ok(false);
    };
    let mut edit = Edit::begin(tx, node_id, None, OWNER)?;
    let state = edit.node.provision_state;
    if !in_ramdisk(state) || state.as_str() != b.purpose {
        return Ok(false);
    }
    // A rescue whose SSH server is up lasts as long as the operator needs it.
    if b.work_step.as_deref() == Some(super::rescue::RESCUE_READY) {
        return Ok(false);
    }
    let pool = pool_of(tx, &edit.node)?;
    let limit = deadline(pool.as_ref(), state);
    if now < b.phase_started_at.saturating_add(ms(limit)) {
        return Ok(false);
    }
    let secs = limit.as_secs();
    let (type_, reason, why) = match (state, b.used_at) {
        (ProvisionState::Releasing | ProvisionState::Retiring, _) => (
            super::release::CLEANED,
            "CleaningDeadline",
            format!("{state}: {}", super::work::overdue_reason(&b, secs)),
        ),
        (ProvisionState::Rescue, _) => (
            super::rescue::RESCUED,
            "RescueDeadline",
            format!("rescue: {}", super::work::overdue_reason(&b, secs)),
        ),
        (ProvisionState::Deploying, _) => (
            super::deploy::DEPLOYED,
            "DeployDeadline",
            format!("deploying: {}", super::work::overdue_reason(&b, secs)),
        ),
        (ProvisionState::Commissioning, _) => (
            COMMISSIONED,
            "CommissioningDeadline",
            format!("commissioning did not finish within {secs}s"),
        ),
        (_, Some(_)) => (
            INSPECTED,
            "InspectionDeadline",
            format!(
                "the ramdisk joined but did not report an inventory within {secs}s of the inspection's start"
            ),
        ),
        (_, None) if b.command_id.is_none() => (
            INSPECTED,
            "InspectionDeadline",
            format!(
                "the machine was never powered on into the ramdisk within {secs}s: no site agent of its site held the lease"
            ),
        ),
        (_, None) => (
            INSPECTED,
            "InspectionDeadline",
            format!(
                "the machine never booted the ramdisk within {secs}s: it was powered on with PXE ({}), but no ramdisk joined with its boot token {}",
                b.command_id.as_deref().unwrap_or("?"),
                b.token_id
            ),
        ),
    };
    condition(
        &mut edit,
        type_,
        ConditionStatus::False,
        reason,
        why.clone(),
    );
    apply_transition(&mut edit, ProvisionState::Failed, &why)?;
    edit.save(tx)?;
    Ok(true)
}

/// What the pass decided for one node, done after its transaction.
enum Action {
    /// Push the assignment, then dispatch the holder's commands.
    Boot { site: String, holder: String },
    /// The boot ended: push the assignment, dispatch a power-off if one was queued, close the
    /// session of a node whose ramdisk identity ended.
    Ended {
        site: String,
        holder: Option<String>,
        close: Option<String>,
    },
    /// A command was queued for the ramdisk (commissioning's `diag.nvml`, cleaning's
    /// `disk.clean`): dispatch it.
    Dispatch { node: String },
}

impl BareMetal {
    /// `nodes.inspect`: a verified `enrolling` node, or a `ready` one, goes to `inspecting`; the
    /// controller boots it into the ramdisk. Errors: `NOT_FOUND`, `CONFLICT` on a stale
    /// `version`, `INVALID_STATE` for any other state or an unverified BMC.
    pub async fn inspect(&self, req: InspectRequest, actor: &str) -> Result<NodeRecord, OpError> {
        let actor = actor.to_owned();
        self.store
            .write(move |tx| {
                let mut edit = Edit::begin(tx, &req.node_id, req.version, &actor)?;
                let verified = tx.bmc(&req.node_id)?.is_some_and(|b| b.verified_at.is_some());
                if !verified {
                    return Err(OpError::InvalidState(format!(
                        "node {} has no verified BMC: only a machine enrolled through its BMC (nodes.enroll) and verified can be inspected",
                        req.node_id
                    )));
                }
                start(&mut edit, "nodes.inspect")?;
                edit.save(tx)
            })
            .await
    }

    /// The ramdisk controller's pass at `now` (see the module docs).
    pub async fn boot_pass(&self, now: i64) {
        let work = self
            .store
            .read(|r| {
                let mut waiting = Vec::new();
                for s in boot::RAMDISK_STATES {
                    for b in r.bmcs_in_state(s.as_str())? {
                        if r.boot(&b.node_id)?.is_none_or(|x| x.ended_at.is_some()) {
                            waiting.push(b.node_id);
                        }
                    }
                }
                Ok::<_, OpError>(waiting)
            })
            .await;
        let waiting = match work {
            Ok(w) => w,
            Err(e) => {
                tracing::error!(error = %e, "reading the ramdisk boots failed");
                return;
            }
        };
        for node_id in waiting {
            let (key, id) = (std::sync::Arc::clone(&self.key), node_id.clone());
            // Whatever runs on the machine now (an earlier ramdisk, an installed OS) is about to
            // be rebooted: its identity ends with this boot, so it cannot hold the node's
            // session (or re-connect) while the new ramdisk joins.
            let live = self.sessions.live_epoch(&node_id).is_some();
            let r = self
                .store
                .write(move |tx| {
                    let Some(node) = tx.node(&id)? else {
                        return Ok::<_, OpError>(false);
                    };
                    let current = tx.boot(&id)?.is_some_and(|b| b.ended_at.is_none());
                    if !in_ramdisk(node.provision_state) || current {
                        return Ok(false);
                    }
                    let pool = pool_of(tx, &node)?;
                    let ttl = deadline(pool.as_ref(), node.provision_state);
                    let b = boot::begin(tx, &key, &id, node.provision_state, ttl, now)?;
                    tracing::info!(node_id = %id, token = %b.token_id, purpose = %b.purpose, "ramdisk boot begun");
                    if live {
                        let mut edit = Edit::begin(tx, &id, None, OWNER)?;
                        crate::ops::nodes::bump_identity(
                            &mut edit,
                            &format!("a new ramdisk boot ({}) begins: the running system's identity ends", b.token_id),
                        );
                        edit.save(tx)?;
                    }
                    Ok(live)
                })
                .await;
            match r {
                Ok(true) => {
                    self.sessions.close(
                        &node_id,
                        bc_protocol::pb::GoodbyeReason::Revoked,
                        "the machine is rebooted into a new ramdisk boot",
                    );
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::error!(node_id = %node_id, error = %e, "beginning a ramdisk boot failed")
                }
            }
        }
        let boots = match self.store.read(|r| r.boots()).await {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(error = %e, "reading the ramdisk boots failed");
                return;
            }
        };
        for b in boots {
            match self.boot_step(b, now).await {
                Ok(Some(Action::Boot { site, holder })) => {
                    self.push_site(&site).await;
                    self.commands.dispatch(&holder, false).await;
                }
                Ok(Some(Action::Ended {
                    site,
                    holder,
                    close,
                })) => {
                    if let Some(node) = close {
                        self.sessions.close(
                            &node,
                            bc_protocol::pb::GoodbyeReason::Revoked,
                            "the node failed in the ramdisk, or was retired",
                        );
                    }
                    self.push_site(&site).await;
                    if let Some(h) = holder {
                        self.commands.dispatch(&h, false).await;
                    }
                }
                Ok(Some(Action::Dispatch { node })) => {
                    self.commands.dispatch(&node, false).await;
                }
                Ok(None) => {}
                Err(e) => tracing::error!(error = %e, "a ramdisk boot step failed"),
            }
        }
    }

    /// One boot's turn, on the row as it is in this transaction (the pass's read may be stale:
    /// a report may have moved it since): end it, fail it, power the machine on into it, or send
    /// commissioning's `diag.nvml`.
    async fn boot_step(&self, seen: BootRecord, now: i64) -> Result<Option<Action>, OpError> {
        let bm = self.clone();
        let timeout = ms(self.cfg.command_timeout);
        self.store
            .write(move |tx| {
                let Some(mut b) = tx
                    .boot(&seen.node_id)?
                    .filter(|b| b.token_id == seen.token_id && b.ended_at.is_none())
                else {
                    return Ok(None);
                };
                let Some(node) = tx.node(&b.node_id)? else {
                    return Ok(None);
                };
                let site = node.site_id.clone().unwrap_or_default();
                let holder = super::power::live_holder(tx, &bm, &site).ok();
                let state = node.provision_state;
                if !in_ramdisk(state) || state.as_str() != b.purpose {
                    return end_boot(tx, &bm, b, &node, holder, now, timeout);
                }
                if fail_overdue(tx, &b.node_id, now)? {
                    return Ok(None);
                }
                if b.used_at.is_none() && b.command_id.is_none() {
                    let Some((h, epoch)) = holder else {
                        return Ok(None);
                    };
                    let action = if node.power == Power::On {
                        PowerAction::Reboot
                    } else {
                        PowerAction::On
                    };
                    let args = serde_json::json!({
                        "nodeId": b.node_id, "leaseEpoch": epoch, "action": action.as_str(),
                        "bootDevice": BootDevice::Pxe.as_str()
                    });
                    let rec = queue(
                        tx,
                        &h,
                        &b.node_id,
                        CommandName::BmcPower,
                        args,
                        timeout,
                        OWNER,
                    )?;
                    mark_expected(tx, &b.node_id, "on")?;
                    b.command_id = Some(rec.id);
                    tx.put_boot(&b)?;
                    return Ok(Some(Action::Boot { site, holder: h }));
                }
                if state == ProvisionState::Commissioning && b.steps_at.is_some() {
                    let pool = pool_of(tx, &node)?;
                    let due = b.diag_command_id.is_none()
                        && super::commission::needs_gpu_diag(pool.as_ref())
                        && bm.sessions.live_epoch(&b.node_id).is_some();
                    if due {
                        let id =
                            super::commission::queue_diag(tx, &b.node_id, pool.as_ref(), timeout)?;
                        b.diag_command_id = Some(id);
                        tx.put_boot(&b)?;
                        return Ok(Some(Action::Dispatch { node: b.node_id }));
                    }
                }
                let next = super::work::next(tx, &bm, &mut b, &node, holder, now, timeout)?;
                Ok(next.map(|node| Action::Dispatch { node }))
            })
            .await
    }
}

/// Ends boot `b` of `node`, which left the ramdisk: a `failed` machine, or a `ready` one whose
/// pool powers it off, is powered off through `holder` — without a live holder the boot stays
/// open and the next pass tries again. A `failed` node's ramdisk identity ends with it
/// (`identityGeneration + 1`; the session is closed after the commit).
fn end_boot(
    tx: &Tx<'_>,
    bm: &BareMetal,
    mut b: BootRecord,
    node: &NodeRecord,
    holder: Option<(String, u64)>,
    now: i64,
    timeout: i64,
) -> Result<Option<Action>, OpError> {
    let state = node.provision_state;
    let pool = pool_of(tx, node)?;
    let off = match state {
        ProvisionState::Ready => pool
            .as_ref()
            .and_then(|p| p.acceptance.power_off_when_ready)
            .unwrap_or(true),
        ProvisionState::Failed | ProvisionState::Retired => true,
        _ => false,
    };
    if off && holder.is_none() {
        return Ok(None);
    }
    b.ended_at = Some(now);
    tx.put_boot(&b)?;
    let mut queued = None;
    if off && let Some((h, epoch)) = &holder {
        let args = serde_json::json!({
            "nodeId": b.node_id, "leaseEpoch": epoch, "action": PowerAction::Off.as_str()
        });
        queue(
            tx,
            h,
            &b.node_id,
            CommandName::BmcPower,
            args,
            timeout,
            OWNER,
        )?;
        queued = Some(h.clone());
        mark_expected(tx, &b.node_id, "off")?;
    }
    let ended = matches!(
        state,
        ProvisionState::Failed | ProvisionState::Retired | ProvisionState::Deployed
    );
    let close = ended && bm.sessions.live_epoch(&b.node_id).is_some();
    // A retired or deployed node's ramdisk identity ended with that move; a failed one's ends
    // here.
    if close && state == ProvisionState::Failed {
        let mut edit = Edit::begin(tx, &b.node_id, None, OWNER)?;
        crate::ops::nodes::bump_identity(
            &mut edit,
            "the node failed in the ramdisk: the ramdisk's identity ends",
        );
        edit.save(tx)?;
    }
    tracing::info!(node_id = %b.node_id, state = %state, power_off = queued.is_some(), "ramdisk boot ended");
    Ok(Some(Action::Ended {
        site: node.site_id.clone().unwrap_or_default(),
        holder: queued,
        close: close.then(|| b.node_id.clone()),
    }))
}

/// Records that the control plane asked for `power` (a change toward it is not out of band).
fn mark_expected(tx: &Tx<'_>, node_id: &str, power: &str) -> Result<(), OpError> {
    if let Some(mut bmc) = tx.bmc(node_id)? {
        bmc.power_expected = Some(power.to_owned());
        bmc.power_expected_at = Some(cpl_store::now_ms());
        tx.put_bmc(&bmc)?;
    }
    Ok(())
}
