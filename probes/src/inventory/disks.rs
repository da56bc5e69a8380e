//! Block devices from `/sys/block` (kernel ABI `sysfs-block`), and NVMe namespaces from
//! `/sys/class/nvme` that `/sys/block` does not list (fixture trees).

use bc_protocol::inventory::{Disk, Note};

use super::note;
use crate::hostroot::HostRoot;

/// Prefixes of block devices that are not disks: loop, RAM, zram, device-mapper, md RAID, nbd,
/// optical, floppy.
const NOT_DISKS: &[&str] = &["loop", "ram", "zram", "dm-", "md", "nbd", "sr", "fd"];

/// Every disk, sorted by name.
pub fn collect(root: &HostRoot, notes: &mut Vec<Note>) -> Vec<Disk> {
    let names = match root.list_dir("/sys/block") {
        Ok(n) => n,
        Err(e) => {
            note(notes, "disks", format!("/sys/block: {e}"));
            Vec::new()
        }
    };
    let mut disks: Vec<Disk> = names
        .into_iter()
        .filter(|n| !NOT_DISKS.iter().any(|p| n.starts_with(p)))
        .map(|name| block_disk(root, name))
        .collect();
    for ctrl in root.list_dir("/sys/class/nvme").unwrap_or_default() {
        let base = format!("/sys/class/nvme/{ctrl}");
        for ns in root.list_dir(&base).unwrap_or_default() {
            if !ns.starts_with("nvme") || disks.iter().any(|d| d.name == ns) {
                continue;
            }
            let Some(sectors) = root.read_parsed::<u64>(format!("{base}/{ns}/size")) else {
                continue;
            };
            disks.push(Disk {
                size_bytes: sectors.saturating_mul(512),
                model: root.read_trimmed(format!("{base}/model")),
                serial: root.read_trimmed(format!("{base}/serial")),
                wwn: root.read_trimmed(format!("{base}/{ns}/wwid")),
                rotational: Some(false),
                transport: Some("nvme".into()),
                nvme: true,
                name: ns,
            });
        }
    }
    disks.sort_by(|a, b| a.name.cmp(&b.name));
    disks
}

fn block_disk(root: &HostRoot, name: String) -> Disk {
    let base = format!("/sys/block/{name}");
    let nvme = name.starts_with("nvme");
    let size_bytes = root
        .read_parsed::<u64>(format!("{base}/size"))
        .unwrap_or(0)
        .saturating_mul(512);
    let serial = root
        .read_trimmed(format!("{base}/device/serial"))
        .or_else(|| vpd_serial(root, &base));
    let wwn = root
        .read_trimmed(format!("{base}/wwid"))
        .or_else(|| root.read_trimmed(format!("{base}/device/wwid")));
    Disk {
        size_bytes,
        model: root.read_trimmed(format!("{base}/device/model")),
        serial,
        wwn,
        rotational: root
            .read_trimmed(format!("{base}/queue/rotational"))
            .map(|v| v == "1"),
        transport: transport(root, &base, nvme),
        nvme,
        name,
    }
}

/// The unit serial number of SCSI VPD page 0x80 (4-byte header, then ASCII).
fn vpd_serial(root: &HostRoot, base: &str) -> Option<String> {
    let b = root.read(format!("{base}/device/vpd_pg80")).ok()?;
    let s = String::from_utf8_lossy(b.get(4..)?).trim().to_owned();
    (!s.is_empty()).then_some(s)
}

/// The bus a disk hangs off, from the path its `/sys/block` link points to.
fn transport(root: &HostRoot, base: &str, nvme: bool) -> Option<String> {
    if nvme {
        return Some("nvme".into());
    }
    let target = root.read_link(base)?.to_string_lossy().into_owned();
    let t = if target.contains("/usb") {
        "usb"
    } else if target.contains("/virtio") {
        "virtio"
    } else if target.contains("/ata") {
        "sata"
    } else if root.exists(format!("{base}/device/sas_address")) {
        "sas"
    } else if target.contains("/host") {
        "scsi"
    } else {
        return None;
    };
    Some(t.into())
}
