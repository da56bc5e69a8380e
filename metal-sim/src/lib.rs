//! bc-metal-sim: bare metal without hardware, for `bcctl dev --metal` and the end-to-end tests.
//!
//! # Background
//! The bare-metal workflows (enroll through a BMC, power on with PXE, boot the ramdisk, inspect,
//! commission) need BMCs and machines. The field's stand-ins are sushy-tools' Redfish emulator
//! (its fake systems driver and external notifier) and QEMU with its own iPXE ROM; this crate
//! ties them together so that a power-on through the emulator boots a machine.
//!
//! # Design
//! - [`sushy`]: the emulator's config and a launcher around its `main()` (no random power delay,
//!   `SerialNumber`/`Model` from the config); the caller starts the process.
//! - [`machines`]: an HTTP endpoint for the emulator's external notifier that starts a QEMU
//!   machine (the system's SMBIOS UUID and serial, its MAC, PXE) when the BMC is asked to power
//!   it on with PXE, and stops it on a power-off; a machine may have several NICs and boot from
//!   any of them.
//! - [`firmware`]: SeaBIOS or UEFI (Debian's OVMF, a variable store per machine); the NICs'
//!   iPXE ROMs (Debian's `ipxe-qemu`) serve both.
//!
//! It depends on no other crate of the workspace: the control plane's CLI and the tests both use
//! it.
//!
//! # Limitations
//! One QEMU per machine under TCG (10–30 s a boot on two cores); a machine has no OS on its disk,
//! so a boot from disk is not emulated.

pub mod firmware;
pub mod machines;
pub mod sushy;

use std::path::PathBuf;

/// The program `env_var` names (when it is a file), else `name` on `PATH`.
pub fn find_program(env_var: &str, name: &str) -> Option<PathBuf> {
    std::env::var_os(env_var)
        .map(PathBuf::from)
        .filter(|p| p.is_file())
        .or_else(|| {
            std::env::var_os("PATH").and_then(|paths| {
                std::env::split_paths(&paths)
                    .map(|d| d.join(name))
                    .find(|p| p.is_file())
            })
        })
}
