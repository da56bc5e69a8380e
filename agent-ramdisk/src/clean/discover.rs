//! Which disks `disk.clean` erases and what it knows of each, from `/sys/block` under the
//! [`HostRoot`] (kernel ABI `Documentation/ABI/stable/sysfs-block`). Which entries are disks is
//! `bcd_probes::inventory::disk_rule`'s decision, the inventory's own: the cleaner erases what
//! the inventory lists, no more and no less.

use bcd_probes::hostroot::HostRoot;
use bcd_probes::inventory::disk_rule::{self, Scan};
use bcd_probes::inventory::{blockdev, disks};

/// Bytes in one of the sectors sysfs counts `size` and `start` in, whatever the device's
/// logical block size.
pub const SECTOR_BYTES: u64 = 512;

/// One partition of a disk, from `/sys/block/<disk>/<part>/{start,size}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    /// Kernel name (`sda1`, `nvme0n1p2`).
    pub name: String,
    /// Where it starts on the disk, bytes (`start` × 512).
    pub start_bytes: u64,
    /// Its size, bytes (`size` × 512).
    pub size_bytes: u64,
}

/// One disk, as sysfs describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskInfo {
    /// Kernel name (`vda`), also its node's name in `/dev`.
    pub name: String,
    /// [`disks::serial`]: `device/serial`, `serial` or VPD page 0x80.
    pub serial: Option<String>,
    /// Size, bytes (`size` × 512); `None` when sysfs has no readable `size`.
    pub size_bytes: Option<u64>,
    /// `ro` is 1: the kernel refuses writes.
    pub read_only: bool,
    /// `queue/discard_max_bytes`, bytes: 0 when the device cannot discard.
    pub discard_max_bytes: u64,
    /// `device/vendor` is `ATA`: a SATA disk behind libata or a SAS HBA's translation, which
    /// answers ATA PASS-THROUGH (as the inventory's `ata_smart` decides).
    pub ata: bool,
    /// `queue/logical_block_size`, bytes (512 when unreadable): where a GPT's header is.
    pub logical_block_bytes: u64,
    /// Its partitions as the kernel lists them, by name.
    pub partitions: Vec<Partition>,
}

impl DiskInfo {
    /// True for an NVMe namespace (`nvme<S>n<N>`; not a partition, not a hidden path device
    /// `nvme<S>c<C>n<N>`, which discovery never lists).
    pub fn is_nvme_namespace(&self) -> bool {
        self.name
            .strip_prefix("nvme")
            .and_then(|r| r.split_once('n'))
            .is_some_and(|(s, n)| {
                !s.is_empty()
                    && !n.is_empty()
                    && s.bytes().all(|b| b.is_ascii_digit())
                    && n.bytes().all(|b| b.is_ascii_digit())
            })
    }
}

/// The entries of `/sys/block` sorted into disks (by name) and the devices left out with why
/// ([`disk_rule::scan`]); `Err` only when the directory cannot be listed.
pub fn list_disks(root: &HostRoot) -> std::io::Result<Scan> {
    disk_rule::scan(root)
}

/// What sysfs says of disk `name` (whether or not discovery would list it).
pub fn read_disk(root: &HostRoot, name: &str) -> DiskInfo {
    let base = format!("/sys/block/{name}");
    let sectors = |p: String| {
        root.read_parsed::<u64>(p)
            .map(|s| s.saturating_mul(SECTOR_BYTES))
    };
    let partitions = blockdev::partitions(root, &base)
        .into_iter()
        .filter_map(|p| {
            Some(Partition {
                start_bytes: sectors(format!("{base}/{p}/start"))?,
                size_bytes: sectors(format!("{base}/{p}/size"))?,
                name: p,
            })
        })
        .collect();
    DiskInfo {
        name: name.to_owned(),
        serial: disks::serial(root, &base),
        size_bytes: sectors(format!("{base}/size")),
        read_only: root.read_trimmed(format!("{base}/ro")).as_deref() == Some("1"),
        discard_max_bytes: root
            .read_parsed(format!("{base}/queue/discard_max_bytes"))
            .unwrap_or(0),
        ata: root
            .read_trimmed(format!("{base}/device/vendor"))
            .as_deref()
            == Some("ATA"),
        logical_block_bytes: root
            .read_parsed(format!("{base}/queue/logical_block_size"))
            .unwrap_or(SECTOR_BYTES),
        partitions,
    }
}
