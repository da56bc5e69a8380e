//! GPUs. The NVML module (another part of the daemon) reads them through NVML and hands its list
//! to [`super::collect_with_gpus`]; without it, this module lists NVIDIA display controllers
//! (vendor `10de`, class `03xxxx`) from the PCI bus, with only the bus id known.

use bc_protocol::inventory::{Gpu, PciDevice};

/// GPUs as the PCI bus shows them (`source: "pci"`): bus id, and a name made of the PCI ids.
pub fn from_pci(pci: &[PciDevice]) -> Vec<Gpu> {
    pci.iter()
        .filter(|d| d.nvidia_gpu)
        .map(|d| Gpu {
            uuid: None,
            name: Some(format!("NVIDIA [{}:{}]", d.vendor_id, d.device_id)),
            pci_bus_id: d.address.clone(),
            memory_bytes: None,
            driver_version: None,
            source: "pci".into(),
            ..Gpu::default()
        })
        .collect()
}
