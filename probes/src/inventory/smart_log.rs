//! The NVMe SMART / Health Information log page (log identifier 02h; NVM Express Base
//! Specification 2.0, section 5.16.1.3, figure 207) as a [`DiskHealth`]. Pure: the page's 512
//! bytes in, the summary out; [`super::nvme`] reads the page from the controller.

use bc_protocol::inventory::DiskHealth;
use bc_protocol::inventory::health::SOURCE_NVME_SMART_LOG;

/// Length of the log page, bytes.
pub const PAGE_BYTES: usize = 512;

/// Names of the Critical Warning bits (byte 0), bit 0 first. Bits 6 and 7 are reserved.
const WARNING_BITS: [&str; 8] = [
    "spareBelowThreshold",
    "temperature",
    "reliabilityDegraded",
    "readOnly",
    "volatileBackupFailed",
    "persistentMemoryReadOnly",
    "bit6",
    "bit7",
];

/// Celsius is Kelvin less 273 (whole degrees: the page holds whole Kelvin; nvme-cli's rule).
const KELVIN_OFFSET: i32 = 273;

/// The summary of one page. Every field the page always carries is filled; the composite
/// temperature is absent when the drive writes 0 (the field is then not implemented).
pub fn parse(page: &[u8; PAGE_BYTES]) -> DiskHealth {
    let critical_warning = page[0];
    let kelvin = u16::from_le_bytes([page[1], page[2]]);
    DiskHealth {
        source: SOURCE_NVME_SMART_LOG.into(),
        critical_warning,
        critical_warnings: WARNING_BITS
            .iter()
            .enumerate()
            .filter(|(bit, _)| critical_warning & (1 << bit) != 0)
            .map(|(_, name)| (*name).to_owned())
            .collect(),
        temperature_celsius: (kelvin != 0).then(|| i32::from(kelvin) - KELVIN_OFFSET),
        available_spare_percent: Some(page[3]),
        available_spare_threshold_percent: Some(page[4]),
        percentage_used: Some(page[5]),
        power_on_hours: Some(counter(page, 128)),
        unsafe_shutdowns: Some(counter(page, 144)),
        media_errors: Some(counter(page, 160)),
        ..DiskHealth::default()
    }
}

/// The 128-bit little-endian counter at `offset`, saturated into a `u64`.
fn counter(page: &[u8; PAGE_BYTES], offset: usize) -> u64 {
    let mut b = [0u8; 16];
    b.copy_from_slice(&page[offset..offset + 16]);
    u64::try_from(u128::from_le_bytes(b)).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A page as a drive writes it: `fields` are (offset, bytes) pairs over zeros.
    fn page(fields: &[(usize, &[u8])]) -> [u8; PAGE_BYTES] {
        let mut p = [0u8; PAGE_BYTES];
        for (at, bytes) in fields {
            p[*at..*at + bytes.len()].copy_from_slice(bytes);
        }
        p
    }

    #[test]
    fn a_healthy_drive() {
        // 323 K (50 °C, what QEMU's emulated controller reports), spare 100 % over a 10 %
        // threshold, 0 % used, 1 power-on hour.
        let p = page(&[
            (1, &323u16.to_le_bytes()),
            (3, &[100, 10, 0]),
            (128, &1u128.to_le_bytes()),
            (144, &0u128.to_le_bytes()),
        ]);
        let h = parse(&p);
        assert_eq!(
            h,
            DiskHealth {
                source: "nvme-smart-log".into(),
                critical_warning: 0,
                critical_warnings: vec![],
                temperature_celsius: Some(50),
                available_spare_percent: Some(100),
                available_spare_threshold_percent: Some(10),
                percentage_used: Some(0),
                media_errors: Some(0),
                power_on_hours: Some(1),
                unsafe_shutdowns: Some(0),
                ..DiskHealth::default()
            }
        );
    }

    #[test]
    fn warnings_named_and_a_counter_past_u64_saturates() {
        // Spare below threshold, read-only and persistent memory read-only (bits 0, 3, 5);
        // media errors 2^64 + 5 (above u64::MAX); 250 K is below freezing; 105 % used.
        let media = (1u128 << 64) + 5;
        let p = page(&[
            (0, &[0b0010_1001]),
            (1, &250u16.to_le_bytes()),
            (3, &[4, 10, 105]),
            (128, &0x0102_0304u128.to_le_bytes()),
            (144, &u128::from(u64::MAX).to_le_bytes()),
            (160, &media.to_le_bytes()),
        ]);
        let h = parse(&p);
        assert_eq!(h.critical_warning, 0x29);
        assert_eq!(
            h.critical_warnings,
            [
                "spareBelowThreshold",
                "readOnly",
                "persistentMemoryReadOnly"
            ]
        );
        assert_eq!(h.temperature_celsius, Some(-23));
        assert_eq!(h.available_spare_percent, Some(4));
        assert_eq!(h.available_spare_threshold_percent, Some(10));
        assert_eq!(h.percentage_used, Some(105));
        assert_eq!(h.media_errors, Some(u64::MAX), "2^64 + 5 saturates");
        assert_eq!(h.power_on_hours, Some(0x0102_0304));
        assert_eq!(
            h.unsafe_shutdowns,
            Some(u64::MAX),
            "exactly u64::MAX is kept"
        );
    }

    #[test]
    fn every_warning_bit_and_no_temperature() {
        let h = parse(&page(&[(0, &[0xff])]));
        assert_eq!(h.critical_warnings.len(), 8);
        assert_eq!(h.critical_warnings[1], "temperature");
        assert_eq!(h.critical_warnings[4], "volatileBackupFailed");
        assert_eq!(h.temperature_celsius, None, "0 K: not reported");
        // Bytes past the counters (temperature sensors, thermal times) do not leak into them.
        let h = parse(&page(&[(176, &[0xff; 336])]));
        assert_eq!(
            (h.media_errors, h.power_on_hours, h.unsafe_shutdowns),
            (Some(0), Some(0), Some(0))
        );
    }
}
