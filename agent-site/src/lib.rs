//! bcd-site: the site agent (`bcd site`), one appliance per site, stored as a node with
//! `role: site`.
//!
//! # Background
//! Bare metal is reached through its BMC before any OS runs on it. A site appliance holds the
//! BMC credentials and the boot network of one site, so the control plane never talks to BMCs
//! directly.
//!
//! # Design
//! The site agent is a mode of the session core (`bcd-core`): it implements
//! `bcd_core::mode::Machine` for the appliance itself (facts from `bcd-probes`: hardware key,
//! inventory; `logs.collect` and `inventory.refresh` from `bcd_core::ops` and
//! `bcd_core::handlers`), keeps its identity in a state dir (`bcd_core::state::StateDir`), and
//! runs `bcd_core::lifecycle::run` — the same join, session, renewal and revocation code as the
//! node agent. Its own work plugs in through the mode traits: BMC tasks arrive as commands
//! (`Machine::run_command`) and power changes leave as reports (`SessionHooks::next_report`).
//! This crate will own, each behind a small trait with a fake for tests:
//! - BMC drivers: Redfish first (power on/off/cycle, boot device, virtual media), IPMI later;
//! - boot services: proxyDHCP, TFTP and HTTP for iPXE, serving the ramdisk image;
//! - enrollment: verifying a BMC and the `enrolling` provision state; the power sync loop.
//!
//! It depends on `bc-protocol`, `bcd-core` and `bcd-probes`; never on the `bcd` binary crate or
//! on another mode (`bcd-ramdisk`). The binary wires it into `bcd site`.
//!
//! # Limitations
//! Nothing is implemented yet: `bcd site` refuses to start and says so.
#![forbid(unsafe_code)]

/// Why the site mode cannot run in this build.
pub const NOT_YET: &str =
    "site mode (BMC drivers, PXE boot services) is not implemented in this build";
