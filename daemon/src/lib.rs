//! bcd: the Better Compute node daemon.
//!
//! # Background
//! Every machine of a GPU fleet runs bcd: as a systemd service on GPU hosts (`bcd agent`), inside
//! a PXE-booted ramdisk (`bcd ramdisk`), and on one appliance per site (`bcd site`). It computes the
//! machine's hardware key, joins the control plane with a token, proves its identity with a
//! certificate, holds a session, reports inventory and health, runs commands and converges the
//! node's desired state (spec "Nodes", "The daemon today").
//!
//! # Design
//! - [`agent`]: join, the session loop (heartbeats, inventory, specs, commands), reconnect with
//!   jittered backoff, revocation and certificate rotation, the command journal, `status.json`.
//! - [`tls`] and [`state`]: CA-pinned TLS, mutual TLS, the state dir with atomic writes.
//! - Hardware identity, inventory and NVML (diag.nvml, gpu.reset, the XID watch) are in
//!   `bcd-probes`.
//! - [`converge`]: GPU device binding and break-glass SSH from the node's spec.
//! - [`config`]: `/etc/bcd/bcd.toml` (systemd's notify protocol is `bc_sys::notify`).
//! - [`logs`], [`reboot`], [`ops`]: logs.collect bundles and node.reboot.
//! - [`sim`]: simulated node agents for `bcctl bench` and `bcctl dev --sim`.
//!
//! # Limitations
//! The site and ramdisk modes are documented in their crates but not implemented; the agent has
//! no local control socket (`bcd status` reads `status.json`).
#![forbid(unsafe_code)]
pub mod agent;
pub mod config;
pub mod converge;
pub mod metrics;
pub mod ops;
pub mod sim;
