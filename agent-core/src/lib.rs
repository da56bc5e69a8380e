//! bcd-core: the session core every bcd mode drives — join, TLS, the identity and state dir, the
//! session loop, backoff, the command journal and executor, `status.json`, and the commands every
//! mode serves the same way.
//!
//! # Background
//! `bcd agent`, `bcd sim`, `bcd site` and the coming `bcd ramdisk` all speak the same protocol
//! to the same gateway: join with a token over a pinned TLS connection, then hold one session
//! (Hello, Welcome, heartbeats, inventory, specs, commands, Goodbye) across reconnects, renewals
//! and revocations. Written once per mode, a protocol change had to be made in each copy and the
//! copies drifted; here it is written once and the modes plug into it.
//!
//! # Design
//! - [`mode`]: the traits a mode implements — [`mode::Machine`] (facts for Join and Hello, the
//!   inventory, the command handlers), [`mode::SessionHooks`] (what to do with a Spec, what to
//!   send unasked), [`mode::Observer`] (bookkeeping callbacks) and [`mode::TokenSource`] — plus
//!   [`identity::IdentityStore`] (the state dir on disk, or memory).
//! - [`lifecycle::run`]: identity (stored, or [`join`]), then sessions until a stop, with
//!   [`backoff`], certificate renewal and revocation; a `node` span (node id) per identity and a
//!   `session` span (epoch) per session.
//! - [`session`]: one session, and the only builders of Hello, Heartbeat and Goodbye.
//! - [`executor`] and [`journal`]: each command journaled before it runs and before its result is
//!   reported, with its deadline, cancel handle and a `command` span (command id).
//! - [`handlers`] (`inventory.refresh`) and [`ops`] (`logs.collect`, `node.reboot`): commands any
//!   mode serves as they are.
//! - [`endpoints`]: the control plane's gateway URLs (one per replica), shuffled once and
//!   tried round-robin by the join and the session loop.
//! - [`tls`] (CA-pin verifier, mutual TLS, the tonic connector), [`state`] (the state dir's
//!   files and its lock), [`identity_check`] (a stored identity checked file by file before use:
//!   a broken one is named and, with a join token, moved aside), [`status`] (`status.json`).
//! - `test_utils` (feature `test-utils`): a scripted fake control plane for protocol tests.
//!
//! # Limitations
//! Depends on `bc-protocol` and `bc-sys` only: never on `bcd-probes` (hardware is the mode's
//! business, reached through [`mode::Machine`]), a mode crate, or the `bcd` binary. No process
//! concerns either (signals, flags, config files, metrics): the binary owns those.
#![forbid(unsafe_code)]

pub mod backoff;
pub mod endpoints;
pub mod executor;
pub mod handlers;
pub mod identity;
pub mod identity_check;
pub mod join;
pub mod journal;
pub mod lifecycle;
pub mod mode;
pub mod ops;
pub mod session;
pub mod state;
pub mod status;
#[cfg(any(test, feature = "test-utils"))]
pub mod test_utils;
pub mod tls;

pub use backoff::Backoff;
