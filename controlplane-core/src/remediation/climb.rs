//! Climbing a remediation's ladder, one transaction per remediation per pass ([`advance`]) and
//! one per command that ended ([`on_final`], from the command router):
//!
//! - `draining`: the fault still there? the step applies to this node? Then the node is
//!   cordoned (and `draining` while it holds allocations) and the step waits for the
//!   allocations it would disrupt — a GPU reset only for those on the fault's GPUs — up to the
//!   pool's `drainGraceSeconds`; then `evict` releases them (the remediation as the reason on
//!   each), `wait` keeps waiting and says so.
//! - `acting`: the step's command is queued (`gpu.reset`, `node.reboot`, `bmc.power reboot` on
//!   the site's lease holder) or the machine goes to `inspecting`; its end moves the step on.
//! - `verifying`: the node's session must come back (after a reboot or a power cycle, one that
//!   opened after the step), then `diag.nvml` runs again; the step succeeded when the fault's
//!   condition is gone (Health applied the diag first, in the same transaction).
//!
//! Transactions only record and queue; the pass dispatches what they return.

use bc_protocol::commands::CommandArgs;
use bc_protocol::commands::bmc::{PowerAction, PowerArgs};
use bc_protocol::commands::diag::DiagArgs;
use bc_protocol::commands::reboot::RebootArgs;
use bc_protocol::commands::reset::{ResetArgs, ResetTarget};
use bc_protocol::{CommandName, Connectivity, Power, ProvisionState, Trust};
use cpl_store::{
    Allocation, AllocationFilter, CommandRecord, CommandState, DrainPolicy, FaultKind, NodeRecord,
    RemediationMode, RemediationPhase, RemediationRecord, RemediationState, RemediationStep,
    StepOutcome, Tx, duration_ms,
};

use super::finish::{current, give_up, step_over, stop, succeed};
use super::policy::Policy;
use super::{Ctx, OWNER, fault};
use crate::commands::record::{self, Queue};
use crate::edit::Edit;
use crate::error::OpError;
use crate::ops::nodes::REASON_DRAINING;

/// What the pass does after a remediation's transaction: dispatch a node's command queue (the
/// node's own, or a site agent's for `bmc.*`).
pub(crate) type Dispatch = Option<String>;

/// What one phase decided.
enum Next {
    /// Go on with the same remediation in this transaction (a step was skipped or failed).
    Again,
    /// Done for this pass.
    Done(Dispatch),
}

fn seconds(ms: i64) -> i64 {
    ms / 1000
}

/// Why `rem` must stop before anything else is looked at, if it must.
fn stop_reason(
    tx: &Tx<'_>,
    rem: &RemediationRecord,
    node: &NodeRecord,
    policy: &Policy,
) -> Result<Option<String>, OpError> {
    if let Some(s) = tx.remediation_suspension(&node.id)? {
        return Ok(Some(format!(
            "remediation of the node was suspended by {}: {}",
            s.by, s.reason
        )));
    }
    if policy.mode != rem.mode {
        return Ok(Some(format!(
            "the pool's remediation mode is now {} (this remediation ran as {})",
            policy.mode, rem.mode
        )));
    }
    let reinspecting =
        current(rem) == Some(RemediationStep::Reinspect) && rem.phase != RemediationPhase::Draining;
    if reinspecting {
        return Ok(None);
    }
    // `ready`: a bare-metal machine the ladder re-inspected, whose next rung (or give-up) is
    // still to come.
    if !matches!(
        node.provision_state,
        ProvisionState::Adopted | ProvisionState::Deployed | ProvisionState::Ready
    ) {
        return Ok(Some(format!(
            "the node left service: it is {}",
            node.provision_state
        )));
    }
    if node.maintenance {
        return Ok(Some(format!(
            "maintenance was turned on ({}): someone else took the node over",
            node.maintenance_reason
                .as_deref()
                .unwrap_or("no reason given")
        )));
    }
    Ok(None)
}

/// One pass's turn of remediation `id` at `now`: stops it, or moves it as far as it can go in
/// this transaction. Returns the node whose command queue to dispatch.
pub(crate) fn advance(tx: &Tx<'_>, id: &str, ctx: &Ctx, now: i64) -> Result<Dispatch, OpError> {
    let Some(mut rem) = tx.remediation(id)? else {
        return Ok(None);
    };
    if rem.ended_at.is_some() {
        return Ok(None);
    }
    // Each turn either returns or moves one rung up: bounded by the ladder.
    for _ in 0..=rem.ladder.len().saturating_add(2) {
        let Some(node) = tx.node(&rem.node_id)? else {
            stop(
                tx,
                &mut rem,
                RemediationState::Cancelled,
                "the node was deleted",
                now,
            )?;
            return Ok(None);
        };
        let pool = match &node.pool_id {
            Some(p) => tx.pool(p)?,
            None => None,
        };
        let policy = Policy::of(pool.as_ref().map(|p| &p.remediation));
        if let Some(why) = stop_reason(tx, &rem, &node, &policy)? {
            stop(tx, &mut rem, RemediationState::Cancelled, &why, now)?;
            return Ok(None);
        }
        if rem.mode == RemediationMode::Observe {
            if !fault::present(&node, &rem.fault) {
                let why = "the fault went away; nothing was done (the pool observes only)";
                stop(tx, &mut rem, RemediationState::Cleared, why, now)?;
            }
            return Ok(None);
        }
        let next = match rem.phase {
            RemediationPhase::Draining => drain(tx, &mut rem, &node, &policy, ctx, now)?,
            RemediationPhase::Verifying => verify(tx, &mut rem, &node, ctx, now)?,
            RemediationPhase::Acting | RemediationPhase::Ended => Next::Done(None),
        };
        match next {
            Next::Again => continue,
            Next::Done(d) => return Ok(d),
        }
    }
    Ok(None)
}

/// Why `step` does not apply to `node`, if it does not.
fn not_applicable(
    tx: &Tx<'_>,
    step: RemediationStep,
    node: &NodeRecord,
    policy: &Policy,
) -> Result<Option<String>, OpError> {
    let tenant = node.trust == Trust::TenantControlled;
    let connected = node.connectivity == Connectivity::Connected;
    let bmc = tx.bmc(&node.id)?.filter(|b| b.verified_at.is_some());
    Ok(match step {
        RemediationStep::ResetGpu | RemediationStep::RebootNode | RemediationStep::Reinspect
            if tenant =>
        {
            Some(
                "a tenant-controlled node (dedicated root) is never sent a platform command".into(),
            )
        }
        RemediationStep::ResetGpu | RemediationStep::RebootNode if !connected => Some(format!(
            "the node is {}: its agent cannot run {}",
            node.connectivity,
            if step == RemediationStep::ResetGpu {
                "gpu.reset"
            } else {
                "node.reboot"
            }
        )),
        RemediationStep::BmcPowerCycle | RemediationStep::Reinspect if bmc.is_none() => {
            Some("the node has no verified BMC (it was not enrolled through one)".into())
        }
        RemediationStep::BmcPowerCycle if tenant && !policy.bmc_on_tenant_controlled => Some(
            "the pool does not allow BMC steps on a tenant-controlled node (bmcOnTenantControlled)"
                .into(),
        ),
        RemediationStep::Reinspect if node.provision_state != ProvisionState::Ready => {
            Some(format!(
                "re-inspection needs a ready machine and this one is {}; a deployed machine is inspected again only after nodes.release, which erases its disks: an operator's call",
                node.provision_state
            ))
        }
        _ => None,
    })
}

/// The node's GPUs of `fault` as allocation atoms (the inventory's uuid, else `gpu<index>`).
fn fault_atoms(node: &NodeRecord, gpus: &[String]) -> Vec<String> {
    let Some(inv) = crate::inventory::of(node) else {
        return Vec::new();
    };
    inv.gpus
        .iter()
        .enumerate()
        .filter(|(_, g)| gpus.contains(&crate::health::canonical_bus_id(&g.pci_bus_id)))
        .map(
            |(pos, g)| match g.uuid.as_deref().filter(|u| !u.is_empty()) {
                Some(u) => u.to_owned(),
                None => format!("gpu{pos}"),
            },
        )
        .collect()
}

/// The node's allocations `step` would disrupt: a GPU reset only those holding one of the
/// fault's GPUs (all of them when the fault is the whole node's or its GPUs are unknown), every
/// other step all of them.
fn blocking(
    tx: &Tx<'_>,
    node: &NodeRecord,
    step: RemediationStep,
    rem: &RemediationRecord,
) -> Result<Vec<Allocation>, OpError> {
    let all = tx.allocations(&AllocationFilter {
        node_id: Some(node.id.clone()),
        active_only: true,
        ..Default::default()
    })?;
    if step != RemediationStep::ResetGpu || rem.fault.gpus.is_empty() {
        return Ok(all);
    }
    let atoms = fault_atoms(node, &rem.fault.gpus);
    if atoms.is_empty() {
        return Ok(all);
    }
    Ok(all
        .into_iter()
        .filter(|a| a.atoms.iter().any(|x| atoms.contains(x)))
        .collect())
}

/// Cordons the node (remembering that the controller did) and keeps `draining` in its
/// `noScheduleReasons` while it holds allocations.
fn cordon(tx: &Tx<'_>, rem: &mut RemediationRecord, step: RemediationStep) -> Result<(), OpError> {
    let mut edit = Edit::begin(tx, &rem.node_id, None, OWNER)?;
    if !edit.node.cordoned {
        edit.node.cordoned = true;
        edit.event(
            "cordoned",
            Some("false".to_owned()),
            Some("true".to_owned()),
            format!("{}: {step} for {}", rem.id, fault::describe(&rem.fault)),
        );
        rem.cordoned = true;
    }
    let holds = tx.active_allocation_count(&rem.node_id)? > 0;
    let has = edit
        .node
        .no_schedule_reasons
        .iter()
        .any(|r| r == REASON_DRAINING);
    if holds && !has {
        edit.set_reason(REASON_DRAINING, true);
        rem.draining = true;
    }
    edit.save(tx)?;
    Ok(())
}

fn drain(
    tx: &Tx<'_>,
    rem: &mut RemediationRecord,
    node: &NodeRecord,
    policy: &Policy,
    ctx: &Ctx,
    now: i64,
) -> Result<Next, OpError> {
    if !fault::present(node, &rem.fault) {
        let why = "the fault went away before a step acted";
        stop(tx, rem, RemediationState::Cleared, why, now)?;
        return Ok(Next::Done(None));
    }
    let Some(step) = current(rem) else {
        let why = format!(
            "every step of its ladder ({} of them) was tried",
            rem.ladder.len()
        );
        give_up(tx, rem, "Exhausted", &why, now)?;
        return Ok(Next::Done(None));
    };
    if let Some(why) = not_applicable(tx, step, node, policy)? {
        step_over(tx, rem, StepOutcome::Skipped, &why, now)?;
        return Ok(Next::Again);
    }
    cordon(tx, rem, step)?;
    let blockers = blocking(tx, node, step, rem)?;
    if !blockers.is_empty() {
        let ids: Vec<&str> = blockers.iter().map(|a| a.id.as_str()).collect();
        let waited = now.saturating_sub(rem.phase_started_at);
        if waited < policy.drain_grace_ms {
            rem.waiting = Some(format!(
                "waiting for allocation(s) {} to be released before {step} ({} s of the pool's drainGraceSeconds {} left)",
                ids.join(", "),
                seconds(policy.drain_grace_ms - waited),
                seconds(policy.drain_grace_ms)
            ));
            tx.put_remediation(rem)?;
            return Ok(Next::Done(None));
        }
        match policy.drain {
            DrainPolicy::Wait => {
                rem.waiting = Some(format!(
                    "waiting for allocation(s) {} to be released before {step}: the drain grace of {} s passed {} s ago and the pool's drain policy is wait",
                    ids.join(", "),
                    seconds(policy.drain_grace_ms),
                    seconds(waited - policy.drain_grace_ms)
                ));
                tx.put_remediation(rem)?;
                return Ok(Next::Done(None));
            }
            DrainPolicy::Evict => {
                let reason = format!(
                    "evicted by remediation {} ({step} for {}): not released within the pool's drainGraceSeconds {}",
                    rem.id,
                    fault::describe(&rem.fault),
                    seconds(policy.drain_grace_ms)
                );
                for a in &blockers {
                    crate::placer::release_for(tx, &a.id, OWNER, Some(&reason))?;
                }
            }
        }
    }
    act(tx, rem, node, step, ctx, now)
}

fn queue_for_node(
    tx: &Tx<'_>,
    node_id: &str,
    args: CommandArgs,
    timeout_ms: i64,
    now: i64,
) -> Result<CommandRecord, OpError> {
    let name = args.name();
    let to = Queue {
        node_id,
        subject: None,
        actor: OWNER,
        timeout_ms,
    };
    let rec = record::queued(to, args.into(), now);
    crate::commands::queue(tx, node_id, name, false, rec.clone())?;
    Ok(tx.command(&rec.id)?.unwrap_or(rec))
}

/// Takes `step`: queues its command (or starts the re-inspection) and moves to `acting`.
fn act(
    tx: &Tx<'_>,
    rem: &mut RemediationRecord,
    node: &NodeRecord,
    step: RemediationStep,
    ctx: &Ctx,
    now: i64,
) -> Result<Next, OpError> {
    let (command, dispatch) = match step {
        RemediationStep::ResetGpu => {
            let gpus = if rem.fault.gpus.is_empty() {
                ResetTarget::All
            } else {
                ResetTarget::Gpus(rem.fault.gpus.clone())
            };
            let args = CommandArgs::GpuReset(ResetArgs { gpus });
            let c = queue_for_node(tx, &node.id, args, duration_ms(ctx.cfg.reset_timeout), now)?;
            (Some(c.id), Some(node.id.clone()))
        }
        RemediationStep::RebootNode => {
            let args = CommandArgs::NodeReboot(RebootArgs::default());
            let c = queue_for_node(tx, &node.id, args, duration_ms(ctx.cfg.reboot_timeout), now)?;
            (Some(c.id), Some(node.id.clone()))
        }
        RemediationStep::BmcPowerCycle => {
            let site = node.site_id.clone().unwrap_or_default();
            let holder = crate::bare_metal::bmc::live_holder(tx, ctx.sessions.as_ref(), &site);
            let (holder, epoch) = match holder {
                Ok(h) => h,
                Err(e) => {
                    let waited = now.saturating_sub(rem.phase_started_at);
                    if waited > duration_ms(ctx.cfg.verify_timeout) {
                        step_over(tx, rem, StepOutcome::Failed, &e.to_string(), now)?;
                        return Ok(Next::Again);
                    }
                    rem.waiting = Some(e.to_string());
                    tx.put_remediation(rem)?;
                    return Ok(Next::Done(None));
                }
            };
            crate::bare_metal::bmc::mark_expected(tx, &node.id, Power::On)?;
            let args = CommandArgs::BmcPower(PowerArgs {
                node_id: node.id.clone(),
                lease_epoch: epoch,
                action: PowerAction::Reboot,
                boot_device: None,
                // A power cycle boots the installed OS: no network boot to confirm.
                network_boot: None,
            });
            let timeout = duration_ms(ctx.cfg.bmc_timeout);
            let c = crate::bare_metal::bmc::queue(tx, &holder, &node.id, args, timeout, OWNER)?;
            (Some(c.id), Some(holder))
        }
        RemediationStep::Reinspect => {
            let mut edit = Edit::begin(tx, &node.id, None, OWNER)?;
            let why = format!("{}: reinspect for {}", rem.id, fault::describe(&rem.fault));
            crate::bare_metal::inspect::start(&mut edit, &why)?;
            edit.save(tx)?;
            (None, None)
        }
    };
    rem.phase = if command.is_some() {
        RemediationPhase::Acting
    } else {
        RemediationPhase::Verifying
    };
    rem.command_id = command;
    rem.acted_at = Some(now);
    rem.phase_started_at = now;
    rem.waiting = None;
    tx.put_remediation(rem)?;
    tx.record_event(&cpl_store::NewEvent {
        node_id: &rem.node_id,
        at: now,
        kind: "remediationStep",
        from: None,
        to: Some(step.as_str()),
        actor: OWNER,
        message: &format!(
            "{}: {step}{} for {}",
            rem.id,
            rem.command_id
                .as_deref()
                .map(|c| format!(" ({c})"))
                .unwrap_or_default(),
            fault::describe(&rem.fault)
        ),
    })?;
    Ok(Next::Done(dispatch))
}

/// Whether the node's session is back after the current step: connected, and for a reboot or
/// a power cycle on a session opened after the step acted.
fn session_back(node: &NodeRecord, rem: &RemediationRecord) -> bool {
    if node.connectivity != Connectivity::Connected {
        return false;
    }
    match current(rem) {
        Some(RemediationStep::RebootNode | RemediationStep::BmcPowerCycle) => {
            node.connected_at.unwrap_or(0) >= rem.acted_at.unwrap_or(0)
        }
        _ => true,
    }
}

fn verify(
    tx: &Tx<'_>,
    rem: &mut RemediationRecord,
    node: &NodeRecord,
    ctx: &Ctx,
    now: i64,
) -> Result<Next, OpError> {
    let step = current(rem);
    if step == Some(RemediationStep::Reinspect) {
        return reinspected(tx, rem, node, now);
    }
    let waited = now.saturating_sub(rem.phase_started_at);
    if waited > duration_ms(ctx.cfg.verify_timeout) {
        let what = if session_back(node, rem) {
            "diag.nvml did not report"
        } else {
            "the node's session did not come back"
        };
        let why = format!(
            "not verified within {} s: {what}",
            ctx.cfg.verify_timeout.as_secs()
        );
        step_over(tx, rem, StepOutcome::Failed, &why, now)?;
        return Ok(Next::Again);
    }
    if !session_back(node, rem) {
        let step = step.map_or("?", |s| s.as_str());
        rem.waiting = Some(format!(
            "waiting for the node's session to come back after {step}"
        ));
        tx.put_remediation(rem)?;
        return Ok(Next::Done(None));
    }
    // A silence is fixed by the session alone; a tenant-controlled node is never sent
    // diag.nvml: what its agent reported decides.
    if rem.fault.kind == FaultKind::Unreachable || node.trust == Trust::TenantControlled {
        return judge(tx, rem, node, "the node's session came back", now);
    }
    if let Some(id) = &rem.verify_command_id {
        rem.waiting = Some(format!("waiting for diag.nvml ({id})"));
        tx.put_remediation(rem)?;
        return Ok(Next::Done(None));
    }
    let args = CommandArgs::DiagNvml(DiagArgs::default());
    let c = queue_for_node(tx, &node.id, args, duration_ms(ctx.cfg.reset_timeout), now)?;
    rem.verify_command_id = Some(c.id.clone());
    rem.waiting = Some(format!("waiting for diag.nvml ({})", c.id));
    tx.put_remediation(rem)?;
    Ok(Next::Done(Some(node.id.clone())))
}

/// The verdict on the current step once it is verified: the fault gone is a success, the fault
/// still there a failed step (the next rung follows).
fn judge(
    tx: &Tx<'_>,
    rem: &mut RemediationRecord,
    node: &NodeRecord,
    how: &str,
    now: i64,
) -> Result<Next, OpError> {
    if fault::present(node, &rem.fault) {
        let why = format!("{how}, and {} is still there", fault::describe(&rem.fault));
        step_over(tx, rem, StepOutcome::Failed, &why, now)?;
        return Ok(Next::Again);
    }
    succeed(tx, rem, how, now)?;
    Ok(Next::Done(None))
}

/// The re-inspection's verdict: back to `ready` without the fault, or commissioning failed.
fn reinspected(
    tx: &Tx<'_>,
    rem: &mut RemediationRecord,
    node: &NodeRecord,
    now: i64,
) -> Result<Next, OpError> {
    match node.provision_state {
        ProvisionState::Ready => judge(tx, rem, node, "inspected and commissioned again", now),
        ProvisionState::Failed => {
            let why = format!(
                "re-inspection failed: {}",
                node.maintenance_reason
                    .as_deref()
                    .unwrap_or("the workflow failed")
            );
            step_over(tx, rem, StepOutcome::Failed, &why, now)?;
            give_up(tx, rem, "Exhausted", &why, now)?;
            Ok(Next::Done(None))
        }
        state => {
            rem.waiting = Some(format!("the machine is {state}"));
            tx.put_remediation(rem)?;
            Ok(Next::Done(None))
        }
    }
}

/// A command that just ended, in its transaction (after Health applied it): the step's
/// command moves the step to `verifying` (succeeded) or to the next rung; the verification's
/// `diag.nvml` decides the step.
pub fn on_final(tx: &Tx<'_>, cmd: &CommandRecord) -> Result<(), OpError> {
    let node_id = cmd.subject_node_id.as_deref().unwrap_or(&cmd.node_id);
    let Some(mut rem) = tx.open_remediation(node_id)? else {
        return Ok(());
    };
    let now = cpl_store::now_ms();
    let is = |id: &Option<String>| id.as_deref() == Some(cmd.id.as_str());
    if is(&rem.command_id) && rem.phase == RemediationPhase::Acting {
        if cmd.state == CommandState::Succeeded {
            rem.phase = RemediationPhase::Verifying;
            rem.phase_started_at = now;
            tx.put_remediation(&rem)?;
            return Ok(());
        }
        let why = crate::bare_metal::workflow::failure(cmd);
        return step_over(tx, &mut rem, StepOutcome::Failed, &why, now);
    }
    if is(&rem.verify_command_id) && rem.phase == RemediationPhase::Verifying {
        if cmd.state != CommandState::Succeeded || cmd.name != CommandName::DiagNvml {
            let why = format!(
                "the verification did not run: {}",
                crate::bare_metal::workflow::failure(cmd)
            );
            return step_over(tx, &mut rem, StepOutcome::Failed, &why, now);
        }
        let Some(node) = tx.node(node_id)? else {
            return Ok(());
        };
        let summary = cmd
            .result
            .as_ref()
            .and_then(|r| r.get("summary"))
            .and_then(|s| s.as_str())
            .unwrap_or("no summary");
        let how = format!("diag.nvml {} says: {summary}", cmd.id);
        judge(tx, &mut rem, &node, &how, now)?;
    }
    Ok(())
}
