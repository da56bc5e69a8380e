//! The `Inventory` message every mode sends after each Welcome and for `inventory.refresh`: the
//! inventory document of [`super::collect_with_gpus`] (GPUs through NVML when it answers, the PCI
//! list otherwise) with the machine's hardware identity ([`crate::hwkey::compute`]), shrunk to
//! fit the gateway's [`bc_protocol::MAX_INVENTORY_BYTES`]. One builder for the node agent, the
//! site agent and the ramdisk, so they report the same document.

use bc_protocol::pb;

use super::lldp::Watcher;
use crate::hostroot::HostRoot;
use crate::nvml::{GpuInfo, NvmlConfig};

/// Why no inventory message could be built.
#[derive(Debug, thiserror::Error)]
pub enum InventoryMessageError {
    /// The document is over the gateway's limit even with PCI, disks and NICs left out.
    #[error("inventory does not fit in {limit} bytes even without PCI, disks and NICs")]
    TooLarge {
        /// The limit, bytes ([`bc_protocol::MAX_INVENTORY_BYTES`]).
        limit: usize,
    },
}

/// The machine under `root` as an `Inventory` message. With `nvml`, GPUs come from NVML when it
/// loads and finds any (otherwise from the PCI list). With `lldp`, the NICs carry the neighbours
/// the watcher holds now (no waiting) and its problems are notes. Blocks: call it off the async
/// runtime.
pub fn message(
    root: &HostRoot,
    nvml: Option<&NvmlConfig>,
    lldp: Option<&Watcher>,
) -> Result<pb::Inventory, InventoryMessageError> {
    message_with_notes(root, nvml, lldp, Vec::new())
}

/// [`message`] with `notes` from the caller added to the document's `notes[]` (the ramdisk's
/// account of how it got on the network).
pub fn message_with_notes(
    root: &HostRoot,
    nvml: Option<&NvmlConfig>,
    lldp: Option<&Watcher>,
    notes: Vec<bc_protocol::inventory::Note>,
) -> Result<pb::Inventory, InventoryMessageError> {
    let gpus = nvml
        .and_then(|cfg| crate::nvml::inventory_gpus(cfg).ok())
        .filter(|g| !g.is_empty())
        .map(|gs| gs.iter().map(GpuInfo::to_inventory).collect());
    let mut inv = super::collect_with_gpus(root, gpus);
    inv.notes.extend(notes);
    if let Some(w) = lldp {
        super::lldp::attach(&mut inv, &w.neighbors(), &w.problems());
    }
    let hw = crate::hwkey::compute(root);
    let limit = bc_protocol::MAX_INVENTORY_BYTES;
    let doc = inv
        .to_json_within(limit)
        .ok_or(InventoryMessageError::TooLarge { limit })?;
    Ok(pb::Inventory {
        hardware: Some(hw),
        document_json: doc,
        collected_at_ms: chrono::Utc::now().timestamp_millis(),
    })
}
