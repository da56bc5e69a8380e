//! bc-protocol: the `bcd.v1` wire protocol and the domain types shared by the node daemon (`bcd`)
//! and the control plane (`controlplane-lite`).
//!
//! # Background
//! The spec (Better Compute docs, "Nodes") describes a node as several independent state axes plus
//! identity fields. Both sides of the wire need the same names for them, spelled as the spec spells
//! them (`provisionState`, `noScheduleReasons`, `tenant-owned`, ...).
//!
//! # Design
//! - [`pb`] is the code generated from `proto/bcd/v1/*.proto` (protox + tonic-prost-build; no
//!   system `protoc`).
//! - [`types`] holds the string enums of the node model; each renders exactly the spec's spelling
//!   on the wire, in JSON and in SQL.
//! - [`inventory`] is the inventory document the agent sends inside `Inventory.document_json`.
//! - [`kinds`] holds the pool and site kinds and the capacity buckets, shared by the control
//!   plane's store and core.
//! - Features: `grpc` (default) generates the tonic clients and servers; without it [`pb`] is the
//!   messages alone and nothing here depends on tonic. `openapi` derives utoipa schemas for the
//!   types the operator API returns (same serde shape).
//! - [`hwid`]: hardware identifiers' normalization, junk rules, `kind:value` lines and digests,
//!   shared by the machine's hardware key and the BMC-reported identifiers of an enrollment.
//! - [`commands`] types the arguments and results of every command and the XID event payload.
//!
//! # Limitations
//! No I/O lives here: this crate is pure data. It must not depend on any other crate of this
//! workspace; every other crate may depend on it.
#![forbid(unsafe_code)]

pub mod commands;
pub mod hwid;
pub mod inventory;
pub mod kinds;
pub mod limits;
#[cfg(feature = "openapi")]
mod schema;
pub mod scrub;
pub mod spec;
pub mod types;

/// Generated `bcd.v1` messages, and with the `grpc` feature the tonic services.
#[allow(missing_docs, clippy::all, missing_debug_implementations)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/bcd.v1.rs"));
}

pub use kinds::*;
pub use types::*;

/// The version string agents and the control plane report (`agent_version`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Largest inventory document (`Inventory.document_json`) the gateway stores, bytes. The agent
/// shrinks a larger one before sending it (docs/protocol.md).
pub const MAX_INVENTORY_BYTES: usize = 8 * 1024 * 1024;

/// Largest message either side of a session decodes, bytes: an inventory at its limit plus the
/// envelope, with room so a slightly larger one is dropped by the gateway with a log line
/// instead of ending the stream.
pub const MAX_SESSION_MESSAGE_BYTES: usize = 2 * MAX_INVENTORY_BYTES;
