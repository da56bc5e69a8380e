//! What the model reads from a node's inventory document (`nodes.inventory`, the camelCase JSON of
//! [`bc_protocol::inventory::Inventory`], read through that type so a renamed field no longer
//! compiles): the GPU atoms placement books, and the summary NodeDetail shows.
//!
//! GPUs are the document's `gpus`; each entry's atom id is its `uuid` (NVML `nvmlDeviceGetUUID`)
//! when present, else `gpu<position in the list>` (the PCI fallback has no UUID). A document that
//! does not parse as an `Inventory` has no atoms and no summary (it is logged).

use bc_protocol::inventory::Inventory;
use serde::Serialize;

/// The typed document of stored inventory JSON; `None` (logged) when it is not an `Inventory`.
pub fn parse(json: &str) -> Option<Inventory> {
    match serde_json::from_str(json) {
        Ok(inv) => Some(inv),
        Err(e) => {
            tracing::warn!(error = %e, "stored inventory is not an Inventory document; no GPUs read from it");
            None
        }
    }
}

/// The node's typed inventory, `None` before the first report (or when it does not parse).
pub fn of(node: &cpl_store::NodeRecord) -> Option<Inventory> {
    node.inventory_json.as_deref().and_then(parse)
}

/// The node's GPUs as atom ids, sorted and deduplicated.
pub fn gpu_atoms(inventory: Option<&Inventory>) -> Vec<String> {
    let Some(inv) = inventory else {
        return Vec::new();
    };
    let mut atoms: Vec<String> = inv
        .gpus
        .iter()
        .enumerate()
        .map(
            |(pos, g)| match g.uuid.as_deref().filter(|u| !u.is_empty()) {
                Some(uuid) => uuid.to_owned(),
                None => format!("gpu{pos}"),
            },
        )
        .collect();
    atoms.sort();
    atoms.dedup();
    atoms
}

/// GPU model names (`name`), in list order; GPUs without a name are left out.
pub fn gpu_models(inventory: Option<&Inventory>) -> Vec<String> {
    inventory
        .map(|inv| inv.gpus.iter().filter_map(|g| g.name.clone()).collect())
        .unwrap_or_default()
}

/// A physical NIC in the summary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NicSummary {
    pub name: String,
    /// Current MAC as `aa:bb:cc:dd:ee:ff`, if the collector read one.
    pub mac: Option<String>,
}

/// What firmware a component of the machine runs (issue 20.5): one line of the summary's
/// `firmware`, and what `nodes.list {firmware: "<component>=<version>"}` matches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FirmwareEntry {
    /// One of [`FIRMWARE_COMPONENTS`].
    pub component: String,
    /// `system`, the disk's or NIC's name, the InfiniBand device, the GPU's PCI bus id.
    pub device: String,
    pub version: String,
}

/// The components `firmware` lists, and where each version comes from: `bios`
/// (`system.biosVersion`, SMBIOS type 0), `bmc` (`bmc.firmware`, IPMI Get Device ID through the
/// host's `/dev/ipmi0`), `nvme` (an NVMe disk's `firmware`, Identify Controller
/// FR), `nic` (a physical NIC's `firmwareVersion`, ethtool `ETHTOOL_GDRVINFO`), `infiniband`
/// (`infiniband[].firmware`, the HCA's `fw_ver`), `gpu` (`gpus[].vbiosVersion`,
/// `nvmlDeviceGetVbiosVersion`).
pub const FIRMWARE_COMPONENTS: &[&str] = &["bios", "bmc", "nvme", "nic", "infiniband", "gpu"];

/// Every firmware version the inventory names, in the order of [`FIRMWARE_COMPONENTS`].
pub fn firmware(inv: &Inventory) -> Vec<FirmwareEntry> {
    let entry = |component: &str, device: &str, version: &str| FirmwareEntry {
        component: component.to_owned(),
        device: device.to_owned(),
        version: version.to_owned(),
    };
    let mut out = Vec::new();
    if let Some(v) = inv.system.as_ref().and_then(|s| s.bios_version.as_deref()) {
        out.push(entry("bios", "system", v));
    }
    if let Some(v) = inv.bmc.as_ref().and_then(|b| b.firmware.as_deref()) {
        out.push(entry("bmc", "bmc", v));
    }
    for d in inv.disks.iter().filter(|d| d.nvme) {
        if let Some(v) = d.firmware.as_deref() {
            out.push(entry("nvme", &d.name, v));
        }
    }
    for n in inv.nics.iter().filter(|n| n.physical) {
        if let Some(v) = n.firmware_version.as_deref() {
            out.push(entry("nic", &n.name, v));
        }
    }
    for p in &inv.infiniband {
        if let Some(v) = p.firmware.as_deref() {
            out.push(entry("infiniband", &p.device, v));
        }
    }
    for g in &inv.gpus {
        if let Some(v) = g.vbios_version.as_deref() {
            out.push(entry("gpu", &g.pci_bus_id, v));
        }
    }
    out.retain(|e| !e.version.trim().is_empty());
    // Every port of an InfiniBand HCA reports the same firmware.
    out.dedup();
    out
}

/// The inventory summary in NodeDetail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct InventorySummary {
    /// `cpu.model` (`/proc/cpuinfo` "model name").
    pub cpu_model: Option<String>,
    /// `cpu.threads`: logical CPUs.
    pub cpu_threads: Option<u64>,
    /// `memory.totalBytes` (`/proc/meminfo` MemTotal), bytes.
    pub memory_bytes: Option<u64>,
    /// `nics[]` with `physical: true` (NICs without the flag are kept: older documents).
    pub nics: Vec<NicSummary>,
    /// Number of GPUs (atoms).
    pub gpus: u32,
    /// Firmware versions in one place ([`firmware`]).
    pub firmware: Vec<FirmwareEntry>,
}

/// Summarizes an inventory document.
pub fn summary(inventory: &Inventory) -> InventorySummary {
    InventorySummary {
        cpu_model: inventory.cpu.as_ref().and_then(|c| c.model.clone()),
        cpu_threads: inventory.cpu.as_ref().map(|c| u64::from(c.threads)),
        memory_bytes: inventory.memory.as_ref().map(|m| m.total_bytes),
        nics: inventory
            .nics
            .iter()
            .filter(|n| n.physical)
            .map(|n| NicSummary {
                name: n.name.clone(),
                mac: n.mac.clone(),
            })
            .collect(),
        gpus: u32::try_from(gpu_atoms(Some(inventory)).len()).unwrap_or(u32::MAX),
        firmware: firmware(inventory),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn inv(v: serde_json::Value) -> Inventory {
        serde_json::from_value(v).unwrap_or_default()
    }

    #[test]
    fn atoms_prefer_uuid_then_position() {
        let gpu = |uuid: Option<&str>| json!({"uuid": uuid, "pciBusId": "0000:01:00.0", "source": "nvml"});
        let i = inv(
            json!({"schemaVersion": 1, "gpus": [gpu(Some("GPU-b")), gpu(None), gpu(None), gpu(Some("GPU-b"))]}),
        );
        assert_eq!(gpu_atoms(Some(&i)), vec!["GPU-b", "gpu1", "gpu2"]);
        assert!(gpu_atoms(Some(&inv(json!({"schemaVersion": 1})))).is_empty());
        assert!(gpu_atoms(None).is_empty());
        // Not an Inventory (no schemaVersion, a GPU without its bus id): no atoms.
        assert!(parse(r#"{"gpus": [{"uuid": "GPU-1"}]}"#).is_none());
    }

    #[test]
    fn firmware_lists_every_component_once_with_its_device() {
        let i = inv(json!({
            "schemaVersion": 1,
            "system": {"biosVersion": "2.19.1"},
            "bmc": {"firmware": "7.10", "lan": [{"channel": 1, "ipAddress": "10.0.0.5"}]},
            "disks": [
                {"name": "nvme0n1", "sizeBytes": 1, "nvme": true, "firmware": "1B2QEXP7"},
                {"name": "sda", "sizeBytes": 1, "nvme": false, "firmware": "GXA0"},
                {"name": "nvme1n1", "sizeBytes": 1, "nvme": true}
            ],
            "nics": [
                {"name": "eno1", "physical": true, "firmwareVersion": "22.39.1002"},
                {"name": "bond0", "physical": false, "firmwareVersion": "22.39.1002"}
            ],
            "infiniband": [
                {"device": "mlx5_0", "port": 1, "firmware": "28.39.1002"},
                {"device": "mlx5_0", "port": 2, "firmware": "28.39.1002"}
            ],
            "gpus": [{"pciBusId": "0000:18:00.0", "source": "nvml", "vbiosVersion": "96.00.89.00.01"}]
        }));
        let f: Vec<(String, String, String)> = firmware(&i)
            .into_iter()
            .map(|e| (e.component, e.device, e.version))
            .collect();
        let want = [
            ("bios", "system", "2.19.1"),
            ("bmc", "bmc", "7.10"),
            ("nvme", "nvme0n1", "1B2QEXP7"),
            ("nic", "eno1", "22.39.1002"),
            ("infiniband", "mlx5_0", "28.39.1002"),
            ("gpu", "0000:18:00.0", "96.00.89.00.01"),
        ];
        let want: Vec<(String, String, String)> = want
            .iter()
            .map(|(a, b, c)| ((*a).into(), (*b).into(), (*c).into()))
            .collect();
        assert_eq!(f, want);
    }

    #[test]
    fn summary_reads_the_documented_fields() {
        let i = inv(json!({
            "schemaVersion": 1,
            "cpu": {"model": "AMD EPYC 9654", "threads": 192},
            "memory": {"totalBytes": 1_099_511_627_776_u64},
            "nics": [
                {"name": "eno1", "mac": "aa:bb:cc:dd:ee:01", "physical": true},
                {"name": "bond0", "mac": "aa:bb:cc:dd:ee:01", "physical": false}
            ],
            "gpus": [
                {"uuid": "GPU-1", "pciBusId": "0000:01:00.0", "source": "nvml"},
                {"uuid": "GPU-2", "pciBusId": "0000:02:00.0", "source": "nvml"}
            ]
        }));
        let s = summary(&i);
        assert_eq!(s.cpu_model.as_deref(), Some("AMD EPYC 9654"));
        assert_eq!(s.cpu_threads, Some(192));
        assert_eq!(s.memory_bytes, Some(1_099_511_627_776));
        assert_eq!(s.nics.len(), 1);
        assert_eq!(s.nics[0].name, "eno1");
        assert_eq!(s.gpus, 2);
        let empty = summary(&inv(json!({"schemaVersion": 1})));
        assert_eq!(empty.cpu_threads, None);
        assert!(empty.nics.is_empty());
    }
}
