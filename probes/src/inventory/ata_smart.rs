//! Health of SATA and SAS disks (issue 20.1), through `SG_IO` ([`super::sgio`]):
//!
//! - **SATA** (the SCSI device's vendor is `ATA`: libata, or a SAS HBA's SATA translation): ATA
//!   PASS-THROUGH (16) (SAT-4 §12.2.2) with SMART RETURN STATUS (ACS-4 §7.45.7, feature `DAh`:
//!   the drive's own pass/fail verdict, returned in LBA mid/high — `4Fh`/`C2h` passed,
//!   `F4h`/`2Ch` threshold exceeded) and SMART READ DATA (feature `D0h`: the 512-byte data
//!   structure whose attribute table starts at byte 2, 30 entries of 12 bytes: id, flags (2),
//!   current, worst, raw value (6, little-endian), reserved). Attributes read: 5 reallocated
//!   sectors, 9 power-on hours, 194 (else 190) temperature, 197 current pending sectors, 198
//!   offline uncorrectable sectors — the ones smartmontools and the drive makers' tools agree on.
//! - **SAS / SCSI** (any other vendor): LOG SENSE (SPC-5 §6.7) of the Informational Exceptions
//!   page `2Fh`: its first parameter carries the additional sense code of a predicted failure
//!   (`5Dh`: failure prediction threshold exceeded; 0 none) and the most recent temperature.
//!
//! A disk that refuses a command (a virtual disk without SMART, a USB bridge that drops ATA
//! PASS-THROUGH) gets a note and no health; nothing fails the inventory.

use bc_protocol::inventory::health::{SOURCE_ATA_SMART, SOURCE_SCSI_INFORMATIONAL_EXCEPTIONS};
use bc_protocol::inventory::{Disk, DiskHealth, Note};

use super::note;
use super::sgio::{self, Reply, SgError};
use crate::hostroot::HostRoot;

/// Bytes of the SMART data structure.
pub const SMART_DATA_BYTES: usize = 512;
/// Allocation length of the LOG SENSE answer, bytes.
const LOG_SENSE_BYTES: usize = 252;

/// ATA PASS-THROUGH (16) of SMART `feature` (`D0h` READ DATA with one 512-byte PIO data-in
/// block; `DAh` RETURN STATUS, non-data with CK_COND so the registers come back as sense).
pub fn smart_cdb(feature: u8) -> [u8; 16] {
    let read = feature == 0xd0;
    let mut cdb = [0u8; 16];
    cdb[0] = 0x85;
    // PROTOCOL (bits 4:1): 4 PIO data-in, 3 non-data.
    cdb[1] = if read { 4 << 1 } else { 3 << 1 };
    // READ DATA: T_DIR from device, BYT_BLOK blocks, T_LENGTH in SECTOR COUNT. RETURN STATUS:
    // CK_COND, to get the ATA registers back.
    cdb[2] = if read { 0x0e } else { 0x20 };
    cdb[4] = feature;
    cdb[6] = u8::from(read);
    cdb[10] = 0x4f;
    cdb[12] = 0xc2;
    cdb[14] = 0xb0;
    cdb
}

/// The SMART verdict from the registers SMART RETURN STATUS returned in `sense` (descriptor
/// format with an ATA Status Return descriptor `09h`, or fixed format with the registers in
/// bytes 9–11, SAT-4 §12.2.5): `Some(true)` passed, `Some(false)` threshold exceeded, `None` when
/// the sense carries neither pattern.
pub fn smart_status(sense: &[u8]) -> Option<bool> {
    let (mid, high) = match sense.first().map(|b| b & 0x7f) {
        Some(0x72 | 0x73) => {
            let mut at = 8;
            let mut found = None;
            while at + 1 < sense.len() {
                let (code, len) = (sense[at], usize::from(sense[at + 1]));
                if code == 0x09 {
                    found = Some((*sense.get(at + 9)?, *sense.get(at + 11)?));
                    break;
                }
                at += 2 + len;
            }
            found?
        }
        Some(0x70 | 0x71) => (*sense.get(10)?, *sense.get(11)?),
        _ => return None,
    };
    match (mid, high) {
        (0x4f, 0xc2) => Some(true),
        (0xf4, 0x2c) => Some(false),
        _ => None,
    }
}

/// The raw value (48 bits) of attribute `id` in a SMART data structure.
fn attribute(data: &[u8], id: u8) -> Option<u64> {
    data.get(2..2 + 30 * 12)?
        .chunks_exact(12)
        .find(|a| a[0] == id)
        .map(|a| {
            let mut raw = [0u8; 8];
            raw[..6].copy_from_slice(&a[5..11]);
            u64::from_le_bytes(raw)
        })
}

/// A [`DiskHealth`] from a SMART data structure and the RETURN STATUS verdict.
pub fn parse_smart_data(data: &[u8], passed: Option<bool>) -> DiskHealth {
    // Temperature raw values carry min/max in the upper bytes on many drives: the low byte is
    // the current reading.
    let temperature = attribute(data, 194)
        .or_else(|| attribute(data, 190))
        .map(|raw| i32::from((raw & 0xff) as u8))
        .filter(|t| *t > 0);
    DiskHealth {
        source: SOURCE_ATA_SMART.into(),
        smart_passed: passed,
        temperature_celsius: temperature,
        // Low 32 bits: some drives keep minutes or milliseconds in the upper bytes.
        power_on_hours: attribute(data, 9).map(|raw| raw & 0xffff_ffff),
        reallocated_sectors: attribute(data, 5),
        pending_sectors: attribute(data, 197),
        uncorrectable_sectors: attribute(data, 198),
        ..DiskHealth::default()
    }
}

/// LOG SENSE of the Informational Exceptions page, cumulative values.
pub fn log_sense_cdb() -> [u8; 10] {
    let len = LOG_SENSE_BYTES as u16;
    let [hi, lo] = len.to_be_bytes();
    [0x4d, 0, 0x40 | 0x2f, 0, 0, 0, 0, hi, lo, 0]
}

/// A [`DiskHealth`] from an Informational Exceptions page; `None` when it is not that page or
/// has no general parameter (code 0000h).
pub fn parse_ie_page(page: &[u8]) -> Option<DiskHealth> {
    if page.first().map(|b| b & 0x3f) != Some(0x2f) {
        return None;
    }
    let len = usize::from(u16::from_be_bytes([*page.get(2)?, *page.get(3)?]));
    let params = page.get(4..(4 + len).min(page.len()))?;
    let mut at = 0;
    while at + 4 <= params.len() {
        let code = u16::from_be_bytes([params[at], params[at + 1]]);
        let plen = usize::from(params[at + 3]);
        if code == 0 {
            let p = params.get(at + 4..at + 4 + plen)?;
            let asc = *p.first()?;
            let temperature = p
                .get(2)
                .copied()
                .filter(|t| *t != 0xff && *t != 0)
                .map(i32::from);
            return Some(DiskHealth {
                source: SOURCE_SCSI_INFORMATIONAL_EXCEPTIONS.into(),
                smart_passed: Some(asc != 0x5d),
                temperature_celsius: temperature,
                ..DiskHealth::default()
            });
        }
        at += 4 + plen;
    }
    None
}

/// Why a disk has no health, as a note's message.
fn refused(name: &str, what: &str, r: &Reply) -> String {
    let key = r.sense.get(2).map(|k| k & 0x0f);
    format!(
        "{name}: {what} not answered (SCSI status {:#04x}, sense key {})",
        r.status,
        key.map_or("none".to_owned(), |k| format!("{k:#x}"))
    )
}

fn read_ata(root: &HostRoot, name: &str) -> Result<DiskHealth, String> {
    let status = sgio::command(root, name, &smart_cdb(0xda), 0).map_err(|e| e.to_string())?;
    let passed = smart_status(&status.sense);
    let data =
        sgio::command(root, name, &smart_cdb(0xd0), SMART_DATA_BYTES).map_err(|e| e.to_string())?;
    if data.status != 0 || data.data.len() < SMART_DATA_BYTES {
        return Err(refused(name, "SMART READ DATA", &data));
    }
    Ok(parse_smart_data(&data.data, passed))
}

fn read_scsi(root: &HostRoot, name: &str) -> Result<DiskHealth, String> {
    let r = sgio::command(root, name, &log_sense_cdb(), LOG_SENSE_BYTES)
        .map_err(|e: SgError| e.to_string())?;
    if r.status != 0 {
        return Err(refused(name, "LOG SENSE (Informational Exceptions)", &r));
    }
    parse_ie_page(&r.data)
        .ok_or_else(|| format!("{name}: no Informational Exceptions parameter in LOG SENSE"))
}

/// Fills `health` of every SCSI-attached disk (`/sys/block/<name>/device/vendor` exists) that
/// is not NVMe: ATA SMART for SATA, Informational Exceptions for the rest. Virtio and other
/// non-SCSI disks are left alone (no health protocol to ask).
pub fn fill_health(root: &HostRoot, disks: &mut [Disk], notes: &mut Vec<Note>) {
    for d in disks.iter_mut().filter(|d| !d.nvme && d.health.is_none()) {
        let Some(vendor) = root.read_trimmed(format!("/sys/block/{}/device/vendor", d.name)) else {
            continue;
        };
        let got = if vendor == "ATA" {
            read_ata(root, &d.name)
        } else {
            read_scsi(root, &d.name)
        };
        match got {
            Ok(h) => d.health = Some(h),
            Err(e) => note(notes, "disks", format!("health: {e}")),
        }
    }
}

#[cfg(test)]
#[path = "ata_smart_tests.rs"]
mod tests;
