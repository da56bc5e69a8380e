//! The operations layer: one function per mutation verb of the operator API, plus the writes the
//! controllers make. Each runs inside the caller's write transaction, checks the
//! `version` the caller read (stale: `CONFLICT`), bumps `version`, appends node events, and writes
//! `noScheduleReasons` in the same transaction as its cause.
//!
//! Locking: the caller's transaction is a store write transaction (`cpl_store::Store::write`),
//! which holds the write lock before the first read, so a read-check-write sequence cannot
//! interleave with another writer. Node rows change only through [`crate::edit::Edit`].

pub mod labels;
pub mod membership;
pub mod nodes;
pub mod pools;
pub mod retire;
pub mod sites;
pub mod tokens;

#[cfg(test)]
mod ops_tests;

use crate::error::OpError;

/// A fresh id `<prefix>_<16 hex>` (64 random bits).
pub fn new_id(prefix: &str) -> String {
    let bits: u64 = rand::random();
    format!("{prefix}_{bits:016x}")
}

/// Checks an operator-supplied key (taint keys, labels) against [`crate::text::KEY`]: 1 to 63
/// characters of `[A-Za-z0-9._/-]`, starting with an alphanumeric. The verbs' requests already
/// hold a checked [`crate::text::Key`]; this guards callers that pass a plain string.
pub(crate) fn valid_key(what: &str, key: &str) -> Result<(), OpError> {
    crate::text::KEY
        .check(key)
        .map_err(|e| OpError::InvalidArgument(format!("{what}: {e}")))
}
