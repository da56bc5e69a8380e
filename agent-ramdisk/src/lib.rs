//! bcd-ramdisk: the agent inside a PXE-booted ramdisk (`bcd ramdisk`), for the bare-metal
//! workflows (`inspecting`, `commissioning`, `deploying`, `releasing`, `rescue`).
//!
//! # Background
//! A bare-metal server enrolled through its BMC boots the ramdisk over the network; the ramdisk's
//! agent joins like a node agent, then does the work no installed OS can: inspection beyond what
//! the OS sees, burn-in, secure disk erase, writing the deployed image. The site agent's iPXE
//! script boots it with `bcd.url`, `bcd.pin`, `bcd.token` and `bcd.node` on the kernel command
//! line (docs/bare-metal.md); the image is built by `packaging/ramdisk/build.sh`.
//!
//! # Design
//! The ramdisk is a mode of the session core (`bcd-core`) over the hardware probes
//! (`bcd-probes`), without the node agent:
//! - [`cmdline`]: the settings from `/proc/cmdline`, split by the kernel's quoting rules.
//! - [`deploy`]: `image.write` — the image streamed over HTTP(S) onto the root disk chosen by
//!   the hints (else the smallest that fits) through one 4 MiB buffer, hashed as served,
//!   gunzipped or unzstd'ed on the way, both ends of the disk zeroed on any failure after the
//!   first write; then a NoCloud config drive (a GPT partition, vfat `cidata`).
//! - [`setup`]: early boot — drivers (`modprobe`), the NICs in `/sys/class/net`, a DHCP lease
//!   (busybox `udhcpc`) asked for on the boot NIC (`BOOTIF`) first, then on NICs with a link,
//!   a lease that cannot reach the control plane given up for the next NIC ([`nics`]);
//!   bounded, and every failure says what was tried.
//! - [`machine`]: the `bcd_core::mode::Machine` — the machine's real SMBIOS, hardware key and
//!   inventory (`bcd_probes::{hwkey, inventory}`, the node agent's document), `diag.nvml` and
//!   `gpu.reset` through `bcd_probes::nvml`, `logs.collect` and `node.reboot` through
//!   `bcd_core::ops` (with `reboot(2)`: there is no service manager), `disk.clean`,
//!   `image.write` and `rescue.start`.
//! - [`clean`]: `disk.clean` — every disk's metadata erased (both ends of the disk and of each
//!   partition, then the partition table re-read), and in mode `full` every block (NVMe Format
//!   with secure erase, falling back `ses=2 → 1 → 0`; ATA security erase; secure discard,
//!   discard, zeroing); a
//!   read-only or failing disk is named in the result and the others are still cleaned. Its
//!   ioctls are `bcd_probes::erase`'s safe wrappers: this crate has no `unsafe`.
//! - [`rescue`]: `rescue.start` — the given keys as root's `authorized_keys` (0700/0600, through
//!   the `HostRoot`), host keys made once per boot with `dropbearkey`, then dropbear (package
//!   dropbear-bin, in the image) as a child of the agent, password logins off, restarted by a
//!   second start; it reports the port, the host keys' OpenSSH SHA-256 fingerprints and the
//!   IPv4 addresses once the port accepts connections.
//! - [`local`]: one disk the operator names, for `bcd disk clean --device` and `bcd image
//!   write --device` (the same cleaning and writing, outside a session), refused when mounted,
//!   swapped on or held.
//! - [`hooks`]: a Spec is answered "not converged" (reason `RamdiskAgent`); a revoked or refused
//!   identity ends the boot.
//! - [`boot`]: one boot — the per-boot identity in memory (`bcd_core::identity::MemoryIdentity`)
//!   and a journal in memory, joining with the one-time boot token through
//!   `bcd_core::lifecycle::run`. A refused token ends the boot with an error (the init powers
//!   off); a control plane that is down is retried with the core's backoff.
//!
//! It depends on `bc-protocol`, `bcd-core` and `bcd-probes`; never on the `bcd` binary crate or
//! on another mode (`bcd-site`). The binary wires it into `bcd ramdisk` (flags, signals, logging).
//!
//! # Limitations
//! The ramdisk joins, reports inventory (NVMe health and NIC firmware included) and serves the
//! commands above, which is what inspection and commissioning need (the control plane decides
//! the steps), `disk.clean`, which release and retire need, `image.write`, which deploying
//! needs, and `rescue.start`; burn-in beyond `diag.nvml` is still to come. Disk erase has no
//! NVMe Sanitize or SCSI sanitize ([`clean::full`]: a SAS disk is discarded or zeroed), and its
//! ATA security erase was tested against a fake drive only. `image.write` takes raw images
//! (plain, gzip or zstd) and plain qcow2 through the image's `qemu-img` (see [`deploy`]). NIC
//! firmware (`ice`'s DDP package, some `bnxt_en` cards) is not in the image, and only IPv4 DHCP
//! is tried. The rescue's dropbear has no RSA host key (ed25519 and ECDSA only), and a rescue
//! ends only by `nodes.unrescue` (no idle timeout).
#![forbid(unsafe_code)]

pub mod boot;
pub mod clean;
pub mod cmdline;
pub mod deploy;
pub mod hooks;
pub mod local;
pub mod machine;
pub mod nics;
pub mod rescue;
pub mod setup;

pub use boot::{BootConfig, BootError, read_params, run};
