//! A disk's health summary (`disks[].health` in the document), as the drive reports it. The NVMe
//! fields are those of the SMART / Health Information log page (log identifier 02h, NVM Express
//! Base Specification 2.0, section 5.16.1.3, figure 207), read by the hardware probes with a Get
//! Log Page admin command; the byte offsets below are that page's.

use serde::{Deserialize, Serialize};

/// `source` of a health summary read from the NVMe SMART / Health Information log page.
pub const SOURCE_NVME_SMART_LOG: &str = "nvme-smart-log";
/// `source` of a SATA disk's summary: ATA SMART RETURN STATUS and READ DATA (ACS-4 §7.45),
/// sent as ATA PASS-THROUGH (16) through `SG_IO`.
pub const SOURCE_ATA_SMART: &str = "ata-smart";
/// `source` of a SAS/SCSI disk's summary: LOG SENSE of the Informational Exceptions page
/// (`2Fh`, SPC-5).
pub const SOURCE_SCSI_INFORMATIONAL_EXCEPTIONS: &str = "scsi-informational-exceptions";

/// Health summary of one disk. An NVMe namespace gets its controller's (the page read with NSID
/// `FFFFFFFFh`: the controller as a whole).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiskHealth {
    /// Where the summary came from: `nvme-smart-log`, `ata-smart` or
    /// `scsi-informational-exceptions`.
    pub source: String,
    /// NVMe only (0 for the other sources). Critical Warning, byte 0, as a bit field: bit 0 spare below threshold, 1 temperature
    /// outside its thresholds, 2 reliability degraded, 3 read-only, 4 volatile memory backup
    /// failed, 5 persistent memory region read-only. 0 is healthy.
    #[serde(default)]
    pub critical_warning: u8,
    /// The set bits of `criticalWarning`, named: `spareBelowThreshold`, `temperature`,
    /// `reliabilityDegraded`, `readOnly`, `volatileBackupFailed`, `persistentMemoryReadOnly`
    /// (bits 6–7, reserved, as `bit6`, `bit7`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub critical_warnings: Vec<String>,
    /// Composite Temperature, bytes 1–2 (little-endian, whole Kelvin), in degrees Celsius:
    /// K − 273, as nvme-cli converts it; absent when the drive reports 0 (not implemented).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature_celsius: Option<i32>,
    /// Available Spare, byte 3: spare capacity left, percent (0–100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_spare_percent: Option<u8>,
    /// Available Spare Threshold, byte 4: below it the drive sets critical warning bit 0, percent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_spare_threshold_percent: Option<u8>,
    /// Percentage Used, byte 5: the vendor's estimate of life used, percent; may exceed 100 (255
    /// at most).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percentage_used: Option<u8>,
    /// Media and Data Integrity Errors, bytes 160–175 (128-bit little-endian counter), saturated
    /// at `u64::MAX`: unrecovered data integrity errors over the drive's life.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_errors: Option<u64>,
    /// Power On Hours, bytes 128–143 (128-bit counter, saturated at `u64::MAX`), hours.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_on_hours: Option<u64>,
    /// Unsafe Shutdowns, bytes 144–159 (128-bit counter, saturated at `u64::MAX`): power losses
    /// without a shutdown notification.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unsafe_shutdowns: Option<u64>,
    /// ATA: the drive's SMART RETURN STATUS verdict (`false`: a threshold exceeded). SCSI: no
    /// failure predicted (Informational Exceptions ASC other than `5Dh`). Absent for NVMe (its
    /// verdict is `criticalWarning`) or when the drive's answer matched neither pattern.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub smart_passed: Option<bool>,
    /// ATA attribute 5 (Reallocated Sectors Count), raw value: sectors remapped to spares.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reallocated_sectors: Option<u64>,
    /// ATA attribute 197 (Current Pending Sector Count), raw value: sectors waiting to be
    /// remapped after a read error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_sectors: Option<u64>,
    /// ATA attribute 198 (Offline Uncorrectable), raw value: sectors the offline scan could not
    /// read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uncorrectable_sectors: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::Disk;

    /// The control plane's commissioning reads these names (issue 15); keep them.
    #[test]
    fn the_names_commissioning_reads() {
        let d = Disk {
            name: "nvme0n1".into(),
            health: Some(DiskHealth {
                source: SOURCE_NVME_SMART_LOG.into(),
                critical_warning: 0b101,
                critical_warnings: vec!["spareBelowThreshold".into(), "reliabilityDegraded".into()],
                temperature_celsius: Some(-5),
                available_spare_percent: Some(9),
                available_spare_threshold_percent: Some(10),
                percentage_used: Some(120),
                media_errors: Some(u64::MAX),
                power_on_hours: Some(7),
                unsafe_shutdowns: Some(3),
                smart_passed: Some(false),
                reallocated_sectors: Some(1),
                pending_sectors: Some(2),
                uncorrectable_sectors: Some(4),
            }),
            ..Disk::default()
        };
        let v = serde_json::to_value(&d).unwrap_or_default();
        let h = &v["health"];
        assert_eq!(h["source"], "nvme-smart-log");
        assert_eq!(h["criticalWarning"], 5);
        assert_eq!(h["criticalWarnings"][1], "reliabilityDegraded");
        assert_eq!(h["temperatureCelsius"], -5);
        assert_eq!(h["availableSparePercent"], 9);
        assert_eq!(h["availableSpareThresholdPercent"], 10);
        assert_eq!(h["percentageUsed"], 120);
        assert_eq!(h["mediaErrors"], u64::MAX);
        assert_eq!(h["powerOnHours"], 7);
        assert_eq!(h["unsafeShutdowns"], 3);
        assert_eq!(h["smartPassed"], false);
        assert_eq!(h["uncorrectableSectors"], 4);
        let back: Disk = serde_json::from_value(v).unwrap_or_default();
        assert_eq!(back, d);
    }

    #[test]
    fn a_disk_without_health_has_no_key_and_an_older_document_reads() {
        let v = serde_json::to_value(Disk::default()).unwrap_or_default();
        assert!(v.get("health").is_none(), "{v}");
        let old: Disk = serde_json::from_str(r#"{"name":"sda","sizeBytes":1,"nvme":false}"#)
            .unwrap_or_default();
        assert_eq!((old.name.as_str(), old.health), ("sda", None));
        // A SATA disk's health has no NVMe critical warning: it reads as 0.
        let sata: DiskHealth = serde_json::from_str(r#"{"source":"ata-smart","smartPassed":true}"#)
            .unwrap_or_default();
        assert_eq!((sata.critical_warning, sata.smart_passed), (0, Some(true)));
    }
}
