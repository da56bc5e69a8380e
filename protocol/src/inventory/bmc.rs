//! The machine's BMC as the host sees it (issue 20.4): in-band IPMI through the kernel's
//! `/dev/ipmi0` and the Redfish host interface that the firmware describes in SMBIOS type 42.
//!
//! The control plane compares [`Bmc::lan`] with the BMC the node was enrolled through
//! (`BmcAddressMatches`, docs/inventory.md "BMC"), and lists [`Bmc::firmware`] among the
//! machine's firmware versions.

use serde::{Deserialize, Serialize};

/// What the host knows of its BMC. Every part is optional: a machine without `/dev/ipmi0` (no
/// `ipmi_si`/`ipmi_devintf`, a VM, a container) still may describe a Redfish host interface.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Bmc {
    /// Firmware revision as `ipmitool mc info` prints it: `<major>.<minor as two hex digits>`
    /// (Get Device ID bytes 3–4, IPMI 2.0 §20.1: major in bits 6:0, minor in BCD), e.g. `2.34`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub firmware: Option<String>,
    /// IPMI version the BMC implements, `2.0` (Get Device ID byte 5, BCD).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipmi_version: Option<String>,
    /// IANA Private Enterprise Number of the BMC's maker (Get Device ID bytes 7–9, 20 bits),
    /// e.g. 674 for Dell, 10876 for Supermicro.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manufacturer_id: Option<u32>,
    /// The maker's product id (Get Device ID bytes 10–11).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub product_id: Option<u16>,
    /// Every LAN channel (Get Channel Info medium type 802.3) with its configuration (Get LAN
    /// Configuration Parameters, IPMI 2.0 §23.2), in channel order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lan: Vec<BmcLanChannel>,
    /// Redfish host interfaces of SMBIOS type 42 (DSP0270), in table order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub redfish_host_interfaces: Vec<RedfishHostInterface>,
}

/// One LAN channel of the BMC (IPMI 2.0 §23.2, Get LAN Configuration Parameters).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BmcLanChannel {
    /// Channel number, 1–11.
    pub channel: u8,
    /// IPv4 address (parameter 3); absent when `0.0.0.0` (not configured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_address: Option<String>,
    /// `static`, `dhcp`, `bios` or `other` (parameter 4, bits 3:0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_source: Option<String>,
    /// Subnet mask in dotted form (parameter 6).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnet_mask: Option<String>,
    /// Default gateway (parameter 12); absent when `0.0.0.0`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    /// The BMC port's MAC, lowercase `aa:bb:cc:dd:ee:ff` (parameter 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac_address: Option<String>,
    /// 802.1Q VLAN id when tagging is enabled (parameter 20: bit 15 enable, bits 11:0 id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan_id: Option<u16>,
}

/// A Redfish host interface (SMBIOS type 42, interface type 0x40 "Network Host Interface", with
/// a "Redfish over IP" protocol record, DSP0270 §8): where the host reaches the BMC's Redfish
/// service in band. The address is usually link-local (a USB or PCI NIC to the BMC), not the
/// BMC's LAN address: it is reported, never compared with the enrollment.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RedfishHostInterface {
    /// The Redfish service's UUID (its `ServiceRoot.UUID`), lowercase text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_uuid: Option<String>,
    /// The service's IP address (IPv4 or IPv6 text); absent when the record leaves it unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_address: Option<String>,
    /// The service's TCP port (usually 443).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_port: Option<u16>,
    /// The service's VLAN id; absent when 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_vlan_id: Option<u32>,
    /// The service's host name, when the record carries one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_hostname: Option<String>,
    /// How the service's address is assigned: `unknown`, `static`, `dhcp`, `autoConfigure`,
    /// `hostSelected` (DSP0270 table "IP Assignment Type").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assignment: Option<String>,
    /// The host side's address on that interface, when assigned statically.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_address: Option<String>,
}

impl Bmc {
    /// Every IPv4 address of the BMC's LAN channels, in channel order.
    pub fn lan_addresses(&self) -> impl Iterator<Item = &str> {
        self.lan.iter().filter_map(|c| c.ip_address.as_deref())
    }

    /// True when nothing was learnt.
    pub fn is_empty(&self) -> bool {
        *self == Bmc::default()
    }
}
