//! PCI functions (`/sys/bus/pci/devices`, kernel ABI `sysfs-bus-pci`) with their PCIe link and
//! place in the hierarchy ([`super::pcie`]), and InfiniBand ports (`/sys/class/infiniband`,
//! `sysfs-class-infiniband`).

use bc_protocol::inventory::{InfinibandPort, Note, PciDevice};

use super::note;
use crate::hostroot::HostRoot;

/// PCI vendor id of NVIDIA.
pub const NVIDIA: &str = "10de";
/// PCI vendor id of Mellanox (NVIDIA Networking).
pub const MELLANOX: &str = "15b3";

pub(crate) fn hex_id(v: Option<String>) -> Option<String> {
    let v = v?;
    let h = v.trim_start_matches("0x").to_lowercase();
    (!h.is_empty() && h.chars().all(|c| c.is_ascii_hexdigit())).then_some(h)
}

/// Every PCI function, sorted by address. Functions without readable ids are skipped with a note.
pub fn devices(root: &HostRoot, notes: &mut Vec<Note>) -> Vec<PciDevice> {
    let addrs = match root.list_dir("/sys/bus/pci/devices") {
        Ok(a) => a,
        Err(e) => {
            note(notes, "pci", format!("/sys/bus/pci/devices: {e}"));
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for address in addrs {
        let base = format!("/sys/bus/pci/devices/{address}");
        let (Some(vendor_id), Some(device_id), Some(class)) = (
            hex_id(root.read_trimmed(format!("{base}/vendor"))),
            hex_id(root.read_trimmed(format!("{base}/device"))),
            hex_id(root.read_trimmed(format!("{base}/class"))),
        ) else {
            note(
                notes,
                "pci",
                format!("{address}: vendor, device or class unreadable"),
            );
            continue;
        };
        let link = super::pcie::link(root, &base);
        let place = super::pcie::placement(root, &address);
        out.push(PciDevice {
            current_link_speed_gts: link.current_speed_gts,
            max_link_speed_gts: link.max_speed_gts,
            current_link_width: link.current_width,
            max_link_width: link.max_width,
            host_bridge: place.host_bridge,
            bridges: place.bridges,
            nvidia_gpu: vendor_id == NVIDIA && class.starts_with("03"),
            mellanox: vendor_id == MELLANOX && class.starts_with("02"),
            infiniband: class.starts_with("0207"),
            driver: root.read_link_name(format!("{base}/driver")),
            numa_node: root
                .read_parsed::<i32>(format!("{base}/numa_node"))
                .filter(|n| *n >= 0),
            address,
            vendor_id,
            device_id,
            class,
        });
    }
    out
}

/// `"4: ACTIVE"` → `ACTIVE`.
fn without_number(s: String) -> String {
    match s.split_once(':') {
        Some((n, rest)) if n.trim().chars().all(|c| c.is_ascii_digit()) => rest.trim().to_owned(),
        _ => s,
    }
}

/// The port GUID in a GID as sysfs writes it (`gids/N`: eight groups of four hex digits,
/// `fe80:0000:0000:0000:0002:c903:000f:abcd`): its last four groups (IBA vol. 1 §4.1.1, the GID
/// of index 0 is the subnet prefix and the port GUID). `None` for anything else or an all-zero
/// GUID (a RoCE port without an address).
fn gid_port_guid(gid: &str) -> Option<String> {
    let groups: Vec<&str> = gid.split(':').collect();
    let ok = groups.len() == 8
        && groups
            .iter()
            .all(|g| g.len() == 4 && g.chars().all(|c| c.is_ascii_hexdigit()));
    let guid = groups.get(4..)?.join(":").to_lowercase();
    (ok && guid.chars().any(|c| c != '0' && c != ':')).then_some(guid)
}

/// Every port of every HCA, sorted by device and port.
pub fn infiniband(root: &HostRoot) -> Vec<InfinibandPort> {
    let mut out = Vec::new();
    for dev in root.list_dir("/sys/class/infiniband").unwrap_or_default() {
        let base = format!("/sys/class/infiniband/{dev}");
        let firmware = root.read_trimmed(format!("{base}/fw_ver"));
        let mut ports: Vec<u32> = root
            .list_dir(format!("{base}/ports"))
            .unwrap_or_default()
            .iter()
            .filter_map(|p| p.parse().ok())
            .collect();
        ports.sort_unstable();
        for port in ports {
            let p = format!("{base}/ports/{port}");
            out.push(InfinibandPort {
                device: dev.clone(),
                port,
                state: root.read_trimmed(format!("{p}/state")).map(without_number),
                phys_state: root
                    .read_trimmed(format!("{p}/phys_state"))
                    .map(without_number),
                rate: root.read_trimmed(format!("{p}/rate")),
                link_layer: root.read_trimmed(format!("{p}/link_layer")),
                firmware: firmware.clone(),
                port_guid: root
                    .read_trimmed(format!("{p}/gids/0"))
                    .and_then(|g| gid_port_guid(&g)),
            });
        }
    }
    out
}
