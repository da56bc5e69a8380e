//! The node model and its operations (spec "State is several axes, not one status", "Provision
//! states", "Identity, ownership and generations", "When a node is schedulable").
//!
//! # Background
//! A node's state is several independent axes, each with one owner: `provisionState`
//! ([`provision`]), `maintenance`, `cordoned`, `power`, `connectivity`, typed [`conditions`], and
//! `noScheduleReasons`, which mirrors every reason the node must not receive new work and is
//! written in the same transaction as its cause.
//!
//! # Design
//! - [`provision`]: `PROVISION_STATE_TABLE`, the one table of legal moves.
//! - [`schedulable`]: the seven checks in Rust and SQL, and capacity buckets.
//! - [`ops`]: one function per mutation verb, run inside a caller's `BEGIN IMMEDIATE`
//!   transaction ([`ops::write_tx`]); each checks `version`, bumps it, logs events.
//! - [`placer`]: allocations and pool capacity, on rows read through the SQL predicate.
//! - [`detail`]: NodeDetail, the API view; the full record stays internal.
//! - [`ownership`]: role, trust, adapter and drivers of a joining node.
//!
//! # Limitations
//! `power` has no writer yet (bare-metal power control is not built). Locking relies on SQLite's
//! single writer; the PostgreSQL port needs `FOR UPDATE` where the code marks it.

pub mod api;
pub mod conditions;
pub mod detail;
pub mod error;
pub mod inventory;
pub mod kinds;
pub mod ops;
pub mod ownership;
pub mod placer;
pub mod provision;
pub mod query;
pub mod schedulable;

#[cfg(test)]
mod test_utils;
#[cfg(test)]
mod tests_detail;
#[cfg(test)]
mod tests_ops;
#[cfg(test)]
mod tests_placer;
#[cfg(test)]
mod tests_schedulable;

pub use error::OpError;
