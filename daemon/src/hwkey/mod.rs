//! The machine's hardware key (DESIGN.md "Hardware key"): SHA-256 over the sorted `kind:value`
//! lines of the normalized identifiers that survive; trusted with at least two.

use bc_protocol::pb::HardwareIdentity;
use sha2::{Digest, Sha256};

use crate::hostroot::HostRoot;

/// Computes the hardware identity from `/sys/class/dmi/id` and the physical NICs' MACs.
pub fn compute(root: &HostRoot) -> HardwareIdentity {
    let mut lines = Vec::new();
    for (kind, file) in [
        ("system-uuid", "product_uuid"),
        ("system-serial", "product_serial"),
        ("baseboard-serial", "board_serial"),
        ("chassis-serial", "chassis_serial"),
    ] {
        if let Some(v) = root.read_trimmed(format!("/sys/class/dmi/id/{file}")) {
            let v = v.to_ascii_lowercase();
            if !v.is_empty() && v.chars().any(|c| c != '0' && c != '-') {
                lines.push(format!("{kind}:{v}"));
            }
        }
    }
    for nic in crate::inventory::collect(root).nics {
        if let (true, Some(mac)) = (nic.physical, nic.mac) {
            lines.push(format!("mac:{mac}"));
        }
    }
    lines.sort();
    lines.dedup();
    identity_from_lines(&lines)
}

fn identity_from_lines(lines: &[String]) -> HardwareIdentity {
    if lines.is_empty() {
        return HardwareIdentity::default();
    }
    let mut h = Sha256::new();
    for l in lines {
        h.update(l.as_bytes());
        h.update(b"\n");
    }
    let mut digests: Vec<String> = lines
        .iter()
        .map(|l| hex::encode(Sha256::digest(l.as_bytes())))
        .collect();
    digests.sort();
    HardwareIdentity {
        hardware_key: hex::encode(h.finalize()),
        trusted: lines.len() >= 2,
        identifier_digests: digests,
    }
}
