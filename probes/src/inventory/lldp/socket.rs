//! One interface's LLDP socket: `socket(AF_PACKET, SOCK_RAW, 0)` (packet(7)), bound to the
//! interface and to EtherType 0x88CC, member of the nearest-bridge group `01:80:c2:00:00:0e`
//! (`PACKET_ADD_MEMBERSHIP` with `PACKET_MR_MULTICAST`, `linux/if_packet.h`) so that a NIC
//! filtering multicast passes LLDPDUs up.
//!
//! Opening needs `CAP_NET_RAW` in the network namespace: without it the kernel answers EPERM,
//! reported as [`LldpSocketError::Permission`] for the caller to log and go on without LLDP.
//!
//! With the other ioctl modules, one of the crate's `unsafe` places: `bind(2)` with a
//! `struct sockaddr_ll` (through nix's [`SockaddrLike::from_raw`]) and one `setsockopt(2)`; the
//! socket itself, `poll(2)` and `recvfrom(2)` are nix's safe calls.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use nix::errno::Errno;
use nix::libc;
use nix::sys::socket::{
    AddressFamily, LinkAddr, SockFlag, SockType, SockaddrLike, bind, recvfrom, socket,
};

use super::parse::ETH_P_LLDP;

/// The nearest-bridge group address LLDPDUs are sent to (IEEE 802.1AB-2016 Table 7-1).
pub const NEAREST_BRIDGE: [u8; 6] = [0x01, 0x80, 0xc2, 0x00, 0x00, 0x0e];
/// `SOL_PACKET` (`linux/socket.h`).
const SOL_PACKET: libc::c_int = 263;
/// `PACKET_ADD_MEMBERSHIP` (`linux/if_packet.h`).
const PACKET_ADD_MEMBERSHIP: libc::c_int = 1;
/// `PACKET_MR_MULTICAST` (`linux/if_packet.h`).
const PACKET_MR_MULTICAST: libc::c_ushort = 0;
/// `PACKET_OUTGOING` (`linux/if_packet.h`): a frame this host sent, looped back to the socket.
const PACKET_OUTGOING: u8 = 4;
/// The largest frame read: a standard Ethernet frame with a VLAN tag; an LLDPDU fits in one.
pub const MAX_FRAME: usize = 1522;

/// `struct packet_mreq` (`linux/if_packet.h`).
#[repr(C)]
struct PacketMreq {
    mr_ifindex: libc::c_int,
    mr_type: libc::c_ushort,
    mr_alen: libc::c_ushort,
    mr_address: [u8; 8],
}

/// Why an interface cannot be listened on.
#[derive(Debug, thiserror::Error)]
pub enum LldpSocketError {
    /// No `CAP_NET_RAW` (EPERM or EACCES from `socket(AF_PACKET, …)`).
    #[error(
        "cannot open an AF_PACKET socket for {iface}: {errno} (LLDP needs CAP_NET_RAW; run as root or grant the capability)"
    )]
    Permission {
        /// The interface.
        iface: String,
        /// What the kernel answered.
        errno: Errno,
    },
    /// The interface does not exist (any more) in this network namespace.
    #[error("no interface {iface}: {errno}")]
    NoInterface {
        /// The interface.
        iface: String,
        /// What `if_nametoindex(3)` answered.
        errno: Errno,
    },
    /// Another step failed.
    #[error("LLDP socket on {iface}: {op}: {errno}")]
    Os {
        /// The interface.
        iface: String,
        /// The call that failed (`socket`, `bind`, `PACKET_ADD_MEMBERSHIP`, `recvfrom`).
        op: &'static str,
        /// What the kernel answered.
        errno: Errno,
    },
}

impl LldpSocketError {
    /// True when this is the missing capability, the same for every interface.
    pub fn is_permission(&self) -> bool {
        matches!(self, Self::Permission { .. })
    }
}

/// An open LLDP socket on one interface (non-blocking; wait with `poll(2)` on [`AsFd`]).
#[derive(Debug)]
pub struct LldpSocket {
    /// The interface's name.
    pub iface: String,
    fd: OwnedFd,
}

impl LldpSocket {
    /// Opens, binds and joins the nearest-bridge group on `iface`.
    pub fn open(iface: &str) -> Result<Self, LldpSocketError> {
        let os = |op, errno| LldpSocketError::Os {
            iface: iface.to_owned(),
            op,
            errno,
        };
        let ifindex =
            nix::net::if_::if_nametoindex(iface).map_err(|errno| LldpSocketError::NoInterface {
                iface: iface.to_owned(),
                errno,
            })?;
        let ifindex =
            libc::c_int::try_from(ifindex).map_err(|_| os("if_nametoindex", Errno::ERANGE))?;
        // Protocol 0: no frame is queued before bind() names the EtherType and the interface.
        let fd = socket(
            AddressFamily::Packet,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            None,
        )
        .map_err(|errno| match errno {
            Errno::EPERM | Errno::EACCES => LldpSocketError::Permission {
                iface: iface.to_owned(),
                errno,
            },
            e => os("socket", e),
        })?;
        // SAFETY: `sockaddr_ll` is plain old data; all-zero is a valid value of it.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as libc::c_ushort;
        sll.sll_protocol = ETH_P_LLDP.to_be();
        sll.sll_ifindex = ifindex;
        let len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        // SAFETY: the pointer is to a live, initialised `sockaddr_ll` of `len` bytes whose family
        // is AF_PACKET, which is what `LinkAddr::from_raw` reads (it copies it).
        let addr = unsafe {
            LinkAddr::from_raw(std::ptr::from_ref(&sll).cast::<libc::sockaddr>(), Some(len))
        }
        .ok_or_else(|| os("bind", Errno::EINVAL))?;
        bind(fd.as_raw_fd(), &addr).map_err(|e| os("bind", e))?;
        let mut mreq = PacketMreq {
            mr_ifindex: ifindex,
            mr_type: PACKET_MR_MULTICAST,
            mr_alen: NEAREST_BRIDGE.len() as libc::c_ushort,
            mr_address: [0; 8],
        };
        mreq.mr_address[..6].copy_from_slice(&NEAREST_BRIDGE);
        // SAFETY: `fd` is an open packet socket; the option value points to a `repr(C)` copy of
        // `struct packet_mreq` that lives across the call, with its exact size as the length.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                SOL_PACKET,
                PACKET_ADD_MEMBERSHIP,
                std::ptr::from_ref(&mreq).cast::<libc::c_void>(),
                std::mem::size_of::<PacketMreq>() as libc::socklen_t,
            )
        };
        Errno::result(rc).map_err(|e| os("PACKET_ADD_MEMBERSHIP", e))?;
        Ok(Self {
            iface: iface.to_owned(),
            fd,
        })
    }

    /// The next frame another host sent, into `buf`: its length; `None` when none is queued
    /// (EAGAIN). Frames this host sent (`PACKET_OUTGOING`) are skipped.
    pub fn recv(&self, buf: &mut [u8]) -> Result<Option<usize>, LldpSocketError> {
        loop {
            match recvfrom::<LinkAddr>(self.fd.as_raw_fd(), buf) {
                Ok((_, Some(from))) if from.pkttype() == PACKET_OUTGOING => {}
                Ok((n, _)) => return Ok(Some(n)),
                Err(Errno::EAGAIN) => return Ok(None),
                Err(Errno::EINTR) => {}
                Err(errno) => {
                    return Err(LldpSocketError::Os {
                        iface: self.iface.clone(),
                        op: "recvfrom",
                        errno,
                    });
                }
            }
        }
    }
}

impl AsFd for LldpSocket {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
