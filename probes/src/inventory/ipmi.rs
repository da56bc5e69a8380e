//! In-band IPMI: one request to the BMC through the kernel's IPMI message handler
//! (`ipmi_devintf`'s `/dev/ipmi0`), and its response.
//!
//! The ABI is Linux `include/uapi/linux/ipmi.h`: `IPMICTL_SEND_COMMAND` (`_IOR('i', 13, struct
//! ipmi_req)`) addressed to the system interface (`IPMI_SYSTEM_INTERFACE_ADDR_TYPE`, channel
//! `IPMI_BMC_CHANNEL`), then `poll(2)` for the answer and `IPMICTL_RECEIVE_MSG_TRUNC`
//! (`_IOWR('i', 11, struct ipmi_recv)`). The first byte of a response is the completion code
//! (IPMI 2.0 §5.2). Each request waits at most [`TIMEOUT_MS`]: a BMC that hangs (it happens
//! while one reboots) costs one timeout per inventory, not a stuck agent.
//!
//! Used by [`super::bmc`]; no process is spawned (ipmitool is not needed on the host, nor in
//! the ramdisk).

use std::fs::{File, OpenOptions};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::FileTypeExt;

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::hostroot::HostRoot;

/// How long one request may wait for its response, ms. A BMC answers in tens of ms over KCS.
pub const TIMEOUT_MS: u16 = 3_000;
/// Device nodes the kernel's `ipmi_devintf` creates, in the order udev and devtmpfs name them.
pub const DEVICE_PATHS: [&str; 3] = ["/dev/ipmi0", "/dev/ipmi/0", "/dev/ipmidev/0"];

/// `IPMI_SYSTEM_INTERFACE_ADDR_TYPE`.
const SYSTEM_INTERFACE_ADDR_TYPE: i32 = 0x0c;
/// `IPMI_BMC_CHANNEL`: the BMC itself, not a channel behind it.
const BMC_CHANNEL: i16 = 0x0f;
/// `IPMI_RESPONSE_RECV_TYPE`: a response to our own request (not an event or a command).
const RESPONSE_RECV_TYPE: i32 = 1;
/// Receive buffer, bytes: the largest IPMI message (IPMB's 32, KCS/BT up to 255 + headers).
const RECV_BYTES: usize = 300;

/// Why an IPMI request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum IpmiError {
    /// No device node: no BMC, or `ipmi_si`/`ipmi_devintf` not loaded.
    #[error(
        "no IPMI device (/dev/ipmi0): no BMC, or the ipmi_si and ipmi_devintf modules are not loaded"
    )]
    NoDevice,
    /// Opening the device failed (`EACCES`: not root).
    #[error("{path}: open: {source}")]
    Open {
        path: String,
        source: std::io::Error,
    },
    /// The send ioctl failed.
    #[error("IPMICTL_SEND_COMMAND (netfn {netfn:#04x} cmd {cmd:#04x}): {errno}")]
    Send { netfn: u8, cmd: u8, errno: Errno },
    /// No response within [`TIMEOUT_MS`].
    #[error("netfn {netfn:#04x} cmd {cmd:#04x}: no response within {TIMEOUT_MS} ms")]
    Timeout { netfn: u8, cmd: u8 },
    /// `poll(2)` or the receive ioctl failed.
    #[error("IPMICTL_RECEIVE_MSG_TRUNC: {0}")]
    Receive(Errno),
    /// The BMC answered with a completion code other than 0 (IPMI 2.0 table 5-2: `0xc1`
    /// command not supported, `0xc9` parameter out of range, `0xcc` invalid data field, `0x80`
    /// parameter not supported for LAN configuration).
    #[error("netfn {netfn:#04x} cmd {cmd:#04x}: completion code {code:#04x}")]
    Completion { netfn: u8, cmd: u8, code: u8 },
    /// The response had no completion code byte.
    #[error("netfn {netfn:#04x} cmd {cmd:#04x}: empty response")]
    Empty { netfn: u8, cmd: u8 },
}

/// `struct ipmi_system_interface_addr`.
#[repr(C)]
struct SystemInterfaceAddr {
    addr_type: i32,
    channel: i16,
    lun: u8,
}

/// `struct ipmi_msg`.
#[repr(C)]
struct IpmiMsg {
    netfn: u8,
    cmd: u8,
    data_len: u16,
    data: *mut u8,
}

/// `struct ipmi_req`.
#[repr(C)]
struct IpmiReq {
    addr: *mut u8,
    addr_len: u32,
    msgid: std::ffi::c_long,
    msg: IpmiMsg,
}

/// `struct ipmi_recv`.
#[repr(C)]
struct IpmiRecv {
    recv_type: i32,
    addr: *mut u8,
    addr_len: u32,
    msgid: std::ffi::c_long,
    msg: IpmiMsg,
}

nix::ioctl_read!(ipmictl_send_command, b'i', 13, IpmiReq);
nix::ioctl_readwrite!(ipmictl_receive_msg_trunc, b'i', 11, IpmiRecv);

/// An open IPMI device; requests go one at a time.
#[derive(Debug)]
pub struct Ipmi {
    file: File,
    next_msgid: std::ffi::c_long,
}

impl Ipmi {
    /// Opens the first IPMI device node under `root` ([`DEVICE_PATHS`]). Errors:
    /// [`IpmiError::NoDevice`] when none is a character device, [`IpmiError::Open`].
    pub fn open(root: &HostRoot) -> Result<Ipmi, IpmiError> {
        for p in DEVICE_PATHS {
            let path = root.path(p);
            let is_char = std::fs::metadata(&path)
                .map(|m| m.file_type().is_char_device())
                .unwrap_or(false);
            if !is_char {
                continue;
            }
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(|source| IpmiError::Open {
                    path: path.display().to_string(),
                    source,
                })?;
            return Ok(Ipmi {
                file,
                next_msgid: 1,
            });
        }
        Err(IpmiError::NoDevice)
    }

    /// Sends `data` as `netfn`/`cmd` to the BMC and returns the response's data after the
    /// completion code. Errors: see [`IpmiError`]; a non-zero completion code is
    /// [`IpmiError::Completion`].
    pub fn request(&mut self, netfn: u8, cmd: u8, data: &[u8]) -> Result<Vec<u8>, IpmiError> {
        let msgid = self.next_msgid;
        self.next_msgid += 1;
        let mut addr = SystemInterfaceAddr {
            addr_type: SYSTEM_INTERFACE_ADDR_TYPE,
            channel: BMC_CHANNEL,
            lun: 0,
        };
        let mut body = data.to_vec();
        let mut req = IpmiReq {
            addr: (&mut addr as *mut SystemInterfaceAddr).cast(),
            addr_len: std::mem::size_of::<SystemInterfaceAddr>() as u32,
            msgid,
            msg: IpmiMsg {
                netfn,
                cmd,
                data_len: body.len() as u16,
                data: body.as_mut_ptr(),
            },
        };
        // SAFETY: `req` and what it points to (`addr`, `body`) live across the call and match
        // the kernel's `struct ipmi_req` layout; the kernel copies them before returning.
        unsafe { ipmictl_send_command(self.file.as_raw_fd(), &mut req) }
            .map_err(|errno| IpmiError::Send { netfn, cmd, errno })?;
        loop {
            let mut fds = [PollFd::new(self.file.as_fd(), PollFlags::POLLIN)];
            let ready =
                poll(&mut fds, PollTimeout::from(TIMEOUT_MS)).map_err(IpmiError::Receive)?;
            if ready == 0 {
                return Err(IpmiError::Timeout { netfn, cmd });
            }
            let mut raddr = [0u8; 32];
            let mut rbuf = [0u8; RECV_BYTES];
            let mut recv = IpmiRecv {
                recv_type: 0,
                addr: raddr.as_mut_ptr(),
                addr_len: raddr.len() as u32,
                msgid: 0,
                msg: IpmiMsg {
                    netfn: 0,
                    cmd: 0,
                    data_len: rbuf.len() as u16,
                    data: rbuf.as_mut_ptr(),
                },
            };
            // SAFETY: `recv` points at `raddr` and `rbuf`, both live and as long as the lengths
            // say; the kernel writes at most those lengths (TRUNC: a longer message is cut).
            match unsafe { ipmictl_receive_msg_trunc(self.file.as_raw_fd(), &mut recv) } {
                Ok(_) | Err(Errno::EMSGSIZE) => {}
                // Woken without a message for us (another reader took it): wait again.
                Err(Errno::EAGAIN) => continue,
                Err(e) => return Err(IpmiError::Receive(e)),
            }
            // Events and other requesters' answers share the device: skip them.
            if recv.recv_type != RESPONSE_RECV_TYPE || recv.msgid != msgid {
                continue;
            }
            let len = usize::from(recv.msg.data_len).min(rbuf.len());
            return response_data(netfn, cmd, &rbuf[..len]);
        }
    }
}

/// Splits a raw response into its completion code and data: the data when the code is 0.
pub fn response_data(netfn: u8, cmd: u8, raw: &[u8]) -> Result<Vec<u8>, IpmiError> {
    match raw.split_first() {
        None => Err(IpmiError::Empty { netfn, cmd }),
        Some((0, rest)) => Ok(rest.to_vec()),
        Some((&code, _)) => Err(IpmiError::Completion { netfn, cmd, code }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_structs_have_the_kernels_layout() {
        // x86_64 and aarch64 (LP64): ipmi_msg 16, ipmi_req 40, ipmi_recv 48 bytes.
        assert_eq!(std::mem::size_of::<IpmiMsg>(), 16);
        assert_eq!(std::mem::size_of::<IpmiReq>(), 40);
        assert_eq!(std::mem::size_of::<IpmiRecv>(), 48);
        assert_eq!(std::mem::size_of::<SystemInterfaceAddr>(), 8);
    }

    #[test]
    fn a_completion_code_other_than_zero_is_an_error_naming_it() {
        assert_eq!(
            response_data(6, 1, &[0, 0x20, 0x01]).ok(),
            Some(vec![0x20, 0x01])
        );
        let e = response_data(0x0c, 2, &[0x80]).err().map(|e| e.to_string());
        assert_eq!(
            e.as_deref(),
            Some("netfn 0x0c cmd 0x02: completion code 0x80")
        );
        assert!(matches!(
            response_data(6, 1, &[]),
            Err(IpmiError::Empty { .. })
        ));
    }

    #[test]
    fn a_fixture_tree_has_no_ipmi_device() {
        let root = HostRoot::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../shared/fixtures/hosts/node-exporter"
        ));
        assert!(matches!(Ipmi::open(&root), Err(IpmiError::NoDevice)));
    }
}
