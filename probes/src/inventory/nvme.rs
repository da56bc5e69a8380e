//! NVMe disk health: the SMART / Health Information log page of each controller, read with one
//! Get Log Page admin command through the kernel's passthrough ioctl, and parsed by
//! [`super::smart_log`].
//!
//! The command (`NVME_IOCTL_ADMIN_CMD`, `_IOWR('N', 0x41, struct nvme_admin_cmd)`, Linux
//! `include/uapi/linux/nvme_ioctl.h`) goes to the controller's character device `/dev/nvme<N>`
//! under the [`HostRoot`] (a container that mounts the host at `/host` reaches the host's
//! controllers). The kernel lets only `CAP_SYS_ADMIN` send Get Log Page (`nvme_cmd_allowed`), so
//! an inventory run as another user gets `EACCES`: a note, no health. No device node, something
//! else at its path (a fixture tree), an ioctl error or an NVMe error status: the same. Nothing
//! here fails the inventory.
//!
//! Bounded: one command per controller per inventory (namespaces of one controller share its
//! answer), each with a 5 s command timeout instead of the kernel's 60 s admin default.
//!
//! This module, [`super::ethtool`], [`super::ipmi`], [`super::sgio`] and [`crate::erase`] are
//! the crate's only `unsafe`; [`admin_command`] is also what `erase` sends NVMe Format with.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};

use bc_protocol::inventory::{Disk, DiskHealth, Note};
use nix::errno::Errno;

use super::note;
use super::smart_log::{self, PAGE_BYTES};
use crate::hostroot::HostRoot;

/// Admin opcode Get Log Page (NVM Express Base Specification 2.0, figure 138).
const OPC_GET_LOG_PAGE: u8 = 0x02;
/// Log identifier of the SMART / Health Information page (figure 202).
const LID_SMART: u32 = 0x02;
/// NSID "all namespaces": the controller as a whole, which every controller accepts for this
/// page (per-namespace pages are optional, Identify Controller LPA bit 0).
const NSID_ALL: u32 = 0xFFFF_FFFF;
/// Command timeout handed to the kernel, ms (0 would mean its admin default, 60 s).
const TIMEOUT_MS: u32 = 5_000;

/// Why a controller's health was not read; the message becomes a note.
#[derive(Debug, thiserror::Error)]
pub enum NvmeError {
    /// `{0}`: no device node (no `/dev`, or udev/devtmpfs did not create it).
    #[error("{0}: no device node")]
    NoDevice(String),
    /// The path holds something else than a character device (a fixture tree's file).
    #[error("{0}: not a character device")]
    NotCharDevice(String),
    /// Opening the node, or the ioctl, was refused: not root (no `CAP_SYS_ADMIN`).
    #[error("{0}: permission denied (Get Log Page needs root, CAP_SYS_ADMIN)")]
    Permission(String),
    /// Opening the node failed otherwise.
    #[error("{path}: open: {source}")]
    Open {
        path: String,
        source: std::io::Error,
    },
    /// The ioctl failed (`errno`).
    #[error("{path}: NVME_IOCTL_ADMIN_CMD: {errno}")]
    Ioctl { path: String, errno: Errno },
    /// The controller completed the command with an error status (Status Field, as the kernel
    /// returns it: status code type and status code).
    #[error("{path}: Get Log Page completed with NVMe status {status:#x}")]
    Status { path: String, status: i32 },
}

/// `struct nvme_passthru_cmd` (alias `nvme_admin_cmd`), `linux/nvme_ioctl.h`: 72 bytes.
#[repr(C)]
#[derive(Debug, Default)]
pub(crate) struct NvmeAdminCmd {
    pub(crate) opcode: u8,
    pub(crate) flags: u8,
    pub(crate) rsvd1: u16,
    pub(crate) nsid: u32,
    pub(crate) cdw2: u32,
    pub(crate) cdw3: u32,
    pub(crate) metadata: u64,
    pub(crate) addr: u64,
    pub(crate) metadata_len: u32,
    pub(crate) data_len: u32,
    pub(crate) cdw10: u32,
    pub(crate) cdw11: u32,
    pub(crate) cdw12: u32,
    pub(crate) cdw13: u32,
    pub(crate) cdw14: u32,
    pub(crate) cdw15: u32,
    pub(crate) timeout_ms: u32,
    pub(crate) result: u32,
}

/// The page buffer, page-aligned so that the kernel maps it for DMA without a bounce copy.
#[repr(C, align(4096))]
struct PageBuf([u8; PAGE_BYTES]);

nix::ioctl_readwrite!(nvme_ioctl_admin_cmd, b'N', 0x41, NvmeAdminCmd);

/// Command Dword 10 of Get Log Page for `bytes` of log `lid`: NUMDL (bits 31:16, number of
/// dwords, 0's based) and LID (bits 7:0); RAE and LSP 0, as nvme-cli's `smart-log` sends it.
pub fn get_log_page_cdw10(lid: u32, bytes: usize) -> u32 {
    let numd = u32::try_from(bytes / 4).unwrap_or(u32::MAX);
    (numd.saturating_sub(1) << 16) | (lid & 0xff)
}

/// The SMART / Health Information page of controller `ctrl` (`nvme0`), from `/dev/<ctrl>`.
pub fn read_smart_log(root: &HostRoot, ctrl: &str) -> Result<[u8; PAGE_BYTES], NvmeError> {
    let dev = format!("/dev/{ctrl}");
    let path = root.path(&dev);
    let shown = path.display().to_string();
    // O_NONBLOCK: a FIFO planted at the path must not hang the inventory in open(2).
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(&path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => NvmeError::NoDevice(shown.clone()),
            std::io::ErrorKind::PermissionDenied => NvmeError::Permission(shown.clone()),
            _ => NvmeError::Open {
                path: shown.clone(),
                source: e,
            },
        })?;
    let is_chr = file.metadata().map(|m| m.file_type().is_char_device());
    if !is_chr.unwrap_or(false) {
        return Err(NvmeError::NotCharDevice(shown));
    }
    let mut buf = PageBuf([0; PAGE_BYTES]);
    let cmd = NvmeAdminCmd {
        opcode: OPC_GET_LOG_PAGE,
        nsid: NSID_ALL,
        cdw10: get_log_page_cdw10(LID_SMART, PAGE_BYTES),
        timeout_ms: TIMEOUT_MS,
        ..NvmeAdminCmd::default()
    };
    match admin_command(&file, cmd, Some(&mut buf.0)) {
        Ok((0, _)) => Ok(buf.0),
        Ok((status, _)) => Err(NvmeError::Status {
            path: shown,
            status,
        }),
        Err(Errno::EACCES | Errno::EPERM) => Err(NvmeError::Permission(shown)),
        Err(errno) => Err(NvmeError::Ioctl { path: shown, errno }),
    }
}

/// Sends admin command `cmd` through `NVME_IOCTL_ADMIN_CMD` on `file` (a controller's character
/// device or a namespace's block device: the kernel's `nvme_ns_ioctl` passes admin commands on
/// to the controller), with `data` as its data buffer (the controller reads or writes at most its
/// length; `cmd.addr` and `cmd.data_len` are set from it, no metadata buffer). Returns the
/// ioctl's value (0, or the NVMe Status Field the command completed with: status code type
/// << 8 | status code, plus More and DNR bits) and the completion's Dword 0 (`result`).
pub(crate) fn admin_command(
    file: &std::fs::File,
    mut cmd: NvmeAdminCmd,
    data: Option<&mut [u8]>,
) -> Result<(i32, u32), Errno> {
    let (addr, len) = match data {
        Some(d) => (d.as_mut_ptr() as u64, u32::try_from(d.len()).unwrap_or(0)),
        None => (0, 0),
    };
    cmd.addr = addr;
    cmd.data_len = len;
    cmd.metadata = 0;
    cmd.metadata_len = 0;
    // SAFETY: `file` is open for the whole call; `cmd` is a valid `struct nvme_admin_cmd` (72
    // bytes, `repr(C)`, the size the request number encodes) whose `addr` is either null with
    // `data_len` 0 or points to `data`, a slice borrowed mutably for this call with `data_len`
    // (its length, or 0 when it does not fit a u32) writable bytes, and whose metadata pointer
    // is null with length 0. The kernel reads or writes at most `data_len` bytes there and
    // writes `result` in `cmd`; both outlive the call and nothing else touches them meanwhile.
    let res = unsafe { nvme_ioctl_admin_cmd(file.as_raw_fd(), &mut cmd) }?;
    Ok((res, cmd.result))
}

/// `nvme` followed by digits: a controller's name (`/sys/class/nvme/<name>`, `/dev/<name>`).
fn is_controller_name(s: &str) -> bool {
    s.strip_prefix("nvme")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The controller that answers for NVMe disk `name`: `device` of `/sys/block/<name>` when it is
/// a controller; for a native multipath head (`device` is `nvme-subsys<S>`), the first controller
/// of the subsystem, from the subsystem's directory, else from the hidden path devices
/// `nvme<S>c<C>n<N>` beside it (controller `nvme<C>`, the kernel's `nvme_mpath_set_disk_name`);
/// for a namespace only `/sys/class/nvme` lists, that controller.
pub fn controller_of(root: &HostRoot, name: &str) -> Option<String> {
    let base = format!("/sys/block/{name}");
    let dev = root.read_link_name(format!("{base}/device"));
    if let Some(d) = dev.as_deref().filter(|d| is_controller_name(d)) {
        return Some(d.to_owned());
    }
    let first = |mut v: Vec<String>| {
        v.retain(|c| is_controller_name(c));
        v.sort_by_key(|c| (c.len(), c.clone()));
        v.into_iter().next()
    };
    if dev.is_some_and(|d| d.starts_with("nvme-subsys")) {
        let listed = first(root.list_dir(format!("{base}/device")).unwrap_or_default());
        if listed.is_some() {
            return listed;
        }
    }
    if let Some((subsys, ns)) = name.strip_prefix("nvme").and_then(|r| r.split_once('n')) {
        let prefix = format!("nvme{subsys}c");
        let suffix = format!("n{ns}");
        let paths = root.list_dir("/sys/block").unwrap_or_default();
        let ctrls = paths
            .iter()
            .filter_map(|p| p.strip_prefix(&prefix)?.strip_suffix(&suffix))
            .map(|c| format!("nvme{c}"))
            .collect();
        if let Some(c) = first(ctrls) {
            return Some(c);
        }
    }
    let ctrls = root.list_dir("/sys/class/nvme").unwrap_or_default();
    first(
        ctrls
            .into_iter()
            .filter(|c| root.exists(format!("/sys/class/nvme/{c}/{name}")))
            .collect(),
    )
}

/// Fills `health` of every NVMe disk: one read per controller, shared by its namespaces. What
/// could not be read adds one note (source `disk-health`) naming each controller and why.
pub fn fill_health(root: &HostRoot, disks: &mut [Disk], notes: &mut Vec<Note>) {
    let mut read: BTreeMap<String, Option<DiskHealth>> = BTreeMap::new();
    let mut failed: Vec<String> = Vec::new();
    for disk in disks.iter_mut().filter(|d| d.nvme) {
        let Some(ctrl) = controller_of(root, &disk.name) else {
            failed.push(format!("{}: controller not found in sysfs", disk.name));
            continue;
        };
        let health = read.entry(ctrl).or_insert_with_key(|ctrl| {
            read_smart_log(root, ctrl)
                .map(|page| smart_log::parse(&page))
                .map_err(|e| failed.push(e.to_string()))
                .ok()
        });
        disk.health = health.clone();
    }
    if !failed.is_empty() {
        note(
            notes,
            "disk-health",
            format!("NVMe SMART log not read: {}", failed.join("; ")),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_is_the_one_nvme_cli_sends() {
        assert_eq!(std::mem::size_of::<NvmeAdminCmd>(), 72, "nvme_ioctl.h");
        // _IOWR('N', 0x41, 72 bytes): dir 3 << 30 | size << 16 | 'N' << 8 | 0x41.
        assert_eq!(
            nix::request_code_readwrite!(b'N', 0x41, std::mem::size_of::<NvmeAdminCmd>()),
            0xC048_4E41
        );
        // 512 bytes = 128 dwords, 0's based 127, log 02h.
        assert_eq!(get_log_page_cdw10(LID_SMART, PAGE_BYTES), 0x007F_0002);
    }

    #[test]
    fn no_device_node_or_a_plain_file_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let root = HostRoot::new(dir.path());
        assert!(matches!(
            read_smart_log(&root, "nvme0"),
            Err(NvmeError::NoDevice(_))
        ));
        std::fs::create_dir(dir.path().join("dev")).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(dir.path().join("dev/nvme0"), b"").unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(
            read_smart_log(&root, "nvme0"),
            Err(NvmeError::NotCharDevice(_))
        ));
        // A character device that is not an NVMe controller refuses the request.
        let null = read_smart_log(&HostRoot::new("/"), "../dev/null");
        assert!(
            matches!(
                null,
                Err(NvmeError::Ioctl {
                    errno: Errno::ENOTTY,
                    ..
                })
            ),
            "{null:?}"
        );
    }

    #[test]
    fn controller_names() {
        assert!(is_controller_name("nvme0") && is_controller_name("nvme12"));
        for n in ["nvme", "nvme0n1", "nvme-subsys0", "nvme0c0n1", "sda"] {
            assert!(!is_controller_name(n), "{n}");
        }
    }
}
