//! The ioctls that erase a disk, as small safe functions for the ramdisk's `disk.clean`
//! (`bcd-ramdisk`'s `clean` module decides what to send; this module only sends it).
//!
//! # Design
//! - [`block`]: the block layer's `BLKRRPART`, `BLKDISCARD`, `BLKSECDISCARD` and `BLKZEROOUT`
//!   (Linux `include/uapi/linux/fs.h`) on an open block device.
//! - [`nvme_format`]: NVMe Identify (Controller, Namespace) and Format NVM through the
//!   passthrough ioctl the inventory's SMART log already uses (`inventory::nvme`).
//! - [`ata_security`]: the ATA Security feature set's erase through ATA PASS-THROUGH (16) on
//!   `SG_IO` (`inventory::sgio`), no `unsafe` of its own.
//!
//! Each function takes an open [`std::fs::File`] and returns the kernel's errno (or the NVMe
//! status, or the SCSI status and sense key) as it came: the caller words the step. Nothing here opens a device or decides
//! whether to erase.
//!
//! # Limitations
//! No NVMe Sanitize and no SCSI SANITIZE / FORMAT UNIT: not built.

pub mod ata_security;
#[allow(unsafe_code)]
pub mod block;
#[allow(unsafe_code)]
pub mod nvme_format;
