//! The LLDPDU parser: an Ethernet frame of EtherType 0x88CC into an [`LldpNeighbor`].
//!
//! An LLDPDU (IEEE 802.1AB-2016 clause 8.2) is a sequence of TLVs, each a 2-byte header — 7 bits
//! of type, 9 bits of length (clause 8.4, Figure 8-2) — and that many bytes of value. It starts
//! with Chassis ID (type 1), Port ID (2) and Time To Live (3), and ends with End Of LLDPDU (0)
//! or the end of the frame. Every length is checked against what is left before a byte is read:
//! junk gives an [`LldpParseError`], never a panic.

use std::net::{Ipv4Addr, Ipv6Addr};

use bc_protocol::inventory::LldpNeighbor;

/// LLDP's EtherType (IEEE 802.1AB clause 7.2; `ETH_P_LLDP` in `linux/if_ether.h`).
pub const ETH_P_LLDP: u16 = 0x88cc;
/// The IEEE 802.1Q customer VLAN tag's EtherType (`ETH_P_8021Q`), skipped when a frame keeps it.
const ETH_P_8021Q: u16 = 0x8100;
/// The IEEE 802.1 OUI of the organizationally specific TLVs of IEEE 802.1Q Annex D.
const OUI_IEEE_8021: [u8; 3] = [0x00, 0x80, 0xc2];
/// Subtype of the Port VLAN ID TLV under that OUI (IEEE 802.1Q-2018 D.2.1).
const SUBTYPE_PORT_VLAN_ID: u8 = 1;
/// IANA address family numbers, as the Management Address TLV and the network address subtypes
/// of Chassis ID and Port ID carry them.
const IANA_IPV4: u8 = 1;
const IANA_IPV6: u8 = 2;

/// TLV types of IEEE 802.1AB-2016 Table 8-1.
mod tlv {
    pub const END: u8 = 0;
    pub const CHASSIS_ID: u8 = 1;
    pub const PORT_ID: u8 = 2;
    pub const TTL: u8 = 3;
    pub const PORT_DESCRIPTION: u8 = 4;
    pub const SYSTEM_NAME: u8 = 5;
    pub const SYSTEM_DESCRIPTION: u8 = 6;
    pub const MANAGEMENT_ADDRESS: u8 = 8;
    pub const ORG_SPECIFIC: u8 = 127;
}

/// Why a frame is not a usable LLDPDU.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LldpParseError {
    /// Shorter than an Ethernet header (14 bytes, 18 with a VLAN tag).
    #[error("frame of {len} bytes is shorter than its Ethernet header")]
    ShortFrame {
        /// The frame's length, bytes.
        len: usize,
    },
    /// The EtherType is not LLDP's 0x88CC.
    #[error("EtherType {ethertype:#06x} is not LLDP (0x88cc)")]
    NotLldp {
        /// The frame's EtherType.
        ethertype: u16,
    },
    /// A TLV says it is longer than what is left of the frame.
    #[error("TLV type {tlv_type} at offset {offset} claims {claimed} bytes, {left} left")]
    Truncated {
        /// The TLV's type.
        tlv_type: u8,
        /// Where its header starts in the LLDPDU, bytes.
        offset: usize,
        /// The length its header gives.
        claimed: usize,
        /// Bytes left after the header.
        left: usize,
    },
    /// A mandatory TLV (Chassis ID, Port ID, TTL) is missing or too short to hold a value.
    #[error("LLDPDU has no usable {0} TLV")]
    Missing(&'static str),
}

/// The LLDPDU in `frame`, a whole Ethernet frame as a packet socket of type `SOCK_RAW` gives it
/// (destination, source, EtherType, payload; a kept 802.1Q tag is skipped).
pub fn parse_frame(frame: &[u8]) -> Result<LldpNeighbor, LldpParseError> {
    let short = || LldpParseError::ShortFrame { len: frame.len() };
    let ethertype = |at: usize| {
        frame
            .get(at..at + 2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]))
    };
    let mut at = 12;
    let mut ty = ethertype(at).ok_or_else(short)?;
    if ty == ETH_P_8021Q {
        at += 4;
        ty = ethertype(at).ok_or_else(short)?;
    }
    if ty != ETH_P_LLDP {
        return Err(LldpParseError::NotLldp { ethertype: ty });
    }
    parse_lldpdu(frame.get(at + 2..).unwrap_or_default())
}

/// The neighbour an LLDPDU (the frame's payload) describes.
pub fn parse_lldpdu(pdu: &[u8]) -> Result<LldpNeighbor, LldpParseError> {
    let mut n = LldpNeighbor::default();
    let (mut chassis, mut port, mut ttl) = (false, false, false);
    let mut at = 0;
    while let Some(head) = pdu.get(at..at + 2) {
        let tlv_type = head[0] >> 1;
        let len = (usize::from(head[0] & 1) << 8) | usize::from(head[1]);
        let left = pdu.len() - at - 2;
        let value = pdu
            .get(at + 2..at + 2 + len)
            .ok_or(LldpParseError::Truncated {
                tlv_type,
                offset: at,
                claimed: len,
                left,
            })?;
        at += 2 + len;
        match tlv_type {
            tlv::END => break,
            tlv::CHASSIS_ID if !chassis => {
                if let Some((&sub, id)) = value.split_first().filter(|(_, id)| !id.is_empty()) {
                    n.chassis_id = id_text(id, sub == 4, sub == 5);
                    n.chassis_id_subtype = chassis_subtype(sub);
                    chassis = true;
                }
            }
            tlv::PORT_ID if !port => {
                if let Some((&sub, id)) = value.split_first().filter(|(_, id)| !id.is_empty()) {
                    n.port_id = id_text(id, sub == 3, sub == 4);
                    n.port_id_subtype = port_subtype(sub);
                    port = true;
                }
            }
            tlv::TTL if !ttl => {
                if let Some(b) = value.get(..2) {
                    n.ttl_seconds = u16::from_be_bytes([b[0], b[1]]);
                    ttl = true;
                }
            }
            tlv::PORT_DESCRIPTION => n.port_description = text(value),
            tlv::SYSTEM_NAME => n.system_name = text(value),
            tlv::SYSTEM_DESCRIPTION => n.system_description = text(value),
            tlv::MANAGEMENT_ADDRESS => n.management_addresses.extend(management_address(value)),
            tlv::ORG_SPECIFIC => {
                if let Some(vid) = port_vlan_id(value) {
                    n.vlan_id = Some(vid);
                }
            }
            _ => {}
        }
    }
    if !chassis {
        return Err(LldpParseError::Missing("Chassis ID"));
    }
    if !port {
        return Err(LldpParseError::Missing("Port ID"));
    }
    if !ttl {
        return Err(LldpParseError::Missing("Time To Live"));
    }
    Ok(n)
}

/// Chassis ID subtype names (IEEE 802.1AB-2016 Table 8-2).
fn chassis_subtype(sub: u8) -> String {
    match sub {
        1 => "chassisComponent".into(),
        2 => "interfaceAlias".into(),
        3 => "portComponent".into(),
        4 => "macAddress".into(),
        5 => "networkAddress".into(),
        6 => "interfaceName".into(),
        7 => "local".into(),
        n => format!("reserved-{n}"),
    }
}

/// Port ID subtype names (IEEE 802.1AB-2016 Table 8-3).
fn port_subtype(sub: u8) -> String {
    match sub {
        1 => "interfaceAlias".into(),
        2 => "portComponent".into(),
        3 => "macAddress".into(),
        4 => "networkAddress".into(),
        5 => "interfaceName".into(),
        6 => "agentCircuitId".into(),
        7 => "local".into(),
        n => format!("reserved-{n}"),
    }
}

/// A Chassis ID or Port ID value: a 6-byte MAC as `aa:bb:..`, a network address (IANA family
/// byte, then the address) as an IP address, else printable UTF-8 as text, else lowercase hex.
fn id_text(id: &[u8], is_mac: bool, is_network: bool) -> String {
    if is_mac && id.len() == 6 {
        return mac(id);
    }
    if is_network && let Some(ip) = ip_address(id) {
        return ip;
    }
    text(id).unwrap_or_else(|| hex::encode(id))
}

/// `aa:bb:cc:dd:ee:ff`.
fn mac(b: &[u8]) -> String {
    b.iter()
        .map(|x| format!("{x:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// An IANA address family byte followed by an IPv4 (4 bytes) or IPv6 (16 bytes) address.
fn ip_address(b: &[u8]) -> Option<String> {
    match b.split_first()? {
        (&IANA_IPV4, a) => <[u8; 4]>::try_from(a)
            .ok()
            .map(|a| Ipv4Addr::from(a).to_string()),
        (&IANA_IPV6, a) => <[u8; 16]>::try_from(a)
            .ok()
            .map(|a| Ipv6Addr::from(a).to_string()),
        _ => None,
    }
}

/// A string TLV's value: valid UTF-8 without control characters, trimmed, non-empty. Switches
/// pad with NULs or end with a newline; those are dropped first.
fn text(b: &[u8]) -> Option<String> {
    let s = std::str::from_utf8(b).ok()?;
    let s = s.trim_matches(|c: char| c == '\0' || c.is_whitespace());
    (!s.is_empty() && !s.chars().any(char::is_control)).then(|| s.to_owned())
}

/// The address of a Management Address TLV (clause 8.5.9, Figure 8-11): its string length
/// (1 byte: the subtype byte plus the address, 2 to 32), the IANA address subtype, the address;
/// then interface numbering and an OID, which are not read. IPv4 and IPv6 only.
fn management_address(v: &[u8]) -> Option<String> {
    let (&len, rest) = v.split_first()?;
    let addr = rest.get(..usize::from(len))?;
    ip_address(addr)
}

/// The PVID of an IEEE 802.1 Port VLAN ID TLV (OUI 00-80-C2, subtype 1, then 2 bytes); `None`
/// for any other organizationally specific TLV and for PVID 0 (no VLAN).
fn port_vlan_id(v: &[u8]) -> Option<u16> {
    if v.get(..3)? != OUI_IEEE_8021 || *v.get(3)? != SUBTYPE_PORT_VLAN_ID {
        return None;
    }
    let b = v.get(4..6)?;
    Some(u16::from_be_bytes([b[0], b[1]])).filter(|vid| *vid != 0)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "parse_tests.rs"]
mod tests;
