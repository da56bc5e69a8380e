//! The per-node event log: what changed, from → to, who, when.

use rusqlite::{Connection, params};
use serde::Serialize;

use super::StoreError;

/// One event.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeEvent {
    pub seq: i64,
    pub node_id: String,
    /// Milliseconds since the Unix epoch.
    pub at: i64,
    /// What changed, e.g. `provisionState`, `connectivity`, `joined`.
    pub kind: String,
    pub from: Option<String>,
    pub to: Option<String>,
    /// Who changed it: `JoinService`, `NodeLifecycle`, `gateway`, `Liveness`, `operator:<name>`.
    pub actor: String,
    pub message: String,
}

/// Appends an event inside the caller's transaction. One argument per column of the row.
#[allow(clippy::too_many_arguments)]
pub fn record(
    conn: &Connection,
    node_id: &str,
    at: i64,
    kind: &str,
    from: Option<&str>,
    to: Option<&str>,
    actor: &str,
    message: &str,
) -> Result<(), StoreError> {
    conn.execute(
        "INSERT INTO node_events (node_id, at, kind, from_value, to_value, actor, message) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![node_id, at, kind, from, to, actor, message],
    )?;
    Ok(())
}

/// A node's events, oldest first.
pub fn list(conn: &Connection, node_id: &str) -> Result<Vec<NodeEvent>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT seq, node_id, at, kind, from_value, to_value, actor, message FROM node_events \
         WHERE node_id = ?1 ORDER BY seq",
    )?;
    let rows = stmt.query_map(params![node_id], |r| {
        Ok(NodeEvent {
            seq: r.get(0)?,
            node_id: r.get(1)?,
            at: r.get(2)?,
            kind: r.get(3)?,
            from: r.get(4)?,
            to: r.get(5)?,
            actor: r.get(6)?,
            message: r.get(7)?,
        })
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}
