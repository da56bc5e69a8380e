//! Block devices from `/sys/block` (kernel ABI `sysfs-block`), and NVMe namespaces from
//! `/sys/class/nvme` that `/sys/block` does not list (fixture trees). Identity (serial, WWN,
//! model, vendor, firmware revision), sector sizes and removability are read here; names,
//! HCTL, partitions and holders in [`super::blockdev`]; NVMe health in [`super::nvme`], SATA and
//! SAS health in [`super::ata_smart`].
//!
//! With NVMe native multipath the kernel lists, beside each namespace head `nvmeXnY`, one path
//! device `nvmeXcZnY` per controller; those are hidden (`hidden` is 1, kernel ABI
//! `sysfs-block`: "the block device is hidden ... e.g. NVMe multipath path devices") and are the
//! same namespace again. Every way in skips them ([`is_path_device`]), so a disk is counted once.

use bc_protocol::inventory::{Disk, Note};

use super::{blockdev, note};
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
    let udev = blockdev::DevDiskNames::read(root);
    let mut disks: Vec<Disk> = names
        .into_iter()
        .filter(|n| !NOT_DISKS.iter().any(|p| n.starts_with(p)))
        .filter(|n| !is_path_device(root, n, &format!("/sys/block/{n}")))
        .map(|name| block_disk(root, name, &udev))
        .collect();
    for ctrl in root.list_dir("/sys/class/nvme").unwrap_or_default() {
        let base = format!("/sys/class/nvme/{ctrl}");
        for ns in root.list_dir(&base).unwrap_or_default() {
            if !ns.starts_with("nvme")
                || disks.iter().any(|d| d.name == ns)
                || is_path_device(root, &ns, &format!("{base}/{ns}"))
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

/// True for a block device that is another view of a disk listed elsewhere: an NVMe multipath
/// path device, by its name (`nvme<subsys>c<ctrl>n<ns>`, the kernel's naming in
/// `nvme_mpath_set_disk_name`) or by its `hidden` attribute at `dir` being 1 (any hidden device).
pub fn is_path_device(root: &HostRoot, name: &str, dir: &str) -> bool {
    is_nvme_path_name(name) || root.read_trimmed(format!("{dir}/hidden")).as_deref() == Some("1")
}

/// `nvme0c1n2`: `nvme`, digits, `c`, digits, `n`, digits.
fn is_nvme_path_name(name: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    name.strip_prefix("nvme")
        .and_then(|r| r.split_once('c'))
        .and_then(|(subsys, r)| r.split_once('n').map(|(ctrl, ns)| (subsys, ctrl, ns)))
        .is_some_and(|(subsys, ctrl, ns)| digits(subsys) && digits(ctrl) && digits(ns))
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
