//! What a disk is known by besides its identity, and what sits on it: the names udev links to it
//! in `/dev/disk/by-path` and `/dev/disk/by-id`, its SCSI address (HCTL), its partitions and the
//! md/dm devices stacked on it (`holders/`, kernel ABI `sysfs-block`), and the vendor extension
//! of an NAA type 6 WWN. These are what ironic's root-device hints match on.

use std::collections::HashMap;

use crate::hostroot::HostRoot;

/// The udev names of block devices: for `/dev/disk/by-path` and `/dev/disk/by-id`, the link names
/// by the last component of their target (`../../sda` → `sda`). Read once per inventory, so a
/// host with many disks and links costs one pass over each directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DevDiskNames {
    by_path: HashMap<String, Vec<String>>,
    by_id: HashMap<String, Vec<String>>,
}

impl DevDiskNames {
    /// Reads both directories; an absent one (no udev, a fixture tree) gives no names.
    pub fn read(root: &HostRoot) -> Self {
        Self {
            by_path: links_by_target(root, "/dev/disk/by-path"),
            by_id: links_by_target(root, "/dev/disk/by-id"),
        }
    }

    /// Names in `/dev/disk/by-path` that point to `dev` itself (a partition's are its own),
    /// sorted.
    pub fn by_path(&self, dev: &str) -> Vec<String> {
        self.by_path.get(dev).cloned().unwrap_or_default()
    }

    /// Names in `/dev/disk/by-id` that point to `dev`, sorted.
    pub fn by_id(&self, dev: &str) -> Vec<String> {
        self.by_id.get(dev).cloned().unwrap_or_default()
    }
}

fn links_by_target(root: &HostRoot, dir: &str) -> HashMap<String, Vec<String>> {
    let mut out: HashMap<String, Vec<String>> = HashMap::new();
    // `list_dir` sorts: each list comes out sorted.
    for name in root.list_dir(dir).unwrap_or_default() {
        if let Some(dev) = root.read_link_name(format!("{dir}/{name}")) {
            out.entry(dev).or_default().push(name);
        }
    }
    out
}

/// `0:0:0:0`: four decimal numbers separated by `:` (a SCSI device's sysfs name).
pub fn is_hctl(s: &str) -> bool {
    let parts: Vec<&str> = s.split(':').collect();
    parts.len() == 4
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// The disk's SCSI address: the name its `device` link points to, else the last HCTL-shaped
/// component of the path its `/sys/block` entry points to (`…/target0:0:0/0:0:0:0/block/sdb`).
pub fn hctl(root: &HostRoot, base: &str) -> Option<String> {
    root.read_link_name(format!("{base}/device"))
        .filter(|n| is_hctl(n))
        .or_else(|| {
            let t = root.read_link(base)?;
            t.components()
                .rev()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .find(|c| is_hctl(c))
        })
}

/// Partitions of the disk at `base` (`/sys/block/sda`): its subdirectories holding a
/// `partition` file, sorted.
pub fn partitions(root: &HostRoot, base: &str) -> Vec<String> {
    root.list_dir(base)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| root.exists(format!("{base}/{e}/partition")))
        .collect()
}

/// The devices in `holders/` of the disk and of each of its `partitions`, sorted, each once.
pub fn holders(root: &HostRoot, base: &str, partitions: &[String]) -> Vec<String> {
    let mut out: Vec<String> = std::iter::once(format!("{base}/holders"))
        .chain(partitions.iter().map(|p| format!("{base}/{p}/holders")))
        .flat_map(|d| root.list_dir(d).unwrap_or_default())
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The vendor extension of an NAA type 6 (IEEE registered extended) WWN, `naa.6` followed by 31
/// more hex digits: its last 16, as `0x…` (udev's `ID_WWN_VENDOR_EXTENSION`).
pub fn wwn_vendor_extension(wwn: &str) -> Option<String> {
    let hex = wwn.strip_prefix("naa.")?;
    (hex.len() == 32 && hex.starts_with('6') && hex.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| format!("0x{}", hex[16..].to_ascii_lowercase()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hctl_shapes() {
        assert!(is_hctl("0:0:0:0") && is_hctl("10:2:31:4096"));
        assert!(!is_hctl("0000:00:03.0") && !is_hctl("0:0:0") && !is_hctl("a:0:0:0"));
        assert!(!is_hctl("target0:0:0"));
    }

    #[test]
    fn naa6_vendor_extension() {
        assert_eq!(
            wwn_vendor_extension("naa.600508b1001c4d4bd2b1e0f5a3c7e921").as_deref(),
            Some("0xd2b1e0f5a3c7e921")
        );
        assert_eq!(wwn_vendor_extension("naa.5000c500a1b2c3d4"), None);
        assert_eq!(
            wwn_vendor_extension("eui.36344830529001230025384500000001"),
            None
        );
    }
}
