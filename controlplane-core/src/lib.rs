//! cpl-core: the control plane's core. The node model of the spec ("Nodes"), the operator verbs
//! and the controllers, with no HTTP, gRPC or SQL in it.
//!
//! # Background
//! A node's state is several independent axes, each with one owner: `provisionState`
//! ([`provision`]), `maintenance`, `cordoned`, `power`, `connectivity`, typed [`conditions`], and
//! `noScheduleReasons`, which mirrors every reason the node must not receive new work and is
//! written in the same transaction as its cause. The coming bare-metal workflows, the site agent
//! and a PostgreSQL store all add writers and verbs; they must land in one place each.
//!
//! # Design
//! - [`edit::Edit`] is the one writer of the node row: load under the write lock, check the
//!   version where the caller gave one, apply, record events, save. Operator verbs ([`ops`]),
//!   JoinService ([`join`]), session open and close and heartbeat revival ([`sessions`]), agent
//!   reports ([`reports`]), Liveness ([`liveness`]) and Health ([`health`]) all go through it.
//!   Conditions are set through one function ([`conditions::apply`]).
//! - [`provision`]: `PROVISION_STATE_TABLE`, the one table of legal moves; [`schedulable`]: the
//!   seven checks in Rust (their SQL form is the store's); [`detail`]: NodeDetail, the API view;
//!   [`ownership`]: role, trust, adapter and drivers of a joining node; [`placer`]: allocations and
//!   pool capacity.
//! - [`verbs`]: every operator method as a type ([`verbs::Method`], [`verbs::Request`],
//!   [`verbs::Response`]), one dispatcher ([`verbs::Core::dispatch`]), and the OpenAPI document
//!   generated from them ([`verbs::openapi`]).
//! - [`agent_report`]: the one door of what agents report over their sessions
//!   ([`verbs::Core::report`] with an [`agent_report::AgentReport`]): the gateway keeps the
//!   stream, the core chooses the transaction and does what the report means.
//! - [`commands`]: the Commands controller (queue, dispatch, updates, deadlines), the one
//!   builder of command records and the one router of a command that ended.
//! - [`bare_metal`]: enrollment through a BMC, the site lease, the power axis's owner, BMC
//!   credentials sealed at rest.
//! - [`remediation`]: health remediation beside Health: a node's fault climbs its pool's ladder
//!   (reset, reboot, BMC power cycle, re-inspection) under a circuit breaker, and is given up
//!   loudly (maintenance on) when nothing helps.
//! - [`port::AgentSessions`]: how the core reaches a live agent session (push a spec, send a
//!   command, close a revoked session); the gateway implements it.
//! - Errors: [`error::OpError`] maps every refusal to one API code ([`error::OpError::code`]);
//!   which HTTP status a code is, is the adapter's business.
//!
//! # Must not depend on
//! axum, tonic, hyper, http (no transport), rusqlite (no SQL: every query is the store's,
//! `cpl-store`), or controlplane-lite. `bc-protocol` is used without its `grpc` feature. A test in
//! controlplane-lite (`tests/layers.rs`) reads `cargo metadata` and fails if that changes.
//!
//! # Limitations
//! The controllers run where controlplane-lite starts them: on one replica at a time, under its
//! controller lease. The core does not know replicas; what it needs of another replica's
//! sessions goes through [`port::AgentSessions`].
#![forbid(unsafe_code)]

pub mod acceptance;
pub mod agent_report;
pub mod bare_metal;
pub mod bmc_address;
pub mod commands;
pub mod conditions;
pub mod detail;
pub mod edit;
pub mod error;
pub mod health;
pub mod identity;
pub mod inventory;
pub mod join;
pub mod liveness;
pub mod ops;
pub mod ownership;
pub mod pcie;
pub mod placer;
pub mod port;
pub mod provision;
pub mod push;
pub mod query;
pub mod remediation;
pub mod reports;
pub mod schedulable;
pub mod sessions;
pub mod status;
pub mod text;
pub mod verbs;

#[cfg(test)]
mod detail_tests;
#[cfg(test)]
mod join_tests;
#[cfg(test)]
mod pcie_tests;
#[cfg(test)]
mod placer_tests;
#[cfg(test)]
mod report_tests;
#[cfg(test)]
mod schedulable_tests;
#[cfg(test)]
mod test_utils;

pub use error::OpError;
