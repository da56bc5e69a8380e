//! The Inventory controller's `PcieLinkDegraded` condition (issue 20.3): a device of interest
//! (GPU, NIC, NVMe, InfiniBand) whose PCIe link trained below what both of its ends support.
//!
//! The evidence is the inventory document's `topology.degradedLinks`
//! ([`bc_protocol::inventory::DegradedLink`]), which the hardware probes compute from sysfs
//! (`current_link_speed`/`current_link_width` against the lower of the device's and its upstream
//! port's `max_link_speed`/`max_link_width`, docs/inventory.md "Topology"). The control plane
//! does not judge the sysfs values again; it names each listed device and what is below its
//! maximum: the width (`x8 of x16`), the speed (`8.0 of 16.0 GT/s`) or both.
//!
//! - `true`, reason `LinkDegraded`: at least one link *counts* (below).
//! - `true`, reason `GpuLinkSpeedBelowMaximum`: only GPUs' speeds are below their maximum. NVIDIA
//!   GPUs lower their link speed when idle and raise it under load (docs/inventory.md), so this is
//!   reported but does not count.
//! - `false`, reason `LinksAtMaximum`: the document has a topology and no degraded link.
//! - absent (or left as it was): the document has no `topology` (agents before issue 20).
//!
//! A link counts when its width is below its maximum (a width does not change with load), or its
//! speed is below its maximum on a device that is not a GPU. With the pool's
//! `hardwareProfile.pcieLinkDegraded: noSchedule`, a counting condition puts `PcieLinkDegraded`
//! into `noScheduleReasons` ([`set_no_schedule`]); with `ignore` (the default) it never does.

use bc_protocol::ConditionStatus;
use bc_protocol::inventory::{DegradedLink, DeviceKind, Inventory};
use cpl_store::{HardwareProfile, LinkDegradedPolicy};

use crate::conditions::{ConditionUpdate, apply};
use crate::edit::Edit;

/// The condition type (and its `noScheduleReasons` entry).
pub const CONDITION: &str = "PcieLinkDegraded";
/// Reason of a `true` condition that counts toward NoSchedule.
pub const REASON_DEGRADED: &str = "LinkDegraded";
/// Reason of a `true` condition where only GPUs' link speeds are below their maximum.
pub const REASON_GPU_SPEED: &str = "GpuLinkSpeedBelowMaximum";
/// Reason of a `false` condition.
pub const REASON_AT_MAXIMUM: &str = "LinksAtMaximum";

/// What a [`DeviceKind`] is called in a message.
fn kind_name(kind: Option<DeviceKind>) -> &'static str {
    match kind {
        Some(DeviceKind::Gpu) => "GPU",
        Some(DeviceKind::Nic) => "NIC",
        Some(DeviceKind::Nvme) => "NVMe",
        Some(DeviceKind::Infiniband) => "InfiniBand",
        None => "device",
    }
}

/// One link in words (`0000:17:00.0 (GPU): width x8 of x16`) and whether it counts.
fn describe(link: &DegradedLink) -> (String, bool) {
    let width = match (link.current_width, link.max_width) {
        (Some(c), Some(m)) if c < m => Some(format!("width x{c} of x{m}")),
        _ => None,
    };
    let speed = match (link.current_speed_gts, link.max_speed_gts) {
        (Some(c), Some(m)) if c < m => Some(format!("speed {c:.1} of {m:.1} GT/s")),
        _ => None,
    };
    let is_gpu = link.kind == Some(DeviceKind::Gpu);
    let counts =
        width.is_some() || (speed.is_some() && !is_gpu) || (width.is_none() && speed.is_none());
    let what = match (width, speed) {
        (Some(w), Some(s)) => format!("{w}, {s}"),
        (Some(w), None) => w,
        (None, Some(s)) if is_gpu => format!("{s} (a GPU's speed drops when idle)"),
        (None, Some(s)) => s,
        // The probe listed it without values the message can show.
        (None, None) => "below its maximum".to_owned(),
    };
    (
        format!("{} ({}): {what}", link.address, kind_name(link.kind)),
        counts,
    )
}

/// The condition for `inventory`; `None` when the document has no `topology` section.
pub fn link_condition(inventory: &Inventory) -> Option<ConditionUpdate> {
    let topology = inventory.topology.as_ref()?;
    let make = |status, reason: &str, message: String| ConditionUpdate {
        type_: CONDITION.to_owned(),
        status,
        reason: reason.to_owned(),
        message,
        owner: "Inventory".to_owned(),
        gpus: Vec::new(),
    };
    if topology.degraded_links.is_empty() {
        return Some(make(
            ConditionStatus::False,
            REASON_AT_MAXIMUM,
            "every device of interest runs its PCIe link at what both ends support".to_owned(),
        ));
    }
    let described: Vec<(String, bool)> = topology.degraded_links.iter().map(describe).collect();
    let counts = described.iter().any(|(_, c)| *c);
    let parts: Vec<String> = described.into_iter().map(|(d, _)| d).collect();
    Some(make(
        ConditionStatus::True,
        if counts {
            REASON_DEGRADED
        } else {
            REASON_GPU_SPEED
        },
        format!("PCIe link below its maximum: {}", parts.join("; ")),
    ))
}

/// Re-derives the condition on `edit` from its stored inventory, through [`apply`]. The document
/// is parsed only when it changed, or when the node has no such condition yet and the document
/// has a topology section: an identical report (every session open) stays cheap.
pub fn refresh(edit: &mut Edit, document_changed: bool) {
    let present = edit.node.conditions.iter().any(|c| c.type_ == CONDITION);
    let may_have_topology = edit
        .node
        .inventory_json
        .as_deref()
        .is_some_and(|j| j.contains("\"topology\""));
    if !may_have_topology || (!document_changed && present) {
        return;
    }
    let update = crate::inventory::of(&edit.node)
        .as_ref()
        .and_then(link_condition);
    if let Some(update) = update {
        apply(edit, &update);
    }
}

/// Keeps `PcieLinkDegraded` in `noScheduleReasons` exactly while the pool's `profile` says
/// `noSchedule` and the node's condition is `true` with a link that counts (reason
/// `LinkDegraded`).
pub fn set_no_schedule(edit: &mut Edit, profile: &HardwareProfile) {
    let counts = edit.node.conditions.iter().any(|c| {
        c.type_ == CONDITION && c.status == ConditionStatus::True && c.reason == REASON_DEGRADED
    });
    let enforced = profile.pcie_link_degraded == Some(LinkDegradedPolicy::NoSchedule);
    edit.set_reason(CONDITION, enforced && counts);
}
