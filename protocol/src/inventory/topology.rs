//! The PCIe and NUMA topology section of the inventory document: NUMA nodes, the GPU-to-device
//! affinity matrix (in `nvidia-smi topo -m` terms) and the links trained below what both of their
//! ends support. All of it is computed from sysfs by the hardware probes.

use serde::{Deserialize, Serialize};

/// PCIe and NUMA topology (`topology` in the document).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Topology {
    /// `/sys/devices/system/node/node<N>`, sorted by id; empty on a kernel without NUMA.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub numa_nodes: Vec<NumaNode>,
    /// One entry per (NVIDIA GPU, other device of interest) pair, sorted by GPU then device
    /// address. Devices of interest: NVIDIA GPUs (class `0300`/`0302`), NICs (`02xx`), NVMe
    /// controllers (`0108`), InfiniBand controllers (`0207`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub affinity: Vec<GpuAffinity>,
    /// Devices of interest whose link runs below the speed or width both of its ends support;
    /// the evidence of a `PcieLinkDegraded` condition.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub degraded_links: Vec<DegradedLink>,
}

/// One NUMA node.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NumaNode {
    /// `N` of `/sys/devices/system/node/node<N>`.
    pub id: u32,
    /// `node<N>/cpulist` as written (`0-15,64-79`); empty for a node without CPUs (memory only).
    pub cpulist: String,
    /// Logical CPUs in `cpulist`.
    pub cpus: u32,
    /// `Node <N> MemTotal` of `node<N>/meminfo`, bytes (the file says kB, meaning KiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
}

/// What a device of interest is, from its PCI class (and vendor, for GPUs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// NVIDIA (`10de`) VGA or 3D controller (class `0300xx`, `0302xx`).
    Gpu,
    /// Network controller (class `02xx`) other than InfiniBand.
    Nic,
    /// NVM Express controller (class `0108xx`).
    Nvme,
    /// InfiniBand controller (class `0207xx`).
    Infiniband,
}

/// How far a GPU is from another device, in `nvidia-smi topo -m`'s terms (closest first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Affinity {
    /// Under one PCIe switch: the path crosses at most one switch (or none: two functions of
    /// one device).
    #[serde(rename = "PIX")]
    Pix,
    /// Under one root port, across several PCIe switches; no host bridge crossed.
    #[serde(rename = "PXB")]
    Pxb,
    /// Under one PCI host bridge (`pciDDDD:BB` in sysfs), through it: different root ports.
    #[serde(rename = "PHB")]
    Phb,
    /// Different host bridges on one NUMA node.
    #[serde(rename = "NODE")]
    Node,
    /// Different NUMA nodes (the path crosses the inter-socket link), or a NUMA node unknown
    /// on a machine with several.
    #[serde(rename = "SYS")]
    Sys,
}

/// One cell of the GPU-to-device affinity matrix.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuAffinity {
    /// The GPU's PCI address (`0000:17:00.0`).
    pub gpu: String,
    /// The other device's PCI address.
    pub device: String,
    pub kind: DeviceKind,
    pub affinity: Affinity,
}

/// A device of interest whose PCIe link trained below its capability.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DegradedLink {
    /// PCI address (`0000:17:00.0`).
    pub address: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<DeviceKind>,
    /// `current_link_speed`, GT/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_speed_gts: Option<f64>,
    /// The speed both ends support: the lower of the device's `max_link_speed` and its upstream
    /// port's, GT/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_speed_gts: Option<f64>,
    /// `current_link_width`, lanes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_width: Option<u32>,
    /// The width both ends support: the lower of the device's `max_link_width` and its
    /// upstream port's, lanes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_width: Option<u32>,
}
