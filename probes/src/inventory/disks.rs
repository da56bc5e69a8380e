//! Block devices from `/sys/block` (kernel ABI `sysfs-block`), and NVMe namespaces from
//! `/sys/class/nvme` that `/sys/block` does not list (fixture trees). Identity (serial, WWN,
//! model, vendor, firmware revision), sector sizes and removability are read here; names,
//! HCTL, partitions and holders in [`super::blockdev`]; NVMe health in [`super::nvme`], SATA and
//! SAS health in [`super::ata_smart`].
//!
//! Which entries are disks is [`super::disk_rule`]'s decision (the one rule the ramdisk's
//! cleaner applies too); the devices it leaves out are counted in one note. With NVMe native
//! multipath the kernel lists, beside each namespace head `nvmeXnY`, one hidden path device
//! `nvmeXcZnY` per controller: the rule leaves them out, so a disk is counted once.

use bc_protocol::inventory::{Disk, Note};

use super::{blockdev, disk_rule, note};
use crate::hostroot::HostRoot;

/// Every disk, sorted by name.
pub fn collect(root: &HostRoot, notes: &mut Vec<Note>) -> Vec<Disk> {
    let scan = match disk_rule::scan(root) {
        Ok(s) => s,
        Err(e) => {
            note(notes, "disks", format!("/sys/block: {e}"));
            disk_rule::Scan::default()
        }
    };
    if let Some(n) = scan.note() {
        note(notes, "disks", n);
    }
    let block_names: Vec<String> = scan
        .disks
        .iter()
        .chain(scan.left_out.iter().map(|(n, _)| n))
        .cloned()
        .collect();
    let udev = blockdev::DevDiskNames::read(root);
    let mut disks: Vec<Disk> = scan
        .disks
        .into_iter()
        .map(|name| block_disk(root, name, &udev))
        .collect();
    for ctrl in root.list_dir("/sys/class/nvme").unwrap_or_default() {
        let base = format!("/sys/class/nvme/{ctrl}");
        for ns in root.list_dir(&base).unwrap_or_default() {
            if !ns.starts_with("nvme")
                || block_names.contains(&ns)
                || disk_rule::classify(root, &ns, &format!("{base}/{ns}"), &block_names).is_some()
            {
                continue;
            }
            let Some(sectors) = root.read_parsed::<u64>(format!("{base}/{ns}/size")) else {
                continue;
            };
            let ns_dir = format!("{base}/{ns}");
            let partitions = blockdev::partitions(root, &ns_dir);
            disks.push(Disk {
                size_bytes: sectors.saturating_mul(512),
                model: root.read_trimmed(format!("{base}/model")),
                serial: root.read_trimmed(format!("{base}/serial")),
                wwn: root.read_trimmed(format!("{ns_dir}/wwid")),
                rotational: Some(false),
                transport: Some("nvme".into()),
                nvme: true,
                firmware: root.read_trimmed(format!("{base}/firmware_rev")),
                by_path: udev.by_path(&ns),
                by_id: udev.by_id(&ns),
                logical_sector_bytes: root
                    .read_parsed(format!("{ns_dir}/queue/logical_block_size")),
                physical_sector_bytes: root
                    .read_parsed(format!("{ns_dir}/queue/physical_block_size")),
                removable: root
                    .read_trimmed(format!("{ns_dir}/removable"))
                    .map(|v| v == "1"),
                holders: blockdev::holders(root, &ns_dir, &partitions),
                partitions,
                name: ns,
                ..Disk::default()
            });
        }
    }
    disks.sort_by(|a, b| a.name.cmp(&b.name));
    super::nvme::fill_health(root, &mut disks, notes);
    super::ata_smart::fill_health(root, &mut disks, notes);
    disks
}

fn block_disk(root: &HostRoot, name: String, udev: &blockdev::DevDiskNames) -> Disk {
    let base = format!("/sys/block/{name}");
    let nvme = name.starts_with("nvme");
    let size_bytes = root
        .read_parsed::<u64>(format!("{base}/size"))
        .unwrap_or(0)
        .saturating_mul(512);
    let serial = serial(root, &base);
    let wwn = root
        .read_trimmed(format!("{base}/wwid"))
        .or_else(|| root.read_trimmed(format!("{base}/device/wwid")))
        .or_else(|| {
            let page = root.read(format!("{base}/device/vpd_pg83")).ok()?;
            super::vpd::device_id(&page)
        });
    let partitions = blockdev::partitions(root, &base);
    Disk {
        size_bytes,
        model: root.read_trimmed(format!("{base}/device/model")),
        serial,
        wwn_vendor_extension: wwn.as_deref().and_then(blockdev::wwn_vendor_extension),
        wwn,
        rotational: root
            .read_trimmed(format!("{base}/queue/rotational"))
            .map(|v| v == "1"),
        transport: transport(root, &base, nvme),
        nvme,
        // SCSI INQUIRY fields; an NVMe controller has neither `vendor` nor `rev`.
        vendor: (!nvme)
            .then(|| root.read_trimmed(format!("{base}/device/vendor")))
            .flatten(),
        firmware: root
            .read_trimmed(format!("{base}/device/rev"))
            .or_else(|| root.read_trimmed(format!("{base}/device/firmware_rev"))),
        hctl: (!nvme).then(|| blockdev::hctl(root, &base)).flatten(),
        by_path: udev.by_path(&name),
        by_id: udev.by_id(&name),
        logical_sector_bytes: root.read_parsed(format!("{base}/queue/logical_block_size")),
        physical_sector_bytes: root.read_parsed(format!("{base}/queue/physical_block_size")),
        removable: root
            .read_trimmed(format!("{base}/removable"))
            .map(|v| v == "1"),
        holders: blockdev::holders(root, &base, &partitions),
        partitions,
        name,
        // Filled afterwards, one read per NVMe controller (`super::nvme::fill_health`).
        health: None,
    }
}

/// The serial number of the disk at `base` (`/sys/block/sda`): NVMe, the controller's
/// `device/serial`; virtio-blk, the disk's own `serial` (the VIRTIO_BLK_T_GET_ID string); SCSI,
/// the unit serial number of VPD page 0x80 (`device/vpd_pg80`).
pub fn serial(root: &HostRoot, base: &str) -> Option<String> {
    root.read_trimmed(format!("{base}/device/serial"))
        .or_else(|| root.read_trimmed(format!("{base}/serial")))
        .or_else(|| vpd_serial(root, base))
}

/// The unit serial number of SCSI VPD page 0x80 (its page length honoured, see [`super::vpd`]).
fn vpd_serial(root: &HostRoot, base: &str) -> Option<String> {
    let b = root.read(format!("{base}/device/vpd_pg80")).ok()?;
    super::vpd::unit_serial(&b)
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
