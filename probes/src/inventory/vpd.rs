//! SCSI Vital Product Data pages as the kernel exports them (`/sys/class/scsi_device/*/device/
//! vpd_pg80`, `vpd_pg83`; kernel ABI `sysfs-bus-scsi`): the raw page, header included.
//!
//! Layout (SPC-5 §7.7): byte 1 is the page code, bytes 2-3 the page length (big-endian), the
//! page data follows. The file may hold more bytes than the page (the kernel keeps the buffer it
//! read into, devices pad), so only the announced length is read.

use crate::hostroot::clean_identifier_bytes;

/// The data of a VPD page: the bytes after the 4-byte header, as many as the page length says
/// (fewer when the file is shorter). `None` when the header itself is missing.
pub fn page_data(page: &[u8]) -> Option<&[u8]> {
    let len = usize::from(u16::from_be_bytes([*page.get(2)?, *page.get(3)?]));
    let data = page.get(4..)?;
    Some(&data[..len.min(data.len())])
}

/// Page 0x80, Unit Serial Number (SPC-5 §7.7.18): ASCII, padded with spaces (and, on some
/// devices, NULs), normalised by [`clean_identifier_bytes`].
pub fn unit_serial(page: &[u8]) -> Option<String> {
    if page.get(1) != Some(&0x80) {
        return None;
    }
    clean_identifier_bytes(page_data(page)?)
}

/// Designator types of page 0x83 (SPC-5 §7.7.6.1, table 567), in the order bcd prefers them
/// for a disk's world-wide name, as the kernel's `scsi_vpd_lun_id` does.
const NAA: u8 = 0x3;
const EUI64: u8 = 0x2;
const SCSI_NAME: u8 = 0x8;
const T10_VENDOR: u8 = 0x1;

/// Page 0x83, Device Identification (SPC-5 §7.7.6): the logical unit's name in the kernel's
/// `wwid` form — `naa.<hex>`, `eui.<hex>`, the SCSI name string as written, or `t10.<ascii>` —
/// from the designators associated with the logical unit (association 0). `None` when the page
/// has none bcd reads.
pub fn device_id(page: &[u8]) -> Option<String> {
    if page.get(1) != Some(&0x83) {
        return None;
    }
    let data = page_data(page)?;
    let mut found: Vec<(u8, String)> = Vec::new();
    let mut at = 0usize;
    // Each designation descriptor: code set (byte 0, low nibble), association (byte 1, bits
    // 5-4), designator type (byte 1, low nibble), length (byte 3), then the designator.
    while let Some(head) = data.get(at..at + 4) {
        let len = usize::from(head[3]);
        let Some(designator) = data.get(at + 4..at + 4 + len) else {
            break;
        };
        at += 4 + len;
        let (code_set, assoc, kind) = (head[0] & 0x0f, (head[1] >> 4) & 0x3, head[1] & 0x0f);
        if assoc != 0 || designator.is_empty() {
            continue;
        }
        let name = match kind {
            NAA | EUI64 if code_set == 1 => Some(format!(
                "{}.{}",
                if kind == NAA { "naa" } else { "eui" },
                hex::encode(designator)
            )),
            SCSI_NAME | T10_VENDOR if code_set != 1 => {
                clean_identifier_bytes(designator).map(|s| {
                    if kind == T10_VENDOR {
                        format!("t10.{s}")
                    } else {
                        s
                    }
                })
            }
            _ => None,
        };
        if let Some(n) = name {
            found.push((kind, n));
        }
    }
    [NAA, EUI64, SCSI_NAME, T10_VENDOR]
        .iter()
        .find_map(|k| found.iter().find(|(t, _)| t == k).map(|(_, n)| n.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_length_bounds_the_serial() {
        // 8 characters announced; what follows in the file is not part of the page.
        let mut p = vec![0x00, 0x80, 0x00, 0x0c];
        p.extend_from_slice(b"  ZC9X1\t\0\0\0\0");
        p.extend_from_slice(b"JUNKJUNK");
        assert_eq!(unit_serial(&p).as_deref(), Some("ZC9X1"));
        // A page longer than the file: what is there is read.
        let short = [0x00, 0x80, 0x00, 0x40, b'A', b'B', b'C', b'1'];
        assert_eq!(unit_serial(&short).as_deref(), Some("ABC1"));
        assert_eq!(unit_serial(&[0x00, 0x80]), None);
        assert_eq!(unit_serial(&[0x00, 0x83, 0x00, 0x02, b'A', b'B']), None);
        assert_eq!(unit_serial(&[0x00, 0x80, 0x00, 0x04, 0, 0, b' ', 0]), None);
    }

    #[test]
    fn device_identification_prefers_naa() {
        let mut p = vec![0x00, 0x83, 0x00, 0x00];
        // T10 vendor id (ASCII), then an NAA designator for the target port (association 1,
        // skipped), then the logical unit's NAA.
        p.extend_from_slice(&[0x02, 0x01, 0x00, 0x10]);
        p.extend_from_slice(b"SEAGATE ST4000\0\t");
        p.extend_from_slice(&[0x01, 0x13, 0x00, 0x08, 0x50, 0, 0, 0, 0, 0, 0, 1]);
        p.extend_from_slice(&[0x01, 0x03, 0x00, 0x08]);
        p.extend_from_slice(&[0x50, 0x00, 0xc5, 0x00, 0xa1, 0xb2, 0xc3, 0xd7]);
        let n = u16::try_from(p.len() - 4).unwrap_or(0);
        p[2..4].copy_from_slice(&n.to_be_bytes());
        assert_eq!(device_id(&p).as_deref(), Some("naa.5000c500a1b2c3d7"));
        // Without the NAA: the T10 vendor id, cleaned.
        p.truncate(4 + 4 + 16);
        p[2..4].copy_from_slice(&20u16.to_be_bytes());
        assert_eq!(device_id(&p).as_deref(), Some("t10.SEAGATE ST4000"));
        // Descriptors running past the page are ignored.
        assert_eq!(
            device_id(&[0x00, 0x83, 0x00, 0x06, 0x01, 0x03, 0x00, 0x08, 1, 2]),
            None
        );
    }
}
