//! SCSI commands through the kernel's `SG_IO` ioctl on a disk's block device (Linux
//! `include/scsi/sg.h`, `struct sg_io_hdr`, interface `'S'`), for the health of SATA and SAS
//! disks ([`super::ata_smart`]): SATA disks behind libata or a SAS HBA answer ATA PASS-THROUGH
//! (16) (SAT-4 §12.2.2), SAS disks LOG SENSE (SPC-5 §6.7).
//!
//! [`command`] sends read-only commands only (SMART READ DATA, SMART RETURN STATUS, LOG SENSE),
//! each with a [`TIMEOUT_MS`] timeout; [`send`], on a device the caller opened, any command
//! with a data phase either way and its own timeout (`crate::erase::ata_security`). The kernel lets `SG_IO` on a block device through for read-only
//! opens only for commands it knows as safe; as root (`CAP_SYS_RAWIO`) all go through.

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};

use nix::errno::Errno;

use crate::hostroot::HostRoot;

/// Timeout of one command, ms (a sleeping disk spins up within it).
pub const TIMEOUT_MS: u32 = 10_000;
/// `SG_IO` (`include/scsi/sg.h`).
const SG_IO: u64 = 0x2285;
/// `SG_DXFER_NONE`, `SG_DXFER_TO_DEV` and `SG_DXFER_FROM_DEV`.
const DXFER_NONE: i32 = -1;
const DXFER_TO_DEV: i32 = -2;
const DXFER_FROM_DEV: i32 = -3;
/// Sense buffer, bytes (descriptor-format sense with an ATA Status Return descriptor is 22).
const SENSE_BYTES: usize = 32;

/// Why a command did not complete.
#[derive(Debug, thiserror::Error)]
pub enum SgError {
    #[error("{0}: no device node")]
    NoDevice(String),
    #[error("{0}: not a block device")]
    NotBlockDevice(String),
    #[error("{0}: permission denied (SG_IO needs root)")]
    Permission(String),
    #[error("{path}: open: {source}")]
    Open {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: SG_IO: {errno}")]
    Ioctl { path: String, errno: Errno },
    /// The transport or the HBA failed the command (`host_status`/`driver_status`).
    #[error("{path}: host status {host:#x}, driver status {driver:#x}")]
    Transport {
        path: String,
        host: u16,
        driver: u16,
    },
}

/// What came back: SCSI status (0 good, 2 CHECK CONDITION), the sense data, the data read.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u8,
    pub sense: Vec<u8>,
    pub data: Vec<u8>,
}

/// `struct sg_io_hdr`: 88 bytes on LP64.
#[repr(C)]
struct SgIoHdr {
    interface_id: i32,
    dxfer_direction: i32,
    cmd_len: u8,
    mx_sb_len: u8,
    iovec_count: u16,
    dxfer_len: u32,
    dxferp: *mut u8,
    cmdp: *const u8,
    sbp: *mut u8,
    timeout: u32,
    flags: u32,
    pack_id: i32,
    usr_ptr: *mut u8,
    status: u8,
    masked_status: u8,
    msg_status: u8,
    sb_len_wr: u8,
    host_status: u16,
    driver_status: u16,
    resid: i32,
    duration: u32,
    info: u32,
}

nix::ioctl_readwrite_bad!(sg_io, SG_IO, SgIoHdr);

/// Sends `cdb` to `/dev/<name>` under `root`, reading `data_len` bytes (0: no data phase).
/// Errors: see [`SgError`]; a CHECK CONDITION is a [`Reply`] with status 2, not an error (SMART
/// RETURN STATUS answers through it).
pub fn command(root: &HostRoot, name: &str, cdb: &[u8], data_len: usize) -> Result<Reply, SgError> {
    let path = root.path(format!("/dev/{name}"));
    let shown = path.display().to_string();
    // O_NONBLOCK: neither a FIFO planted at the path nor a tray-less drive may hang open(2).
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(&path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => SgError::NoDevice(shown.clone()),
            std::io::ErrorKind::PermissionDenied => SgError::Permission(shown.clone()),
            _ => SgError::Open {
                path: shown.clone(),
                source: e,
            },
        })?;
    let is_blk = file.metadata().map(|m| m.file_type().is_block_device());
    if !is_blk.unwrap_or(false) {
        return Err(SgError::NotBlockDevice(shown));
    }
    let data = if data_len == 0 {
        Data::None
    } else {
        Data::In(data_len)
    };
    send(&file, &shown, cdb, data, TIMEOUT_MS)
}

/// The data phase of a command.
#[derive(Debug, Clone, Copy)]
pub enum Data<'a> {
    /// None.
    None,
    /// From the device, at most this many bytes.
    In(usize),
    /// To the device, these bytes.
    Out(&'a [u8]),
}

/// Sends `cdb` on `file` (an open block device; `shown` names it in errors) with `data` as its
/// data phase, waiting at most `timeout_ms`. Errors and replies as for [`command`].
pub fn send(
    file: &std::fs::File,
    shown: &str,
    cdb: &[u8],
    data: Data<'_>,
    timeout_ms: u32,
) -> Result<Reply, SgError> {
    let (direction, mut buf) = match data {
        Data::None => (DXFER_NONE, Vec::new()),
        Data::In(n) => (DXFER_FROM_DEV, vec![0u8; n]),
        // A copy the kernel may read through a `*mut` without the caller's slice being aliased.
        Data::Out(b) => (DXFER_TO_DEV, b.to_vec()),
    };
    let data_len = buf.len();
    let mut sense = [0u8; SENSE_BYTES];
    let mut hdr = SgIoHdr {
        interface_id: i32::from(b'S'),
        dxfer_direction: direction,
        cmd_len: u8::try_from(cdb.len()).unwrap_or(u8::MAX),
        mx_sb_len: SENSE_BYTES as u8,
        iovec_count: 0,
        dxfer_len: u32::try_from(data_len).unwrap_or(0),
        dxferp: if data_len == 0 {
            std::ptr::null_mut()
        } else {
            buf.as_mut_ptr()
        },
        cmdp: cdb.as_ptr(),
        sbp: sense.as_mut_ptr(),
        timeout: timeout_ms,
        flags: 0,
        pack_id: 0,
        usr_ptr: std::ptr::null_mut(),
        status: 0,
        masked_status: 0,
        msg_status: 0,
        sb_len_wr: 0,
        host_status: 0,
        driver_status: 0,
        resid: 0,
        duration: 0,
        info: 0,
    };
    if cdb.len() > usize::from(u8::MAX) || u32::try_from(data_len).is_err() {
        return Err(SgError::Ioctl {
            path: shown.to_owned(),
            errno: Errno::EINVAL,
        });
    }
    // SAFETY: `file` is open for the whole call; `hdr` is a `struct sg_io_hdr` (`repr(C)`)
    // whose pointers name `cdb` (cmd_len bytes, checked above to fit), `sense` (mx_sb_len
    // bytes) and `buf` (dxfer_len bytes, or null with 0), all alive and unaliased until it
    // returns; the kernel reads or writes only within those lengths and writes into `hdr`.
    match unsafe { sg_io(file.as_raw_fd(), &mut hdr) } {
        Ok(_) => {}
        Err(Errno::EACCES | Errno::EPERM) => return Err(SgError::Permission(shown.to_owned())),
        Err(errno) => {
            return Err(SgError::Ioctl {
                path: shown.to_owned(),
                errno,
            });
        }
    }
    // DID_OK and no driver error other than DRIVER_SENSE (0x08: sense data is there).
    if hdr.host_status != 0 || (hdr.driver_status & !0x08) != 0 {
        return Err(SgError::Transport {
            path: shown.to_owned(),
            host: hdr.host_status,
            driver: hdr.driver_status,
        });
    }
    if direction == DXFER_FROM_DEV {
        let got = data_len.saturating_sub(usize::try_from(hdr.resid).unwrap_or(0));
        buf.truncate(got);
    } else {
        buf.clear();
    }
    Ok(Reply {
        status: hdr.status,
        sense: sense[..usize::from(hdr.sb_len_wr).min(SENSE_BYTES)].to_vec(),
        data: buf,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_has_the_kernels_layout() {
        assert_eq!(std::mem::size_of::<SgIoHdr>(), 88);
    }

    #[test]
    fn a_fixture_file_is_not_a_block_device() {
        let root = HostRoot::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../shared/fixtures/hosts/node-exporter"
        ));
        assert!(command(&root, "sda", &[0u8; 6], 0).is_err());
    }
}
