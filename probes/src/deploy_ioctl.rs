//! The one block-device ioctl the ramdisk's `image.write` needs: `BLKRRPART` (Linux
//! `include/uapi/linux/fs.h`, `_IO(0x12, 95)`; the kernel side is `block/ioctl.c`), so the
//! partitions of the image just written (and of its config drive) appear as devices.
//!
//! Kept apart from the erase ioctls of `disk.clean` so the two can be merged without touching
//! each other's file; once both are in, this is the same call as theirs and can fold into it.

use std::fs::File;
use std::os::fd::AsRawFd;

use nix::errno::Errno;

nix::ioctl_none!(blkrrpart, 0x12, 95);

/// `BLKRRPART` failed: the errno the kernel answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("BLKRRPART: {errno}")]
pub struct RereadError {
    /// `ENOTTY`: not a block device; `EBUSY`: a partition is mounted or held; `EINVAL`: the
    /// device cannot be partitioned (a partition itself, a loop device without `-P`).
    pub errno: Errno,
}

/// Asks the kernel to re-read the partition table of the whole disk `file`.
pub fn reread_partition_table(file: &File) -> Result<(), RereadError> {
    // SAFETY: `file` is open for the whole call and BLKRRPART takes no argument.
    unsafe { blkrrpart(file.as_raw_fd()) }
        .map(drop)
        .map_err(|errno| RereadError { errno })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_regular_file_is_not_a_block_device() {
        let f = tempfile::tempfile().unwrap();
        assert_eq!(
            reread_partition_table(&f),
            Err(RereadError {
                errno: Errno::ENOTTY
            })
        );
    }
}
