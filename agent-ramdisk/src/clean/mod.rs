//! `disk.clean {mode: metadata|full}` (`bc_protocol::commands::clean`): erasing every disk of
//! the machine before it goes to the next tenant or is retired.
//!
//! # Design
//! - [`discover`]: the disks, from `/sys/block` under the [`HostRoot`] by the inventory's rule
//!   (`bcd_probes::inventory::disk_rule`: virtual, hidden, hardware partitions, drives for other
//!   media and empty slots are not disks, and are reported as left out), sorted by name, with
//!   size, serial, `ro`, discard support and partitions.
//! - [`metadata`]: always, first: the first and last MiB of the disk and of each partition
//!   zeroed, then `fsync`. The partitions are the kernel's (sysfs) and those of the GPT or MBR
//!   on the disk ([`table`]), which a kernel may not have parsed.
//! - [`full`]: mode `full`, next: NVMe Format NVM with secure erase falling back 2 → 1 → 0, or
//!   for a SATA disk an ATA security erase ([`ata`]); else secure discard, discard checked by
//!   reading back, zeroing last.
//! - In mode `full`, the metadata erase once more (a format may leave the old bytes); last,
//!   `BLKRRPART` so the kernel forgets the partitions; `EBUSY` or `EINVAL` from it is a
//!   step, not a failure (the table on the disk is gone either way).
//!
//! Each disk's device is `/dev/<name>` under the root, opened read-write with `O_EXCL` (the
//! kernel refuses with `EBUSY` a disk that is mounted, or part of an md/dm device, instead of
//! letting it be erased under its users). A disk whose `ro` is 1, or whose open answers
//! `EROFS`, is `readOnly` and nothing is written (so is one whose writes are refused with
//! `EROFS`/`EPERM`); any other failure makes it `failed` with what was being done and the
//! errno, and the next disk is still attempted. The command fails (`CLEAN_FAILED`) only when
//! `/sys/block` cannot be listed.
//!
//! # Limitations
//! No NVMe Sanitize or SCSI sanitize ([`full`]); the ATA security erase ([`ata`]) is built from
//! the standard and tested against a fake drive only (no SATA disk in the test beds). The disks
//! are erased one after another, not in parallel. `bytesErased` of a full erase is the disk's
//! size, whichever way it was erased. Every disk is erased, removable ones (a USB stick left in
//! the machine, a BMC's writable virtual media) included; only read-only ones are left, and the
//! devices the disk rule says are not disks (reported in `leftOut`). [`plan`] says what would
//! be done without writing (`bcd disk clean --dry-run`).

pub mod ata;
pub mod discover;
pub mod full;
pub mod metadata;
pub mod nvme;
pub mod plan;
pub mod table;

#[cfg(test)]
mod loop_tests;
#[cfg(test)]
mod tests;

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

use bc_protocol::commands::clean::{CleanMode, CleanResult, DiskClean, DiskOutcome, LeftOut};
use bcd_probes::erase::block::{self, BlockIoctlError};
use bcd_probes::erase::nvme_format::NvmeCommandError;
use bcd_probes::hostroot::HostRoot;
use nix::errno::Errno;

pub use full::Tools;

/// Why the command as a whole failed.
#[derive(Debug, thiserror::Error)]
pub enum CleanError {
    /// `/sys/block` could not be listed: no disk can be found.
    #[error("listing {path}: {source}")]
    ListDisks {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Why one disk was not cleaned; the message is its `error`.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// The kernel refuses writes: `ro` is 1, or `EROFS` on open.
    #[error("read-only: {0}")]
    ReadOnly(String),
    /// sysfs has no readable `size`.
    #[error("size unknown: /sys/block/{0}/size unreadable")]
    NoSize(String),
    /// The device node is not a block device or a regular file (a directory, ...).
    #[error("{0}: not a block device")]
    NotADevice(PathBuf),
    /// `EBUSY` on an exclusive open: mounted, or held by md/dm/another exclusive opener.
    #[error("{0}: in use (mounted, or held by md/dm): EBUSY")]
    InUse(PathBuf),
    /// The device node could not be opened (or looked at).
    #[error("opening {path}: {}", errno_of(source))]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Writing zeroes failed at `offset` (bytes).
    #[error("writing {what} at byte {offset}: {}", errno_of(source))]
    Write {
        what: String,
        offset: u64,
        source: std::io::Error,
    },
    /// Reading back after a discard failed at `offset` (bytes).
    #[error("reading back at byte {offset}: {}", errno_of(source))]
    Read { offset: u64, source: std::io::Error },
    /// `fsync` after writing failed: what was written may not be on the device.
    #[error("fsync: {}", errno_of(source))]
    Sync { source: std::io::Error },
    /// A block ioctl failed where nothing else could be tried.
    #[error("{0}")]
    Ioctl(BlockIoctlError),
    /// An ATA security erase failed once started.
    #[error("ATA security erase: {0}")]
    Ata(String),
    /// An NVMe command failed otherwise than by refusing the setting.
    #[error("NVMe {what}: {source}")]
    Nvme {
        what: String,
        source: NvmeCommandError,
    },
}

impl DiskError {
    /// True when the kernel refused to write at all: `ro` or `EROFS` on open, or `EROFS`/`EPERM`
    /// on a write (what a block device answers when it became read-only after being opened,
    /// `blkdev_write_iter`).
    pub fn is_read_only(&self) -> bool {
        match self {
            DiskError::ReadOnly(_) => true,
            DiskError::Write { source, .. } => matches!(
                source.raw_os_error().map(Errno::from_raw),
                Some(Errno::EROFS | Errno::EPERM)
            ),
            _ => false,
        }
    }
}

/// `EIO: I/O error` for an OS error, else the error's own words.
fn errno_of(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(n) => Errno::from_raw(n).to_string(),
        None => e.to_string(),
    }
}

/// `disk.clean`: every disk [`discover::list_disks`] finds, in `mode`; the devices it leaves
/// out are named in the result's `leftOut`.
pub fn clean(root: &HostRoot, mode: CleanMode) -> Result<CleanResult, CleanError> {
    let scan = discover::list_disks(root).map_err(|source| CleanError::ListDisks {
        path: root.path("/sys/block"),
        source,
    })?;
    if let Some(n) = scan.note() {
        tracing::info!("disk.clean: {n}");
    }
    let mut r = clean_disks(root, mode, &scan.disks, Tools::default());
    r.left_out = scan
        .left_out
        .into_iter()
        .map(|(name, why)| LeftOut {
            name,
            reason: why.to_string(),
        })
        .collect();
    Ok(r)
}

/// Cleans the disks named (whatever discovery would say of them), one after another.
pub fn clean_disks(
    root: &HostRoot,
    mode: CleanMode,
    names: &[String],
    tools: Tools,
) -> CleanResult {
    let t0 = Instant::now();
    let disks = names
        .iter()
        .map(|n| {
            let d = clean_one(root, mode, n, tools);
            match d.outcome {
                DiskOutcome::Cleaned => tracing::info!(
                    disk = %d.name, serial = ?d.serial, bytes = d.bytes_erased,
                    ms = d.duration_ms, steps = ?d.steps, "disk cleaned ({mode})"
                ),
                DiskOutcome::ReadOnly => {
                    tracing::warn!(disk = %d.name, error = ?d.error, "disk read-only, left as it is")
                }
                DiskOutcome::Failed => {
                    tracing::error!(disk = %d.name, error = ?d.error, steps = ?d.steps, "disk cleaning failed")
                }
            }
            d
        })
        .collect();
    CleanResult {
        mode,
        disks,
        left_out: Vec::new(),
        duration_ms: ms(t0),
    }
}

fn ms(t0: Instant) -> u64 {
    u64::try_from(t0.elapsed().as_millis()).unwrap_or(u64::MAX)
}

fn clean_one(root: &HostRoot, mode: CleanMode, name: &str, tools: Tools) -> DiskClean {
    let t0 = Instant::now();
    let info = discover::read_disk(root, name);
    let mut steps = Vec::new();
    let mut bytes = 0;
    let res = erase(root, mode, &info, tools, &mut steps, &mut bytes);
    let (outcome, error) = match res {
        Ok(()) => (DiskOutcome::Cleaned, None),
        Err(e) if e.is_read_only() => (DiskOutcome::ReadOnly, Some(e.to_string())),
        Err(e) => (DiskOutcome::Failed, Some(e.to_string())),
    };
    DiskClean {
        name: name.to_owned(),
        serial: info.serial,
        size_bytes: info.size_bytes.unwrap_or(0),
        outcome,
        steps,
        error,
        duration_ms: ms(t0),
        bytes_erased: bytes,
    }
}

fn erase(
    root: &HostRoot,
    mode: CleanMode,
    info: &discover::DiskInfo,
    tools: Tools,
    steps: &mut Vec<String>,
    bytes: &mut u64,
) -> Result<(), DiskError> {
    if info.read_only {
        return Err(DiskError::ReadOnly(format!(
            "/sys/block/{}/ro is 1",
            info.name
        )));
    }
    let size = info
        .size_bytes
        .ok_or_else(|| DiskError::NoSize(info.name.clone()))?;
    if size == 0 {
        // An empty card reader or virtual-media slot: no medium, and opening it would fail
        // with ENOMEDIUM.
        steps.push("nothing to erase (size 0: no medium)".to_owned());
        return Ok(());
    }
    let (file, target) = open(&root.path(format!("/dev/{}", info.name)))?;
    let mut parts = info.partitions.clone();
    for p in table::read(&file, size, info.logical_block_bytes) {
        if !parts
            .iter()
            .any(|k| (k.start_bytes, k.size_bytes) == (p.start_bytes, p.size_bytes))
        {
            parts.push(p);
        }
    }
    *bytes = metadata::erase(&file, &parts, size)?;
    steps.push(format!(
        "metadata ({} bytes: first and last MiB of the disk and of {} partition(s))",
        *bytes,
        parts.len()
    ));
    if mode == CleanMode::Full {
        *bytes = full::erase(&file, target, info, size, tools, steps)?;
        // An NVMe format with Secure Erase Setting 0 leaves what the blocks read as to the
        // drive; the places that name a former layout are zeroed again (milliseconds).
        metadata::erase(&file, &parts, size)?;
        steps.push("metadata (again, after the full erase)".to_owned());
    }
    match block::reread_partitions(&file) {
        Ok(()) => steps.push("rereadPartitions".to_owned()),
        Err(e) if target == full::Target::File => {
            steps.push(format!("rereadPartitions: not a block device ({})", e.errno));
        }
        Err(e) => steps.push(format!(
            "rereadPartitions: {} (the table on the disk is erased; the kernel keeps its old view until the next boot)",
            e.errno
        )),
    }
    Ok(())
}

/// Opens the device node read-write (read too: a discard is checked by reading back),
/// exclusively when it is a block device.
fn open(path: &Path) -> Result<(File, full::Target), DiskError> {
    let meta = std::fs::metadata(path).map_err(|source| DiskError::Open {
        path: path.to_owned(),
        source,
    })?;
    let target = if meta.file_type().is_block_device() {
        full::Target::Block
    } else if meta.is_file() {
        full::Target::File
    } else {
        return Err(DiskError::NotADevice(path.to_owned()));
    };
    // O_EXCL without O_CREAT is defined for block devices only.
    let flags = match target {
        full::Target::Block => nix::libc::O_EXCL | nix::libc::O_CLOEXEC,
        full::Target::File => nix::libc::O_CLOEXEC,
    };
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(flags)
        .open(path)
        .map_err(|source| match source.raw_os_error().map(Errno::from_raw) {
            Some(Errno::EROFS) => DiskError::ReadOnly(format!("{}: EROFS on open", path.display())),
            Some(Errno::EBUSY) => DiskError::InUse(path.to_owned()),
            _ => DiskError::Open {
                path: path.to_owned(),
                source,
            },
        })?;
    Ok((file, target))
}
