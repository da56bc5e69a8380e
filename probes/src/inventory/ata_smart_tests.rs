//! SATA/SAS health parsers, from bytes laid out as SAT-4, ACS-4 and SPC-5 define them. The
//! SG_IO path runs against a real kernel (libata over QEMU's AHCI disk, which implements SMART)
//! in tests/e2e/tests/topology_vm.rs.

use super::*;
use proptest::prelude::*;

type R = Result<(), Box<dyn std::error::Error>>;

#[test]
fn the_cdbs_are_sat_ata_pass_through_16() {
    let read = smart_cdb(0xd0);
    assert_eq!(
        read,
        [
            0x85, 0x08, 0x0e, 0, 0xd0, 0, 1, 0, 0, 0, 0x4f, 0, 0xc2, 0, 0xb0, 0
        ]
    );
    let status = smart_cdb(0xda);
    assert_eq!(
        status,
        [
            0x85, 0x06, 0x20, 0, 0xda, 0, 0, 0, 0, 0, 0x4f, 0, 0xc2, 0, 0xb0, 0
        ]
    );
    assert_eq!(log_sense_cdb(), [0x4d, 0, 0x6f, 0, 0, 0, 0, 0, 252, 0]);
}

#[test]
fn smart_status_reads_both_sense_formats() {
    // Descriptor format: header, then the ATA Status Return descriptor (09h, 0Ch bytes).
    let mut desc = vec![0x72, 0x01, 0x00, 0x1d, 0, 0, 0, 14];
    desc.extend_from_slice(&[0x09, 0x0c, 0, 0, 0, 0, 0, 0, 0, 0x4f, 0, 0xc2, 0, 0x50]);
    assert_eq!(smart_status(&desc), Some(true));
    desc[17] = 0xf4;
    desc[19] = 0x2c;
    assert_eq!(smart_status(&desc), Some(false));
    // Fixed format: LBA mid and high in bytes 10 and 11.
    let mut fixed = vec![0x70, 0, 0x01, 0, 0x50, 0, 0, 10, 0, 0, 0x4f, 0xc2];
    assert_eq!(smart_status(&fixed), Some(true));
    fixed[10] = 0;
    assert_eq!(smart_status(&fixed), None);
    assert_eq!(smart_status(&[]), None);
    // A descriptor list without 09h.
    assert_eq!(
        smart_status(&[0x72, 0, 0, 0, 0, 0, 0, 4, 0x02, 0x02, 0, 0]),
        None
    );
}

/// A SMART data structure with `attrs` (id, raw) in its table.
fn smart_data(attrs: &[(u8, u64)]) -> Vec<u8> {
    let mut d = vec![0u8; SMART_DATA_BYTES];
    d[0] = 0x10; // revision
    for (i, (id, raw)) in attrs.iter().enumerate() {
        let at = 2 + i * 12;
        d[at] = *id;
        d[at + 3] = 100; // current
        d[at + 4] = 100; // worst
        d[at + 5..at + 11].copy_from_slice(&raw.to_le_bytes()[..6]);
    }
    d
}

#[test]
fn attributes_give_the_sectors_hours_and_temperature() {
    // Temperature 194 with min/max in the upper bytes (a common layout): low byte is current.
    let d = smart_data(&[
        (5, 8),
        (9, 0x0001_0000_2710),
        (194, 0x0028_0014_0023),
        (197, 2),
        (198, 1),
    ]);
    let h = parse_smart_data(&d, Some(true));
    assert_eq!(h.source, "ata-smart");
    assert_eq!(h.smart_passed, Some(true));
    assert_eq!(h.reallocated_sectors, Some(8));
    assert_eq!(h.power_on_hours, Some(10_000));
    assert_eq!(h.temperature_celsius, Some(35));
    assert_eq!(h.pending_sectors, Some(2));
    assert_eq!(h.uncorrectable_sectors, Some(1));
    assert_eq!(h.critical_warning, 0);
    // 190 stands in when 194 is absent; absent attributes stay absent.
    let h = parse_smart_data(&smart_data(&[(190, 41)]), None);
    assert_eq!(h.temperature_celsius, Some(41));
    assert_eq!(h.reallocated_sectors, None);
    assert_eq!(h.smart_passed, None);
}

#[test]
fn the_informational_exceptions_page_gives_the_verdict_and_temperature() -> R {
    // Page 2Fh, one general parameter (code 0000h, 4 bytes: ASC, ASCQ, temperature, vendor).
    let ok = [0x2f, 0, 0, 8, 0, 0, 0x03, 4, 0x00, 0x00, 38, 0];
    let h = parse_ie_page(&ok).ok_or("page")?;
    assert_eq!(h.source, "scsi-informational-exceptions");
    assert_eq!(h.smart_passed, Some(true));
    assert_eq!(h.temperature_celsius, Some(38));
    let failing = [0x2f, 0, 0, 8, 0, 0, 0x03, 4, 0x5d, 0x10, 0xff, 0];
    let h = parse_ie_page(&failing).ok_or("page")?;
    assert_eq!(h.smart_passed, Some(false));
    assert_eq!(h.temperature_celsius, None);
    assert!(parse_ie_page(&[0x0d, 0, 0, 0]).is_none());
    assert!(parse_ie_page(&[0x2f, 0, 0, 4, 0, 1, 0, 0]).is_none());
    Ok(())
}

proptest! {
    #[test]
    fn junk_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = smart_status(&bytes);
        let _ = parse_smart_data(&bytes, None);
        let _ = parse_ie_page(&bytes);
    }
}
