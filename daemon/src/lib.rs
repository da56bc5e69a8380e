//! bcd
#![forbid(unsafe_code)]
pub mod hostroot;
pub mod hwkey;
pub mod inventory;
