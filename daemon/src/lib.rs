//! bcd: the Better Compute node daemon — the binary's modes and process plumbing.
//!
//! # Background
//! Every machine of a GPU fleet runs bcd: as a systemd service on GPU hosts (`bcd agent`), inside
//! a PXE-booted ramdisk (`bcd ramdisk`), and on one appliance per site (`bcd site`). It computes the
//! machine's hardware key, joins the control plane with a token, proves its identity with a
//! certificate, holds a session, reports inventory and health, runs commands and converges the
//! node's desired state (spec "Nodes", "The daemon today").
//!
//! # Design
//! The protocol work is `bcd-core` (join, TLS, sessions, journal, executor), the hardware work
//! `bcd-probes` (hostroot, SMBIOS, hardware key, inventory, NVML); this crate holds what is left:
//! - [`agent`]: `bcd agent` — the host as a `bcd_core::mode::Machine` and the agent's hooks (the
//!   converge task, the XID watch, `status.json`, metrics, systemd) on the core's lifecycle.
//! - [`sim`]: `bcd sim` — simulated node agents on the same core, for `bcctl bench` and
//!   `bcctl dev --sim`.
//! - [`site`]: `bcd site` — `bcd-site`'s machine, hooks and power sync loop with the process
//!   around them (flags, the `[site]` config section, signals, systemd).
//! - [`ramdisk`]: `bcd ramdisk` — `bcd-ramdisk`'s boot with its flags, signals and the log
//!   settings of the kernel command line.
//! - [`converge`]: GPU device binding and break-glass SSH from the node's spec.
//! - [`process`]: what those three modes share around the session core — the session flags
//!   (one flattened group), the join token source, the errors that stop any mode, shutdown
//!   signals, systemd's notifier and the command journal.
//! - [`config`], [`ops`]: `/etc/bcd/bcd.toml` and the agent's flags; [`metrics`]: `/metrics`.
//! - [`disk_cli`]: `bcd disk clean --device` and `bcd image write --device`, the ramdisk's disk
//!   cleaning and image writing on one named disk, steps printed.
//! - `main.rs`: flags, logging (`bc_sys::logging`), mode dispatch, and the only place errors
//!   become exit codes.
//!
//! # Limitations
//! Nothing depends on this crate. The ramdisk mode joins, reports and serves the bare-metal
//! workflows' commands (erase, image write, rescue; see `bcd-ramdisk`); burn-in beyond
//! `diag.nvml` is to come. The agent has no local control socket (`bcd status` reads
//! `status.json`).
#![forbid(unsafe_code)]
pub mod agent;
pub mod config;
pub mod converge;
pub mod disk_cli;
pub mod metrics;
pub mod ops;
pub mod process;
pub mod ramdisk;
pub mod sim;
pub mod site;
