//! bcd
#![forbid(unsafe_code)]
pub mod agent;
pub mod config;
pub mod converge;
pub mod hostroot;
pub mod hwkey;
pub mod inventory;
pub mod notify;
