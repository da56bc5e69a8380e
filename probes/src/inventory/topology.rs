//! PCIe and NUMA topology: NUMA nodes (`/sys/devices/system/node/node<N>/{cpulist,meminfo}`,
//! kernel ABI `sysfs-devices-node`), the GPU-to-device affinity matrix and the degraded links,
//! both computed from the PCI list ([`super::pci`]) with no further reads.
//!
//! # Design
//! Affinity follows `nvidia-smi topo -m`, from the functions' placements (host bridge and the
//! bridges down from the root port):
//! - same host bridge, a common bridge above both, and at most one bridge (a switch's downstream
//!   port) below the deepest common one on each side: `PIX`, one switch crossed;
//! - same host bridge, a common bridge, more below it: `PXB`, several switches;
//! - same host bridge, no common bridge (different root ports): `PHB`;
//! - different host bridges, same NUMA node: `NODE`; else `SYS`. A NUMA node the kernel does not
//!   know (`numa_node` -1) is node 0 on a machine with at most one node, and unknown (`SYS`)
//!   otherwise.
//!
//! A link is degraded when its current speed or width is below what both of its ends support:
//! the lower of the device's own maximum and its upstream port's (the last bridge), so a Gen4
//! card in a Gen3 slot, or an x16 card in an x8 slot, is not reported; a card that trained at x8
//! in an x16 slot is.
//!
//! # Limitations
//! Many GPUs (and some NICs) lower their link speed when idle to save power, and raise it under
//! load: a speed below maximum on an idle GPU is not by itself a fault. The width does not change
//! that way. Whoever turns `degradedLinks` into a condition weighs that.

use bc_protocol::inventory::{
    Affinity, DegradedLink, DeviceKind, GpuAffinity, Note, NumaNode, PciDevice, Topology,
};

use super::note;
use crate::hostroot::HostRoot;

/// A `cpulist` that is not a list of CPU numbers and ranges.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CpuListError {
    /// `{0:?}` is neither a CPU number nor a range `a-b` with a ≤ b.
    #[error("{0:?} is neither a CPU number nor a range a-b with a <= b")]
    Item(String),
}

/// Logical CPUs in a `cpulist` (`0-15,64-79`, `0,2,4`, empty for none).
pub fn cpulist_count(list: &str) -> Result<u32, CpuListError> {
    let mut n = 0u32;
    for item in list.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let bad = || CpuListError::Item(item.to_owned());
        let (a, b) = match item.split_once('-') {
            Some((a, b)) => (a, b),
            None => (item, item),
        };
        let (a, b): (u32, u32) = (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
        if a > b {
            return Err(bad());
        }
        n = n.saturating_add(b - a + 1);
    }
    Ok(n)
}

/// The kind of a device of interest, `None` for any other function.
pub fn kind(d: &PciDevice) -> Option<DeviceKind> {
    let c = d.class.as_str();
    if d.vendor_id == super::pci::NVIDIA && (c.starts_with("0300") || c.starts_with("0302")) {
        Some(DeviceKind::Gpu)
    } else if c.starts_with("0207") {
        Some(DeviceKind::Infiniband)
    } else if c.starts_with("02") {
        Some(DeviceKind::Nic)
    } else if c.starts_with("0108") {
        Some(DeviceKind::Nvme)
    } else {
        None
    }
}

/// How far apart `a` and `b` are (see the module docs); `numa_nodes` is how many NUMA nodes the
/// machine has.
pub fn affinity(a: &PciDevice, b: &PciDevice, numa_nodes: usize) -> Affinity {
    if a.host_bridge.is_some() && a.host_bridge == b.host_bridge {
        let common = a
            .bridges
            .iter()
            .zip(&b.bridges)
            .take_while(|(x, y)| x == y)
            .count();
        if common == 0 {
            return Affinity::Phb;
        }
        let below = |d: &PciDevice| d.bridges.len() - common;
        return if below(a) <= 1 && below(b) <= 1 {
            Affinity::Pix
        } else {
            Affinity::Pxb
        };
    }
    let node = |n: Option<i32>| n.or((numa_nodes <= 1).then_some(0));
    match (node(a.numa_node), node(b.numa_node)) {
        (Some(x), Some(y)) if x == y => Affinity::Node,
        _ => Affinity::Sys,
    }
}

/// The lower of two optional values; the one present when only one is.
fn lower<T: PartialOrd + Copy>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(x), Some(y)) => Some(if y < x { y } else { x }),
        (x, None) => x,
        (None, y) => y,
    }
}

/// `d`'s link when it runs below what `d` and its upstream port `up` both support.
pub fn degraded(d: &PciDevice, up: Option<&PciDevice>) -> Option<DegradedLink> {
    let max_speed = lower(d.max_link_speed_gts, up.and_then(|u| u.max_link_speed_gts));
    let max_width = lower(d.max_link_width, up.and_then(|u| u.max_link_width));
    let slow = matches!((d.current_link_speed_gts, max_speed), (Some(c), Some(m)) if c < m);
    let narrow = matches!((d.current_link_width, max_width), (Some(c), Some(m)) if c < m);
    (slow || narrow).then(|| DegradedLink {
        address: d.address.clone(),
        kind: kind(d),
        current_speed_gts: d.current_link_speed_gts,
        max_speed_gts: max_speed,
        current_width: d.current_link_width,
        max_width,
    })
}

/// NUMA nodes, sorted by id. A missing `/sys/devices/system/node` (a kernel without NUMA) gives
/// none and no note; an unreadable or malformed `cpulist` gives a note.
pub fn numa_nodes(root: &HostRoot, notes: &mut Vec<Note>) -> Vec<NumaNode> {
    const DIR: &str = "/sys/devices/system/node";
    let mut ids: Vec<u32> = root
        .list_dir(DIR)
        .unwrap_or_default()
        .iter()
        .filter_map(|n| n.strip_prefix("node")?.parse().ok())
        .collect();
    ids.sort_unstable();
    let mut out = Vec::new();
    for id in ids {
        let base = format!("{DIR}/node{id}");
        let cpulist = match root.read_to_string(format!("{base}/cpulist")) {
            Ok(t) => t.trim().to_owned(),
            Err(e) => {
                note(notes, "topology", format!("{base}/cpulist: {e}"));
                String::new()
            }
        };
        let cpus = cpulist_count(&cpulist).unwrap_or_else(|e| {
            note(notes, "topology", format!("{base}/cpulist: {e}"));
            0
        });
        out.push(NumaNode {
            id,
            cpus,
            cpulist,
            memory_bytes: root
                .read_to_string(format!("{base}/meminfo"))
                .ok()
                .and_then(|t| node_mem_total(&t)),
        });
    }
    out
}

/// `Node 0 MemTotal:  134182340 kB` → bytes.
fn node_mem_total(meminfo: &str) -> Option<u64> {
    meminfo.lines().find_map(|l| {
        let (_, rest) = l.split_once("MemTotal:")?;
        let kib: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(kib.saturating_mul(1024))
    })
}

/// The topology section from the NUMA nodes under `root` and the PCI list; `None` when there is
/// nothing to say (no NUMA nodes, no GPU, no degraded link).
pub fn collect(root: &HostRoot, pci: &[PciDevice], notes: &mut Vec<Note>) -> Option<Topology> {
    let numa = numa_nodes(root, notes);
    let of_interest: Vec<(&PciDevice, DeviceKind)> =
        pci.iter().filter_map(|d| Some((d, kind(d)?))).collect();
    let mut affinity = Vec::new();
    for (g, _) in of_interest.iter().filter(|(_, k)| *k == DeviceKind::Gpu) {
        for (d, k) in of_interest.iter().filter(|(d, _)| d.address != g.address) {
            affinity.push(GpuAffinity {
                gpu: g.address.clone(),
                device: d.address.clone(),
                kind: *k,
                affinity: self::affinity(g, d, numa.len()),
            });
        }
    }
    let degraded_links: Vec<DegradedLink> = of_interest
        .iter()
        .filter_map(|(d, _)| {
            let up = d
                .bridges
                .last()
                .and_then(|b| pci.iter().find(|p| &p.address == b));
            degraded(d, up)
        })
        .collect();
    let t = Topology {
        numa_nodes: numa,
        affinity,
        degraded_links,
    };
    (t != Topology::default()).then_some(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpulists() {
        assert_eq!(cpulist_count("0-15,64-79"), Ok(32));
        assert_eq!(cpulist_count("0,2,4\n"), Ok(3));
        assert_eq!(cpulist_count(""), Ok(0));
        assert_eq!(cpulist_count("3"), Ok(1));
        assert_eq!(cpulist_count("7-3"), Err(CpuListError::Item("7-3".into())));
        assert!(cpulist_count("a-b").is_err());
    }

    #[test]
    fn node_meminfo() {
        assert_eq!(
            node_mem_total("Node 1 MemTotal:       134217728 kB\nNode 1 MemFree: 1 kB\n"),
            Some(134_217_728 * 1024)
        );
        assert_eq!(node_mem_total("Node 1 MemFree: 1 kB\n"), None);
    }
}
