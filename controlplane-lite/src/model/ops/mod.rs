//! The operations layer: one function per mutation verb of the operator API, plus the writes the
//! controllers make. Each runs inside the caller's transaction (see [`write_tx`]), checks the
//! `version` the caller read (stale: `CONFLICT`), bumps `version`, appends node events, and writes
//! `noScheduleReasons` in the same transaction as its cause.
//!
//! Locking: on SQLite, [`write_tx`] opens `BEGIN IMMEDIATE`, which takes the database's write lock
//! before the first read, so a read-check-write sequence cannot interleave with another writer.
//! On PostgreSQL the same role is played by `SELECT ... FOR UPDATE` on the rows read
//! ([`edit::Edit::begin`] and the placer mark the spots).

pub mod edit;
pub mod nodes;
pub mod pools;
pub mod sites;
pub mod tokens;

use rusqlite::{Connection, Transaction, TransactionBehavior};

use super::error::OpError;

pub use edit::Edit;

/// Runs `f` in a `BEGIN IMMEDIATE` transaction and commits when it returns `Ok`; an `Err` rolls
/// everything back (the transaction is dropped uncommitted).
pub fn write_tx<T>(
    conn: &mut Connection,
    f: impl FnOnce(&Transaction<'_>) -> Result<T, OpError>,
) -> Result<T, OpError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let out = f(&tx)?;
    tx.commit()?;
    Ok(out)
}

/// A fresh id `<prefix>_<16 hex>` (64 random bits).
pub(crate) fn new_id(prefix: &str) -> String {
    let bits: u64 = rand::random();
    format!("{prefix}_{bits:016x}")
}

/// Checks an operator-supplied key (taint keys, labels): 1 to 63 characters of
/// `[A-Za-z0-9._/-]`, starting with an alphanumeric.
pub(crate) fn valid_key(what: &str, key: &str) -> Result<(), OpError> {
    let ok = !key.is_empty()
        && key.len() <= 63
        && key
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '/' | '-'));
    if ok {
        Ok(())
    } else {
        Err(OpError::InvalidArgument(format!(
            "{what} {key:?} is not 1-63 characters of [A-Za-z0-9._/-] starting with a letter or digit"
        )))
    }
}
