//! The permanent MAC through ETHTOOL_GPERMADDR.
//!
//! Not implemented yet: the ioctl needs `unsafe`, and the crate forbids it. Bond members get their
//! permanent MAC from `bonding_slave/perm_hwaddr`, other NICs from `address` when
//! `addr_assign_type` is 0; a NIC whose MAC was changed by software and is not in a bond has no
//! permanent MAC and is not counted in the hardware key.

use crate::hostroot::HostRoot;

/// The permanent MAC of `_iface`, lowercase, on a live root only. Always `None` for now (see the
/// module docs).
pub fn permanent_mac(root: &HostRoot, _iface: &str) -> Option<String> {
    if !root.is_live() {
        return None;
    }
    None
}
