//! bcd-site: the site agent (`bcd site`), one appliance per site, stored as a node with
//! `role: site`.
//!
//! # Background
//! Bare metal is reached through its BMC before any OS runs on it. A site appliance holds the
//! BMC credentials and the boot network of one site, so the control plane never talks to BMCs
//! directly.
//!
//! # Design
//! This crate will own, each behind a small trait with a fake for tests:
//! - BMC drivers: Redfish first (power on/off/cycle, boot device, virtual media), IPMI later;
//! - boot services: proxyDHCP, TFTP and HTTP for iPXE, serving the ramdisk image;
//! - enrollment: `metal.enroll` discovery of new BMCs and the `enrolling` provision state.
//!
//! It depends on `bc-protocol` only; the daemon wires it into `bcd site` and hands it a session
//! handle.
//!
//! # Limitations
//! Nothing is implemented yet: `bcd site` refuses to start and says so.
#![forbid(unsafe_code)]

/// Why the site mode cannot run in this build.
pub const NOT_YET: &str =
    "site mode (BMC drivers, PXE boot services) is not implemented in this build";
