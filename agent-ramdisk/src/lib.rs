//! bcd-ramdisk: the agent inside a PXE-booted ramdisk (`bcd ramdisk`), for the bare-metal
//! workflows (`inspecting`, `commissioning`, `deploying`, `releasing`).
//!
//! # Background
//! A bare-metal server enrolled through its BMC boots the ramdisk over the network; the ramdisk's
//! agent joins like a node agent, then does the work no installed OS can: inspection beyond what
//! the OS sees, burn-in, secure disk erase, writing the deployed image.
//!
//! # Design
//! The ramdisk is a mode of the session core (`bcd-core`) over the hardware probes
//! (`bcd-probes`), without the node agent: its `bcd_core::mode::Machine` reports the machine's
//! real SMBIOS, hardware key and inventory (`bcd_probes::{hwkey, inventory}`), serves
//! `diag.nvml` and `gpu.reset` through `bcd_probes::nvml`, `logs.collect` and `node.reboot`
//! through `bcd_core::ops` (with `reboot(2)`: there is no service manager), and keeps its
//! per-boot identity in memory (`bcd_core::identity::MemoryIdentity`), joining with the one-time
//! boot token from `/proc/cmdline` through `bcd_core::lifecycle::run`. This crate will own:
//! inspection extras (firmware versions, BMC identity), commissioning steps and burn-in (GPU,
//! memory, disk), disk erase (NVMe format/sanitize, ATA secure erase, overwrite as last resort),
//! image write with checksum, and the early-boot duties.
//!
//! It depends on `bc-protocol`, `bcd-core` and `bcd-probes`; never on the `bcd` binary crate or
//! on another mode (`bcd-site`). The binary wires it into `bcd ramdisk`.
//!
//! # Limitations
//! Nothing is implemented yet: `bcd ramdisk` refuses to start and says so.
#![forbid(unsafe_code)]

/// Why the ramdisk mode cannot run in this build.
pub const NOT_YET: &str =
    "ramdisk mode (inspection, burn-in, erase, image write) is not implemented in this build";
