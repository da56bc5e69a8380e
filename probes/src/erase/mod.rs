//! The ioctls that erase a disk, as small safe functions for the ramdisk's `disk.clean`
//! (`bcd-ramdisk`'s `clean` module decides what to send; this module only sends it).
//!
//! # Design
//! - [`block`]: the block layer's `BLKRRPART`, `BLKDISCARD`, `BLKSECDISCARD` and `BLKZEROOUT`
//!   (Linux `include/uapi/linux/fs.h`) on an open block device.
//! - [`nvme_format`]: NVMe Identify (Controller, Namespace) and Format NVM through the
//!   passthrough ioctl the inventory's SMART log already uses (`inventory::nvme`).
//!
//! Each function takes an open [`std::fs::File`] and returns the kernel's errno (or the NVMe
//! status) as it came: the caller words the step. Nothing here opens a device or decides
//! whether to erase.
//!
//! # Limitations
//! No ATA pass-through (`SECURITY ERASE UNIT`) and no NVMe Sanitize: not built.

#[allow(unsafe_code)]
pub mod block;
#[allow(unsafe_code)]
pub mod nvme_format;
