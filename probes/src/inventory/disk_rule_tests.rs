//! Issue 32, item 1: what is a disk, on the field trees (`emmc-boot-partitions`,
//! `removed-disk-zero-size`, read in place) and on trees of the same kinds built here, with
//! names that say nothing (or the wrong thing) about what a device is.

use super::disk_rule::{self, NotADisk};
use super::field_tests::{Tree, field_root};
use super::*;

fn disk_names(inv: &Inventory) -> Vec<&str> {
    inv.disks.iter().map(|d| d.name.as_str()).collect()
}

fn disk_note(inv: &Inventory) -> Option<&str> {
    inv.notes
        .iter()
        .find(|n| n.source == "disks" && n.message.contains("left out"))
        .map(|n| n.message.as_str())
}

#[test]
fn an_emmcs_boot_partitions_are_not_disks() {
    let Some(root) = field_root("emmc-boot-partitions/root") else {
        return;
    };
    let inv = collect(&root);
    assert_eq!(disk_names(&inv), ["mmcblk0", "nvme0n1"]);
    let emmc = &inv.disks[0];
    assert_eq!(emmc.size_bytes, 122_142_720 * 512);
    assert_eq!(emmc.partitions, ["mmcblk0p1", "mmcblk0p2"]);
    assert_eq!(
        disk_note(&inv),
        Some(
            "2 block device(s) left out, not disks: 2 read-only hardware partition of mmcblk0: \
             mmcblk0boot0, mmcblk0boot1"
        )
    );
    let scan = disk_rule::scan(&root).unwrap_or_default();
    assert_eq!(scan.disks, ["mmcblk0", "nvme0n1"]);
    assert_eq!(
        scan.left_out[0],
        (
            "mmcblk0boot0".to_owned(),
            NotADisk::HardwarePartition {
                of: "mmcblk0".into(),
                read_only: true
            }
        )
    );
}

#[test]
fn a_removed_disk_listed_with_size_zero_is_not_a_disk() {
    let Some(root) = field_root("removed-disk-zero-size/root") else {
        return;
    };
    let inv = collect(&root);
    assert_eq!(disk_names(&inv), ["sda"]);
    assert_eq!(inv.disks[0].size_bytes, 104_857_600 * 512);
    assert_eq!(
        disk_note(&inv),
        Some(
            "1 block device(s) left out, not disks: 1 size 0 (removed but still listed, or no \
             capacity): sdb"
        )
    );
}

/// A block device of `kind` in the tree: its directory under `/sys/devices/...`, linked from
/// `/sys/block/<name>` with a relative link as the kernel makes it.
fn dev(t: &Tree, name: &str, dir: &str, sectors: u64) -> std::io::Result<()> {
    t.file(&format!("{dir}/size"), format!("{sectors}\n").as_bytes())?;
    let rel = format!("..{}", dir.trim_start_matches("/sys"));
    t.link(&format!("/sys/block/{name}"), &rel)
}

#[test]
fn the_rule_reads_properties_not_names() -> std::io::Result<()> {
    let t = Tree::new()?;
    // Disks whose names say otherwise: a SATA disk the firmware named like a RAM disk, an NVMe
    // namespace head (under /sys/devices/virtual, with a device link to its subsystem).
    let sata = "/sys/devices/pci0000:00/0000:00:17.0/ata1/host0/target0:0:0/0:0:0:0";
    dev(&t, "ram9", &format!("{sata}/block/ram9"), 4096)?;
    t.link(&format!("{sata}/block/ram9/device"), "../../../0:0:0:0")?;
    t.file(&format!("{sata}/type"), b"0\n")?;
    let subsys = "/sys/devices/virtual/nvme-subsystem/nvme-subsys0";
    dev(&t, "nvme0n1", &format!("{subsys}/nvme0n1"), 8192)?;
    t.link(&format!("{subsys}/nvme0n1/device"), "../../nvme-subsys0")?;
    // Virtual devices with names nobody listed: a ublk disk, a zoned test device, one called sdq.
    for n in ["ublkb0", "zloop0", "sdq"] {
        dev(&t, n, &format!("/sys/devices/virtual/block/{n}"), 2048)?;
    }
    // An optical drive that reports its type, a floppy drive that has none (its driver says).
    let cd = "/sys/devices/pci0000:00/0000:00:17.0/ata2/host1/target1:0:0/1:0:0:0";
    dev(&t, "sr0", &format!("{cd}/block/sr0"), 2048)?;
    t.link(&format!("{cd}/block/sr0/device"), "../../../1:0:0:0")?;
    t.file(&format!("{cd}/type"), b"5\n")?;
    let fd = "/sys/devices/platform/floppy.0";
    dev(&t, "fd0", &format!("{fd}/block/fd0"), 2880)?;
    t.link(&format!("{fd}/block/fd0/device"), "../../../floppy.0")?;
    t.link(
        &format!("{fd}/driver"),
        "../../../bus/platform/drivers/floppy",
    )?;
    // A writable hardware partition of a disk (an eMMC general-purpose area).
    let mmc = "/sys/devices/pci0000:00/0000:00:1c.4/0000:03:00.0/mmc_host/mmc0/mmc0:0001";
    dev(&t, "disk7", &format!("{mmc}/block/disk7"), 1 << 20)?;
    t.link(&format!("{mmc}/block/disk7/device"), "../../../mmc0:0001")?;
    dev(&t, "disk7gp0", &format!("{mmc}/block/disk7/disk7gp0"), 8192)?;
    t.link(&format!("{mmc}/block/disk7/disk7gp0/device"), "../../disk7")?;
    t.file(&format!("{mmc}/block/disk7/disk7gp0/ro"), b"0\n")?;
    // A removable drive with no medium.
    let usb = "/sys/devices/pci0000:00/0000:00:14.0/usb1/1-1/1-1:1.0/host2/target2:0:0/2:0:0:0";
    dev(&t, "sdb", &format!("{usb}/block/sdb"), 0)?;
    t.link(&format!("{usb}/block/sdb/device"), "../../../2:0:0:0")?;
    t.file(&format!("{usb}/block/sdb/removable"), b"1\n")?;

    let scan = disk_rule::scan(&t.root)?;
    assert_eq!(scan.disks, ["disk7", "nvme0n1", "ram9"]);
    let why: Vec<(&str, String)> = scan
        .left_out
        .iter()
        .map(|(n, w)| (n.as_str(), w.to_string()))
        .collect();
    let virt = "virtual, no hardware behind it (under /sys/devices/virtual, no device link)";
    assert_eq!(
        why,
        [
            ("disk7gp0", "hardware partition of disk7".to_owned()),
            ("fd0", "not a disk drive (driver floppy)".to_owned()),
            ("sdb", "size 0 (removable, no medium)".to_owned()),
            ("sdq", virt.to_owned()),
            (
                "sr0",
                "not a disk drive (SCSI peripheral type 5, CD/DVD)".to_owned()
            ),
            ("ublkb0", virt.to_owned()),
            ("zloop0", virt.to_owned()),
        ]
    );
    // The inventory lists the same disks and counts the rest in one note.
    let inv = collect(&t.root);
    assert_eq!(disk_names(&inv), ["disk7", "nvme0n1", "ram9"]);
    let note = disk_note(&inv).unwrap_or_default();
    assert!(
        note.starts_with("7 block device(s) left out, not disks: ")
            && note.contains(&format!("3 {virt}: sdq, ublkb0, zloop0")),
        "{note}"
    );
    Ok(())
}
