//! The `meta` table: facts about the store itself that every replica opening it must agree on
//! (the CA pin its node certificates chain to, the fingerprint of the key BMC credentials are
//! sealed under).
use crate::db::OptionalExt;
use crate::params;

use super::{Reader, StoreError, Tx};

impl Reader<'_> {
    /// The value recorded under `key`, if any.
    pub fn meta(&self, key: &str) -> Result<Option<String>, StoreError> {
        self.db()
            .query_row("SELECT value FROM meta WHERE key = ?1", params![key], |r| {
                r.get(0)
            })
            .optional()
    }
}

impl Tx<'_> {
    /// Records `value` under `key` unless a value is already there; returns the value the store
    /// holds afterwards (the first writer's, when two replicas race).
    pub fn claim_meta(&self, key: &str, value: &str) -> Result<String, StoreError> {
        self.db().execute(
            "INSERT INTO meta (key, value) VALUES (?1, ?2) ON CONFLICT (key) DO NOTHING",
            params![key, value],
        )?;
        Ok(self.meta(key)?.unwrap_or_else(|| value.to_owned()))
    }
}
