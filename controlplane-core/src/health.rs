//! The Health controller: turns `diag.nvml` and `gpu.reset` results and the agent's XID events
//! into the GPU conditions, all NoSchedule (so they enter noScheduleReasons in the same
//! transaction): `GpuUnhealthy` (a failed diag), `XidCritical` (an XID whose resolution is a
//! reset or a reboot) and `P2pDrainRequired` (an XID 154 that announces "drain P2P").
//!
//! Results and events are read through their typed contracts (`bc_protocol::commands`), so a
//! renamed field no longer compiles.
//!
//! Each condition keeps the GPUs it is about (`Condition.gpus`, PCI bus ids): fixing one GPU
//! clears only that GPU's entry, and the condition turns `false` once no GPU is left. What
//! proves a GPU fixed: a `diag.nvml` whose report for that GPU is not a failure, or a
//! `gpu.reset` that verified that GPU. A condition of the whole node (`gpus` empty: a node-wide
//! diag check failed, an XID without a bus id) is cleared only by a diag that passes on the whole
//! node. Unhealthy is never sticky: a passing diag clears all three.

use bc_protocol::commands::diag::{CheckStatus, DiagReport};
use bc_protocol::commands::reset::ResetReport;
use bc_protocol::commands::xid::{XidClass, XidEvent};
use bc_protocol::{CommandName, Condition, ConditionStatus};
use cpl_store::{CommandRecord, CommandState, NodeRecord, Store, Tx};

use crate::conditions::{ConditionUpdate, apply};
use crate::edit::Edit;
use crate::error::OpError;

/// The condition a failed diag sets.
pub const GPU_UNHEALTHY: &str = "GpuUnhealthy";
/// The condition a critical XID sets (NoSchedule) until a reset or a passing diag.
pub const XID_CRITICAL: &str = "XidCritical";
/// The condition an XID 154 announcing "drain P2P" sets (NoSchedule): peer-to-peer traffic of
/// the GPU must stop, so no new (possibly multi-GPU) work is placed until the GPU passes a diag
/// or is reset.
pub const P2P_DRAIN_REQUIRED: &str = "P2pDrainRequired";

/// The condition one node alone gets for application-class XIDs in several allocations
/// (`crate::remediation::workload`), cleared as an `XidCritical` is.
pub use crate::remediation::fault::REPEATED_WORKLOAD_XID;

/// A PCI bus id in one spelling: lowercase, a 4-digit domain and a function (`0000:1a:00.0`).
/// NVML writes an 8-digit domain in upper case (`00000000:1A:00.0`), the kernel log may leave out
/// the function; all name the same GPU.
pub fn canonical_bus_id(s: &str) -> String {
    let s = s.trim().to_ascii_lowercase();
    let s = s.strip_prefix("pci:").unwrap_or(&s);
    let with_function = if s.contains('.') {
        s.to_owned()
    } else {
        format!("{s}.0")
    };
    match with_function.split_once(':') {
        Some((domain, rest)) if rest.contains(':') => match u32::from_str_radix(domain, 16) {
            Ok(d) => format!("{d:04x}:{rest}"),
            Err(_) => with_function,
        },
        _ => format!("0000:{with_function}"),
    }
}

fn update(
    type_: &str,
    status: ConditionStatus,
    reason: &str,
    message: String,
    gpus: Vec<String>,
) -> ConditionUpdate {
    ConditionUpdate {
        type_: type_.to_owned(),
        status,
        reason: reason.to_owned(),
        message,
        owner: "Health".to_owned(),
        gpus,
    }
}

/// What a finished command proves about the node's GPUs.
#[derive(Debug, Clone)]
pub enum Evidence {
    /// A `diag.nvml` report of a node with NVML.
    Diag(DiagReport),
    /// A succeeded `gpu.reset`: the GPUs it verified (canonical bus ids).
    Reset { verified: Vec<String> },
}

/// The evidence in a finished command, if any: a succeeded `diag.nvml` with NVML (a host without
/// NVML says nothing about GPU health) or a succeeded `gpu.reset`. A result that does not parse
/// as its contract is logged and proves nothing.
pub fn evidence(c: &CommandRecord) -> Option<Evidence> {
    if c.state != CommandState::Succeeded {
        return None;
    }
    let name = c.name;
    let typed = |what: &'static str| {
        move |e: serde_json::Error| {
            tracing::warn!(command_id = %c.id, error = %e, "{what} result is not its contract; ignored");
        }
    };
    match name {
        CommandName::DiagNvml => {
            let r: DiagReport = serde_json::from_value(c.result.clone()?)
                .map_err(typed("diag.nvml"))
                .ok()?;
            r.nvml_available.then_some(Evidence::Diag(r))
        }
        CommandName::GpuReset => {
            let verified = match c.result.clone() {
                Some(v) => serde_json::from_value::<ResetReport>(v)
                    .map_err(typed("gpu.reset"))
                    .ok()?
                    .gpus
                    .iter()
                    .filter(|g| g.problems.is_empty() && g.after.is_some())
                    .map(|g| canonical_bus_id(&g.pci_bus_id))
                    .collect(),
                None => Vec::new(),
            };
            Some(Evidence::Reset { verified })
        }
        // The site agent's BMC commands say nothing about a node's GPUs either.
        CommandName::InventoryRefresh
        | CommandName::LogsCollect
        | CommandName::NodeReboot
        | CommandName::BmcVerify
        | CommandName::BmcPower
        | CommandName::BmcSetBootDevice
        | CommandName::DiskClean
        | CommandName::ImageWrite
        | CommandName::RescueStart => None,
    }
}

/// `type_`'s condition on the node, if any.
fn current<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// The condition `type_` with the GPUs in `fixed` taken off it: `false` (with `reason` and
/// `message`) once none is left, the same condition with fewer GPUs otherwise, unchanged when it
/// is about the whole node or names none of them. `None`: nothing to write.
fn without(
    c: Option<&Condition>,
    type_: &str,
    fixed: &[String],
    reason: &str,
    message: &str,
) -> Option<ConditionUpdate> {
    let c = c.filter(|c| c.status == ConditionStatus::True && !c.gpus.is_empty())?;
    let left: Vec<String> = c
        .gpus
        .iter()
        .filter(|g| !fixed.contains(&canonical_bus_id(g)))
        .cloned()
        .collect();
    if left.len() == c.gpus.len() {
        return None;
    }
    Some(if left.is_empty() {
        update(
            type_,
            ConditionStatus::False,
            reason,
            message.to_owned(),
            Vec::new(),
        )
    } else {
        update(
            type_,
            ConditionStatus::True,
            &c.reason,
            c.message.clone(),
            left,
        )
    })
}

/// The conditions `evidence` sets on a node whose conditions are `conditions`.
pub fn updates_for(conditions: &[Condition], evidence: &Evidence) -> Vec<ConditionUpdate> {
    match evidence {
        Evidence::Diag(r) => diag_updates(conditions, r),
        Evidence::Reset { verified } => reset_updates(conditions, verified),
    }
}

fn diag_updates(conditions: &[Condition], r: &DiagReport) -> Vec<ConditionUpdate> {
    let summary = r.summary.clone();
    if r.verdict != CheckStatus::Fail {
        // Every GPU and every node-wide check passed: nothing is left of any GPU condition.
        let mut out = vec![
            update(
                GPU_UNHEALTHY,
                ConditionStatus::False,
                "DiagPassed",
                summary.clone(),
                Vec::new(),
            ),
            update(
                XID_CRITICAL,
                ConditionStatus::False,
                "DiagPassed",
                summary.clone(),
                Vec::new(),
            ),
        ];
        for type_ in [P2P_DRAIN_REQUIRED, REPEATED_WORKLOAD_XID] {
            if current(conditions, type_).is_some() {
                out.push(update(
                    type_,
                    ConditionStatus::False,
                    "DiagPassed",
                    summary.clone(),
                    Vec::new(),
                ));
            }
        }
        return out;
    }
    let node_wide = r.node_checks.iter().any(|c| c.status == CheckStatus::Fail);
    let failing: Vec<String> = r
        .gpus
        .iter()
        .filter(|g| g.verdict == CheckStatus::Fail)
        .map(|g| canonical_bus_id(&g.pci_bus_id))
        .collect();
    let passing: Vec<String> = r
        .gpus
        .iter()
        .filter(|g| g.verdict != CheckStatus::Fail)
        .map(|g| canonical_bus_id(&g.pci_bus_id))
        .collect();
    let reason = format!("DiagFailed:{}", r.action.as_str());
    let mut out = vec![update(
        GPU_UNHEALTHY,
        ConditionStatus::True,
        &reason,
        summary,
        if node_wide { Vec::new() } else { failing },
    )];
    // An XID's GPU that now passes its checks is fixed; the others stay.
    for type_ in [XID_CRITICAL, P2P_DRAIN_REQUIRED, REPEATED_WORKLOAD_XID] {
        let message = "the GPU passed diag.nvml";
        out.extend(without(
            current(conditions, type_),
            type_,
            &passing,
            "DiagPassed",
            message,
        ));
    }
    out
}

fn reset_updates(conditions: &[Condition], verified: &[String]) -> Vec<ConditionUpdate> {
    let message = format!("gpu.reset verified {}", verified.join(", "));
    let mut out = Vec::new();
    for type_ in [
        GPU_UNHEALTHY,
        XID_CRITICAL,
        P2P_DRAIN_REQUIRED,
        REPEATED_WORKLOAD_XID,
    ] {
        let c = current(conditions, type_);
        match c {
            Some(c) if c.status == ConditionStatus::True => {
                out.extend(without(
                    Some(c),
                    type_,
                    verified,
                    "ResetSucceeded",
                    &message,
                ));
            }
            // Nothing to clear; a verified reset still says the GPUs are fine (as before
            // conditions named their GPUs).
            _ if type_ != P2P_DRAIN_REQUIRED
                && type_ != REPEATED_WORKLOAD_XID
                && !verified.is_empty() =>
            {
                out.push(update(
                    type_,
                    ConditionStatus::False,
                    "ResetSucceeded",
                    message.clone(),
                    Vec::new(),
                ))
            }
            _ => {}
        }
    }
    out
}

/// What an XID event reported by the agent sets: a reset-, reboot- or service-required XID adds its GPU to
/// `XidCritical`, an XID 154 announcing "drain P2P" adds it to `P2pDrainRequired`; application
/// faults and informational XIDs change nothing. An XID without a bus id is about the whole node.
pub fn xid_update(conditions: &[Condition], event: &XidEvent) -> Option<ConditionUpdate> {
    let type_ = match event.class {
        c if c.is_critical() => XID_CRITICAL,
        XidClass::DrainP2pRequired => P2P_DRAIN_REQUIRED,
        _ => return None,
    };
    let bus = event.pci_bus_id.as_deref().map(canonical_bus_id);
    let gpus = match (current(conditions, type_), bus.as_ref()) {
        // Already about the whole node, or this XID names no GPU: the whole node.
        (Some(c), _) if c.status == ConditionStatus::True && c.gpus.is_empty() => Vec::new(),
        (_, None) => Vec::new(),
        (Some(c), Some(b)) if c.status == ConditionStatus::True => {
            let mut g = c.gpus.clone();
            if !g.iter().any(|x| canonical_bus_id(x) == *b) {
                g.push(b.clone());
                g.sort();
            }
            g
        }
        (_, Some(b)) => vec![b.clone()],
    };
    let gpu = bus.as_deref().unwrap_or("unknown GPU");
    Some(update(
        type_,
        ConditionStatus::True,
        &format!("Xid{}", event.xid),
        format!(
            "Xid {} on {gpu}: {}, action {}",
            event.xid,
            serde_json::to_value(event.class)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
            event.action.as_str()
        ),
        gpus,
    ))
}

/// Applies an XID event of the node's agent (parsed by [`crate::agent_report`] from
/// `Event.data_json` of type `xid`), in its own write transaction.
pub async fn on_xid(store: &Store, node_id: &str, event: &XidEvent) {
    let event = event.clone();
    let id = node_id.to_owned();
    let written = store
        .write(move |tx| {
            // An XID event is what the agent reported: it never moves `version` (issue 19.2).
            let mut edit = Edit::report(tx, &id, "Health")?;
            let Some(u) = xid_update(&edit.node.conditions, &event) else {
                return Ok(None);
            };
            apply(&mut edit, &u);
            edit.save(tx).map(Some)
        })
        .await;
    match written {
        Ok(Some(n)) => {
            tracing::info!(reasons = ?n.no_schedule_reasons, "Health: conditions updated")
        }
        Ok(None) => {}
        Err(e) => tracing::warn!(error = %e, "Health: condition not written"),
    }
}

/// Writes the conditions a finished command sets to its node, in the caller's transaction.
/// `None` when the command says nothing about the node's GPUs.
pub fn apply_command_result(tx: &Tx<'_>, c: &CommandRecord) -> Result<Option<NodeRecord>, OpError> {
    let Some(ev) = evidence(c) else {
        return Ok(None);
    };
    // A command's result is what the agent reported: it never moves `version` (issue 19.2).
    let mut edit = Edit::report(tx, &c.node_id, "Health")?;
    let updates = updates_for(&edit.node.conditions, &ev);
    if updates.is_empty() {
        return Ok(None);
    }
    for u in &updates {
        apply(&mut edit, u);
    }
    edit.save(tx).map(Some)
}

#[cfg(test)]
#[path = "health_tests.rs"]
mod health_tests;
