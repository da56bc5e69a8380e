//! Network interfaces from `/sys/class/net` (kernel ABI `sysfs-class-net`), with the facts the
//! hardware key needs: physical or not, and the permanent MAC with where it came from; driver
//! and firmware versions from ETHTOOL_GDRVINFO ([`super::ethtool`]).

use bc_protocol::inventory::{Nic, Note};

use crate::hostroot::HostRoot;

/// Where a NIC's permanent MAC came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PermSource {
    /// `bonding_slave/perm_hwaddr`: a bond member, whose `address` is the bond's.
    BondingSlave,
    /// The ETHTOOL_GPERMADDR ioctl (live machine only).
    Ethtool,
    /// `address`, trusted because `addr_assign_type` is 0 (NET_ADDR_PERM).
    Address,
}

impl PermSource {
    /// Short name for reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BondingSlave => "bonding_slave/perm_hwaddr",
            Self::Ethtool => "ethtool",
            Self::Address => "address",
        }
    }
}

/// One interface as read, plus what the hardware key needs to judge it.
#[derive(Debug, Clone, PartialEq)]
pub struct NicProbe {
    pub nic: Nic,
    /// Where `nic.permanent_mac` came from, when set.
    pub perm_source: Option<PermSource>,
    /// `addr_assign_type` (0 permanent, 1 random, 2 stolen, 3 set by userspace).
    pub addr_assign_type: Option<u8>,
}

/// `ARPHRD_INFINIBAND` (`linux/if_arp.h`): the `type` of an IPoIB interface.
pub const ARPHRD_INFINIBAND: u16 = 32;

/// Bytes in a `:`-separated link-layer address (`address`, `perm_hwaddr`).
fn address_len(addr: &str) -> usize {
    addr.split(':').count()
}

/// The port GUID in an IPoIB hardware address (20 bytes: flags and queue pair number, then the
/// port's GID, whose last 8 bytes are the port GUID; RFC 4391 §9.1.1), written as sysfs writes
/// GUIDs (`node_guid`): `0002:c903:000f:abcd`.
pub fn ipoib_port_guid(addr: &str) -> Option<String> {
    let bytes: Vec<u8> = addr
        .split(':')
        .map(|b| u8::from_str_radix(b, 16).ok().filter(|_| b.len() == 2))
        .collect::<Option<_>>()?;
    let guid = bytes.get(12..20).filter(|_| bytes.len() == 20)?;
    Some(
        guid.chunks(2)
            .map(hex::encode)
            .collect::<Vec<_>>()
            .join(":"),
    )
}

/// A PCI address (`0000:03:00.0`).
pub fn is_pci_address(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && b.iter()
            .enumerate()
            .all(|(i, c)| matches!(i, 4 | 7 | 10) || c.is_ascii_hexdigit())
}

/// Reads every interface but `lo`. A missing `/sys/class/net` gives a note and no NICs.
pub fn probe(root: &HostRoot, notes: &mut Vec<Note>) -> Vec<NicProbe> {
    let names = match root.list_dir("/sys/class/net") {
        Ok(n) => n,
        Err(e) => {
            notes.push(Note {
                source: "nics".into(),
                message: format!("/sys/class/net: {e}"),
            });
            return Vec::new();
        }
    };
    let mut addrs = super::addrs::read(root);
    names
        .into_iter()
        .filter(|n| n != "lo" && n != "bonding_masters")
        .map(|name| probe_one(root, name, &mut addrs))
        .collect()
}

fn probe_one(root: &HostRoot, name: String, addrs: &mut super::addrs::Addresses) -> NicProbe {
    let base = format!("/sys/class/net/{name}");
    let class_link = root.read_link(&base);
    // A real device has a `device` link; fixture trees drop it, but their class link still
    // points under /sys/devices/<bus>, never /sys/devices/virtual.
    let physical = root.exists(format!("{base}/device"))
        || class_link.as_ref().is_some_and(|t| {
            let t = t.to_string_lossy();
            t.contains("devices/") && !t.contains("devices/virtual/")
        });
    let pci_address = root
        .read_link_name(format!("{base}/device"))
        .filter(|a| is_pci_address(a))
        .or_else(|| {
            class_link.as_ref().and_then(|t| {
                t.components()
                    .rev()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .find(|c| is_pci_address(c))
            })
        });
    // The PCI function itself: `device` is a virtio device for a virtio NIC (its `vendor` and
    // `device` are virtio ids), the function for a PCI NIC.
    let pci_dir = pci_address
        .as_ref()
        .map(|a| format!("/sys/bus/pci/devices/{a}"));
    let mac = root
        .read_trimmed(format!("{base}/address"))
        .map(|m| m.to_ascii_lowercase());
    let addr_assign_type = root.read_parsed::<u8>(format!("{base}/addr_assign_type"));
    let link_type = root.read_parsed::<u16>(format!("{base}/type"));
    let (permanent_mac, perm_source) =
        if let Some(p) = root.read_trimmed(format!("{base}/bonding_slave/perm_hwaddr")) {
            (Some(p.to_ascii_lowercase()), Some(PermSource::BondingSlave))
        } else if let Some(p) = physical
            .then(|| super::ethtool::permanent_mac(root, &name))
            .flatten()
        {
            (Some(p), Some(PermSource::Ethtool))
        } else if addr_assign_type == Some(0) {
            (mac.clone(), mac.as_ref().map(|_| PermSource::Address))
        } else {
            (None, None)
        };
    // Only a 48-bit Ethernet address is a MAC. An InfiniBand port's link-layer address is 20
    // bytes (4 of queue pair number, then its 16-byte GID) and is reported as the port GUID.
    let port_guid = permanent_mac
        .as_deref()
        .or(mac.as_deref())
        .and_then(ipoib_port_guid);
    let (permanent_mac, perm_source) = match permanent_mac {
        Some(p) if address_len(&p) == 6 && link_type != Some(ARPHRD_INFINIBAND) => {
            (Some(p), perm_source)
        }
        _ => (None, None),
    };
    // Physical NICs only: a host's veths and bridges can be hundreds, and have no firmware.
    let drvinfo = physical
        .then(|| super::ethtool::driver_info(root, &name))
        .flatten()
        .unwrap_or_default();
    // `speed`, `carrier` and `duplex` answer EINVAL while the interface is down (and `speed`
    // while there is no link): the read fails and the field stays absent.
    let speed_mbps = root
        .read_parsed::<i64>(format!("{base}/speed"))
        .filter(|s| *s > 0)
        .and_then(|s| u32::try_from(s).ok());
    NicProbe {
        nic: Nic {
            mac,
            permanent_mac,
            physical,
            driver: root
                .read_link_name(format!("{base}/device/driver"))
                .or(drvinfo.driver),
            driver_version: drvinfo.version,
            firmware_version: drvinfo.firmware,
            speed_mbps,
            link: root
                .read_trimmed(format!("{base}/carrier"))
                .map(|c| c == "1"),
            mtu: root.read_parsed(format!("{base}/mtu")),
            numa_node: root
                .read_parsed::<i32>(format!("{base}/device/numa_node"))
                .filter(|n| *n >= 0),
            pci_address,
            port_guid,
            duplex: root
                .read_trimmed(format!("{base}/duplex"))
                .filter(|d| d == "full" || d == "half"),
            pci_vendor_id: pci_dir
                .as_ref()
                .and_then(|d| super::pci::hex_id(root.read_trimmed(format!("{d}/vendor")))),
            pci_device_id: pci_dir
                .as_ref()
                .and_then(|d| super::pci::hex_id(root.read_trimmed(format!("{d}/device")))),
            sriov_total_vfs: pci_dir
                .as_ref()
                .and_then(|d| root.read_parsed(format!("{d}/sriov_totalvfs"))),
            sriov_num_vfs: pci_dir
                .as_ref()
                .and_then(|d| root.read_parsed(format!("{d}/sriov_numvfs"))),
            ipv4: addrs.ipv4.remove(&name).unwrap_or_default(),
            ipv6: addrs.ipv6.remove(&name).unwrap_or_default(),
            // Heard on the wire, not read here: [`super::lldp::attach`].
            lldp: Vec::new(),
            name,
        },
        perm_source,
        addr_assign_type,
    }
}
