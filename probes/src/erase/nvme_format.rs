//! NVMe Format NVM with a Secure Erase Setting, and the Identify data that choosing it needs
//! (NVM Express Base Specification 2.0: Identify 06h, figure 273 ff.; Format NVM 80h, figure
//! 301 ff.), sent on a namespace's block device (`/dev/nvme0n1`) through
//! `NVME_IOCTL_ADMIN_CMD` ([`crate::inventory::nvme::admin_command`]); the namespace's id comes
//! from `NVME_IOCTL_ID` (`_IO('N', 0x40)`, `linux/nvme_ioctl.h`).
//!
//! The format keeps the namespace as it is: same LBA format (Identify Namespace FLBAS, upper
//! bits included), same metadata setting and protection information (FLBAS bit 4, DPS), so
//! the disk's size and block size do not change; only the Secure Erase Setting is chosen.

use std::fs::File;
use std::os::fd::AsRawFd;

use nix::errno::Errno;

use crate::inventory::nvme::{NvmeAdminCmd, admin_command};

/// Admin opcode Identify.
const OPC_IDENTIFY: u8 = 0x06;
/// Admin opcode Format NVM.
const OPC_FORMAT_NVM: u8 = 0x80;
/// Identify CNS values: the namespace (00h) and the controller (01h).
const CNS_NAMESPACE: u32 = 0x00;
const CNS_CONTROLLER: u32 = 0x01;
/// Identify data, bytes.
const IDENTIFY_BYTES: usize = 4096;
/// What the kernel is told to wait for a Format NVM, ms: a user-data erase of a large drive
/// takes minutes; a crypto erase, seconds.
pub const FORMAT_TIMEOUT_MS: u32 = 3_600_000;
/// What the kernel is told to wait for an Identify, ms.
const IDENTIFY_TIMEOUT_MS: u32 = 5_000;

nix::ioctl_none!(nvme_ioctl_id, b'N', 0x40);

/// Secure Erase Settings of Format NVM (CDW10 bits 11:9).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum SecureErase {
    /// 0: no secure erase requested (what the data reads as afterwards is the drive's choice).
    None = 0,
    /// 1: user data erase.
    UserData = 1,
    /// 2: cryptographic erase (the media key is changed).
    Crypto = 2,
}

/// Why an NVMe command did not complete successfully.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NvmeCommandError {
    /// The ioctl itself failed: `ENOTTY` (not an NVMe device), `EACCES` (not root), ...
    #[error("NVME_IOCTL: {0}")]
    Ioctl(Errno),
    /// The controller completed the command with this Status Field (status code type << 8 |
    /// status code, with the DNR bit 0x4000 and More bit 0x2000 as the kernel returns them).
    #[error("NVMe status {0:#x}")]
    Status(i32),
}

impl NvmeCommandError {
    /// True when the drive refused the command's fields rather than failed it: Invalid Field in
    /// Command (generic 02h), Invalid Opcode (generic 01h), Invalid Format (command specific
    /// 0Ah, status code type 1): the answer of a drive that lacks the asked Secure Erase Setting.
    pub fn is_unsupported(&self) -> bool {
        matches!(self, NvmeCommandError::Status(s) if matches!(s & 0x7ff, 0x001 | 0x002 | 0x10a))
    }
}

/// From Identify Controller: what Format NVM can do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FormatCaps {
    /// OACS (bytes 257:256) bit 1: the controller supports Format NVM.
    pub format: bool,
    /// FNA (byte 524) bit 2: cryptographic erase is supported as part of a format.
    pub crypto_erase: bool,
    /// FNA bit 1: a secure erase erases every namespace of the controller, whatever NSID.
    pub erase_all_namespaces: bool,
}

/// From Identify Namespace: the namespace's current format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamespaceFormat {
    /// NSZE (bytes 7:0): size, logical blocks.
    pub blocks: u64,
    /// The LBA format in use: FLBAS (byte 26) bits 3:0, and bits 6:5 as bits 5:4.
    pub lbaf: u8,
    /// FLBAS bit 4: metadata is transferred at the end of each LBA (MSET 1).
    pub extended_metadata: bool,
    /// DPS (byte 29) bits 2:0: protection information type (0: none).
    pub pi_type: u8,
    /// DPS bit 3: protection information in the first eight bytes of metadata (PIL 1).
    pub pi_first: bool,
}

impl FormatCaps {
    /// Parses Identify Controller data (4096 bytes; shorter data gives nothing).
    pub fn parse(id: &[u8]) -> Option<Self> {
        let oacs = u16::from_le_bytes([*id.get(256)?, *id.get(257)?]);
        let fna = *id.get(524)?;
        Some(Self {
            format: oacs & 0x2 != 0,
            crypto_erase: fna & 0x4 != 0,
            erase_all_namespaces: fna & 0x2 != 0,
        })
    }
}

impl NamespaceFormat {
    /// Parses Identify Namespace data (4096 bytes; shorter data gives nothing).
    pub fn parse(id: &[u8]) -> Option<Self> {
        let nsze = u64::from_le_bytes(id.get(0..8)?.try_into().ok()?);
        let flbas = *id.get(26)?;
        let dps = *id.get(29)?;
        Some(Self {
            blocks: nsze,
            lbaf: (flbas & 0x0f) | ((flbas >> 1) & 0x30),
            extended_metadata: flbas & 0x10 != 0,
            pi_type: dps & 0x07,
            pi_first: dps & 0x08 != 0,
        })
    }

    /// Command Dword 10 of a Format NVM that keeps this format and asks for `ses`: LBAFL
    /// (3:0), MSET (4), PI (7:5), PIL (8), SES (11:9), LBAFU (13:12).
    pub fn format_cdw10(&self, ses: SecureErase) -> u32 {
        u32::from(self.lbaf & 0x0f)
            | u32::from(self.extended_metadata) << 4
            | u32::from(self.pi_type & 0x07) << 5
            | u32::from(self.pi_first) << 8
            | (ses as u32) << 9
            | u32::from((self.lbaf >> 4) & 0x03) << 12
    }
}

/// The namespace id of the namespace block device `file` (`NVME_IOCTL_ID`).
pub fn namespace_id(file: &File) -> Result<u32, NvmeCommandError> {
    // SAFETY: `file` is open for the whole call and NVME_IOCTL_ID takes no argument.
    let id = unsafe { nvme_ioctl_id(file.as_raw_fd()) }.map_err(NvmeCommandError::Ioctl)?;
    u32::try_from(id).map_err(|_| NvmeCommandError::Ioctl(Errno::EINVAL))
}

fn identify(file: &File, cns: u32, nsid: u32) -> Result<Vec<u8>, NvmeCommandError> {
    let mut buf = vec![0u8; IDENTIFY_BYTES];
    let cmd = NvmeAdminCmd {
        opcode: OPC_IDENTIFY,
        nsid,
        cdw10: cns,
        timeout_ms: IDENTIFY_TIMEOUT_MS,
        ..NvmeAdminCmd::default()
    };
    match admin_command(file, cmd, Some(&mut buf)) {
        Ok((0, _)) => Ok(buf),
        Ok((status, _)) => Err(NvmeCommandError::Status(status)),
        Err(errno) => Err(NvmeCommandError::Ioctl(errno)),
    }
}

/// Identify Controller (CNS 01h) of the controller behind `file`, as [`FormatCaps`].
pub fn format_caps(file: &File) -> Result<FormatCaps, NvmeCommandError> {
    let id = identify(file, CNS_CONTROLLER, 0)?;
    FormatCaps::parse(&id).ok_or(NvmeCommandError::Ioctl(Errno::EIO))
}

/// Identify Namespace (CNS 00h) of namespace `nsid`, as [`NamespaceFormat`].
pub fn namespace_format(file: &File, nsid: u32) -> Result<NamespaceFormat, NvmeCommandError> {
    let id = identify(file, CNS_NAMESPACE, nsid)?;
    NamespaceFormat::parse(&id).ok_or(NvmeCommandError::Ioctl(Errno::EIO))
}

/// Format NVM of namespace `nsid` keeping `format`, with Secure Erase Setting `ses`. Blocks
/// until the controller completes it (at most [`FORMAT_TIMEOUT_MS`]).
pub fn format_nvm(
    file: &File,
    nsid: u32,
    format: &NamespaceFormat,
    ses: SecureErase,
) -> Result<(), NvmeCommandError> {
    let cmd = NvmeAdminCmd {
        opcode: OPC_FORMAT_NVM,
        nsid,
        cdw10: format.format_cdw10(ses),
        timeout_ms: FORMAT_TIMEOUT_MS,
        ..NvmeAdminCmd::default()
    };
    match admin_command(file, cmd, None) {
        Ok((0, _)) => Ok(()),
        Ok((status, _)) => Err(NvmeCommandError::Status(status)),
        Err(errno) => Err(NvmeCommandError::Ioctl(errno)),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn identify_fields_and_the_format_dword() {
        let mut ctrl = vec![0u8; IDENTIFY_BYTES];
        ctrl[256] = 0x06; // OACS: format (bit 1) and firmware download (bit 2)
        ctrl[524] = 0x04; // FNA: crypto erase
        let caps = FormatCaps::parse(&ctrl).unwrap();
        assert!(caps.format && caps.crypto_erase && !caps.erase_all_namespaces);
        ctrl[256] = 0x04;
        ctrl[524] = 0x02;
        let caps = FormatCaps::parse(&ctrl).unwrap();
        assert!(!caps.format && !caps.crypto_erase && caps.erase_all_namespaces);

        let mut ns = vec![0u8; IDENTIFY_BYTES];
        ns[0..8].copy_from_slice(&1_953_525_168u64.to_le_bytes());
        ns[26] = 0x01; // LBA format 1 (4 KiB on many drives), no extended metadata
        let f = NamespaceFormat::parse(&ns).unwrap();
        assert_eq!((f.blocks, f.lbaf), (1_953_525_168, 1));
        assert_eq!(f.format_cdw10(SecureErase::Crypto), 0x401);
        assert_eq!(f.format_cdw10(SecureErase::UserData), 0x201);
        assert_eq!(f.format_cdw10(SecureErase::None), 0x001);
        // LBA format 18 (FLBAS bits 6:5 = 01b, bits 3:0 = 2), MSET, PI type 1 first.
        ns[26] = 0x20 | 0x10 | 0x02;
        ns[29] = 0x09;
        let f = NamespaceFormat::parse(&ns).unwrap();
        assert_eq!(f.lbaf, 18);
        assert_eq!(
            f.format_cdw10(SecureErase::Crypto),
            (1 << 12) | (2 << 9) | (1 << 8) | (1 << 5) | (1 << 4) | 2
        );
        assert!(FormatCaps::parse(&ctrl[..100]).is_none());
    }

    #[test]
    fn which_statuses_mean_not_supported() {
        for s in [0x2, 0x4002, 0x10a, 0x410a, 0x1] {
            assert!(NvmeCommandError::Status(s).is_unsupported(), "{s:#x}");
        }
        for s in [0x6, 0x4006, 0x280] {
            assert!(!NvmeCommandError::Status(s).is_unsupported(), "{s:#x}");
        }
        assert!(!NvmeCommandError::Ioctl(Errno::ENOTTY).is_unsupported());
    }

    #[test]
    fn a_regular_file_is_not_a_namespace() {
        let f = tempfile::tempfile().unwrap();
        assert_eq!(
            namespace_id(&f),
            Err(NvmeCommandError::Ioctl(Errno::ENOTTY))
        );
    }
}
