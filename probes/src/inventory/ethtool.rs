//! The permanent MAC through the ETHTOOL_GPERMADDR ioctl (`linux/ethtool.h`,
//! `struct ethtool_perm_addr`), on a live root only.
//!
//! This is the only module of the crate with `unsafe`: one ioctl on a socket, through nix's
//! `ioctl_readwrite_bad!`. A NIC whose driver does not know a permanent address answers all
//! zeros, which is treated as "unknown".

use std::os::fd::AsRawFd;

use nix::sys::socket::{AddressFamily, SockFlag, SockType, socket};

use crate::hostroot::HostRoot;

/// `SIOCETHTOOL` (`linux/sockios.h`).
const SIOCETHTOOL: u32 = 0x8946;
/// `ETHTOOL_GPERMADDR` (`linux/ethtool.h`).
const ETHTOOL_GPERMADDR: u32 = 0x20;
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

/// `struct ifreq` with the `ifr_data` member of its union; padded past the union's 24 bytes.
#[repr(C)]
struct IfReq {
    name: [u8; IFNAMSIZ],
    data: *mut EthtoolPermAddr,
    pad: [u8; 24],
}

nix::ioctl_readwrite_bad!(siocethtool, SIOCETHTOOL, IfReq);

/// The permanent MAC of `iface`, lowercase `aa:bb:...`, on a live root; `None` under any other
/// root, for a name too long, when the ioctl fails, or when the driver reports zeros.
pub fn permanent_mac(root: &HostRoot, iface: &str) -> Option<String> {
    if !root.is_live() || iface.is_empty() || iface.len() >= IFNAMSIZ || iface.contains('\0') {
        return None;
    }
    let sock = socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .ok()?;
    let mut perm = EthtoolPermAddr {
        cmd: ETHTOOL_GPERMADDR,
        size: MAX_ADDR_LEN as u32,
        data: [0; MAX_ADDR_LEN],
    };
    let mut req = IfReq {
        name: [0; IFNAMSIZ],
        data: &mut perm,
        pad: [0; 24],
    };
    req.name[..iface.len()].copy_from_slice(iface.as_bytes());
    // SAFETY: `sock` is an open socket for the whole call; `req` is a valid, NUL-terminated
    // `struct ifreq` (name shorter than IFNAMSIZ, zero-filled) whose `ifr_data` points to `perm`,
    // a live `struct ethtool_perm_addr` with `size` bytes of room that the kernel writes at most.
    // Both outlive the call, and nothing else aliases them meanwhile.
    let res = unsafe { siocethtool(sock.as_raw_fd(), &mut req) };
    res.ok()?;
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

#[cfg(test)]
mod tests {
    use super::*;

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
