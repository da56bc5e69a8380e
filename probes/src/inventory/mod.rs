//! Inventory collectors (spec "inventory and health"; DESIGN.md "The daemon").
//!
//! # Design
//! Each collector reads through a [`HostRoot`] and owns one section: [`system`] (SMBIOS or
//! `/sys/class/dmi/id`), [`cpu`], [`host`] (memory, OS, boot mode), [`disks`] (which entries of `/sys/block` are disks:
//! [`disk_rule`]; with
//! [`blockdev`]: by-path and by-id names, partitions, holders; health from the NVMe SMART log
//! through [`nvme`] and [`smart_log`], from ATA SMART or the SCSI Informational Exceptions page
//! through [`ata_smart`] and [`sgio`]), [`nics`] (addresses from [`addrs`], permanent MAC and
//! driver/firmware versions from [`ethtool`]), [`pci`] (PCI functions with their link and
//! place from [`pcie`], and InfiniBand ports), [`topology`] (NUMA nodes, GPU affinity, degraded
//! links), [`gpu`] and [`bmc`] (in-band IPMI through [`ipmi`], SMBIOS type 42). LLDP
//! neighbours come from [`lldp`], which listens on the wire: its [`lldp::Watcher`] or
//! [`lldp::wait`] runs beside the collectors and [`lldp::attach`] adds what they heard. A missing or
//! unreadable source leaves its section or field absent and adds a [`Note`]; nothing fails the
//! whole inventory. No process is spawned; besides files, ioctls: ethtool's on a socket
//! (running machine only), one NVMe Get Log Page per controller on its `/dev` node, read-only
//! SCSI/ATA commands (`SG_IO`) on SATA and SAS disks, and IPMI requests on `/dev/ipmi0` where a
//! BMC is. The agent calls [`collect`] at start and on every
//! `inventory.refresh`. Fields and their sources: docs/inventory.md.
//!
//! # Limitations
//! GPUs come from the PCI list unless NVML data is handed in ([`collect_with_gpus`]).

pub mod addrs;
pub mod ata_smart;
pub mod blockdev;
pub mod bmc;
mod cli;
pub mod cpu;
pub mod disk_rule;
pub mod disks;
#[allow(unsafe_code)]
pub mod ethtool;
pub mod gpu;
pub mod host;
#[allow(unsafe_code)]
pub mod ipmi;
pub mod lldp;
pub mod message;
pub mod nics;
#[allow(unsafe_code)]
pub mod nvme;
pub mod pci;
pub mod pcie;
mod render;
#[allow(unsafe_code)]
pub mod sgio;
pub mod smart_log;
pub mod system;
pub mod topology;
pub mod vpd;

use bc_protocol::inventory::{self, Gpu, Inventory, Note};

use crate::hostroot::HostRoot;

pub use cli::{InventoryArgs, run};
pub use message::{InventoryMessageError, message, message_with_notes};
pub use render::render_table;

/// Collects the inventory of the machine under `root`, GPUs from the PCI list.
pub fn collect(root: &HostRoot) -> Inventory {
    collect_with_gpus(root, None)
}

/// Collects the inventory; `nvml_gpus`, when given (the NVML module's reading), replaces the GPUs
/// found on the PCI bus.
pub fn collect_with_gpus(root: &HostRoot, nvml_gpus: Option<Vec<Gpu>>) -> Inventory {
    let mut notes = Vec::new();
    let smbios = system::collect(root, &mut notes);
    let mut memory = host::memory(root, &mut notes);
    if let Some(m) = memory.as_mut() {
        m.dimm_total_bytes = host::dimm_total(&smbios.dimms);
        m.dimms = smbios.dimms;
    }
    let bmc = bmc::collect(root, smbios.redfish_host_interfaces, &mut notes);
    let pci_devices = pci::devices(root, &mut notes);
    let topology = topology::collect(root, &pci_devices, &mut notes);
    let gpus = match nvml_gpus {
        Some(g) => g,
        None => gpu::from_pci(&pci_devices),
    };
    Inventory {
        schema_version: inventory::SCHEMA_VERSION,
        hostname: host::hostname(root, &mut notes),
        system: smbios.system,
        cpu: cpu::collect(root, &mut notes),
        memory,
        disks: disks::collect(root, &mut notes),
        nics: nics::probe(root, &mut notes)
            .into_iter()
            .map(|p| p.nic)
            .collect(),
        infiniband: pci::infiniband(root),
        pci_devices,
        gpus,
        os: Some(host::os(root, &mut notes)),
        boot_mode: host::boot_mode(root, &mut notes),
        topology,
        bmc,
        notes,
    }
}

/// Adds a note from `source` (a collector name such as `cpu`).
pub(crate) fn note(notes: &mut Vec<Note>, source: &str, message: impl Into<String>) {
    notes.push(Note {
        source: source.into(),
        message: message.into(),
    });
}

#[cfg(test)]
mod depth_tests;
#[cfg(test)]
mod disk_rule_tests;
#[cfg(test)]
mod field_tests;
#[cfg(test)]
mod qemu_topology_tests;
#[cfg(test)]
#[path = "inventory_tests.rs"]
mod tests;
#[cfg(test)]
mod topology_tests;
