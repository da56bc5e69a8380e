//! Operator taints (`nodes.taint`): each taint `key` puts `taint:<key>` into the node's
//! `noScheduleReasons`, written by the core in the same transaction.

use crate::params;
use serde::Serialize;

use super::{Reader, StoreError, Tx};

/// One taint on a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Taint {
    pub key: String,
    pub value: String,
    /// `operator:<name>`.
    pub created_by: String,
    /// Milliseconds since the Unix epoch.
    pub created_at: i64,
}

impl Reader<'_> {
    /// The node's taints, by key.
    pub fn taints(&self, node_id: &str) -> Result<Vec<Taint>, StoreError> {
        let mut stmt = self.db().prepare_cached(
            "SELECT key, value, created_by, created_at FROM node_taints WHERE node_id = ?1 ORDER BY key",
        )?;
        let rows = stmt.query_map(params![node_id], |r| {
            Ok(Taint {
                key: r.get(0)?,
                value: r.get(1)?,
                created_by: r.get(2)?,
                created_at: r.get(3)?,
            })
        })?;
        rows.collect::<Result<_, _>>()
    }
}

impl Tx<'_> {
    /// Adds or replaces the taint `key` on `node_id`.
    pub fn put_taint(&self, node_id: &str, taint: &Taint) -> Result<(), StoreError> {
        let conn = self.db();
        conn.execute(
            "DELETE FROM node_taints WHERE node_id = ?1 AND key = ?2",
            params![node_id, taint.key],
        )?;
        conn.execute(
            "INSERT INTO node_taints (node_id, key, value, created_by, created_at) \
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![
                node_id,
                taint.key,
                taint.value,
                taint.created_by,
                taint.created_at
            ],
        )?;
        Ok(())
    }

    /// Removes the taint `key`; returns whether it was there.
    pub fn remove_taint(&self, node_id: &str, key: &str) -> Result<bool, StoreError> {
        let n = self.db().execute(
            "DELETE FROM node_taints WHERE node_id = ?1 AND key = ?2",
            params![node_id, key],
        )?;
        Ok(n > 0)
    }
}
