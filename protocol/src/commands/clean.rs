//! `disk.clean {mode: metadata|full}`: the ramdisk's cleaning of every disk of the machine
//! before it is handed to the next tenant (`releasing`) or retired (`retiring`), and the
//! per-disk result it reports.
//!
//! # Background
//! Ironic's cleaning erases metadata always and the whole disk only when asked (a full erase of
//! a large disk takes hours, and its users found it too slow to be the default); NVIDIA's scout
//! cleanup formats NVMe drives with a crypto erase and falls back `-s2 -> -s1 -> -s0`, because not
//! every drive supports each; both attempt every disk even when one fails. What their users
//! report: a read-only device (a virtual CD, a write-protected stick) failing the whole cleaning.
//!
//! # Design
//! Only the release and retire workflows queue this command (the control plane refuses it from
//! `commands.create`), and only the ramdisk serves it. The command succeeds when it could look at
//! the machine's disks at all; each disk's fate is in [`CleanResult::disks`], and the control
//! plane judges: a [`DiskOutcome::Failed`] disk fails the workflow naming it, a
//! [`DiskOutcome::ReadOnly`] one is named and left (nothing can be written to it, so nothing of
//! a tenant's can be on it that was not there before).

use serde::{Deserialize, Serialize};

/// How much of each disk to erase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum CleanMode {
    /// Partition tables at both ends and filesystem/RAID/LVM signatures: the first and last
    /// MiB of the disk and of each partition are zeroed, then the kernel re-reads the table.
    #[default]
    Metadata,
    /// Every block: an NVMe namespace is formatted with Secure Erase Settings 2 (crypto, where
    /// the controller says it can) falling back to 1 (user data) and 0; a SATA disk gets ATA
    /// SECURITY ERASE UNIT where the drive is not frozen; anything else (or when those cannot
    /// run) a secure discard, else a discard checked by reading back, else zeroing
    /// (BLKZEROOUT) as the last resort; metadata erase first and after.
    Full,
}

impl CleanMode {
    /// The JSON spelling (`metadata`, `full`).
    pub fn as_str(self) -> &'static str {
        match self {
            CleanMode::Metadata => "metadata",
            CleanMode::Full => "full",
        }
    }
}

impl std::fmt::Display for CleanMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for CleanMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "metadata" => Ok(CleanMode::Metadata),
            "full" => Ok(CleanMode::Full),
            other => Err(format!(
                "cleaning mode {other:?} is neither \"metadata\" nor \"full\""
            )),
        }
    }
}

/// The args of `disk.clean` (camelCase JSON; unknown keys are refused).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CleanArgs {
    /// How much to erase; default metadata.
    #[serde(default)]
    pub mode: CleanMode,
}

/// What became of one disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum DiskOutcome {
    /// Erased as the mode asks.
    Cleaned,
    /// The kernel says the device is read-only (`/sys/block/<name>/ro` is 1, or opening it for
    /// writing is refused with EROFS); nothing was written.
    ReadOnly,
    /// An erase step failed; [`DiskClean::error`] says which and how. Other disks were still
    /// attempted.
    Failed,
}

impl DiskOutcome {
    /// The JSON spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            DiskOutcome::Cleaned => "cleaned",
            DiskOutcome::ReadOnly => "readOnly",
            DiskOutcome::Failed => "failed",
        }
    }
}

/// One disk's cleaning (camelCase JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiskClean {
    /// Kernel name (`nvme0n1`, `sda`, `vda`), as in the inventory's `disks[].name`.
    pub name: String,
    /// `/sys/block/<name>/device/serial` (or the NVMe/ATA identify data) when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// Size, bytes (`/sys/block/<name>/size` × 512).
    pub size_bytes: u64,
    pub outcome: DiskOutcome,
    /// The steps that ran, in order, with how each ended: `metadata`, `nvmeFormat ses=2`,
    /// `nvmeFormat ses=1 (ses=2: not supported)`, `ataSecureErase`, `discard`, `zero`,
    /// `rereadPartitions`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<String>,
    /// For [`DiskOutcome::Failed`] (and [`DiskOutcome::ReadOnly`]): what failed, with the
    /// errno or the device's status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// How long this disk took, ms.
    pub duration_ms: u64,
    /// Bytes written or erased (zeroed metadata, discarded or zeroed whole device; for an NVMe
    /// Format, the namespace's size).
    #[serde(default)]
    pub bytes_erased: u64,
}

/// The result of `disk.clean` (camelCase JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CleanResult {
    /// The mode that ran.
    pub mode: CleanMode,
    /// Every disk attempted, in kernel-name order: the inventory's disks (the probes'
    /// `disk_rule`; a partition is cleaned with its disk).
    pub disks: Vec<DiskClean>,
    /// The block devices that are not disks and were not touched, each with why (virtual,
    /// hidden, a hardware partition of a disk, a drive for other media, size 0). Absent in
    /// JSON when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_out: Vec<LeftOut>,
    /// The whole command, ms.
    pub duration_ms: u64,
}

/// A block device `disk.clean` did not touch because it is not a disk (camelCase JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeftOut {
    /// Kernel name (`mmcblk0boot0`, `loop0`).
    pub name: String,
    /// Why it is not a disk (`read-only hardware partition of mmcblk0`).
    pub reason: String,
}

impl CleanResult {
    /// The disks whose cleaning failed.
    pub fn failed(&self) -> impl Iterator<Item = &DiskClean> {
        self.disks
            .iter()
            .filter(|d| d.outcome == DiskOutcome::Failed)
    }

    /// One line for people: `3 disk(s) cleaned (metadata), 1 read-only: sr0`.
    pub fn summary(&self) -> String {
        let count = |o: DiskOutcome| self.disks.iter().filter(|d| d.outcome == o).count();
        let names = |o: DiskOutcome| -> Vec<String> {
            self.disks
                .iter()
                .filter(|d| d.outcome == o)
                .map(|d| match &d.error {
                    Some(e) => format!("{} ({e})", d.name),
                    None => d.name.clone(),
                })
                .collect()
        };
        let mut out = format!(
            "{} disk(s) cleaned ({})",
            count(DiskOutcome::Cleaned),
            self.mode
        );
        if count(DiskOutcome::ReadOnly) > 0 {
            out.push_str(&format!(
                ", read-only and left as they are: {}",
                names(DiskOutcome::ReadOnly).join(", ")
            ));
        }
        if count(DiskOutcome::Failed) > 0 {
            out.push_str(&format!(
                ", failed: {}",
                names(DiskOutcome::Failed).join("; ")
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_result_keeps_its_spelling_and_summarises_each_outcome() {
        let r: CleanResult = serde_json::from_value(json!({
            "mode": "metadata",
            "durationMs": 81,
            "disks": [
                {"name": "nvme0n1", "serial": "S1", "sizeBytes": 1048576, "outcome": "cleaned",
                 "steps": ["metadata"], "durationMs": 3, "bytesErased": 4096},
                {"name": "sr0", "sizeBytes": 0, "outcome": "readOnly", "durationMs": 0},
                {"name": "sdb", "sizeBytes": 10, "outcome": "failed", "error": "EIO writing LBA 0",
                 "durationMs": 1}
            ]
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.failed().count(), 1);
        assert_eq!(
            r.summary(),
            "1 disk(s) cleaned (metadata), read-only and left as they are: sr0, failed: sdb (EIO writing LBA 0)"
        );
        let back = serde_json::to_value(&r).unwrap_or_default();
        assert_eq!(back["disks"][1]["outcome"], "readOnly");
        assert_eq!(back["disks"][0]["bytesErased"], 4096);
        assert!(back["disks"][1].get("serial").is_none());
    }

    #[test]
    fn modes_parse_and_unknown_keys_are_refused() {
        assert_eq!("full".parse::<CleanMode>(), Ok(CleanMode::Full));
        assert!("secure".parse::<CleanMode>().is_err());
        let a: CleanArgs = serde_json::from_value(json!({})).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(a.mode, CleanMode::Metadata);
        assert!(serde_json::from_value::<CleanArgs>(json!({"mode": "full", "disks": []})).is_err());
    }
}
