//! Two `SIOCETHTOOL` requests (`linux/ethtool.h`), on a live root only: the permanent MAC
//! (ETHTOOL_GPERMADDR, `struct ethtool_perm_addr`) and the driver's name, version and firmware
//! version (ETHTOOL_GDRVINFO, `struct ethtool_drvinfo`).
//!
//! With [`super::nvme`] and [`super::ipmi`], the only `unsafe` of the crate: one ioctl on a socket, through nix's
//! `ioctl_readwrite_bad!`. A NIC whose driver does not know a permanent address answers all
//! zeros, which is treated as "unknown". The ioctl works on the calling process's network
//! namespace, not on a root prefix: under any root but `/` nothing is asked.

use std::os::fd::AsRawFd;

use nix::sys::socket::{AddressFamily, SockFlag, SockType, socket};

use crate::hostroot::HostRoot;

/// `SIOCETHTOOL` (`linux/sockios.h`).
const SIOCETHTOOL: u32 = 0x8946;
/// `ETHTOOL_GPERMADDR` (`linux/ethtool.h`).
const ETHTOOL_GPERMADDR: u32 = 0x20;
/// `ETHTOOL_GDRVINFO` (`linux/ethtool.h`).
const ETHTOOL_GDRVINFO: u32 = 0x03;
/// Length of each string of `struct ethtool_drvinfo` but `reserved2` (`ETHTOOL_FWVERS_LEN`,
/// `ETHTOOL_BUSINFO_LEN`, `ETHTOOL_EROMVERS_LEN` and the literal 32 of `driver`, `version`).
const DRVINFO_STR: usize = 32;
/// `MAX_ADDR_LEN` (`linux/netdevice.h`): room for any link-layer address.
const MAX_ADDR_LEN: usize = 32;
/// `IFNAMSIZ` (`linux/if.h`), terminating NUL included.
const IFNAMSIZ: usize = 16;

/// `struct ethtool_perm_addr` with its flexible array sized to `MAX_ADDR_LEN`.
#[repr(C)]
struct EthtoolPermAddr {
    cmd: u32,
    size: u32,
    data: [u8; MAX_ADDR_LEN],
}

/// `struct ethtool_drvinfo` (196 bytes). The strings are NUL-terminated when shorter than 32
/// (the kernel fills them with `strscpy`).
#[repr(C)]
#[derive(Debug, Clone)]
pub struct EthtoolDrvinfo {
    pub cmd: u32,
    pub driver: [u8; DRVINFO_STR],
    pub version: [u8; DRVINFO_STR],
    pub fw_version: [u8; DRVINFO_STR],
    pub bus_info: [u8; DRVINFO_STR],
    pub erom_version: [u8; DRVINFO_STR],
    pub reserved2: [u8; 12],
    pub n_priv_flags: u32,
    pub n_stats: u32,
    pub testinfo_len: u32,
    pub eedump_len: u32,
    pub regdump_len: u32,
}

impl Default for EthtoolDrvinfo {
    fn default() -> Self {
        Self {
            cmd: ETHTOOL_GDRVINFO,
            driver: [0; DRVINFO_STR],
            version: [0; DRVINFO_STR],
            fw_version: [0; DRVINFO_STR],
            bus_info: [0; DRVINFO_STR],
            erom_version: [0; DRVINFO_STR],
            reserved2: [0; 12],
            n_priv_flags: 0,
            n_stats: 0,
            testinfo_len: 0,
            eedump_len: 0,
            regdump_len: 0,
        }
    }
}

/// What ETHTOOL_GDRVINFO says of a NIC, the empty strings and `N/A` dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriverInfo {
    /// `driver`: the driver's name (`virtio_net`, `mlx5_core`).
    pub driver: Option<String>,
    /// `version`: the driver's version; in-tree drivers leave the kernel's release there.
    pub version: Option<String>,
    /// `fw_version`: the device's firmware (`16.35.2000 (MT_0000000012)` for a ConnectX).
    pub firmware: Option<String>,
    /// `bus_info`: the device's bus address (`0000:03:00.0`; a virtio NIC names its PCI function).
    pub bus_info: Option<String>,
}

impl DriverInfo {
    /// The strings of an answered `struct ethtool_drvinfo`.
    pub fn parse(raw: &EthtoolDrvinfo) -> Self {
        Self {
            driver: c_string(&raw.driver),
            version: c_string(&raw.version),
            firmware: c_string(&raw.fw_version),
            bus_info: c_string(&raw.bus_info),
        }
    }
}

/// A fixed-size C string: up to its first NUL (or all of it), trimmed; `None` when empty or
/// `N/A` (what several drivers write for "no firmware version").
fn c_string(b: &[u8]) -> Option<String> {
    let end = b.iter().position(|c| *c == 0).unwrap_or(b.len());
    let s = String::from_utf8_lossy(&b[..end]).trim().to_owned();
    (!s.is_empty() && s != "N/A").then_some(s)
}

/// `struct ifreq` with the `ifr_data` member of its union; padded past the union's 24 bytes.
#[repr(C)]
struct IfReq {
    name: [u8; IFNAMSIZ],
    data: *mut u8,
    pad: [u8; 24],
}

nix::ioctl_readwrite_bad!(siocethtool, SIOCETHTOOL, IfReq);

/// Sends ETHTOOL request `data` (a `struct ethtool_*` starting with its `cmd`) for `iface` on a
/// live root; `false` under any other root, for a name too long, or when the ioctl fails.
fn ethtool<T>(root: &HostRoot, iface: &str, data: &mut T) -> bool {
    if !root.is_live() || iface.is_empty() || iface.len() >= IFNAMSIZ || iface.contains('\0') {
        return false;
    }
    let Ok(sock) = socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    ) else {
        return false;
    };
    let mut req = IfReq {
        name: [0; IFNAMSIZ],
        data: std::ptr::from_mut(data).cast::<u8>(),
        pad: [0; 24],
    };
    req.name[..iface.len()].copy_from_slice(iface.as_bytes());
    // SAFETY: `sock` is an open socket for the whole call; `req` is a valid, NUL-terminated
    // `struct ifreq` (name shorter than IFNAMSIZ, zero-filled) whose `ifr_data` points to `data`,
    // one of this module's `repr(C)` copies of a `struct ethtool_*` whose `cmd` names it (both
    // callers below), with all the room the kernel writes for that command. Both outlive the
    // call, and nothing else aliases them meanwhile.
    let res = unsafe { siocethtool(sock.as_raw_fd(), &mut req) };
    res.is_ok()
}

/// The permanent MAC of `iface`, lowercase `aa:bb:...`, on a live root; `None` under any other
/// root, for a name too long, when the ioctl fails, or when the driver reports zeros.
pub fn permanent_mac(root: &HostRoot, iface: &str) -> Option<String> {
    let mut perm = EthtoolPermAddr {
        cmd: ETHTOOL_GPERMADDR,
        size: MAX_ADDR_LEN as u32,
        data: [0; MAX_ADDR_LEN],
    };
    if !ethtool(root, iface, &mut perm) {
        return None;
    }
    let n = (perm.size as usize).min(MAX_ADDR_LEN);
    let bytes = &perm.data[..n];
    if n == 0 || bytes.iter().all(|b| *b == 0) {
        return None;
    }
    Some(
        bytes
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(":"),
    )
}

/// Driver name, version and firmware version of `iface` (ETHTOOL_GDRVINFO), on a live root;
/// `None` where [`permanent_mac`] would be, or when the driver has no ethtool support.
pub fn driver_info(root: &HostRoot, iface: &str) -> Option<DriverInfo> {
    let mut info = EthtoolDrvinfo::default();
    ethtool(root, iface, &mut info).then(|| DriverInfo::parse(&info))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 32-byte C string field holding `s`.
    fn field(s: &[u8]) -> [u8; DRVINFO_STR] {
        let mut f = [0; DRVINFO_STR];
        f[..s.len()].copy_from_slice(s);
        f
    }

    #[test]
    fn drvinfo_is_the_kernels_196_bytes_and_parses() {
        assert_eq!(
            std::mem::size_of::<EthtoolDrvinfo>(),
            196,
            "linux/ethtool.h"
        );
        // As mlx5_core fills it: firmware with its PSID, padding after the NULs ignored.
        let mut raw = EthtoolDrvinfo {
            driver: field(b"mlx5_core"),
            version: field(b"6.1.0-57-amd64"),
            fw_version: field(b"16.35.2000 (MT_0000000012)"),
            bus_info: field(b"0000:03:00.0"),
            ..EthtoolDrvinfo::default()
        };
        raw.driver[20] = b'x';
        assert_eq!(
            DriverInfo::parse(&raw),
            DriverInfo {
                driver: Some("mlx5_core".into()),
                version: Some("6.1.0-57-amd64".into()),
                firmware: Some("16.35.2000 (MT_0000000012)".into()),
                bus_info: Some("0000:03:00.0".into()),
            }
        );
        // virtio_net: no firmware; a driver writing "N/A"; a full 32-byte field without NUL.
        let raw = EthtoolDrvinfo {
            driver: field(b"virtio_net"),
            version: field(b"1.0.0"),
            fw_version: field(b"N/A"),
            bus_info: [b'a'; DRVINFO_STR],
            ..EthtoolDrvinfo::default()
        };
        let info = DriverInfo::parse(&raw);
        assert_eq!(info.driver.as_deref(), Some("virtio_net"));
        assert_eq!(info.firmware, None);
        assert_eq!(info.bus_info.map(|b| b.len()), Some(DRVINFO_STR));
    }

    #[test]
    fn drvinfo_only_on_a_live_root() {
        assert_eq!(driver_info(&HostRoot::new("/tmp"), "lo"), None);
        assert_eq!(driver_info(&HostRoot::default(), "bcd-no-such0"), None);
        // Every interface with a device has a driver that answers with its name.
        let live = HostRoot::default();
        for name in live.list_dir("/sys/class/net").unwrap_or_default() {
            let Some(sysfs) = live.read_link_name(format!("/sys/class/net/{name}/device/driver"))
            else {
                continue;
            };
            let info = driver_info(&live, &name);
            println!("{name}: {info:?}");
            assert!(info.is_some_and(|i| i.driver.is_some()), "{name} ({sysfs})");
        }
    }

    #[test]
    fn only_on_a_live_root_and_only_for_real_names() {
        assert_eq!(permanent_mac(&HostRoot::new("/tmp"), "eth0"), None);
        let live = HostRoot::default();
        assert_eq!(permanent_mac(&live, ""), None);
        assert_eq!(permanent_mac(&live, "a-name-far-too-long"), None);
        assert_eq!(permanent_mac(&live, "bcd-no-such0"), None);
        assert_eq!(
            permanent_mac(&live, "lo"),
            None,
            "loopback has no permanent MAC"
        );
    }

    #[test]
    fn agrees_with_sysfs_for_nics_whose_address_is_permanent() {
        let live = HostRoot::default();
        for name in live.list_dir("/sys/class/net").unwrap_or_default() {
            let base = format!("/sys/class/net/{name}");
            if live
                .read_trimmed(format!("{base}/addr_assign_type"))
                .as_deref()
                != Some("0")
                || !live.exists(format!("{base}/device"))
            {
                continue;
            }
            if let Some(p) = permanent_mac(&live, &name) {
                assert_eq!(
                    Some(p),
                    live.read_trimmed(format!("{base}/address")),
                    "{name}"
                );
            }
        }
    }
}
