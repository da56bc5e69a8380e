//! Block-device ioctls (Linux `include/uapi/linux/fs.h`; the kernel side is `block/ioctl.c`):
//! re-reading the partition table and erasing a byte range by discard, secure discard or
//! zeroing. Every range is in bytes and must be aligned to the device's logical block size (the
//! kernel answers `EINVAL` otherwise); a whole device, `0..size` with `size` from
//! `/sys/block/<name>/size` × 512, always is.

use std::fs::File;
use std::os::fd::AsRawFd;

use nix::errno::Errno;

/// `BLKRRPART`, `_IO(0x12, 95)`.
const BLK_IOC: u8 = 0x12;
nix::ioctl_none!(blkrrpart, BLK_IOC, 95);
// `BLKDISCARD` `_IO(0x12,119)`, `BLKSECDISCARD` `_IO(0x12,125)`, `BLKZEROOUT` `_IO(0x12,127)`:
// numbered as taking no argument although each reads a `uint64_t[2]` {start, length}, hence the
// `_bad` forms with the request number spelled out.
nix::ioctl_write_ptr_bad!(blkdiscard, nix::request_code_none!(BLK_IOC, 119), [u64; 2]);
nix::ioctl_write_ptr_bad!(
    blksecdiscard,
    nix::request_code_none!(BLK_IOC, 125),
    [u64; 2]
);
nix::ioctl_write_ptr_bad!(blkzeroout, nix::request_code_none!(BLK_IOC, 127), [u64; 2]);

/// A block ioctl that failed: which, and the errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{ioctl}: {errno}")]
pub struct BlockIoctlError {
    /// `BLKRRPART`, `BLKDISCARD`, `BLKSECDISCARD` or `BLKZEROOUT`.
    pub ioctl: &'static str,
    /// What the kernel answered: `ENOTTY` (not a block device), `EOPNOTSUPP` (the device
    /// cannot), `EBUSY` (a partition is in use, for `BLKRRPART`), `EIO`, ...
    pub errno: Errno,
}

/// Asks the kernel to re-read the partition table of the whole disk `file` (`BLKRRPART`), so
/// that the partition devices of a table just erased disappear. `EBUSY`: a partition is
/// mounted or held; `EINVAL`: the device has no partitions to scan (a partition itself, a
/// loop device without `-P`).
pub fn reread_partitions(file: &File) -> Result<(), BlockIoctlError> {
    // SAFETY: `file` is open for the whole call and BLKRRPART takes no argument.
    unsafe { blkrrpart(file.as_raw_fd()) }
        .map(drop)
        .map_err(|errno| BlockIoctlError {
            ioctl: "BLKRRPART",
            errno,
        })
}

/// Discards bytes `start..start + len` (`BLKDISCARD`): the device may unmap them; what they
/// read as afterwards is the device's choice (zeroes, the old data, anything).
pub fn discard(file: &File, start: u64, len: u64) -> Result<(), BlockIoctlError> {
    let range = [start, len];
    // SAFETY: `file` is open for the whole call; the kernel reads the two u64 of `range`,
    // which outlives the call.
    unsafe { blkdiscard(file.as_raw_fd(), &range) }
        .map(drop)
        .map_err(|errno| BlockIoctlError {
            ioctl: "BLKDISCARD",
            errno,
        })
}

/// Securely discards bytes `start..start + len` (`BLKSECDISCARD`): the device erases them and
/// every copy it made of them (eMMC/UFS secure trim); most SATA, SAS and NVMe devices answer
/// `EOPNOTSUPP` (`/sys/block/<name>/queue/discard_max_bytes` says nothing about this one).
pub fn secure_discard(file: &File, start: u64, len: u64) -> Result<(), BlockIoctlError> {
    let range = [start, len];
    // SAFETY: as in `discard`.
    unsafe { blksecdiscard(file.as_raw_fd(), &range) }
        .map(drop)
        .map_err(|errno| BlockIoctlError {
            ioctl: "BLKSECDISCARD",
            errno,
        })
}

/// Zeroes bytes `start..start + len` (`BLKZEROOUT`): afterwards they read as zeroes. The kernel
/// uses the device's Write Zeroes / WRITE SAME when it has one
/// (`queue/write_zeroes_max_bytes` > 0), else writes zero pages; it never unmaps for this
/// ioctl (`BLKDEV_ZERO_NOUNMAP`). Blocks until done: hours on a large disk without offload.
pub fn zeroout(file: &File, start: u64, len: u64) -> Result<(), BlockIoctlError> {
    let range = [start, len];
    // SAFETY: as in `discard`.
    unsafe { blkzeroout(file.as_raw_fd(), &range) }
        .map(drop)
        .map_err(|errno| BlockIoctlError {
            ioctl: "BLKZEROOUT",
            errno,
        })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn request_numbers_are_the_kernels() {
        assert_eq!(nix::request_code_none!(BLK_IOC, 95), 0x125f, "BLKRRPART");
        assert_eq!(nix::request_code_none!(BLK_IOC, 119), 0x1277, "BLKDISCARD");
        assert_eq!(
            nix::request_code_none!(BLK_IOC, 125),
            0x127d,
            "BLKSECDISCARD"
        );
        assert_eq!(nix::request_code_none!(BLK_IOC, 127), 0x127f, "BLKZEROOUT");
    }

    #[test]
    fn a_regular_file_is_refused_with_enotty() {
        let f = tempfile::tempfile().unwrap();
        f.set_len(4096).unwrap();
        assert_eq!(reread_partitions(&f).unwrap_err().errno, Errno::ENOTTY);
        let e = zeroout(&f, 0, 4096).unwrap_err();
        assert_eq!((e.ioctl, e.errno), ("BLKZEROOUT", Errno::ENOTTY));
        assert_eq!(discard(&f, 0, 4096).unwrap_err().errno, Errno::ENOTTY);
        assert_eq!(
            secure_discard(&f, 0, 4096).unwrap_err().errno,
            Errno::ENOTTY
        );
    }
}
