//! System identity and DIMMs: the SMBIOS table (`/sys/firmware/dmi/tables`), else the kernel's
//! parsed copy in `/sys/class/dmi/id` (no DIMMs there).

use bc_protocol::inventory::{Dimm, Note, RedfishHostInterface, System};

use super::note;
use crate::hostroot::HostRoot;
use crate::smbios;

/// What the SMBIOS table gives the inventory.
#[derive(Debug, Default)]
pub struct Smbios {
    /// The system section (types 0–3), else `/sys/class/dmi/id`.
    pub system: Option<System>,
    /// Populated DIMMs (type 17).
    pub dimms: Vec<Dimm>,
    /// Redfish host interfaces (type 42), for the BMC section ([`super::bmc`]).
    pub redfish_host_interfaces: Vec<RedfishHostInterface>,
}

/// The system section, the populated DIMMs and the Redfish host interfaces.
pub fn collect(root: &HostRoot, notes: &mut Vec<Note>) -> Smbios {
    match smbios::load_sysfs(root) {
        Ok(t) => {
            for w in &t.warnings {
                note(notes, "smbios", w.clone());
            }
            let f = t.facts();
            let system = System {
                vendor: f.system_vendor.clone(),
                product: f.system_product.clone(),
                serial: f.system_serial.clone(),
                uuid: f.system_uuid(),
                bios_vendor: f.bios_vendor.clone(),
                bios_version: f.bios_version.clone(),
                bios_date: f.bios_date.clone(),
                board_vendor: f.board_vendor.clone(),
                board_product: f.board_product.clone(),
                board_serial: f.board_serial.clone(),
                chassis_vendor: f.chassis_vendor.clone(),
                chassis_type: f.chassis_type,
                chassis_serial: f.chassis_serial.clone(),
                smbios_version: Some(format!("{}.{}", t.version.0, t.version.1)),
            };
            Smbios {
                system: Some(system),
                dimms: f.dimms,
                redfish_host_interfaces: super::bmc::redfish_host_interfaces(t.data()),
            }
        }
        Err(e) => {
            note(notes, "smbios", format!("SMBIOS table: {e}"));
            Smbios {
                system: from_dmi_id(root, notes),
                ..Smbios::default()
            }
        }
    }
}

fn from_dmi_id(root: &HostRoot, notes: &mut Vec<Note>) -> Option<System> {
    const DIR: &str = "/sys/class/dmi/id";
    if !root.exists(DIR) {
        note(
            notes,
            "smbios",
            "no SMBIOS on this machine: /sys/class/dmi/id is absent too",
        );
        return None;
    }
    note(
        notes,
        "smbios",
        "system facts from /sys/class/dmi/id; no DIMMs",
    );
    let r = |f: &str| root.read_trimmed(format!("{DIR}/{f}"));
    Some(System {
        vendor: r("sys_vendor"),
        product: r("product_name"),
        serial: r("product_serial"),
        uuid: r("product_uuid").map(|u| u.to_lowercase()),
        bios_vendor: r("bios_vendor"),
        bios_version: r("bios_version"),
        bios_date: r("bios_date"),
        board_vendor: r("board_vendor"),
        board_product: r("board_name"),
        board_serial: r("board_serial"),
        chassis_vendor: r("chassis_vendor"),
        chassis_type: r("chassis_type").and_then(|t| t.parse().ok()),
        chassis_serial: r("chassis_serial"),
        smbios_version: None,
    })
}
