//! bcd
// `unsafe` is denied everywhere but `inventory::ethtool` (one ioctl, see there).
#![deny(unsafe_code)]
pub mod agent;
pub mod hostroot;
pub mod hwkey;
pub mod inventory;
pub mod logs;
pub mod nvml;
pub mod ops;
pub mod reboot;
pub mod smbios;
pub mod state;
pub mod tls;
