//! SMBIOS entry points (DSP0134 §5.2): the 32-bit `_SM_` (2.1+) and the 64-bit `_SM3_` (3.0+)
//! forms. Parsed here rather than by smbios-lib because its parsers assume exact lengths and
//! panic on a short buffer; this one returns an error instead.

use super::SmbiosError;

/// What an entry point says about the structure table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryPoint {
    /// SMBIOS version, major and minor (`3.5` is `(3, 5)`).
    pub version: (u8, u8),
    /// Physical address of the table (in a `dmidecode --dump-bin` file: its file offset, 0x20).
    pub table_address: u64,
    /// Table length in bytes (`_SM_`: exact; `_SM3_`: a maximum).
    pub table_len: usize,
    /// False when the entry point's checksum does not add up (reported, not fatal).
    pub checksum_ok: bool,
}

/// Anchor of the 64-bit entry point.
pub const SM3_ANCHOR: &[u8] = b"_SM3_";
/// Anchor of the 32-bit entry point.
pub const SM_ANCHOR: &[u8] = b"_SM_";

fn le_u16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn le_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn le_u64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

fn checksum_ok(b: &[u8], len: usize) -> bool {
    b.get(..len)
        .is_some_and(|s| s.iter().fold(0u8, |a, x| a.wrapping_add(*x)) == 0)
}

/// True when `bytes` starts with an entry point anchor.
pub fn has_anchor(bytes: &[u8]) -> bool {
    bytes.starts_with(SM3_ANCHOR) || bytes.starts_with(SM_ANCHOR)
}

/// Parses an entry point at the start of `bytes`.
pub fn parse(bytes: &[u8]) -> Result<EntryPoint, SmbiosError> {
    let short =
        || SmbiosError::BadEntryPoint(format!("entry point truncated at {} bytes", bytes.len()));
    if bytes.starts_with(SM3_ANCHOR) {
        // 0x06 length, 0x07 major, 0x08 minor, 0x0C u32 max table size, 0x10 u64 table address.
        let len = usize::from(*bytes.get(6).ok_or_else(short)?);
        Ok(EntryPoint {
            version: (
                *bytes.get(7).ok_or_else(short)?,
                *bytes.get(8).ok_or_else(short)?,
            ),
            table_len: le_u32(bytes, 0x0C).ok_or_else(short)? as usize,
            table_address: le_u64(bytes, 0x10).ok_or_else(short)?,
            checksum_ok: checksum_ok(bytes, len),
        })
    } else if bytes.starts_with(SM_ANCHOR) {
        // 0x05 length, 0x06 major, 0x07 minor, 0x10 `_DMI_`, 0x16 u16 table length,
        // 0x18 u32 table address.
        let len = usize::from(*bytes.get(5).ok_or_else(short)?);
        if bytes.get(0x10..0x15) != Some(b"_DMI_".as_slice()) {
            return Err(SmbiosError::BadEntryPoint(
                "_SM_ entry point without its _DMI_ intermediate anchor".into(),
            ));
        }
        Ok(EntryPoint {
            version: (
                *bytes.get(6).ok_or_else(short)?,
                *bytes.get(7).ok_or_else(short)?,
            ),
            table_len: usize::from(le_u16(bytes, 0x16).ok_or_else(short)?),
            table_address: u64::from(le_u32(bytes, 0x18).ok_or_else(short)?),
            checksum_ok: checksum_ok(bytes, len)
                && checksum_ok(&bytes[0x10.min(bytes.len())..], 0x0F),
        })
    } else {
        Err(SmbiosError::BadEntryPoint(
            "no _SM_ or _SM3_ anchor at offset 0".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_checksum(mut ep: Vec<u8>, at: usize, len: usize) -> Vec<u8> {
        let sum = ep[..len].iter().fold(0u8, |a, x| a.wrapping_add(*x));
        ep[at] = ep[at].wrapping_sub(sum);
        ep
    }

    #[test]
    fn parses_a_64_bit_entry_point() -> Result<(), SmbiosError> {
        let mut ep = vec![0u8; 0x18];
        ep[..5].copy_from_slice(b"_SM3_");
        ep[6] = 0x18;
        ep[7] = 3;
        ep[8] = 5;
        ep[0x0C..0x10].copy_from_slice(&0x16b1u32.to_le_bytes());
        ep[0x10..0x18].copy_from_slice(&0x20u64.to_le_bytes());
        let ep = with_checksum(ep, 5, 0x18);
        let p = parse(&ep)?;
        assert_eq!(p.version, (3, 5));
        assert_eq!(p.table_len, 0x16b1);
        assert_eq!(p.table_address, 0x20);
        assert!(p.checksum_ok);
        Ok(())
    }

    #[test]
    fn parses_a_32_bit_entry_point() -> Result<(), SmbiosError> {
        let mut ep = vec![0u8; 0x1F];
        ep[..4].copy_from_slice(b"_SM_");
        ep[5] = 0x1F;
        ep[6] = 2;
        ep[7] = 7;
        ep[0x10..0x15].copy_from_slice(b"_DMI_");
        ep[0x16..0x18].copy_from_slice(&1234u16.to_le_bytes());
        ep[0x18..0x1C].copy_from_slice(&0x20u32.to_le_bytes());
        // Intermediate checksum first (0x10..0x1F), then the whole.
        let isum = ep[0x10..0x1F].iter().fold(0u8, |a, x| a.wrapping_add(*x));
        ep[0x15] = ep[0x15].wrapping_sub(isum);
        let ep = with_checksum(ep, 4, 0x1F);
        let p = parse(&ep)?;
        assert_eq!(p.version, (2, 7));
        assert_eq!(p.table_len, 1234);
        assert_eq!(p.table_address, 0x20);
        assert!(p.checksum_ok);
        Ok(())
    }

    #[test]
    fn short_or_foreign_input_is_an_error() {
        assert!(parse(b"_SM3_").is_err());
        assert!(parse(b"_SM_\x00\x1f\x02").is_err());
        assert!(parse(b"garbage").is_err());
        assert!(parse(&[]).is_err());
    }
}
