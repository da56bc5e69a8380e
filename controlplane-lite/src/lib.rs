//! controlplane-lite: the small control plane bundled with bcd (`bcctl`) — its adapters.
//!
//! # Background
//! The node model, the verbs and the controllers live in `cpl-core`, the store (the only SQL) in
//! `cpl-store`. This crate connects them to the world: agents over gRPC, operators over HTTP, a
//! CA for both, Prometheus, and the `bcctl` command line.
//!
//! # Design
//! - [`gateway`]: JoinService and the agents' sessions over mutual TLS (tonic); its session
//!   registry implements the core's `AgentSessions` port. [`ca`]: the CA and certificates.
//! - [`api`]: the operator API (axum): `POST /v1/<method>` decodes the body into the core's typed
//!   request, calls the one dispatcher, and maps an error code to an HTTP status in one place;
//!   `GET /v1/openapi.json` serves the document generated from the same types.
//! - [`bundle_store`]: where `logs.collect` bundles are kept, pruned by age, count and bytes.
//! - [`metrics`]: Prometheus exposition; [`server`]: `bcctl serve` wiring; [`client`]: the
//!   operator client `bcctl` uses. The CLI and the bench are in the binary (`src/cli`).
//!
//! # Must not depend on
//! rusqlite or any other database crate: every query is `cpl-store`'s (`tests/layers.rs` checks).
//! Node rows are changed only through the core's edit path, never here.
//!
//! # Limitations
//! With SQLite, one process and one file. Several replicas need PostgreSQL (`--store
//! postgres://…`): the database is shared, one leader at a time runs the controllers
//! ([`leadership`]); the availability is the database's.
#![forbid(unsafe_code)]
pub mod api;
pub mod bundle_store;
pub mod ca;
pub mod client;
pub mod cluster;
pub mod gateway;
pub mod leadership;
pub mod limits;
pub mod metrics;
pub mod server;
pub mod state_dir;
