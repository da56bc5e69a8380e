//! bcd-site: the site agent (`bcd site`), one appliance per site, stored as a node with
//! `role: site`.
//!
//! # Background
//! Bare metal is reached through its BMC before any OS runs on it. A site appliance holds the
//! BMC credentials and the boot network of one site, so the control plane never talks to BMCs
//! directly. A site may run two appliances: the one holding the site lease does the BMC work,
//! the other stands by.
//!
//! # Design
//! The site agent is a mode of the session core (`bcd-core`): [`machine::SiteMachine`] is its
//! `Machine` (the appliance's own facts from `bcd-probes`; `logs.collect`, `inventory.refresh`
//! and `node.reboot` from `bcd-core`; the BMC commands), [`hooks::SiteHooks`] its
//! `SessionHooks` and `Observer` (the assignment, lease renewals, power reports, `status.json`).
//! Both share one [`site::Site`]: the [`lease`], the BMCs of the assignment with their drivers
//! and [`limiter`] permits, and the [`report`]s waiting for the session.
//! - [`bmc`]: the drivers behind the `Bmc` trait — Redfish through nv-redfish over our own
//!   reqwest/rustls client with a certificate pin ([`bmc::tls`]), IPMI through `ipmitool` —
//!   and the error classification into command error codes; [`address`] parses BMC addresses.
//! - [`commands`]: `bmc.verify`, `bmc.power`, `bmc.setBootDevice` under the lease epoch they
//!   carry (`LEASE_LOST` otherwise, and nothing is done).
//! - [`sync`]: the power sync loop, one poller per BMC, change-only `PowerReport`s.
//! - [`boot`]: the boot service — iPXE scripts per MAC from the assignment's boot plans, the
//!   ramdisk's kernel and initramfs (issue 15).
//! - [`config`]: the `[site]` section of bcd.toml.
//! - `test_utils` (feature `test-utils`): sushy-emulator and fakebmc processes, a
//!   fault-injecting HTTP proxy, a fake BMC — the harness of this crate's tests and of the
//!   daemon's site-mode session test.
//!
//! It depends on `bc-protocol`, `bcd-core` and `bcd-probes`; never on the `bcd` binary crate or
//! on another mode (`bcd-ramdisk`). The binary wires it into `bcd site` (flags, config file,
//! signals, systemd).
//!
//! # Limitations
//! The boot service speaks plain HTTP and no TFTP (firmware without iPXE chainloads it through
//! the site's DHCP; docs/bare-metal.md). Credentials live in
//! memory only: after a restart the site agent has none until the control plane sends the
//! assignment again. Redfish sessions (`X-Auth-Token`) are not used: Basic authentication on
//! every request.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod address;
pub mod bmc;
pub mod boot;
pub mod boot_limit;
pub mod commands;
pub mod config;
pub mod hooks;
pub mod lease;
pub mod limiter;
pub mod machine;
pub mod report;
pub mod site;
pub mod sync;
#[cfg(any(test, feature = "test-utils"))]
pub mod test_utils;
