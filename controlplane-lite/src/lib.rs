//! controlplane-lite
#![forbid(unsafe_code)]
pub mod api;
pub mod ca;
pub mod client;
pub mod commands;
pub mod gateway;
pub mod health;
pub mod liveness;
pub mod model;
pub mod server;
pub mod store;
