//! The BMC as the host sees it (issue 20.4): in-band IPMI ([`super::ipmi`]) for its firmware
//! and LAN addresses, and SMBIOS type 42 for its Redfish host interface.
//!
//! IPMI requests, all IPMI 2.0: Get Device ID (App netfn 0x06, cmd 0x01, §20.1), Get Channel
//! Info (App, cmd 0x42, §22.24) for channels 1–11 to find the 802.3 LAN channels, and Get LAN
//! Configuration Parameters (Transport netfn 0x0c, cmd 0x02, §23.2) for parameters 3 (IP
//! address), 4 (IP address source), 5 (MAC), 6 (subnet mask), 12 (default gateway) and 20
//! (802.1Q VLAN id) of each. A BMC that does not support a parameter leaves that field
//! absent; one that answers nothing (no device, not root, a timeout) leaves the IPMI fields
//! absent with a note. Nothing here fails the inventory.
//!
//! Type 42 (SMBIOS 3.x §7.43, DSP0270 §8): a "Network Host Interface" (interface type 0x40)
//! with a "Redfish over IP" protocol record (type 0x04), whose data is the service UUID (16),
//! host IP assignment type (1), host address format (1), host address (16), host mask (16),
//! service assignment type (1), service address format (1), service address (16), service
//! mask (16), port (2, LE), VLAN id (4, LE), host name length (1) and host name.

use std::net::{Ipv4Addr, Ipv6Addr};

use bc_protocol::inventory::{Bmc, BmcLanChannel, Note, RedfishHostInterface};
use smbioslib::{SMBiosData, SMBiosManagementControllerHostInterface};

use super::ipmi::{Ipmi, IpmiError};
use super::note;
use crate::hostroot::HostRoot;

const NETFN_APP: u8 = 0x06;
const NETFN_TRANSPORT: u8 = 0x0c;
const CMD_GET_DEVICE_ID: u8 = 0x01;
const CMD_GET_CHANNEL_INFO: u8 = 0x42;
const CMD_GET_LAN_CONFIG: u8 = 0x02;
/// Channel medium type "802.3 LAN" (IPMI 2.0 table 6-3).
const MEDIUM_LAN: u8 = 0x04;
/// Channel numbers a BMC may give its LAN channels (0 is IPMB, 0x0e "this channel", 0x0f the
/// system interface).
const CHANNELS: std::ops::RangeInclusive<u8> = 1..=0x0b;
/// SMBIOS type 42 interface type "Network Host Interface" (DSP0270).
const HOSTIF_NETWORK: u8 = 0x40;
/// Protocol record type "Redfish over IP" (DSP0270).
const PROTOCOL_REDFISH_OVER_IP: u8 = 0x04;

/// What Get Device ID says, parsed (IPMI 2.0 §20.1; `data` is after the completion code).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceId {
    /// `<major>.<minor>`, minor as two hex digits of its BCD byte (as `ipmitool mc info`).
    pub firmware: String,
    /// `major.minor` of the IPMI version.
    pub ipmi_version: String,
    pub manufacturer_id: Option<u32>,
    pub product_id: Option<u16>,
}

/// Parses a Get Device ID response; `None` when it is shorter than the 5 bytes that carry the
/// firmware revision and IPMI version.
pub fn parse_device_id(data: &[u8]) -> Option<DeviceId> {
    let (rev1, rev2, ver) = (*data.get(2)?, *data.get(3)?, *data.get(4)?);
    let manufacturer_id = data
        .get(6..9)
        .map(|m| u32::from_le_bytes([m[0], m[1], m[2] & 0x0f, 0]));
    let product_id = data.get(9..11).map(|p| u16::from_le_bytes([p[0], p[1]]));
    Some(DeviceId {
        firmware: format!("{}.{:02x}", rev1 & 0x7f, rev2),
        ipmi_version: format!("{}.{}", ver & 0x0f, ver >> 4),
        manufacturer_id,
        product_id,
    })
}

/// Dotted IPv4 from 4 bytes; `None` for `0.0.0.0` (not configured) or a short field.
fn ipv4(b: &[u8]) -> Option<String> {
    let a: [u8; 4] = b.get(..4)?.try_into().ok()?;
    let ip = Ipv4Addr::from(a);
    (!ip.is_unspecified()).then(|| ip.to_string())
}

/// Lowercase colon-separated MAC from 6 bytes; `None` for all zeros or a short field.
fn mac(b: &[u8]) -> Option<String> {
    let m = b.get(..6)?;
    if m.iter().all(|&x| x == 0) {
        return None;
    }
    Some(
        m.iter()
            .map(|x| format!("{x:02x}"))
            .collect::<Vec<_>>()
            .join(":"),
    )
}

/// Fills `channel` from one Get LAN Configuration Parameters answer (`data` after the completion
/// code: parameter revision, then the parameter's bytes).
pub fn apply_lan_parameter(channel: &mut BmcLanChannel, parameter: u8, data: &[u8]) {
    let Some(value) = data.get(1..) else { return };
    match parameter {
        3 => channel.ip_address = ipv4(value),
        4 => {
            channel.ip_source = value.first().map(|s| {
                match s & 0x0f {
                    1 => "static",
                    2 => "dhcp",
                    3 => "bios",
                    _ => "other",
                }
                .to_owned()
            })
        }
        5 => channel.mac_address = mac(value),
        6 => {
            channel.subnet_mask = value
                .get(..4)
                .and_then(|b| <[u8; 4]>::try_from(b).ok())
                .map(|a| Ipv4Addr::from(a).to_string())
        }
        12 => channel.gateway = ipv4(value),
        20 => {
            channel.vlan_id = match value.get(..2) {
                Some(&[lo, hi]) if hi & 0x80 != 0 => Some(u16::from_le_bytes([lo, hi & 0x0f])),
                _ => None,
            }
        }
        _ => {}
    }
}

/// The LAN parameters read per channel (see the module docs).
const LAN_PARAMETERS: [u8; 6] = [3, 4, 5, 6, 12, 20];

/// Reads the in-band part of [`Bmc`] through `ipmi`: device id, then each LAN channel.
fn read_ipmi(ipmi: &mut Ipmi, bmc: &mut Bmc, notes: &mut Vec<Note>) -> Result<(), IpmiError> {
    let id = ipmi.request(NETFN_APP, CMD_GET_DEVICE_ID, &[])?;
    match parse_device_id(&id) {
        Some(d) => {
            bmc.firmware = Some(d.firmware);
            bmc.ipmi_version = Some(d.ipmi_version);
            bmc.manufacturer_id = d.manufacturer_id;
            bmc.product_id = d.product_id;
        }
        None => note(
            notes,
            "bmc",
            format!("Get Device ID: a {}-byte answer is too short", id.len()),
        ),
    }
    for ch in CHANNELS {
        // An absent channel answers 0xcc/0xc9 at once: that is the end of the search for it.
        let info = match ipmi.request(NETFN_APP, CMD_GET_CHANNEL_INFO, &[ch]) {
            Ok(i) => i,
            Err(IpmiError::Completion { .. }) => continue,
            Err(e) => return Err(e),
        };
        if info.get(1).map(|m| m & 0x7f) != Some(MEDIUM_LAN) {
            continue;
        }
        let mut channel = BmcLanChannel {
            channel: ch,
            ..BmcLanChannel::default()
        };
        for p in LAN_PARAMETERS {
            match ipmi.request(NETFN_TRANSPORT, CMD_GET_LAN_CONFIG, &[ch, p, 0, 0]) {
                Ok(d) => apply_lan_parameter(&mut channel, p, &d),
                // 0x80: parameter not supported; the field stays absent.
                Err(IpmiError::Completion { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        bmc.lan.push(channel);
    }
    Ok(())
}

/// Text of an address field in a Redfish-over-IP record: `format` 1 is IPv4 (first 4 bytes),
/// 2 is IPv6; unspecified addresses and unknown formats give `None`.
fn record_address(format: u8, b: &[u8]) -> Option<String> {
    match format {
        1 => ipv4(b),
        2 => {
            let a: [u8; 16] = b.get(..16)?.try_into().ok()?;
            let ip = Ipv6Addr::from(a);
            (!ip.is_unspecified()).then(|| ip.to_string())
        }
        _ => None,
    }
}

/// DSP0270's "IP Assignment Type".
fn assignment(t: u8) -> String {
    match t {
        1 => "static",
        2 => "dhcp",
        3 => "autoConfigure",
        4 => "hostSelected",
        _ => "unknown",
    }
    .to_owned()
}

/// Parses the data of one "Redfish over IP" protocol record (layout in the module docs);
/// `None` when it is shorter than the fixed 91 bytes.
pub fn parse_redfish_over_ip(d: &[u8]) -> Option<RedfishHostInterface> {
    if d.len() < 91 {
        return None;
    }
    let uuid: [u8; 16] = d[..16].try_into().ok()?;
    // Stored as SMBIOS stores the system UUID (first three fields little-endian, DSP0270).
    let service_uuid =
        (uuid != [0; 16] && uuid != [0xff; 16]).then(|| crate::smbios::render_uuid(&uuid, (3, 0)));
    let port = u16::from_le_bytes([d[84], d[85]]);
    let vlan = u32::from_le_bytes([d[86], d[87], d[88], d[89]]);
    let name_len = usize::from(d[90]);
    let service_hostname = d
        .get(91..91 + name_len)
        .map(|n| {
            String::from_utf8_lossy(n)
                .trim_end_matches('\0')
                .trim()
                .to_owned()
        })
        .filter(|n| !n.is_empty());
    Some(RedfishHostInterface {
        service_uuid,
        service_address: record_address(d[51], &d[52..68]),
        service_port: (port != 0).then_some(port),
        service_vlan_id: (vlan != 0).then_some(vlan),
        service_hostname,
        assignment: Some(assignment(d[50])),
        host_address: record_address(d[17], &d[18..34]),
    })
}

/// The Redfish host interfaces of an SMBIOS table (type 42, network interfaces with a Redfish
/// over IP record).
pub fn redfish_host_interfaces(data: &SMBiosData) -> Vec<RedfishHostInterface> {
    let mut out = Vec::new();
    for hi in data.defined_struct_iter::<SMBiosManagementControllerHostInterface<'_>>() {
        if hi.interface_type().map(|t| t.raw) != Some(HOSTIF_NETWORK) {
            continue;
        }
        for record in hi.protocol_record_iterator() {
            if record.protocol_type().map(|t| t.raw) != Some(PROTOCOL_REDFISH_OVER_IP) {
                continue;
            }
            if let Some(r) = record
                .protocol_type_specific_data()
                .and_then(parse_redfish_over_ip)
            {
                out.push(r);
            }
        }
    }
    out
}

/// The BMC section: in-band IPMI on a live root (a fixture tree has no `/dev/ipmi0`), plus the
/// type 42 interfaces the SMBIOS collector found. `None` when neither says anything.
pub fn collect(
    root: &HostRoot,
    host_interfaces: Vec<RedfishHostInterface>,
    notes: &mut Vec<Note>,
) -> Option<Bmc> {
    let mut bmc = Bmc {
        redfish_host_interfaces: host_interfaces,
        ..Bmc::default()
    };
    match Ipmi::open(root) {
        Ok(mut ipmi) => {
            if let Err(e) = read_ipmi(&mut ipmi, &mut bmc, notes) {
                note(notes, "bmc", format!("in-band IPMI: {e}"));
            }
        }
        // No BMC device is the common case off bare metal: a note, quietly.
        Err(e) => note(notes, "bmc", format!("in-band IPMI: {e}")),
    }
    (!bmc.is_empty()).then_some(bmc)
}

#[cfg(test)]
#[path = "bmc_tests.rs"]
mod tests;
