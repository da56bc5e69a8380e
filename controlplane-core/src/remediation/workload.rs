//! Faults that belong to the workload, not the node. An application-class XID (the catalog's
//! `restartApp` bucket — 13, 31, 94 … — and 43 and 45, which the driver raises on the channel of
//! the application that faulted) never sets a NoSchedule condition by itself. Seen on a booked
//! GPU, it is kept with the workload of the allocation holding that GPU (its `workloadId`, else
//! the allocation itself), for the pool's `workloadWindowSeconds`:
//!
//! - the same workload's XIDs on `workloadMinNodes` nodes or more within the window: the
//!   workload's fault. It is recorded on every active allocation of the workload
//!   (`workloadFault`), with a `workloadFault` event on each of its nodes, and none of those
//!   XIDs ever counts against a node;
//! - one node alone showing them in `nodeMinAllocations` different allocations (or outside any
//!   allocation) within the window: the node's fault after all. Health's `RepeatedWorkloadXid`
//!   condition (NoSchedule, the GPUs named) makes it a fault Remediation acts on; a passing
//!   diag or a verified reset of the GPU clears it, as for an `XidCritical`.
//!
//! Only pools whose remediation is not `off` keep observations.

use std::collections::BTreeSet;

use bc_protocol::ConditionStatus;
use bc_protocol::commands::xid::{XidClass, XidEvent};
use cpl_store::{NewEvent, NodeRecord, Store, Tx, WorkloadFault, XidObservation};

use super::fault::REPEATED_WORKLOAD_XID;
use crate::conditions::{ConditionUpdate, apply};
use crate::edit::Edit;
use crate::error::OpError;
use crate::health::canonical_bus_id;

/// XIDs the catalog calls informational that still come from the application's own channel
/// ("GPU stopped processing", "preemptive cleanup"): application-class, as the issue names them.
pub const APPLICATION_XIDS: &[u64] = &[43, 45];

/// Observations are kept at least this long, ms (a day), whatever the pool's window.
const KEEP_MS: i64 = 86_400_000;

/// Whether `event` is application-class: the catalog's `restartApp` bucket, or one of
/// [`APPLICATION_XIDS`].
pub fn is_application_class(event: &XidEvent) -> bool {
    event.class == XidClass::ApplicationFault || APPLICATION_XIDS.contains(&event.xid)
}

/// What an application-class XID came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Not application-class, or the node's pool does not remediate.
    Ignored,
    /// Kept; nothing decided yet.
    Observed,
    /// The workload's fault (its id).
    Workload(String),
    /// The node's fault: `RepeatedWorkloadXid` set.
    Node,
}

/// Applies an application-class XID of `node_id`'s agent, in its own write transaction (after
/// Health applied the event). Errors are logged: an XID never fails the session.
pub async fn on_xid(store: &Store, node_id: &str, event: &XidEvent) -> Verdict {
    if !is_application_class(event) {
        return Verdict::Ignored;
    }
    let (id, event) = (node_id.to_owned(), event.clone());
    let r = store
        .write(move |tx| observe(tx, &id, &event, cpl_store::now_ms()))
        .await;
    match r {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!(error = %e, "remediation: application XID not recorded");
            Verdict::Ignored
        }
    }
}

/// The atom (the inventory's uuid, else `gpu<index>`) of the GPU at `bus` on `node`.
fn atom_of(node: &NodeRecord, bus: &str) -> Option<String> {
    let inv = crate::inventory::of(node)?;
    inv.gpus
        .iter()
        .enumerate()
        .find(|(_, g)| canonical_bus_id(&g.pci_bus_id) == bus)
        .map(
            |(pos, g)| match g.uuid.as_deref().filter(|u| !u.is_empty()) {
                Some(u) => u.to_owned(),
                None => format!("gpu{pos}"),
            },
        )
}

/// [`on_xid`]'s transaction at `now` (ms).
pub fn observe(tx: &Tx<'_>, node_id: &str, event: &XidEvent, now: i64) -> Result<Verdict, OpError> {
    if !is_application_class(event) {
        return Ok(Verdict::Ignored);
    }
    let Some(node) = tx.node(node_id)? else {
        return Ok(Verdict::Ignored);
    };
    let Some((_, policy)) = super::policy::of_node(tx, &node)? else {
        return Ok(Verdict::Ignored);
    };
    let gpu = event.pci_bus_id.as_deref().map(canonical_bus_id);
    let atom = event
        .uuid
        .clone()
        .filter(|u| !u.is_empty())
        .or_else(|| gpu.as_deref().and_then(|b| atom_of(&node, b)));
    let active = tx.allocations(&cpl_store::AllocationFilter {
        node_id: Some(node_id.to_owned()),
        active_only: true,
        ..Default::default()
    })?;
    let holder = match &atom {
        Some(a) => active.iter().find(|x| x.atoms.contains(a)),
        // An XID without its GPU belongs to the node's one allocation, if it has just one.
        None if active.len() == 1 => active.first(),
        None => None,
    };
    let workload = holder.map(|a| a.workload_id.clone().unwrap_or_else(|| a.id.clone()));
    let window_start = now.saturating_sub(policy.workload_window_ms);
    tx.add_xid_observation(
        &XidObservation {
            node_id: node_id.to_owned(),
            xid: event.xid,
            gpu: gpu.clone(),
            workload_id: workload.clone(),
            allocation_id: holder.map(|a| a.id.clone()),
            workload_fault: false,
            at: now,
        },
        now.saturating_sub(KEEP_MS.max(policy.workload_window_ms)),
    )?;
    if let Some(w) = &workload {
        let seen = tx.workload_xids(w, window_start)?;
        let nodes: BTreeSet<&str> = seen.iter().map(|o| o.node_id.as_str()).collect();
        if nodes.len() >= policy.workload_min_nodes as usize {
            record_workload_fault(tx, w, &seen, window_start, now)?;
            return Ok(Verdict::Workload(w.clone()));
        }
    }
    let alone: Vec<XidObservation> = tx
        .node_xids(node_id, window_start)?
        .into_iter()
        .filter(|o| !o.workload_fault)
        .collect();
    let allocations: BTreeSet<Option<&str>> =
        alone.iter().map(|o| o.allocation_id.as_deref()).collect();
    if allocations.len() < policy.node_min_allocations as usize {
        return Ok(Verdict::Observed);
    }
    let gpus: BTreeSet<String> = alone.iter().filter_map(|o| o.gpu.clone()).collect();
    let xids: BTreeSet<u64> = alone.iter().map(|o| o.xid).collect();
    let mut edit = Edit::report(tx, node_id, "Health")?;
    apply(
        &mut edit,
        &ConditionUpdate {
            type_: REPEATED_WORKLOAD_XID.to_owned(),
            status: ConditionStatus::True,
            reason: format!("Xid{}", event.xid),
            message: format!(
                "application-class Xid {} on this node alone in {} allocations within {} s, on no other node of them: the node's fault",
                xids.iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
                allocations.len(),
                policy.workload_window_ms / 1000
            ),
            owner: "Health".to_owned(),
            gpus: gpus.into_iter().collect(),
        },
    );
    edit.save(tx)?;
    Ok(Verdict::Node)
}

/// Records workload `w`'s fault from `seen` on each of its active allocations (a
/// `workloadFault` event on each node whose allocation's record changed) and marks the window's
/// observations as the workload's.
fn record_workload_fault(
    tx: &Tx<'_>,
    w: &str,
    seen: &[XidObservation],
    window_start: i64,
    now: i64,
) -> Result<(), OpError> {
    tx.mark_workload_fault(w, window_start)?;
    let fault = WorkloadFault {
        xids: seen
            .iter()
            .map(|o| o.xid)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect(),
        nodes: seen
            .iter()
            .map(|o| o.node_id.clone())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect(),
        first_at: seen.iter().map(|o| o.at).min().unwrap_or(now),
        last_at: seen.iter().map(|o| o.at).max().unwrap_or(now),
    };
    for a in tx.workload_allocations(w)? {
        if a.workload_fault.as_ref() == Some(&fault) {
            continue;
        }
        tx.set_workload_fault(&a.id, &fault)?;
        if tx.node_exists(&a.node_id)? {
            tx.record_event(&NewEvent {
                node_id: &a.node_id,
                at: now,
                kind: "workloadFault",
                from: None,
                to: Some(&a.id),
                actor: super::OWNER,
                message: &format!(
                    "workload {w}: application-class Xid {} on nodes {} within the window: the workload's fault, not the nodes'; no node is remediated for it",
                    fault
                        .xids
                        .iter()
                        .map(u64::to_string)
                        .collect::<Vec<_>>()
                        .join(", "),
                    fault.nodes.join(", ")
                ),
            })?;
        }
    }
    Ok(())
}
