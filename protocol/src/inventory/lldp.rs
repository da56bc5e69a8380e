//! A NIC's LLDP neighbours (issue 20.2): what the switch port at the other end of the cable
//! says of itself in its LLDPDUs (IEEE 802.1AB-2016, clause 8), read by `bcd-probes` from a raw
//! `AF_PACKET` socket. Operators use them to find which switch port a machine is cabled to.

use serde::{Deserialize, Serialize};

/// One LLDP agent heard on a link: the fields of its last LLDPDU. Neighbours of one link are
/// told apart by their chassis id and port id (802.1AB's MSAP identifier, clause 6.5.1).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LldpNeighbor {
    /// Chassis ID TLV (type 1, clause 8.5.2): the sender's chassis. A MAC address (subtype 4) is
    /// written `aa:bb:cc:dd:ee:ff`; a network address (subtype 5) as an IPv4 or IPv6 address;
    /// an interface alias, interface name or locally assigned id (subtypes 2, 6, 7) as text when
    /// it is printable UTF-8; anything else as lowercase hex.
    pub chassis_id: String,
    /// How `chassisId` is to be read (Table 8-2): `chassisComponent` (1), `interfaceAlias` (2),
    /// `portComponent` (3), `macAddress` (4), `networkAddress` (5), `interfaceName` (6),
    /// `local` (7), or `reserved-<n>` for a value the standard does not assign.
    pub chassis_id_subtype: String,
    /// Port ID TLV (type 2, clause 8.5.3): the sender's port, written as `chassisId` is.
    pub port_id: String,
    /// How `portId` is to be read (Table 8-3): `interfaceAlias` (1), `portComponent` (2),
    /// `macAddress` (3), `networkAddress` (4), `interfaceName` (5), `agentCircuitId` (6),
    /// `local` (7), or `reserved-<n>`.
    pub port_id_subtype: String,
    /// Port Description TLV (type 4, clause 8.5.5): the port's description as the switch's
    /// administrator set it (often the interface's `description`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_description: Option<String>,
    /// System Name TLV (type 5, clause 8.5.6): the sender's host name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_name: Option<String>,
    /// System Description TLV (type 6, clause 8.5.7): the sender's model and software.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_description: Option<String>,
    /// Every Management Address TLV (type 8, clause 8.5.9) with an IPv4 or IPv6 address
    /// (IANA address family 1 or 2), in the order sent; others (an 802 MAC, …) are left out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub management_addresses: Vec<String>,
    /// The port's VLAN id for untagged frames: the IEEE 802.1 organizationally specific Port
    /// VLAN ID TLV (type 127, OUI 00-80-C2, subtype 1; IEEE 802.1Q-2018 Annex D.2.1). Absent
    /// when not sent or 0 (the port is in no VLAN).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan_id: Option<u16>,
    /// Time To Live TLV (type 3, clause 8.5.4): seconds the sender's information stays valid
    /// from when it was received. 0 announces that the sender is going away.
    pub ttl_seconds: u16,
}
