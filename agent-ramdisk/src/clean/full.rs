//! The full erase, after the metadata erase: every block of the disk.
//!
//! - An NVMe namespace: Format NVM keeping its LBA format, with Secure Erase Setting 2
//!   (crypto) when Identify Controller FNA bit 2 says it exists, else or when refused 1 (user
//!   data), then 0; a drive that refuses all three (or lacks Format NVM, OACS bit 1) falls
//!   through to the block path below ([`super::nvme`]). Setting 0 is what NVIDIA's scout cleanup ends with too:
//!   what the data reads as afterwards is the drive's choice (most deallocate, reading zeroes).
//! - A SATA disk (`device/vendor` is `ATA`): the ATA security erase of [`super::ata`] when the
//!   drive's state allows it.
//! - Any block device (SATA, SAS, virtio, loop, an NVMe drive that refused every format): when
//!   `queue/discard_max_bytes` > 0, `BLKSECDISCARD` of the whole device (done when it works);
//!   else `BLKDISCARD`, which guarantees nothing about what the blocks read as (the kernel's
//!   `discard_zeroes_data` is always 0 since Linux 4.12), so afterwards [`SAMPLES`] places
//!   spread over the disk are read back: all zeroes and the discard stands (the device returns
//!   zeroes for unmapped blocks, as ATA RZAT, NVMe DLFEAT or SCSI LBPRZ drives do), any other
//!   byte and the disk is zeroed. `BLKZEROOUT` of the whole device is the last resort.
//! - A regular file standing for a device (tests): written with zeroes.
//!
//! Not done: NVMe Sanitize, SCSI SANITIZE / FORMAT UNIT (a SAS disk is discarded or zeroed).

use std::fs::File;
use std::os::unix::fs::FileExt;

use bcd_probes::erase::block;

use super::discover::DiskInfo;
use super::{DiskError, metadata};

/// Places read back after a plain discard.
pub const SAMPLES: u64 = 64;
/// Bytes read at each place.
const SAMPLE_BYTES: usize = 4096;

/// How the disk behind the open file can be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A block device: ioctls.
    Block,
    /// A regular file standing for one: plain writes.
    File,
}

/// Which tools the full erase may use; all of them on a machine (tests turn some off to reach
/// the ones behind).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tools {
    /// NVMe Format NVM on an NVMe namespace.
    pub nvme_format: bool,
    /// ATA security erase on a SATA disk.
    pub ata_security: bool,
    /// `BLKSECDISCARD` and `BLKDISCARD`.
    pub discard: bool,
}

impl Default for Tools {
    fn default() -> Self {
        Self {
            nvme_format: true,
            ata_security: true,
            discard: true,
        }
    }
}

/// Erases every block of `disk` (`size` bytes) through `file`, recording each attempt in
/// `steps`; returns the bytes erased (the whole disk).
pub fn erase(
    file: &File,
    target: Target,
    disk: &DiskInfo,
    size: u64,
    tools: Tools,
    steps: &mut Vec<String>,
) -> Result<u64, DiskError> {
    if target == Target::File {
        metadata::zero(file, 0..size, "zero")?;
        file.sync_all()
            .map_err(|source| DiskError::Sync { source })?;
        steps.push("zero (written: not a block device)".to_owned());
        return Ok(size);
    }
    if tools.nvme_format
        && disk.is_nvme_namespace()
        && super::nvme::format(&mut super::nvme::IoctlNamespace { file }, steps)?
    {
        return Ok(size);
    }
    if tools.ata_security && disk.ata {
        let mut drive = super::ata::SgDrive {
            file,
            shown: format!("/dev/{}", disk.name),
        };
        if super::ata::secure_erase(&mut drive, steps)? {
            return Ok(size);
        }
    }
    if tools.discard && disk.discard_max_bytes > 0 && discard(file, size, steps)? {
        return Ok(size);
    }
    block::zeroout(file, 0, size).map_err(DiskError::Ioctl)?;
    steps.push("zero".to_owned());
    Ok(size)
}

/// Secure discard, else discard checked by reading back: `Ok(true)` when the disk is erased.
fn discard(file: &File, size: u64, steps: &mut Vec<String>) -> Result<bool, DiskError> {
    match block::secure_discard(file, 0, size) {
        Ok(()) => {
            steps.push("secureDiscard".to_owned());
            return Ok(true);
        }
        Err(e) => steps.push(format!("secureDiscard: {}", e.errno)),
    }
    if let Err(e) = block::discard(file, 0, size) {
        steps.push(format!("discard: {}", e.errno));
        return Ok(false);
    }
    match nonzero_sample(file, size)? {
        None => {
            steps.push(format!("discard (reads back zeroes at {SAMPLES} places)"));
            Ok(true)
        }
        Some(at) => {
            steps.push(format!("discard (byte {at} reads back non-zero: zeroing)"));
            Ok(false)
        }
    }
}

/// The offset of a sampled block that is not all zeroes, if any.
fn nonzero_sample(file: &File, size: u64) -> Result<Option<u64>, DiskError> {
    let block = SAMPLE_BYTES as u64;
    let blocks = size / block;
    if blocks == 0 {
        return Ok(None);
    }
    let mut buf = vec![0u8; SAMPLE_BYTES];
    for i in 0..SAMPLES {
        let at = (blocks - 1) * i / (SAMPLES - 1) * block;
        file.read_exact_at(&mut buf, at)
            .map_err(|source| DiskError::Read { offset: at, source })?;
        if buf.iter().any(|&b| b != 0) {
            return Ok(Some(at));
        }
    }
    Ok(None)
}
