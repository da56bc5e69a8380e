//! The site agent's BMC commands: `bmc.verify`, `bmc.power` and `bmc.setBootDevice`, sent to the
//! site agent that holds its site's lease, about one bare-metal node (`nodeId`).
//!
//! # Design
//! Credentials are never part of these arguments: the site agent finds the BMC of `nodeId` (and
//! its credentials) in the `SiteAssignment` it holds in memory. Every command carries the
//! `leaseEpoch` it was issued under; a site agent whose lease has another epoch, or has lapsed,
//! refuses it with [`super::CommandErrorCode::LeaseLost`] and does nothing, so a task is never run
//! by two appliances. Failures name the BMC (its address, never its credentials) and what it
//! answered: a BMC fault is not a node fault.
//!
//! Power and boot-device values are spelled as the operator API spells them (`on`, `softOff`,
//! `pxe`), not as Redfish (`On`, `GracefulShutdown`, `Pxe`) or IPMI does: the drivers translate.

use serde::{Deserialize, Serialize};

/// A power action (`nodes.power {action}`), as the site agent executes it against the BMC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum PowerAction {
    /// Power on (Redfish `On`; IPMI `chassis power on`).
    On,
    /// Power off at once (Redfish `ForceOff`; IPMI `chassis power off`).
    Off,
    /// Ask the OS to shut down (Redfish `GracefulShutdown`; IPMI `chassis power soft`).
    SoftOff,
    /// Restart at once (Redfish `ForceRestart`; IPMI `chassis power reset`, or `cycle` when off).
    Reboot,
}

impl PowerAction {
    /// The JSON spelling (`softOff`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::On => "on",
            Self::Off => "off",
            Self::SoftOff => "softOff",
            Self::Reboot => "reboot",
        }
    }
}

/// The device a machine boots from next (`nodes.setBootDevice {device}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum BootDevice {
    /// The network (Redfish `Pxe`; IPMI `chassis bootdev pxe`).
    Pxe,
    /// The local disk (Redfish `Hdd`; IPMI `chassis bootdev disk`).
    Disk,
    /// No override: the firmware's own boot order (Redfish `BootSourceOverrideEnabled:
    /// Disabled`; IPMI `chassis bootdev none`). What the control plane sets once a ramdisk
    /// joined (issue 31, rule 4).
    None,
}

impl BootDevice {
    /// The JSON spelling (`pxe`, `disk`, `none`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pxe => "pxe",
            Self::Disk => "disk",
            Self::None => "none",
        }
    }
}

/// The power state a BMC reports, in the spelling of the node's `power` axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum PowerState {
    /// Redfish `On` or `PoweringOff`; IPMI "Chassis Power is on".
    On,
    /// Redfish `Off` or `PoweringOn`; IPMI "Chassis Power is off".
    Off,
    /// The BMC did not say, or said something else.
    #[default]
    Unknown,
}

impl PowerState {
    /// The power axis's spelling (`on`, `off`, `unknown`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::On => "on",
            Self::Off => "off",
            Self::Unknown => "unknown",
        }
    }
}

/// The args of `bmc.verify` (camelCase JSON; unknown keys are refused): check that the BMC of
/// `nodeId` answers with the credentials the site agent holds for it, that the address names a
/// system, and read the system's identity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VerifyArgs {
    /// The bare-metal node whose BMC to verify.
    pub node_id: String,
    /// The site lease epoch the command was issued under.
    pub lease_epoch: u64,
    /// Verify the candidate credentials of `ManagedBmc.candidate` (a rotation by
    /// `nodes.updateBmcCredentials`) instead of the current ones.
    #[serde(default)]
    pub candidate: bool,
}

/// One network interface of a system as its BMC reports it (Redfish `EthernetInterfaces`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BmcNic {
    /// The interface's id on the BMC (`EthernetInterface.Id`), e.g. `NIC.Integrated.1-1`.
    pub id: String,
    /// Lowercase, colon-separated (`PermanentMACAddress`, else `MACAddress`).
    pub mac: String,
}

/// The result of `bmc.verify`: what the BMC says about the system (camelCase JSON). These
/// identifiers are what the ramdisk's hardware key must later match.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BmcFacts {
    /// The system's path on the BMC (`/redfish/v1/Systems/<id>`); empty for IPMI.
    #[serde(default)]
    pub system_path: String,
    /// SMBIOS system UUID as the BMC reports it (`ComputerSystem.UUID`; IPMI `Get System GUID`),
    /// lowercase.
    #[serde(default)]
    pub uuid: Option<String>,
    /// `ComputerSystem.SerialNumber`.
    #[serde(default)]
    pub serial: Option<String>,
    /// `ComputerSystem.Manufacturer`.
    #[serde(default)]
    pub manufacturer: Option<String>,
    /// `ComputerSystem.Model`.
    #[serde(default)]
    pub model: Option<String>,
    /// The system's NICs (empty for IPMI, which does not list them).
    #[serde(default)]
    pub nics: Vec<BmcNic>,
    /// The power state read during the check.
    pub power: PowerState,
    /// SHA-256 of the BMC's leaf certificate (DER), lowercase hex, when it spoke TLS: recorded
    /// at enrollment and pinned afterwards.
    #[serde(default)]
    pub cert_sha256: Option<String>,
    /// How the credentials got through when it took more than one try (a rotation tried again
    /// after a lockout window: when it was refused, when it was tried again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The args of `bmc.power` (camelCase JSON; unknown keys are refused).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PowerArgs {
    /// The bare-metal node whose BMC to act on.
    pub node_id: String,
    /// The site lease epoch the command was issued under.
    pub lease_epoch: u64,
    /// What to do.
    pub action: PowerAction,
    /// A boot override for the next boot only, set before the action (issue 15: power on, or
    /// reboot, into the network boot), so the two cannot run in the wrong order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_device: Option<BootDevice>,
    /// With `boot_device: pxe`: the network boot is confirmed by the machine asking the site's
    /// boot service for its script, and the power-on is repeated when it does not (issue 31,
    /// rule 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_boot: Option<NetworkBootCheck>,
}

/// How a network boot is confirmed: the site agent's boot service must see one of the
/// machine's MACs ask for its script within `within_ms` of each power-on with PXE; after
/// `attempts` power-ons (the last with a persistent override) without one, the command fails
/// with `NETWORK_BOOT_NOT_REQUESTED`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkBootCheck {
    /// How long after a power-on the script request may come, ms.
    pub within_ms: u64,
    /// Power-ons with PXE at most (at least 1).
    pub attempts: u32,
}

/// The result of `bmc.power` (camelCase JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PowerResult {
    /// The power state read back after the action, once the BMC settled (a BMC that reports
    /// `PoweringOn` is asked again until it says `On`, within a bound; `unknown` when it never
    /// answered).
    pub power: PowerState,
    /// The network boot the site's boot service saw, when the command asked for one to be
    /// confirmed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_boot: Option<NetworkBootSeen>,
    /// BMC faults (no answer, 5xx) the operation retried before it succeeded: a flaky BMC.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub transient_faults: u32,
}

/// A confirmed network boot: which of the machine's MACs asked the boot service for its
/// script, and on which power-on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkBootSeen {
    /// The MAC in the script request (lowercase `aa:bb:…`).
    pub mac: String,
    /// The power-on (1-based) after which it came.
    pub attempt: u32,
    /// The override of that power-on was persistent (the last resort): clear it after the
    /// ramdisk joined.
    pub persistent: bool,
}

/// serde's `skip_serializing_if` for a zero count.
fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The args of `bmc.setBootDevice` (camelCase JSON; unknown keys are refused).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BootDeviceArgs {
    /// The bare-metal node whose BMC to act on.
    pub node_id: String,
    /// The site lease epoch the command was issued under.
    pub lease_epoch: u64,
    /// Boot from this next.
    pub device: BootDevice,
    /// Keep it for every later boot (Redfish `Continuous`), not only the next (`Once`).
    #[serde(default)]
    pub persistent: bool,
}

/// The result of `bmc.setBootDevice` (camelCase JSON): the override read back, where the BMC
/// reports one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BootDeviceResult {
    /// The boot device the BMC reports now; `None` where it cannot be read back (IPMI).
    #[serde(default)]
    pub device: Option<BootDevice>,
    /// Whether the BMC reports the override as persistent; `None` where it cannot be read back.
    #[serde(default)]
    pub persistent: Option<bool>,
    /// What the BMC holds differs from what was asked in a way the site agent accepted (a
    /// one-time override stored as `Continuous`): what was asked and what reads back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// BMC faults (no answer, 5xx) the operation retried before it succeeded.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub transient_faults: u32,
}
