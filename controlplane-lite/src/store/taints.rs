//! Operator taints (`nodes.taint`): each taint `key` puts `taint:<key>` into the node's
//! `noScheduleReasons` in the same transaction.

use rusqlite::{Connection, params};
use serde::Serialize;

use super::StoreError;

/// One taint on a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Taint {
    pub key: String,
    pub value: String,
    /// `operator:<name>`.
    pub created_by: String,
    /// Milliseconds since the Unix epoch.
    pub created_at: i64,
}

/// Adds or replaces the taint `key` on `node_id`.
pub fn put(conn: &Connection, node_id: &str, taint: &Taint) -> Result<(), StoreError> {
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
pub fn remove(conn: &Connection, node_id: &str, key: &str) -> Result<bool, StoreError> {
    let n = conn.execute(
        "DELETE FROM node_taints WHERE node_id = ?1 AND key = ?2",
        params![node_id, key],
    )?;
    Ok(n > 0)
}

/// The node's taints, by key.
pub fn list(conn: &Connection, node_id: &str) -> Result<Vec<Taint>, StoreError> {
    let mut stmt = conn.prepare_cached(
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
    Ok(rows.collect::<Result<_, _>>()?)
}
