//! bcd-ramdisk: the agent inside a PXE-booted ramdisk (`bcd ramdisk`), for the bare-metal
//! workflows (`inspecting`, `commissioning`, `deploying`, `releasing`).
//!
//! # Background
//! A bare-metal server enrolled through its BMC boots the ramdisk over the network; the ramdisk's
//! agent joins like a node agent, then does the work no installed OS can: inspection beyond what
//! the OS sees, burn-in, secure disk erase, writing the deployed image.
//!
//! # Design
//! This crate will own: inspection extras (firmware versions, BMC identity), burn-in (GPU, memory,
//! disk), disk erase (NVMe format/sanitize, ATA secure erase, overwrite as last resort), image
//! write with checksum, and the early-boot duties (reboot(2) instead of systemd). It depends on
//! `bc-protocol` only; the daemon wires it into `bcd ramdisk`.
//!
//! # Limitations
//! Nothing is implemented yet: `bcd ramdisk` refuses to start and says so.
#![forbid(unsafe_code)]

/// Why the ramdisk mode cannot run in this build.
pub const NOT_YET: &str =
    "ramdisk mode (inspection, burn-in, erase, image write) is not implemented in this build";
