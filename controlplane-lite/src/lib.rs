//! controlplane-lite: the small control plane bundled with bcd (`bcctl`).
//!
//! # Background
//! It keeps the node model of the spec ("Nodes": independent state axes, role, trust, hardware
//! key, generations, conditions, noScheduleReasons, the schedulable predicate), issues
//! certificates, holds agent sessions and serves operators. End-to-end tests, the simulator and
//! small fleets run on it.
//!
//! # Design
//! - [`store`]: SQLite (bundled, WAL) behind one module whose SQL stays portable to PostgreSQL.
//! - [`model`]: the provisionStateTable, the predicate in Rust and SQL, conditions, NodeDetail,
//!   the placer, one ops function per API verb.
//! - [`ca`], [`gateway`]: the CA, JoinService (re-join in place, duplicate refusal) and the agent
//!   sessions over mutual TLS; [`liveness`], [`commands`], [`health`]: the controllers.
//! - [`api`], [`client`], [`server`]: the operator API, its client, and `bcctl serve` wiring.
//!
//! # Limitations
//! One process, one SQLite file: no high availability. PostgreSQL needs the `FOR UPDATE` clauses
//! noted in docs/node-model.md.
#![forbid(unsafe_code)]
pub mod api;
pub mod ca;
pub mod client;
pub mod commands;
pub mod gateway;
pub mod health;
pub mod liveness;
pub mod metrics;
pub mod model;
pub mod server;
pub mod store;
