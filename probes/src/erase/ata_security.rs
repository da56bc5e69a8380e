//! The ATA Security feature set's erase (ACS-4 §4.18, §7.36–§7.41), sent as ATA PASS-THROUGH
//! (16) (SAT-4 §12.2.2) through `SG_IO` ([`crate::inventory::sgio::send`]) on a SATA disk's
//! block device: IDENTIFY DEVICE (ECh) for the security state, SECURITY SET PASSWORD (F1h),
//! SECURITY ERASE PREPARE (F3h), SECURITY ERASE UNIT (F4h) and SECURITY DISABLE PASSWORD (F6h).
//!
//! The sequence and when it may start are the caller's (`bcd-ramdisk`'s `clean::ata`); this
//! module builds and sends each command. The user password set for the erase is [`PASSWORD`]:
//! a drive left with it set (power lost mid-erase) is unlocked with `hdparm --user-master u
//! --security-unlock bcd-erase` then `--security-disable bcd-erase`.

use std::fs::File;

use crate::inventory::sgio::{self, Data, Reply, SgError};

/// The user password set for the erase, zero-padded to 32 bytes in the command's data.
pub const PASSWORD: &[u8] = b"bcd-erase";
/// Bytes of IDENTIFY DEVICE data and of a security command's data block.
pub const BLOCK_BYTES: usize = 512;
/// Timeout of IDENTIFY DEVICE and the password commands, ms.
const SHORT_TIMEOUT_MS: u32 = 30_000;
/// Timeout of an erase whose time the drive does not report (or reports as more than 508
/// minutes), ms: 24 h.
const UNKNOWN_ERASE_MS: u32 = 86_400_000;

/// A security command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecurityCommand {
    /// SECURITY SET PASSWORD (F1h): the user password [`PASSWORD`], security level high.
    SetPassword,
    /// SECURITY ERASE PREPARE (F3h), which must come just before the erase.
    ErasePrepare,
    /// SECURITY ERASE UNIT (F4h) with the user password, enhanced (vendor-defined pattern over
    /// every block, reallocated ones included) or normal (zeroes over user data), waiting at
    /// most `timeout_ms`.
    EraseUnit { enhanced: bool, timeout_ms: u32 },
    /// SECURITY DISABLE PASSWORD (F6h) with the user password.
    DisablePassword,
}

impl SecurityCommand {
    /// The ATA command code.
    pub fn code(&self) -> u8 {
        match self {
            SecurityCommand::SetPassword => 0xf1,
            SecurityCommand::ErasePrepare => 0xf3,
            SecurityCommand::EraseUnit { .. } => 0xf4,
            SecurityCommand::DisablePassword => 0xf6,
        }
    }

    /// Its data block (ACS-4 tables 56, 59, 61): word 0 (identifier 0: user password; bit 1 of
    /// an ERASE UNIT: enhanced), words 1–16 the password; `None` for ERASE PREPARE (non-data).
    pub fn data(&self) -> Option<[u8; BLOCK_BYTES]> {
        let mut b = [0u8; BLOCK_BYTES];
        match self {
            SecurityCommand::ErasePrepare => return None,
            SecurityCommand::EraseUnit { enhanced, .. } => b[0] = u8::from(*enhanced) << 1,
            SecurityCommand::SetPassword | SecurityCommand::DisablePassword => {}
        }
        b[2..2 + PASSWORD.len()].copy_from_slice(PASSWORD);
        Some(b)
    }

    fn timeout_ms(&self) -> u32 {
        match self {
            SecurityCommand::EraseUnit { timeout_ms, .. } => *timeout_ms,
            _ => SHORT_TIMEOUT_MS,
        }
    }
}

/// The security state from IDENTIFY DEVICE data: word 82 bit 1 and word 128 (security status),
/// words 89 and 90 (erase times).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SecurityState {
    /// Word 82 bit 1 and word 128 bit 0: the Security feature set is supported.
    pub supported: bool,
    /// Word 128 bit 1: a user password is set.
    pub enabled: bool,
    /// Word 128 bit 2: locked (the password must be given first).
    pub locked: bool,
    /// Word 128 bit 3: frozen (SECURITY FREEZE LOCK, usually sent by the firmware at boot):
    /// every security command is aborted until the next power cycle.
    pub frozen: bool,
    /// Word 128 bit 4: too many wrong passwords were given.
    pub count_expired: bool,
    /// Word 128 bit 5: enhanced erase is supported.
    pub enhanced: bool,
    /// Words 89 (normal) and 90 (enhanced): the erase time the drive reports, minutes; `None`
    /// when not reported or "more than 508 minutes" (word value 255 in the short format).
    pub erase_minutes: Option<u32>,
    pub enhanced_erase_minutes: Option<u32>,
}

fn word(id: &[u8], n: usize) -> Option<u16> {
    Some(u16::from_le_bytes([*id.get(2 * n)?, *id.get(2 * n + 1)?]))
}

/// An erase time word (ACS-4 §7.12.7.48): bit 15 set, bits 14:0 in 2-minute units; else bits
/// 7:0, 255 meaning more than 508 minutes; 0 not reported.
fn erase_time(w: u16) -> Option<u32> {
    let units = if w & 0x8000 != 0 {
        u32::from(w & 0x7fff)
    } else {
        match w & 0xff {
            255 => return None,
            n => u32::from(n),
        }
    };
    (units > 0).then_some(units * 2)
}

impl SecurityState {
    /// Parses IDENTIFY DEVICE data (512 bytes; shorter data gives nothing).
    pub fn parse(id: &[u8]) -> Option<Self> {
        let (w82, w128) = (word(id, 82)?, word(id, 128)?);
        Some(Self {
            supported: w82 & 0x2 != 0 && w128 & 0x1 != 0,
            enabled: w128 & 0x2 != 0,
            locked: w128 & 0x4 != 0,
            frozen: w128 & 0x8 != 0,
            count_expired: w128 & 0x10 != 0,
            enhanced: w128 & 0x20 != 0,
            erase_minutes: erase_time(word(id, 89)?),
            enhanced_erase_minutes: erase_time(word(id, 90)?),
        })
    }

    /// What to wait for an erase, ms: twice the reported time plus 10 minutes, else 24 h.
    pub fn erase_timeout_ms(&self, enhanced: bool) -> u32 {
        let minutes = if enhanced {
            self.enhanced_erase_minutes
        } else {
            self.erase_minutes
        };
        minutes.map_or(UNKNOWN_ERASE_MS, |m| {
            m.saturating_mul(2)
                .saturating_add(10)
                .saturating_mul(60_000)
                .min(UNKNOWN_ERASE_MS)
        })
    }
}

/// ATA PASS-THROUGH (16) of `command` (`ECh` IDENTIFY DEVICE with one 512-byte PIO data-in
/// block, a security command with one PIO data-out block or none).
pub fn cdb(code: u8, data: Option<bool>) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x85;
    // PROTOCOL (bits 4:1): 4 PIO data-in, 5 PIO data-out, 3 non-data. Byte 2: T_DIR (bit 3, from
    // device), BYT_BLOK (bit 2: length in blocks), T_LENGTH (bits 1:0, 2: in SECTOR COUNT).
    (c[1], c[2]) = match data {
        Some(true) => (4 << 1, 0x0e),
        Some(false) => (5 << 1, 0x06),
        None => (3 << 1, 0x00),
    };
    c[6] = u8::from(data.is_some());
    c[14] = code;
    c
}

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum AtaSecurityError {
    /// `SG_IO` itself failed, or the transport did.
    #[error(transparent)]
    Sg(#[from] SgError),
    /// The drive (or the translation layer) answered CHECK CONDITION: the command was aborted.
    #[error("ATA command {code:#04x} refused (SCSI status {status:#04x}, sense key {key})")]
    Refused { code: u8, status: u8, key: String },
}

fn check(code: u8, r: Reply) -> Result<Reply, AtaSecurityError> {
    if r.status == 0 {
        return Ok(r);
    }
    // Fixed (70h/71h) sense has the key in byte 2, descriptor (72h/73h) in byte 1.
    let key = match r.sense.first().map(|b| b & 0x7f) {
        Some(0x72 | 0x73) => r.sense.get(1),
        _ => r.sense.get(2),
    };
    Err(AtaSecurityError::Refused {
        code,
        status: r.status,
        key: key.map_or("none".to_owned(), |k| format!("{:#x}", k & 0x0f)),
    })
}

/// IDENTIFY DEVICE of the SATA disk `file` (`shown` names it in errors), as its security state.
pub fn identify(file: &File, shown: &str) -> Result<SecurityState, AtaSecurityError> {
    let r = sgio::send(
        file,
        shown,
        &cdb(0xec, Some(true)),
        Data::In(BLOCK_BYTES),
        SHORT_TIMEOUT_MS,
    )?;
    let r = check(0xec, r)?;
    SecurityState::parse(&r.data).ok_or(AtaSecurityError::Refused {
        code: 0xec,
        status: 0,
        key: format!("short data ({} bytes)", r.data.len()),
    })
}

/// Sends `command` to the SATA disk `file`; blocks until the drive answers (an erase: hours).
pub fn send(file: &File, shown: &str, command: SecurityCommand) -> Result<(), AtaSecurityError> {
    let block = command.data();
    let (c, data) = match &block {
        Some(b) => (cdb(command.code(), Some(false)), Data::Out(b)),
        None => (cdb(command.code(), None), Data::None),
    };
    let r = sgio::send(file, shown, &c, data, command.timeout_ms())?;
    check(command.code(), r).map(drop)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn commands_as_hdparm_sends_them() {
        assert_eq!(
            cdb(0xec, Some(true)),
            [0x85, 0x08, 0x0e, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0xec, 0]
        );
        assert_eq!(
            cdb(0xf4, Some(false)),
            [0x85, 0x0a, 0x06, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0xf4, 0]
        );
        assert_eq!(cdb(0xf3, None)[1..3], [0x06, 0x00]);
        assert_eq!(cdb(0xf3, None)[6], 0);
        let erase = SecurityCommand::EraseUnit {
            enhanced: true,
            timeout_ms: 1,
        };
        let b = erase.data().unwrap();
        assert_eq!(b[0], 0x02, "enhanced, user password");
        assert_eq!(&b[2..11], b"bcd-erase");
        assert!(b[11..].iter().all(|&x| x == 0));
        assert_eq!(SecurityCommand::SetPassword.data().unwrap()[0], 0);
        assert!(SecurityCommand::ErasePrepare.data().is_none());
    }

    #[test]
    fn the_security_state_and_the_erase_time() {
        let mut id = [0u8; BLOCK_BYTES];
        id[164] = 0x02; // word 82 bit 1
        id[256] = 0x29; // word 128: supported, frozen, enhanced
        id[178] = 30; // word 89: 60 minutes
        id[180..182].copy_from_slice(&0x8001u16.to_le_bytes()); // word 90: 2 minutes
        let s = SecurityState::parse(&id).unwrap();
        assert!(s.supported && s.frozen && s.enhanced);
        assert!(!s.enabled && !s.locked && !s.count_expired);
        assert_eq!(
            (s.erase_minutes, s.enhanced_erase_minutes),
            (Some(60), Some(2))
        );
        assert_eq!(s.erase_timeout_ms(false), 130 * 60_000);
        assert_eq!(s.erase_timeout_ms(true), 14 * 60_000);
        id[178] = 255;
        let s = SecurityState::parse(&id).unwrap();
        assert_eq!(s.erase_minutes, None);
        assert_eq!(s.erase_timeout_ms(false), 86_400_000);
        id[164] = 0; // word 82 says no
        assert!(!SecurityState::parse(&id).unwrap().supported);
        assert!(SecurityState::parse(&id[..200]).is_none());
    }

    #[test]
    fn a_regular_file_refuses_sg_io() {
        let f = tempfile::tempfile().unwrap();
        assert!(identify(&f, "f").is_err());
        assert!(send(&f, "f", SecurityCommand::ErasePrepare).is_err());
    }
}
