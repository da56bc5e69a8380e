//! bcd
// `unsafe` is denied everywhere but `inventory::ethtool` (one ioctl, see there).
#![deny(unsafe_code)]
pub mod agent;
pub mod config;
pub mod converge;
pub mod hostroot;
pub mod hwkey;
pub mod inventory;
pub mod notify;
pub mod nvml;
pub mod sim;
pub mod smbios;
pub mod state;
pub mod tls;
