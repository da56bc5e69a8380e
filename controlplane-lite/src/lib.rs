//! controlplane-lite
#![forbid(unsafe_code)]
pub mod store;
