//! One disk the operator names, for the standalone commands `bcd disk clean --device …` and
//! `bcd image write --device …`: the ramdisk's own cleaning and image writing ([`crate::clean`],
//! [`crate::deploy`]) on that disk alone, on any machine (a loop device, a disk of a host being
//! decommissioned), instead of only inside a PXE-booted ramdisk's session.
//!
//! The device is named by any path to its node (`/dev/nvme0n1`, `/dev/disk/by-id/…`, `loop3`);
//! it must be a whole disk (`/sys/block/<name>`), not a partition. A disk the machine uses is
//! refused before anything is read from it: mounted (its or a partition's device number in
//! `/proc/self/mountinfo`), swapped on (`/proc/swaps`), or held by device-mapper, md or another
//! stacking driver (`holders/`). The disk rule of the inventory does not apply: a loop device
//! named here is cleaned, as the operator asked.

use std::path::{Path, PathBuf};

use bcd_probes::hostroot::HostRoot;

/// Why the named device cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// The path does not lead anywhere.
    #[error("{device}: {source}")]
    NotFound {
        device: String,
        source: std::io::Error,
    },
    /// The node is not a disk the kernel lists in `/sys/block`.
    #[error("{device}: not a disk in /sys/block ({name})")]
    NotADisk { device: String, name: String },
    /// A partition was named.
    #[error("{name} is a partition of {disk}: name the whole disk (/dev/{disk})")]
    Partition { name: String, disk: String },
    /// The disk, or a partition of it, is mounted.
    #[error("{name} is in use: {what} mounted at {at}; unmount it first")]
    Mounted {
        name: String,
        what: String,
        at: String,
    },
    /// The disk, or a partition of it, is a swap area in use.
    #[error("{name} is in use: {what} is swap; swapoff first")]
    Swap { name: String, what: String },
    /// Another block device is built on it.
    #[error("{name} is in use: held by {}; stop them first", by.join(", "))]
    Held { name: String, by: Vec<String> },
}

/// The kernel name of the whole disk `device` names (a path to its node, or a bare name).
pub fn resolve(root: &HostRoot, device: &str) -> Result<String, LocalError> {
    let d = device.trim();
    let name = if d.contains('/') {
        let path = if root.is_live() {
            PathBuf::from(d)
        } else {
            root.path(d)
        };
        let real = std::fs::canonicalize(&path).map_err(|source| LocalError::NotFound {
            device: d.to_owned(),
            source,
        })?;
        real.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    } else {
        d.to_owned()
    };
    if !name.is_empty() && root.exists(format!("/sys/block/{name}")) {
        return Ok(name);
    }
    if root.exists(format!("/sys/class/block/{name}/partition"))
        && let Some(disk) = root
            .read_link(format!("/sys/class/block/{name}"))
            .and_then(|t| {
                t.parent()
                    .and_then(Path::file_name)
                    .map(|n| n.to_string_lossy().into_owned())
            })
    {
        return Err(LocalError::Partition { name, disk });
    }
    Err(LocalError::NotADisk {
        device: d.to_owned(),
        name,
    })
}

/// `Ok` when nothing on the machine uses the disk `name` (see the module docs).
pub fn check_unused(root: &HostRoot, name: &str) -> Result<(), LocalError> {
    let base = format!("/sys/block/{name}");
    let parts = bcd_probes::inventory::blockdev::partitions(root, &base);
    // The disk and its partitions: their names and device numbers.
    let devs: Vec<(String, Option<String>)> = std::iter::once(name.to_owned())
        .chain(parts.iter().cloned())
        .map(|n| {
            let dir = if n == name {
                base.clone()
            } else {
                format!("{base}/{n}")
            };
            let dev = root.read_trimmed(format!("{dir}/dev"));
            (n, dev)
        })
        .collect();
    let mounts = root
        .read_to_string("/proc/self/mountinfo")
        .unwrap_or_default();
    for line in mounts.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(numbers), Some(at)) = (f.get(2), f.get(4)) else {
            continue;
        };
        if let Some((what, _)) = devs
            .iter()
            .find(|(_, dev)| dev.as_deref() == Some(*numbers))
        {
            return Err(LocalError::Mounted {
                name: name.to_owned(),
                what: what.clone(),
                at: (*at).to_owned(),
            });
        }
    }
    let swaps = root.read_to_string("/proc/swaps").unwrap_or_default();
    for line in swaps.lines().skip(1) {
        let Some(path) = line.split_whitespace().next() else {
            continue;
        };
        let base_name = path.rsplit('/').next().unwrap_or(path);
        if let Some((what, _)) = devs.iter().find(|(n, _)| n == base_name) {
            return Err(LocalError::Swap {
                name: name.to_owned(),
                what: what.clone(),
            });
        }
    }
    let by = bcd_probes::inventory::blockdev::holders(root, &base, &parts);
    if !by.is_empty() {
        return Err(LocalError::Held {
            name: name.to_owned(),
            by,
        });
    }
    Ok(())
}

/// [`resolve`] then [`check_unused`]: the disk's kernel name, ready for the ramdisk's code.
pub fn open_disk(root: &HostRoot, device: &str) -> Result<String, LocalError> {
    let name = resolve(root, device)?;
    check_unused(root, &name)?;
    Ok(name)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn file(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    /// `sdb` (8:16) with partition `sdb1` (8:17), and `sdc` (8:32).
    fn tree() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        file(r, "sys/block/sdb/dev", "8:16\n");
        file(r, "sys/block/sdb/sdb1/partition", "1\n");
        file(r, "sys/block/sdb/sdb1/dev", "8:17\n");
        file(r, "sys/block/sdc/dev", "8:32\n");
        std::fs::create_dir_all(r.join("sys/class/block")).unwrap();
        std::os::unix::fs::symlink("../../block/sdb/sdb1", r.join("sys/class/block/sdb1")).unwrap();
        file(r, "dev/sdb", "");
        file(r, "proc/swaps", "Filename Type Size Used Priority\n");
        file(
            r,
            "proc/self/mountinfo",
            "22 1 8:2 / / rw - ext4 /dev/sda2 rw\n",
        );
        d
    }

    #[test]
    fn a_disk_is_named_by_any_path_and_a_partition_is_refused() {
        let d = tree();
        let root = HostRoot::new(d.path());
        assert_eq!(resolve(&root, "/dev/sdb").unwrap(), "sdb");
        assert_eq!(resolve(&root, "sdc").unwrap(), "sdc");
        let e = resolve(&root, "sdb1").unwrap_err();
        assert_eq!(
            e.to_string(),
            "sdb1 is a partition of sdb: name the whole disk (/dev/sdb)"
        );
        assert!(matches!(
            resolve(&root, "/dev/nope"),
            Err(LocalError::NotFound { .. })
        ));
        assert!(matches!(
            resolve(&root, "sdz"),
            Err(LocalError::NotADisk { .. })
        ));
    }

    #[test]
    fn a_mounted_swapped_or_held_disk_is_refused() {
        let d = tree();
        let root = HostRoot::new(d.path());
        assert!(check_unused(&root, "sdb").is_ok());
        file(
            d.path(),
            "proc/self/mountinfo",
            "22 1 8:2 / / rw - ext4 /dev/sda2 rw\n40 22 8:17 / /srv rw - xfs /dev/sdb1 rw\n",
        );
        assert_eq!(
            check_unused(&root, "sdb").unwrap_err().to_string(),
            "sdb is in use: sdb1 mounted at /srv; unmount it first"
        );
        assert!(check_unused(&root, "sdc").is_ok());
        file(
            d.path(),
            "proc/swaps",
            "Filename Type Size Used Priority\n/dev/sdc partition 1024 0 -2\n",
        );
        assert!(matches!(
            check_unused(&root, "sdc"),
            Err(LocalError::Swap { .. })
        ));
        file(d.path(), "proc/swaps", "Filename Type Size Used Priority\n");
        file(d.path(), "sys/block/sdc/holders/md0", "");
        assert_eq!(
            check_unused(&root, "sdc").unwrap_err().to_string(),
            "sdc is in use: held by md0; stop them first"
        );
    }
}
