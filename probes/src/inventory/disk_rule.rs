//! What is a disk: the one rule the inventory ([`super::disks`]), the ramdisk's cleaner
//! (`bcd_ramdisk::clean::discover`) and its image writer (through the inventory) apply to the
//! entries of `/sys/block`, decided from what sysfs says of each device (kernel ABI
//! `Documentation/ABI/stable/sysfs-block`), never from its name.
//!
//! A `/sys/block` entry is a disk unless, in this order:
//! 1. it is **hidden** (`hidden` is 1: an NVMe multipath path device, another view of the
//!    namespace head beside it; on kernels older than the attribute (5.12), the kernel's own
//!    naming of such a path, `nvme<S>c<C>n<N>`, is the evidence);
//! 2. it is **virtual**: no hardware behind it — its sysfs directory lies under
//!    `/sys/devices/virtual/` with no `device` link (loop, RAM and zram disks, device-mapper, md
//!    RAID, nbd, and whatever a new virtual block driver is called), or it is built from other
//!    block devices (`slaves/` lists them; a `dm/` or `md/` attribute group says which kind);
//!    an NVMe namespace head also lives under `/sys/devices/virtual/` but has a `device` link
//!    (its subsystem) and is a disk;
//! 3. it is a **hardware partition** of another disk: its `device` link names another
//!    `/sys/block` entry (an eMMC's boot partitions `mmcblk0boot0/1`, read-only by default
//!    through `force_ro`, its RPMB area on kernels that exposed it as a block device, its
//!    general-purpose partitions): the disk is its parent, which is inventoried and cleaned;
//! 4. it is a **drive for media that is not a disk**: a SCSI peripheral device type other than
//!    direct access (0), reduced block commands (0x0e) or host-managed zoned (0x14) in
//!    `device/type` (5 is a CD/DVD drive, 1 a tape, 7 optical memory, 8 a changer), or its
//!    device's driver (`device/driver`) is one of [`REMOVABLE_MEDIA_DRIVERS`];
//! 5. it has **zero capacity** (`size` is 0): a removable drive with no medium in it, or a disk
//!    removed at the hypervisor or storage array that the kernel still lists; there is nothing
//!    on it to inventory, choose or erase, and opening it fails.
//!
//! Removability and holders do not make a device less of a disk: a USB stick or a BMC's
//! writable virtual media is a disk (`removable` in the inventory), a member of an md array or
//! an LVM volume group is a disk with `holders`. Every device left out is named, with the
//! reason, in [`Scan::left_out`] and counted in one inventory note.

use std::fmt;

use crate::hostroot::HostRoot;

/// Drivers of drives whose medium is not a disk (`/sys/block/<name>/device/driver`): SCSI CD/DVD
/// (`sr`) and tape (`st`) when `device/type` is unreadable, the PC floppy controller and the
/// old IDE and parallel-port optical and floppy drivers. What is a disk is decided by the SCSI
/// type first; this list covers devices that have none.
pub const REMOVABLE_MEDIA_DRIVERS: &[&str] =
    &["sr", "st", "floppy", "ide-cd", "ide-floppy", "pcd", "pf"];

/// SCSI peripheral device types of block devices that are disks: direct access (SBC), reduced
/// block commands (RBC), host-managed zoned block (ZBC).
const DISK_SCSI_TYPES: &[u8] = &[0x00, 0x0e, 0x14];

/// Why a `/sys/block` entry is not a disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotADisk {
    /// `hidden` is 1, or the kernel's multipath path name on kernels without `hidden`.
    Hidden,
    /// No hardware behind it; the evidence (`under /sys/devices/virtual`, `device-mapper`,
    /// `md array`, `made of sda, sdb`).
    Virtual(String),
    /// A hardware partition of the named disk; `read_only` when `ro` or `force_ro` is 1.
    HardwarePartition {
        /// The disk it is part of (`mmcblk0`).
        of: String,
        /// `ro` or `force_ro` is 1.
        read_only: bool,
    },
    /// A drive whose medium is not a disk: the SCSI type, or the driver.
    NotDirectAccess(String),
    /// `size` is 0; `removable` when the kernel says the medium can be removed.
    ZeroCapacity {
        /// `removable` is 1.
        removable: bool,
    },
}

impl fmt::Display for NotADisk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Hidden => write!(f, "hidden (a multipath path of a disk listed on its own)"),
            Self::Virtual(why) => write!(f, "virtual, no hardware behind it ({why})"),
            Self::HardwarePartition { of, read_only } => write!(
                f,
                "{}hardware partition of {of}",
                if *read_only { "read-only " } else { "" }
            ),
            Self::NotDirectAccess(why) => write!(f, "not a disk drive ({why})"),
            Self::ZeroCapacity { removable: true } => {
                write!(f, "size 0 (removable, no medium)")
            }
            Self::ZeroCapacity { removable: false } => {
                write!(f, "size 0 (removed but still listed, or no capacity)")
            }
        }
    }
}

/// The `/sys/block` entries sorted into disks and the rest.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scan {
    /// Kernel names of the disks, sorted.
    pub disks: Vec<String>,
    /// The entries that are not disks, sorted by name, each with why.
    pub left_out: Vec<(String, NotADisk)>,
}

impl Scan {
    /// One line counting the devices left out by reason, each with its names:
    /// `3 block device(s) left out: hardware partition of mmcblk0: mmcblk0boot0, …`; `None`
    /// when every entry is a disk.
    pub fn note(&self) -> Option<String> {
        if self.left_out.is_empty() {
            return None;
        }
        let mut groups: Vec<(String, Vec<&str>)> = Vec::new();
        for (name, why) in &self.left_out {
            let why = why.to_string();
            match groups.iter_mut().find(|(w, _)| *w == why) {
                Some((_, names)) => names.push(name),
                None => groups.push((why, vec![name])),
            }
        }
        let parts: Vec<String> = groups
            .into_iter()
            .map(|(why, names)| format!("{} {why}: {}", names.len(), names.join(", ")))
            .collect();
        Some(format!(
            "{} block device(s) left out, not disks: {}",
            self.left_out.len(),
            parts.join("; ")
        ))
    }
}

/// Sorts every entry of `/sys/block` under `root`; `Err` only when the directory cannot be
/// listed.
pub fn scan(root: &HostRoot) -> std::io::Result<Scan> {
    let names = root.list_dir("/sys/block")?;
    let mut out = Scan::default();
    for name in &names {
        match classify(root, name, &format!("/sys/block/{name}"), &names) {
            None => out.disks.push(name.clone()),
            Some(why) => out.left_out.push((name.clone(), why)),
        }
    }
    Ok(out)
}

/// Why the block device `name`, whose sysfs directory is `dir`, is not a disk (`None`: it is
/// one). `block_names` are the entries of `/sys/block` (a hardware partition's `device` link
/// names one of them).
pub fn classify(
    root: &HostRoot,
    name: &str,
    dir: &str,
    block_names: &[String],
) -> Option<NotADisk> {
    if root.read_trimmed(format!("{dir}/hidden")).as_deref() == Some("1") || is_nvme_path_name(name)
    {
        return Some(NotADisk::Hidden);
    }
    if let Some(why) = virtual_evidence(root, dir) {
        return Some(NotADisk::Virtual(why));
    }
    if let Some(of) = root
        .read_link_name(format!("{dir}/device"))
        .filter(|parent| parent != name && block_names.iter().any(|b| b == parent))
    {
        let one = |attr: &str| root.read_trimmed(format!("{dir}/{attr}")).as_deref() == Some("1");
        return Some(NotADisk::HardwarePartition {
            of,
            read_only: one("ro") || one("force_ro"),
        });
    }
    if let Some(t) = root
        .read_trimmed(format!("{dir}/device/type"))
        .and_then(|t| t.parse::<u8>().ok())
        .filter(|t| !DISK_SCSI_TYPES.contains(t))
    {
        return Some(NotADisk::NotDirectAccess(format!(
            "SCSI peripheral type {t}{}",
            scsi_type_name(t)
                .map(|n| format!(", {n}"))
                .unwrap_or_default()
        )));
    }
    if let Some(driver) = root
        .read_link_name(format!("{dir}/device/driver"))
        .filter(|d| REMOVABLE_MEDIA_DRIVERS.contains(&d.as_str()))
    {
        return Some(NotADisk::NotDirectAccess(format!("driver {driver}")));
    }
    if root.read_parsed::<u64>(format!("{dir}/size")) == Some(0) {
        return Some(NotADisk::ZeroCapacity {
            removable: root.read_trimmed(format!("{dir}/removable")).as_deref() == Some("1"),
        });
    }
    None
}

/// What shows a device has no hardware of its own behind it, if anything does.
fn virtual_evidence(root: &HostRoot, dir: &str) -> Option<String> {
    let slaves = root.list_dir(format!("{dir}/slaves")).unwrap_or_default();
    let kind = if root.exists(format!("{dir}/dm")) {
        Some("device-mapper")
    } else if root.exists(format!("{dir}/md")) {
        Some("md array")
    } else {
        None
    };
    match (kind, slaves.is_empty()) {
        (Some(k), true) => return Some(k.to_owned()),
        (Some(k), false) => return Some(format!("{k} made of {}", slaves.join(", "))),
        (None, false) => return Some(format!("made of {}", slaves.join(", "))),
        (None, true) => {}
    }
    let under_virtual = root
        .read_link(dir)
        .is_some_and(|t| t.to_string_lossy().contains("devices/virtual/"));
    (under_virtual && !root.exists(format!("{dir}/device")))
        .then(|| "under /sys/devices/virtual, no device link".to_owned())
}

/// The SPC-4 name of a SCSI peripheral device type that is not a disk.
fn scsi_type_name(t: u8) -> Option<&'static str> {
    Some(match t {
        0x01 => "tape",
        0x02 => "printer",
        0x03 => "processor",
        0x04 => "write-once",
        0x05 => "CD/DVD",
        0x07 => "optical memory",
        0x08 => "medium changer",
        0x0c => "storage array controller",
        0x0d => "enclosure",
        0x11 => "object storage",
        _ => return None,
    })
}

/// `nvme0c1n2`: `nvme`, digits, `c`, digits, `n`, digits — the kernel's name for a multipath
/// path device (`nvme_mpath_set_disk_name`), hidden by the kernel since it has `hidden`.
fn is_nvme_path_name(name: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    name.strip_prefix("nvme")
        .and_then(|r| r.split_once('c'))
        .and_then(|(subsys, r)| r.split_once('n').map(|(ctrl, ns)| (subsys, ctrl, ns)))
        .is_some_and(|(subsys, ctrl, ns)| digits(subsys) && digits(ctrl) && digits(ns))
}
