//! The inventory document a node agent reports (`Inventory.document_json`), camelCase JSON.
//!
//! Every section is optional: a collector that cannot read its source leaves the section or field
//! absent and adds a [`Note`]; it never fails the whole inventory.

use serde::{Deserialize, Serialize};

/// Version of this document's shape. Bump on an incompatible change.
pub const SCHEMA_VERSION: u32 = 1;

/// The whole inventory of one machine.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Inventory {
    pub schema_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Cpu>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Memory>,
    #[serde(default)]
    pub disks: Vec<Disk>,
    #[serde(default)]
    pub nics: Vec<Nic>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub os: Option<Os>,
    /// Why a section or field is missing.
    #[serde(default)]
    pub notes: Vec<Note>,
}

/// CPU facts from `/proc/cpuinfo` and `/sys/devices/system/cpu`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Cpu {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sockets: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cores: Option<u32>,
    /// Logical CPUs (hardware threads).
    pub threads: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
}

/// Memory from `/proc/meminfo`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Memory {
    /// `MemTotal`, bytes.
    pub total_bytes: u64,
}

/// A block device from `/sys/block`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Disk {
    pub name: String,
    /// Bytes (`size` is in 512-byte sectors in sysfs).
    pub size_bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotational: Option<bool>,
}

/// A network interface from `/sys/class/net`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Nic {
    pub name: String,
    /// Current MAC (`address`), lowercase `aa:bb:...`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// True when the interface has a `device` link (a real device, not a virtual interface).
    pub physical: bool,
}

/// Operating system facts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Os {
    /// `/proc/sys/kernel/osrelease`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
    /// `/proc/sys/kernel/random/boot_id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
}

/// Why something could not be collected.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Note {
    /// Which collector, e.g. `cpu`, `smbios`.
    pub source: String,
    pub message: String,
}
