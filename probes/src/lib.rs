//! bcd-probes: what bcd can learn about the machine it runs on, with no control plane in sight.
//!
//! # Background
//! The node agent reports inventory and health; the ramdisk inspects and commissions a bare-metal
//! machine before any OS is installed; both must tell machines apart by a hardware key that
//! survives junk firmware identifiers. They read the same sources — SMBIOS, sysfs, procfs, NVML —
//! so the reading lives here once, usable without the session core or any mode.
//!
//! # Design
//! - [`hostroot`]: every `/sys`, `/proc`, `/dev`, `/etc` path is resolved under a root prefix, so
//!   the same collectors run on the machine (`/`) and on fixture trees in tests.
//! - [`smbios`]: entry points and tables (sysfs or a `dmidecode --dump-bin` file), the facts the
//!   key and the inventory need.
//! - [`hwkey`]: the hardware key and its per-identifier digests (DESIGN.md "Hardware key").
//! - [`inventory`]: the inventory document (`bc_protocol::inventory`) from its collectors.
//! - [`erase`]: the ioctls that erase a disk (re-read partitions, discard, zero out, NVMe
//!   Format NVM), for the ramdisk's `disk.clean`.
//! - [`nvml`]: NVML through nvml-wrapper — GPU inventory, `diag.nvml`, `gpu.reset`, the XID watch
//!   (NVML events or `/dev/kmsg`); results are `bc_protocol::commands` types.
//! - Each of `hwkey`, `inventory` and `nvml` has a `cli` module: the flags and output of
//!   `bcd hardware-key`, `bcd inventory` and `bcd gpu …`. They sit beside what they print (their
//!   tests read the same fixtures), are the only users of clap here, and nothing else in the crate
//!   calls them; the binary only dispatches to them.
//!
//! Everything here blocks (file reads, NVML calls, `nvidia-smi`); async callers use
//! `spawn_blocking`.
//!
//! # Limitations
//! Depends on `bc-protocol` only, never on `bcd-core` (no session, no state dir, no journal) nor on
//! any mode crate or the `bcd` binary. `unsafe` is denied everywhere but the ioctl modules
//! (`inventory::{ethtool, ipmi, nvme, sgio}`, `erase::{block, nvme_format}`) and
//! `inventory::lldp::socket` (`bind` and `setsockopt` of an `AF_PACKET` socket), each call
//! documented there.
#![deny(unsafe_code)]

pub mod erase;
pub mod hostroot;
pub mod hwkey;
pub mod inventory;
pub mod nvml;
pub mod smbios;
