//! controlplane-lite
#![forbid(unsafe_code)]
pub mod model;
pub mod store;
